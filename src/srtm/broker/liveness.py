"""A broker's liveness lease in etcd (``--etcd-endpoints``; docs/broker.md, "Liveness in
etcd"): the key ``PREFIX/live/BROKER_ID`` on the broker's own etcd lease, kept alive every
quarter of the lease. While the lease holds, the broker shapes by its shares whether or not
any controller answers; a controller gives them away only once etcd deleted the key.

The rule (``LivenessLease``, pure, on an injected clock): the liveness is valid while the
last keepalive that etcd answered with the lease alive was *sent* less than 0.6 x the lease
ago. etcd deletes the key no sooner than the lease after the last keepalive it *received*,
which is later than that send, so a broker always stops shaping (``Shares.lease_ok``)
before the controller can learn that its key is gone. A keepalive answered "gone", or no
answer past validity: the shares lapse (held) and the broker takes a new lease, puts its key
again and registers with the controller again (``Shares.renew_liveness``).

``LivenessKeeper`` is the asyncio edge: ``srtm.etcd.Etcd`` requests, and the lease revoked
at a clean stop so that the key disappears at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from srtm.etcd import REQUEST_TIMEOUT_S, Etcd, EtcdError, check_prefix, endpoint_urls
from srtm.httpkit import join_host_port

if TYPE_CHECKING:
    from srtm.broker.options import BrokerOptions

log = logging.getLogger("srtm.broker")

#: The liveness is valid for this fraction of the lease after a keepalive's send: the rest
#: is room for the time the request takes and clocks running at slightly different rates.
VALID_FRACTION = 0.6
#: Keepalives per lease: two may fail before the liveness runs out.
KEEPALIVES_PER_LEASE = 4


@dataclass(frozen=True)
class LivenessSettings:
    """A broker's ``--etcd-*`` settings, checked."""

    endpoints: tuple[str, ...]
    prefix: str
    lease_s: int
    broker_id: int

    @property
    def live_prefix(self) -> str:
        """Where the controller watches brokers' keys: its registration answer names it."""
        return f"{self.prefix.rstrip('/')}/live/"

    @property
    def key(self) -> str:
        return f"{self.live_prefix}{self.broker_id}"

    @property
    def interval_s(self) -> float:
        """How often the lease is kept alive (s)."""
        return self.lease_s / KEEPALIVES_PER_LEASE


def liveness_settings(options: BrokerOptions) -> LivenessSettings | None:
    """The liveness settings (None without ``--etcd-endpoints``); ValueError naming the
    flag that is wrong."""
    if options.etcd_endpoints is None:
        return None
    urls = endpoint_urls(options.etcd_endpoints)
    check_prefix(options.etcd_prefix)
    lease = options.etcd_lease_s
    if isinstance(lease, bool) or not isinstance(lease, int) or lease < 1:
        raise ValueError(f"--etcd-lease-s: {lease!r} is not a whole number of seconds >= 1")
    if not options.controller:
        raise ValueError(
            "--etcd-endpoints needs --controller: the liveness lease keeps the shares a "
            "controller gives"
        )
    return LivenessSettings(tuple(urls), options.etcd_prefix, lease, options.broker_id)


class LeaseStep(enum.Enum):
    """What the keeper asks etcd next."""

    GRANT = "grant"  # a new lease, and the key put on it
    KEEPALIVE = "keepalive"


@dataclass
class LivenessLease:
    """The liveness rule: no I/O, the times given (monotonic s)."""

    lease_s: int
    #: The etcd lease held (0: none).
    lease: int = 0
    #: When the last request that found the lease alive (its grant, or a keepalive that
    #: etcd answered with a TTL) was sent; None: no lease.
    sent: float | None = None

    def valid_until(self) -> float | None:
        """Until when the shares may be used (None: not at all)."""
        if self.lease == 0 or self.sent is None:
            return None
        return self.sent + VALID_FRACTION * self.lease_s

    def valid(self, now: float) -> bool:
        until = self.valid_until()
        return until is not None and now < until

    def next_step(self, now: float) -> LeaseStep:
        """A keepalive while the liveness is valid; else a new lease (one past validity
        is given up even if etcd still has it: the shares lapsed meanwhile)."""
        return LeaseStep.KEEPALIVE if self.valid(now) else LeaseStep.GRANT

    def granted(self, lease: int, sent: float) -> None:
        """etcd granted ``lease`` to a request sent at ``sent``, and the key is on it."""
        self.lease, self.sent = lease, sent

    def kept(self, ttl: int, sent: float, now: float) -> bool:
        """etcd answered a keepalive sent at ``sent`` with ``ttl`` (0: the lease is gone),
        at ``now``. False: the liveness is lost (gone, or it ran out before the answer
        came), and the next step is a new lease."""
        if ttl <= 0 or not self.valid(now):
            self.lease, self.sent = 0, None
            return False
        self.sent = sent
        return True


