"""The broker's housekeeping: histograms' waiting values flushed, the lease looked at,
overflowed messages handed to the OS and traces rolled.

While the broker works it runs every 100 ms. Once a pass finds no topic used since the
last one it waits for the next use (the first topic stats handed out) or the next
second's work, whichever comes first: an idle broker's loop then wakes about twice a
second (this and the deadlines), where every wake-up runs cold, not about ten times.
Under a controller's lease it keeps to 100 ms: a lapsed lease holds shaped topics even
with nothing to release, and that is noticed here. Reads that use no topic (NOPs) add
their stamp gaps meanwhile: a second's worth at most waits for the idle pass.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from srtm.broker.dispatch import Dispatcher
from srtm.broker.measurement import Measurements
from srtm.broker.persistence import Persistence
from srtm.broker.release import Releaser
from srtm.broker.shares import Shares
from srtm.broker.stats import BrokerStats
from srtm.broker.tcp import Client

#: Between passes while the broker works (a pass flushes what reached ``FLUSH_AT``).
BUSY_PAUSE_S = 0.1
#: The disk's sync and the traces' roll, whatever the load.
ROLL_S = 1.0


class HousekeepingHost(Protocol):
    """What the housekeeping looks after (``srtm.broker.broker.Broker``)."""

    stats: BrokerStats
    shares: Shares
    releaser: Releaser
    measurements: Measurements
    persistence: Persistence
    dispatcher: Dispatcher
    clients: set[Client]


def _resolve(waiter: asyncio.Future[bool], used: bool) -> None:
    if not waiter.done():
        waiter.set_result(used)


class Housekeeping:
    """The housekeeping of ``host``; ``run`` is its loop. Waking it is the stats'
    ``on_touch``: the first topic stats handed out after a pass."""

    def __init__(self, host: HousekeepingHost) -> None:
        self._host = host
        #: What an idle wait waits for (None: not waiting idle).
        self._waiter: asyncio.Future[bool] | None = None
        #: Passes so far (tests see an idle loop make none).
        self.passes = 0
        host.stats.on_touch = self.wake

    def wake(self) -> None:
        """A topic was used: an idle wait ends (the pass then comes ``BUSY_PAUSE_S``
        later, as while working, so the use's own loop turn is not charged with it)."""
        if (waiter := self._waiter) is not None:
            _resolve(waiter, True)

    async def run(self) -> None:
        host = self._host
        rolled = time.monotonic()
        used = True
        while True:
            idle = not used and not host.shares.leased
            # working, or woken from idle by a use (not by the second's work): a pause
            if not idle or await self._idle(rolled + ROLL_S - time.monotonic()):
                await asyncio.sleep(BUSY_PAUSE_S)
            used = await self._pass()
            if time.monotonic() - rolled >= ROLL_S:
                rolled = time.monotonic()
                await self._roll()

    async def _idle(self, timeout_s: float) -> bool:
        """Until a topic is used (True) or ``timeout_s`` has passed (False)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(max(0.0, timeout_s), _resolve, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def _pass(self) -> bool:
        """Every histogram holding ``stats.FLUSH_AT`` values or more flushed, one a loop
        turn, none by a release due soon (``clear``); whether any topic was used since
        the last pass."""
        host = self._host
        self.passes += 1
        host.shares.lease_ok()  # a lapsed lease holds shaped topics
        await host.releaser.clear()  # looking for them takes ~100 µs at 40 topics
        used = host.stats.used
        recorders = host.stats.pending_recorders()
        for rec in recorders:
            await host.releaser.clear()
            rec.flush()
            await asyncio.sleep(0)
        del recorders  # no reference to a deleted topic's histograms while sleeping
        return used

    async def _roll(self) -> None:
        host = self._host
        if host.measurements.running:  # only rounds use them (a syscall each)
            await host.measurements.refresh_rtts(host.clients)
        await host.persistence.housekeep()
        if (traces := host.dispatcher.traces) is not None:
            traces.maybe_roll()
