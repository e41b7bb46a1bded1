"""What the controller knows, as data: each broker (``BrokerInfo``), each topic
(``TopicState``) and the fields every decision reads (``ControllerState``), with the typed
parts that JSON documents carry (fitting progress, a broker's resources, a topic's
utility spec, parsed and as given, and its allocation by the utility optimizer).

No decisions here: the concept modules (``brokers``, ``topics``, ``plans``, ``replicas``,
``views``, ``persistence``) make them over a ``ControllerState``; ``srtm.control.state``'s
``Controller`` is the one object that offers them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from srtm.control.registry import LookupRegistry
from srtm.control.routes import FORWARD_GRACE_S, Routing
from srtm.control.validate import ControlError, parse_address
from srtm.placement import AdaptorSettings, Policy, PublisherLoad, Sums, TopicSpec, WindowReport
from srtm.placement.fitting import FitOutcome, Step, Verdict
from srtm.ratelimit import MAX_RATE, BucketParams
from srtm.ratelimit.overflow import DEFAULT_BOUND, Bound
from srtm.utility.cluster import parse_topic_utility
from srtm.utility.optimizer import FlowSpec

if TYPE_CHECKING:
    from srtm.control.liveness import LiveBrokers

#: Events a topic keeps (the latest): a flood of joins or plan changes must not grow the
#: state, its saved row or the console's answer without bound.
MAX_EVENTS = 200

#: Publishers one topic may have (a bigger topic is refused with 413): placement and
#: re-placement are linear to quadratic in it, and run on a thread or in the tick.
MAX_PUBLISHERS = 100_000

#: The lease a broker gets, as a fraction of ``broker_timeout_s``: a broker cut off from
#: the controller holds its topics before the controller marks it down and gives its
#: shares away, with room for the time a request takes on the way.
LEASE_FRACTION = 0.6


@dataclass(frozen=True)
class Resources:
    """A broker's resources over its last report interval (``documents.BrokerResources``):
    ``cpu`` (fraction of one core), ``egress_bps``, and the resources it flags congested."""

    cpu: float = 0.0
    egress_bps: float = 0.0
    congested: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Resources:
        flags = doc.get("congested") or {}
        return cls(
            float(doc.get("cpu", 0.0)),
            float(doc.get("egress_bps", 0.0)),
            frozenset(r for r, on in flags.items() if on is True),
        )


@dataclass
class BrokerInfo:
    id: str
    tcp_address: str
    http_address: str
    mcap: float
    #: The host it runs on (``srtm node`` runs several brokers under one host id);
    #: empty: its own id, one host per broker (a broker that does not tell one).
    host: str = ""
    #: Last reported message rate over all its topics (msg/s).
    load: float = 0.0
    #: On the controller's *awake* clock (``ControllerState.awake``), not wall time: a
    #: stall of the controller itself never counts as the broker's silence.
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
    #: Its resources over its last report interval, None until a broker that tells them
    #: reports.
    resources: Resources | None = None
    #: Per topic: consumers per class that asked for it (connected or waiting).
    demand: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per topic: bytes of the messages ``arrived`` counts.
    arrived_bytes: dict[str, int] = field(default_factory=dict)
    #: Per persisted topic: mean ms from a publish's arrival to its disk write over
    #: the last report interval (absent: none waited for the disk).
    storage_latency_ms: dict[str, float] = field(default_factory=dict)
    #: Per topic: the sub-bucket it shaped with at its last report (held or unmanaged
    #: topics absent): what a repair of another broker's share must leave room for.
    #: None: unknown, no report since it registered or since this controller read its
    #: state (a new leader, a restart): it may shape by a plan older than the one read.
    shares: dict[str, BucketParams] | None = None

    def __post_init__(self) -> None:
        if not self.host:
            self.host = self.id

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
        r = self.resources or Resources()
        return r.cpu, r.egress_bps

    def http_endpoint(self) -> tuple[str, int]:
        """Host and port of its HTTP API, parsed (URLs are built from these parts)."""
        return parse_address(self.http_address, "http_address")


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


class FitState(Enum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass
class FittingProgress:
    """Online fitting's progress (``documents.FittingStatus``): only ``state`` until the
    search is set up (``started``), then its rounds; ``outcome`` and ``note`` once done."""

    state: FitState = FitState.RUNNING
    started: bool = False
    iteration: int = 0
    round: int = 0
    rounds: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    full: list[str] = field(default_factory=list)
    iteration_brokers: list[str] | None = None
    outcome: FitOutcome | None = None
    note: str | None = None

    @property
    def running(self) -> bool:
        return self.state is FitState.RUNNING

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"state": self.state.value}
        if self.started:
            doc |= {"iteration": self.iteration, "round": self.round, "rounds": self.rounds,
                    "steps": [_step_json(s) for s in self.steps], "full": self.full}  # fmt: skip
        if self.iteration_brokers is not None:
            doc["iteration_brokers"] = self.iteration_brokers
        if self.outcome is not None:
            doc["outcome"] = self.outcome.value
        if self.note is not None:
            doc["note"] = self.note
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FittingProgress:
        brokers, outcome = doc.get("iteration_brokers"), doc.get("outcome")
        return cls(
            FitState(doc["state"]),
            "iteration" in doc,
            int(doc.get("iteration", 0)),
            int(doc.get("round", 0)),
            list(doc.get("rounds", [])),
            [_step(s) for s in doc.get("steps", [])],
            list(doc.get("full", [])),
            None if brokers is None else list(brokers),
            None if outcome is None else FitOutcome(outcome),
            doc.get("note"),
        )


def _step_json(s: Step) -> dict[str, Any]:
    """A measurement as served (``documents.FittingStep``: no p99 is null)."""
    p99 = s.p99_ms if math.isfinite(s.p99_ms) else None
    return asdict(s) | {"verdict": s.verdict.value, "p99_ms": p99}


def _step(doc: Mapping[str, Any]) -> Step:
    p99 = doc["p99_ms"]
    return Step(
        doc["iteration"], doc["round"], doc["broker"], doc["publishers"],
        math.nan if p99 is None else float(p99), doc["samples"], Verdict(doc["verdict"]),
    )  # fmt: skip


@dataclass(frozen=True)
class AllocationState:
    """A topic's part of the optimizer's last run (``srtm.utility.cluster.flow_doc``),
    when it ran and whether it was feasible (``documents.TopicAllocation``)."""

    name: str
    rate: float
    admitted: dict[str, int]
    utility: float
    t_s: float
    feasible: bool

    def to_json(self, current_rate: float) -> dict[str, Any]:
        """As served, with the rate rate control gave the topic since."""
        return {"name": self.name, "rate": self.rate, "admitted": self.admitted,
                "utility": self.utility, "t_s": self.t_s, "feasible": self.feasible,
                "current_rate": current_rate}  # fmt: skip


@dataclass(frozen=True)
class TopicUtility:
    """A topic's utility spec (``srtm.utility.cluster``: one flow of ``srtm utility
    optimize``'s document without name and brokers): ``doc`` as the user sent it, which
    is what is served and saved (unchanged, so what was saved restores as it was), and
    ``flow``, the spec parsed once, which the optimizer reads at every run."""

    doc: dict[str, Any]
    #: None only for a saved spec that this version no longer accepts: it is kept,
    #: served and saved as it came, but the optimizer leaves the topic alone.
    flow: FlowSpec | None

    @classmethod
    def parse(cls, doc: dict[str, Any], topic: str) -> TopicUtility:
        """A spec as given, checked (ValueError naming ``utility.…``)."""
        return cls(doc, parse_topic_utility(doc, topic))

    @classmethod
    def from_json(cls, doc: dict[str, Any], topic: str) -> TopicUtility:
        """A saved spec: never refused (a restore must not fail on one that an older
        version accepted), unparsed if this version cannot read it."""
        try:
            return cls.parse(doc, topic)
        except ValueError:
            return cls(doc, None)

    def to_json(self) -> dict[str, Any]:
        return self.doc


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
    fitting: FittingProgress | None = None
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
    #: Its utility spec; None: the optimizer leaves it alone.
    utility: TopicUtility | None = None
    #: Its part of the optimizer's last run (not saved).
    allocation: AllocationState | None = None
    #: The bound on what waits behind its sub-buckets and its overflow policy (every
    #: broker shaping it polices by it: ``srtm.ratelimit.overflow``).
    bound: Bound = DEFAULT_BOUND
    #: Its running sums (``plans.sums``) and the shape of the publishers and assignment
    #: they were taken over; the shape at the last ``Routing.note_plan``.
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
        if self.fitting is not None and self.fitting.running:
            return "fitting"
        return "short" if self.unassigned else "placed"


@dataclass
class ControllerState:
    """The fields the concept modules read and change: settings, brokers, topics, the
    awake clock's record and nsqlookupd's registry."""

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
    #: With etcd: the brokers holding a live key (``srtm.control.liveness``; not
    #: persisted): they are not down for silence, and one whose key goes is down.
    live: LiveBrokers | None = None

    @property
    def lease_s(self) -> float:
        """How long a broker may shape by its shares without word from the controller."""
        return self.broker_timeout_s * LEASE_FRACTION

    def awake(self, now: float) -> float:
        """The controller's own clock: ``now`` less the time it was stalled."""
        return now - self.stalled_s

    def up(self) -> list[BrokerInfo]:
        return [b for b in self.brokers.values() if not b.down]

    def topic(self, name: str) -> TopicState:
        """The topic (404 if there is none)."""
        topic = self.topics.get(name)
        if topic is None:
            raise ControlError(404, f"topic {name!r} does not exist")
        return topic

    def changeable(self, name: str) -> TopicState:
        """The topic, if a lifecycle change may touch it now (404; 409 while fitting:
        fitting owns the plan until it is done)."""
        topic = self.topic(name)
        if topic.status == "fitting":
            raise ControlError(409, f"topic {name!r} is being fitted; try again when done")
        return topic


def bucket_json(p: BucketParams | None) -> dict[str, float] | None:
    """A sub-bucket as served and saved (None: none)."""
    return None if p is None else {"rate": p.rate, "burst": p.burst}
