"""A topic's lifecycle and its publishers: creating and placing it, changing its SLO,
bucket, bound or policy, deleting it; publishers joining (by the policy's incremental
rule, or by self-registration on an open topic) and leaving; the rate the utility
optimizer and rate control give it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from srtm.control.actions import Action, DropRoute, SetBucket, Unmanage, same_bucket
from srtm.control.model import ControllerState, TopicState, TopicUtility
from srtm.control.plans import fleet, new_plan, set_assignment, sums
from srtm.control.validate import ControlError, publisher_id, topic_name
from srtm.placement import (
    RATE_MARGIN,
    BrokerCapacity,
    Joined,
    Placement,
    Policy,
    PublisherLoad,
    RateSum,
    TopicSpec,
    for_topic,
    join,
    place,
    topic_bucket,
)
from srtm.ratelimit import MAX_RATE, BucketParams, check_bucket, merge, split_floored
from srtm.ratelimit.overflow import DEFAULT_BOUND, Bound, check_bound


def check_new_topic(c: ControllerState, spec: TopicSpec) -> list[BrokerCapacity]:
    """Refusals before placing ``spec``; the fleet to place it on."""
    topic_name(spec.name)
    if len(spec.publishers) > c.max_publishers:
        raise ControlError(
            413, f"publishers: {len(spec.publishers)} > {c.max_publishers} per topic"
        )
    if spec.name in c.topics:
        raise ControlError(409, f"topic {spec.name!r} exists")
    brokers = fleet(c)
    if not brokers:
        raise ControlError(503, "no broker is registered and up")
    return for_topic(spec, brokers)


def create_topic(
    c: ControllerState,
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
    share: then it is placed again here, on the ledger as it is now. ``utility``: its
    utility spec as given (refused as ``set_utility`` refuses it)."""
    parsed = _utility(utility, spec.name)
    brokers = check_new_topic(c, spec)
    if placement is None:
        placement = place(policy, brokers, spec, c.seed)
    elif not {a.broker for a in placement.assignments} <= {b.id for b in brokers}:
        raise ControlError(503, "a broker went down while the topic was being placed")
    elif placed_on is not None and _overtaken(placement, placed_on, brokers):
        placement = place(policy, brokers, spec, c.seed)
    topic = c.topics[spec.name] = TopicState(
        spec, policy, open=open, rate_auto=rate_auto, utility=parsed,
        max_publisher_rate=max_publisher_rate, join_secret=join_secret, bound=bound,
    )  # fmt: skip
    for a in placement.assignments:
        topic.assignment[a.broker] = list(a.publishers)
    topic.unassigned = list(placement.unassigned)
    topic.events.append(
        f"placed with {policy} on {', '.join(placement.brokers) or 'no broker'}"
        + (f"; shortfall {placement.shortfall:.6g} msg/s" if placement.shortfall else "")
    )
    return new_plan(c, topic)


def _overtaken(placement: Placement, then: list[BrokerCapacity], now: list[BrokerCapacity]) -> bool:
    """Did a chosen broker's ``rcap`` shrink, since ``placement`` was computed on
    ``then``, below the rate the placement gives it?"""
    before = {b.id: b.rcap for b in then}
    after = {b.id: b.rcap for b in now}
    return any(
        after[a.broker] < before.get(a.broker, math.inf) and a.rate > after[a.broker] * (1 + 1e-9)
        for a in placement.assignments
    )


def delete_topic(c: ControllerState, name: str) -> list[Action]:
    """Stop managing ``name``: its plan is gone (the ledger frees its share) and every
    broker up is told to drop its sub-bucket and release what it holds, so messages
    already accepted are still delivered (/lookup lists brokers holding them)."""
    topic = c.changeable(name)
    del c.topics[name]
    c.replace_pending = True  # capacity freed: place others' unassigned publishers
    routed: list[Action] = [DropRoute(b, name) for b in topic.routing.pushed]
    return [*(Unmanage(b.id, name) for b in c.up()), *routed]


