"""Which brokers hold a live key in etcd (``PREFIX/live/BROKER_ID``, on the broker's own
lease: srtm.broker.liveness), for a controller with ``--etcd-endpoints``.

``LiveBrokers`` (pure) is what the tick's failover step reads (``brokers.expire``): a
broker holding a live key is never down for silence; one whose key etcd deleted (its lease
expired or was revoked) is down at the next tick; one that never had a key keeps the
report-silence rule. ``LivenessWatch`` fills it: an initial range of ``PREFIX/live/``, then
a watch from the revision before it. The service creates, starts and stops it, and asks
it to ``revoke`` the lease of a broker whose address refuses connections (its process is
gone) before marking it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from srtm.etcd import Etcd, EtcdError, EventKind, KeyValue, WatchEvent

log = logging.getLogger("srtm.controller")

#: After a failed initial range, the next try comes this much later (s).
RETRY_S = 0.5


def live_prefix(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/live/"


def lease_in(value: str) -> int:
    """The lease a liveness key's value names (0: none readable)."""
    try:
        lease = json.loads(value).get("lease", 0)
    except (ValueError, AttributeError):
        return 0
    return lease if isinstance(lease, int) and not isinstance(lease, bool) else 0


@dataclass
class LiveBrokers:
    """The brokers with a live key, and those whose key was deleted since the last tick."""

    #: The key prefix, ``PREFIX/live/``.
    prefix: str
    #: Broker id -> the lease its key is on (0: not readable).
    leases: dict[str, int] = field(default_factory=dict)
    #: Brokers whose key was deleted, not yet taken by a tick.
    deleted: set[str] = field(default_factory=set)

    def broker_of(self, key: str) -> str | None:
        bid = key.removeprefix(self.prefix)
        return bid if bid != key and bid else None

    def load(self, kvs: Sequence[KeyValue]) -> None:
        """The keys as a range read them (the state before the watch's first event)."""
        self.leases = {}
        for kv in kvs:
            if (bid := self.broker_of(kv.key)) is not None:
                self.leases[bid] = kv.lease or lease_in(kv.value)

    def apply(self, event: WatchEvent) -> None:
        bid = self.broker_of(event.key)
        if bid is None:
            return
        if event.kind is EventKind.PUT:
            self.leases[bid] = lease_in(event.value)
        elif self.leases.pop(bid, None) is not None:
            self.deleted.add(bid)

    def holds(self, broker_id: str) -> bool:
        """Whether the broker holds a live key: its shares are its own until etcd
        deletes it."""
        return broker_id in self.leases

    def take_deleted(self) -> set[str]:
        """Brokers whose key was deleted and not put again since: down. A key put again
        is a broker that lapsed (it held everything) and registers again by itself."""
        gone = {b for b in self.deleted if b not in self.leases}
        self.deleted = set()
        return gone


class LivenessWatch:
    """Follows ``PREFIX/live/`` in etcd into ``brokers``."""

    def __init__(self, endpoints: Sequence[str], prefix: str) -> None:
        self.brokers = LiveBrokers(live_prefix(prefix))
        self.etcd = Etcd(list(endpoints))
        self._task: asyncio.Task[None] | None = None
        self._revision: int | None = None

    async def start(self) -> None:
        """Read the keys now if etcd answers (else the watch task keeps trying), then
        follow their changes."""
        with contextlib.suppress(EtcdError):
            await self._load()
        self._task = asyncio.create_task(self._follow(), name="srtm-liveness-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.etcd.close()

    async def revoke(self, broker_id: str) -> bool:
        """End the broker's lease (its key goes with it): only for a broker whose process
        is gone. False if etcd did not answer: its lease then decides as before."""
        lease = self.brokers.leases.get(broker_id)
        if lease is None:
            return True  # no key: the silence rule applies
        try:
            if lease:
                await self.etcd.revoke(lease)
            else:  # a key whose lease cannot be read: delete the key itself
                await self.etcd.delete(self.brokers.prefix + broker_id)
        except EtcdError as e:
            log.warning("could not revoke broker %s's liveness lease: %s", broker_id, e)
            return False
        self.brokers.leases.pop(broker_id, None)
        return True

    async def _load(self) -> None:
        # The revision first: a change between it and the range is seen again by the
        # watch (a put or a delete applied twice ends in the same state).
        revision = await self.etcd.revision()
        self.brokers.load(await self.etcd.range_prefix(self.brokers.prefix))
        self._revision = revision

    async def _follow(self) -> None:
        while self._revision is None:
            try:
                await self._load()
            except EtcdError as e:
                log.warning("cannot read the brokers' liveness keys: %s", e)
                await asyncio.sleep(RETRY_S)
        async for event in self.etcd.watch(self.brokers.prefix, self._revision + 1):
            self.brokers.apply(event)
            if event.kind is EventKind.DELETE:
                log.info("liveness key %s deleted", event.key)
