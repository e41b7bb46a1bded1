"""Topics and channels: nsqd's delivery semantics plus SRTM's shaping, no I/O.

Every method takes the current time (``now``, CLOCK_REALTIME ns, the clock arrival
stamps come from) so the logic is deterministic under test. Queues come from a
factory the broker injects (memory-bounded, overflowing to disk where durable).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from srtm.broker.flights import fin_flights, fly
from srtm.broker.message import Message
from srtm.broker.queue import (
    IN_MEMORY,
    NOT_KEPT,
    DeferredQueue,
    Fresh,
    Kept,
    MessageQueue,
    Record,
    attempted,
    settle,
)
from srtm.protocol import ProtocolError, is_ephemeral
from srtm.protocol.header import publisher_of
from srtm.ratelimit import Reservation, TokenBucket
from srtm.ratelimit.overflow import Bound, OverflowPolicy, over_by_ns

#: Makes the queue for a key: ``topic`` (held), ``topic@shaping``, ``topic@deferred``
#: (only its bound and backend are used: see ``DeferredQueue``), ``topic:channel``.
QueueFactory = Callable[[str], MessageQueue]


def memory_queues(mem_size: int = 1 << 62) -> QueueFactory:
    """Queues without a backend (tests, ephemeral use)."""
    return lambda key: MessageQueue(mem_size)


class Consumer(Protocol):
    """What a channel needs of a subscribed client."""

    rdy: int
    in_flight: int
    msg_timeout_ns: int


#: Settled ids a channel's deadlines may hold beyond 4 x what is in flight before they are
#: compacted away. Few: each dispatch's deadline is a tuple and a list, tracked by the
#: collector, and at 1,024, with a consumer FINing each shaped release at once, they were
#: the whole of the young generation and set it off 47 times in 5 s at 10,000/s (300-800
#: µs each, releases held meanwhile); at 64, 2 or 3 times.
STALE_DEADLINES = 64

#: A message in flight: its record as it was queued (the attempt it is on is one more
#: than the record says: see ``queue.attempted``), its consumer and its deadline. A plain
#: tuple: one allocation per dispatched message, replaced whole by a TOUCH.
Flight = tuple[Record, Consumer, int]


class LimitReached(ProtocolError):
    """A topic or channel the broker's limits leave no room for: nothing was created
    and nothing already accepted changes. ``http_code`` is the HTTP API's message."""

    def __init__(self, code: str, message: str, http_code: str) -> None:
        super().__init__(code, message)
        self.http_code = http_code


class LeaseExpired(Exception):
    """A sub-bucket pushed while the broker's lease has lapsed: it may be stale (sent
    before the controller gave this broker's shares away), so it is not applied."""


class DeliveryError(Exception):
    """FIN/REQ/TOUCH of a message that is not in flight for this client."""


class Homing(Protocol):
    """Which channels of a replicated topic this broker serves."""

    def keeps(self, channel: str) -> bool: ...

    @property
    def serves_unlisted(self) -> bool:
        """Whether a channel not made yet may be served here (then what comes before it
        is held for it, as for a topic's first channel)."""
        ...


