"""Connections whose peer went away, closed a slice at a time.

When many clients go at once (a fleet of sensors losing its network, a load balancer
restarting), closing each connection in the read that finds its end runs every close
in one loop turn: the session's teardown, its in-flight messages requeued, close(2),
20-30 µs each, so 2,000 of them held the loop for some 50 ms
(``benchmarks/churn.py``) while every other connection's reads, answers and
deliveries waited. Those reads only stop reading and queue their connection here; the
queue is closed for at most ``budget_ns`` a loop turn, a due shaped release going
before each close, and the loop polls every socket between slices.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("srtm.broker")

#: How long one loop turn spends closing (ns): a few dozen closes.
SLICE_NS = 500_000


class Closable(Protocol):
    def close(self) -> None: ...


class Closer:
    """Closes what ``add`` is given, in order, for at most ``budget_ns`` a loop turn
    (one close at least), calling ``release_due`` before each."""

    def __init__(
        self,
        release_due: Callable[[], object],
        budget_ns: int = SLICE_NS,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.budget_ns = budget_ns
        self._release_due = release_due
        self._clock = clock
        self._queue: deque[Closable] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, conn: Closable) -> None:
        """Close ``conn`` in a slice from the next loop turn on (closing one twice is
        harmless: a closed connection's ``close`` does nothing)."""
        self._queue.append(conn)
        if not self._scheduled:
            self._scheduled = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._slice)

    def _slice(self) -> None:
        queue, clock = self._queue, self._clock
        end = clock() + self.budget_ns
        while queue:
            self._release_due()
            conn = queue.popleft()
            try:
                conn.close()
            except Exception:  # the rest are still closed (each was a callback of its own)
                log.exception("closing a connection whose peer went failed")
            if clock() >= end:
                break
        if queue and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon(self._slice)
        else:
            self._scheduled = False
