"""The end-of-turn dispatch: scheduled only where there is something to take."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from srtm.broker.dispatch import Dispatcher
from srtm.broker.measurement import Measurements
from srtm.broker.message import Message
from srtm.broker.queue import Record
from srtm.broker.state import Channel, Consumer, memory_queues
from srtm.broker.stats import BrokerStats


@dataclass
class Subscriber:
    rdy: int = 5
    in_flight: int = 0
    msg_timeout_ns: int = 60_000_000_000


def counted_channel() -> tuple[Channel, list[int]]:
    """A channel with one consumer whose every ``take`` is counted."""
    ch = Channel("t", "c", memory_queues()("t/c"))
    ch.add_consumer(Subscriber(), 0)
    takes: list[int] = []
    take = ch.take

    def counting(now: int) -> list[tuple[Consumer, list[Record]]]:
        takes.append(now)
        return take(now)

    ch.take = counting
    return ch, takes


async def test_a_channel_with_nothing_queued_is_not_dispatched() -> None:
    """A consumer's FINs, RDY or TOUCH mark its channel ready: with its queue empty there
    is nothing to take, and no loop callback is spent on it."""
    dispatcher = Dispatcher({}, BrokerStats(), Measurements(), emulated_server=False)
    ch, takes = counted_channel()
    dispatcher.mark_ready(ch)
    await asyncio.sleep(0)
    assert takes == []


async def test_a_channel_with_a_message_queued_is_dispatched_once_per_turn() -> None:
    dispatcher = Dispatcher({}, BrokerStats(), Measurements(), emulated_server=False)
    ch, takes = counted_channel()
    ch.put(Message(b"0" * 16, b"x", 1, 1))
    ch.paused = True  # taken nothing, so no client is needed to send to
    for _ in range(3):
        dispatcher.mark_ready(ch)
    await asyncio.sleep(0)
    assert len(takes) == 1