@dataclass(eq=False)  # identity: channels are kept in sets
class Channel:
    """One subscription of a topic: every channel gets a copy, one consumer gets each."""

    topic: str
    name: str
    queue: MessageQueue
    in_flight: dict[bytes, Flight] = field(default_factory=dict)
    consumers: list[Consumer] = field(default_factory=list)
    paused: bool = False
    message_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    _deferred: list[tuple[int, int, Message]] = field(default_factory=list)
    #: Deadlines, one per dispatch batch (they share one): (deadline, seq, message ids).
    _timeouts: list[tuple[int, int, list[bytes]]] = field(default_factory=list)
    #: Ids in ``_timeouts`` (settled ones too, until compacted away).
    _timeout_ids: int = 0
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _next_consumer: int = 0
    #: Where the channel puts itself when it gets a deferred message or an in-flight
    #: deadline (the broker's scan then looks at these channels only, not at every one).
    watch: set[Channel] | None = field(default=None, repr=False)
    #: A message that arrived before this (ns) waited for a subscriber: when the channel
    #: last got a consumer while it had none (0: neither it nor its topic holds one
    #: that old). One that arrived since, while a consumer stayed, was served.
    unserved_before_ns: int = 0

    @property
    def ephemeral(self) -> bool:
        return is_ephemeral(self.name)

    @property
    def depth(self) -> int:
        return len(self.queue)

    @property
    def deferred_count(self) -> int:
        return len(self._deferred)

    def put(self, msg: Message) -> None:
        self.message_count += 1
        self.queue.append(msg)

    def put_many(self, batch: list[Record] | Fresh) -> None:
        """Fresh messages, as records or a ``Fresh`` batch (see ``Topic.put_many``)."""
        self.message_count += len(batch)
        self.queue.extend(batch)

    def defer(self, msg: Message, due_ns: int) -> None:
        heapq.heappush(self._deferred, (due_ns, next(self._seq), msg))
        if self.watch is not None:
            self.watch.add(self)

    def put_deferred(self, msg: Message, due_ns: int) -> None:
        """A new message (DPUB), due later; unlike a delayed REQ it counts as a message."""
        self.message_count += 1
        self.defer(msg, due_ns)

    # -- consumers -----------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer, now: int) -> None:
        """A consumer subscribes at ``now``: the first one (the channel had none) makes
        whatever arrived before it one that waited for a subscriber."""
        if not self.consumers:
            self.unserved_before_ns = now
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Drop a consumer. What it had in flight stays in flight until its deadline, then
        is requeued and counted as a timeout (``tick``), as nsqd does: no other consumer
        can settle it meanwhile, and it is still owed (``head``) if the broker stops."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def dispatch(self, now: int) -> list[tuple[Consumer, Message]]:
        """``take``, one ``Message`` per delivery (attempts counted): the per-message view."""
        return [(c, Message(*attempted(r))) for c, recs in self.take(now) for r in recs]

    def take(self, now: int) -> list[tuple[Consumer, list[Record]]]:
        """Hand queued messages to consumers with RDY room, round-robin; per consumer the
        records it gets, as they were queued (each is now on attempt ``attempts + 1``)."""
        consumers = self.consumers
        if self.paused or not consumers:
            return []
        if len(consumers) == 1:
            c = consumers[0]
            room = c.rdy - c.in_flight
            recs = self.queue.take(room) if room > 0 else []
            if not recs:
                return []
            c.in_flight += len(recs)
            out = [(c, recs)]
        else:
            out = self._round_robin()
        for c, recs in out:
            self._fly(c, recs, now)
        if out and self.watch is not None:
            self.watch.add(self)
        return out

    def _round_robin(self) -> list[tuple[Consumer, list[Record]]]:
        """Share the queue among consumers with room, starting one further each time:
        each gets an equal share of what is queued (at most its room) per pass, until the
        queue or the room runs out (counted in flight)."""
        consumers = self.consumers
        n = len(consumers)
        start = self._next_consumer % n
        self._next_consumer = start + 1
        rooms = [(c, c.rdy - c.in_flight) for c in consumers[start:] + consumers[:start]]
        rooms = [(c, room) for c, room in rooms if room > 0]
        groups: dict[int, tuple[Consumer, list[Record]]] = {}
        queue = self.queue
        while rooms:
            share = max(1, -(-len(queue) // len(rooms)))
            left: list[tuple[Consumer, int]] = []
            for c, room in rooms:
                recs = queue.take(min(room, share))
                if not recs:
                    return list(groups.values())
                c.in_flight += len(recs)
                groups.setdefault(id(c), (c, []))[1].extend(recs)
                if room > len(recs):
                    left.append((c, room - len(recs)))
            rooms = left
        return list(groups.values())

    def _fly(self, consumer: Consumer, recs: list[Record], now: int) -> None:
        """``recs`` are in flight to ``consumer`` until one deadline (one heap entry)."""
        deadline = now + consumer.msg_timeout_ns
        ids = fly(self.in_flight, recs, consumer, deadline)
        heapq.heappush(self._timeouts, (deadline, next(self._seq), ids))
        self._timeout_ids += len(ids)

    # -- FIN / REQ / TOUCH ---------------------------------------------------------------
    def _take(self, mid: bytes, consumer: Consumer) -> Flight:
        flight = self.in_flight.get(mid)
        if flight is None or flight[1] is not consumer:
            raise DeliveryError(f"{mid.decode(errors='replace')} not found")
        return flight

    def fin(self, mid: bytes, consumer: Consumer) -> None:
        flight = self.in_flight.get(mid)  # as _take: this runs once per message
        if flight is None or flight[1] is not consumer:
            raise DeliveryError(f"{mid.decode(errors='replace')} not found")
        del self.in_flight[mid]
        consumer.in_flight -= 1
        origin = flight[0][7]
        if origin is not None:  # read from disk: its segment may go now
            origin.settle()
        if self._timeout_ids > 4 * len(self.in_flight) + STALE_DEADLINES:
            self._compact_timeouts()

    def fin_many(self, mids: list[bytes], consumer: Consumer) -> list[tuple[bytes, str]]:
        """``fin`` of each (a consumer's run of FINs); those that failed and why. Read
        from disk, settled per run of one origin (one segment), not per FIN."""
        done, failed, settles = fin_flights(self.in_flight, mids, consumer)
        for origin, run in settles:
            origin.settle(run)
        consumer.in_flight -= done
        if self._timeout_ids > 4 * len(self.in_flight) + STALE_DEADLINES:
            self._compact_timeouts()
        return [(mid, f"{mid.decode(errors='replace')} not found") for mid in failed]

    def _compact_timeouts(self) -> None:
        """Drop deadlines of settled messages (the heap would otherwise keep one id per
        message for a whole timeout: 600,000 at 10,000 msg/s and 60 s); at most every
        3 x in flight + ``STALE_DEADLINES`` FINs, so that it costs a FIN a third of a dict
        entry."""
        by_deadline: dict[int, list[bytes]] = {}
        for mid, f in self.in_flight.items():
            by_deadline.setdefault(f[2], []).append(mid)
        live = [(deadline, next(self._seq), mids) for deadline, mids in by_deadline.items()]
        heapq.heapify(live)
        self._timeouts = live
        self._timeout_ids = len(self.in_flight)

    def req(self, mid: bytes, consumer: Consumer, delay_ns: int, now: int) -> None:
        flight = self._take(mid, consumer)
        del self.in_flight[mid]
        consumer.in_flight -= 1
        self.requeue_count += 1
        msg = Message(*attempted(flight[0]))
        if delay_ns > 0:
            self.defer(msg, now + delay_ns)
        else:
            self.queue.append(msg)

    def touch(self, mid: bytes, consumer: Consumer, now: int) -> None:
        flight = self._take(mid, consumer)
        deadline = now + consumer.msg_timeout_ns
        self.in_flight[mid] = (flight[0], consumer, deadline)
        heapq.heappush(self._timeouts, (deadline, next(self._seq), [mid]))
        self._timeout_ids += 1

    # -- time ----------------------------------------------------------------------------
    def tick(self, now: int) -> bool:
        """Requeue timed-out messages and queue due deferred ones; True if any moved."""
        moved = False
        while self._deferred and self._deferred[0][0] <= now:
            self.queue.append(heapq.heappop(self._deferred)[2])
            moved = True
        while self._timeouts and self._timeouts[0][0] <= now:
            deadline, _, mids = heapq.heappop(self._timeouts)
            self._timeout_ids -= len(mids)
            for mid in mids:
                flight = self.in_flight.get(mid)
                if flight is None or flight[2] != deadline:
                    continue  # finished, requeued or touched since
                del self.in_flight[mid]
                flight[1].in_flight -= 1
                self.timeout_count += 1
                self.queue.append(Message(*attempted(flight[0])))
                moved = True
        return moved

    def next_due_ns(self) -> int | None:
        candidates = [h[0][0] for h in (self._deferred, self._timeouts) if h]
        return min(candidates) if candidates else None

    def head(self) -> list[tuple[Message, int | None]]:
        """What this channel owes in memory, in delivery order, with due times of
        deferred ones: in-flight first (they are the oldest), then the queue."""
        out: list[tuple[Message, int | None]] = [
            (Message(*attempted(f[0])), None) for f in self.in_flight.values()
        ]
        out += [(m, None) for m in self.queue.memory()]
        out += [(m, due) for due, _, m in sorted(self._deferred)]
        return out

    def empty(self) -> None:
        """nsqd's /channel/empty: queued and deferred go; in-flight stay with their clients."""
        self.queue.clear()
        for _, _, msg in self._deferred:
            settle(msg.origin)
        self._deferred.clear()

    def discard(self) -> None:
        """The channel is deleted: nothing it holds will be settled any other way."""
        for flight in self.in_flight.values():
            settle(flight[0][7])
        self.in_flight.clear()
        self.empty()


@dataclass(frozen=True, slots=True)
class Released:
    """A message leaving a topic's sub-bucket, and when it was due."""

    message: Message
    due_ns: int


#: ``release_ns`` of a shaped message not booked on the bucket yet (real ones are >= 0).
UNBOOKED = -1


@dataclass(eq=False)
class Topic:
    """A topic: an optional sub-bucket that shapes, then a copy to every channel.

    Three states: unmanaged (no bucket, not on hold: released at once, as nsqd does),
    shaped (``bucket``) and on hold (``on_hold``): the controller manages it but gave
    this broker no share, so what arrives is accepted and waits in ``shaping`` until a
    sub-bucket comes (released at its pace) or the topic is unmanaged (released at once).

    A shaped message is booked on the bucket when it reaches the head of the topic's
    queue, at its arrival time: the same GCRA schedule as booking on arrival (the queue
    is FIFO), but a retuned bucket paces what already waits, not only what comes next.
    A second bucket, the *meter*, books every arrival at once to measure the virtual
    backlog the TB Adaptor asks for.

    A deferred message (DPUB) waits in ``deferred`` until it is due, then joins the
    shaping queue like a message arriving then (``tick``): it is paced by the bucket,
    held while the topic is on hold or paused, and released at once when unmanaged.
    """

    name: str
    queues: QueueFactory
    channels: dict[str, Channel] = field(default_factory=dict)
    bucket: TokenBucket | None = None
    meter: TokenBucket | None = None
    #: Book no release as if it arrived before this (messages restored after a restart).
    book_not_before_ns: int = 0
    #: The head's booking, while it waits (it is the bucket's most recent one).
    _head_booking: Reservation | None = None
    paused: bool = False
    #: Managed with no share here: nothing is released (see the class's docstring).
    on_hold: bool = False
    message_count: int = 0
    message_bytes: int = 0
    #: Waiting for the sub-bucket to release them (FIFO).
    shaping: MessageQueue = field(init=False)
    #: Released before the topic had any channel: kept for the first one, never dropped.
    held: MessageQueue = field(init=False)
    #: Deferred copies kept for a replica's channels before the topic had any (the
    #: relay's fallback), with their due times: the first channel defers them.
    held_deferred: list[tuple[Message, int]] = field(default_factory=list)
    #: DPUB'd, waiting until due to join ``shaping`` (bounded in memory, then on disk).
    deferred: DeferredQueue = field(init=False)
    #: Which channels get messages here (None: all): a replicated topic's channel is
    #: served by one replica only (srtm.broker.routes.TopicRoute is one).
    homing: Homing | None = None
    #: The bound on what waits behind the sub-bucket, and what happens over it
    #: (``srtm.ratelimit.overflow``); it acts only while the topic is shaped. None: no
    #: bound (a bucket given without one; the controller always sends its topic's).
    bound: Bound | None = None
    #: Waiting messages dropped to make room (``drop-oldest``), and publishes refused
    #: (``refuse``, messages), over the bound.
    dropped_over_bound: int = 0
    refused_over_bound: int = 0

    def __post_init__(self) -> None:
        self.shaping = self.queues(f"{self.name}@shaping")
        self.held = self.queues(self.name)
        self.deferred = DeferredQueue(self.queues(f"{self.name}@deferred"))

    @property
    def ephemeral(self) -> bool:
        return is_ephemeral(self.name)

    @property
    def depth(self) -> int:
        return len(self.shaping) + len(self.held) + len(self.held_deferred)

    @property
    def backend_depth(self) -> int:
        return self.shaping.backend_depth + self.held.backend_depth

    @property
    def deferred_count(self) -> int:
        """DPUB'd messages not due yet (each goes to every channel once due)."""
        return len(self.deferred)

    def channel(self, name: str) -> Channel:
        """The channel ``name``, created on first use (receiving what the topic held)."""
        ch = self.channels.get(name)
        if ch is None:
            ch = self.channels[name] = Channel(self.name, name, self.queues(f"{self.name}:{name}"))
            if len(self.channels) == 1 if self.homing is None else self._first_kept(name):
                for msg in self.held.drain():
                    ch.put(msg)
                for msg, due in self.held_deferred:
                    ch.put_deferred(msg, due)
                self.held_deferred.clear()
        return ch

    def may_hold_before(self, ch: Channel, arrival_ns: int) -> bool:
        """Whether the topic or ``ch``, one of its channels, may still hold a message that
        arrived before ``arrival_ns`` (queues are FIFO, so their heads tell: one whose head
        is not in memory may, as may anything deferred or held for a first channel)."""
        if ch.deferred_count or self.held_deferred or len(self.held) or len(self.deferred):
            return True
        for q in (ch.queue, self.shaping):
            if len(q) and ((head := q.head_arrival_ns()) is None or head < arrival_ns):
                return True
        return False

    def oldest_arrival_ns(self) -> int | None:
        """The arrival of the oldest message waiting to be delivered here, of the queues'
        heads in memory (shaping, held for a first channel, each channel's queue, where a
        requeued message counts from its first arrival); None: none. Deferred messages
        (DPUB, delayed REQ) wait by request and are not counted."""
        heads = [self.shaping.head_arrival_ns(), self.held.head_arrival_ns()]
        heads += [ch.queue.head_arrival_ns() for ch in self.channels.values()]
        return min((h for h in heads if h is not None), default=None)

    def shape(self, rate: float, burst: float, clock: Callable[[], int]) -> TokenBucket:
        """Give the topic its sub-bucket, or retune it keeping its state (both checked
        before either changes, so a bad pair changes nothing); a hold ends."""
        if self.bucket is None or self.meter is None:
            TokenBucket(rate, burst)
            self.on_hold = False
            # What waited (held, paused) is booked from now: booked at its arrival, a
            # long wait's backlog would all be due at once.
            self.book_not_before_ns = max(self.book_not_before_ns, clock())
            self.bucket = TokenBucket(rate, burst, clock=clock)
            self.meter = TokenBucket(rate, burst, clock=clock)
        else:
            TokenBucket(rate, burst)
            # The waiting head was booked at the old rate: give its token back, book anew.
            if self._head_booking is not None and self.bucket.cancel(self._head_booking):
                self.shaping.set_head_release(UNBOOKED)
            self._head_booking = None
            for b in (self.bucket, self.meter):
                b.set_rate(rate)
                b.set_burst(burst)
        return self.bucket

    def unshape(self) -> None:
        """No more shaping, no hold (unmanaged): what waits is due at once."""
        self._drop_bucket()
        self.on_hold = False

    def hold(self) -> None:
        """Managed with no share here: keep what comes, release nothing (the sub-bucket
        it had, if any, goes; its head's booking is given back so that the next bucket
        books it afresh)."""
        self._drop_bucket()
        self.on_hold = True

    def _drop_bucket(self) -> None:
        if self._head_booking is not None:
            self.shaping.set_head_release(UNBOOKED)
        self.bucket = self.meter = self._head_booking = None

    def set_paused(self, paused: bool, now: int) -> None:
        """Pause or unpause at ``now``: nothing is released while paused, and what
        waited is booked from the unpause on (not at its arrival: no burst)."""
        self.paused = paused
        if not paused:
            self.book_not_before_ns = max(self.book_not_before_ns, now)
        elif self._head_booking is not None:
            # Booked before the pause: booked again after it (its token given back if
            # it can be, else spent twice: slower, never faster than the bucket).
            if self.bucket is not None:
                self.bucket.cancel(self._head_booking)
            if self.shaping.memory_depth:
                self.shaping.set_head_release(UNBOOKED)
            self._head_booking = None

    def put(self, msg: Message) -> float:
        """Accept a message at its arrival time.

        Returns the virtual backlog (tokens owed on the meter) right after it, 0 unshaped.
        """
        self.message_count += 1
        self.message_bytes += len(msg.body)
        return self._queue(msg)

    def put_many(
        self,
        ids: list[bytes],
        bodies: list[bytes],
        now: int,
        arrival: int,
        publisher: str | None,
        direct: bool = True,
    ) -> float:
        """Accept messages published together (``ids`` from the broker's ``MessageIds``)
        at ``arrival``; ``publisher`` None: the one each measurement header names.

        An unmanaged topic that is not paused and has nothing waiting hands them to its
        channels at once, or holds them for its first channel (``direct``: unless an
        emulated server must take them first), as records: no ``Message`` and no trip
        through ``shaping``; the caller has the channels dispatched. Otherwise each is
        queued as ``put`` queues it. Returns the largest virtual backlog right after one
        of them (0 unshaped).
        """
        self.message_count += len(bodies)
        self.message_bytes += sum(map(len, bodies))
        batch: list[Record] | Fresh
        if publisher is not None:
            batch = Fresh(ids, bodies, now, arrival, publisher)
        elif len(bodies) == 1:  # a PUB: a queue keeps it among singles (no record)
            batch = Fresh(ids, bodies, now, arrival, publisher_of(bodies[0]))
        else:
            batch = [
                (i, b, now, arrival, arrival, 0, publisher_of(b), None)
                for i, b in zip(ids, bodies, strict=True)
            ]
        if self.meter is None and not self.on_hold:
            # Unshaped: released on arrival (release_ns == arrival_ns, as ``put`` sets it),
            # to every channel, or held for the first one (as ``release`` would). A
            # replica keeps only its homed channels: ``release`` knows which.
            if not direct or self.paused or len(self.shaping) or self.homing is not None:
                self.shaping.extend(batch)
            elif self.channels:
                for ch in self.channels.values():
                    ch.put_many(batch)
            else:
                self.held.extend(batch)
            return 0.0
        backlog = 0.0
        for r in batch if isinstance(batch, list) else batch.records():
            backlog = max(backlog, self._queue(Message(*r)))
        return backlog

    def put_one(
        self, id_: bytes, body: bytes, now: int, arrival: int, publisher: str | None, direct: bool
    ) -> Kept:
        """``put_many`` of one message (a sensor's PUB) where it goes straight to its one
        queue, in fewer steps: to its one channel, or held for the first, in memory or
        written to disk at once (``MessageQueue.put_single``); or to each of several
        channels, each with room in memory. Unshaped; or shaped where nothing waits and
        its sub-bucket has a token at its arrival: released on arrival, as ``put_many``
        and ``release`` would release it, its token taken here (the caller dispatches
        it at once). ``Kept.NOT``, with nothing done, where it does not (``put_many``
        takes it)."""
        if self.on_hold or not direct or self.paused:
            return NOT_KEPT
        if len(self.shaping) or self.homing is not None:
            return NOT_KEPT
        bucket = self.bucket
        if bucket is not None and (
            arrival < self.book_not_before_ns or not bucket.may_release_by(arrival)
        ):
            return NOT_KEPT  # it waits for a token: the shaping queue and the release loop
        pub = publisher_of(body) if publisher is None else publisher
        channels = self.channels
        if not channels:
            kept = self.held.put_single(id_, body, now, arrival, pub)
            if kept is NOT_KEPT:
                return kept
        elif len(channels) == 1:
            for ch in channels.values():
                kept = ch.queue.put_single(id_, body, now, arrival, pub)
                if kept is NOT_KEPT:
                    return kept
                ch.message_count += 1
        else:  # room in every queue first: all of them take it, or none
            if any(not ch.queue.has_room() for ch in channels.values()):
                return NOT_KEPT
            for ch in channels.values():
                ch.queue.put_single(id_, body, now, arrival, pub)
                ch.message_count += 1
            kept = IN_MEMORY
        self.message_count += 1
        self.message_bytes += len(body)
        if bucket is not None:  # its token, as ``_queue`` and ``next_release_ns`` book it
            assert self.meter is not None
            self.meter.reserve(at=arrival)
            bucket.reserve(at=arrival)
        return kept

    def _queue(self, msg: Message, joined_ns: int | None = None) -> float:
        """Into the shaping queue; ``joined_ns``: when it joins, if later than its
        arrival (a deferred message, when due)."""
        backlog = 0.0
        if self.on_hold:
            msg.release_ns = UNBOOKED  # booked by the bucket that releases it
        elif self.meter is None:
            msg.release_ns = msg.arrival_ns
        else:
            msg.release_ns = UNBOOKED
            meter = self.meter
            at = msg.arrival_ns if joined_ns is None else joined_ns
            booked = meter.reserve(at=at)
            bound = self.bound
            if (
                bound is not None
                and booked.wait_ns > bound.max_wait_ns
                and bound.overflow is OverflowPolicy.DROP_OLDEST
                and self._drop_oldest()
            ):
                meter.cancel(booked)  # it takes the dropped one's place: no more waits
            backlog = booked.backlog_ns * meter.rate / 1e9
        self.shaping.append(msg)
        return backlog

    def _drop_oldest(self) -> bool:
        """``drop-oldest``: the oldest message waiting behind the sub-bucket goes (its
        booking, if it has one, given back); False if none waits."""
        if not self.shaping:
            return False
        if self._head_booking is not None and self.bucket is not None:
            self.bucket.cancel(self._head_booking)
        self._head_booking = None
        settle(self.shaping.popleft().origin)
        self.dropped_over_bound += 1
        return True

    def backlog_at(self, at: int) -> float:
        """The virtual backlog (tokens owed on the meter) at ``at``: right after a
        message booked at ``at``, what ``put_many`` returns for it; 0 unshaped."""
        meter = self.meter
        return 0.0 if meter is None else meter.backlog_ns(at) * meter.rate / 1e9

    def over_bound_ns(self, at: int) -> int:
        """How much longer than its bound a message arriving at ``at`` would wait behind
        the sub-bucket (<= 0: within it, or the topic is not shaped); also how long until
        it is back within it, if nothing more arrives."""
        meter, bound = self.meter, self.bound
        if meter is None or bound is None or self.on_hold:
            return 0
        return over_by_ns(meter, bound, at)

    def defer(self, msg: Message, due_ns: int) -> bool:
        """DPUB: keep ``msg`` until ``due_ns``, then it is shaped like a PUB (``tick``).
        False if it had to be dropped (ephemeral, beyond the memory bound)."""
        self.message_count += 1
        self.message_bytes += len(msg.body)
        return self.deferred.push(msg, due_ns)

    def next_deferred_ns(self) -> int | None:
        """When the soonest deferred message is due, or one on disk may be (None: none
        known now)."""
        return self.deferred.next_due_ns()

    def tick(self, now: int) -> bool:
        """Deferred messages due by ``now`` join the shaping queue, as if they arrived
        now: none is booked on the bucket before ``now`` (booked at their arrival, a
        backlog deferred together would be due at once, all of it). True if any joined."""
        due = self.deferred.pop_due(now)
        if not due:
            return False
        self.book_not_before_ns = max(self.book_not_before_ns, now)
        for msg in due:
            self._queue(msg, now)
        return True

    def next_release_ns(self) -> int | None:
        """When the head of the queue is due (booking it on the bucket if need be); None
        while paused or on hold."""
        if self.paused or self.on_hold:
            return None
        due = self.shaping.peek_release_ns()
        if due == UNBOOKED and self.bucket is not None:
            arrival = self.shaping.peek_arrival_ns()
            assert arrival is not None
            self._head_booking = self.bucket.reserve(at=max(arrival, self.book_not_before_ns))
            due = self._head_booking.release_ns
            self.shaping.set_head_release(due)
        return due

    def release(self, now: int, deliver: bool = True) -> list[Released]:
        """Take every message due by ``now`` off the bucket and, with ``deliver``, hand
        it to the channels (else the caller delivers it later, e.g. after processing)."""
        out: list[Released] = []
        targets = self._targets()
        bucket = self.bucket
        while (due := self.next_release_ns()) is not None and due <= now:
            msg = self.shaping.popleft()
            self._head_booking = None
            out.append(Released(msg, msg.release_ns))
            if deliver:
                self._deliver(msg, targets)
            # No token for another by ``now``: the next head is booked later (the caller
            # asks ``next_release_ns``), after what was released here is sent.
            if bucket is not None and not bucket.may_release_by(now):
                break
        return out

    def deliver(self, msg: Message) -> None:
        """A copy to every channel, or hold it for the first one."""
        self._deliver(msg, self._targets())

    def _targets(self) -> list[Channel]:
        homing = self.homing
        if homing is None:
            return list(self.channels.values())
        return [ch for name, ch in self.channels.items() if homing.keeps(name)]

    def _first_kept(self, name: str) -> bool:
        """Is ``name`` the only channel here that this replica serves (it takes what
        the topic held, as the first channel does)?"""
        assert self.homing is not None
        keeps = self.homing.keeps
        return keeps(name) and sum(1 for n in self.channels if keeps(n)) == 1

    def _deliver(self, msg: Message, targets: list[Channel]) -> None:
        if not targets and self.homing is not None and not self.homing.serves_unlisted:
            settle(msg.origin)  # every channel of it is served by another replica
            return
        if msg.origin is not None and len(targets) > 1:
            msg.origin.share(len(targets) - 1)  # each channel's copy is settled on its own
        if not targets:
            self.held.append(msg)
        for ch in targets:
            ch.put(msg)  # queued as an immutable record: one per channel for free

    def head(self) -> Iterator[tuple[str, list[tuple[Message, int | None]]]]:
        """What the topic itself holds in memory, per queue key (for shutdown)."""
        yield f"{self.name}@shaping", [(m, None) for m in self.shaping.memory()]
        held: list[tuple[Message, int | None]] = [(m, None) for m in self.held.memory()]
        held += [(m, due) for m, due in self.held_deferred]
        yield self.name, held
        yield f"{self.name}@deferred", self.deferred.memory()

    def empty(self) -> None:
        self.shaping.clear()
        self.held.clear()
        self.deferred.clear()
        for msg, _ in self.held_deferred:
            settle(msg.origin)
        self.held_deferred.clear()
