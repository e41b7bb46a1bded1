"""The broker: topics, channels and client connections on one asyncio loop.

``Broker`` keeps the registry of topics and channels, serves the operations that
connections (``srtm.broker.tcp``) and the HTTP API (``srtm.broker.http``) call, delivers
messages to consumers and runs the background tasks. The rest is done by parts it owns,
one module each, none of which imports this one (each is handed what it needs):

- ``persistence.Persistence``: the disk queues, ``meta.json``, the save at stop;
- ``restart.restore``: what the last run saved, put back in place at start;
- ``release.Releaser``: the release loop of shaped topics and the emulated server;
- ``measurement.Measurements``: measurement rounds and the publishers' RTTs;
- ``stats.BrokerStats``: what publishes and dispatches record;
- ``dispatch.Dispatcher``: a channel's dispatch to its consumers, and what it records;
- ``scan.Scan``: deferred messages that came due, in-flight messages that timed out;
- ``relay.Relay``: the routes and the links to other brokers;
- ``shares.Shares``: the sub-buckets, holds and lease the controller gives;
- ``handoff.Handoffs``: shares handed from one broker to another;
- ``policing.Policing``: publishes to a topic over its bound;
- ``takes.Takes``: publishes too big for one loop turn, taken in slices;
- ``accept.Acceptor``: the accept loop;
- ``admission.Admissions``: consumer admission control per topic.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from srtm.broker.accept import LISTEN_BACKLOG, Acceptor, refuse
from srtm.broker.admission import Admission, Admissions
from srtm.broker.auth import Authenticator, close_quietly
from srtm.broker.busypoll import BusyPoll
from srtm.broker.closer import Closer
from srtm.broker.dispatch import Dispatcher
from srtm.broker.handoff import Handoffs
from srtm.broker.housekeeping import Housekeeping
from srtm.broker.measurement import Measurement, Measurements
from srtm.broker.message import Message, MessageIds
from srtm.broker.options import VERSION, BrokerOptions
from srtm.broker.persistence import Persistence
from srtm.broker.policing import Policing, refuse_over_bound
from srtm.broker.queue import NOT_KEPT, ON_DISK, PUBLISH_SLICE
from srtm.broker.relay import Relay
from srtm.broker.release import Releaser
from srtm.broker.restart import restore
from srtm.broker.scan import Scan
from srtm.broker.shares import Shares
from srtm.broker.state import Channel, LimitReached, Topic
from srtm.broker.stats import BrokerStats, StorageLatencyMeter
from srtm.broker.takes import Take, Takes
from srtm.broker.tcp import Client, deadline_loop, enable_kernel_timestamps
from srtm.broker.tls import identity_keys, server_context
from srtm.broker.traces import TraceWriter
from srtm.protocol import ProtocolError, errors, is_valid_name
from srtm.protocol.header import publisher_of
from srtm.protocol.session import E_SUB_FAILED

log = logging.getLogger("srtm.broker")
#: Each persisted topic's storage latency since the last report, by topic.
_Meters = defaultdict[str, StorageLatencyMeter]


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
        #: The connections a deadline bounds now (output left unsent, a command partly
        #: read), in the order they began: the deadline pass looks only at these, not at
        #: thousands of idle sensors (a dict as an ordered set).
        self.deadline_watch: dict[Client, None] = {}
        #: Consumer admission control per topic name (srtm.broker.admission).
        self.admission = Admissions()
        #: Bytes sent to connections closed since start (``egress_bytes``).
        self._sent_closed = 0
        self.stats = BrokerStats(self.options.window_seconds)
        #: Per topic: how long publishes waited for their disk write before the OK.
        self.storage_latency: _Meters = defaultdict(StorageLatencyMeter)
        self.ids = MessageIds(self.options.broker_id, time.time_ns() // 1000)
        self.started_ns = time.time_ns()
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.https_address: tuple[str, int] | None = None
        #: TLS and AUTH (srtm.broker.tls, srtm.broker.auth); None where not configured.
        self.tls_context = server_context(self.options)
        auth = self.options.auth_http_address
        self.authenticator = Authenticator(auth) if auth else None
        self._tasks: list[asyncio.Task[None]] = []
        self.acceptor: Acceptor | None = None
        #: Connections closed at once because ``max_connections`` were open.
        self.refused_connections = 0
        self.stopped = asyncio.Event()
        # The parts (see the module's docstring), each handed what it needs.
        self.persistence = Persistence(self.options, self, partial(disk_readable, self))
        self.shares = Shares(self)
        self.measurements = Measurements()
        emulated = self.options.capacity > 0
        self.dispatcher = Dispatcher(self.topics, self.stats, self.measurements, emulated)
        self.releaser = Releaser(
            self.options, self.topics, self.stats, self.dispatcher.mark_ready,
            self.dispatcher.dispatch, self.shares.lease_ok,
        )  # fmt: skip
        #: Release shaped messages that are due (``Releaser.release_due``): called around
        #: every command read, so without a call of the broker's own in between.
        self.release_due: Callable[[], bool] = self.releaser.release_due
        #: The topic and arrival of a ``publish_one`` not yet counted (``account_one``).
        self._unaccounted: tuple[Topic, int] | None = None
        self.busy_poll = BusyPoll(self.options.busy_poll_us * 1000)
        #: Connections whose peer went, closed a slice a loop turn (``Closer``).
        self.closer = Closer(self.release_due)
        self.housekeeping = Housekeeping(self)
        self.relay = Relay(self)
        #: What proves a relay link or a consumer class (docs/security.md, "Identities").
        self.keys = identity_keys(self.options, self.relay.security.secret)
        self.handoffs = Handoffs(self.relay, self.shares.set_bucket)
        self.policing = Policing(self.topics, self.topic, self.persistence.save_meta)
        self.takes = Takes(self.topics, self._put)
        self.scan = Scan(
            self.topics, self.dispatcher.mark_ready, self.releaser.kick, self.releaser.clear
        )

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        restore(self)
        self.persistence.serve()
        if opts.trace_dir is not None:
            self.dispatcher.traces = TraceWriter(
                opts.trace_dir, opts.run, str(opts.broker_id), opts.trace_sample
            )
        listener = socket.create_server((opts.tcp_host, opts.tcp_port), backlog=LISTEN_BACKLOG)
        listener.setblocking(False)
        if opts.kernel_timestamps:
            # Accepted sockets inherit it, so even bytes that arrive before the accept
            # (a client's first PUB) carry their kernel receive stamp.
            enable_kernel_timestamps(listener)
        self.acceptor = Acceptor(listener, self._admit, opts.shared_fd)
        self.tcp_address = listener.getsockname()[:2]
        self._tasks = [
            asyncio.create_task(self.acceptor.run(), name="srtm-accept"),
            asyncio.create_task(self.scan.run(opts.scan_interval_ms / 1000), name="srtm-scan"),
            asyncio.create_task(self.housekeeping.run(), name="srtm-housekeeping"),
        ]
        if opts.busy_poll_us and not self.busy_poll.enabled:
            log.info("busy polling off: fewer than two usable CPUs (affinity or cgroup quota)")
        self.releaser.start()
        self._tasks.append(asyncio.create_task(self.releaser.run(), name="srtm-release"))
        deadlines = deadline_loop(opts.read_timeout_ms, opts.write_timeout_ms, self.deadline_watch)
        self._tasks.append(asyncio.create_task(deadlines, name="srtm-deadlines"))
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
        listener = None if self.acceptor is None else self.acceptor.detach()
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
        self.takes.finish()
        await self.persistence.persist()
        await close_quietly(self.authenticator)
        if (traces := self.dispatcher.traces) is not None:
            await traces.close()
        self.stopped.set()

    # -- background tasks ----------------------------------------------------------------
    def _admit(self, sock: socket.socket, shared: bool = False) -> None:
        limit = self.options.max_connections
        if limit and len(self.clients) >= limit:
            self.refused_connections += 1
            refuse(sock, f"max connections ({limit}) reached")
            return
        try:
            self.clients.add(Client(self, sock, self.options.kernel_timestamps, shared))
        except OSError:
            sock.close()  # gone before we could set it up

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Log a background task's death when it happens, not at the next stop."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s died", task.get_name(), exc_info=exc)

    def health(self) -> str | None:
        """What is wrong with this broker (for /ping), or None."""
        if self.acceptor is not None and self.acceptor.error is not None:
            return self.acceptor.error
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return f"task {task.get_name()} died: {task.exception()!r}"
        return None

    # -- connections ---------------------------------------------------------------------
    def disconnected(self, client: Client) -> None:
        self.deadline_watch.pop(client, None)
        if client in self.clients:  # counted once
            self.clients.discard(client)
            self._sent_closed += client.sent_bytes
        self.admission.gone(client.consumer_class, client)
        ch = client.channel
        if ch is None:
            return
        self.admission.leave(ch.topic, client.consumer_class, client)
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
        ch = self.scan.watch(topic.channel(channel_name))
        if new:
            self.names_changed.set()
        if new and not ch.ephemeral and not topic.ephemeral:
            self.persistence.save_meta()
        self.mark_ready(ch)
        return ch

    def subscribe(self, topic_name: str, channel_name: str, client: Client) -> Channel:
        """Add ``client`` as a consumer, if its class admits one more (else NotAdmitted,
        and nothing is created)."""
        self.admission.check(topic_name, client.consumer_class, client)
        ch = self.channel(topic_name, channel_name, E_SUB_FAILED)
        self.stats.topic(topic_name).channel(channel_name)  # now, not on the first release
        self.admission.join(topic_name, client.consumer_class, client)
        ch.add_consumer(client, time.time_ns())
        return ch

    def egress_bytes(self) -> int:
        """Bytes sent to clients since start (read once per report: the sum over the
        connections open, so the write path only counts its own)."""
        return self._sent_closed + sum(c.sent_bytes for c in self.clients)

    def set_admission(
        self, topic_name: str, admitted: dict[str, int], order: list[str]
    ) -> tuple[Admission, int]:
        """The topic's admitted counts per class and their order (most important first);
        consumers beyond a count are disconnected, the lowest class first and the newest
        of a class first. Returns the admission and how many were disconnected."""
        return self.admission.set(topic_name, admitted, order, partial(_evict, topic_name))

    def delete_channel(self, topic_name: str, channel_name: str) -> None:
        topic = self.topics.get(topic_name)
        if topic is None or channel_name not in topic.channels:
            raise KeyError(channel_name)
        ch = topic.channels.pop(channel_name)
        self.names_changed.set()
        self.scan.timed.discard(ch)
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
        self.releaser.unshape(name)
        self.shares.forget(name)
        for ch_name in list(topic.channels):
            ch = topic.channels.pop(ch_name)
            self.scan.timed.discard(ch)
            for consumer in list(ch.consumers):
                if isinstance(consumer, Client):
                    consumer.close()
            self.persistence.remove(f"{name}:{ch_name}")
        self.persistence.remove(name)
        self.persistence.remove(f"{name}@shaping")
        self.persistence.remove(f"{name}@deferred")
        self.scan.deferring.discard(topic)
        self.stats.drop_topic(name)
        if not topic.ephemeral:
            self.persistence.save_meta()

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
        A topic with a relay route (``client``: the connection it came on) is the relay's
        to forward or replicate; ``local``: accept it here."""
        if not local and topic_name in self.relay.routes:
            return self.relay.publish(topic_name, bodies, arrival, publisher, client)
        topic = self.topics.get(topic_name)  # a sensor's publish: no call more
        if topic is None or self.persistence.failing:
            topic = self._publish_topic(topic_name, "PUB", errors.E_PUB_FAILED)
        bodies = bodies if isinstance(bodies, list) else list(bodies)
        if topic.bound is not None:
            refuse_over_bound(topic, len(bodies), arrival)
        done: asyncio.Future[Any] | None
        if len(bodies) > PUBLISH_SLICE:
            done = self.takes.take(Take(topic, bodies, arrival, publisher))
        else:
            done = self._put(topic, bodies, arrival, publisher)
        if topic.bound is not None:
            self.policing.block_over_bound(topic, client)
        return done

    def publish_one(
        self, topic_name: str, body: bytes, arrival: int, publisher: str | None
    ) -> bool:
        """``publish`` of a sensor's PUB kept at once (``_put_one``), to an existing topic,
        unrouted, unbounded, the disk working; False (nothing done) elsewhere."""
        topic = self.topics.get(topic_name)
        if topic is None or topic.bound is not None:
            return False
        if self.persistence.failing or topic_name in self.relay.routes:
            return False
        self.account_one()  # one left by a read that did not get to its answer
        if self._put_one(topic, self.ids.next(), body, time.time_ns(), arrival, publisher):
            self._unaccounted = (topic, arrival)  # counted once its OK is sent
            return True
        self.ids.give_back()  # ``publish`` takes it
        return False

    def account_one(self) -> None:
        """What the last ``publish_one`` kept, counted in its topic's window (the TB
        Adaptor's arrivals and backlog), once its OK has been sent: the OK does not need
        the count, and the read runs cold, each step before the send costing the round
        trip several times what it costs warm."""
        if (kept := self._unaccounted) is not None:
            self._unaccounted = None
            topic, arrival = kept
            self.stats.topic(topic.name).window.add(arrival, 1, topic.backlog_at(arrival))

    def _put_one(
        self, topic: Topic, id_: bytes, body: bytes, now: int, arrival: int, publisher: str | None
    ) -> bool:
        """One message where ``Topic.put_one`` keeps it, as ``_put`` would (its kick: ready)."""
        if topic.bucket is not None:  # past the lease it is held, as a release finds first
            self.shares.lease_ok()
        kept = topic.put_one(id_, body, now, arrival, publisher, self.releaser.direct)
        if kept is NOT_KEPT:
            return False
        if topic.bucket is not None:  # shaped, released on arrival: sent before its accounting
            self.releaser.released_on_arrival(topic)
        elif topic.channels:  # none: held for the first, nothing to dispatch
            self.releaser.ready(topic)
        if kept is ON_DISK:
            self.storage_latency[topic.name].add(time.time_ns() - arrival)
        return True

    def _put(
        self, topic: Topic, bodies: list[bytes], arrival: int, publisher: str | None
    ) -> asyncio.Future[Any] | None:
        """``publish``'s work, in one go (at most ``PUBLISH_SLICE`` messages; more are
        taken in slices of it, ``Takes``)."""
        n = len(bodies)
        now = time.time_ns()
        ids = self.ids.take(n)
        if n == 1 and self._put_one(topic, ids[0], bodies[0], now, arrival, publisher):
            self.stats.topic(topic.name).window.add(arrival, 1, topic.backlog_at(arrival))
            return None
        direct = self.releaser.direct
        pushed = self.persistence.pushed
        pushed.clear()
        backlog = topic.put_many(ids, bodies, now, arrival, publisher, direct)
        self.stats.topic(topic.name).window.add(arrival, n, backlog)
        self.releaser.kick(topic)
        if pushed:
            written = self.persistence.write_through()
            # The storage latency (Bhola et al. §III-C): arrival to the write the OK waits for.
            meter = self.storage_latency[topic.name]
            if written is None:  # written inline: acknowledged now
                meter.add(time.time_ns() - arrival)
            else:
                written.add_done_callback(lambda _: meter.add(time.time_ns() - arrival))
            return written
        return None

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
        refuse_over_bound(topic, 1, arrival, errors.E_DPUB_FAILED)
        pushed = self.persistence.pushed
        pushed.clear()
        now = time.time_ns()
        who = publisher_of(body) if publisher is None else publisher
        topic.defer(
            Message(self.ids.next(), body, now, arrival, publisher=who),
            now + defer_ms * 1_000_000,
        )
        self.stats.topic(topic_name).window.add(arrival, 1, 0.0)
        self.scan.deferring.add(topic)
        self.scan.tick_topic(topic, now)  # DPUB 0 joins the shaping queue at once
        self.policing.block_over_bound(topic, client)
        if pushed:
            return self.persistence.write_through()
        return None

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
        """Dispatch this channel soon (``Dispatcher.mark_ready``)."""
        self.dispatcher.mark_ready(channel)

    def takes_runs(self, topic_name: str) -> bool:
        """Whether a read's run of PUBs to the topic may be one publish: it has no bound,
        which is judged PUB by PUB (refused, or the publisher blocked, at the first over)."""
        return (topic := self.topics.get(topic_name)) is not None and topic.bound is None

    # -- measurement rounds --------------------------------------------------------------
    async def measure(
        self, topic: str, publishers: frozenset[str] | None, window_ns: int
    ) -> Measurement:
        """A measurement round (``Measurements.run``: it opens once the topic's backlog has
        drained); cancelling the call ends it. MeasurementsBusy past ``measurements.limit``."""
        drained = partial(backlog_drained, self.topics, topic)
        return await self.measurements.run(topic, publishers, window_ns, self.clients, drained)


