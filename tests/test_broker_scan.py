"""The scan ticks only while some channel or topic has a timer, and wakes when one gets one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from srtm.broker.message import Message
from srtm.broker.scan import Scan
from srtm.broker.state import Channel, Topic, memory_queues

INTERVAL_S = 0.001
#: Long enough for a ticking scan to tick many times, short enough for a test.
IDLE_S = 0.05


class Counted(Scan):
    """A scan that counts its passes and the channels and topics it moved on."""

    def __init__(self, topics: dict[str, Topic]) -> None:
        self.ready: list[Channel] = []
        self.kicked: list[Topic] = []
        super().__init__(topics, self.ready.append, self.kicked.append)
        self.passes = 0

    def scan(self, now: int) -> None:
        self.passes += 1
        super().scan(now)


@asynccontextmanager
async def running(scan: Scan) -> AsyncIterator[None]:
    task = asyncio.create_task(scan.run(INTERVAL_S))
    try:
        yield
    finally:
        task.cancel()


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(INTERVAL_S)


def message(arrival: int) -> Message:
    return Message(b"%016x" % 1, b"body", arrival, arrival)


async def test_the_scan_does_not_tick_with_no_timer_to_watch() -> None:
    topic = Topic("t", memory_queues())
    scan = Counted({"t": topic})
    scan.watch(topic.channel("c"))  # a channel with nothing deferred or in flight
    async with running(scan):
        await asyncio.sleep(IDLE_S)
    assert scan.passes == 0


async def test_a_channel_that_gets_a_timer_wakes_the_scan_and_idle_it_stops() -> None:
    topic = Topic("t", memory_queues())
    scan = Counted({"t": topic})
    ch = scan.watch(topic.channel("c"))
    async with running(scan):
        await asyncio.sleep(IDLE_S)
        ch.defer(message(0), time.time_ns())  # due now: the next pass moves it on
        await until(lambda: scan.ready == [ch])
        assert ch.deferred_count == 0 and ch.depth == 1
        await until(lambda: not scan.timed)  # the pass after drops it: nothing is due
        passes = scan.passes
        await asyncio.sleep(IDLE_S)
    assert scan.passes == passes


async def test_a_topic_that_defers_wakes_the_scan() -> None:
    topic = Topic("t", memory_queues())
    topic.channel("c")
    scan = Counted({"t": topic})
    async with running(scan):
        await asyncio.sleep(IDLE_S)
        topic.defer(message(0), time.time_ns())
        scan.defer(topic)
        await until(lambda: scan.kicked == [topic])
