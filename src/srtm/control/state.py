"""The controller's state and decisions, with no I/O: brokers, topics, plans.

Every method takes the controller's clock (``now``, seconds) and returns the actions for
the service to carry out (set a broker's sub-bucket; a plan changed). The service
persists what a change touched (``topic_json`` of its topics, ``brokers_json``) and
rebuilds with ``restore`` on restart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from srtm.control.actions import (
    HELD,
    Action,
    DropRoute,
    Hold,
    Migrate,
    PlanChanged,
    SetBucket,
    Share,
    Unmanage,
    same_bucket,
)
from srtm.control.registry import LookupRegistry
from srtm.control.routes import FORWARD_GRACE_S, Routing, changes, home_channels, routes
from srtm.control.validate import ControlError, parse_address, publisher_id, topic_name
from srtm.placement import (
    RATE_MARGIN,
    AdaptorSettings,
    BrokerCapacity,
    Joined,
    LedgerEntry,
    Placement,
    Policy,
    PublisherLoad,
    RateSum,
    Sums,
    TopicSpec,
    WindowReport,
    adapt,
    for_topic,
    join,
    ledger,
    place,
    topic_bucket,
)
from srtm.ratelimit import MAX_RATE, BucketParams, check_bucket, merge, split_floored
from srtm.ratelimit.overflow import DEFAULT_BOUND, Bound, check_bound

__all__ = ["BrokerInfo", "ControlError", "Controller", "TopicState"]


@dataclass
class BrokerInfo:
    id: str
    tcp_address: str
    http_address: str
    mcap: float
    #: Last reported message rate over all its topics (msg/s).
    load: float = 0.0
    #: On the controller's *awake* clock (``Controller.awake``), not wall time: a stall
    #: of the controller itself never counts as the broker's silence.
    last_seen_s: float = -math.inf
    down: bool = False
    #: Per topic: the TB Adaptor's inputs from its last report.
    reports: dict[str, WindowReport] = field(default_factory=dict)
    #: Per topic: messages it still holds (queued, deferred, in flight), last reported.
    depths: dict[str, int] = field(default_factory=dict)
    #: Reports received (counted by the controller, never reset): a topic's draining
    #: member leaves by a report numbered at least 2 after its drop (``TopicState``).
    reports_seen: int = 0
    #: Per topic: messages waiting for tokens (its shaping queue), last reported.
    waiting: dict[str, int] = field(default_factory=dict)
    #: Per topic: messages accepted since the broker started, in its last report and in
    #: the one before (unchanged: none arrived in between).
    arrived: dict[str, int] = field(default_factory=dict)
    arrived_before: dict[str, int] = field(default_factory=dict)
    #: Its resources over its last report interval (``documents.BrokerResources``:
    #: cpu, egress_bps, congested), None until a broker that tells them reports.
    resources: dict[str, Any] | None = None
    #: Per topic: consumers per class that asked for it (connected or waiting).
    demand: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per topic: bytes of the messages ``arrived`` counts.
    arrived_bytes: dict[str, int] = field(default_factory=dict)

    def settled(self, topic: str) -> bool:
        """By its last report: nothing of ``topic`` waits for tokens and nothing arrived
        since the report before (a topic it does not report has neither)."""
        return self.waiting.get(topic, 0) == 0 and self.arrived.get(
            topic
        ) == self.arrived_before.get(topic)

    def usage(self) -> tuple[float, float]:
        """Its CPU (fraction of one core) and egress (bytes/s) by its last report's
        ``resources`` (0 for what it does not tell): the rebalancer's loads and where a
        replicated topic's channels are homed read them here, and only here."""
        r = self.resources or {}
        return float(r.get("cpu", 0.0)), float(r.get("egress_bps", 0.0))

    def http_endpoint(self) -> tuple[str, int]:
        """Host and port of its HTTP API, parsed (URLs are built from these parts)."""
        return parse_address(self.http_address, "http_address")


#: Events a topic keeps (the latest): a flood of joins or plan changes must not grow the
#: state, its saved row or the console's answer without bound.
MAX_EVENTS = 200


class Events(list[str]):
    """A topic's events, the latest ``MAX_EVENTS`` of them."""

    def append(self, event: str) -> None:
        super().append(event)
        if len(self) > MAX_EVENTS:
            del self[: len(self) - MAX_EVENTS]

    def __iadd__(self, events: Any) -> Events:  # type: ignore[override,misc]
        super().__iadd__(events)
        if len(self) > MAX_EVENTS:
            del self[: len(self) - MAX_EVENTS]
        return self


@dataclass(frozen=True, eq=False)
class Shape:
    """``TopicState.shape``: compared by identity, never by content (O(brokers))."""

    publishers: tuple[PublisherLoad, ...]
    lists: tuple[tuple[str, list[str], int], ...]

    def same(self, other: Shape | None) -> bool:
        return (
            other is not None
            and self.publishers is other.publishers
            and len(self.lists) == len(other.lists)
            and all(
                b == b2 and ps is ps2 and n == n2
                for (b, ps, n), (b2, ps2, n2) in zip(self.lists, other.lists, strict=True)
            )
        )


@dataclass
class TopicState:
    spec: TopicSpec
    policy: Policy
    version: int = 0
    #: broker id -> publisher ids
    assignment: dict[str, list[str]] = field(default_factory=dict)
    buckets: dict[str, BucketParams] = field(default_factory=dict)
    unassigned: list[str] = field(default_factory=list)
    events: Events = field(default_factory=Events)
    #: Online fitting's progress (None: not asked for).
    fitting: dict[str, Any] | None = None
    #: The plan version the TB Adaptor last saw, and until when it leaves it alone.
    adapted_version: int = 0
    adapt_after_s: float = 0.0
    #: Unknown publishers may join by ``/assign`` (self-registration).
    open: bool = False
    #: The most msg/s a joining publisher may declare (None: ``join_rate_limit``'s default).
    max_publisher_rate: float | None = None
    #: What a joining publisher must show (or the cluster token); never answered by a GET.
    join_secret: str | None = None
    #: The rate was not given: it follows the publishers (RATE_MARGIN × their total).
    rate_auto: bool = False
    #: Draining members: brokers out of the plan that may still hold messages waiting
    #: for tokens. They keep a share of the split (weight, in msg/s like the assigned
    #: rates) and are never a publish target, until a report sent after the drop shows
    #: the topic settled there (``BrokerInfo.settled``); then they hold it.
    draining: dict[str, float] = field(default_factory=dict)
    #: Per draining member: its ``reports_seen`` when it started draining (not saved: a
    #: restarted controller counts from 0, every report it gets is after the drop).
    drain_since: dict[str, int] = field(default_factory=dict)
    #: Forwarding and replication (``srtm.control.routes``).
    routing: Routing = field(default_factory=Routing)
    #: Its utility spec (``srtm.utility.cluster``: one flow of ``srtm utility optimize``'s
    #: document without name and brokers), as given; None: the optimizer leaves it alone.
    utility: dict[str, Any] | None = None
    #: Its part of the optimizer's last run (``srtm.utility.cluster.flow_doc`` and
    #: ``t_s``), and the rate rate control gave it since (not saved).
    allocation: dict[str, Any] | None = None
    #: The bound on what waits behind its sub-buckets and its overflow policy (every
    #: broker shaping it polices by it: ``srtm.ratelimit.overflow``).
    bound: Bound = DEFAULT_BOUND
    #: Its running sums (``Controller.sums``) and the shape of the publishers and
    #: assignment they were taken over; the shape at the last ``Routing.note_plan``.
    sums: Sums | None = field(default=None, repr=False, compare=False)
    sums_shape: Shape | None = field(default=None, repr=False, compare=False)
    noted_shape: Shape | None = field(default=None, repr=False, compare=False)

    def shape(self) -> Shape:
        """What its publishers and plan are made of, by identity (not content): its
        publishers' tuple and, per broker of ``assignment``, its list and that list's
        length. Every change to them replaces the tuple, replaces a list, or grows or
        shrinks one (lists are never edited in place otherwise), so an unchanged shape
        means unchanged publishers and plan. O(brokers)."""
        return Shape(
            self.spec.publishers, tuple((b, ps, len(ps)) for b, ps in self.assignment.items())
        )

    def join_rate_limit(self) -> float:
        """The most msg/s an unknown publisher may declare to join: ``max_publisher_rate``,
        else the topic's rate (one publisher never declares more than the whole bucket),
        else (a rate that follows the publishers) ``MAX_RATE`` (and the topic's rate it
        makes is checked as any bucket)."""
        if self.max_publisher_rate is not None:
            return self.max_publisher_rate
        return MAX_RATE if self.rate_auto else self.spec.rate

    @property
    def status(self) -> str:
        if self.fitting is not None and self.fitting.get("state") == "running":
            return "fitting"
        return "short" if self.unassigned else "placed"


