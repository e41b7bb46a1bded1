"""The rebalancer: Dynamoth's load-balancing loop as a pure function of loads and plans.

``rebalance(state, settings, now)`` returns decisions (``Relocate``, ``Replicate``,
``Unreplicate``, ``Spawn``, ``Despawn``); it performs none. Pure: no I/O, time injected.

- **Load ratio** (LR) of a broker: the worst of ingress (the ledger's ``max(allocated,
  measured)`` against ``mcap``), egress (bytes/s out, fan-out included, against
  ``egress_max``) and CPU (a fraction). Inputs are averages over ``window_s``
  (``LoadAverager`` makes them from reports).
- **Channel level first** (Dynamoth's Algorithm 1, ALL_PUBLISHERS only): a topic on one
  broker whose egress is more than ``target`` × that broker's ``egress_max`` gets replicas
  that each receive the whole stream and serve a share of the subscribers; one no longer
  needed is removed. An overloaded home of several replicated topics widens the one that
  sends the most out of it, one replica at a time (each topic was sized alone).
  ALL_SUBSCRIBERS is SRTM's split itself: a slice ``Relocate`` to a broker outside the plan.
- **Overload** (Algorithm 2): a broker with ``LR > overload``, or an SLO violated for
  ``slo_windows`` consecutive windows, sheds topic parts until ``LR < target``. Whole
  parts first: the busiest part that some broker can take whole (brokers already carrying
  the topic first, then the least loaded: concentration), so small whole topics move
  before a big one is split (a split part first on an SLO-overloaded broker: it is the
  one paying the DRL penalty). Only when no part can move whole, a slice sized to the
  roomiest broker's room, taking every correlation group in proportion (``fill_by_group``),
  never leaving a part below ``min_slice_share`` of the topic on either side (a sliver
  would pay a large DRL penalty); and only of a part that no new broker could take whole
  either (or when the cluster is at ``max_brokers``): otherwise the part waits for the
  spawn. No destination is ever filled past ``target``, and none whose SLO is being
  violated gets anything.
- **Spawn** when a broker that was over ``overload`` is still at ``target`` or above
  after shedding because no broker could take a part whole and stay under ``target``
  (Dynamoth's code: no server under 0.60 can take the load); **despawn** the
  least-loaded broker (moving all its parts away) when no broker is overloaded and the
  average LR would stay under ``despawn_below`` without it; only a ``stoppable`` broker
  is a candidate (one that cannot be given back never blocks one that can).
  ``min_brokers`` and ``max_brokers`` bound both.
- A topic changed less than ``min_plan_interval_s`` ago is not touched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from srtm.placement.ledger import LedgerEntry, for_topic
from srtm.placement.model import BrokerCapacity, PublisherLoad, TopicSpec
from srtm.placement.policies import fill_by_group

__all__ = [
    "BrokerWindow",
    "Decision",
    "Despawn",
    "LoadAverager",
    "RebalanceSettings",
    "RebalanceState",
    "Relocate",
    "Replicate",
    "Spawn",
    "TopicLoad",
    "Unreplicate",
    "apply",
    "egress_of",
    "ingress_of",
    "load_ratios",
    "rebalance",
]

_EPS = 1e-9
ReplicationKind = Literal["all_subscribers", "all_publishers"]


# -- inputs ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BrokerWindow:
    """One broker's loads averaged over the window: ingress msg/s, egress bytes/s, CPU
    fraction, and how many consecutive windows ended with an SLO violated on it."""

    id: str
    mcap: float
    ingress: float = 0.0
    egress: float = 0.0
    cpu: float = 0.0
    slo_streak: int = 0
    #: This broker's maximum egress (bytes/s); None: the settings' ``egress_max``.
    egress_max: float | None = None
    #: Whether it may be despawned (the controller: its provisioner can stop it; a broker
    #: started some other way cannot). It still takes and sheds load either way.
    stoppable: bool = True


@dataclass(frozen=True, slots=True)
class TopicLoad:
    """A topic as the rebalancer sees it: its spec (publishers with rates and groups,
    ``(r, b)``), fan-out, message size and current plan."""

    spec: TopicSpec
    #: Broker -> the publishers that publish there.
    plan: Mapping[str, tuple[str, ...]]
    #: Copies each message is delivered to (channels × their consumers' share: fan-out).
    subscribers: int = 1
    message_bytes: float = 100.0
    #: ALL_PUBLISHERS replicas besides the plan's broker: each gets the whole stream.
    replicas: tuple[str, ...] = ()
    #: When its plan last changed (s, the caller's clock); None: long ago.
    last_change_s: float | None = None
    # Derived once (the rebalancer reads them in its inner loops): the load, per broker.
    _load: float = field(init=False, repr=False, compare=False)
    _parts: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rates = {p.id: p.rate for p in self.spec.publishers}
        parts = {b: math.fsum(rates.get(p, 0.0) for p in ps) for b, ps in self.plan.items()}
        object.__setattr__(self, "_load", self.spec.load)
        object.__setattr__(self, "_parts", parts)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def load(self) -> float:
        """Its publishers' total rate (msg/s)."""
        return self._load

    @property
    def scale(self) -> float:
        """What the ledger counts per msg/s of publisher rate (``r / load``)."""
        return self.spec.rate / self._load if self._load > 0 else 1.0

    def part(self, broker: str) -> float:
        """Publisher msg/s the plan sends to ``broker``."""
        return self._parts.get(broker, 0.0)

    def carriers(self) -> tuple[str, ...]:
        """Brokers carrying the topic: the plan's, then the replicas."""
        return tuple(dict.fromkeys([*self.plan, *self.replicas]))


