"""Connections whose peer went, closed a slice a loop turn (``srtm.broker.closer``): a
crowd leaving at once does not hold every other connection's reads and answers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsq_raw import RawClient
from srtm.broker.closer import Closer
from srtm.protocol import Pub
from support import MakeBroker, eventually


class Conn:
    def __init__(self, name: str, log: list[str], fails: bool = False) -> None:
        self.name, self.log, self.fails = name, log, fails

    def close(self) -> None:
        self.log.append(self.name)
        if self.fails:
            raise RuntimeError("teardown failed")


class Ticks:
    """A clock that moves 100 ns each time it is read."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 100
        return self.now


async def test_closes_in_order_a_budget_a_turn_releases_first() -> None:
    log: list[str] = []
    # the clock is read once at the slice's start and once after each close: a budget
    # of 250 ns is spent by the third close
    closer = Closer(lambda: log.append("release"), budget_ns=250, clock=Ticks())
    for i in range(7):
        closer.add(Conn(f"c{i}", log))
    assert log == [] and len(closer) == 7  # nothing in the read that found them gone
    await asyncio.sleep(0)
    assert log == ["release", "c0", "release", "c1", "release", "c2"]
    assert len(closer) == 4
    await asyncio.sleep(0)
    assert log[6:] == ["release", "c3", "release", "c4", "release", "c5"]
    await asyncio.sleep(0)
    assert log[-2:] == ["release", "c6"] and len(closer) == 0
    closer.add(Conn("late", log))  # a new crowd schedules a slice again
    await asyncio.sleep(0)
    assert log[-1] == "late"


async def test_at_least_one_close_a_turn() -> None:
    log: list[str] = []
    closer = Closer(lambda: None, budget_ns=0, clock=Ticks())
    for i in range(3):
        closer.add(Conn(f"c{i}", log))
    for n in (1, 2, 3):
        await asyncio.sleep(0)
        assert len(log) == n


async def test_a_close_that_fails_is_logged_and_the_rest_are_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    closer = Closer(lambda: None, budget_ns=10**12)  # all in one slice
    for name, fails in (("a", False), ("b", True), ("c", False)):
        closer.add(Conn(name, log, fails))
    with caplog.at_level(logging.ERROR, "srtm.broker"):
        await asyncio.sleep(0)
    assert log == ["a", "b", "c"]
    assert "closing a connection whose peer went failed" in caplog.text


async def test_a_publisher_is_answered_while_a_crowd_that_left_is_still_closing(
    make_broker: MakeBroker,
) -> None:
    """300 connections go at once; a slice closes one of them a turn, so a PUB sent
    meanwhile is read and answered between slices, not after every close."""
    broker = await make_broker()
    assert broker.tcp_address is not None
    broker.closer.budget_ns = 0
    crowd = [await RawClient.connect(*broker.tcp_address) for _ in range(300)]
    pub = await RawClient.connect(*broker.tcp_address)
    await pub.send(Pub("t", b"before"))
    assert (await pub.frame()).data == b"OK"
    await eventually(lambda: len(broker.clients) == 301, "every connection accepted")
    for c in crowd:
        c.writer.close()
    await eventually(lambda: len(broker.closer) > 100, "the crowd's ends read")
    await pub.send(Pub("t", b"during"))
    assert (await pub.frame()).data == b"OK"
    assert len(broker.closer) > 0  # answered before the crowd was closed
    await eventually(lambda: len(broker.clients) == 1, "the crowd closed")
    assert broker.topics["t"].depth == 2