#: A draining broker's smallest weight, as a fraction of the one it had: room for what
#: reaches it between its drop and its forwarding route (a few requests), while the
#: members keep most of ``RATE_MARGIN``'s 10 % headroom over their assigned rates.
DRAIN_FLOOR = 0.05
#: The time a draining broker is given to release what it had waiting (s).
DRAIN_S = 1.0

#: The lease a broker gets, as a fraction of ``broker_timeout_s``: a broker cut off from
#: the controller holds its topics before the controller marks it down and gives its
#: shares away, with room for the time a request takes on the way.
LEASE_FRACTION = 0.6


#: Publishers one topic may have (a bigger topic is refused with 413): placement and
#: re-placement are linear to quadratic in it, and run on a thread or in the tick.
MAX_PUBLISHERS = 100_000


@dataclass
class Controller:
    broker_timeout_s: float = 5.0
    adaptor: AdaptorSettings = field(default_factory=AdaptorSettings)
    seed: int = 0
    brokers: dict[str, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicState] = field(default_factory=dict)
    #: Ticks further apart than this mean the controller itself stalled (SIGSTOP, a
    #: blocked loop, a suspended VM): such a gap counts as no time for brokers' silence.
    stall_after_s: float = 2.0
    max_publishers: int = MAX_PUBLISHERS
    #: Total time the controller was stalled (the sum of those gaps).
    stalled_s: float = 0.0
    #: Ticks run and stalls seen, for the log and /info.
    ticks: int = 0
    stalls: int = 0
    last_tick_s: float | None = None
    #: A broker came (back) up: try to place unassigned publishers at the next tick.
    replace_pending: bool = False
    #: nsqlookupd's view: every topic and channel brokers carry, managed or not (not
    #: persisted: brokers report them again within a second, as nsqds re-register).
    registry: LookupRegistry = field(default_factory=LookupRegistry)
    #: A broker forwards a moved publisher's messages until none came for this long (s).
    forward_grace_s: float = FORWARD_GRACE_S

    @property
    def lease_s(self) -> float:
        """How long a broker may shape by its shares without word from the controller."""
        return self.broker_timeout_s * LEASE_FRACTION

    def awake(self, now: float) -> float:
        """The controller's own clock: ``now`` less the time it was stalled."""
        return now - self.stalled_s

    # -- brokers -------------------------------------------------------------------------
    def register(
        self, broker_id: str, tcp: str, http: str, mcap: float, now: float
    ) -> list[Action]:
        """Register (again); an existing id at another address is refused (409) while the
        broker there is up, so nobody takes over a live broker's id."""
        if not isinstance(broker_id, str) or not broker_id or len(broker_id) > 256:
            raise ControlError(400, "id must be a non-empty string of at most 256 characters")
        if isinstance(mcap, bool) or not (
            isinstance(mcap, int | float) and math.isfinite(mcap) and mcap > 0
        ):
            raise ControlError(400, f"mcap must be a number > 0, got {mcap!r}")
        parse_address(tcp, "tcp_address")
        parse_address(http, "http_address")
        info = self.brokers.get(broker_id)
        if info is None:
            info = self.brokers[broker_id] = BrokerInfo(broker_id, tcp, http, float(mcap))
            self.replace_pending = True
        elif (info.tcp_address, info.http_address) != (tcp, http) and not info.down:
            raise ControlError(
                409,
                f"broker {broker_id!r} is registered at {info.tcp_address} and up; "
                "another address may take its id only once it is down",
            )
        if info.down:
            self.replace_pending = True
        info.tcp_address, info.http_address, info.mcap = tcp, http, float(mcap)
        info.last_seen_s, info.down = self.awake(now), False
        self.registry.drop(broker_id)  # a new producer, as an nsqd reconnecting
        info.reports, info.depths, info.waiting = {}, {}, {}
        info.arrived, info.arrived_before = {}, {}
        # A broker that (re)starts, or whose lease lapsed, holds every managed topic:
        # its shares again, and a hold on every other managed topic; then its routes
        # (a restarted broker lost them; the others' name its new address).
        actions: list[Action] = [
            SetBucket(broker_id, name, t.buckets[broker_id])
            if broker_id in t.buckets
            else Hold(broker_id, name)
            for name, t in self.topics.items()
        ]
        for t in self.topics.values():
            t.routing.pushed.pop(broker_id, None)
            actions += self._routes(t)
        return actions

    def bucket_doc(self, topic: str, bucket: BucketParams) -> dict[str, Any]:
        """A sub-bucket as brokers are given it (a push, a registration answer): with its
        topic's bound and overflow policy, which the broker polices by."""
        t = self.topics.get(topic)
        bound = DEFAULT_BOUND if t is None else t.bound
        return {"rate": bucket.rate, "burst": bucket.burst,
                "max_wait_ms": bound.max_wait_ms, "overflow": bound.overflow.value}  # fmt: skip

    def shares(self, broker_id: str) -> tuple[dict[str, BucketParams], list[str]]:
        """What ``broker_id`` carries: its sub-bucket per topic, and the managed topics it
        holds (what its registration answer tells it)."""
        buckets = {
            n: t.buckets[broker_id] for n, t in self.topics.items() if broker_id in t.buckets
        }
        return buckets, [n for n in self.topics if n not in buckets]

    def report(
        self,
        broker_id: str,
        load: float,
        topics: dict[str, tuple[float, float]],
        now: float,
        depths: dict[str, int] | None = None,
        waiting: dict[str, int] | None = None,
        arrived: dict[str, int] | None = None,
        carried: dict[str, frozenset[str]] | None = None,
        seen: dict[str, Share] | None = None,
        resources: dict[str, Any] | None = None,
        demand: dict[str, dict[str, int]] | None = None,
        arrived_bytes: dict[str, int] | None = None,
    ) -> list[Action]:
        """A broker's report: its load, each topic's TB Adaptor window, (``depths``) what
        it still holds per topic, (``waiting``) what waits for tokens and (``arrived``)
        messages accepted since it started, per topic (``BrokerInfo.settled``; the tick
        acts on them). Non-finite or negative numbers are refused whole.

        ``carried``: every topic it has, with its channels (the registry's input);
        ``seen``: each topic's share there; ``resources``, ``demand``, ``arrived_bytes``:
        what the utility optimizer and rate control read (``BrokerInfo``). Returns what
        puts back a share the broker lost (an NSQ tool deleted or emptied the topic, say):
        the caller carries these out only while no change of that topic is on its way
        (``repairs``)."""
        info = self.brokers.get(broker_id)
        if info is None:
            raise ControlError(404, f"broker {broker_id!r} is not registered")
        numbers = [load, *(x for pair in topics.values() for x in pair)]
        if not all(math.isfinite(x) and x >= 0 for x in numbers):
            raise ControlError(400, f"report of {broker_id}: numbers must be finite and >= 0")
        if info.down:
            self.replace_pending = True
        info.load, info.last_seen_s, info.down = load, self.awake(now), False
        for name, (rate, backlog) in topics.items():
            info.reports[name] = WindowReport(rate, backlog, now, (waiting or {}).get(name, 0))
        if depths is not None:
            info.depths = {name: d for name, d in depths.items() if d > 0}
        info.reports_seen += 1
        info.waiting = {name: w for name, w in (waiting or {}).items() if w > 0}
        info.arrived_before, info.arrived = info.arrived, dict(arrived or {})
        if carried is not None:
            self.registry.carry(broker_id, carried)
        info.resources = resources
        info.demand = dict(demand or {})
        info.arrived_bytes = dict(arrived_bytes or {})
        return [] if seen is None else self.repairs(broker_id, seen)

    def repairs(self, broker_id: str, seen: dict[str, Share]) -> list[Action]:
        """What makes ``broker_id``'s shares what the plans give it, from what it has
        (``seen``: topic -> its sub-bucket, ``HELD``, or ``None``: neither; a topic it
        lacks is absent): its sub-bucket where it has a share, a hold on a managed topic
        it carries without one."""
        actions: list[Action] = []
        for name, topic in self.topics.items():
            want = topic.buckets.get(broker_id)
            got = seen.get(name)
            was = got if isinstance(got, BucketParams) else None
            if want is not None and (was is None or not same_bucket(was, want)):
                actions.append(SetBucket(broker_id, name, want, was))
            elif want is None and name in seen and got != HELD:
                actions.append(Hold(broker_id, name))
        return actions

    def deregister(self, broker_id: str) -> list[Action]:
        """A broker stopping cleanly: down at once (its publishers move), not after
        ``broker_timeout_s`` of silence."""
        info = self.brokers.get(broker_id)
        if info is None:
            raise ControlError(404, f"broker {broker_id!r} is not registered")
        self.registry.drop(broker_id)
        if info.down:
            return []
        info.down = True
        return self._broker_down(broker_id)

    def up(self) -> list[BrokerInfo]:
        return [b for b in self.brokers.values() if not b.down]

    def silent(self, now: float, after_s: float) -> list[str]:
        """Brokers up that sent nothing for ``after_s`` (awake clock), not down yet: the
        ones worth asking whether anything still listens at their address."""
        awake = self.awake(now)
        return [
            b.id for b in self.brokers.values() if not b.down and awake - b.last_seen_s > after_s
        ]

    def gone(
        self, broker_id: str, http_address: str, now: float, after_s: float
    ) -> list[Action] | None:
        """A silent broker whose address (``http_address``, as it was asked) refused the
        connection: its process is gone (a kill, a crash), so it is down now, as after
        ``broker_timeout_s``: the actions. None if it spoke or registered again
        meanwhile (or is down already)."""
        info = self.brokers.get(broker_id)
        if info is None or info.down or info.http_address != http_address:
            return None
        if self.awake(now) - info.last_seen_s <= after_s:
            return None
        info.down = True
        self.registry.drop(broker_id)
        return self._broker_down(broker_id)

    # -- topics --------------------------------------------------------------------------
    def ledger(self, exclude: str | None = None, placing: str | None = None) -> list[LedgerEntry]:
        """Every registered broker's capacity ledger (``srtm.placement.ledger``):
        ``allocated`` summed from the current plans' sub-buckets, draining members' too
        (all topics but ``exclude``; ``placing``: that topic's draining shares left out,
        a member's share replaces them), ``measured`` from its last report."""
        return ledger(
            ((b.id, b.mcap, b.load) for b in self.brokers.values()),
            (
                {b: p for b, p in t.buckets.items() if b not in t.draining}
                if name == placing
                else t.buckets
                for name, t in self.topics.items()
                if name != exclude
            ),
        )

    def fleet(self, exclude: str | None = None, placing: str | None = None) -> list[BrokerCapacity]:
        """The brokers up, as placement sees them: what is promised counts as carried
        (``load = max(allocated, measured)``), so ``rcap`` is the ledger's. ``exclude``:
        a topic being placed again as a whole (its own plan is not in the way);
        ``placing``: a topic whose publishers are placed (its draining shares are not)."""
        up = {b.id for b in self.up()}
        return [e.capacity() for e in self.ledger(exclude, placing) if e.id in up]

    def check_new_topic(self, spec: TopicSpec) -> list[BrokerCapacity]:
        """Refusals before placing ``spec``; the fleet to place it on."""
        topic_name(spec.name)
        if len(spec.publishers) > self.max_publishers:
            raise ControlError(
                413, f"publishers: {len(spec.publishers)} > {self.max_publishers} per topic"
            )
        if spec.name in self.topics:
            raise ControlError(409, f"topic {spec.name!r} exists")
        fleet = self.fleet()
        if not fleet:
            raise ControlError(503, "no broker is registered and up")
        return for_topic(spec, fleet)

    def create_topic(
        self,
        spec: TopicSpec,
        policy: Policy,
        now: float,
        placement: Placement | None = None,
        placed_on: list[BrokerCapacity] | None = None,
        *,
        open: bool = False,
        rate_auto: bool = False,
        utility: dict[str, Any] | None = None,
        max_publisher_rate: float | None = None,
        join_secret: str | None = None,
        bound: Bound = DEFAULT_BOUND,
    ) -> list[Action]:
        """Create and place ``spec``; ``placement``, when given, was computed off the
        event loop (``place(policy, placed_on, spec, seed)`` with ``placed_on =
        check_new_topic(spec)``) and is used as is, unless the ledger changed meanwhile
        (the tick placed publishers) so that a chosen broker no longer has room for its
        share: then it is placed again here, on the ledger as it is now."""
        fleet = self.check_new_topic(spec)
        if placement is None:
            placement = place(policy, fleet, spec, self.seed)
        elif not {a.broker for a in placement.assignments} <= {b.id for b in fleet}:
            raise ControlError(503, "a broker went down while the topic was being placed")
        elif placed_on is not None and _overtaken(placement, placed_on, fleet):
            placement = place(policy, fleet, spec, self.seed)
        topic = self.topics[spec.name] = TopicState(
            spec, policy, open=open, rate_auto=rate_auto, utility=utility,
            max_publisher_rate=max_publisher_rate, join_secret=join_secret, bound=bound,
        )  # fmt: skip
        for a in placement.assignments:
            topic.assignment[a.broker] = list(a.publishers)
        topic.unassigned = list(placement.unassigned)
        topic.events.append(
            f"placed with {policy} on {', '.join(placement.brokers) or 'no broker'}"
            + (f"; shortfall {placement.shortfall:.6g} msg/s" if placement.shortfall else "")
        )
        return self._new_plan(topic)

    def _new_plan(
        self,
        topic: TopicState,
        released: frozenset[str] = frozenset(),
        joined: Mapping[str, Sequence[str]] | None = None,
    ) -> list[Action]:
        """Re-split the topic's bucket over its brokers by assigned rate, and over its
        draining members by their weight; a new version. A broker up dropped from the
        plan drains (unless ``released``: it settled, it holds the topic now). Each replica
        of a replicated topic shapes the whole stream: its sub-bucket is all of ``(r, b)``.
        Then the routes that changed (forwarding from brokers publishers left, replicas).
        ``joined``: the publishers ``add_publishers`` appended (broker -> ids), if that is
        all that changed since the last plan."""
        self._fold_replicas(topic)
        topic.assignment = {b: ps for b, ps in topic.assignment.items() if ps}
        shape = topic.shape()
        # Only ``joined`` changed since the last note (``add_publishers`` checked, and
        # left the shape its sums were brought to): nobody moved, left, or was folded.
        only_joined = joined is not None and shape.same(topic.sums_shape)
        sums = self.sums(topic)
        members = {b: sums.rate(b) for b in topic.assignment}
        replicas = dict.fromkeys(topic.routing.replicas, 0.0)
        load = sums.rate_sum().total
        self._update_draining(topic, members | replicas, released, load)
        rates = members | topic.draining
        topic.version += 1
        old, topic.buckets = topic.buckets, {}
        if rates:
            spec = topic.spec
            placed = 1.0
            if topic.unassigned:  # a draining member's weight counts as placed load
                placed = min(1.0, math.fsum(rates.values()) / load)
            try:
                parts = split_floored(
                    spec.rate * placed, max(1.0, spec.burst * placed), list(rates.values())
                )
            except ValueError as exc:
                topic.events.append(f"no sub-buckets: {exc}")
                parts = []
            topic.buckets = dict(zip(rates, parts, strict=False))
        for b in replicas:  # each receives every message: no split, no DRL penalty
            topic.buckets[b] = BucketParams(topic.spec.rate, topic.spec.burst)
        name = topic.spec.name
        # Every broker up and out of the plan holds the topic: one dropped from it stops
        # shaping by its old share, one that never had it never passes it unshaped.
        actions: list[Action] = [
            Hold(b.id, name, old.get(b.id)) for b in self.up() if b.id not in topic.buckets
        ]
        actions += [SetBucket(b, name, p, old.get(b)) for b, p in topic.buckets.items()]
        if only_joined:
            assert joined is not None
            topic.routing.note_joined(joined)
        else:
            topic.routing.note_plan(topic.assignment, sums.by_id)
        topic.noted_shape = shape
        return [*actions, *self._routes(topic, noted=True), PlanChanged(name, topic.version)]

    def _routes(self, topic: TopicState, noted: bool = False) -> list[Action]:
        """The route changes that bring brokers up to date with ``topic``'s plan, replica
        set and channels (homes placed by the replicas' reported egress). ``noted``: the
        plan was just noted (``Routing.where`` is the plan's)."""
        r, name = topic.routing, topic.spec.name
        egress = {b: self.brokers[b].usage()[1] for b in r.replicas if b in self.brokers}
        r.homes = home_channels(r.homes, r.replicas, self.registry.channels(name), egress)
        tcp = {b.id: b.tcp_address for b in self.up()}
        want = routes(
            name, r, topic.assignment, topic.buckets, tcp, self.forward_grace_s,
            where=r.where if noted else None,
        )  # fmt: skip
        return list(changes(r, want))

    def sums(self, topic: TopicState) -> Sums:
        """``topic``'s running sums (``srtm.placement.joining.Sums``): kept up to date by
        the join path, taken again from scratch when anything else changed its
        publishers or plan (its shape)."""
        shape = topic.shape()
        if topic.sums is None or not shape.same(topic.sums_shape):
            topic.sums = Sums.of(topic.spec.publishers, topic.assignment)
            topic.sums_shape = shape
        return topic.sums

    def _fold_replicas(self, topic: TopicState) -> None:
        """Keep a replicated topic's plan on its primary: a replica down leaves the set
        (a set of one is no replication); a plan moved whole to one broker makes it the
        primary (a replica swaps places with the old primary, another broker takes its
        place); publishers placed anywhere else (joins) go to the primary."""
        r = topic.routing
        for b in list(r.replicas):
            if b not in self.brokers or self.brokers[b].down:
                r.drop_replica(b)
        if not r.replicated:
            return
        plan = [b for b, ps in topic.assignment.items() if ps]
        if len(plan) == 1 and plan[0] != r.replicas[0]:
            if plan[0] in r.replicas:
                r.replicas.remove(plan[0])
                r.replicas.insert(0, plan[0])
            else:
                r.replicas[0] = plan[0]
        elif len(plan) > 1:
            topic.assignment = {r.replicas[0]: [p for b in plan for p in topic.assignment[b]]}

    def _update_draining(
        self, topic: TopicState, members: dict[str, float], released: frozenset[str], load: float
    ) -> None:
        """Brokers up that had a share and are not members any more drain, weighted by
        what their queue needs (``drain_weight``); a member again, a broker down or
        ``released`` stops draining. ``load``: the publishers' total rate."""
        spec, up = topic.spec, {b.id for b in self.up()}
        scale = load / spec.rate if spec.rate > 0 else 1.0
        for b, p in topic.buckets.items():
            if b not in topic.draining and b not in members and b in up and b not in released:
                waiting = self.brokers[b].waiting.get(spec.name, 0)
                topic.draining[b] = drain_weight(p.rate * scale, waiting)
                topic.drain_since[b] = self.brokers[b].reports_seen
        for b in list(topic.draining):
            if b in members or b not in up or b in released:
                del topic.draining[b]
                topic.drain_since.pop(b, None)

    def _drain(self, topic: TopicState) -> list[Action]:
        """The tick's draining step for ``topic``: a broker up, out of the plan, that
        reports messages waiting for tokens starts draining (a broker restarted with
        restored messages, or one a message reached after its hold); a draining member
        whose report sent after its drop shows the topic settled leaves the split."""
        name, actions = topic.spec.name, []
        members = {b for b, ps in topic.assignment.items() if ps}
        new = {
            b.id
            for b in self.up()
            if b.waiting.get(name, 0) > 0
            and b.id not in members
            and b.id not in topic.draining
            and b.id not in topic.routing.replicas
        }
        for b in new:
            report = self.brokers[b].reports.get(name)
            weights = [self.sums(topic).rate(b) for b in topic.assignment]
            floor = min(weights, default=1.0)
            topic.draining[b] = max(report.rate if report else 0.0, floor, 1e-9)
            topic.drain_since[b] = self.brokers[b].reports_seen - 2  # its report is news
        released = frozenset(
            b
            for b in topic.draining
            if b not in new
            and (
                (info := self.brokers.get(b)) is None
                or info.down
                or (info.reports_seen >= topic.drain_since.get(b, 0) + 2 and info.settled(name))
            )
        )
        if new or released:
            left = f"; {', '.join(sorted(released))} settled" if released else ""
            topic.events.append(f"draining: {', '.join(sorted(new)) or 'none new'}{left}")
            actions = self._new_plan(topic, released)
        return actions

    def move(self, name: str, publishers: list[str], to: str) -> list[Action]:
        """Move publishers to broker ``to``."""
        topic = self._topic(name)
        dest = self.brokers.get(to)
        if dest is None or dest.down:
            raise ControlError(400, f"to: broker {to!r} is not registered and up")
        where = {p: b for b, ps in topic.assignment.items() for p in ps}
        unknown = [p for p in publishers if p not in where]
        if unknown:
            raise ControlError(400, f"publishers not placed in {name!r}: {unknown[:5]}")
        moving = [p for p in publishers if where[p] != to]
        if not moving:
            return []
        assignment = {b: [p for p in ps if p not in moving] for b, ps in topic.assignment.items()}
        assignment.setdefault(to, []).extend(moving)
        return self.set_assignment(
            name, assignment, topic.unassigned, f"moved {len(moving)} publishers to {to}"
        )

    def set_assignment(
        self, name: str, assignment: dict[str, list[str]], unassigned: list[str], note: str
    ) -> list[Action]:
        """A new plan with this assignment: the sub-buckets re-split and pushed first (so a
        destination shapes from the first message), then a migration order for every
        publisher that changes broker."""
        topic = self._topic(name)
        if topic.routing.replicated and sum(1 for ps in assignment.values() if ps) > 1:
            raise ControlError(
                409, f"topic {name!r} is replicated: its publishers stay on one broker "
                "(POST /topics/NAME/replicas with count 1 first)",
            )  # fmt: skip
        before = {p: b for b, ps in topic.assignment.items() for p in ps}
        topic.assignment = {b: list(ps) for b, ps in assignment.items() if ps}
        topic.unassigned = list(unassigned)
        topic.events.append(note)
        actions = self._new_plan(topic)
        orders: list[Action] = [
            Migrate(before[p], name, p, self.brokers[b].tcp_address, topic.version)
            for b, ps in topic.assignment.items()
            for p in ps
            if p in before and before[p] != b and before[p] in self.brokers
        ]
        return [*actions[:-1], *orders, actions[-1]]

    # -- lifecycle -----------------------------------------------------------------------
    def _changeable(self, name: str) -> TopicState:
        """The topic, if a lifecycle change may touch it now (404; 409 while fitting:
        fitting owns the plan until it is done)."""
        topic = self._topic(name)
        if topic.status == "fitting":
            raise ControlError(409, f"topic {name!r} is being fitted; try again when done")
        return topic

    def delete_topic(self, name: str) -> list[Action]:
        """Stop managing ``name``: its plan is gone (the ledger frees its share) and every
        broker up is told to drop its sub-bucket and release what it holds, so messages
        already accepted are still delivered (/lookup lists brokers holding them)."""
        topic = self._changeable(name)
        del self.topics[name]
        self.replace_pending = True  # capacity freed: place others' unassigned publishers
        routed: list[Action] = [DropRoute(b, name) for b in topic.routing.pushed]
        return [*(Unmanage(b.id, name) for b in self.up()), *routed]

    def change_topic(
        self,
        name: str,
        *,
        slo_p99_ms: float | None = None,
        rate: float | None = None,
        burst: float | None = None,
        policy: Policy | None = None,
        max_wait_ms: float | None = None,
        overflow: str | None = None,
    ) -> list[Action]:
        """PATCH: a new SLO is recorded; a new rate or burst re-splits the bucket over the
        same brokers; a new policy places the topic again as a whole (migration orders
        for the publishers that move); a new bound or overflow policy goes to every
        broker with its sub-bucket. No actions: nothing to push (save the state)."""
        topic = self._changeable(name)
        bound = topic.bound
        if max_wait_ms is not None or overflow is not None:
            try:
                bound = check_bound(
                    bound.max_wait_ms if max_wait_ms is None else max_wait_ms,
                    bound.overflow if overflow is None else overflow,
                )
            except ValueError as exc:
                raise ControlError(400, f"topic: {exc}") from None
        if policy is not None and policy != topic.policy and topic.routing.replicated:
            raise ControlError(409, f"topic {name!r} is replicated: it is not placed again")
        spec = topic.spec
        new_rate = spec.rate if rate is None else rate
        new_burst = spec.burst if burst is None else burst
        if rate is not None or burst is not None:
            try:  # a rate that follows the publishers is quoted with the rates it came from
                if rate is None and topic.rate_auto:
                    topic_bucket(spec.publishers, None, new_burst)
                else:
                    check_bucket(new_rate, new_burst)
            except ValueError as exc:
                raise ControlError(400, f"topic: {exc}") from None
        changed = [
            f"{k} {v:g}"
            for k, v in (("slo_p99_ms", slo_p99_ms), ("rate", rate), ("burst", burst),
                         ("max_wait_ms", max_wait_ms))
            if v is not None
        ] + ([f"overflow {overflow}"] if overflow is not None else [])  # fmt: skip
        rebound = bound != topic.bound
        topic.bound = bound
        topic.spec = dataclasses.replace(
            spec,
            slo_p99_ms=spec.slo_p99_ms if slo_p99_ms is None else slo_p99_ms,
            rate=new_rate,
            burst=new_burst,
        )
        if rate is not None:
            topic.rate_auto = False
        if policy is not None and policy != topic.policy:  # (refused above if replicated)
            fleet = self.fleet(exclude=name)
            if not fleet:
                raise ControlError(503, "no broker is registered and up")
            placement = place(policy, for_topic(topic.spec, fleet), topic.spec, self.seed)
            topic.policy = policy
            assignment = {a.broker: list(a.publishers) for a in placement.assignments}
            note = f"changed {', '.join([*changed, f'policy {policy}'])}: placed again"
            return self.set_assignment(name, assignment, list(placement.unassigned), note)
        if not changed:
            return []
        topic.events.append(f"changed {', '.join(changed)}")
        if rate is None and burst is None:
            # The same sub-buckets again, with the new bound (retuning keeps their state).
            return [SetBucket(b, name, p, p) for b, p in topic.buckets.items()] if rebound else []
        return self._new_plan(topic)

    def set_utility(self, name: str, utility: dict[str, Any] | None) -> None:
        """PATCH: a new utility spec (checked by the caller), or None: the optimizer and
        rate control leave the topic's rate alone from now on."""
        topic = self._changeable(name)
        topic.utility = utility
        topic.allocation = None
        topic.events.append("utility spec " + ("set" if utility is not None else "removed"))

    def set_rate(self, name: str, rate: float) -> list[Action]:
        """The optimizer's or rate control's rate for ``name``: its sub-buckets scaled to
        it, keeping their proportions (the TB Adaptor's split) and bursts; no new plan
        version. No actions while fitting owns the plan, or if the rate cannot be a
        bucket's (it is kept as it is)."""
        topic = self._topic(name)
        spec = topic.spec
        if topic.status == "fitting" or math.isclose(rate, spec.rate, rel_tol=1e-9):
            return []
        try:
            check_bucket(rate, spec.burst)
        except ValueError:
            return []
        old = dict(topic.buckets)
        topic.spec = dataclasses.replace(spec, rate=rate)
        topic.rate_auto = False
        if not old:
            return []
        total = merge(old.values())
        weights = [p.rate for p in old.values()] if total.rate > 0 else [1.0] * len(old)
        try:
            placed = min(1.0, total.rate / spec.rate) if spec.rate > 0 else 1.0
            parts = split_floored(rate * placed, total.burst, weights)
        except ValueError:
            return []
        topic.buckets = dict(zip(old, parts, strict=True))
        return [
            SetBucket(b, name, p, old[b])
            for b, p in topic.buckets.items()
            if not same_bucket(p, old[b])
        ]

    def add_publishers(
        self,
        name: str,
        publishers: list[PublisherLoad],
        field: str = "publishers",
        *,
        whole: bool = False,
    ) -> list[Action]:
        """Join ``publishers`` to the topic by its policy's incremental rule
        (``srtm.placement.joining``): nobody already placed moves; who fits nowhere is
        unassigned (status ``short``). Then the bucket is re-split. A refusal names
        ``field``, where the request carried them. ``whole``: all placed, with a
        sub-bucket each, or nothing changes (503): an anonymous join never makes a topic
        short, nor takes its existing publishers' shares."""
        topic = self._changeable(name)
        if not publishers:
            raise ControlError(400, "publishers: at least one")
        for i, p in enumerate(publishers):
            where = field if field != "publishers" else f"publishers[{i}]"
            publisher_id(p.id, f"{where}.id" if field == "publishers" else "publisher")
            if isinstance(p.rate, bool) or not (
                isinstance(p.rate, int | float) and 0 < p.rate <= MAX_RATE
            ):  # NaN fails both comparisons
                rate_field = f"{where}.rate" if field == "publishers" else field
                raise ControlError(
                    400, f"{rate_field}: must be a number > 0 and <= {MAX_RATE:g}, got {p.rate!r}"
                )
        sums = self.sums(topic)
        # The record of forwarding is the plan's as last noted: the new plan may be
        # noted by the newcomers alone (``_new_plan``).
        noted = topic.shape().same(topic.noted_shape)
        known = sums.by_id
        ids = [p.id for p in publishers]
        taken = sorted({i for i in ids if i in known or ids.count(i) > 1})[:5]
        if taken:
            raise ControlError(409, f"publishers: ids already in topic {name!r}: {taken}")
        if len(known) + len(publishers) > self.max_publishers:
            raise ControlError(
                413, f"publishers: {len(known) + len(publishers)} > {self.max_publishers} per topic"
            )
        spec, after = topic.spec, sums.rate_sum(publishers)
        try:  # refused before anything changes (a rate that follows them: quoted)
            bucket = topic_bucket(after, None if topic.rate_auto else spec.rate, spec.burst)
        except ValueError as exc:
            raise ControlError(400, f"{field}: {exc}") from None
        fleet = self.fleet(exclude=name)
        if not fleet:
            raise ControlError(503, "no broker is registered and up")
        load = after.total
        joined = join(topic.policy, fleet, sums, publishers, bucket.rate / load)
        if whole:
            self._check_whole(topic, joined, publishers, bucket, load)
        self._set_publishers(topic, spec.publishers + tuple(publishers), after)  # one copy
        sums.joined(publishers)
        for b, ps in joined.placed.items():
            topic.assignment.setdefault(b, []).extend(ps)
            sums.placed(b, ps)
        topic.sums_shape = topic.shape()  # brought up to date: no need to take them again
        topic.unassigned += joined.unassigned
        where = ", ".join(f"{len(ps)} on {b}" for b, ps in joined.placed.items())
        topic.events.append(
            f"{len(publishers)} publishers joined: {where or 'none placed'}"
            + (f"; {len(joined.unassigned)} unassigned" if joined.unassigned else "")
        )
        return self._new_plan(topic, joined=joined.placed if noted else None)

    def _check_whole(
        self,
        topic: TopicState,
        joined: Joined,
        publishers: list[PublisherLoad],
        bucket: BucketParams,
        load: float,
    ) -> None:
        """503 unless ``joined`` places every newcomer and the topic's bucket still splits
        into one sub-bucket per member (``_new_plan``'s split), so that refusing changes
        nothing: the plan, its buckets and delivery stay as they are."""
        name = topic.spec.name
        if joined.unassigned:
            who = ", ".join(repr(p) for p in joined.unassigned[:3])
            raise ControlError(
                503, f"publisher {who} cannot be placed: no broker up has room for its rate; "
                f"topic {name!r} is unchanged",
            )  # fmt: skip
        rate_of = {p.id: p.rate for p in publishers}
        sums = self.sums(topic)
        weights = {b: sums.rate(b) for b in topic.assignment}
        primary = topic.routing.replicas[0] if topic.routing.replicated else None
        for b, ps in joined.placed.items():
            b = primary or b  # a replicated topic's joiners go to its primary
            weights[b] = weights.get(b, 0.0) + math.fsum(rate_of[p] for p in ps)
        weights = {b: w for b, w in weights.items() if w > 0} | topic.draining
        placed = 1.0
        if topic.unassigned:
            placed = min(1.0, math.fsum(weights.values()) / load)
        try:
            split_floored(
                bucket.rate * placed, max(1.0, bucket.burst * placed), list(weights.values())
            )
        except ValueError as exc:
            raise ControlError(
                503, f"publisher cannot be placed: {exc}; topic {name!r} is unchanged"
            ) from None

    def remove_publisher(self, name: str, publisher: str) -> list[Action]:
        """The publisher leaves: out of the topic and its plan, the bucket re-split over
        who is left; nobody else moves."""
        topic = self._changeable(name)
        if publisher not in {p.id for p in topic.spec.publishers}:
            raise ControlError(404, f"publisher {publisher!r} is not in topic {name!r}")
        self._set_publishers(topic, [p for p in topic.spec.publishers if p.id != publisher])
        topic.assignment = {
            b: [p for p in ps if p != publisher] for b, ps in topic.assignment.items()
        }
        topic.unassigned = [p for p in topic.unassigned if p != publisher]
        topic.events.append(f"publisher {publisher} left")
        self.replace_pending = True  # capacity freed
        return self._new_plan(topic)

    def join_open(
        self, name: str, publisher: str, rate: float | None, group: str | None
    ) -> list[Action]:
        """Self-registration on ``/assign``: an unknown publisher of an ``open`` topic
        joins with the rate and group it tells (no rate: 400), at most the topic's
        ``join_rate_limit`` (400 naming ``rate``). It is placed whole or refused (503)
        with the topic unchanged. A known one: nothing."""
        topic = self._topic(name)
        publisher_id(publisher)
        if publisher in self.sums(topic).by_id:
            return []
        if not topic.open:
            raise ControlError(404, f"publisher {publisher!r} is not in topic {name!r}")
        if rate is None:
            raise ControlError(400, f"rate: required to join open topic {name!r}")
        limit = topic.join_rate_limit()
        number = isinstance(rate, int | float) and not isinstance(rate, bool)
        if not (number and 0 < rate <= limit):  # NaN fails both comparisons
            raise ControlError(
                400, f"rate: an unknown publisher of topic {name!r} may declare more than 0 "
                f"and at most {limit:g} msg/s (its max_publisher_rate), got "
                + (f"{rate:g}" if number else repr(rate)),
            )  # fmt: skip
        load = PublisherLoad(publisher, float(rate), group)
        return self.add_publishers(name, [load], "rate", whole=True)

    def set_join(
        self,
        name: str,
        *,
        max_publisher_rate: float | bool | None = False,
        join_secret: str | bool | None = False,
    ) -> None:
        """PATCH: how unknown publishers join (``False``: left as it is; None: removed)."""
        topic = self._changeable(name)
        if max_publisher_rate is not False:
            assert not isinstance(max_publisher_rate, bool)
            topic.max_publisher_rate = max_publisher_rate
            topic.events.append(
                "max_publisher_rate "
                + ("default" if max_publisher_rate is None else f"{max_publisher_rate:g}")
            )
        if join_secret is not False:
            assert not isinstance(join_secret, bool)
            topic.join_secret = join_secret
            topic.events.append("join secret " + ("removed" if join_secret is None else "set"))

    def _set_publishers(
        self,
        topic: TopicState,
        publishers: Sequence[PublisherLoad],
        summed: RateSum | None = None,
    ) -> None:
        """The topic's publishers are ``publishers`` (``summed``: their ``RateSum``, if
        known); a rate that follows them follows."""
        spec = topic.spec
        rate = spec.rate
        if topic.rate_auto:
            total = math.fsum(p.rate for p in publishers) if summed is None else summed.total
            rate = RATE_MARGIN * total
        topic.spec = dataclasses.replace(spec, publishers=tuple(publishers), rate=rate)

    def over(self) -> list[LedgerEntry]:
        """Brokers promised more than their ``mcap`` (an operator's warning: a PATCH
        raised a rate, or a fleet shrank)."""
        return [e for e in self.ledger() if e.allocated > e.mcap * (1 + 1e-9)]

    def note_over(self, name: str) -> list[str]:
        """Warnings for the brokers over ``mcap`` that carry ``name``, kept as its events."""
        topic = self.topics.get(name)
        if topic is None:
            return []
        notes = [
            f"warning: broker {e.id} is promised {e.allocated:.6g} msg/s > mcap {e.mcap:.6g}"
            for e in self.over()
            if e.id in topic.buckets
        ]
        topic.events += notes
        return notes

    # -- time ----------------------------------------------------------------------------
    def tick(self, now: float) -> list[Action]:
        """Mark silent brokers down (placing their publishers again), place publishers
        left without a broker when brokers came (back), then run the TB Adaptor.

        Silence is measured on the awake clock: a gap between ticks longer than
        ``stall_after_s`` is the controller's own stall and counts as no time at all, so
        every broker looking silent at once after a SIGSTOP or a blocked loop does not
        unassign anyone: each gets its remaining timeout from the resumption."""
        if self.last_tick_s is not None and now - self.last_tick_s > self.stall_after_s:
            self.stalled_s += now - self.last_tick_s
            self.stalls += 1
        self.last_tick_s = now
        self.ticks += 1
        awake = self.awake(now)
        actions: list[Action] = []
        for info in self.brokers.values():
            if not info.down and awake - info.last_seen_s > self.broker_timeout_s:
                info.down = True
                self.registry.drop(info.id)
                actions += self._broker_down(info.id)
        if self.replace_pending:
            self.replace_pending = False
            actions += self._place_unassigned()
        for topic in self.topics.values():
            if topic.status != "fitting":  # fitting owns the plan until it is done
                actions += self._drain(topic)
            actions += self._adapt(topic, now)
        return actions + self.rehome()

    def _place_unassigned(self) -> list[Action]:
        """Publishers with no broker get one now that capacity may have come back."""
        actions: list[Action] = []
        for topic in self.topics.values():
            if not topic.unassigned or topic.status == "fitting":
                continue
            # again per topic: the previous one's plan is promised
            fleet = self.fleet(placing=topic.spec.name)
            if not fleet:
                return actions
            by_id = {p.id: p for p in topic.spec.publishers}
            pool = [by_id[p] for p in topic.unassigned if p in by_id]
            fleet = for_topic(topic.spec, fleet)
            placement = place(topic.policy, fleet, topic.spec.with_publishers(pool), self.seed)
            placed = sum(len(a.publishers) for a in placement.assignments)
            if not placed:
                continue
            for a in placement.assignments:
                topic.assignment.setdefault(a.broker, []).extend(a.publishers)
            topic.unassigned = list(placement.unassigned)
            topic.events.append(
                f"{placed} unassigned publishers placed on "
                f"{', '.join(placement.brokers)} as capacity came back"
            )
            actions += self._new_plan(topic)
        return actions

    def _broker_down(self, broker_id: str) -> list[Action]:
        actions: list[Action] = []
        for topic in self.topics.values():
            if broker_id in topic.routing.replicas:  # the next replica takes over
                actions += self._replica_down(topic, broker_id)
                continue
            orphans = topic.assignment.pop(broker_id, None)
            if not orphans:
                if broker_id in topic.draining:  # its share is freed, as at failover
                    topic.events.append(f"broker {broker_id} down: no longer draining")
                    actions += self._new_plan(topic)
                continue
            # per topic: what the previous topics were given counts
            fleet = self.fleet(placing=topic.spec.name)
            by_id = {p.id: p for p in topic.spec.publishers}
            pool: list[PublisherLoad] = [by_id[p] for p in orphans]
            fleet = for_topic(topic.spec, fleet)
            placement = place(topic.policy, fleet, topic.spec.with_publishers(pool), self.seed)
            for a in placement.assignments:
                topic.assignment.setdefault(a.broker, []).extend(a.publishers)
            topic.unassigned += placement.unassigned
            topic.events.append(
                f"broker {broker_id} down: {len(orphans)} publishers moved to "
                f"{', '.join(placement.brokers) or 'no broker'}"
            )
            actions += self._new_plan(topic)
        return actions

    def _replica_down(self, topic: TopicState, broker_id: str) -> list[Action]:
        """A replica went down: it leaves the set, its channels are homed elsewhere; if it
        was the primary, the next replica takes its publishers."""
        r = topic.routing
        others = [b for b in r.replicas if b != broker_id]
        orphans = topic.assignment.pop(broker_id, None)
        r.drop_replica(broker_id)
        if orphans:
            topic.assignment.setdefault(others[0], []).extend(orphans)
        topic.events.append(
            f"replica {broker_id} down: " + (f"{others[0]} is primary" if orphans else "re-homed")
        )
        return self._new_plan(topic)

    # -- replication ---------------------------------------------------------------------
    def set_replicas(self, name: str, count: int, to: list[str] | None = None) -> list[Action]:
        """ALL_PUBLISHERS with ``count`` replicas (1: none): added from ``to`` if given,
        else the least-loaded brokers up by the ledger; removed from the end of the set
        (never the primary). The topic's publishers must be on one broker (409)."""
        topic = self._changeable(name)
        up = {b.id for b in self.up()}
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ControlError(400, f"count must be an integer >= 1, got {count!r}")
        if count > len(up):
            raise ControlError(400, f"count: {count} > {len(up)} brokers up")
        plan = [b for b, ps in topic.assignment.items() if ps]
        r = topic.routing
        have = list(r.replicas) or plan[:1]
        if len(have) == count or (not r.replicas and count == 1):
            return []
        if not r.replicas and len(plan) != 1:
            raise ControlError(
                409, f"topic {name!r}: ALL_PUBLISHERS replicates a topic whose publishers "
                f"are on one broker; they are on {len(plan)}",
            )  # fmt: skip
        if count > len(have):
            load = {e.id: e.load / e.mcap for e in self.ledger()}
            pool = [b for b in (to or sorted(up, key=lambda b: (load[b], b))) if b not in have]
            bad = [b for b in pool if b not in up]
            if bad:
                raise ControlError(400, f"to: broker {bad[0]!r} is not registered and up")
            have += pool[: count - len(have)]
        r.replicas = have[:count]
        if not r.replicated:
            r.replicas, r.homes = [], {}
        note = f"replicas: {', '.join(r.replicas)}" if r.replicated else "not replicated"
        topic.events.append(f"ALL_PUBLISHERS {note}")
        return self._new_plan(topic)

    def replicate(self, name: str, to: str) -> list[Action]:
        """Add broker ``to`` to ``name``'s replica set (the rebalancer's ``Replicate``)."""
        have = self.topics[name].routing.replicas if name in self.topics else []
        if to in have:
            return []
        return self.set_replicas(name, max(len(have), 1) + 1, [to])

    def unreplicate(self, name: str, broker: str) -> list[Action]:
        """Remove replica ``broker`` (the rebalancer's ``Unreplicate``; not the primary)."""
        topic = self._changeable(name)
        r = topic.routing
        if broker not in r.replicas[1:]:
            raise ControlError(400, f"broker {broker!r} is not a replica of {name!r}")
        r.drop_replica(broker)
        topic.events.append(f"replica {broker} removed")
        return self._new_plan(topic)

    def rehome(self) -> list[Action]:
        """The tick's replication step: channels new to a replicated topic get a home."""
        actions: list[Action] = []
        for topic in self.topics.values():
            if topic.routing.replicated:
                actions += self._routes(topic)
        return actions

    def _adapt(self, topic: TopicState, now: float) -> list[Action]:
        if topic.version != topic.adapted_version:  # a new plan: let the windows refill
            topic.adapted_version = topic.version
            topic.adapt_after_s = now + self.adaptor.settle_s
        if len(topic.buckets) < 2 or topic.routing.replicated:
            return []  # a replica shapes the whole stream: nothing to re-split
        reports = {
            b: self.brokers[b].reports[topic.spec.name]
            for b in topic.buckets
            if b in self.brokers and topic.spec.name in self.brokers[b].reports
        }
        total = merge(topic.buckets.values())
        total_was = dict(topic.buckets)
        settling = now < topic.adapt_after_s  # only a deep queue moves rate meanwhile
        new = adapt(total, topic.buckets, reports, now, self.adaptor, settling=settling)
        changed = [b for b in new if new[b] != topic.buckets[b]]
        topic.buckets = new
        return [SetBucket(b, topic.spec.name, new[b], total_was.get(b)) for b in changed]

    # -- read-outs -----------------------------------------------------------------------
    def _topic(self, name: str) -> TopicState:
        topic = self.topics.get(name)
        if topic is None:
            raise ControlError(404, f"topic {name!r} does not exist")
        return topic

    def plan(self, name: str) -> dict[str, Any]:
        topic = self._topic(name)
        return {
            "topic": name,
            "version": topic.version,
            "policy": topic.policy,
            "status": topic.status,
            "brokers": [
                {
                    "id": b,
                    "tcp_address": self.brokers[b].tcp_address,
                    "http_address": self.brokers[b].http_address,
                    "publishers": ps,
                    "bucket": _bucket(topic.buckets.get(b)),
                }
                for b, ps in topic.assignment.items()
            ],
            "unassigned": topic.unassigned,
        }

    def is_publisher(self, name: str, publisher: str) -> bool:
        topic = self.topics.get(name)
        return topic is not None and publisher in self.sums(topic).by_id

    def assign(self, name: str, publisher: str) -> dict[str, Any]:
        topic = self._topic(name)
        if topic.shape().same(topic.noted_shape):  # the plan as noted: where it is, at once
            where = topic.routing.where.get(publisher)
            placed = [] if where is None else [(where, [publisher])]
        else:
            placed = list(topic.assignment.items())
        for b, ps in placed:
            if publisher in ps:
                info = self.brokers[b]
                return {
                    "topic": name,
                    "publisher": publisher,
                    "broker": b,
                    "tcp_address": info.tcp_address,
                    "version": topic.version,
                }
        if publisher in topic.unassigned:
            raise ControlError(503, f"publisher {publisher!r} is unassigned: capacity is short")
        raise ControlError(404, f"publisher {publisher!r} is not in topic {name!r}")

    def topic_doc(self, name: str) -> dict[str, Any]:
        topic = self._topic(name)
        return self.plan(name) | {
            "slo_p99_ms": topic.spec.slo_p99_ms,
            "rate": topic.spec.rate,
            "burst": topic.spec.burst,
            "max_wait_ms": topic.bound.max_wait_ms,
            "overflow": topic.bound.overflow.value,
            "publishers": len(topic.spec.publishers),
            "events": topic.events,
            "fitting": topic.fitting,
            "open": topic.open,
            "max_publisher_rate": topic.join_rate_limit() if topic.open else None,
            "join_secret_set": topic.join_secret is not None,
            "replicas": topic.routing.replicas,
            "homes": topic.routing.homes,
            "forwarding": {b: sorted(d) for b, d in topic.routing.left.items()},
            "utility": topic.utility,
            "allocation": None
            if topic.allocation is None
            else topic.allocation | {"current_rate": topic.spec.rate},
        }

    def topic_brokers(self, name: str) -> list[BrokerInfo]:
        """The plan's brokers, then a replicated topic's other replicas."""
        topic = self.topics.get(name)
        if topic is None:
            return []
        ids = dict.fromkeys([*topic.assignment, *topic.routing.replicas])
        return [self.brokers[b] for b in ids if b in self.brokers]

    def producers(self, name: str) -> list[BrokerInfo]:
        """Where subscribers of ``name`` read: its live brokers, then any other live broker
        still holding messages of it or draining it (a broker back after failover drains
        its backlog there; it is never a publish target, /assign does not name it)."""
        live = [b for b in self.topic_brokers(name) if not b.down]
        ids = {b.id for b in live}
        topic = self.topics.get(name)
        draining = set() if topic is None else set(topic.draining)
        return live + [
            b
            for b in self.up()
            if b.id not in ids and (b.depths.get(name, 0) > 0 or b.id in draining)
        ]

    # -- nsqlookupd's view --------------------------------------------------------------
    def lookup(self, name: str, now: float) -> tuple[list[str], list[BrokerInfo]] | None:
        """nsqlookupd's /lookup: the topic's channels and where to read it (None: no such
        topic). A managed topic's are its ``producers`` (plan, then backlogs); an
        unmanaged one's every live broker registered for it; a tombstoned broker is left
        out while its tombstone lasts."""
        reg = self.registry
        holding = self.producers(name)
        if name not in self.topics and not holding and not reg.has_topic(name):
            return None
        ids = {b.id for b in holding}
        # A managed topic's readers go where its plan and backlogs are (a broker holding
        # it with nothing left is not listed); the registry lists an unmanaged one's.
        more = [
            self.brokers[i]
            for i in reg.producers(name)
            if name not in self.topics
            and i not in ids
            and i in self.brokers
            and not self.brokers[i].down
        ]
        live = [b for b in holding + more if not reg.is_tombstoned(name, b.id, now)]
        return reg.channels(name), live

    def topic_names(self) -> list[str]:
        """nsqlookupd's /topics: managed topics and every registered one."""
        return sorted(set(self.topics) | set(self.registry.topics()))

    def nodes(self, now: float) -> list[tuple[BrokerInfo, list[str], list[bool]]]:
        """nsqlookupd's /nodes: every broker up, its topics, and whether each is
        tombstoned there."""
        reg = self.registry
        out = []
        for b in self.up():
            topics = reg.broker_topics(b.id)
            out.append((b, topics, [reg.is_tombstoned(t, b.id, now) for t in topics]))
        return out

    # -- persistence ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Everything that is saved (``brokers_json`` and each ``topic_json``)."""
        return {"brokers": self.brokers_json(), "topics": [self.topic_json(n) for n in self.topics]}

    def brokers_json(self) -> list[dict[str, Any]]:
        return [
            {"id": b.id, "tcp_address": b.tcp_address, "http_address": b.http_address,
             "mcap": b.mcap}
            for b in self.brokers.values()
        ]  # fmt: skip

    def topic_json(self, name: str) -> dict[str, Any]:
        """One topic as it is saved (its own row: a change of it rewrites only this)."""
        t = self.topics[name]
        return {
            "name": t.spec.name,
            "policy": t.policy,
            "slo_p99_ms": t.spec.slo_p99_ms,
            "rate": t.spec.rate,
            "burst": t.spec.burst,
            "publishers": [
                {"id": p.id, "rate": p.rate, "group": p.group} for p in t.spec.publishers
            ],
            "version": t.version,
            "assignment": t.assignment,
            "buckets": {b: _bucket(p) for b, p in t.buckets.items()},
            "unassigned": t.unassigned,
            "events": t.events,
            "fitting": t.fitting,
            "open": t.open,
            "max_publisher_rate": t.max_publisher_rate,
            "join_secret": t.join_secret,
            "rate_auto": t.rate_auto,
            "draining": t.draining,
            "routing": t.routing.to_json(),
            "utility": t.utility,
            "bound": {"max_wait_ms": t.bound.max_wait_ms, "overflow": t.bound.overflow.value},
        }

    def restore(self, doc: dict[str, Any], now: float) -> None:
        """Rebuild from ``to_json``; brokers get a full timeout to report again."""
        for b in doc.get("brokers", []):
            self.brokers[b["id"]] = BrokerInfo(
                b["id"], b["tcp_address"], b["http_address"], b["mcap"],
                last_seen_s=self.awake(now),
            )  # fmt: skip
        for t in doc.get("topics", []):
            pubs = tuple(PublisherLoad(p["id"], p["rate"], p.get("group")) for p in t["publishers"])
            spec = TopicSpec(t["name"], pubs, t["burst"], t["slo_p99_ms"], t["rate"])
            self.topics[spec.name] = TopicState(
                spec,
                t["policy"],
                t["version"],
                {b: list(ps) for b, ps in t["assignment"].items()},
                {b: BucketParams(x["rate"], x["burst"]) for b, x in t["buckets"].items() if x},
                list(t["unassigned"]),
                Events(list(t.get("events", []))[-MAX_EVENTS:]),
                _interrupted(t.get("fitting")),
                open=bool(t.get("open", False)),
                max_publisher_rate=t.get("max_publisher_rate"),
                join_secret=t.get("join_secret"),
                rate_auto=bool(t.get("rate_auto", False)),
                draining={b: float(w) for b, w in t.get("draining", {}).items()},
                routing=Routing.from_json(t.get("routing")),
                utility=t.get("utility"),
                bound=_restored_bound(t.get("bound")),
            )
            self._restore_routes(self.topics[spec.name])
            self._drop_impossible(self.topics[spec.name])
            if t["unassigned"]:
                self.replace_pending = True

    def _drop_impossible(self, topic: TopicState) -> None:
        """A state saved before joins were bounded may hold a publisher whose rate no
        bucket can carry (``rate=1e308`` by an anonymous ``/assign``): its topic lost
        its sub-buckets and every sum over it overflows. Such publishers leave the topic
        at restore (an event says so) and it gets a new plan; the brokers get their
        shares back by the repairs of their next reports."""
        bad = [
            p
            for p in topic.spec.publishers
            if not (isinstance(p.rate, int | float) and 0 < p.rate <= MAX_RATE)
        ]
        if not bad:
            return
        gone = {p.id for p in bad}
        self._set_publishers(topic, [p for p in topic.spec.publishers if p.id not in gone])
        topic.assignment = {
            b: [p for p in ps if p not in gone] for b, ps in topic.assignment.items()
        }
        topic.unassigned = [p for p in topic.unassigned if p not in gone]
        topic.events.append(
            f"at restore: {len(bad)} publishers with a rate no bucket can carry removed "
            f"({', '.join(repr(p.id) for p in bad[:3])})"
        )
        self._new_plan(topic)

    def _restore_routes(self, topic: TopicState) -> None:
        """After a restart: brokers kept the routes they were given, which the record
        says (every registered broker counts as up until it is marked down)."""
        r, name = topic.routing, topic.spec.name
        r.where = {p: b for b, ps in topic.assignment.items() for p in ps}
        tcp = {b.id: b.tcp_address for b in self.brokers.values()}
        r.pushed = routes(name, r, topic.assignment, topic.buckets, tcp, self.forward_grace_s)