@dataclass(frozen=True, slots=True)
class RebalanceState:
    brokers: tuple[BrokerWindow, ...]
    topics: tuple[TopicLoad, ...] = ()
    #: Brokers already being started (a spawn decided earlier, not registered yet).
    spawning: int = 0


@dataclass(frozen=True, slots=True)
class RebalanceSettings:
    #: LR above this is an overload (Dynamoth slides: 80 %).
    overload: float = 0.80
    #: Shed until LR is below this; never fill a destination past it (Dynamoth code: 0.60).
    target: float = 0.60
    #: Loads are averaged over this many seconds (Dynamoth code: 10 s).
    window_s: float = 10.0
    #: At most one plan change per topic in this many seconds (Dynamoth code: 20 s).
    min_plan_interval_s: float = 20.0
    #: A broker's maximum egress, bytes/s (ours: 1 Gbit/s, a common NIC).
    egress_max: float = 125e6
    #: Consecutive windows with an SLO violated that make an overload (issue 18).
    slo_windows: int = 2
    #: Despawn when the average LR without the least-loaded broker stays below this.
    despawn_below: float = 0.60
    min_brokers: int = 1
    max_brokers: int = 64
    #: No move leaves a broker with less than this share of a topic's load (a sliver):
    #: ours, a fifth is as thin as a 5-way equal split (see docs/controller.md).
    min_slice_share: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.target < self.overload:
            raise ValueError(f"need 0 < target < overload, got {self.target}, {self.overload}")
        if not 0 <= self.min_slice_share <= 0.5:
            raise ValueError(f"min_slice_share must be in [0, 0.5], got {self.min_slice_share}")
        if not 1 <= self.min_brokers <= self.max_brokers:
            raise ValueError(
                f"need 1 <= min_brokers <= max_brokers, got {self.min_brokers}, {self.max_brokers}"
            )
        if self.window_s <= 0 or self.egress_max <= 0 or self.slo_windows < 1:
            raise ValueError("window_s, egress_max and slo_windows must be positive")


# -- decisions ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Relocate:
    """Relocate ``publishers`` of ``topic`` from broker ``source`` to broker ``to``."""

    topic: str
    publishers: tuple[str, ...]
    source: str
    to: str

    def to_json(self) -> dict[str, Any]:
        return {"action": "move", "topic": self.topic, "publishers": list(self.publishers),
                "from": self.source, "to": self.to}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Replicate:
    """Add broker ``to`` as a replica of ``topic``."""

    topic: str
    to: str
    kind: ReplicationKind = "all_publishers"

    def to_json(self) -> dict[str, Any]:
        return {"action": "replicate", "topic": self.topic, "to": self.to, "kind": self.kind}