def change_topic(
    c: ControllerState,
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
    topic = c.changeable(name)
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
        brokers = fleet(c, exclude=name)
        if not brokers:
            raise ControlError(503, "no broker is registered and up")
        placement = place(policy, for_topic(topic.spec, brokers), topic.spec, c.seed)
        topic.policy = policy
        assignment = {a.broker: list(a.publishers) for a in placement.assignments}
        note = f"changed {', '.join([*changed, f'policy {policy}'])}: placed again"
        return set_assignment(c, name, assignment, list(placement.unassigned), note)
    if not changed:
        return []
    topic.events.append(f"changed {', '.join(changed)}")
    if rate is None and burst is None:
        # The same sub-buckets again, with the new bound (retuning keeps their state).
        return [SetBucket(b, name, p, p) for b, p in topic.buckets.items()] if rebound else []
    return new_plan(c, topic)


def set_utility(c: ControllerState, name: str, utility: dict[str, Any] | None) -> None:
    """PATCH: a new utility spec, as given (a bad one is refused: 400 naming the field),
    or None: the optimizer and rate control leave the topic's rate alone from now on."""
    topic = c.changeable(name)
    topic.utility = _utility(utility, name)
    topic.allocation = None
    topic.events.append("utility spec " + ("set" if utility is not None else "removed"))


def _utility(doc: dict[str, Any] | None, topic: str) -> TopicUtility | None:
    """A spec as given, parsed once here, where it enters the state. The API's request
    documents refuse a bad one first; a direct caller's gets the same 400 and text."""
    if doc is None:
        return None
    try:
        return TopicUtility.parse(doc, topic)
    except ValueError as exc:
        raise ControlError(400, str(exc)) from None


def set_rate(c: ControllerState, name: str, rate: float) -> list[Action]:
    """The optimizer's or rate control's rate for ``name``: its sub-buckets scaled to
    it, keeping their proportions (the TB Adaptor's split) and bursts; no new plan
    version. No actions while fitting owns the plan, or if the rate cannot be a
    bucket's (it is kept as it is)."""
    topic = c.topic(name)
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
    c: ControllerState,
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
    topic = c.changeable(name)
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
    summed = sums(c, topic)
    # The record of forwarding is the plan's as last noted: the new plan may be
    # noted by the newcomers alone (``plans.new_plan``).
    noted = topic.shape().same(topic.noted_shape)
    known = summed.by_id
    ids = [p.id for p in publishers]
    taken = sorted({i for i in ids if i in known or ids.count(i) > 1})[:5]
    if taken:
        raise ControlError(409, f"publishers: ids already in topic {name!r}: {taken}")
    if len(known) + len(publishers) > c.max_publishers:
        raise ControlError(
            413, f"publishers: {len(known) + len(publishers)} > {c.max_publishers} per topic"
        )
    spec, after = topic.spec, summed.rate_sum(publishers)
    try:  # refused before anything changes (a rate that follows them: quoted)
        bucket = topic_bucket(after, None if topic.rate_auto else spec.rate, spec.burst)
    except ValueError as exc:
        raise ControlError(400, f"{field}: {exc}") from None
    brokers = fleet(c, exclude=name)
    if not brokers:
        raise ControlError(503, "no broker is registered and up")
    load = after.total
    joined = join(topic.policy, brokers, summed, publishers, bucket.rate / load)
    if whole:
        _check_whole(c, topic, joined, publishers, bucket, load)
    set_publishers(topic, spec.publishers + tuple(publishers), after)  # one copy
    summed.joined(publishers)
    for b, ps in joined.placed.items():
        topic.assignment.setdefault(b, []).extend(ps)
        summed.placed(b, ps)
    topic.sums_shape = topic.shape()  # brought up to date: no need to take them again
    topic.unassigned += joined.unassigned
    where = ", ".join(f"{len(ps)} on {b}" for b, ps in joined.placed.items())
    topic.events.append(
        f"{len(publishers)} publishers joined: {where or 'none placed'}"
        + (f"; {len(joined.unassigned)} unassigned" if joined.unassigned else "")
    )
    return new_plan(c, topic, joined=joined.placed if noted else None)


def _check_whole(
    c: ControllerState,
    topic: TopicState,
    joined: Joined,
    publishers: list[PublisherLoad],
    bucket: BucketParams,
    load: float,
) -> None:
    """503 unless ``joined`` places every newcomer and the topic's bucket still splits
    into one sub-bucket per member (``plans.new_plan``'s split), so that refusing
    changes nothing: the plan, its buckets and delivery stay as they are."""
    name = topic.spec.name
    if joined.unassigned:
        who = ", ".join(repr(p) for p in joined.unassigned[:3])
        raise ControlError(
            503, f"publisher {who} cannot be placed: no broker up has room for its rate; "
            f"topic {name!r} is unchanged",
        )  # fmt: skip
    rate_of = {p.id: p.rate for p in publishers}
    summed = sums(c, topic)
    weights = {b: summed.rate(b) for b in topic.assignment}
    primary = topic.routing.replicas[0] if topic.routing.replicated else None
    for b, ps in joined.placed.items():
        b = primary or b  # a replicated topic's joiners go to its primary
        weights[b] = weights.get(b, 0.0) + math.fsum(rate_of[p] for p in ps)
    weights = {b: w for b, w in weights.items() if w > 0} | topic.draining
    placed = 1.0
    if topic.unassigned:
        placed = min(1.0, math.fsum(weights.values()) / load)
    try:
        split_floored(bucket.rate * placed, max(1.0, bucket.burst * placed), list(weights.values()))
    except ValueError as exc:
        raise ControlError(
            503, f"publisher cannot be placed: {exc}; topic {name!r} is unchanged"
        ) from None


def remove_publisher(c: ControllerState, name: str, publisher: str) -> list[Action]:
    """The publisher leaves: out of the topic and its plan, the bucket re-split over
    who is left; nobody else moves."""
    topic = c.changeable(name)
    if publisher not in {p.id for p in topic.spec.publishers}:
        raise ControlError(404, f"publisher {publisher!r} is not in topic {name!r}")
    set_publishers(topic, [p for p in topic.spec.publishers if p.id != publisher])
    topic.assignment = {b: [p for p in ps if p != publisher] for b, ps in topic.assignment.items()}
    topic.unassigned = [p for p in topic.unassigned if p != publisher]
    topic.events.append(f"publisher {publisher} left")
    c.replace_pending = True  # capacity freed
    return new_plan(c, topic)


def join_open(
    c: ControllerState, name: str, publisher: str, rate: float | None, group: str | None
) -> list[Action]:
    """Self-registration on ``/assign``: an unknown publisher of an ``open`` topic
    joins with the rate and group it tells (no rate: 400), at most the topic's
    ``join_rate_limit`` (400 naming ``rate``). It is placed whole or refused (503)
    with the topic unchanged. A known one: nothing."""
    topic = c.topic(name)
    publisher_id(publisher)
    if publisher in sums(c, topic).by_id:
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
    return add_publishers(c, name, [load], "rate", whole=True)


def set_join(
    c: ControllerState,
    name: str,
    *,
    max_publisher_rate: float | bool | None = False,
    join_secret: str | bool | None = False,
) -> None:
    """PATCH: how unknown publishers join (``False``: left as it is; None: removed)."""
    topic = c.changeable(name)
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


def set_publishers(
    topic: TopicState, publishers: Sequence[PublisherLoad], summed: RateSum | None = None
) -> None:
    """The topic's publishers are ``publishers`` (``summed``: their ``RateSum``, if
    known); a rate that follows them follows."""
    spec = topic.spec
    rate = spec.rate
    if topic.rate_auto:
        total = math.fsum(p.rate for p in publishers) if summed is None else summed.total
        rate = RATE_MARGIN * total
    topic.spec = dataclasses.replace(spec, publishers=tuple(publishers), rate=rate)
