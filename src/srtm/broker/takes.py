"""Publishes of more than ``PUBLISH_SLICE`` messages, taken in slices over loop turns.

One 5 MiB MPUB is a million messages: seconds of work in one turn (shaped, each is booked
on the meter on its own). ``Takes`` takes one slice now and one per loop turn after, sized
so that the slices of all such publishes take about ``SLICE_S`` per turn together, so that
the loop serves everyone else in between; the collector's oldest generation is left alone
meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from srtm.broker.queue import PUBLISH_SLICE
from srtm.broker.state import Topic

#: How long the slices of sliced publishes should take per loop turn, all together (s):
#: answering /ping takes a few turns; a first slice's size, and the smallest.
SLICE_S = 0.002
FIRST_SLICE = 512
MIN_SLICE = 64
#: The collector's oldest generation is looked at after this many middle ones (CPython's
#: default), and while publishes are taken in slices (never, in practice: 7 billion
#: allocations).
_GEN2_THRESHOLD = gc.get_threshold()[2]
_TAKE_GEN2_THRESHOLD = 1_000_000

#: What takes one slice: ``Broker``'s publish in one go (topic, bodies, arrival,
#: publisher), returning what its OK waits for.
Put = Callable[[Topic, list[bytes], int, str | None], asyncio.Future[Any] | None]


@dataclass(eq=False)
class Take:
    """A publish taken in slices: ``taken`` messages so far, and the writes its OK waits
    for."""

    topic: Topic
    bodies: list[bytes]
    arrival: int
    publisher: str | None
    taken: int = 0
    writes: list[asyncio.Future[Any]] = field(default_factory=list)


class Takes:
    """The publishes being taken in slices, and the tasks taking them."""

    def __init__(self, topics: dict[str, Topic], put: Put) -> None:
        self._topics = topics
        self._put = put
        self._takes: dict[Take, asyncio.Task[None]] = {}

    def take(self, take: Take) -> asyncio.Future[Any]:
        """One slice now, the rest one per loop turn after. Whatever was checked before
        the first slice holds for all: none is refused once the first is taken. Returns a
        future done once every slice is taken and written, as ``Broker.publish``'s."""
        if not self._takes:
            # While a million-message publish is taken, a full collection walks every
            # element of its list of bodies and of the disk queue's buffer of records
            # (40-50 ms, a few times per MPUB, though the oldest generation held 3,600
            # objects). Both are gone once it is taken and written; the young
            # generations go on as ever (disabling the collector instead left one young
            # collection of everything at the end: 300 ms).
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, _TAKE_GEN2_THRESHOLD)
        self._slice(take, FIRST_SLICE)
        task = asyncio.ensure_future(self._rest(take))
        self._takes[take] = task
        return task

    def _slice(self, take: Take, n: int) -> None:
        start, end = take.taken, min(take.taken + n, len(take.bodies))
        take.taken = end
        if self._topics.get(take.topic.name) is not take.topic:
            # Deleted meanwhile: as if deleted after the publish, with what it held.
            take.taken = len(take.bodies)
            return
        written = self._put(take.topic, take.bodies[start:end], take.arrival, take.publisher)
        if written is not None:
            take.writes.append(written)

    async def _rest(self, take: Take) -> None:
        n = FIRST_SLICE
        try:
            while True:
                await asyncio.sleep(0)  # a loop turn for everyone else
                if take.taken >= len(take.bodies):  # ``finish`` may have taken the rest
                    break
                start = time.perf_counter()
                self._slice(take, n)
                spent = time.perf_counter() - start
                # Takes running together share a turn's time (one each per turn).
                share = SLICE_S / len(self._takes)
                n = max(MIN_SLICE, min(PUBLISH_SLICE, int(n * share / max(spent, 1e-6))))
            # Written, the records leave the disk queue's buffer; the bodies go now.
            take.bodies = []
            if take.writes:
                await asyncio.gather(*take.writes)
        finally:
            self._takes.pop(take, None)
            if not self._takes:
                gc.set_threshold(*gc.get_threshold()[:2], _GEN2_THRESHOLD)

    def finish(self) -> None:
        """At stop: what sliced publishes have left is taken now, so that each is saved
        whole (never acknowledged: their connections are closed)."""
        for take, task in list(self._takes.items()):
            while take.taken < len(take.bodies):
                self._slice(take, PUBLISH_SLICE)
            task.cancel()
        self._takes.clear()
        gc.set_threshold(*gc.get_threshold()[:2], _GEN2_THRESHOLD)