@dataclass(frozen=True, slots=True)
class Unreplicate:
    """Remove replica ``source`` of ``topic``."""

    topic: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"action": "unreplicate", "topic": self.topic, "from": self.source}


@dataclass(frozen=True, slots=True)
class Spawn:
    n: int

    def to_json(self) -> dict[str, Any]:
        return {"action": "spawn", "n": self.n}


@dataclass(frozen=True, slots=True)
class Despawn:
    """Give ``broker`` back, once the moves off it (in the same decisions) are done."""

    broker: str

    def to_json(self) -> dict[str, Any]:
        return {"action": "despawn", "broker": self.broker}


Decision = Relocate | Replicate | Unreplicate | Spawn | Despawn


# -- the load model -------------------------------------------------------------------------
@dataclass(slots=True)
class _Load:
    """A broker's estimated loads while decisions are made."""

    window: BrokerWindow
    egress_max: float
    allocated: float
    ingress: float
    egress: float
    cpu: float
    #: CPU fraction per msg/s of ingress (what a message costs this broker).
    cpu_per_msg: float

    def ratio(self) -> float:
        mcap = self.window.mcap
        ingress = LedgerEntry(self.window.id, mcap, self.allocated, self.ingress).load / mcap
        return max(ingress, self.egress / self.egress_max, self.cpu)

    def add(self, topic: TopicLoad, msgs: float, cpu_per_msg: float) -> None:
        """Add ``msgs`` publisher msg/s of ``topic`` (negative: remove), with its fan-out."""
        self.allocated = max(0.0, self.allocated + msgs * topic.scale)
        self.ingress = max(0.0, self.ingress + msgs)
        self.cpu = max(0.0, self.cpu + msgs * cpu_per_msg)
        self.egress = max(0.0, self.egress + msgs * topic.subscribers * topic.message_bytes)


def egress_of(topic: TopicLoad, broker: str) -> float:
    """Bytes/s ``topic`` sends out of ``broker`` under its plan and replicas."""
    if topic.replicas:
        n = len(topic.carriers())
        share = topic.load if broker in topic.carriers() else 0.0
        return share * topic.subscribers / n * topic.message_bytes
    return topic.part(broker) * topic.subscribers * topic.message_bytes


def _allocated_of(topic: TopicLoad, broker: str) -> float:
    """What the ledger counts for ``topic`` on ``broker`` (its sub-bucket rate): a replica
    shapes with the whole ``r``; a split shares it in proportion to the publishers."""
    if topic.replicas:
        return topic.spec.rate if broker in topic.carriers() else 0.0
    return topic.part(broker) * topic.scale


def ingress_of(topic: TopicLoad, broker: str) -> float:
    """Publisher msg/s ``topic`` sends into ``broker`` (a replica takes the whole stream)."""
    if topic.replicas:
        return topic.load if broker in topic.carriers() else 0.0
    return topic.part(broker)


def _model(state: RebalanceState, settings: RebalanceSettings) -> dict[str, _Load]:
    loads = {}
    for b in state.brokers:
        allocated = math.fsum(_allocated_of(t, b.id) for t in state.topics)
        cpu_per_msg = b.cpu / b.ingress if b.ingress > 0 else 0.0
        loads[b.id] = _Load(
            b, b.egress_max or settings.egress_max, allocated, b.ingress, b.egress, b.cpu,
            cpu_per_msg,
        )  # fmt: skip
    return loads


def load_ratios(state: RebalanceState, settings: RebalanceSettings) -> dict[str, float]:
    """Each broker's load ratio: the worst of ingress (ledger load / ``mcap``), egress and
    CPU."""
    return {b: load.ratio() for b, load in _model(state, settings).items()}


