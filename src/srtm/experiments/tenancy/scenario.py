"""The multi-tenant scenario: topics with different SLOs, rates and correlation arriving
over time on capacity-limited brokers, one deleted midway, one whose sensors join one by
one; and the replay of its placement decisions on the capacity ledger.

``paper_scale()`` is the simulated scenario (the paper's brokers: 20 of 110 kmsg/s),
``live_scale()`` the one run on local brokers. ``replay`` takes a scenario's events in
order and places each on the ledger the previous ones left (``srtm.placement``): a topic
as a whole when created, a joining sensor incrementally, a deletion freeing its share.
It records every broker's ledger after every event. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from srtm.placement import (
    LedgerEntry,
    Policy,
    PublisherLoad,
    TopicSpec,
    for_topic,
    join,
    ledger,
    place,
)
from srtm.ratelimit import BucketParams, split_floored
from srtm.workload import PublisherSpec


@dataclass(frozen=True)
class Tenant:
    """One topic of the scenario: its sensors (``publishers`` of ``rate`` msg/s each, in
    correlation groups of ``group`` firing together; 0: independent) and its lifetime."""

    name: str
    slo_p99_ms: float
    publishers: int
    rate: float
    process: Literal["poisson", "periodic"]
    batch: int
    group: int
    arrive_s: float
    delete_s: float | None = None
    #: Sensors join one by one this far apart, the first at ``arrive_s`` (None: all at once).
    join_every_s: float | None = None

    def specs(self) -> list[PublisherSpec]:
        return [
            PublisherSpec(
                f"{self.name}-s{i}",
                self.rate,
                self.process,
                self.batch,
                f"g{i // self.group}" if self.group else None,
            )
            for i in range(self.publishers)
        ]

    @property
    def load(self) -> float:
        return self.publishers * self.rate

    @property
    def kind(self) -> str:
        corr = f"groups of {self.group}" if self.group else "independent"
        return f"{self.process} ×{self.batch}, {corr}"


@dataclass(frozen=True)
class TenancyScenario:
    name: str
    brokers: int
    mcap: float
    tenants: tuple[Tenant, ...]
    #: Per-broker processing capacity of the live brokers (``--capacity``); 0 in the sim.
    capacity: float = 0.0
    #: How much slower in time than ``live_scale`` writes it this scenario runs
    #: (``scaled``): rates were multiplied by it and queueing durations divided by it.
    time_scale: float = 1.0

    def broker_ids(self) -> list[str]:
        return [f"b{i + 1}" for i in range(self.brokers)]

    @property
    def deleted(self) -> Tenant:
        return next(t for t in self.tenants if t.delete_s is not None)

    @property
    def joining(self) -> Tenant:
        return next(t for t in self.tenants if t.join_every_s is not None)


# -- the two scales ------------------------------------------------------------------------
#: (process, batch, group size, SLO ms): the kinds of tenant, from smooth to bursty.
KINDS: tuple[tuple[Literal["poisson", "periodic"], int, int, float], ...] = (
    ("poisson", 10, 0, 5.0),  # meters: independent readings
    ("periodic", 10, 10, 10.0),  # alarms: groups of 10 in lockstep
    ("poisson", 10, 5, 3.0),  # telemetry: small correlated groups
    ("periodic", 10, 0, 2.0),  # tracking: periodic, independent, the tightest SLO
    ("poisson", 10, 20, 20.0),  # events: large bursts, loose SLO
    ("periodic", 10, 5, 3.0),  # control: small lockstep groups
)
#: Sensors per tenant (10 msg/s each), cycled: 2–50 kmsg/s per topic.
SIZES = (600, 2_400, 1_200, 4_000, 300, 1_800, 3_000, 900, 5_000, 1_500, 2_000)


def paper_scale(topics: int = 54) -> TenancyScenario:
    """The paper's brokers (20 of 110 kmsg/s, 10 msg/s sensors): ``topics`` tenants, one
    a second; the 11th deleted midway; the 6th's 1,000 sensors join one by one."""
    if topics < 12:
        raise ValueError(f"the scenario needs at least 12 topics, got {topics}")
    tenants = []
    for i in range(topics):
        process, batch, group, slo = KINDS[i % len(KINDS)]
        t = Tenant(f"t{i:02d}", slo, SIZES[i % len(SIZES)], 10.0, process, batch, group, float(i))
        if i == 5:
            t = replace(t, publishers=1_000, join_every_s=(topics - 10) / 1_000)
        if i == 10:
            t = replace(t, delete_s=(10 + topics) / 2)
        tenants.append(t)
    return TenancyScenario("multi-tenant", 20, 110_000.0, tuple(tenants))


