"""Broker-to-broker relay: forwarding (Dynamoth's lazy plan propagation) and
ALL_PUBLISHERS replication, over persistent NSQ TCP connections to the other brokers.

``Relay.publish`` is what ``Broker.publish`` calls for a topic with a route
(``srtm.broker.routes``); every other topic never reaches this module. A message is
forwarded (sent to its plan's broker instead of being accepted here), or accepted here and
copied once to every replica, or accepted here as without a route; ``Relay.publish_deferred``
(DPUB, from ``Broker.publish_deferred``) does the same with one deferred message, which
keeps its due time wherever it goes. Nothing acknowledged is
dropped: the publisher's OK waits until the target answered OK, and whatever a peer cannot
take (unreachable, over its bound, an error) is accepted here instead (``fallback_local``).

A ``PeerLink`` is one connection (``srtm.nsq_connection``) to one peer, opened on first
use: it IDENTIFYs with ``srtm_relay: true`` (what arrives on it is never relayed again: no
loops), upgrades to TLS
and sends AUTH where the peer's answer asks for them (``--relay-tls*``,
``--relay-auth-secret``: a peer with ``--tls-required`` or an auth server is relayed to as
any NSQ client would publish to it; one that cannot be is logged and its share falls back
here, retried with the backoff). A peer with a token or relay secret checks that a link
saying ``srtm_relay`` is one (its answer's ``srtm_relay_auth``): the link AUTHs with the
relay secret, else the cluster token. Then it sends what is
queued as PUB, or MPUB when a backlog built up (DPUB for a deferred message, with the
time it has left), one command in flight, and reconnects with
a backoff; while down, what comes falls back at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from srtm.broker.message import Message, MessageIds
from srtm.broker.options import RelayTls
from srtm.broker.routes import RouteTable, TopicRoute, restored_route
from srtm.broker.tls import RelaySecurity, relay_security
from srtm.nsq_connection import BrokerError, Connection, Handshake, HandshakeError
from srtm.protocol import ProtocolError
from srtm.protocol.commands import Command, Dpub, Handoff, Mpub, Pub

if TYPE_CHECKING:
    from srtm.broker.options import BrokerOptions
    from srtm.broker.persistence import Persistence
    from srtm.broker.state import Channel, Topic
    from srtm.broker.tcp import Client

log = logging.getLogger("srtm.broker.relay")

#: Per peer: the most messages (and bytes) queued or in flight; beyond, fallback local.
MAX_QUEUED = 10_000
MAX_QUEUED_BYTES = 64 << 20
#: One MPUB carries at most this many messages (and bytes).
MAX_BATCH = 500
MAX_BATCH_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 2.0
#: How long ``close`` waits for its cancelled task before cancelling it again (s).
CANCEL_RETRY_S = 0.1
#: How long one PUB/MPUB may wait for its answer before the connection is given up.
ANSWER_TIMEOUT_S = 5.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 5.0

Done = Callable[[bool], None]


@dataclass(slots=True)
class _Item:
    topic: str
    bodies: list[bytes]
    size: int
    done: Done
    #: A deferred message's due time (``time.monotonic`` s): sent alone as DPUB.
    due_s: float | None = None
    #: A handoff notice (no bodies) with this token: sent alone as HANDOFF.
    token: str | None = None


class LinkRefused(ValueError):
    """The peer cannot be relayed to as configured: TLS, AUTH or IDENTIFY failed."""


class PeerLink:
    """One persistent NSQ connection to one peer broker, with a bounded queue."""

    def __init__(self, address: str, client_id: str, security: RelaySecurity | None = None) -> None:
        self.address = address
        self.client_id = client_id
        self.security = security or RelaySecurity()
        self.queue: deque[_Item] = deque()
        self.queued = 0
        self.queued_bytes = 0
        self.connected = False
        #: Connections made so far (a diagnostic: reconnects show as more than one).
        self.connects = 0
        #: Monotonic time before which no connection is tried (after a failure).
        self.down_until = 0.0
        self._backoff = BACKOFF_MIN_S
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: A command is written and its answer not read yet.
        self._in_flight = False

    def send(self, topic: str, bodies: list[bytes], done: Done, due_s: float | None = None) -> bool:
        """Queue a copy for the peer; ``done(ok)`` once it answered. False (nothing
        queued, ``done`` not called): down or full, the caller keeps it here. ``due_s``
        (one body): a deferred message due then (``time.monotonic``)."""
        size = sum(len(b) for b in bodies)
        if self._closing or time.monotonic() < self.down_until:
            return False
        if self.queued + len(bodies) > MAX_QUEUED or self.queued_bytes + size > MAX_QUEUED_BYTES:
            return False
        self.queue.append(_Item(topic, bodies, size, done, due_s))
        self.queued += len(bodies)
        self.queued_bytes += size
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"srtm-relay-{self.address}"
            )
        return True

    def send_handoff(self, topic: str, token: str, done: Done) -> bool:
        """Queue a HANDOFF of ``topic`` behind everything queued so far (the peer
        applies the share armed under ``token`` after all of it); ``done(ok)`` once
        answered. False (nothing queued): down or closing."""
        if self._closing or time.monotonic() < self.down_until:
            return False
        self.queue.append(_Item(topic, [], 0, done, token=token))
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"srtm-relay-{self.address}"
            )
        return True

    async def close(self) -> None:
        """Stop; whatever is still queued is handed back (``done(False)``). A command in
        flight gets its answer first (up to ``ANSWER_TIMEOUT_S``): the peer may have
        taken it, and handing it back would deliver it twice (seen when a plan change
        closed a link mid-MPUB)."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None and self._in_flight:
            await asyncio.wait({task}, timeout=ANSWER_TIMEOUT_S + CANCEL_RETRY_S)
        # Cancelled again until it ends: on Python 3.11 a cancel that lands as a
        # ``wait_for`` completes is lost (cpython gh-86296), the link then waits for more
        # to send for ever, and the broker's shutdown with it (seen: a broker not exiting
        # 15 s after SIGTERM, its link's task "cancelling" in ``_serve``).
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_RETRY_S)
        if task is not None and not task.cancelled() and (exc := task.exception()) is not None:
            raise exc
        self._fail_all()

    # -- the connection ------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if self._closing or not self.queue:
                continue
            try:
                conn = await self._connect()
            except LinkRefused as exc:
                self._failed(str(exc), logging.ERROR)
                continue
            except (OSError, TimeoutError, BrokerError, ValueError) as exc:
                self._failed(f"cannot connect: {exc}")
                continue
            try:
                await self._serve(conn)
            except (OSError, TimeoutError, ValueError) as exc:
                self._failed(f"connection lost: {exc}")
            finally:
                self.connected = False
                conn.close_nowait()

    async def _connect(self) -> Connection:
        hs = await asyncio.wait_for(Handshake.start(self.address), CONNECT_TIMEOUT_S)
        try:
            how = await asyncio.wait_for(self._negotiate(hs), ANSWER_TIMEOUT_S)
        except BaseException:
            hs.close()
            raise
        self.connected = True
        self.connects += 1
        self._backoff = BACKOFF_MIN_S
        self.down_until = 0.0
        log.info("relay to %s connected (%s)", self.address, how)
        return hs.connection()

    async def _negotiate(self, hs: Handshake) -> str:
        """IDENTIFY as a real NSQ client would (feature negotiation: the answer says
        whether the peer offers TLS and wants AUTH), then the TLS upgrade and AUTH where
        due. Returns how the link is secured. A peer that cannot be relayed to as
        configured raises ``LinkRefused``."""
        sec = self.security
        # Each message is attributed at the target to the publisher its measurement header
        # names, as on the broker it was published to (traces, measurement rounds).
        identity = {"client_id": self.client_id, "srtm_relay": True, "srtm_header_publisher": True,
                    "tls_v1": sec.context is not None}  # fmt: skip
        try:
            features = await hs.identify(identity)
        except (BrokerError, HandshakeError) as exc:
            raise LinkRefused(f"IDENTIFY refused: {exc}") from exc
        if features.get("tls_v1") is True and sec.context is not None:
            try:
                await hs.upgrade(sec.context)
            except (ssl.SSLError, ssl.CertificateError) as exc:
                raise LinkRefused(f"TLS handshake failed: {exc}") from exc
            except HandshakeError as exc:
                raise LinkRefused(f"TLS: {exc}") from exc
        elif sec.tls == RelayTls.REQUIRED:
            raise LinkRefused("TLS: the peer offers none (--relay-tls required)")
        how = [hs.secured]
        # A peer that checks relay links itself (its token or relay secret) says so: a
        # link that does not prove itself may not say srtm_relay there.
        checks = features.get("srtm_relay_auth") is True
        if features.get("auth_required") is True or checks:
            secret = sec.proof(checks)
            if secret is None:
                raise LinkRefused(
                    "the peer requires AUTH and neither --relay-auth-secret nor --token is set"
                    if checks
                    else "the peer requires AUTH (its auth server) and no --relay-auth-secret "
                    "is set (the token goes only to a peer that checks it itself)"
                )
            try:
                answer = await hs.auth(secret)
            except (BrokerError, HandshakeError) as exc:
                raise LinkRefused(f"AUTH refused: {exc}") from exc
            who = f"AUTH as {str(answer.get('identity', '?'))[:100]!r}"
            if answer.get("srtm_relay") is not True:
                raise LinkRefused(f"{who}: the peer does not take it for a relay link")
            how.append(who)
        return ", ".join(how)

    async def _serve(self, conn: Connection) -> None:
        """Send the queue, one command at a time, until it is empty; then wait for more
        (the connection answers the peer's heartbeats meanwhile)."""
        while True:
            while self.queue and not self._closing:
                batch = self._batch()
                self._in_flight = True
                try:
                    await asyncio.wait_for(conn.request(_command(batch)), ANSWER_TIMEOUT_S)
                except BrokerError:
                    self._settle(batch, False)  # refused (not fatal for us): kept here
                    continue
                except BaseException:
                    self._settle(batch, False)
                    raise
                finally:
                    self._in_flight = False
                self._settle(batch, True)
            if self._closing:
                return
            await self._idle(conn)
            if conn.closed.is_set():
                raise ConnectionError("closed by the peer")

    async def _idle(self, conn: Connection) -> None:
        """Wait for more to send, or for the connection to end."""
        wake = asyncio.ensure_future(self._wake.wait())
        lost = asyncio.ensure_future(conn.closed.wait())
        try:
            await asyncio.wait({wake, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            lost.cancel()
        self._wake.clear()

    def _batch(self) -> list[_Item]:
        """The head of the queue, plus what follows it for the same topic while a batch
        stays within its bounds (a deferred message is a batch of its own: DPUB)."""
        first = self.queue.popleft()
        batch = [first]
        if first.due_s is not None or first.token is not None:
            return batch
        n, size = len(first.bodies), first.size
        while self.queue:
            nxt = self.queue[0]
            if nxt.topic != first.topic or nxt.due_s is not None or nxt.token is not None:
                break
            if n + len(nxt.bodies) > MAX_BATCH:
                break
            if size + nxt.size > MAX_BATCH_BYTES:
                break
            batch.append(self.queue.popleft())
            n += len(nxt.bodies)
            size += nxt.size
        return batch

    def _settle(self, batch: list[_Item], ok: bool) -> None:
        for item in batch:
            self.queued -= len(item.bodies)
            self.queued_bytes -= item.size
            _call(item.done, ok)

    def _failed(self, why: str, level: int = logging.WARNING) -> None:
        if self.connected or self.queue:
            log.log(
                level,
                "relay to %s: %s; kept here, retrying in %.1f s",
                self.address,
                why,
                self._backoff,
            )
        self.connected = False
        self.down_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        self._fail_all()

    def _fail_all(self) -> None:
        while self.queue:
            self._settle([self.queue.popleft()], False)


def _command(batch: list[_Item]) -> Command:
    if (token := batch[0].token) is not None:
        return Handoff(batch[0].topic, token)
    if (due := batch[0].due_s) is not None:
        return Dpub(batch[0].topic, left_ms(due), batch[0].bodies[0])
    bodies = [b for item in batch for b in item.bodies]
    if len(bodies) == 1:
        return Pub(batch[0].topic, bodies[0])
    return Mpub(batch[0].topic, bodies)


def left_ms(due_s: float) -> int:
    """A deferred message's time left (ms, rounded up, 0 if due): what a DPUB that
    passes it on asks for, so that a hop (or a fallback) does not defer it twice."""
    return max(0, math.ceil((due_s - time.monotonic()) * 1000))


def _call(done: Done, ok: bool) -> None:
    try:
        done(ok)
    except Exception:  # one failed settlement must not stop the others
        log.exception("relay: settling a message failed")


class _Countdown:
    """A future done once ``n`` parts reported (the publisher's OK waits for it)."""

    def __init__(self, n: int) -> None:
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.left = n
        if n == 0:
            self.future.set_result(None)

    def part_done(self, _: object = None) -> None:
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)

    def wait_for(self, other: asyncio.Future[Any] | None) -> None:
        if other is None:
            self.part_done()
        else:
            other.add_done_callback(self.part_done)


class RelayHost(Protocol):
    """What the relay needs of the broker (srtm.broker.broker.Broker is one)."""

    @property
    def options(self) -> BrokerOptions: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    @property
    def ids(self) -> MessageIds: ...

    @property
    def persistence(self) -> Persistence: ...

    def publish(
        self,
        topic_name: str,
        bodies: Iterable[bytes],
        arrival: int,
        publisher: str | None,
        client: Client | None = None,
        local: bool = False,
    ) -> asyncio.Future[Any] | None: ...

    def publish_deferred(
        self,
        topic_name: str,
        body: bytes,
        defer_ms: int,
        arrival: int,
        publisher: str | None,
        client: Client | None = None,
        local: bool = False,
    ) -> asyncio.Future[Any] | None: ...

    def topic(self, name: str) -> Topic: ...

    def channel(self, topic_name: str, channel_name: str) -> Channel: ...

    def order(self, publisher: str, order: dict[str, Any]) -> int: ...

    def mark_ready(self, channel: Channel) -> None: ...


class Relay:
    """The broker's routes and its links to other brokers."""

    def __init__(self, broker: RelayHost, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker
        self.clock = clock
        self.table = RouteTable()
        broker.persistence.routes = self.table  # saved with the metadata
        #: The table's dict itself: the publish hook's one lookup.
        self.routes = self.table.routes
        self.links: dict[str, PeerLink] = {}
        #: TLS and AUTH on the links (--relay-*); bad settings fail the broker's start.
        self.security = relay_security(broker.options)
        self._closing: set[asyncio.Task[None]] = set()
        self.stopping = False

    # -- routes ----------------------------------------------------------------------------
    def set_route(self, route: TopicRoute) -> TopicRoute:
        """Install ``route`` (replacing the topic's). The topic is made first (a refusal,
        e.g. --max-topics, installs nothing; its /stats row carries the counters). A
        replicated topic delivers only the channels homed here, and those are made at
        once so that nothing sent to them before their consumers connect is missed."""
        route.last_forward_s = self.clock()
        return self._install(route)

    def _install(self, route: TopicRoute) -> TopicRoute:
        topic = self.broker.topic(route.topic)
        self.table.set(route)
        topic.homing = None if route.replicas is None else route
        if route.replicas is not None:
            for channel, home in route.replicas.homes.items():
                if home == route.self_id:
                    self.broker.channel(route.topic, channel)
        self._prune_links()
        self.broker.persistence.save_meta()
        return route

    def restore(self, saved: list[Any], saved_at_s: float | None) -> None:
        """The routes the last run saved (``Persistence.load``), each with the grace it had
        left less the time the broker was down; one that does not fit is logged and
        skipped. They stand until the controller's replace them (``registered``)."""
        now = self.clock()
        down_s = math.inf if saved_at_s is None else max(0.0, time.time() - saved_at_s)
        for doc in saved:
            try:
                route = restored_route(doc, now, down_s)
                if route is not None:
                    self._install(route)
            except (ValueError, ProtocolError) as exc:
                log.error("a saved route was not restored (%s): %.200r", exc, doc)
        if self.routes:
            log.info("restored %d relay routes", len(self.routes))

    def registered(self) -> None:
        """Registered with the controller: the routes it sets replace those read back at
        start, so one it set nowhere (no longer in its plan) goes."""
        for topic in [t for t, r in self.routes.items() if r.restored]:
            log.info("topic %s: restored route dropped at registration", topic)
            self.remove_route(topic)

    def get_route(self, topic: str) -> TopicRoute | None:
        route = self.table.get(topic)
        if route is not None:
            route.expire(self.clock())
        return route

    def remove_route(self, topic: str) -> TopicRoute | None:
        route = self.table.remove(topic)
        if route is not None and (t := self.broker.topics.get(topic)) is not None:
            t.homing = None
        self._prune_links()
        if route is not None:
            self.broker.persistence.save_meta()
        return route

    def _prune_links(self) -> None:
        """Close the links no route names any more (what they still hold falls back)."""
        used: set[str] = set()
        for route in self.routes.values():
            if (fwd := route.forward) is not None:
                used.update(a for a in (fwd.to, *fwd.publishers.values()) if a is not None)
            used.update(route.peers().values())
        for address in [a for a in self.links if a not in used]:
            task = asyncio.get_running_loop().create_task(self.links.pop(address).close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def stop(self) -> None:
        """Close the links; what they still held, and whatever comes from now on, is
        accepted here (before the broker persists what it owes)."""
        self.stopping = True
        # At once: each waits up to ANSWER_TIMEOUT_S for a command in flight, and a stop
        # must not take that once per silent peer.
        await asyncio.gather(*(link.close() for link in list(self.links.values())))
        self.links.clear()
        for task in list(self._closing):
            await task

    def link(self, address: str) -> PeerLink:
        link = self.links.get(address)
        if link is None:
            client_id = f"srtm-relay-{self.broker.options.broker_id}"
            link = self.links[address] = PeerLink(address, client_id, self.security)
        return link

    # -- publishing ------------------------------------------------------------------------
    def publish(
        self,
        topic: str,
        bodies: Iterable[bytes],
        arrival: int,
        publisher: str | None,
        client: Client | None,
        due_s: float | None = None,
    ) -> asyncio.Future[Any] | None:
        """A publish to a topic with a route: forwarded, replicated, or accepted here.
        ``due_s`` (one body): a deferred message (DPUB) due then (``time.monotonic`` s)."""
        route = self.routes[topic]
        if self.stopping:
            return self._local(route, bodies, arrival, publisher, due_s)
        who = publisher  # over HTTP: its ?publisher=
        if client is not None:
            if client.relay:  # never relayed again
                return self._local(route, bodies, arrival, publisher, due_s)
            who = str(client.identity.get("srtm_publisher") or "")  # a plain one has none
        to = route.forward_target(who, self.clock())
        if to is not None:
            return self._forward(route, to, list(bodies), arrival, publisher, who, due_s)
        if route.replicas is not None:
            return self._replicate(route, list(bodies), arrival, publisher, due_s)
        return self._local(route, bodies, arrival, publisher, due_s)

    def publish_deferred(
        self,
        topic: str,
        body: bytes,
        defer_ms: int,
        arrival: int,
        publisher: str | None,
        client: Client | None,
    ) -> asyncio.Future[Any] | None:
        """A DPUB to a topic with a route: as ``publish``, its due time kept (a target or
        a peer gets a DPUB for the time it has left, a fallback defers it as long)."""
        due_s = time.monotonic() + defer_ms / 1000
        return self.publish(topic, [body], arrival, publisher, client, due_s)

    def _local(
        self,
        route: TopicRoute,
        bodies: Iterable[bytes],
        arrival: int,
        publisher: str | None,
        due_s: float | None = None,
    ) -> asyncio.Future[Any] | None:
        broker = self.broker
        if due_s is None:
            written = broker.publish(route.topic, bodies, arrival, publisher, local=True)
        else:
            (body,) = bodies
            written = broker.publish_deferred(
                route.topic, body, left_ms(due_s), arrival, publisher, local=True
            )
        if route.replicas is not None:
            # A topic deleted and made again is a new object: it keeps the homing too.
            self.broker.topics[route.topic].homing = route
        return written

    def _forward(
        self,
        route: TopicRoute,
        to: str,
        bodies: list[bytes],
        arrival: int,
        publisher: str | None,
        who: str | None,
        due_s: float | None,
    ) -> asyncio.Future[Any] | None:
        """Send to ``to``; the publisher's OK waits for its. Not shaped here (it is at
        the target); an SRTM publisher is told once to move there."""
        route.forwarded(0, self.clock())  # the grace runs from the last forwarded message
        if who and who not in route.ordered:
            route.ordered.add(who)
            order = {"migrate": {"topic": route.topic, "to": to, "version": 0}}
            self.broker.order(who, order)
        n = len(bodies)
        answered = _Countdown(1)

        def done(ok: bool) -> None:
            if ok:
                route.counters.forwarded += n
                answered.part_done()
                return
            route.counters.fallback_local += n
            try:
                answered.wait_for(self._local(route, bodies, arrival, publisher, due_s))
            except Exception as exc:  # this broker cannot take it either (disk, limits)
                log.error("topic %s: %d forwarded messages lost: %s", route.topic, n, exc)
                # Known gap: its OK, queued behind this, still goes out (logged as lost).
                answered.part_done()

        if not self.link(to).send(route.topic, bodies, done, due_s):
            route.counters.fallback_local += n
            return self._local(route, bodies, arrival, publisher, due_s)
        return answered.future

    def _replicate(
        self,
        route: TopicRoute,
        bodies: list[bytes],
        arrival: int,
        publisher: str | None,
        due_s: float | None,
    ) -> asyncio.Future[Any] | None:
        """Accept here (for the channels homed here) and copy to every peer; a copy a
        peer cannot take feeds its channels here instead."""
        peers = route.peers()
        written = self._local(route, bodies, arrival, publisher, due_s)
        if not peers:
            return written
        answered = _Countdown(len(peers) + 1)
        answered.wait_for(written)
        n = len(bodies)
        for peer, address in peers.items():

            def done(ok: bool, peer: str = peer) -> None:
                if ok:
                    route.counters.relayed += n
                    answered.part_done()
                    return
                try:
                    fallback = self._fallback(route, peer, bodies, arrival, publisher, due_s)
                    answered.wait_for(fallback)
                except Exception:  # a bug: logged, and the publisher is not kept waiting
                    log.exception("topic %s: copies for %s not kept", route.topic, peer)
                    answered.part_done()

            if not self.link(address).send(route.topic, bodies, done, due_s):
                done(False)
        return answered.future

    def _fallback(
        self,
        route: TopicRoute,
        peer: str,
        bodies: list[bytes],
        arrival: int,
        publisher: str | None,
        due_s: float | None,
    ) -> asyncio.Future[Any] | None:
        """What ``peer`` could not take goes to its channels here (their consumers may
        come here; unshaped: the bucket here already paced this broker's own copy; a
        deferred one deferred as long as it has left). Returns what to wait for before
        the OK (its overflow to disk, as a publish)."""
        route.counters.fallback_local += len(bodies)
        broker = self.broker
        broker.persistence.pushed.clear()
        topic = broker.topic(route.topic)
        names = route.channels_of(peer, list(topic.channels))
        now = time.time_ns()
        due_ns = None if due_s is None else now + left_ms(due_s) * 1_000_000
        who = publisher or ""
        kept = False
        for name in names:
            try:
                ch = broker.channel(route.topic, name)
            except ProtocolError as exc:  # --max-channels-per-topic: kept on the topic
                log.warning(
                    "topic %s: channel %s for %s's copies: %s", route.topic, name, peer, exc
                )
                continue
            for body in bodies:
                msg = Message(broker.ids.next(), body, now, arrival, now, publisher=who)
                if due_ns is None:
                    ch.put(msg)
                else:
                    ch.put_deferred(msg, due_ns)
            broker.mark_ready(ch)
            kept = True
        if not kept:
            for body in bodies:  # no channel of it yet: kept for the topic's first one
                msg = Message(broker.ids.next(), body, now, arrival, now, 0, who)
                if due_ns is None:
                    topic.held.append(msg)
                else:
                    topic.held_deferred.append((msg, due_ns))
        return broker.persistence.write_through() if broker.persistence.pushed else None


def counters_of(route: TopicRoute) -> dict[str, Any]:
    """A route's counters (RouteCountersDoc's shape: /stats)."""
    c = route.counters
    return dict(forwarded=c.forwarded, relayed=c.relayed, fallback_local=c.fallback_local)


def route_document(route: TopicRoute, now_s: float) -> dict[str, Any]:
    """A route as GET /srtm/route shows it (RouteDoc's shape)."""
    fwd, reps = route.forward, route.replicas
    return dict(
        topic=route.topic,
        self=route.self_id,
        forward=None
        if fwd is None
        else dict(to=fwd.to, publishers=dict(fwd.publishers), grace_s=fwd.grace_s),
        replicas=None
        if reps is None
        else dict(peers=dict(reps.peers), primary=reps.primary, homes=dict(reps.homes)),
        counters=dict(counters_of(route), last_forward_age_s=now_s - route.last_forward_s),
    )
