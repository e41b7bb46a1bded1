"""The broker: topics, channels and client connections on one asyncio loop.

``Broker`` keeps the registry of topics and channels, serves the operations that
connections (``srtm.broker.tcp``) and the HTTP API (``srtm.broker.http``) call, delivers
messages to consumers and runs the background tasks. The rest is done by parts it owns,
one module each, none of which imports this one (each is handed what it needs):

- ``persistence.Persistence``: the disk queues, ``meta.json``, the restart, the save at stop;
- ``release.Releaser``: the release loop of shaped topics and the emulated server;
- ``measurement.Measurements``: measurement rounds and the publishers' RTTs;
- ``stats.BrokerStats``: what publishes and dispatches record.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from srtm.broker.accept import AcceptBackoff, refuse
from srtm.broker.admission import Admission, NotAdmitted
from srtm.broker.auth import Authenticator, close_quietly
from srtm.broker.measurement import Measurement, Measurements
from srtm.broker.message import Message, MessageIds
from srtm.broker.options import VERSION, BrokerOptions
from srtm.broker.persistence import Persistence, SavedTopic
from srtm.broker.queue import PUBLISH_SLICE, Record, attempted
from srtm.broker.relay import Arms, Relay
from srtm.broker.release import Releaser
from srtm.broker.state import Channel, LeaseExpired, LimitReached, Topic
from srtm.broker.stats import BrokerStats
from srtm.broker.tcp import Client, enable_kernel_timestamps
from srtm.broker.tls import identity_keys, server_context
from srtm.broker.traces import TraceWriter
from srtm.protocol import ProtocolError, errors, is_valid_name
from srtm.protocol.header import publisher_of
from srtm.protocol.session import E_SUB_FAILED
from srtm.ratelimit import TokenBucket, check_bucket
from srtm.ratelimit.overflow import Bound, OverflowPolicy, check_bound, refusal

log = logging.getLogger("srtm.broker")


#: How long the slices of sliced publishes should take per loop turn, all together (s):
#: answering /ping takes a few turns; a first slice's size, and the smallest.
_SLICE_S = 0.002
_FIRST_SLICE = 512
_MIN_SLICE = 64
#: The collector's oldest generation is looked at after this many middle ones (CPython's
#: default), and while publishes are taken in slices (never, in practice: 7 billion
#: allocations).
_GEN2_THRESHOLD = gc.get_threshold()[2]
_TAKE_GEN2_THRESHOLD = 1_000_000


@dataclass(eq=False)
class _Take:
    """A publish taken in slices (``Broker._take_in_slices``): ``taken`` messages so far,
    and the writes their OK waits for."""

    topic: Topic
    bodies: list[bytes]
    arrival: int
    publisher: str | None
    taken: int = 0
    writes: list[asyncio.Future[Any]] = field(default_factory=list)


class Broker:
    """Owns the topics and the connections; ``Client`` objects call into it, it calls
    back to send frames."""

    def __init__(self, options: BrokerOptions | None = None) -> None:
        self.options = options or BrokerOptions()
        self.version = VERSION
        self.topics: dict[str, Topic] = {}
        #: Set when a topic or channel appears or goes: the reporter tells the controller
        #: at once, as nsqd REGISTERs with nsqlookupd (a go-nsq consumer that asks the
        #: lookupd before then looks again only a minute later).
        self.names_changed = asyncio.Event()
        self.clients: set[Client] = set()
        #: Consumer admission control per topic name (srtm.broker.admission): set before
        #: or after the topic exists, forgotten once nothing is set and nobody connected.
        self.admission: dict[str, Admission] = {}
        #: Per connection refused by admission control: the topics it waits for (it
        #: counts in their demand until it joins or goes).
        self._refused: dict[Client, set[str]] = {}
        #: Bytes sent to connections closed since start (``egress_bytes``).
        self._sent_closed = 0
        self.stats = BrokerStats(self.options.window_seconds)
        self.ids = MessageIds(self.options.broker_id, time.time_ns() // 1000)
        self.started_ns = time.time_ns()
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.https_address: tuple[str, int] | None = None
        #: TLS and AUTH (srtm.broker.tls, srtm.broker.auth); None where not configured.
        self.tls_context = server_context(self.options)
        self.authenticator = (
            Authenticator(self.options.auth_http_address)
            if self.options.auth_http_address
            else None
        )
        self.traces: TraceWriter | None = None
        self._dirty: set[Channel] = set()
        #: Channels with deferred messages or in-flight deadlines: all that _scan visits.
        self._timed: set[Channel] = set()
        #: Topics with deferred messages (DPUB): the scan moves them on when due.
        self._deferring: set[Topic] = set()
        self._flush_scheduled = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: socket.socket | None = None
        #: Why accepting TCP connections fails right now (None: it does not).
        self.accept_error: str | None = None
        #: Connections closed at once because ``max_connections`` were open.
        self.refused_connections = 0
        self.stopped = asyncio.Event()
        #: With a controller: the monotonic time (s) until which its last word lets this
        #: broker shape by the sub-buckets it was given (``lease_ok``); None: no lease
        #: yet, or it lapsed and the broker has not registered again.
        self.lease_until: float | None = None
        # The parts (see the module's docstring), each handed what it needs.
        self.persistence = Persistence(self.options, self, self._disk_readable)
        self.releaser = Releaser(
            self.options, self.topics, self.stats, self.mark_ready, self._dispatch,
            self.lease_ok,
        )  # fmt: skip
        self.measurements = Measurements()
        #: Forwarding and replication routes, and the links to other brokers.
        self.relay = Relay(self)
        #: What proves a relay link or a consumer class (docs/security.md, "Identities").
        self.keys = identity_keys(self.options, self.relay.security.secret)
        #: Shares armed for a handoff from another broker (``arm``, ``take_handoff``).
        self.arms = Arms()
        #: Publishes being taken in slices, and the tasks taking them.
        self._takes: dict[_Take, asyncio.Task[None]] = {}
        #: Per topic over its bound under ``block``: the connections not read until it is
        #: within it again, and the timer that looks again (``_recheck_blocked``).
        self.blocked: dict[str, set[Client]] = {}
        self._block_timers: dict[str, asyncio.TimerHandle] = {}

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        self._restore()
        self.persistence.serve()
        if opts.trace_dir is not None:
            self.traces = TraceWriter(
                opts.trace_dir, opts.run, str(opts.broker_id), opts.trace_sample
            )
        listener = socket.create_server((opts.tcp_host, opts.tcp_port))
        listener.setblocking(False)
        if opts.kernel_timestamps:
            # Accepted sockets inherit it, so even bytes that arrive before the accept
            # (a client's first PUB) carry their kernel receive stamp.
            enable_kernel_timestamps(listener)
        self._listener = listener
        self.tcp_address = listener.getsockname()[:2]
        self._tasks = [
            asyncio.create_task(self._accept_loop(listener), name="srtm-accept"),
            asyncio.create_task(self._scan_loop(), name="srtm-scan"),
            asyncio.create_task(self._housekeeping_loop(), name="srtm-housekeeping"),
        ]
        self.releaser.start()
        self._tasks.append(asyncio.create_task(self.releaser.run(), name="srtm-release"))
        self._tasks.append(asyncio.create_task(self._deadline_loop(), name="srtm-deadlines"))
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        for topic in self.topics.values():
            self.releaser.kick(topic)

    async def stop(self) -> None:
        """Stop serving and persist every message still owed (queued, deferred, in flight)."""
        if self.stopped.is_set():
            return
        await self.relay.stop()  # what the links held is accepted here (saved below)
        await self.persistence.stop_meta_writes()
        self.releaser.stop()
        listener, self._listener = self._listener, None  # tells the accept loop it is over
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                # Already logged when it died; what the broker owes is persisted anyway.
                log.warning("stopping after background task %s died", task.get_name())
        self._tasks = []
        if listener is not None:
            listener.close()
        for client in list(self.clients):
            client.close()  # in-flight messages go back to their channel's queue
        self.releaser.processed(None)  # what the emulated server still holds is owed too
        self._finish_takes()
        await self.persistence.persist()
        await close_quietly(self.authenticator)
        if self.traces is not None:
            await self.traces.close()
        self.stopped.set()

    def _restore(self) -> None:
        """Topics, channels and the messages they held, as the last run left them."""
        saved = self.persistence.load()
        self.persistence.restoring = True
        self.ids = MessageIds(self.options.broker_id, max(saved.next_id, self.ids.last + 1))
        now = time.time_ns()
        for t in saved.topics:
            self._restore_topic(t, now)
        self.persistence.restoring = False
        self.relay.restore(saved.routes, saved.saved_at_s)
        self.persistence.save_meta()
        restored = sum(
            t.depth
            + t.deferred_count
            + sum(c.depth + c.deferred_count for c in t.channels.values())
            for t in self.topics.values()
        )
        if restored:
            log.info("restored %d messages from %s", restored, self.options.data_dir)

    def _restore_topic(self, saved: SavedTopic, now: int) -> None:
        topic = self.topic(saved.name)
        topic.paused = saved.paused
        if isinstance(saved.bound, dict):
            try:
                b = saved.bound
                topic.bound = check_bound(b.get("max_wait_ms"), b.get("overflow"))
            except ValueError as exc:
                log.error("topic %s: saved bound %r ignored (%s)", topic.name, saved.bound, exc)
        # What waited for tokens is booked again, not as if it arrived before this
        # run: a restart must not burst.
        topic.book_not_before_ns = now
        bucket = saved.bucket
        if (bucket or saved.held) and self.options.controller:
            # Its saved share may have been given away meanwhile: held until the
            # controller, at registration, gives it its shares again.
            topic.hold()
        elif saved.held:
            topic.hold()
        elif bucket:
            try:
                topic.shape(bucket["rate"], bucket["burst"], time.time_ns)
                self.releaser.shaped[topic.name] = topic
            except (KeyError, TypeError, ValueError) as exc:
                log.error("topic %s: saved bucket %r ignored (%s)", topic.name, bucket, exc)
        for c in saved.channels:
            ch = self._watched(topic.channel(c.name))
            ch.paused = c.paused
            self.persistence.restore_channel(ch)
        self.persistence.restore_topic(topic)
        if topic.deferred_count:
            self._deferring.add(topic)

    # -- background tasks ----------------------------------------------------------------
    async def _accept_loop(self, listener: socket.socket) -> None:
        """Accept clients until stopped. A failed accept never ends it: out of fds or
        memory it is retried with a backoff (the connection waits in the kernel's
        backlog meanwhile, and /ping says so); a connection gone before it was
        accepted is skipped."""
        loop = asyncio.get_running_loop()
        backoff = AcceptBackoff()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if self._listener is None:
                    return  # closed by stop()
                delay = backoff.failed(exc)
                if delay is None:
                    continue
                self.accept_error = f"accepting TCP connections fails: {exc}"
                if backoff.should_log():
                    log.error("%s; retrying (%d failures so far)", self.accept_error, backoff.count)
                await asyncio.sleep(delay)
                continue
            if self.accept_error is not None:
                log.warning("accepting TCP connections again after %d failures", backoff.count)
                self.accept_error = None
            backoff.reset()
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        limit = self.options.max_connections
        if limit and len(self.clients) >= limit:
            self.refused_connections += 1
            refuse(sock, f"max connections ({limit}) reached")
            return
        try:
            self.clients.add(Client(self, sock, self.options.kernel_timestamps))
        except OSError:
            sock.close()  # gone before we could set it up

    async def _deadline_loop(self) -> None:
        """Close connections whose writes or partly received commands stalled too long."""
        opts = self.options
        timeouts = [t for t in (opts.read_timeout_ms, opts.write_timeout_ms) if t > 0]
        if not timeouts:
            return
        interval = min(1.0, min(timeouts) / 4000)
        while True:
            await asyncio.sleep(interval)
            now = time.time_ns()
            for client in list(self.clients):
                client.check_deadlines(now)

    async def _scan_loop(self) -> None:
        """Deferred messages that came due and in-flight messages that timed out."""
        interval = self.options.scan_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._scan(time.time_ns())

    def _scan(self, now: int) -> None:
        # A function of its own: no loop variable keeps a deleted topic alive while the
        # loop sleeps (freeing it later, all at once, stalled the loop). Only channels
        # with timers are visited: thousands of idle ones cost nothing.
        for ch in list(self._timed):
            due = ch.next_due_ns()
            if due is None:
                self._timed.discard(ch)  # it puts itself back when it gets a timer
            elif due <= now and ch.tick(now):
                self.mark_ready(ch)
        for topic in list(self._deferring):
            self._tick_topic(topic, now)

    def _tick_topic(self, topic: Topic, now: int) -> None:
        """Deferred messages of ``topic`` due by ``now`` join its shaping queue."""
        if self.topics.get(topic.name) is not topic or not topic.deferred_count:
            self._deferring.discard(topic)  # deleted, or nothing deferred left
            return
        due = topic.next_deferred_ns()
        if due is not None and due <= now and topic.tick(now):
            self.releaser.kick(topic)

    async def _housekeeping_loop(self) -> None:
        """Every 100 ms, move the measured values of each histogram holding
        ``stats.FLUSH_AT`` or more into it, one histogram per loop turn, so no single step
        holds the loop (and shaped releases) for long."""
        rolled = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            self.lease_ok()  # a lapsed lease holds shaped topics even with nothing to release
            recorders = self.stats.pending_recorders()
            for rec in recorders:
                rec.flush()
                await asyncio.sleep(0)
            del recorders  # no reference to a deleted topic's histograms while sleeping
            if time.monotonic() - rolled >= 1.0:
                rolled = time.monotonic()
                self.measurements.refresh_rtts(self.clients)
                await self.persistence.housekeep()
                if self.traces is not None:
                    self.traces.maybe_roll()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Log a background task's death when it happens, not at the next stop."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s died", task.get_name(), exc_info=exc)

    def health(self) -> str | None:
        """What is wrong with this broker (for /ping), or None."""
        if self.accept_error is not None:
            return self.accept_error
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return f"task {task.get_name()} died: {task.exception()!r}"
        return None

    # -- connections ---------------------------------------------------------------------
    def disconnected(self, client: Client) -> None:
        if client in self.clients:  # counted once
            self.clients.discard(client)
            self._sent_closed += client.sent_bytes
        for name in self._refused.pop(client, ()):
            self._stop_waiting(name, client)
        ch = client.channel
        if ch is None:
            return
        self._leave(ch.topic, client)
        ch.remove_consumer(client)
        topic = self.topics.get(ch.topic)
        if topic is None or topic.channels.get(ch.name) is not ch:
            return  # its channel is being deleted
        self.mark_ready(ch)
        if ch.ephemeral and not ch.consumers:
            self.delete_channel(ch.topic, ch.name)

    def order(self, publisher: str, order: dict[str, Any]) -> int:
        """Send an SRTM order to every connection of ``publisher`` that takes orders."""
        clients = [c for c in self.clients if c.publisher == publisher and c.takes_orders]
        for c in clients:
            c.send_order(order)
        return len(clients)

    # -- topics and channels -------------------------------------------------------------
    def topic(self, name: str, limit_code: str = errors.E_BAD_TOPIC) -> Topic:
        """The topic ``name``, created on first use; ``limit_code`` is the error code
        when the broker already has ``max_topics`` (the command's own, e.g. E_PUB_FAILED)."""
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_name(name):
                raise ProtocolError(errors.E_BAD_TOPIC, f"topic name {name!r} is not valid")
            limit = self.options.max_topics
            if len(self.topics) >= limit and not self.persistence.restoring:
                raise LimitReached(
                    limit_code,
                    f"topic {name!r} not created: this broker has its maximum of {limit} "
                    "topics (--max-topics)",
                    "TOO_MANY_TOPICS",
                )
            topic = self.topics[name] = Topic(name, self.persistence.queue)
            self.names_changed.set()
            if not topic.ephemeral:
                self.persistence.save_meta()
        return topic

    def channel(
        self, topic_name: str, channel_name: str, limit_code: str = errors.E_BAD_CHANNEL
    ) -> Channel:
        if not is_valid_name(channel_name):
            raise ProtocolError(errors.E_BAD_CHANNEL, f"channel name {channel_name!r} is not valid")
        topic = self.topic(topic_name, limit_code)
        new = channel_name not in topic.channels
        limit = self.options.max_channels_per_topic
        if new and len(topic.channels) >= limit and not self.persistence.restoring:
            raise LimitReached(
                limit_code,
                f"channel {channel_name!r} not created: topic {topic_name!r} has its maximum "
                f"of {limit} channels (--max-channels-per-topic)",
                "TOO_MANY_CHANNELS",
            )
        ch = self._watched(topic.channel(channel_name))
        if new:
            self.names_changed.set()
        if new and not ch.ephemeral and not topic.ephemeral:
            self.persistence.save_meta()
        self.mark_ready(ch)
        return ch

    def _watched(self, ch: Channel) -> Channel:
        """Have the scan look at ``ch`` whenever it has timers."""
        if ch.watch is None:
            ch.watch = self._timed
            if ch.next_due_ns() is not None:  # what the topic deferred before it existed
                self._timed.add(ch)
        return ch

    def subscribe(self, topic_name: str, channel_name: str, client: Client) -> Channel:
        """Add ``client`` as a consumer, if its class admits one more (else NotAdmitted,
        and nothing is created)."""
        klass = client.consumer_class
        adm = self.admission.get(topic_name)
        if adm is not None:
            try:
                adm.check(klass)
            except NotAdmitted:
                adm.refused(klass, client)
                self._refused.setdefault(client, set()).add(topic_name)
                raise
        ch = self.channel(topic_name, channel_name, E_SUB_FAILED)
        if adm is None:
            adm = self.admission[topic_name] = Admission(topic_name)
        adm.join(klass, client)
        waits = self._refused.get(client)
        if waits is not None:
            waits.discard(topic_name)
            if not waits:
                del self._refused[client]
        ch.add_consumer(client, time.time_ns())
        return ch

    def _stop_waiting(self, topic_name: str, client: Client) -> None:
        adm = self.admission.get(topic_name)
        if adm is not None:
            adm.gave_up(client.consumer_class, client)
            if adm.idle:
                del self.admission[topic_name]

    def egress_bytes(self) -> int:
        """Bytes sent to clients since start (read once per report: the sum over the
        connections open, so the write path only counts its own)."""
        return self._sent_closed + sum(c.sent_bytes for c in self.clients)

    def _leave(self, topic_name: str, client: Client) -> None:
        adm = self.admission.get(topic_name)
        if adm is not None:
            adm.leave(client.consumer_class, client)
            if adm.idle:
                del self.admission[topic_name]

    def set_admission(
        self, topic_name: str, admitted: dict[str, int], order: list[str]
    ) -> tuple[Admission, int]:
        """The topic's admitted counts per class and their order (most important first);
        consumers beyond a count are disconnected, the lowest class first and the newest
        of a class first. Returns the admission and how many were disconnected."""
        adm = self.admission.setdefault(topic_name, Admission(topic_name))
        out = adm.set(admitted, order)
        for client in out:
            assert isinstance(client, Client)
            admits = adm.admitted.get(client.consumer_class)
            client.evict(
                ProtocolError(
                    E_SUB_FAILED,
                    f"class {client.consumer_class!r} of topic {topic_name!r} now admits "
                    f"{admits} consumers: the newest are disconnected",
                )
            )
        if adm.idle:
            del self.admission[topic_name]
        return adm, len(out)

    def delete_channel(self, topic_name: str, channel_name: str) -> None:
        topic = self.topics.get(topic_name)
        if topic is None or channel_name not in topic.channels:
            raise KeyError(channel_name)
        ch = topic.channels.pop(channel_name)
        self.names_changed.set()
        self._timed.discard(ch)
        for consumer in list(ch.consumers):
            if isinstance(consumer, Client):
                consumer.close()
        ch.discard()  # what it read from the topic's disk queues is settled
        self.persistence.remove(f"{topic_name}:{channel_name}")
        self.stats.drop_channel(topic_name, channel_name)
        if topic.ephemeral and not topic.channels:
            self.delete_topic(topic_name)
        elif not ch.ephemeral:
            self.persistence.save_meta()

    def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name)
        self.names_changed.set()
        self.releaser.shaped.pop(name, None)
        for ch_name in list(topic.channels):
            ch = topic.channels.pop(ch_name)
            self._timed.discard(ch)
            for consumer in list(ch.consumers):
                if isinstance(consumer, Client):
                    consumer.close()
            self.persistence.remove(f"{name}:{ch_name}")
        self.persistence.remove(name)
        self.persistence.remove(f"{name}@shaping")
        self.persistence.remove(f"{name}@deferred")
        self._deferring.discard(topic)
        self.stats.drop_topic(name)
        if not topic.ephemeral:
            self.persistence.save_meta()

    def set_bucket(
        self, topic_name: str, rate: float, burst: float, leased: bool = False
    ) -> TokenBucket:
        """Give a topic its sub-bucket, or retune it keeping its state; what already waits
        is paced by the new parameters from now on. Refused (LeaseExpired) while this
        broker's lease has lapsed, unless ``leased`` (it comes with a new lease)."""
        check_bucket(rate, burst)  # a bad pair creates no topic
        if not leased and not self.lease_ok():
            raise LeaseExpired("this broker's lease lapsed: it takes shares again once registered")
        self.arms.clear(topic_name)  # the controller's word replaces an armed share
        topic = self.topic(topic_name)
        bucket = topic.shape(rate, burst, time.time_ns)
        self.releaser.shaped[topic_name] = topic
        self.persistence.save_meta()
        self.releaser.kick(topic)
        return bucket

    def arm(self, topic_name: str, rate: float, burst: float, token: str) -> None:
        """Keep ``(rate, burst)`` for ``topic_name`` until a relay link hands it over with
        ``token`` (``take_handoff``); nothing changes here until then. Replaces an armed
        share of the topic; lapses after ``relay.ARM_TTL_S``."""
        check_bucket(rate, burst)
        self.arms.arm(topic_name, rate, burst, token, time.monotonic())

    def take_handoff(self, topic_name: str, token: str) -> bool:
        """A relay link's HANDOFF: the broker that sent it gave up the share armed here
        under ``token``; apply it as the controller's ``set_bucket`` would (lease rules
        included). An unknown, spent or lapsed token does nothing (logged)."""
        armed = self.arms.take(topic_name, token, time.monotonic())
        if armed is None:
            log.info("topic %s: a handoff with no matching armed share ignored", topic_name)
            return False
        try:
            self.set_bucket(topic_name, *armed)
        except (LeaseExpired, ValueError, OverflowError, ProtocolError) as exc:
            log.warning("topic %s: handed-over share %r not applied: %s", topic_name, armed, exc)
            return False
        return True

    # -- the controller's lease (see docs/broker.md, "No holes in (r, b)") -------------------
    @property
    def leased(self) -> bool:
        """Whether this broker's shares come with a lease (it runs with a controller)."""
        return bool(self.options.controller)

    def lease_ok(self) -> bool:
        """May this broker shape by its sub-buckets now? Always without a controller.
        With one, only while the lease its controller granted runs: past it, the
        controller may have marked this broker down and given its shares to others, so
        every shaped topic is held until the broker registers again (checked where it
        matters, before releasing and answering /stats, so a broker resumed after
        SIGSTOP never uses or shows a stale bucket)."""
        if not self.leased:
            return True
        until = self.lease_until
        if until is not None and time.monotonic() < until:
            return True
        if until is not None:
            self.lease_until = None
            shaped = [t for t in self.topics.values() if t.bucket is not None]
            log.warning(
                "no word from the controller for the lease: %d shaped topics held until "
                "this broker registers again",
                len(shaped),
            )
            for topic in shaped:
                self.hold_topic(topic.name)
        return False

    def renew_lease(self, since: float, lease_s: float) -> None:
        """The controller answered a request sent at ``since`` (monotonic s): shares may
        be used until ``since + lease_s``."""
        self.lease_until = since + lease_s

    def apply_shares(
        self,
        buckets: dict[str, tuple[float, float]],
        held: list[str],
        bounds: dict[str, Bound] | None = None,
    ) -> None:
        """What a registration answer says this broker carries: these sub-buckets (with
        their topics' bounds), and a hold on these other managed topics. Any other topic
        keeps its state."""
        for name in held:
            if is_valid_name(name):
                self.hold_topic(name)
        for name, (rate, burst) in buckets.items():
            try:
                self.set_bucket(name, rate, burst, leased=True)
            except (ValueError, OverflowError, ProtocolError) as exc:
                log.error("topic %s: bucket %r from the controller refused: %s",
                          name, (rate, burst), exc)  # fmt: skip
                continue
            if bounds is not None and name in bounds:
                self.set_bound(name, bounds[name])

    def hold_topic(self, topic_name: str) -> None:
        """The topic is managed but this broker has no share of it: what comes is kept
        (acknowledged, queued, spilled to disk like any message) and released by the
        sub-bucket that comes next, or at once if the topic is unmanaged. Creates it."""
        topic = self.topic(topic_name)
        topic.hold()
        self.arms.clear(topic_name)
        self.releaser.shaped.pop(topic_name, None)
        self.persistence.save_meta()

    def clear_bucket(self, topic_name: str) -> None:
        """Unmanage the topic (no share, no hold): what waits is released at once."""
        topic = self.topics[topic_name]
        topic.unshape()
        self.arms.clear(topic_name)
        self.releaser.shaped.pop(topic_name, None)
        self.persistence.save_meta()
        self.releaser.release_all(topic)

    def managed(self, topic_name: str) -> bool:
        """Whether the controller manages the topic here: it has a sub-bucket, a hold or
        a relay route (a topic it does not have is not)."""
        topic = self.topics.get(topic_name)
        if topic is None:
            return False
        return topic.bucket is not None or topic.on_hold or topic_name in self.relay.routes

    def pause_topic(self, name: str, paused: bool) -> None:
        topic = self.topics[name]
        topic.set_paused(paused, time.time_ns())
        self.persistence.save_meta()
        if not paused:
            self.releaser.kick(topic)

    def pause_channel(self, topic_name: str, channel_name: str, paused: bool) -> None:
        ch = self.topics[topic_name].channels[channel_name]
        ch.paused = paused
        self.persistence.save_meta()
        self.mark_ready(ch)

    # -- publishing ----------------------------------------------------------------------
    def publish(
        self,
        topic_name: str,
        bodies: Iterable[bytes],
        arrival: int,
        publisher: str | None,
        client: Client | None = None,
        local: bool = False,
    ) -> asyncio.Future[Any] | None:
        """Accept messages that arrived at ``arrival``; ``publisher`` None: each one is
        attributed to the publisher its measurement header names. Returns a future done
        once what overflowed to disk is written (None: nothing to wait for): the publish
        is acknowledged only then. More than ``PUBLISH_SLICE`` messages are taken in
        slices, over loop turns: the future is then done once all are taken and written.
        A topic with a relay route (``client``: the connection
        it came on) is the relay's to forward or replicate; ``local``: accept it here."""
        if not local and topic_name in self.relay.routes:
            return self.relay.publish(topic_name, bodies, arrival, publisher, client)
        topic = self._publish_topic(topic_name, "PUB", errors.E_PUB_FAILED)
        bodies = bodies if isinstance(bodies, list) else list(bodies)
        self._refuse_over_bound(topic, len(bodies), arrival)
        done: asyncio.Future[Any] | None
        if len(bodies) > PUBLISH_SLICE:
            done = self._take_in_slices(_Take(topic, bodies, arrival, publisher))
        else:
            done = self._put(topic, bodies, arrival, publisher)
        self._block_over_bound(topic, client)
        return done

    def _refuse_over_bound(
        self, topic: Topic, n: int, arrival: int, code: str = errors.E_PUB_FAILED
    ) -> None:
        """Under ``refuse``, a publish to a topic over its bound fails whole (before any
        of it is taken, so that a publish taken in slices is never refused half-way)."""
        bound = topic.bound
        if bound is None or topic.meter is None or bound.overflow is not OverflowPolicy.REFUSE:
            return
        over = topic.over_bound_ns(arrival)
        if over > 0:
            topic.refused_over_bound += n
            why = refusal(topic.name, over + bound.max_wait_ns, bound)
            verb = code.removeprefix("E_").removesuffix("_FAILED")
            raise ProtocolError(code, f"{verb} failed: {why}")

    def _block_over_bound(self, topic: Topic, client: Client | None) -> None:
        """Under ``block``, the connection of a publish that left its topic over the
        bound is not read until the topic is within it again."""
        bound = topic.bound
        if bound is None or topic.meter is None or client is None:
            return
        if bound.overflow is not OverflowPolicy.BLOCK:
            return
        over = topic.over_bound_ns(time.time_ns())
        # A relay link carries other topics too (and what it brings was acknowledged at
        # the broker it came from): it is never blocked, it counts toward the bound.
        if over > 0 and client.identity.get("srtm_relay") is not True:
            self._block(client, topic.name, over)

    def _put(
        self, topic: Topic, bodies: list[bytes], arrival: int, publisher: str | None
    ) -> asyncio.Future[Any] | None:
        """``publish``'s work, in one go (at most ``PUBLISH_SLICE`` messages)."""
        pushed = self.persistence.pushed
        pushed.clear()
        n = len(bodies)
        now = time.time_ns()
        backlog = topic.put_many(
            self.ids.take(n), bodies, now, arrival, publisher, self.releaser.direct
        )
        self.stats.topic(topic.name).window.add(arrival, n, backlog)
        self.releaser.kick(topic)
        if pushed:
            return self.persistence.write_through()
        return None

    def _take_in_slices(self, take: _Take) -> asyncio.Future[Any]:
        """A publish of more than ``PUBLISH_SLICE`` messages: one slice now, one per loop
        turn after, sized so that the slices of all such publishes take about
        ``_SLICE_S`` per turn together, so that the loop serves everyone else in between
        (one 5 MiB MPUB is a million messages: seconds of work in one turn; shaped, each
        is booked on the meter on its own). Whatever was checked before the first slice
        holds for all: none is refused once the first is taken. Returns a future done
        once every slice is taken and written, as ``publish``'s."""
        if not self._takes:
            # While a million-message publish is taken, a full collection walks every
            # element of its list of bodies and of the disk queue's buffer of records
            # (40-50 ms, a few times per MPUB, though the oldest generation held 3,600
            # objects). Both are gone once it is taken and written; the young
            # generations go on as ever (disabling the collector instead left one young
            # collection of everything at the end: 300 ms).
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, _TAKE_GEN2_THRESHOLD)
        self._take_slice(take, _FIRST_SLICE)
        task = asyncio.ensure_future(self._take_rest(take))
        self._takes[take] = task
        return task

    def _take_slice(self, take: _Take, n: int) -> None:
        start, end = take.taken, min(take.taken + n, len(take.bodies))
        take.taken = end
        if self.topics.get(take.topic.name) is not take.topic:
            # Deleted meanwhile: as if deleted after the publish, with what it held.
            take.taken = len(take.bodies)
            return
        written = self._put(take.topic, take.bodies[start:end], take.arrival, take.publisher)
        if written is not None:
            take.writes.append(written)

    async def _take_rest(self, take: _Take) -> None:
        n = _FIRST_SLICE
        try:
            while True:
                await asyncio.sleep(0)  # a loop turn for everyone else
                if take.taken >= len(take.bodies):  # ``stop`` may have taken the rest
                    break
                start = time.perf_counter()
                self._take_slice(take, n)
                spent = time.perf_counter() - start
                # Takes running together share a turn's time (one each per turn).
                share = _SLICE_S / len(self._takes)
                n = max(_MIN_SLICE, min(PUBLISH_SLICE, int(n * share / max(spent, 1e-6))))
            # Written, the records leave the disk queue's buffer; the bodies go now.
            take.bodies = []
            if take.writes:
                await asyncio.gather(*take.writes)
        finally:
            self._takes.pop(take, None)
            if not self._takes:
                gc.set_threshold(*gc.get_threshold()[:2], _GEN2_THRESHOLD)

    def _finish_takes(self) -> None:
        """At stop: what sliced publishes have left is taken now, so that each is saved
        whole (never acknowledged: their connections are closed)."""
        for take, task in list(self._takes.items()):
            while take.taken < len(take.bodies):
                self._take_slice(take, PUBLISH_SLICE)
            task.cancel()
        self._takes.clear()
        gc.set_threshold(*gc.get_threshold()[:2], _GEN2_THRESHOLD)

    def publish_deferred(
        self,
        topic_name: str,
        body: bytes,
        defer_ms: int,
        arrival: int,
        publisher: str | None,
        client: Client | None = None,
        local: bool = False,
    ) -> asyncio.Future[Any] | None:
        """DPUB: one message due in ``defer_ms``, then shaped like a PUB (see
        ``Topic.tick``). A topic with a relay route is the relay's, as in ``publish``;
        returns what to wait for before the OK (its write to disk, past the memory
        bound; None: nothing)."""
        if not local and topic_name in self.relay.routes:
            return self.relay.publish_deferred(
                topic_name, body, defer_ms, arrival, publisher, client
            )
        topic = self._publish_topic(topic_name, "DPUB", errors.E_DPUB_FAILED)
        # Bounded as a PUB is: what waits behind the bucket now is what it joins (a
        # DPUB 0 at once; a longer delay is judged by the wait it would join now).
        self._refuse_over_bound(topic, 1, arrival, errors.E_DPUB_FAILED)
        pushed = self.persistence.pushed
        pushed.clear()
        now = time.time_ns()
        who = publisher_of(body) if publisher is None else publisher
        topic.defer(
            Message(self.ids.next(), body, now, arrival, publisher=who),
            now + defer_ms * 1_000_000,
        )
        self.stats.topic(topic_name).window.add(arrival, 1, 0.0)
        self._deferring.add(topic)
        self._tick_topic(topic, now)  # DPUB 0 joins the shaping queue at once
        self._block_over_bound(topic, client)
        if pushed:
            return self.persistence.write_through()
        return None

    # -- policing: topics over their bound (srtm.ratelimit.overflow) ---------------------------
    def set_bound(self, topic_name: str, bound: Bound | None) -> None:
        """The topic's bound and overflow policy (it acts while the topic is shaped);
        connections it blocked are looked at again at once."""
        topic = self.topic(topic_name)
        if topic.bound != bound:
            topic.bound = bound
            self.persistence.save_meta()
        if topic_name in self.blocked:
            self._recheck_blocked(topic_name)

    def _block(self, client: Client, topic_name: str, over_ns: int) -> None:
        """``block``: ``client`` published to a topic now over its bound by ``over_ns``:
        not read until the topic is within it again."""
        client.block_reads()
        self.blocked.setdefault(topic_name, set()).add(client)
        if topic_name not in self._block_timers:
            self._arm_recheck(topic_name, over_ns)

    def _arm_recheck(self, topic_name: str, over_ns: int) -> None:
        # The wait falls as time passes: look again when it should be within the bound,
        # and at least every second (a retuned, unshaped, held or deleted topic, a
        # closed connection: nobody stays blocked for a stale reason).
        delay = min(max(over_ns, 0) / 1e9, 1.0) + 0.001
        loop = asyncio.get_running_loop()
        self._block_timers[topic_name] = loop.call_later(delay, self._recheck_blocked, topic_name)

    def _recheck_blocked(self, topic_name: str) -> None:
        timer = self._block_timers.pop(topic_name, None)
        if timer is not None:
            timer.cancel()
        clients = self.blocked.get(topic_name)
        if not clients:
            self.blocked.pop(topic_name, None)
            return
        topic = self.topics.get(topic_name)
        over = 0
        if (
            topic is not None
            and topic.bound is not None
            and topic.bound.overflow is OverflowPolicy.BLOCK
        ):
            over = topic.over_bound_ns(time.time_ns())
        live = {c for c in clients if not c.finishing}
        if over > 0 and live:
            self.blocked[topic_name] = live
            self._arm_recheck(topic_name, over)
            return
        del self.blocked[topic_name]
        for client in live:
            if not any(client in cs for cs in self.blocked.values()):
                client.unblock_reads()

    async def within_bound(self, topic_name: str) -> None:
        """HTTP's ``block``: the publish (and its answer) waits until the topic is within
        its bound, as a TCP publisher's reads do; past ``max_wait_ms`` more of waiting,
        E_PUB_FAILED naming the limit (HTTP 503)."""
        topic = self.topics.get(topic_name)
        bound = None if topic is None else topic.bound
        if topic is None or topic.meter is None or bound is None:
            return
        if bound.overflow is not OverflowPolicy.BLOCK:
            return
        give_up = time.monotonic() + bound.max_wait_ms / 1000
        while (over := topic.over_bound_ns(time.time_ns())) > 0:
            if time.monotonic() >= give_up:
                why = refusal(topic_name, over + bound.max_wait_ns, bound)
                raise ProtocolError(errors.E_PUB_FAILED, f"PUB failed: {why}")
            await asyncio.sleep(min(over / 1e9, give_up - time.monotonic(), 1.0) + 0.001)
            if self.topics.get(topic_name) is not topic or topic.bound is not bound:
                return  # deleted, or its bound changed: published as it is now

    def _publish_topic(self, name: str, what: str, limit_code: str) -> Topic:
        """The topic to publish to, or E_PUB_FAILED if it cannot take messages now
        (``limit_code`` when it would be one topic too many)."""
        try:
            topic = self.topic(name, limit_code)
        except OSError as exc:  # its metadata could not be written (disk full...)
            raise ProtocolError(errors.E_PUB_FAILED, f"{what} failed: {exc}") from exc
        if self.persistence.failing:
            self.persistence.refuse_if_failing(topic, what)
        return topic

    # -- delivery ------------------------------------------------------------------------
    def mark_ready(self, channel: Channel) -> None:
        """Dispatch this channel soon (once per loop turn, however many calls). One with
        no consumer has nothing to dispatch (a single PUB into it would cost a loop turn
        more); a consumer has RDY 0 until its RDY, which marks the channel again."""
        if not channel.consumers:
            return
        self._dirty.add(channel)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for ch in dirty:
            self._dispatch(ch)

    def _dispatch(self, ch: Channel, send: bool = False) -> None:
        now = time.time_ns()
        out = ch.take(now)
        if not out:
            return
        self._account(ch, out, now)
        for consumer, records in out:
            assert isinstance(consumer, Client)
            consumer.send_records(records)
            if send:
                consumer.send_now()

    def _account(self, ch: Channel, out: Sequence[tuple[object, list[Record]]], now: int) -> None:
        """What a dispatch records: stats, traces and measurement rounds. The topic's own
        figures come from its first channel (each channel gets a copy of every message)."""
        topic = self.topics.get(ch.topic)
        if topic is None:
            return
        shaped = topic.bucket is not None
        first_channel = next(iter(topic.channels.values()), None) is ch
        # with an emulated server, the lateness is measured when it has processed one
        lateness = shaped and self.releaser.server is None
        records = out[0][1] if len(out) == 1 else [r for _, rs in out for r in rs]
        stats = self.stats.topic(ch.topic)
        unserved = ch.unserved_before_ns
        stats.dispatched(ch.name, records, now, shaped, first_channel, lateness, unserved)
        if unserved and not topic.may_hold_before(ch, unserved):
            ch.unserved_before_ns = 0  # nothing from before its subscriber is left
        if not first_channel or (self.traces is None and not self.measurements.running):
            return
        # Traces and measurement rounds take messages (as sent: attempts counted).
        sent = [(c, Message(*attempted(r))) for c, rs in out for r in rs]
        if (traces := self.traces) is not None:
            for _, msg in sent:
                if msg.attempts == 1:
                    traces.add(ch.topic, msg, now)
        if self.measurements.running:
            self.measurements.record(ch.topic, sent, now)

    def _disk_readable(self, key: str) -> None:
        """The disk queue of ``key`` has read or written records ``pop`` can give now:
        dispatch its channel, or release its topic, again."""
        name, sep, channel = key.partition(":")
        topic = self.topics.get(name.split("@")[0])
        if topic is None:
            return
        if name == topic.name:
            # What the topic held for its first channel (read back after a restart):
            # that channel takes it, as it took what was in memory when it was made.
            first = next(iter(topic.channels.values()), None)
            if first is not None:
                for msg in topic.held.drain():
                    first.put(msg)
                self.mark_ready(first)
        elif name.endswith("@deferred"):
            self._deferring.add(topic)  # the scan takes what was read back when due
        elif not sep:
            self.releaser.kick(topic)
        elif (ch := topic.channels.get(channel)) is not None:
            self.mark_ready(ch)

    def release_due(self) -> bool:
        """Release shaped messages that are due (see ``Releaser.release_due``)."""
        return self.releaser.release_due()

    # -- measurement rounds --------------------------------------------------------------
    async def measure(
        self, topic: str, publishers: frozenset[str] | None, window_ns: int
    ) -> Measurement:
        """Run a measurement round for ``window_ns`` and return it; cancelling the call
        ends the round. At most ``max_measurements`` run at once (MeasurementsBusy)."""
        return await self.measurements.run(topic, publishers, window_ns, self.clients)

    @property
    def max_measurements(self) -> int:
        return self.measurements.limit

    @max_measurements.setter
    def max_measurements(self, limit: int) -> None:
        self.measurements.limit = limit
