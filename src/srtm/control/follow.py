"""A controller's state read again from its store into the same ``Controller`` (the API's
handlers hold that object): when it becomes the leader (the last leader's state), when it
stops leading (what was written, not what it held), and, as a standby, after every change
its watch sees (``changed``: debounced, so a burst of writes costs one read)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from srtm.control.state import Controller
from srtm.control.store import load_state
from srtm.control.store_writer import StoreWriter

log = logging.getLogger("srtm.controller")

#: A standby reads the state this long after the first change of a burst (s).
DEBOUNCE_S = 0.05
#: A read that failed (etcd away) is tried again after this long (s).
RETRY_S = 0.5


def replace_state(ctrl: Controller, doc: dict[str, object] | None, now: float) -> None:
    """``ctrl`` holds ``doc`` (None: nothing saved) and nothing else of what it held; its
    settings, counters and nsqlookupd's registry (reports refill it) stay."""
    ctrl.brokers.clear()
    ctrl.topics.clear()
    ctrl.replace_pending = False
    ctrl.last_tick_s = None  # the time it did not tick is no stall of its own
    if doc:
        ctrl.restore(doc, now)


class Follower:
    """Reloads, one at a time, in the store's order (on the writer's thread)."""

    def __init__(
        self, ctrl: Controller, writer: StoreWriter, following: Callable[[], bool]
    ) -> None:
        self.ctrl, self.writer = ctrl, writer
        #: Whether changes seen are someone else's (a standby): a leader's are its own.
        self.following = following
        self._lock = asyncio.Lock()
        self._pending: asyncio.Task[None] | None = None
        self._dirty = False
        #: Reloads done (for tests and the log).
        self.reloads = 0

    async def reload(self) -> None:
        """The whole state read again now (EtcdError/StoreError raised)."""
        async with self._lock:
            await self._reload()

    async def _reload(self) -> None:
        doc = await self.writer.read(load_state)
        replace_state(self.ctrl, doc, time.monotonic())
        self.reloads += 1

    def changed(self) -> None:
        """The watch saw a change: read it all again soon (once per burst; a change seen
        while a read is on its way gets a read after it)."""
        self._dirty = True
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        while self._dirty:
            await asyncio.sleep(DEBOUNCE_S)
            self._dirty = False
            async with self._lock:
                if not self.following():
                    return
                try:
                    await self._reload()
                    continue
                except Exception as e:  # etcd away: the state stays as it was, for now
                    log.warning("could not read the state from the store: %s", e)
                    self._dirty = True
            await asyncio.sleep(RETRY_S)

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pending
