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
from typing import Protocol

from srtm.etcd import Etcd, EtcdError, EventKind, KeyValue, WatchEvent, endpoint_urls

log = logging.getLogger("srtm.controller")

#: After a failed initial range, the next try comes this much later (s).
RETRY_S = 0.5


def live_prefix(prefix: str) -> str:
    return f"{prefix.rstrip('/')}/live/"


@dataclass(frozen=True)
class LiveKey:
    """A broker's liveness key, as its value reads."""

    #: The lease it is on (0: not readable).
    lease: int
    #: The broker's HTTP address (None: not readable).
    http_address: str | None

    @classmethod
    def parse(cls, value: str, lease: int = 0) -> LiveKey:
        try:
            doc = json.loads(value)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(lease, None)
        named = doc.get("lease", 0)
        if lease == 0 and isinstance(named, int) and not isinstance(named, bool):
            lease = named
        http = doc.get("http_address")
        return cls(lease, http if isinstance(http, str) else None)

    def of(self, http_address: str) -> bool:
        """Whether the key is that of the broker process at ``http_address``."""
        return self.http_address is None or self.http_address == http_address


@dataclass
class LiveBrokers:
    """The brokers with a live key, and those whose key was deleted since the last tick."""

    #: The key prefix, ``PREFIX/live/``.
    prefix: str
    #: Broker id -> its live key.
    keys: dict[str, LiveKey] = field(default_factory=dict)
    #: Brokers whose key was deleted, not yet taken by a tick.
    deleted: set[str] = field(default_factory=set)

    def broker_of(self, key: str) -> str | None:
        bid = key.removeprefix(self.prefix)
        return bid if bid != key and bid else None

    def load(self, kvs: Sequence[KeyValue]) -> None:
        """The keys as a range read them (at start, or again after the watch was lost:
        a key known before and gone now was deleted meanwhile)."""
        before, self.keys = self.keys, {}
        for kv in kvs:
            if (bid := self.broker_of(kv.key)) is not None:
                self.keys[bid] = LiveKey.parse(kv.value, kv.lease)
        self.deleted |= before.keys() - self.keys.keys()

    def apply(self, event: WatchEvent) -> None:
        bid = self.broker_of(event.key)
        if bid is None:
            return
        if event.kind is EventKind.PUT:
            self.keys[bid] = LiveKey.parse(event.value)
        elif self.keys.pop(bid, None) is not None:
            self.deleted.add(bid)

    def holds(self, broker_id: str, http_address: str) -> bool:
        """Whether the broker registered at ``http_address`` holds a live key: its shares
        are its own until etcd deletes it. A key put by a process at another address (the
        broker restarted elsewhere with the same id) does not cover the old registration."""
        key = self.keys.get(broker_id)
        return key is not None and key.of(http_address)

    def take_deleted(self) -> set[str]:
        """Brokers whose key was deleted and not put again since: down. A key put again
        is a broker that lapsed (it held everything) and registers again by itself."""
        gone = {b for b in self.deleted if b not in self.keys}
        self.deleted = set()
        return gone


class LiveReader(Protocol):
    """What reads the live keys (srtm.control.model.ControllerState is one)."""

    live: LiveBrokers | None


class LivenessWatch:
    """Follows ``PREFIX/live/`` in etcd into ``brokers`` (``endpoints`` None: inert, for a
    controller on SQLite, whose brokers keep the silence rule)."""

    def __init__(self, endpoints: Sequence[str] | None, prefix: str) -> None:
        self.brokers = LiveBrokers(live_prefix(prefix))
        self.etcd = None if endpoints is None else Etcd(list(endpoints))
        self._task: asyncio.Task[None] | None = None
        self._revision: int | None = None

    @classmethod
    def of(cls, endpoints: str | None, prefix: str, ctrl: LiveReader) -> LivenessWatch:
        """The controller's watch (``--etcd-endpoints``, ``--etcd-prefix``); with etcd,
        ``ctrl`` (its state: the tick's failover step) reads the live keys."""
        if endpoints is None:
            return cls(None, prefix)
        watch = cls(endpoint_urls(endpoints), prefix)
        ctrl.live = watch.brokers
        return watch

    async def start(self) -> None:
        """Read the keys now if etcd answers (else the watch task keeps trying), then
        follow their changes."""
        if self.etcd is None:
            return
        with contextlib.suppress(EtcdError):
            await self._load()
        self._task = asyncio.create_task(self._follow(), name="srtm-liveness-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.etcd is not None:
            await self.etcd.close()

    async def revoke(self, broker_id: str, http_address: str) -> bool:
        """End the lease of the broker process at ``http_address`` (its key goes with it):
        only for one whose process is gone. False if etcd did not answer: its lease then
        decides as before."""
        key = self.brokers.keys.get(broker_id)
        if self.etcd is None or key is None or not key.of(http_address):
            return True  # no key of that process: the silence rule applies
        try:
            if key.lease:
                await self.etcd.revoke(key.lease)
            else:  # a key whose lease cannot be read: delete the key itself
                await self.etcd.delete(self.brokers.prefix + broker_id)
        except EtcdError as e:
            log.warning("could not revoke broker %s's liveness lease: %s", broker_id, e)
            return False
        self.brokers.keys.pop(broker_id, None)
        return True

    async def _load(self) -> None:
        assert self.etcd is not None
        # The revision first: a change between it and the range is seen again by the
        # watch (a put or a delete applied twice ends in the same state).
        revision = await self.etcd.revision()
        self.brokers.load(await self.etcd.range_prefix(self.brokers.prefix))
        self._revision = revision

    async def _follow(self) -> None:
        """Watch from the last load; a watch etcd ends (its revision compacted, say) is
        followed by a new load and a new watch."""
        assert self.etcd is not None
        failing = False
        while True:
            try:
                if self._revision is None:
                    await self._load()
                assert self._revision is not None
                failing = False
                async for event in self.etcd.watch(self.brokers.prefix, self._revision + 1):
                    self.brokers.apply(event)
                    self._revision = event.revision
                    if event.kind is EventKind.DELETE:
                        log.info("liveness key %s deleted", event.key)
            except EtcdError as e:
                if not failing:  # once per outage
                    log.warning("cannot follow the brokers' liveness keys: %s", e)
                failing = True
                self._revision = None
                await asyncio.sleep(RETRY_S)