def disk_readable(broker: Broker, key: str) -> None:
    """The disk queue of ``key`` has read or written records ``pop`` can give now:
    dispatch its channel, or release its topic, again (``Persistence``'s callback)."""
    name, sep, channel = key.partition(":")
    topic = broker.topics.get(name.split("@")[0])
    if topic is None:
        return
    if sep:  # a channel's ("topic:channel"; its topic's name is ``name`` too)
        if (ch := topic.channels.get(channel)) is not None:
            broker.mark_ready(ch)
    elif name == topic.name:
        # What the topic held for its first channel (read back after a restart): that
        # channel takes it, as it took what was in memory when it was made.
        first = next(iter(topic.channels.values()), None)
        if first is not None:
            for msg in topic.held.drain():
                first.put(msg)
            broker.mark_ready(first)
    elif name.endswith("@deferred"):
        broker.scan.deferring.add(topic)  # the scan takes what was read back when due
    else:
        broker.releaser.kick(topic)


def backlog_drained(topics: Mapping[str, Topic], name: str) -> bool:
    """None of ``name``'s messages waits for tokens: what a move left has drained. A
    queue as deep as the burst is not enough: with the bucket empty, each of them waits
    a token's time more (an unshaped topic never waits)."""
    topic = topics.get(name)
    return topic is None or topic.bucket is None or len(topic.shaping) == 0


def _evict(topic_name: str, client: object, adm: Admission) -> None:
    """Disconnect a consumer of ``topic_name`` beyond its class's admitted count."""
    assert isinstance(client, Client)
    admits = adm.admitted.get(client.consumer_class)
    client.evict(
        ProtocolError(
            E_SUB_FAILED,
            f"class {client.consumer_class!r} of topic {topic_name!r} now admits "
            f"{admits} consumers: the newest are disconnected",
        )
    )