# -- the rebalancer -------------------------------------------------------------------------
@dataclass(slots=True)
class _Pass:
    state: RebalanceState
    settings: RebalanceSettings
    now: float
    loads: dict[str, _Load]
    topics: dict[str, TopicLoad]
    decisions: list[Decision] = field(default_factory=list)
    changed: set[str] = field(default_factory=set)
    #: Some load could not move because no broker had room (the reason to spawn).
    short: bool = False
    #: Whether a spawn may add a broker (``max_brokers`` not reached, counting spawning).
    can_grow: bool = True

    def locked(self, topic: TopicLoad) -> bool:
        last = topic.last_change_s
        return topic.name not in self.changed and (
            last is not None and self.now - last < self.settings.min_plan_interval_s
        )

    def by_ratio(self) -> list[_Load]:
        return sorted(self.loads.values(), key=lambda x: (x.ratio(), x.window.id))


def rebalance(
    state: RebalanceState, settings: RebalanceSettings | None = None, now: float = 0.0
) -> list[Decision]:
    """The decisions for ``state`` at time ``now`` (s, the clock of ``last_change_s``):
    replication first, then overloads (and a spawn if they cannot be relieved), else at
    most one despawn. Deterministic: ties go by id."""
    settings = settings or RebalanceSettings()
    run = _Pass(state, settings, now, _model(state, settings), {t.name: t for t in state.topics})
    brokers = len(state.brokers) + state.spawning
    if brokers < settings.min_brokers:
        return [Spawn(settings.min_brokers - brokers)]
    run.can_grow = brokers < settings.max_brokers
    _replication(run)
    overloaded = _overloaded(run)
    over = {x.window.id for x in overloaded if x.ratio() > settings.overload}
    for load in overloaded:
        _shed(run, load)
    # Spawn early: an overloaded broker that could not get back under target for lack of
    # room asks for a broker, even once it is under the overload threshold.
    still = [
        x
        for x in run.loads.values()
        if x.ratio() > settings.overload
        or (x.window.id in over and x.ratio() >= settings.target - _EPS)
    ]
    if still and run.short:
        room = settings.max_brokers - brokers
        excess = math.fsum(x.ratio() - settings.target for x in still)
        needed = max(1, math.ceil(excess / settings.target - _EPS))
        n = min(room, needed - state.spawning)  # those being started count
        if n > 0:
            run.decisions.append(Spawn(n))
    if not overloaded and not run.decisions and brokers > settings.min_brokers:
        _despawn(run)
    return run.decisions


def _slo_hot(run: _Pass, load: _Load) -> bool:
    return load.window.slo_streak >= run.settings.slo_windows


def _overloaded(run: _Pass) -> list[_Load]:
    hot = [x for x in run.loads.values() if x.ratio() > run.settings.overload or _slo_hot(run, x)]
    return sorted(hot, key=lambda x: (-x.ratio(), x.window.id))


def _room(run: _Pass, dest: _Load, topic: TopicLoad, source: _Load) -> float:
    """Publisher msg/s of ``topic`` that ``dest`` can take and stay at ``target`` or below
    on ingress (in the topic's units, as placement counts: ``for_topic``), egress and CPU."""
    t = run.settings.target
    if dest.ratio() >= t:  # e.g. its CPU, which a move from a cheaper broker may not raise
        return 0.0
    ledger_load = max(dest.allocated, dest.ingress)
    ingress = for_topic(topic.spec, [BrokerCapacity(dest.window.id, t * dest.window.mcap,
                                                    ledger_load)])[0].rcap  # fmt: skip
    # for_topic counts the ledger's units; the measured ingress must fit too (rate < load)
    ingress = min(ingress, t * dest.window.mcap - dest.ingress)
    per_msg_out = topic.subscribers * topic.message_bytes
    egress = (t * dest.egress_max - dest.egress) / per_msg_out if per_msg_out else math.inf
    cpu = (t - dest.cpu) / source.cpu_per_msg if source.cpu_per_msg > 0 else math.inf
    return max(0.0, min(ingress, egress, cpu))


