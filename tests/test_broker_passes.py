"""Passes over every connection (deadline checks, RTT reads) take a loop turn per slice,
so thousands of connections never hold the loop for milliseconds; and RTTs, a syscall per
connection, are read only while a measurement round needs them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from nsq_raw import RawClient
from srtm.broker import tcp
from srtm.broker.measurement import RTTS_PER_TURN, Measurements
from srtm.broker.tcp import DEADLINES_PER_TURN, check_deadlines
from srtm.protocol import Pub
from support import MakeBroker, eventually


@dataclass
class Conn:
    """A connection as the passes see it; each call is logged in ``log``."""

    name: int
    log: list[object]
    publisher: str = ""
    pub_counts: dict[str, int] = field(default_factory=dict)
    rtt_cache_ns: int = 0

    def check_deadlines(self, now: int) -> None:
        self.log.append(self.name)

    def rtt_ns(self) -> int:
        self.log.append(self.name)
        return 1_000 * (self.name + 1)


def _other_work_ran_between_slices(log: list[object], n: int, per_turn: int) -> None:
    """Each connection once, in order, with the loop's other work after the first slice."""
    assert [x for x in log if x != "other"] == list(range(n))
    assert log.index("other") == per_turn


async def test_deadline_checks_leave_the_loop_between_slices() -> None:
    log: list[object] = []
    conns = [Conn(i, log) for i in range(3 * DEADLINES_PER_TURN + 5)]
    asyncio.get_running_loop().call_soon(log.append, "other")
    await check_deadlines(conns)  # type: ignore[arg-type]
    _other_work_ran_between_slices(log, len(conns), DEADLINES_PER_TURN)


async def test_rtt_reads_leave_the_loop_between_slices() -> None:
    log: list[object] = []
    conns = [Conn(i, log, publisher=f"p{i}") for i in range(2 * RTTS_PER_TURN + 1)]
    conns[-1].pub_counts["t"] = 1  # the one publisher
    m = Measurements()
    asyncio.get_running_loop().call_soon(log.append, "other")
    await m.refresh_rtts(conns)
    _other_work_ran_between_slices(log, len(conns), RTTS_PER_TURN)
    assert [c.rtt_cache_ns for c in conns] == [1_000 * (i + 1) for i in range(len(conns))]
    assert m.publisher_rtt_ns == {conns[-1].publisher: conns[-1].rtt_cache_ns}


async def test_rtts_are_read_only_while_a_round_runs(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = tcp.Client.rtt_ns

    def counted(self: tcp.Client) -> int:
        reads.append(1)
        return real(self)

    monkeypatch.setattr(tcp.Client, "rtt_ns", counted)
    broker = await make_broker()
    housekept: list[int] = []
    real_housekeep = broker.persistence.housekeep

    async def housekeep() -> None:  # the per-second step, where RTTs were read
        housekept.append(1)
        await real_housekeep()

    monkeypatch.setattr(broker.persistence, "housekeep", housekeep)
    assert broker.tcp_address is not None
    client = await RawClient.connect(*broker.tcp_address)
    try:
        await client.send(Pub("t", b"x"))
        await client.frame()
        await eventually(lambda: housekept, "a per-second step")
        assert reads == []  # no round: no TCP_INFO call
        round_ = asyncio.create_task(broker.measure("t", None, 3_000_000_000))
        # One read as the round starts, one at the next per-second step.
        await eventually(lambda: len(reads), "RTTs read in a round", until=lambda n: n >= 2)
        round_.cancel()
    finally:
        await client.close()
