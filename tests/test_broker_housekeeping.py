"""The housekeeping runs every 100 ms while topics are used, and otherwise waits for the
next use or the next second's work: an idle broker's loop woke ten times a second for it,
each wake-up cold."""

from __future__ import annotations

import asyncio

import pytest

from srtm.broker import housekeeping
from srtm.broker.housekeeping import Housekeeping
from srtm.broker.shares import Shares
from srtm.broker.stats import FLUSH_AT
from support import MakeBroker


async def _idle(hk: Housekeeping) -> None:
    """Until a pass found nothing used and the loop waits for a use."""
    async with asyncio.timeout(10):
        while hk._waiter is None:
            await asyncio.sleep(0.005)


async def test_an_idle_housekeeping_waits_for_the_first_use(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(housekeeping, "ROLL_S", 60.0)  # only a use can end the wait
    monkeypatch.setattr(housekeeping, "BUSY_PAUSE_S", 0.01)
    broker = await make_broker()
    hk = broker.housekeeping
    await _idle(hk)
    passes = hk.passes
    await asyncio.sleep(0.2)  # twenty pauses of a working broker
    assert hk.passes == passes
    recorder = broker.stats.topic("t").latency  # a use: the pass comes a pause later
    recorder.pending.extend([1_000] * FLUSH_AT)
    async with asyncio.timeout(10):
        while recorder.pending:
            await asyncio.sleep(0.005)
    assert hk.passes > passes
    await _idle(hk)  # nothing used since: idle again


async def test_the_second_s_work_comes_while_idle(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk's sync and the traces' roll wait for no use (and bring none: a pause
    of a working broker, made a minute here once idle, would hold them)."""
    monkeypatch.setattr(housekeeping, "ROLL_S", 0.05)
    broker = await make_broker()
    rolls: list[None] = []

    async def housekeep() -> None:
        rolls.append(None)

    monkeypatch.setattr(broker.persistence, "housekeep", housekeep)
    await _idle(broker.housekeeping)
    monkeypatch.setattr(housekeeping, "BUSY_PAUSE_S", 60.0)
    async with asyncio.timeout(10):
        while len(rolls) < 3:
            await asyncio.sleep(0.01)


async def test_under_a_lease_it_keeps_to_its_pause(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lapsed lease holds shaped topics even with nothing used: the housekeeping looks
    at it every pause, never waiting idle."""
    monkeypatch.setattr(housekeeping, "ROLL_S", 60.0)
    monkeypatch.setattr(housekeeping, "BUSY_PAUSE_S", 0.01)
    looked: list[None] = []

    def lease_ok(_: Shares) -> bool:
        looked.append(None)
        return True

    monkeypatch.setattr(Shares, "leased", property(lambda _: True))
    monkeypatch.setattr(Shares, "lease_ok", lease_ok)
    hk = (await make_broker()).housekeeping
    async with asyncio.timeout(10):
        while len(looked) < 20:
            assert hk._waiter is None
            await asyncio.sleep(0.005)
