"""Plans: a topic's assignment of publishers to brokers, its sub-buckets split over them
and its draining members, the versions that follow each change, and what keeps them
current (the TB Adaptor's re-split, draining, re-placing who was left unassigned). A new
plan's actions are the share changes and routes brokers need, then ``PlanChanged``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from srtm.control.actions import Action, Hold, Migrate, PlanChanged, SetBucket
from srtm.control.model import ControllerState, TopicState
from srtm.control.routes import changes, home_channels, routes
from srtm.control.validate import ControlError
from srtm.placement import BrokerCapacity, LedgerEntry, Sums, adapt, for_topic, ledger, place
from srtm.ratelimit import BucketParams, merge, split_floored

#: A draining broker's smallest weight, as a fraction of the one it had: room for what
#: reaches it between its drop and its forwarding route (a few requests), while the
#: members keep most of ``RATE_MARGIN``'s 10 % headroom over their assigned rates.
DRAIN_FLOOR = 0.05
#: The time a draining broker is given to release what it had waiting (s).
DRAIN_S = 1.0


def ledger_of(
    c: ControllerState, exclude: str | None = None, placing: str | None = None
) -> list[LedgerEntry]:
    """Every registered broker's capacity ledger (``srtm.placement.ledger``):
    ``allocated`` summed from the current plans' sub-buckets, draining members' too
    (all topics but ``exclude``; ``placing``: that topic's draining shares left out,
    a member's share replaces them), ``measured`` from its last report; the host of
    each broker that shares one (``srtm node``), which placement spreads topics over."""
    hosts = {b.id: b.host for b in c.brokers.values() if b.host != b.id}
    return ledger(
        ((b.id, b.mcap, b.load) for b in c.brokers.values()),
        (
            {b: p for b, p in t.buckets.items() if b not in t.draining}
            if name == placing
            else t.buckets
            for name, t in c.topics.items()
            if name != exclude
        ),
        hosts,
    )


def fleet(
    c: ControllerState, exclude: str | None = None, placing: str | None = None
) -> list[BrokerCapacity]:
    """The brokers up, as placement sees them: what is promised counts as carried
    (``load = max(allocated, measured)``), so ``rcap`` is the ledger's. ``exclude``:
    a topic being placed again as a whole (its own plan is not in the way);
    ``placing``: a topic whose publishers are placed (its draining shares are not)."""
    up = {b.id for b in c.up()}
    return [e.capacity() for e in ledger_of(c, exclude, placing) if e.id in up]


def hosts_of(c: ControllerState, topic: TopicState) -> set[str]:
    """The shared hosts (``srtm node``) of ``topic``'s brokers up with publishers: where
    placing more of it goes last, among equals (``srtm.placement.place``'s ``hosts_used``)."""
    return {
        info.host
        for b, ps in topic.assignment.items()
        if ps and (info := c.brokers.get(b)) is not None and not info.down and info.host != b
    }


def over(c: ControllerState) -> list[LedgerEntry]:
    """Brokers promised more than their ``mcap`` (an operator's warning: a PATCH
    raised a rate, or a fleet shrank)."""
    return [e for e in ledger_of(c) if e.allocated > e.mcap * (1 + 1e-9)]


def note_over(c: ControllerState, name: str) -> list[str]:
    """Warnings for the brokers over ``mcap`` that carry ``name``, kept as its events."""
    topic = c.topics.get(name)
    if topic is None:
        return []
    notes = [
        f"warning: broker {e.id} is promised {e.allocated:.6g} msg/s > mcap {e.mcap:.6g}"
        for e in over(c)
        if e.id in topic.buckets
    ]
    topic.events += notes
    return notes


def sums(c: ControllerState, topic: TopicState) -> Sums:
    """``topic``'s running sums (``srtm.placement.joining.Sums``): kept up to date by
    the join path, taken again from scratch when anything else changed its
    publishers or plan (its shape)."""
    shape = topic.shape()
    if topic.sums is None or not shape.same(topic.sums_shape):
        topic.sums = Sums.of(topic.spec.publishers, topic.assignment)
        topic.sums_shape = shape
    return topic.sums


def new_plan(
    c: ControllerState,
    topic: TopicState,
    released: frozenset[str] = frozenset(),
    joined: Mapping[str, Sequence[str]] | None = None,
) -> list[Action]:
    """Re-split the topic's bucket over its brokers by assigned rate, and over its
    draining members by their weight; a new version. A broker up dropped from the
    plan drains (unless ``released``: it settled, it holds the topic now). Each replica
    of a replicated topic shapes the whole stream: its sub-bucket is all of ``(r, b)``.
    Then the routes that changed (forwarding from brokers publishers left, replicas).
    ``joined``: the publishers ``topics.add_publishers`` appended (broker -> ids), if
    that is all that changed since the last plan."""
    fold_replicas(c, topic)
    topic.assignment = {b: ps for b, ps in topic.assignment.items() if ps}
    shape = topic.shape()
    # Only ``joined`` changed since the last note (``add_publishers`` checked, and
    # left the shape its sums were brought to): nobody moved, left, or was folded.
    only_joined = joined is not None and shape.same(topic.sums_shape)
    summed = sums(c, topic)
    members = {b: summed.rate(b) for b in topic.assignment}
    replicas = dict.fromkeys(topic.routing.replicas, 0.0)
    load = summed.rate_sum().total
    update_draining(c, topic, members | replicas, released, load)
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
        Hold(b.id, name, old.get(b.id)) for b in c.up() if b.id not in topic.buckets
    ]
    actions += [SetBucket(b, name, p, old.get(b)) for b, p in topic.buckets.items()]
    if only_joined:
        assert joined is not None
        topic.routing.note_joined(joined)
    else:
        topic.routing.note_plan(topic.assignment, summed.by_id)
    topic.noted_shape = shape
    return [*actions, *route_changes(c, topic, noted=True), PlanChanged(name, topic.version)]


def route_changes(c: ControllerState, topic: TopicState, noted: bool = False) -> list[Action]:
    """The route changes that bring brokers up to date with ``topic``'s plan, replica
    set and channels (homes placed by the replicas' reported egress). ``noted``: the
    plan was just noted (``Routing.where`` is the plan's)."""
    r, name = topic.routing, topic.spec.name
    egress = {b: c.brokers[b].usage()[1] for b in r.replicas if b in c.brokers}
    r.homes = home_channels(r.homes, r.replicas, c.registry.channels(name), egress)
    tcp = {b.id: b.tcp_address for b in c.up()}
    want = routes(
        name, r, topic.assignment, topic.buckets, tcp, c.forward_grace_s,
        where=r.where if noted else None,
    )  # fmt: skip
    return list(changes(r, want))


def fold_replicas(c: ControllerState, topic: TopicState) -> None:
    """Keep a replicated topic's plan on its primary: a replica down leaves the set
    (a set of one is no replication); a plan moved whole to one broker makes it the
    primary (a replica swaps places with the old primary, another broker takes its
    place); publishers placed anywhere else (joins) go to the primary."""
    r = topic.routing
    for b in list(r.replicas):
        if b not in c.brokers or c.brokers[b].down:
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


def drain_weight(had: float, waiting: int) -> float:
    """A dropped broker's weight in the split (msg/s): enough to release what its last
    report had waiting within ``DRAIN_S``, at least ``DRAIN_FLOOR`` of the weight it
    ``had`` and at most that. Not the whole of it: forwarding sends what its publishers
    still publish there to their new broker, and every msg/s it keeps is taken from the
    brokers they moved to (weighted by its old share, each move in the live diurnal day
    left the destination short of its rate and queueing for 2-4 s)."""
    need = max(DRAIN_FLOOR * had, waiting / DRAIN_S)
    return max(min(had, need), 1e-9)


def update_draining(
    c: ControllerState,
    topic: TopicState,
    members: dict[str, float],
    released: frozenset[str],
    load: float,
) -> None:
    """Brokers up that had a share and are not members any more drain, weighted by
    what their queue needs (``drain_weight``); a member again, a broker down or
    ``released`` stops draining. ``load``: the publishers' total rate."""
    spec, up = topic.spec, {b.id for b in c.up()}
    scale = load / spec.rate if spec.rate > 0 else 1.0
    for b, p in topic.buckets.items():
        if b not in topic.draining and b not in members and b in up and b not in released:
            waiting = c.brokers[b].waiting.get(spec.name, 0)
            topic.draining[b] = drain_weight(p.rate * scale, waiting)
            topic.drain_since[b] = c.brokers[b].reports_seen
    for b in list(topic.draining):
        if b in members or b not in up or b in released:
            del topic.draining[b]
            topic.drain_since.pop(b, None)


def drain(c: ControllerState, topic: TopicState) -> list[Action]:
    """The tick's draining step for ``topic``: a broker up, out of the plan, that
    reports messages waiting for tokens starts draining (a broker restarted with
    restored messages, or one a message reached after its hold); a draining member
    whose report sent after its drop shows the topic settled leaves the split."""
    name, actions = topic.spec.name, []
    members = {b for b, ps in topic.assignment.items() if ps}
    new = {
        b.id
        for b in c.up()
        if b.waiting.get(name, 0) > 0
        and b.id not in members
        and b.id not in topic.draining
        and b.id not in topic.routing.replicas
    }
    for b in new:
        report = c.brokers[b].reports.get(name)
        weights = [sums(c, topic).rate(b) for b in topic.assignment]
        floor = min(weights, default=1.0)
        topic.draining[b] = max(report.rate if report else 0.0, floor, 1e-9)
        topic.drain_since[b] = c.brokers[b].reports_seen - 2  # its report is news
    released = frozenset(
        b
        for b in topic.draining
        if b not in new
        and (
            (info := c.brokers.get(b)) is None
            or info.down
            or (info.reports_seen >= topic.drain_since.get(b, 0) + 2 and info.settled(name))
        )
    )
    if new or released:
        left = f"; {', '.join(sorted(released))} settled" if released else ""
        topic.events.append(f"draining: {', '.join(sorted(new)) or 'none new'}{left}")
        actions = new_plan(c, topic, released)
    return actions


def move(c: ControllerState, name: str, publishers: list[str], to: str) -> list[Action]:
    """Move publishers to broker ``to``."""
    topic = c.topic(name)
    dest = c.brokers.get(to)
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
    return set_assignment(
        c, name, assignment, topic.unassigned, f"moved {len(moving)} publishers to {to}"
    )


def set_assignment(
    c: ControllerState,
    name: str,
    assignment: dict[str, list[str]],
    unassigned: list[str],
    note: str,
) -> list[Action]:
    """A new plan with this assignment: the sub-buckets re-split and pushed first (so a
    destination shapes from the first message), then a migration order for every
    publisher that changes broker."""
    topic = c.topic(name)
    if topic.routing.replicated and sum(1 for ps in assignment.values() if ps) > 1:
        raise ControlError(
            409, f"topic {name!r} is replicated: its publishers stay on one broker "
            "(POST /topics/NAME/replicas with count 1 first)",
        )  # fmt: skip
    before = {p: b for b, ps in topic.assignment.items() for p in ps}
    topic.assignment = {b: list(ps) for b, ps in assignment.items() if ps}
    topic.unassigned = list(unassigned)
    topic.events.append(note)
    actions = new_plan(c, topic)
    orders: list[Action] = [
        Migrate(before[p], name, p, c.brokers[b].tcp_address, topic.version)
        for b, ps in topic.assignment.items()
        for p in ps
        if p in before and before[p] != b and before[p] in c.brokers
    ]
    return [*actions[:-1], *orders, actions[-1]]


def adapt_topic(c: ControllerState, topic: TopicState, now: float) -> list[Action]:
    """The TB Adaptor's re-split of ``topic``'s sub-buckets by its brokers' reports
    (after a new plan, only once its windows refilled, unless a queue is deep)."""
    if topic.version != topic.adapted_version:  # a new plan: let the windows refill
        topic.adapted_version = topic.version
        topic.adapt_after_s = now + c.adaptor.settle_s
    if len(topic.buckets) < 2 or topic.routing.replicated:
        return []  # a replica shapes the whole stream: nothing to re-split
    reports = {
        b: c.brokers[b].reports[topic.spec.name]
        for b in topic.buckets
        if b in c.brokers and topic.spec.name in c.brokers[b].reports
    }
    total = merge(topic.buckets.values())
    total_was = dict(topic.buckets)
    settling = now < topic.adapt_after_s  # only a deep queue moves rate meanwhile
    new = adapt(total, topic.buckets, reports, now, c.adaptor, settling=settling)
    changed = [b for b in new if new[b] != topic.buckets[b]]
    topic.buckets = new
    return [SetBucket(b, topic.spec.name, new[b], total_was.get(b)) for b in changed]


def place_unassigned(c: ControllerState) -> list[Action]:
    """Publishers with no broker get one now that capacity may have come back."""
    actions: list[Action] = []
    for topic in c.topics.values():
        if not topic.unassigned or topic.status == "fitting":
            continue
        # again per topic: the previous one's plan is promised
        brokers = fleet(c, placing=topic.spec.name)
        if not brokers:
            return actions
        by_id = {p.id: p for p in topic.spec.publishers}
        pool = [by_id[p] for p in topic.unassigned if p in by_id]
        brokers = for_topic(topic.spec, brokers)
        pool_spec = topic.spec.with_publishers(pool)
        placement = place(topic.policy, brokers, pool_spec, c.seed, hosts_of(c, topic))
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
        actions += new_plan(c, topic)
    return actions