def live_scale() -> TenancyScenario:
    """Three brokers of 2,000 msg/s (``mcap`` 1,200) on this machine; six tenants of
    10 msg/s sensors (2,400 msg/s, 2,640 promised: three quarters of the fleet's ``mcap``,
    so brokers take two topics each) arriving over 25 s, the 3rd deleted at 30 s, the
    4th's 20 sensors joining one a second."""
    tenants = (
        Tenant("meters", 40.0, 40, 10.0, "poisson", 1, 0, 0.0),
        Tenant("alarms", 60.0, 60, 10.0, "periodic", 1, 10, 5.0),
        Tenant("telemetry", 30.0, 30, 10.0, "poisson", 1, 5, 10.0, delete_s=30.0),
        Tenant("sensors", 50.0, 20, 10.0, "poisson", 1, 0, 15.0, join_every_s=1.0),
        Tenant("tracking", 25.0, 50, 10.0, "periodic", 1, 0, 20.0),
        Tenant("events", 80.0, 40, 10.0, "poisson", 1, 20, 25.0),
    )
    return TenancyScenario("multi-tenant", 3, 1_200.0, tenants, capacity=2_000.0)


def scaled(sc: TenancyScenario, s: float) -> TenancyScenario:
    """``sc`` slowed in time by ``s`` (0 < s <= 1) for a slower machine, as
    ``srtm.experiments.sizing.scaled`` slows a live scenario: every rate (the sensors',
    the brokers' ``capacity`` and ``mcap``) × s, every SLO ÷ s, so that each topic's SLO in
    the brokers' service times, its sensors, groups and bucket in tokens, and which topics
    fit on which broker (its load ratio) are unchanged. The emulator's lateness limit
    follows ``time_scale`` (``tenancy.live.max_late_s``).

    The timeline stays in wall seconds: arrivals 5 s apart, sensors joining a second
    apart, the deletion at 30 s, the settling and tail times. They are the scenario's
    shape and the control plane's times (a plan reaching the emulator, a subscriber
    connecting, ``GET /brokers`` each second), not queueing ones: a topic's bucket starts
    full, so nothing queued needs the 2 s of settling, and the longest memory of its
    queueing, a drained bucket refilling (b / r: 15-500 ms at full scale, 1 s at most at
    0.5, a machine half as fast), stays well inside the 5 s between arrivals and the
    2 s of settling. Kept, a slowed run takes as long as the full
    one and each topic's p99 comes from s times its messages (the fewest, ``sensors``,
    about 2,700 at full scale: 1,350 at 0.5)."""
    if not (0 < s <= 1):
        raise ValueError(f"scale must be in (0, 1], got {s!r}")
    if s == 1:
        return sc
    tenants = tuple(
        # Three significant digits, as sizing.scaled: 41.7 ms, not 41.666…
        replace(t, rate=t.rate * s, slo_p99_ms=float(f"{t.slo_p99_ms / s:.3g}"))
        for t in sc.tenants
    )
    return replace(
        sc, mcap=sc.mcap * s, capacity=sc.capacity * s, tenants=tenants,
        time_scale=sc.time_scale * s,
    )  # fmt: skip


# -- events --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    t_s: float
    what: Literal["create", "join", "delete"]
    topic: str
    #: The sensors the event brings (create: those present at once; join: the one).
    publishers: tuple[PublisherSpec, ...] = ()


def events(sc: TenancyScenario) -> list[Event]:
    """The scenario's events in time order (creations before joins at the same time)."""
    out: list[Event] = []
    for t in sc.tenants:
        specs = t.specs()
        if t.join_every_s is None:
            out.append(Event(t.arrive_s, "create", t.name, tuple(specs)))
        else:
            out.append(Event(t.arrive_s, "create", t.name, tuple(specs[:1])))
            out += [
                Event(t.arrive_s + i * t.join_every_s, "join", t.name, (s,))
                for i, s in enumerate(specs[1:], 1)
            ]
        if t.delete_s is not None:
            out.append(Event(t.delete_s, "delete", t.name))
    order = {"create": 0, "join": 1, "delete": 2}
    return sorted(out, key=lambda e: (e.t_s, order[e.what]))


