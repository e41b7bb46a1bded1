"""The shares the controller gives this broker: sub-buckets, holds, and the lease they
come with (docs/broker.md, "No holes in (r, b)").

A topic with a sub-bucket is shaped by it; a held one is managed but has no share here
(what comes is kept until a sub-bucket comes); any other is unmanaged. With a controller,
shares are used only while the lease runs: the controller's (renewed by its answers), or
with ``--etcd-endpoints`` the broker's own liveness lease in etcd (``srtm.broker.liveness``).
Past it, every shaped topic is held until the broker registers again.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from srtm.broker.liveness import liveness_settings
from srtm.broker.state import LeaseExpired
from srtm.protocol import ProtocolError, is_valid_name
from srtm.ratelimit import TokenBucket, check_bucket

if TYPE_CHECKING:
    from srtm.broker.handoff import Handoffs
    from srtm.broker.options import BrokerOptions
    from srtm.broker.persistence import Persistence
    from srtm.broker.policing import Policing
    from srtm.broker.relay import Relay
    from srtm.broker.release import Releaser
    from srtm.broker.state import Topic
    from srtm.ratelimit.overflow import Bound

log = logging.getLogger("srtm.broker")


class SharesHost(Protocol):
    """What the shares need of the broker (srtm.broker.broker.Broker is one)."""

    @property
    def options(self) -> BrokerOptions: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    @property
    def persistence(self) -> Persistence: ...

    @property
    def releaser(self) -> Releaser: ...

    @property
    def relay(self) -> Relay: ...

    @property
    def handoffs(self) -> Handoffs: ...

    @property
    def policing(self) -> Policing: ...

    def topic(self, name: str) -> Topic: ...


class Shares:
    """Sub-buckets, holds and the lease, as the controller orders them."""

    def __init__(self, host: SharesHost) -> None:
        self.host = host
        #: With a controller: the monotonic time (s) until which its last word lets this
        #: broker shape by the sub-buckets it was given (``lease_ok``); None: no lease
        #: yet, or it lapsed and the broker has not registered again.
        self.lease_until: float | None = None
        #: With ``--etcd-endpoints``: the liveness lease's settings; ``lease_until`` then
        #: follows that lease (``renew_liveness``), not the controller's answers.
        self.liveness = liveness_settings(host.options)
        #: Lapses so far (and new liveness leases): the reporter registers again after each.
        self.lapses = 0
        #: With etcd: whether the controller that registered this broker since its last
        #: lapse watches its key (``watched_by``); no share is used, and no push taken,
        #: until one does.
        self.watched = False
        #: When the controller last pushed each topic's share (monotonic s): a
        #: registration answer sent before that is older news for the topic.
        self._pushed_at: dict[str, float] = {}
        #: Per topic: the newest order (``srtm.httpkit.push_order``) of the controller's
        #: pushes this broker took; and the order of its last registration answer. A
        #: push older than either is stale (``admit``).
        self._heard: dict[str, tuple[int, int]] = {}
        self._floor: tuple[int, int] = (0, 0)
        #: Set by ``stop``: no share is taken again in this run.
        self.stopped = False

    def set_bucket(
        self, topic_name: str, rate: float, burst: float, leased: bool = False
    ) -> TokenBucket:
        """Give a topic its sub-bucket, or retune it keeping its state; what already waits
        is paced by the new parameters from now on. Refused (LeaseExpired) while this
        broker's lease has lapsed, unless ``leased`` (it comes with a new lease)."""
        check_bucket(rate, burst)  # a bad pair creates no topic
        if self.stopped:
            raise LeaseExpired("this broker is stopping: it takes no share")
        if not leased and not self.lease_ok():
            raise LeaseExpired("this broker's lease lapsed: it takes shares again once registered")
        if not leased:
            self._pushed_at[topic_name] = time.monotonic()
        host = self.host
        host.handoffs.clear(topic_name)  # the controller's word replaces an armed share
        topic = host.topic(topic_name)
        bucket = topic.shape(rate, burst, time.time_ns)
        host.releaser.shaped[topic_name] = topic
        host.persistence.save_meta()
        host.releaser.kick(topic)
        return bucket

    def admit(self, topic_name: str, order: tuple[int, int] | None) -> bool:
        """May a push of the topic's share with this order be applied? Not if the
        controller sent it before its last registration answer or before a push of the
        topic already taken: a request held up on a cut link and delivered after the
        heal (the controller timed it out and moved on) would otherwise bring back a
        share the controller has since given to another broker. Taken pushes are
        noted; one without an order (a tool's) is always admitted."""
        if order is None:
            return True
        if order < self._floor or order <= self._heard.get(topic_name, (0, 0)):
            return False
        self._heard[topic_name] = order
        return True

    def apply(
        self,
        buckets: dict[str, tuple[float, float]],
        held: list[str],
        bounds: dict[str, Bound] | None = None,
        sent: float = float("inf"),
        order: tuple[int, int] | None = None,
    ) -> None:
        """What a registration answer says this broker carries: these sub-buckets (with
        their topics' bounds), and a hold on these other managed topics. Any other topic
        keeps its state, and so does one whose share the controller pushed after the
        registration was ``sent`` (monotonic s): the push is the newer word, and the
        answer's share may be one the push's change already took back (with etcd, a
        broker takes pushes before its answer comes). By default no push is newer.
        ``order``: the answer's place in the controller's order; a push older than it
        is refused from now on (``admit``)."""
        if self.stopped:
            return
        if order is not None:
            self._floor = max(self._floor, order)
        pushed = self._pushed_at
        for name in held:
            if is_valid_name(name) and pushed.get(name, float("-inf")) < sent:
                self.hold(name, pushed=False)
        for name, (rate, burst) in buckets.items():
            if pushed.get(name, float("-inf")) >= sent:
                continue
            try:
                self.set_bucket(name, rate, burst, leased=True)
            except (ValueError, OverflowError, ProtocolError) as exc:
                log.error("topic %s: bucket %r from the controller refused: %s",
                          name, (rate, burst), exc)  # fmt: skip
                continue
            if bounds is not None and name in bounds:
                self.host.policing.set_bound(name, bounds[name])

    def forget(self, topic_name: str) -> None:
        """The topic is deleted here: nothing kept of it (what a broker holds per topic
        stays bounded by the topics it has)."""
        self._pushed_at.pop(topic_name, None)
        self._heard.pop(topic_name, None)

    def hold(self, topic_name: str, pushed: bool = True) -> None:
        """The topic is managed but this broker has no share of it: what comes is kept
        (acknowledged, queued, spilled to disk like any message) and released by the
        sub-bucket that comes next, or at once if the topic is unmanaged. Creates it.
        ``pushed``: the controller's push (not a registration answer, nor a lapse)."""
        if pushed:
            self._pushed_at[topic_name] = time.monotonic()
        host = self.host
        topic = host.topic(topic_name)
        topic.hold()
        host.handoffs.clear(topic_name)
        host.releaser.unshape(topic_name)
        host.persistence.save_meta()

    def clear(self, topic_name: str) -> None:
        """Unmanage the topic (no share, no hold): what waits is released at once."""
        self._pushed_at[topic_name] = time.monotonic()
        host = self.host
        topic = host.topics[topic_name]
        topic.unshape()
        host.handoffs.clear(topic_name)
        host.releaser.unshape(topic_name)
        host.persistence.save_meta()
        host.releaser.release_all(topic)

    def managed(self, topic_name: str) -> bool:
        """Whether the controller manages the topic here: it has a sub-bucket, a hold or
        a relay route (a topic it does not have is not)."""
        topic = self.host.topics.get(topic_name)
        if topic is None:
            return False
        return topic.bucket is not None or topic.on_hold or topic_name in self.host.relay.routes

    # -- the controller's lease --------------------------------------------------------------
    @property
    def leased(self) -> bool:
        """Whether this broker's shares come with a lease (it runs with a controller)."""
        return bool(self.host.options.controller)

    def lease_ok(self) -> bool:
        """May this broker shape by its sub-buckets now? Always without a controller.
        With one, only while its lease runs (the controller's, or with etcd the liveness
        lease): past it, the controller may have marked this broker down and given its
        shares to others, so every shaped topic is held until the broker registers again
        (checked where it matters, before releasing and answering /stats, so a broker
        resumed after SIGSTOP never uses or shows a stale bucket)."""
        if not self.leased:
            return True
        if self.stopped:
            return False
        until = self.lease_until
        if until is not None and time.monotonic() < until:
            return self.watched or self.liveness is None
        if until is not None:
            self.lapse(
                "no etcd keepalive succeeded for 0.6 of the liveness lease"
                if self.liveness is not None
                else "no word from the controller for the lease"
            )
        return False

    def stop(self) -> None:
        """The broker is stopping: hold every shaped topic, and take no share from now on
        (a push, a handoff, a registration answer). Called before it deregisters: the
        controller gives this broker's shares to others as soon as it hears, and a share
        still used while the stop closes connections and writes to disk would add to
        theirs (tests/test_no_holes.py saw that sum). What waits for tokens is kept and
        restored held. Nothing changes without a controller: no one takes its shares."""
        if not self.leased:
            return
        self.stopped = True
        self.lease_until = None
        self._hold_shaped()

    def lapse(self, why: str) -> None:
        """The lease is lost: hold every shaped topic until the broker registers again.
        With etcd, a new lease comes before that registration's answer: meanwhile a push
        the controller sent before the lapse, held up on a cut link, may arrive, newer than
        any this broker took; taken, it would bring back a share the controller gave to
        another broker (tests/test_partitions.py saw that sum over r). So none is taken
        until the answer (``watched_by``), which also sets the floor of the orders."""
        self.lease_until = None
        self.watched = False
        self.lapses += 1
        if n := self._hold_shaped():
            log.warning("%s: %d shaped topics held until this broker registers again", why, n)

    def _hold_shaped(self) -> int:
        shaped = [t for t in self.host.topics.values() if t.bucket is not None]
        for topic in shaped:
            self.hold(topic.name, pushed=False)
        return len(shaped)

    def renew_lease(self, since: float, lease_s: float) -> None:
        """The controller answered a request sent at ``since`` (monotonic s): shares may
        be used until ``since + lease_s``. Not with etcd: the liveness lease decides."""
        if self.liveness is None:
            self.lease_until = since + lease_s

    def renew_liveness(self, until: float, fresh: bool) -> None:
        """With etcd: the liveness lease holds until ``until`` (monotonic s). ``fresh``: a
        new lease (at start, or after one was lost): what is shaped now is held, as at a
        lapse, and the shares come again with the registration that follows."""
        if fresh:
            self.lapse("a new liveness lease")
        self.lease_until = until

    def may_register(self) -> bool:
        """Whether the reporter may register now: always without etcd; with it, only
        while the liveness lease holds, so that no share is taken without the key the
        controller watches."""
        until = self.lease_until
        return self.liveness is None or (until is not None and time.monotonic() < until)

    def watched_by(self, live_prefix: object) -> bool:
        """With etcd: whether the controller whose registration answer names
        ``live_prefix`` watches this broker's key. One that does not (no etcd, another
        prefix) would give the shares away on report silence while this broker, on its
        own lease, still shaped: its shares are not taken (every managed topic stays
        held, pushes are refused) and the error is logged."""
        if self.liveness is None:
            return True
        self.watched = live_prefix == self.liveness.live_prefix
        if not self.watched:
            self._hold_shaped()
            log.error(
                "the controller does not watch %s (it answered %r): start it with "
                "--etcd-endpoints and the same --etcd-prefix; managed topics stay held",
                self.liveness.live_prefix,
                live_prefix,
            )
        return self.watched