def live_document(lease: int, tcp_address: str, http_address: str) -> str:
    """The value of the liveness key, as the controller reads it."""
    return json.dumps({"lease": lease, "tcp_address": tcp_address, "http_address": http_address})


class LeaseHolder(Protocol):
    """What the liveness tells (srtm.broker.shares.Shares is one)."""

    def renew_liveness(self, until: float, fresh: bool) -> None: ...

    def lapse(self, why: str) -> None: ...


class LivenessHost(Protocol):
    """What the keeper needs of the broker (srtm.broker.broker.Broker is one)."""

    @property
    def shares(self) -> LeaseHolder: ...

    @property
    def tcp_address(self) -> tuple[str, int] | None: ...

    @property
    def http_address(self) -> tuple[str, int] | None: ...


class LivenessKeeper:
    """Keeps the broker's liveness lease and key in etcd, and tells its shares."""

    def __init__(
        self,
        host: LivenessHost,
        settings: LivenessSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.settings = settings
        self.clock = clock
        self.lease = LivenessLease(settings.lease_s)
        # A request that takes longer than the keepalive interval is no use.
        timeout = min(REQUEST_TIMEOUT_S, settings.interval_s)
        self.etcd = Etcd(list(settings.endpoints), timeout_s=timeout)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="srtm-liveness")

    async def stop(self) -> None:
        """Stop keeping the lease and revoke it: the key disappears at once, and the
        controller (if it did not see this broker deregister) gives its shares away."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.lease.lease:
            try:
                await self.etcd.revoke(self.lease.lease)
            except EtcdError as e:  # it expires on its own
                log.warning("could not revoke the liveness lease: %s", e)
            self.lease.lease = 0
        await self.etcd.close()

    async def run(self) -> None:
        failing = False
        while True:
            sent = self.clock()
            try:
                await self.step(sent)
                if failing:
                    log.warning("etcd answers the liveness lease again")
                failing = False
            except EtcdError as e:
                if not failing:  # once per outage, not every keepalive
                    log.warning("etcd did not answer for the liveness lease: %s", e)
                failing = True
            except Exception:  # an odd answer must not end the liveness for good
                log.exception("keeping the liveness lease failed")
            wait = sent + self.settings.interval_s - self.clock()
            if failing:  # etcd may be electing a leader: ask again soon, within validity
                wait = min(wait, self.settings.interval_s / 4)
            await asyncio.sleep(max(0.0, wait))

    async def step(self, sent: float) -> None:
        """One request's worth: a keepalive, or a new lease with the key put on it."""
        lease, shares = self.lease, self.host.shares
        if lease.next_step(sent) is LeaseStep.KEEPALIVE:
            ttl = await self.etcd.keepalive(lease.lease)
            if lease.kept(ttl, sent, self.clock()):
                until = lease.valid_until()
                assert until is not None
                shares.renew_liveness(until, fresh=False)
                return
            why = "etcd says the liveness lease is gone" if ttl <= 0 else "liveness ran out"
            shares.lapse(why)
            sent = self.clock()
        tcp, http = self.host.tcp_address, self.host.http_address
        assert tcp is not None and http is not None
        new = await self.etcd.grant(self.settings.lease_s)
        doc = live_document(new, join_host_port(*tcp), join_host_port(*http))
        await self.etcd.put(self.settings.key, doc, lease=new)
        lease.granted(new, sent)
        until = lease.valid_until()
        assert until is not None
        shares.renew_liveness(until, fresh=True)
