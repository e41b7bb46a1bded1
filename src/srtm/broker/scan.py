"""The scan: deferred messages that came due and in-flight messages that timed out.

Every ``--scan-interval-ms``, the scan visits only the channels with timers (deferred
messages or in-flight deadlines: a channel puts itself back in ``timed`` when it gets
one) and the topics with deferred messages (DPUB), so thousands of idle ones cost nothing.
With none of either it sleeps until one comes: an idle broker's loop then wakes about
twice a second (the housekeeping's idle pass and the deadlines), not a hundred.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from srtm.broker.state import Channel, Topic

T = TypeVar("T")


class Watched(set[T]):
    """A set that calls ``wake`` when something is added to it empty (the scan may be
    asleep then); otherwise a plain set."""

    def __init__(self, wake: Callable[[], None]) -> None:
        super().__init__()
        self._wake = wake

    def add(self, item: T) -> None:
        if not self:
            self._wake()
        super().add(item)


class Scan:
    """The channels and topics with timers, and the loop that moves them on when due.
    ``mark_ready`` has a channel dispatched, ``kick`` a topic's shaping queue released;
    ``clear`` returns once no shaped release is due soon (``Releaser.clear``)."""

    def __init__(
        self,
        topics: dict[str, Topic],
        mark_ready: Callable[[Channel], None],
        kick: Callable[[Topic], None],
        clear: Callable[[], Awaitable[None]],
    ) -> None:
        self._topics = topics
        self._mark_ready = mark_ready
        self._kick = kick
        self._clear = clear
        #: Set while ``timed`` or ``deferring`` may hold something: the scan's loop runs.
        self._busy = asyncio.Event()
        #: Channels with deferred messages or in-flight deadlines: all that ``scan`` visits.
        self.timed: Watched[Channel] = Watched(self._busy.set)
        #: Topics with deferred messages (DPUB): the scan moves them on when due.
        self.deferring: Watched[Topic] = Watched(self._busy.set)

    def watch(self, ch: Channel) -> Channel:
        """Have the scan look at ``ch`` whenever it has timers."""
        if ch.watch is None:
            ch.watch = self.timed
            if ch.next_due_ns() is not None:  # what the topic deferred before it existed
                self.timed.add(ch)
        return ch

    async def run(self, interval_s: float) -> None:
        while True:
            if not self.timed and not self.deferring:
                self._busy.clear()
                await self._busy.wait()
            await asyncio.sleep(interval_s)
            # A scan of many channels takes tens of µs: a release due meanwhile goes first.
            await self._clear()
            self.scan(time.time_ns())

    def scan(self, now: int) -> None:
        # A function of its own: no loop variable keeps a deleted topic alive while the
        # loop sleeps (freeing it later, all at once, stalled the loop).
        for ch in list(self.timed):
            due = ch.next_due_ns()
            if due is None:
                self.timed.discard(ch)  # it puts itself back when it gets a timer
            elif due <= now and ch.tick(now):
                self._mark_ready(ch)
        for topic in list(self.deferring):
            self.tick_topic(topic, now)

    def tick_topic(self, topic: Topic, now: int) -> None:
        """Deferred messages of ``topic`` due by ``now`` join its shaping queue."""
        if self._topics.get(topic.name) is not topic or not topic.deferred_count:
            self.deferring.discard(topic)  # deleted, or nothing deferred left
            return
        due = topic.next_deferred_ns()
        if due is not None and due <= now and topic.tick(now):
            self._kick(topic)