# -- the replay ----------------------------------------------------------------------------
@dataclass
class TenantPlan:
    """One topic's plan in the replay: the envelope declared for all its sensors, those
    joined, where each went and the sub-buckets."""

    declared: TopicSpec
    joined: list[PublisherLoad] = field(default_factory=list)
    assignment: dict[str, list[PublisherLoad]] = field(default_factory=dict)
    buckets: dict[str, BucketParams] = field(default_factory=dict)
    unassigned: list[PublisherLoad] = field(default_factory=list)
    problem: str | None = None

    def current(self) -> TopicSpec:
        """The declared rate in proportion to the sensors joined so far (what capacity
        must cover), the declared burst whole: a group's burst is as large with one group
        joined as with all of them."""
        part = self.declared.with_publishers(self.joined)
        return replace(part, burst=self.declared.burst)

    def resplit(self) -> None:
        """Sub-buckets by assigned rate, as the controller splits (``plans.new_plan``)."""
        self.assignment = {b: ps for b, ps in self.assignment.items() if ps}
        rates = [math.fsum(p.rate for p in ps) for ps in self.assignment.values()]
        spec = self.current()
        placed = math.fsum(rates) / spec.load if spec.load else 0.0
        self.buckets, self.problem = {}, None
        if not rates:
            return
        try:
            parts = split_floored(spec.rate * placed, max(1.0, spec.burst * placed), rates)
        except ValueError as exc:
            self.problem = f"no sub-buckets: {exc}"
            return
        self.buckets = dict(zip(self.assignment, parts, strict=True))


@dataclass(frozen=True)
class LedgerSample:
    t_s: float
    event: str
    allocated: dict[str, float]


@dataclass
class Replay:
    policy: Policy
    plans: dict[str, TenantPlan] = field(default_factory=dict)
    samples: list[LedgerSample] = field(default_factory=list)
    #: Every broker a topic's plan used at any time, per topic.
    used: dict[str, set[str]] = field(default_factory=dict)


def book(sc: TenancyScenario, plans: dict[str, TenantPlan]) -> list[LedgerEntry]:
    """The ledger of ``sc``'s brokers with ``plans`` (nothing measured: the sim's traffic
    is what was promised)."""
    return ledger(((b, sc.mcap, 0.0) for b in sc.broker_ids()), (p.buckets for p in plans.values()))


def replay(
    sc: TenancyScenario,
    policy: Policy,
    declared: dict[str, TopicSpec],
    *,
    seed: int = 0,
    until_s: float = math.inf,
) -> Replay:
    """``sc``'s events up to ``until_s`` under ``policy``; ``declared``: each topic's
    envelope for all its sensors (``(r, b)``, SLO)."""
    rep = Replay(policy)
    for ev in events(sc):
        if ev.t_s > until_s:
            break
        apply(sc, rep, ev, declared[ev.topic], seed)
        entries = book(sc, rep.plans)
        rep.samples.append(
            LedgerSample(ev.t_s, f"{ev.what} {ev.topic}", {e.id: e.allocated for e in entries})
        )
        if ev.topic in rep.plans:
            rep.used.setdefault(ev.topic, set()).update(rep.plans[ev.topic].assignment)
    return rep


def apply(sc: TenancyScenario, rep: Replay, ev: Event, declared: TopicSpec, seed: int) -> None:
    """One event on the replay's plans, decided as the controller decides it: a new topic
    placed whole by ``place`` on the ledger, a joining sensor by ``join`` beside the
    topic's sensors already placed (nobody moves), a deletion freeing its share."""
    loads = [PublisherLoad(p.id, p.rate, p.group) for p in ev.publishers]
    if ev.what == "delete":
        rep.plans.pop(ev.topic, None)
        return
    others = book(sc, {n: p for n, p in rep.plans.items() if n != ev.topic})
    fleet = [e.capacity() for e in others]
    if ev.what == "create":
        plan = rep.plans[ev.topic] = TenantPlan(declared, list(loads))
        spec = plan.current()
        placed = place(rep.policy, for_topic(spec, fleet), spec, seed)
        by_id = {p.id: p for p in loads}
        plan.assignment = {a.broker: [by_id[p] for p in a.publishers] for a in placed.assignments}
        plan.unassigned = [by_id[p] for p in placed.unassigned]
        plan.resplit()
        return
    plan = rep.plans[ev.topic]
    plan.joined += loads
    spec = plan.current()
    joined = join(rep.policy, fleet, plan.assignment, loads, spec.rate / spec.load)
    by_id = {p.id: p for p in loads}
    for b, ids in joined.placed.items():
        plan.assignment.setdefault(b, []).extend(by_id[i] for i in ids)
    plan.unassigned += [by_id[i] for i in joined.unassigned]
    plan.resplit()


def active_at(sc: TenancyScenario, t_s: float) -> Iterator[Tenant]:
    """The tenants that exist at ``t_s``."""
    for t in sc.tenants:
        if t.arrive_s <= t_s and (t.delete_s is None or t_s < t.delete_s):
            yield t
