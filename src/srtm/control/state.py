"""The controller's state and decisions, with no I/O: brokers, topics, plans.

Every method takes the controller's clock (``now``, seconds) and returns the actions for
the service to carry out (set a broker's sub-bucket; a plan changed). The service
persists ``to_json()`` after each change and rebuilds with ``from_json`` on restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from srtm.placement import AdaptorSettings, Broker, Policy, Publisher, Report, Topic, adapt, place
from srtm.ratelimit import BucketParams, merge, split_floored


@dataclass
class BrokerInfo:
    id: str
    tcp_address: str
    http_address: str
    mcap: float
    #: Last reported message rate over all its topics (msg/s).
    load: float = 0.0
    last_seen_s: float = -math.inf
    down: bool = False
    #: Per topic: the TB Adaptor's inputs from its last report.
    reports: dict[str, Report] = field(default_factory=dict)


@dataclass
class TopicState:
    spec: Topic
    policy: Policy
    version: int = 0
    #: broker id -> publisher ids
    assignment: dict[str, list[str]] = field(default_factory=dict)
    buckets: dict[str, BucketParams] = field(default_factory=dict)
    unassigned: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    #: Online fitting's progress (None: not asked for).
    fitting: dict[str, Any] | None = None
    #: The plan version the TB Adaptor last saw, and until when it leaves it alone.
    adapted_version: int = 0
    adapt_after_s: float = 0.0

    @property
    def status(self) -> str:
        if self.fitting is not None and self.fitting.get("state") == "running":
            return "fitting"
        return "short" if self.unassigned else "placed"


@dataclass(frozen=True, slots=True)
class SetBucket:
    broker: str
    topic: str
    bucket: BucketParams


@dataclass(frozen=True, slots=True)
class PlanChanged:
    topic: str
    version: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """Tell ``publisher``, through its current broker, to move to ``to`` (TCP address)."""

    broker: str
    topic: str
    publisher: str
    to: str
    version: int


Action = SetBucket | PlanChanged | Migrate


class ControlError(ValueError):
    """A request the controller refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Controller:
    broker_timeout_s: float = 5.0
    adaptor: AdaptorSettings = field(default_factory=AdaptorSettings)
    seed: int = 0
    brokers: dict[str, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicState] = field(default_factory=dict)

    # -- brokers -------------------------------------------------------------------------
    def register(
        self, broker_id: str, tcp: str, http: str, mcap: float, now: float
    ) -> list[Action]:
        if not broker_id:
            raise ControlError(400, "id must be a non-empty string")
        if not (isinstance(mcap, int | float) and math.isfinite(mcap) and mcap > 0):
            raise ControlError(400, f"mcap must be a number > 0, got {mcap!r}")
        info = self.brokers.get(broker_id)
        if info is None:
            info = self.brokers[broker_id] = BrokerInfo(broker_id, tcp, http, float(mcap))
        info.tcp_address, info.http_address, info.mcap = tcp, http, float(mcap)
        info.last_seen_s, info.down = now, False
        # A broker that (re)starts has lost its sub-buckets: send it its shares again.
        return [
            SetBucket(broker_id, name, t.buckets[broker_id])
            for name, t in self.topics.items()
            if broker_id in t.buckets
        ]

    def report(
        self, broker_id: str, load: float, topics: dict[str, tuple[float, float]], now: float
    ) -> None:
        info = self.brokers.get(broker_id)
        if info is None:
            raise ControlError(404, f"broker {broker_id!r} is not registered")
        info.load, info.last_seen_s, info.down = load, now, False
        for name, (rate, backlog) in topics.items():
            info.reports[name] = Report(rate, backlog, now)

    def up(self) -> list[BrokerInfo]:
        return [b for b in self.brokers.values() if not b.down]

    # -- topics --------------------------------------------------------------------------
    def create_topic(self, spec: Topic, policy: Policy, now: float) -> list[Action]:
        if spec.name in self.topics:
            raise ControlError(409, f"topic {spec.name!r} exists")
        fleet = [Broker(b.id, b.mcap, b.load) for b in self.up()]
        if not fleet:
            raise ControlError(503, "no broker is registered and up")
        topic = self.topics[spec.name] = TopicState(spec, policy)
        placement = place(policy, fleet, spec, self.seed)
        for a in placement.assignments:
            topic.assignment[a.broker] = list(a.publishers)
        topic.unassigned = list(placement.unassigned)
        topic.events.append(
            f"placed with {policy} on {', '.join(placement.brokers) or 'no broker'}"
            + (f"; shortfall {placement.shortfall:.6g} msg/s" if placement.shortfall else "")
        )
        return self._new_plan(topic)

    def _new_plan(self, topic: TopicState) -> list[Action]:
        """Re-split the topic's bucket over its brokers by assigned rate; a new version."""
        rate_of = {p.id: p.rate for p in topic.spec.publishers}
        rates = {b: math.fsum(rate_of[p] for p in ps) for b, ps in topic.assignment.items() if ps}
        topic.assignment = {b: topic.assignment[b] for b in rates}
        topic.version += 1
        topic.buckets = {}
        if rates:
            spec = topic.spec
            placed = 1.0 if not topic.unassigned else math.fsum(rates.values()) / spec.load
            try:
                parts = split_floored(
                    spec.rate * placed, max(1.0, spec.burst * placed), list(rates.values())
                )
            except ValueError as exc:
                topic.events.append(f"no sub-buckets: {exc}")
                parts = []
            topic.buckets = dict(zip(rates, parts, strict=False))
        actions: list[Action] = [
            SetBucket(b, topic.spec.name, bucket) for b, bucket in topic.buckets.items()
        ]
        return [*actions, PlanChanged(topic.spec.name, topic.version)]

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

    # -- time ----------------------------------------------------------------------------
    def tick(self, now: float) -> list[Action]:
        """Mark silent brokers down (placing their publishers again), then run the TB
        Adaptor on every topic."""
        actions: list[Action] = []
        for info in self.brokers.values():
            if not info.down and now - info.last_seen_s > self.broker_timeout_s:
                info.down = True
                actions += self._broker_down(info.id)
        for topic in self.topics.values():
            actions += self._adapt(topic, now)
        return actions

    def _broker_down(self, broker_id: str) -> list[Action]:
        actions: list[Action] = []
        fleet = [Broker(b.id, b.mcap, b.load) for b in self.up()]
        for topic in self.topics.values():
            orphans = topic.assignment.pop(broker_id, None)
            if not orphans:
                continue
            by_id = {p.id: p for p in topic.spec.publishers}
            pool: list[Publisher] = [by_id[p] for p in orphans]
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

    def _adapt(self, topic: TopicState, now: float) -> list[Action]:
        if topic.version != topic.adapted_version:  # a new plan: let the windows refill
            topic.adapted_version = topic.version
            topic.adapt_after_s = now + self.adaptor.settle_s
        if len(topic.buckets) < 2 or now < topic.adapt_after_s:
            return []
        reports = {
            b: self.brokers[b].reports[topic.spec.name]
            for b in topic.buckets
            if b in self.brokers and topic.spec.name in self.brokers[b].reports
        }
        total = merge(topic.buckets.values())
        new = adapt(total, topic.buckets, reports, now, self.adaptor)
        changed = [b for b in new if new[b] != topic.buckets[b]]
        topic.buckets = new
        return [SetBucket(b, topic.spec.name, new[b]) for b in changed]

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

    def assign(self, name: str, publisher: str) -> dict[str, Any]:
        topic = self._topic(name)
        for b, ps in topic.assignment.items():
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
            "publishers": len(topic.spec.publishers),
            "events": topic.events,
            "fitting": topic.fitting,
        }

    def topic_brokers(self, name: str) -> list[BrokerInfo]:
        topic = self.topics.get(name)
        return [] if topic is None else [self.brokers[b] for b in topic.assignment]

    # -- persistence ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "brokers": [
                {"id": b.id, "tcp_address": b.tcp_address, "http_address": b.http_address,
                 "mcap": b.mcap}
                for b in self.brokers.values()
            ],
            "topics": [
                {
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
                }
                for t in self.topics.values()
            ],
        }  # fmt: skip

    def restore(self, doc: dict[str, Any], now: float) -> None:
        """Rebuild from ``to_json``; brokers get a full timeout to report again."""
        for b in doc.get("brokers", []):
            self.brokers[b["id"]] = BrokerInfo(
                b["id"], b["tcp_address"], b["http_address"], b["mcap"], last_seen_s=now
            )
        for t in doc.get("topics", []):
            pubs = tuple(Publisher(p["id"], p["rate"], p.get("group")) for p in t["publishers"])
            spec = Topic(t["name"], pubs, t["burst"], t["slo_p99_ms"], t["rate"])
            self.topics[spec.name] = TopicState(
                spec,
                t["policy"],
                t["version"],
                {b: list(ps) for b, ps in t["assignment"].items()},
                {b: BucketParams(x["rate"], x["burst"]) for b, x in t["buckets"].items() if x},
                list(t["unassigned"]),
                list(t.get("events", [])),
                _interrupted(t.get("fitting")),
            )


def _interrupted(fitting: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fitting that was running when the controller stopped is not running any more."""
    if fitting is not None and fitting.get("state") == "running":
        return fitting | {"state": "interrupted"}
    return fitting


def _bucket(p: BucketParams | None) -> dict[str, float] | None:
    return None if p is None else {"rate": p.rate, "burst": p.burst}