def _contribution(load: _Load, topic: TopicLoad) -> float:
    """How much of ``load``'s LR ``topic`` accounts for (the worst dimension)."""
    b = load.window.id
    return max(
        _allocated_of(topic, b) / load.window.mcap,
        egress_of(topic, b) / load.egress_max,
        ingress_of(topic, b) * load.cpu_per_msg,
    )


def _shed(run: _Pass, source: _Load) -> None:
    """Algorithm 2 for one broker: move its parts until LR < target (an SLO-overloaded
    broker sheds at least one part). Whole parts first, the busiest that fits somewhere
    (a split part first on an SLO-overloaded broker: it is what pays the DRL penalty);
    only when no part can move whole, a slice of one too big for any one broker (or of
    any, when the cluster cannot grow): a part that a new broker could take whole waits
    for the spawn rather than being split."""
    s = run.settings
    b = source.window.id
    moved = False
    while source.ratio() >= s.target - _EPS or (_slo_hot(run, source) and not moved):
        movable = [
            t for t in run.topics.values() if not t.replicas and t.part(b) > 0 and not run.locked(t)
        ]
        if not movable:  # only replicated topics left: their carriers share more widely
            if not _widen(run, source):
                return
            moved = True
            continue
        hot = _slo_hot(run, source)
        movable.sort(key=lambda t: (not (hot and len(t.plan) > 1), -_contribution(source, t),
                                    t.name))  # fmt: skip
        if any(_move_whole(run, source, t) for t in movable):
            moved = True
            continue
        run.short = True  # no part moves whole: a slice, or a spawn
        slicing = [t for t in movable if not run.can_grow or not _fits_fresh(run, source, t)]
        if not any(_move_slice(run, source, t) for t in slicing):
            return
        moved = True


def _widen(run: _Pass, source: _Load) -> bool:
    """One more replica for the replicated topic that sends the most out of ``source``,
    when egress is what overloads it: every carrier's share of the subscribers shrinks.
    Replication sizes each topic alone, so a home carrying several can stay over. False
    when there is none to widen or egress is not the cause; a spawn is asked for when
    there is one but no broker can take another replica of it."""
    b = source.window.id
    wide = [
        x for x in run.topics.values() if x.replicas and b in x.carriers() and not run.locked(x)
    ]
    if not wide or source.egress < (run.settings.target - _EPS) * source.egress_max:
        return False
    for topic in sorted(wide, key=lambda x: (-egress_of(x, b), x.name)):
        added = _replica_candidates(run, topic, 1)
        if added:
            _set_replicas(run, topic, (*topic.replicas, *added))
            run.decisions.append(Replicate(topic.name, added[0], "all_publishers"))
            return True
    run.short = True
    return False


def _fits_fresh(run: _Pass, source: _Load, topic: TopicLoad) -> bool:
    """Could a new, empty broker (as large as the largest now) take ``topic``'s part on
    ``source`` whole and stay under target?"""
    mcap = max(x.window.mcap for x in run.loads.values())
    emax = max(x.egress_max for x in run.loads.values())
    fresh = _Load(BrokerWindow("", mcap), emax, 0.0, 0.0, 0.0, 0.0, 0.0)
    return _room(run, fresh, topic, source) >= topic.part(source.window.id) * (1 - _EPS)


def _destinations(run: _Pass, topic: TopicLoad, source: str) -> list[_Load]:
    """Brokers already carrying the topic first (the topic gains no broker), then the
    least loaded; never the source nor a broker violating an SLO (one over the target
    has no room)."""
    held = set(topic.plan)
    return sorted(
        (x for x in run.loads.values() if x.window.id != source and not _slo_hot(run, x)),
        key=lambda x: (x.window.id not in held, x.ratio(), x.window.id),
    )


def _mine(topic: TopicLoad, broker: str) -> list[PublisherLoad]:
    ids = set(topic.plan[broker])
    return [p for p in topic.spec.publishers if p.id in ids]


def _move_whole(run: _Pass, source: _Load, topic: TopicLoad) -> bool:
    """Relocate ``topic``'s part on ``source`` whole to the first destination with room
    (the part keeps its size: no new split, no sliver); False when none has."""
    b = source.window.id
    part = topic.part(b)
    for dest in _destinations(run, topic, b):
        if _room(run, dest, topic, source) >= part * (1 - _EPS):
            _commit(run, topic, source, dest, _mine(topic, b))
            return True
    return False


