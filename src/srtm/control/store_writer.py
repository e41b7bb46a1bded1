"""The controller's rows written to its store (``srtm.control.store``) off the event loop:
rows marked dirty, encoded on the loop in batches at most every ``WRITE_INTERVAL_S``,
written in order by one thread."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from srtm.control.actions import Action, DropRoute, Hold, PlanChanged, SetBucket, SetRoute, Unmanage
from srtm.control.state import Controller
from srtm.control.store import BROKERS_KEY, BUCKETS_PREFIX, LEGACY_KEY, TOPIC_PREFIX, StateStore

log = logging.getLogger("srtm.controller")

#: Batches of rows go to the writer thread at most this often (s): the most a change
#: waits to be saved (and its plan to reach brokers) while changes come faster than this.
WRITE_INTERVAL_S = 0.05

T = TypeVar("T")


class StoreWriter:
    """The rows marked since the last batch, and the batch on its way to the thread."""

    def __init__(
        self,
        ctrl: Controller,
        store: StateStore,
        on_unsaved: Callable[[Exception], None] | None = None,
    ) -> None:
        self.ctrl = ctrl
        self.store = store
        #: Told when a write failed: fenced (another controller leads now), or not taken.
        self.on_unsaved = on_unsaved
        #: The file holds the old single ``controller`` row: the first write replaces it.
        self._legacy = store.get(LEGACY_KEY) is not None
        #: SQLite writes leave the event loop, in order, in this one thread: the batch
        #: being written, and the one that gathers rows marked meanwhile (``mark``).
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="srtm-store")
        self._writing: asyncio.Future[None] | None = None
        self._next_write: asyncio.Future[None] | None = None
        self._dirty_topics: set[str] = set()
        self._dirty_buckets: set[str] = set()
        self._dirty_brokers = False
        #: When the last batch began (the loop's clock).
        self._last_flush = -math.inf
        #: Documents encoded for the store, and their bytes (what a change costs).
        self.encodes = 0
        self.encoded_bytes = 0

    def mark(
        self, topics: Iterable[str] = (), buckets: Iterable[str] = (), brokers: bool = False
    ) -> asyncio.Future[None]:
        """Have these rows written (``srtm.control.store``): the future of the write that
        will carry them (a failed write is logged, and its future raises the error: a
        handler answers only once its change is saved, and says so when it is not).
        Rows marked while a write is on its way, or within ``WRITE_INTERVAL_S`` of the
        last one, go in the next batch, encoded once however many changes touched them
        meanwhile: a burst of joins costs one encoding of its topic, and at most one
        batch waits for the writer thread (memory stays bounded however fast changes
        come)."""
        self._dirty_topics.update(topics)
        self._dirty_buckets.update(buckets)
        self._dirty_brokers = self._dirty_brokers or brokers
        if self._next_write is None:
            loop = asyncio.get_running_loop()
            self._next_write = loop.create_future()
            # A shield whose caller was cancelled first stops looking at this future:
            # its error is logged by ``_written``, not left for asyncio to warn of.
            self._next_write.add_done_callback(_retrieved)
            if self._writing is None:
                self._schedule_flush()
        # Shielded: a caller cancelled while it waits (a task ended at stop) must not
        # cancel the write every other caller of this batch waits for.
        outer = asyncio.shield(self._next_write)
        outer.add_done_callback(_retrieved)  # whoever does not wait: the log has it
        return outer

    async def read(self, load: Callable[[StateStore], T]) -> T:
        """``load(store)`` on the writer's thread: after every batch handed to it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, load, self.store)

    def persist(self, actions: list[Action]) -> asyncio.Future[None] | None:
        """Have what ``actions`` changed written: the rows of the topics whose plan or
        routes changed, the buckets of those whose shares did; the future of that write
        (None: nothing to write)."""
        topics = {
            a.topic for a in actions if isinstance(a, PlanChanged | Unmanage | SetRoute | DropRoute)
        }
        buckets = {a.topic for a in actions if isinstance(a, SetBucket | Hold)}
        if not topics and not buckets:
            return None
        return self.mark(topics, buckets)

    async def close(self) -> None:
        """Every marked row written, the thread stopped."""
        while (pending := self._next_write or self._writing) is not None:
            with contextlib.suppress(Exception):  # a failed write is logged
                await pending
        await asyncio.to_thread(self._writer.shutdown, wait=True)

    def _schedule_flush(self) -> None:
        """The next batch goes now, or ``WRITE_INTERVAL_S`` after the last one began:
        under a flood of changes a topic's row is encoded at most that often, however
        many joins come meanwhile; a change after a quiet spell is written at once."""
        loop = asyncio.get_running_loop()
        wait = self._last_flush + WRITE_INTERVAL_S - loop.time()
        if wait > 0:
            loop.call_later(wait, self._flush)
        else:
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Encode the marked rows, on the loop (a snapshot of state it owns), and hand
        them to the writer thread as one batch."""
        done, self._next_write = self._next_write, None
        if done is None:
            return
        self._last_flush = asyncio.get_running_loop().time()
        rows = self._rows()
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(self._writer, self.store.write, rows)
        self._writing.add_done_callback(partial(self._written, done, len(rows)))

    def _rows(self) -> list[tuple[str, str | None]]:
        topics, buckets = self._dirty_topics, self._dirty_buckets
        self._dirty_topics, self._dirty_buckets = set(), set()
        rows: list[tuple[str, str | None]] = []
        if self._legacy:  # an old file's single row: replaced by rows, all of them
            self._legacy = False
            topics |= set(self.ctrl.topics)
            self._dirty_brokers = True
            rows.append((LEGACY_KEY, None))
        if self._dirty_brokers:
            self._dirty_brokers = False
            rows.append((BROKERS_KEY, self._encode(self.ctrl.brokers_json())))
        for name in sorted(topics):
            if name in self.ctrl.topics:
                rows.append((TOPIC_PREFIX + name, self._encode(self.ctrl.topic_json(name))))
                rows.append((BUCKETS_PREFIX + name, None))  # the row above has them
            else:  # deleted
                rows += [(TOPIC_PREFIX + name, None), (BUCKETS_PREFIX + name, None)]
        for name in sorted(buckets - topics):
            topic = self.ctrl.topics.get(name)
            if topic is not None:
                doc = {b: {"rate": p.rate, "burst": p.burst} for b, p in topic.buckets.items()}
                rows.append((BUCKETS_PREFIX + name, self._encode(doc)))
        return rows

    def _encode(self, doc: Any) -> str:
        text = json.dumps(doc)
        self.encodes += 1
        self.encoded_bytes += len(text)
        return text

    def _written(
        self, done: asyncio.Future[None], rows: int, written: asyncio.Future[None]
    ) -> None:
        self._writing = None
        if written.cancelled():
            done.cancel()
        else:
            if (exc := written.exception()) is None:
                done.set_result(None)
            else:
                log.error("could not save %d rows to the controller's database: %s", rows, exc)
                done.set_exception(exc)
                if isinstance(exc, Exception) and self.on_unsaved is not None:
                    self.on_unsaved(exc)
        if self._next_write is not None:  # marked meanwhile: the next batch
            self._schedule_flush()


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a write's error as seen (logged by ``_written``), so that asyncio does not
    warn of it again for a caller that did not wait."""
    if not future.cancelled():
        future.exception()
