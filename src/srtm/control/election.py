"""The election of one leader among the controllers on one etcd prefix, and the watch a
standby follows the state by: the asyncio edge around ``srtm.control.leadership``.

A campaign grants a lease of ``--leader-lease-s`` and creates ``PREFIX/leader`` on it
only if it is absent (``Compare.created(key, 0)``); the winner's epoch is the revision
that created it. The leader sends a keepalive every lease/4; an answer of 0 (the lease
is gone) or renewals failing past ``ACTING_FRACTION`` × the lease make it a standby. A
standby campaigns when the key is deleted (seen by its watch) and every lease anyway.
Stopping revokes the lease, so a standby takes over without waiting for it to expire."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from srtm.control.leadership import LEADER_KEY, LeaderInfo, Leadership, Role
from srtm.etcd import Compare, Etcd, EtcdError, EventKind, Op, WatchEvent

log = logging.getLogger("srtm.controller")

#: A watch that failed for good (a compacted revision) is opened again after this (s).
REWATCH_S = 0.5


class Election:
    """Campaigns, keeps the lease alive while leading, and watches the prefix.

    ``on_won(epoch)`` runs before the leadership acts (the service fences its store and
    reloads the state); ``on_lost()`` after it stopped acting; ``on_change()`` for every
    change of the state's keys while not leading."""

    def __init__(
        self,
        etcd: Etcd,
        prefix: str,
        leadership: Leadership,
        *,
        on_won: Callable[[int], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
        on_change: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.etcd = etcd
        self.key = prefix.rstrip("/") + "/" + LEADER_KEY
        self.leadership = leadership
        self._on_won, self._on_lost, self._on_change = on_won, on_lost, on_change
        self._clock = clock
        #: The lease the leader key is (or was last) put on (0: none).
        self.lease = 0
        self._vacant = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def ttl_s(self) -> int:
        """etcd's leases are whole seconds."""
        return max(1, int(-(-self.leadership.lease_s // 1)))

    def fence(self) -> Compare:
        """The condition every write of this leader carries (one that never holds when
        not leading: a standby writes nothing)."""
        epoch = self.leadership.epoch
        return Compare.created(self.key, -1 if epoch is None else epoch)

    async def start(self, start_revision: int) -> None:
        """One campaign now (so the role printed at start is known), then the loops;
        ``start_revision``: where the watch starts (after the state was loaded)."""
        with contextlib.suppress(EtcdError):
            await self.campaign()
        self._tasks = [
            asyncio.create_task(self._run()),
            asyncio.create_task(self._watch(start_revision)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.lease:  # a standby takes over now, not once the lease expires
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(self.lease)
            self.leadership.lost()
        await self.etcd.close()

    def step_down(self, why: str) -> None:
        """Stop acting at once (a write was fenced: another leads)."""
        if self.leadership.role is Role.LEADER:
            log.warning("controller: no longer the leader (%s)", why)
            self.leadership.lost()

    # -- the campaign ----------------------------------------------------------------------
    async def campaign(self) -> bool:
        """Try to create the leader key; True: this controller leads (and ``on_won`` ran)."""
        me = self.leadership.me
        sent = self._clock()
        lease = await self.etcd.grant(self.ttl_s)
        try:
            result = await self.etcd.txn(
                [Compare.created(self.key, 0)], [Op.put(self.key, me.to_json(), lease)]
            )
        except BaseException:
            await self._revoke(lease)
            raise
        if not result.succeeded:
            await self._revoke(lease)
            found = await self.etcd.get(self.key)
            self.leadership.saw_leader(None if found is None else _leader_of(found.value))
            return False
        self.lease = lease
        try:
            self.leadership.epoch = result.revision  # what the fence and on_won read
            await self._on_won(result.revision)
        except BaseException:
            self.leadership.epoch = None
            await self._revoke(lease)
            self.lease = 0
            raise
        self.leadership.won(result.revision, sent)
        log.info("controller %s leads (epoch %d)", me.id, result.revision)
        return True

    async def _run(self) -> None:
        """Lead while the lease holds; campaign again whenever the key may be free."""
        while True:
            try:
                if self.leadership.role is Role.LEADER:
                    await self._keep()
                    await self._lose()
                elif not await self.campaign():
                    self._vacant.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.leadership.lease_s):  # keeps a cancel
                            await self._vacant.wait()
            except EtcdError as e:
                log.warning("leader election: %s", e)
                await asyncio.sleep(self.leadership.lease_s / 4)
            except Exception:
                log.exception("leader election failed; trying again")
                await asyncio.sleep(self.leadership.lease_s / 4)

    async def _keep(self) -> None:
        """Keepalives every lease/4 until the lease is gone or renewals lapsed."""
        lead = self.leadership
        while lead.role is Role.LEADER:
            await asyncio.sleep(lead.lease_s / 4)
            sent = self._clock()
            try:
                async with asyncio.timeout(lead.lease_s / 2):
                    ttl = await self.etcd.keepalive(self.lease)
            except (EtcdError, TimeoutError) as e:
                log.warning("leader lease keepalive failed: %s", e)
                ttl = None
            if ttl == 0:
                self.step_down("its lease is gone")
            elif ttl is not None:
                lead.renewed(sent)
            if lead.lapsed(self._clock()):
                self.step_down("its lease could not be renewed in time")

    async def _lose(self) -> None:
        """After leading: give the key up (if it is still ours) and follow the state."""
        lease, self.lease = self.lease, 0
        self.leadership.lost()
        await self._revoke(lease)
        await self._on_lost()

    async def _revoke(self, lease: int) -> None:
        if lease:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(lease)

    # -- the watch -------------------------------------------------------------------------
    async def _watch(self, start_revision: int) -> None:
        """Every change under the prefix: the leader key's tell who leads (and when to
        campaign), the others that the state changed."""
        revision = start_revision
        prefix = self.key[: -len(LEADER_KEY)]
        while True:
            try:
                async for event in self.etcd.watch(prefix, revision):
                    revision = event.revision + 1
                    self._seen(event)
            except EtcdError as e:  # e.g. compacted past ``revision``: read it all again
                log.warning("watch on %s: %s", prefix, e)
                await asyncio.sleep(REWATCH_S)
                with contextlib.suppress(EtcdError):
                    revision = await self.etcd.revision() + 1
                self._on_change()

    def _seen(self, event: WatchEvent) -> None:
        if event.key != self.key:
            # Brokers' liveness keys (``PREFIX/live/``) are no saved state.
            live = event.key.startswith(self.key[: -len(LEADER_KEY)] + "live/")
            if self.leadership.role is not Role.LEADER and not live:
                self._on_change()
            return
        leader = None if event.kind is EventKind.DELETE else _leader_of(event.value)
        lead = self.leadership
        # An event from before its own campaign (a watch behind) says nothing of it.
        if lead.role is Role.LEADER and event.revision > (lead.epoch or 0) and leader != lead.me:
            self.step_down("the leader key is no longer its own")  # deleted by hand?
        self.leadership.saw_leader(leader)
        if leader is None:
            self._vacant.set()


def _leader_of(value: str) -> LeaderInfo | None:
    try:
        return LeaderInfo.from_json(value)
    except ValueError as e:
        log.warning("%s", e)
        return None