def _move_slice(run: _Pass, source: _Load, topic: TopicLoad) -> bool:
    """Relocate a proportional slice of ``topic``'s part on ``source`` (whole correlation
    groups in proportion: ``fill_by_group``) to the broker with the most room; False when
    it would leave a sliver on either side."""
    b = source.window.id
    part = topic.part(b)
    dests = _destinations(run, topic, b)
    rooms = [(_room(run, d, topic, source), d) for d in dests]
    if not rooms:
        return False
    room, dest = max(rooms, key=lambda rd: (rd[0], -dests.index(rd[1])))
    want = min(room, part)
    if want <= 0:
        return False
    keep_quota = max(part - want, 0.0)
    mine = _mine(topic, b)
    groups, _ = fill_by_group(mine, [keep_quota, want], [math.inf, want * (1 + _EPS) + _EPS])
    slice_ = groups[1]
    rate = math.fsum(p.rate for p in slice_)
    if not slice_ or not _no_sliver(topic, dest.window.id, rate, topic.load, part - rate, run):
        return False
    _commit(run, topic, source, dest, slice_)
    return True


def _no_sliver(
    topic: TopicLoad, dest: str, moved: float, total: float, left: float, run: _Pass
) -> bool:
    """Neither the part left on the source nor the part at ``dest`` is a sliver: a share of
    the topic's load in (0, ``min_slice_share``), or a sub-bucket below one token."""
    floor = run.settings.min_slice_share * total
    at_dest = topic.part(dest) + moved
    for part in (left, at_dest):
        if part > _EPS and (part < floor * (1 - _EPS) or part / total * topic.spec.burst < 1):
            return False
    return True


def _commit(
    run: _Pass, topic: TopicLoad, source: _Load, dest: _Load, pubs: Sequence[PublisherLoad]
) -> None:
    rate = math.fsum(p.rate for p in pubs)
    per_msg = source.cpu_per_msg
    source.add(topic, -rate, per_msg)
    dest.add(topic, rate, per_msg)
    ids = tuple(p.id for p in pubs)
    move = Relocate(topic.name, ids, source.window.id, dest.window.id)
    new = _apply_move(topic, move)
    run.topics[topic.name] = replace(new, last_change_s=topic.last_change_s)
    run.changed.add(topic.name)
    run.decisions.append(move)


def _apply_move(topic: TopicLoad, move: Relocate) -> TopicLoad:
    gone = set(move.publishers)
    plan = {b: tuple(p for p in ps if p not in gone) for b, ps in topic.plan.items()}
    plan[move.to] = (*plan.get(move.to, ()), *move.publishers)
    return replace(topic, plan={b: ps for b, ps in plan.items() if ps})


def _replication(run: _Pass) -> None:
    """ALL_PUBLISHERS for a topic on one broker whose egress no broker can carry under
    ``target``: replicas = ceil(egress / (target × egress_max)); one fewer when that suffices."""
    s = run.settings
    for topic in sorted(run.topics.values(), key=lambda t: t.name):
        if len(topic.plan) != 1 or run.locked(topic):
            continue
        egress = topic.load * topic.subscribers * topic.message_bytes
        home = run.loads.get(next(iter(topic.plan)))
        per_replica = s.target * (home.egress_max if home else s.egress_max)
        need = max(1, math.ceil(egress / per_replica - _EPS))
        have = topic.carriers()
        if need > len(have):
            _add_replicas(run, topic, need - len(have))
        elif topic.replicas and egress / (len(have) - 1) <= per_replica * (1 - _EPS):
            _drop_replica(run, topic, egress)