def drain_weight(had: float, waiting: int) -> float:
    """A dropped broker's weight in the split (msg/s): enough to release what its last
    report had waiting within ``DRAIN_S``, at least ``DRAIN_FLOOR`` of the weight it
    ``had`` and at most that. Not the whole of it: forwarding sends what its publishers
    still publish there to their new broker, and every msg/s it keeps is taken from the
    brokers they moved to (weighted by its old share, each move in the live diurnal day
    left the destination short of its rate and queueing for 2-4 s)."""
    need = max(DRAIN_FLOOR * had, waiting / DRAIN_S)
    return max(min(had, need), 1e-9)


def _overtaken(placement: Placement, then: list[BrokerCapacity], now: list[BrokerCapacity]) -> bool:
    """Did a chosen broker's ``rcap`` shrink, since ``placement`` was computed on
    ``then``, below the rate the placement gives it?"""
    before = {b.id: b.rcap for b in then}
    after = {b.id: b.rcap for b in now}
    return any(
        after[a.broker] < before.get(a.broker, math.inf) and a.rate > after[a.broker] * (1 + 1e-9)
        for a in placement.assignments
    )


def _interrupted(fitting: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fitting that was running when the controller stopped is not running any more."""
    if fitting is not None and fitting.get("state") == "running":
        return fitting | {"state": "interrupted"}
    return fitting


def _restored_bound(doc: Any) -> Bound:
    """A saved bound (absent, from before bounds: the default)."""
    if not isinstance(doc, dict):
        return DEFAULT_BOUND
    return check_bound(doc.get("max_wait_ms"), doc.get("overflow"))


def _bucket(p: BucketParams | None) -> dict[str, float] | None:
    return None if p is None else {"rate": p.rate, "burst": p.burst}
