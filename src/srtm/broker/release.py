"""The release loop of shaped topics, and the emulated processing server.

A shaped topic's messages wait for their sub-bucket's tokens; the loop releases each
when it is due, on a precise timer, to the topic's channels, or first to the emulated
server (``--capacity``) that delivers it once processed. Unshaped topics release at
once, when published to.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable

from srtm.broker.busypoll import usable_cpus
from srtm.broker.message import Message
from srtm.broker.options import BrokerOptions
from srtm.broker.state import Channel, Topic
from srtm.broker.stats import BrokerStats
from srtm.broker.timer import TimerFd, WakeMargin
from srtm.ratelimit import TokenBucket

log = logging.getLogger("srtm.broker")
_FOREVER = 2**63 - 1
#: Stale bookings the heap may hold beyond twice the live ones before it is rebuilt.
_STALE_SLACK = 64
#: How late an asyncio timeout can end (epoll waits in whole milliseconds), with margin.
_ASYNCIO_TIMER_SLACK_NS = 1_500_000
#: How long before a shaped release a connection's read waits for it (at most the spin:
#: no wait where the loop does not spin). A read after the loop slept runs cold, 50 µs
#: of CPU at the median and 180 µs at p99 on the development VM, and a release due while
#: it runs waits for it: most of the releases over 100 µs late there.
READ_GUARD_NS = 200_000


class Releaser:
    """Releases what topics' buckets let through, and emulates the processing server.

    ``mark_ready`` has a channel dispatched at the end of the loop turn, ``dispatch``
    dispatches it now: an on-time shaped release goes out at once. ``cpus``: the CPUs
    the process may use (None: ``usable_cpus()``).
    """

    def __init__(
        self,
        options: BrokerOptions,
        topics: dict[str, Topic],
        stats: BrokerStats,
        mark_ready: Callable[[Channel], None],
        dispatch: Callable[[Channel], None],
        lease_ok: Callable[[], bool] = lambda: True,
        cpus: float | None = None,
    ) -> None:
        self._topics, self._stats = topics, stats
        self._mark_ready, self._dispatch = mark_ready, dispatch
        #: Checked before every release of shaped topics: past the lease it holds them.
        self._lease_ok = lease_ok
        self._timer_kind = options.release_timer
        spin = options.release_spin_ns
        if options.nice < 0 and (usable_cpus() if cpus is None else cpus) < 2:
            spin = 0  # raised above the programs on its only CPU, a spin would starve them
        self.margin = WakeMargin(spin, options.release_spin_max_ns)
        #: The topics with a sub-bucket: the only ones the release loop looks at.
        self.shaped: dict[str, Topic] = {}
        #: Each shaped topic's next release, earliest first (due, tie-break, name), and
        #: which entry is each topic's current one: the others are stale, skipped when
        #: they come up. A release looks at the topics due, not at every shaped topic.
        #: Entries name their topic, so a stale one keeps no topic (nor its messages).
        self._heap: list[tuple[int, int, str]] = []
        self._booked: dict[str, tuple[int, Topic]] = {}
        self._ticket = itertools.count()
        #: Earliest release time among shaped topics (None: nothing waits for tokens).
        self.next_release_ns: int | None = None
        self._wakeup: asyncio.Event | None = None
        self._timer: TimerFd | None = None
        #: The emulated processing server (``options.capacity``; None: none): a GCRA with
        #: one token is a D/1 queue whose release times are when each service starts.
        cap = options.capacity
        self.server = TokenBucket(cap, 1.0) if cap > 0 else None
        #: Whether an unshaped topic may hand what is published straight to its channels
        #: (``Topic.put_many``): not when the emulated server takes every message first.
        #: (An attribute, not a property: every PUB reads it.)
        self.direct = self.server is None
        self._service_ns = round(1e9 / cap) if cap > 0 else 0
        #: Released by their buckets, waiting for the server: (done at, topic, message).
        self._processing: collections.deque[tuple[int, Topic, Message]] = collections.deque()

    # -- lifecycle (on the running loop) -------------------------------------------------
    def start(self) -> None:
        """Ready the wake-up and the precise timer; ``run`` is the loop's task."""
        self._wakeup = asyncio.Event()
        self._timer = self._precise_timer()

    def _precise_timer(self) -> TimerFd | None:
        if self._timer_kind != "timerfd":
            return None
        try:
            timer = TimerFd()
        except OSError as exc:
            log.warning("no timerfd (%s): shaped releases fall back to spinning", exc)
            return None
        asyncio.get_running_loop().add_reader(timer.fd, self._on_timer)
        return timer

    def _on_timer(self) -> None:
        assert self._timer is not None and self._wakeup is not None
        if (armed := self._timer.armed_ns) is not None:
            self.margin.woke(time.time_ns() - armed)
        self._timer.consume()
        self._wakeup.set()

    def stop(self) -> None:
        """Close the timer (the loop's task is cancelled by its owner)."""
        if self._timer is not None:
            asyncio.get_running_loop().remove_reader(self._timer.fd)
            self._timer.close()
            self._timer = None

    # -- releasing -----------------------------------------------------------------------
    def kick(self, topic: Topic) -> None:
        """``topic`` got messages or changed: release what is due now (unshaped), or have
        the loop wake up by its next release (shaped)."""
        if topic.bucket is None:
            if topic.shaping:
                self.release(topic, time.time_ns())
            # What ``Topic.put_many`` handed straight to the channels is dispatched too.
            self.ready(topic, at_once=False)
            return
        due = topic.next_release_ns()
        if due is not None:
            self._book(topic, due)
        self._wake(due)

    def _book(self, topic: Topic, due: int) -> None:
        """Have the release loop look at ``topic`` by ``due`` (an earlier booking stands:
        it finds the topic not due yet and books it again). Whatever makes a shaped
        topic due sooner kicks it (a publish, a new or retuned bucket, a resume, the
        start), as it always had to for the loop to wake up."""
        booked = self._booked.get(topic.name)
        if booked is None or booked[1] is not topic or due < booked[0]:
            self._booked[topic.name] = (due, topic)
            heapq.heappush(self._heap, (due, next(self._ticket), topic.name))
            if len(self._heap) > 2 * len(self._booked) + _STALE_SLACK:
                self._rebuild()

    def _rebuild(self) -> None:
        """The heap of the live bookings only (stale ones dropped)."""
        self._heap = [(d, next(self._ticket), name) for name, (d, _) in self._booked.items()]
        heapq.heapify(self._heap)

    def unshape(self, name: str) -> None:
        """The topic is no longer shaped here (deleted, held, unmanaged): nothing of the
        loop's keeps it, nor what still waits in it (its heap entry, stale now, names it).
        O(1): a lapsed lease unshapes every shaped topic in one go."""
        self.shaped.pop(name, None)
        self._booked.pop(name, None)

    @property
    def read_guard_ns(self) -> int:
        """How long before the next release a read waits for it (``READ_GUARD_NS``, at
        most the spin; 0 where the loop does not spin, ``--release-spin-us 0``)."""
        spin = self.margin.spin_ns if self._timer is not None else _ASYNCIO_TIMER_SLACK_NS
        return min(READ_GUARD_NS, spin) if self.margin.floor_ns else 0

    async def clear(self) -> None:
        """Release what is due now, then return once no shaped release is due within the
        read guard, else once that release has gone, or the guard has passed since it was
        due (one release at most): work that can wait a little (the scan, flushing
        histograms) does not make a release late, as a read does not (``Intake``). Where
        the loop does not spin, at once."""
        self.release_due()
        due, guard = self.next_release_ns, self.read_guard_ns
        if due is None or due - time.time_ns() > guard:
            return
        while self.next_release_ns == due and time.time_ns() < due + guard:
            await asyncio.sleep(0)

    def _wake(self, due: int | None) -> None:
        """Make the release loop wake up by ``due``."""
        if due is not None and (self.next_release_ns is None or due < self.next_release_ns):
            self.next_release_ns = due
            if self._wakeup is not None:
                self._wakeup.set()

    def release(self, topic: Topic, upto: int, at_once: bool = False) -> None:
        """Release what is due by ``upto`` to the channels (or to the emulated server);
        ``at_once`` dispatches and sends now instead of at the end of the loop turn (for
        on-time shaped releases)."""
        server = self.server
        released = topic.release(upto, deliver=server is None)
        if not released:
            return
        if server is None:
            self.ready(topic, at_once)  # sent first: the accounting can wait, they cannot
        else:
            for r in released:
                done = server.reserve(at=r.due_ns).release_ns + self._service_ns
                self._processing.append((done, topic, r.message))
            self._wake(self._processing[0][0])
        if topic.bucket is not None:
            wait = self._stats.topic(topic.name).token_wait
            for r in released:
                wait.add(r.due_ns - r.message.arrival_ns)

    def released_on_arrival(self, topic: Topic) -> None:
        """A shaped topic's message its token let through on arrival, already in its
        channels (``Topic.put_one``): dispatched now, as ``release`` sends one, then its
        token wait (none) recorded."""
        self.ready(topic, at_once=True)
        self._stats.topic(topic.name).token_wait.add(0)

    def release_all(self, topic: Topic) -> None:
        """Everything that waits, now (the topic is no longer shaped)."""
        self.release(topic, _FOREVER)

    def ready(self, topic: Topic, at_once: bool = False) -> None:
        """Have ``topic``'s channels dispatched: now (``at_once``), else at the end of the
        loop turn (what was handed straight to them, or released)."""
        for ch in topic.channels.values():
            if at_once:
                self._dispatch(ch)
            else:
                self._mark_ready(ch)

    def processed(self, now: int | None) -> int | None:
        """Deliver what the emulated server has finished by ``now`` (None: everything);
        returns when the next one finishes."""
        queue = self._processing
        done: dict[str, Topic] = {}
        while queue and (now is None or queue[0][0] <= now):
            due, topic, msg = queue.popleft()
            if self._topics.get(topic.name) is not topic:
                continue  # deleted meanwhile
            topic.deliver(msg)
            done[topic.name] = topic
            if now is not None:
                self._stats.topic(topic.name).lateness.add(now - due)
        for topic in done.values():
            self.ready(topic, at_once=now is not None)
        return queue[0][0] if queue else None

    def release_due(self) -> bool:
        """Release shaped messages that are due; called before each command of a read
        and at its end (before its answers are sent), so that a busy connection cannot
        hold releases back for a whole loop turn, and what a read made due goes from it.
        Whether any still wait (False: the read need not look again)."""
        due = self.next_release_ns
        if due is None:
            return False
        if (now := time.time_ns()) >= due:
            self.release_shaped(now)
        return self.next_release_ns is not None

    def release_shaped(self, now: int) -> int | None:
        """Release every shaped message due by ``now``, and what the emulated server has
        processed; returns the next time something is due."""
        self._lease_ok()  # a lapsed lease holds the shaped topics (they leave ``shaped``)
        booked, shaped = self._booked, self.shaped
        while self._heap and self._heap[0][0] <= now:
            when, _, name = heapq.heappop(self._heap)
            mine = booked.get(name)
            if mine is None or mine[0] != when:
                continue  # stale: the topic was booked again since, or unshaped
            topic = mine[1]
            del booked[name]
            if shaped.get(topic.name) is not topic:
                continue  # no longer shaped: a kick books it if it is again
            nxt = topic.next_release_ns()
            if nxt is not None and nxt <= now:
                self.release(topic, now, at_once=True)
                nxt = topic.next_release_ns()
            if nxt is not None:
                self._book(topic, nxt)
        # The earliest booking (if stale, the loop finds nothing due then and goes on).
        due = self._heap[0][0] if self._heap else None
        if self._processing:
            nxt = self.processed(now)
            if nxt is not None and (due is None or nxt < due):
                due = nxt
        self.next_release_ns = due
        return due

    async def run(self) -> None:
        """Release shaped messages on time: sleep while the next release is far, then
        yield to the loop for the last stretch (``margin``).

        The sleep ends on a timerfd armed that long before the release (ns precise, the
        stretch as long as its wake-ups have been late: ``WakeMargin``); without one, on
        an asyncio timeout (about 1 ms coarse), so the spin must then be longer.
        """
        assert self._wakeup is not None
        wakeup = self._wakeup
        margin = self.margin
        while True:
            due = self.release_shaped(time.time_ns())
            if due is None:
                wakeup.clear()
                await wakeup.wait()
                continue
            spin = margin.spin_ns if self._timer is not None else _ASYNCIO_TIMER_SLACK_NS
            spin = max(spin, margin.floor_ns)
            wait = due - time.time_ns()
            if wait <= spin:
                await self._spin(spin)
                continue
            wakeup.clear()
            if self._timer is not None:
                self._timer.arm(due - spin)
                await wakeup.wait()
                self._timer.disarm()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout((wait - spin) / 1e9):  # keeps a cancel
                        await wakeup.wait()

    async def _spin(self, spin: int) -> None:
        """Yield to the loop until the earliest release is due, or is more than ``spin``
        away (a read released it first: the next one may be far). Each turn reads only
        ``next_release_ns``, which reads and kicks keep current."""
        while (due := self.next_release_ns) is not None and 0 < due - time.time_ns() <= spin:
            await asyncio.sleep(0)