def _drop_replica(run: _Pass, topic: TopicLoad, egress: float) -> None:
    """Remove the most loaded replica if every carrier left can take its share of the
    subscribers and stay at or under target."""
    have = topic.carriers()
    drop = max(topic.replicas, key=lambda r: (run.loads[r].ratio(), r) if r in run.loads
               else (math.inf, r))  # fmt: skip
    more = egress / (len(have) - 1) - egress / len(have)
    for c in have:
        load = run.loads.get(c)
        if c != drop and load and load.egress + more > run.settings.target * load.egress_max:
            return
    _set_replicas(run, topic, tuple(r for r in topic.replicas if r != drop))
    run.decisions.append(Unreplicate(topic.name, drop))


def _add_replicas(run: _Pass, topic: TopicLoad, n: int) -> None:
    """Up to ``n`` of the least-loaded brokers that can take the whole stream in and their
    share of the subscribers out (the share with the replicas actually found) and stay
    under target; fewer found counts toward a spawn."""
    for k in range(n, 0, -1):
        added = _replica_candidates(run, topic, k)
        if len(added) == k:
            break
    else:
        added = []
    if len(added) < n:
        run.short = True
    if added:
        _set_replicas(run, topic, (*topic.replicas, *added))
        run.decisions.extend(Replicate(topic.name, b, "all_publishers") for b in added)


def _replica_candidates(run: _Pass, topic: TopicLoad, k: int) -> list[str]:
    """The ``k`` least-loaded brokers (or fewer) that can be replicas with ``k`` added."""
    t = run.settings.target
    whole = topic.load * topic.subscribers * topic.message_bytes
    egress_each = whole / (len(topic.carriers()) + k)
    added: list[str] = []
    for cand in run.by_ratio():
        b = cand.window.id
        if len(added) == k or b in topic.carriers() or _slo_hot(run, cand):
            continue
        ledger_in = max(cand.allocated + topic.spec.rate, cand.ingress + topic.load)
        out = cand.egress + egress_each
        cpu = cand.cpu + topic.load * _cpu_per_msg(run, cand)
        if ledger_in <= t * cand.window.mcap and out <= t * cand.egress_max and cpu <= t:
            added.append(b)
    return added


def _set_replicas(run: _Pass, topic: TopicLoad, replicas: tuple[str, ...]) -> None:
    """Re-estimate every carrier's loads for ``topic`` with ``replicas``."""
    new = replace(topic, replicas=replicas)
    for b in set(topic.carriers()) | set(new.carriers()):
        if b not in run.loads:
            continue
        load = run.loads[b]
        d_in = ingress_of(new, b) - ingress_of(topic, b)
        load.allocated = max(0.0, load.allocated + _allocated_of(new, b) - _allocated_of(topic, b))
        load.ingress = max(0.0, load.ingress + d_in)
        load.egress = max(0.0, load.egress + egress_of(new, b) - egress_of(topic, b))
        load.cpu = max(0.0, load.cpu + d_in * _cpu_per_msg(run, load))
    run.topics[topic.name] = new
    run.changed.add(topic.name)


def _cpu_per_msg(run: _Pass, load: _Load) -> float:
    """A broker's CPU per msg/s; one with no traffic yet costs what the dearest costs."""
    return load.cpu_per_msg or max((x.cpu_per_msg for x in run.loads.values()), default=0.0)


def _despawn(run: _Pass) -> None:
    """Dynamoth's low-load plan: if the average LR without the least-loaded stoppable
    broker stays under ``despawn_below``, move all its parts away (whole, each to a broker
    with room) and give it back; nothing when any part cannot move."""
    s = run.settings
    loads = run.by_ratio()
    stoppable = [x for x in loads if x.window.stoppable]
    if len(loads) < 2 or not stoppable:
        return
    # The load is conserved by the moves: the average without any one broker is the total
    # over n - 1, whichever broker goes.
    avg = math.fsum(x.ratio() for x in loads) / len(loads)
    if avg * len(loads) / (len(loads) - 1) >= s.despawn_below:
        return
    victim = stoppable[0]
    b = victim.window.id
    before = len(run.decisions)
    saved = {k: replace(v) for k, v in run.loads.items()}
    topics = dict(run.topics)
    for topic in sorted(run.topics.values(), key=lambda t: t.name):
        if b not in topic.carriers():
            continue
        if run.locked(topic) or topic.replicas or not _drain(run, victim, topic):
            del run.decisions[before:]
            run.loads, run.topics = saved, topics
            return
    del run.loads[b]
    run.decisions.append(Despawn(b))


