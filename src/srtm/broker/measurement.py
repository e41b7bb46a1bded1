"""Measurement rounds: the estimated end-to-end latency of a topic's messages over a
window (``POST /srtm/measure``), and the connection RTTs the estimate adds.

The estimate of one message is its publisher's RTT/2 + its time in the broker + its
subscriber's RTT/2; RTTs come from TCP_INFO, read as a round starts and once a second
while rounds run, not per message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from srtm.broker.message import Message
from srtm.broker.stats import Recorder

#: Bounds of a measurement round: each holds a recorder and is fed every message of its
#: topic, so neither their length nor their number may be left to whoever asks.
MIN_MEASURE_NS = 1_000_000
MAX_MEASURE_NS = 60_000_000_000
MAX_MEASUREMENTS = 16
#: A round wakes this often to see how late its event loop runs (``Measurement.lag``):
#: a loop starved of CPU adds its lag to every latency the round measures, and whoever
#: judges the round should know (online fitting repeats such a round instead).
LAG_TICK_NS = 10_000_000
#: The longest a round waits for its topic's backlog to drain before it starts
#: (``Measurements.run``'s ``settled``). A move leaves a backlog on the broker that
#: lost publishers, which drains at the share's margin over its load (10 %: seconds);
#: a round that started on it measured the move, and fitting halved shares that fit.
MAX_SETTLE_NS = 5_000_000_000
#: Connections whose RTT is read per loop turn: one TCP_INFO call each, and a pass over
#: 2,000 connections in one go held the loop for 2-9 ms.
RTTS_PER_TURN = 64


class MeasurementsBusy(RuntimeError):
    """As many measurement rounds as allowed are already running."""


@dataclass
class Measurement:
    """A measurement round: estimated end-to-end latency (publisher RTT/2 + time in broker
    + subscriber RTT/2) of a topic's messages from ``publishers`` (None: all) until
    ``until_ns``."""

    topic: str
    publishers: frozenset[str] | None
    until_ns: int
    latency: Recorder = field(default_factory=Recorder)
    #: How late the broker's loop woke for each ``LAG_TICK_NS`` tick of the round.
    lag: Recorder = field(default_factory=Recorder)
    #: How long the round waited for the topic's backlog before it started, and whether
    #: it had drained then (False: ``MAX_SETTLE_NS`` ran out).
    settle_ns: int = 0
    settled: bool = True


class MeasuredClient(Protocol):
    """What a round needs of a client connection: its RTT, and whom it publishes for."""

    rtt_cache_ns: int
    pub_counts: dict[str, int]

    @property
    def publisher(self) -> str: ...

    def rtt_ns(self) -> int: ...


class Measurements:
    """The rounds running (at most ``limit``), and each publisher's connection RTT."""

    def __init__(self, limit: int = MAX_MEASUREMENTS) -> None:
        self.running: list[Measurement] = []
        #: Rounds waiting for their topic's backlog (they count against ``limit``).
        self.settling = 0
        self.limit = limit
        #: Publisher name -> RTT of its connection, refreshed every second while rounds run.
        self.publisher_rtt_ns: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.running) + self.settling

    async def refresh_rtts(self, clients: Iterable[MeasuredClient]) -> None:
        """Read every connection's RTT afresh, ``RTTS_PER_TURN`` a loop turn."""
        batch = list(clients)
        for k in range(0, len(batch), RTTS_PER_TURN):
            if k:
                await asyncio.sleep(0)
            for c in batch[k : k + RTTS_PER_TURN]:
                c.rtt_cache_ns = c.rtt_ns()
                if c.pub_counts:
                    self.publisher_rtt_ns[c.publisher] = c.rtt_cache_ns

    def record(self, topic: str, out: Sequence[tuple[object, Message]], now: int) -> None:
        """Add the estimate of every first delivery of ``topic`` in ``out`` (dispatched at
        ``now``) to the rounds that want it."""
        measuring = [m for m in self.running if m.topic == topic and m.until_ns > now]
        if not measuring:
            return
        rtt = self.publisher_rtt_ns
        for consumer, msg in out:
            if msg.attempts != 1:
                continue
            # Only client connections have an RTT (a consumer in a test may have none).
            sub_rtt: int = getattr(consumer, "rtt_cache_ns", 0)
            estimate = rtt.get(msg.publisher, 0) // 2 + (now - msg.arrival_ns) + sub_rtt // 2
            for m in measuring:
                if m.publishers is None or msg.publisher in m.publishers:
                    m.latency.add(estimate)

    async def run(
        self,
        topic: str,
        publishers: frozenset[str] | None,
        window_ns: int,
        clients: Iterable[MeasuredClient],
        settled: Callable[[], bool] | None = None,
    ) -> Measurement:
        """Run a round for ``window_ns`` and return it; cancelling the call ends the round.
        At most ``limit`` run or wait at once (MeasurementsBusy). ``clients``: the
        connections, whose RTTs are read afresh as the round starts. ``settled``: whether
        the topic's backlog has drained; the round starts once it has, or after
        ``MAX_SETTLE_NS``, so that it measures the placement rather than a move."""
        if not MIN_MEASURE_NS <= window_ns <= MAX_MEASURE_NS:
            raise ValueError(f"window {window_ns} ns is not within 1 ms..60 s")
        if len(self) >= self.limit:
            raise MeasurementsBusy(f"{len(self)} measurement rounds are running")
        self.settling += 1
        try:
            settle_ns, ok = await _settle(settled, MAX_SETTLE_NS)
        finally:
            self.settling -= 1
        await self.refresh_rtts(clients)
        m = Measurement(topic, publishers, time.time_ns() + window_ns)
        m.settle_ns, m.settled = settle_ns, ok
        self.running.append(m)
        try:
            await _ticks(m, LAG_TICK_NS)
        finally:
            self.running.remove(m)
        return m


async def _settle(settled: Callable[[], bool] | None, limit_ns: int) -> tuple[int, bool]:
    """Wait until ``settled()``, looking every ``LAG_TICK_NS``, for at most ``limit_ns``:
    (how long it waited, whether it settled)."""
    start = time.monotonic_ns()
    while settled is not None and not settled():
        waited = time.monotonic_ns() - start
        if waited >= limit_ns:
            return waited, False
        await asyncio.sleep(min(LAG_TICK_NS, limit_ns - waited) / 1e9)
    return time.monotonic_ns() - start, True


async def _ticks(m: Measurement, tick_ns: int) -> None:
    """Sleep until the round ends, in ticks, recording how late each one woke."""
    while (left := m.until_ns - time.time_ns()) > 0:
        step = min(tick_ns, left)
        due = time.monotonic_ns() + step
        await asyncio.sleep(step / 1e9)
        m.lag.add(max(1, time.monotonic_ns() - due))