def _drain(run: _Pass, victim: _Load, topic: TopicLoad) -> bool:
    return _move_whole(run, victim, topic)


# -- applying decisions (what-if, tests) ----------------------------------------------------
def apply(
    state: RebalanceState, decisions: Iterable[Decision], settings: RebalanceSettings,
    now: float = 0.0,
) -> RebalanceState:  # fmt: skip
    """``state`` with ``decisions`` made: plans and replicas changed, broker loads moved as
    the rebalancer estimates them, despawned brokers gone, changed topics stamped ``now``.
    Spawns add no broker (a new broker comes with its own registration)."""
    run = _Pass(state, settings, now, _model(state, settings), {t.name: t for t in state.topics})
    gone: set[str] = set()
    for d in decisions:
        if isinstance(d, Relocate):
            topic = run.topics[d.topic]
            pubs = [p for p in topic.spec.publishers if p.id in set(d.publishers)]
            _commit(run, topic, run.loads[d.source], run.loads[d.to], pubs)
        elif isinstance(d, Replicate):
            topic = run.topics[d.topic]
            _set_replicas(run, topic, (*topic.replicas, d.to))
        elif isinstance(d, Unreplicate):
            topic = run.topics[d.topic]
            _set_replicas(run, topic, tuple(r for r in topic.replicas if r != d.source))
        elif isinstance(d, Despawn):
            gone.add(d.broker)
    brokers = tuple(
        replace(x.window, ingress=x.ingress, egress=x.egress, cpu=x.cpu)
        for x in run.loads.values()
        if x.window.id not in gone
    )
    topics = tuple(
        replace(t, last_change_s=now) if t.name in run.changed else t for t in run.topics.values()
    )
    return RebalanceState(brokers, topics, state.spawning)


# -- averaging ------------------------------------------------------------------------------
@dataclass(slots=True)
class LoadAverager:
    """Per broker, reports averaged over the last ``window_s`` seconds, and the SLO streak:
    how many consecutive tumbling windows of ``window_s`` had an SLO violated (counting
    from the current window if it has one, else from the one before). Pure: time is given."""

    window_s: float = 10.0
    _samples: dict[str, list[tuple[float, float, float, float]]] = field(default_factory=dict)
    _violated: dict[str, set[int]] = field(default_factory=dict)

    def add(
        self, broker: str, now: float, ingress: float, egress: float, cpu: float,
        slo_violated: bool = False,
    ) -> None:  # fmt: skip
        rows = self._samples.setdefault(broker, [])
        rows.append((now, ingress, egress, cpu))
        while rows and rows[0][0] <= now - self.window_s:
            rows.pop(0)
        marks = self._violated.setdefault(broker, set())
        if slo_violated:
            marks.add(self._index(now))
        oldest = self._index(now) - 64  # a streak longer than that is counted as 64
        marks.difference_update({i for i in marks if i < oldest})

    def forget(self, broker: str) -> None:
        self._samples.pop(broker, None)
        self._violated.pop(broker, None)

    def window(self, broker: str, mcap: float, now: float) -> BrokerWindow:
        """``broker``'s means over ``(now - window_s, now]`` (zeros without samples)."""
        rows = [r for r in self._samples.get(broker, []) if r[0] > now - self.window_s]
        n = len(rows)
        mean = [math.fsum(r[i] for r in rows) / n if n else 0.0 for i in (1, 2, 3)]
        return BrokerWindow(broker, mcap, mean[0], mean[1], mean[2], self._streak(broker, now))

    def _index(self, now: float) -> int:
        return math.floor(now / self.window_s)

    def _streak(self, broker: str, now: float) -> int:
        marks = self._violated.get(broker, set())
        i = self._index(now)
        if i not in marks:
            i -= 1
        streak = 0
        while i in marks:
            streak += 1
            i -= 1
        return streak
