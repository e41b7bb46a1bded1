"""Placements for the simulator: a policy's answer as broker shares, a policy held to
exactly ``k`` brokers, and the measurement-validated choice of ``k`` the paper's
baselines use (Sec. VI-B: estimated from ``rcap``, then validated by measuring)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from srtm.placement import (
    Assignment,
    BrokerCapacity,
    Placement,
    Policy,
    PublisherLoad,
    TopicSpec,
    place,
)
from srtm.placement.policies import (
    by_residual,
    equal_total_quotas,
    fewest_brokers,
    fill_by_group,
    fill_in_order,
    maxmin_quotas,
)
from srtm.ratelimit import BucketParams, split_floored
from srtm.sim.arrivals import Trace
from srtm.sim.engine import Share
from srtm.workload import PublisherSpec


def topic_of(
    publishers: Sequence[PublisherSpec], bucket: BucketParams, slo_p99_ms: float, name: str = "t"
) -> TopicSpec:
    """The placement view of a simulated topic (its profiled ``(r, b)`` and SLO)."""
    pubs = tuple(PublisherLoad(p.id, p.rate, p.group) for p in publishers)
    return TopicSpec(name, pubs, bucket.burst, slo_p99_ms, bucket.rate)


def shares_of(placement: Placement, trace: Trace) -> list[Share]:
    index = trace.index()
    return [
        Share(a.broker, [index[p] for p in a.publishers], a.bucket) for a in placement.assignments
    ]


def on_brokers(
    policy: Policy, chosen: Sequence[BrokerCapacity], topic: TopicSpec, seed: int = 0
) -> Placement:
    """``policy``'s quotas and selection on exactly ``chosen`` (all of them get a share):
    LB and Conc equalise total load, MaxMin and SRTM water-fill; SRTM splits groups."""
    load = topic.load
    quotas = (
        equal_total_quotas(chosen, load)
        if policy in ("lb", "conc")
        else maxmin_quotas(chosen, load)
    )
    caps = [b.rcap for b in chosen]
    fill = fill_by_group if policy == "srtm" else None
    if fill is not None:
        groups, left = fill(topic.publishers, quotas, caps, seed)
    else:
        groups, left = fill_in_order(topic.publishers, quotas, caps)
    used = [(b, ps) for b, ps in zip(chosen, groups, strict=True) if ps]
    rates = [math.fsum(p.rate for p in ps) for _, ps in used]
    placed = math.fsum(rates) / load if load else 0.0
    buckets = (
        split_floored(topic.rate * placed, max(1.0, topic.burst * placed), rates) if used else []
    )
    assignments = tuple(
        Assignment(b.id, tuple(p.id for p in ps), r, bk)
        for (b, ps), r, bk in zip(used, rates, buckets, strict=True)
    )
    shortfall = math.fsum(p.rate for p in left)
    return Placement(policy, assignments, tuple(p.id for p in left), shortfall)


@dataclass(frozen=True)
class Choice:
    """The placement a validated policy settles on, and what each ``k`` tried measured."""

    placement: Placement
    k: int
    p99_ms: float
    tried: Mapping[int, float]
    meets_slo: bool


def validated(
    policy: Policy,
    brokers: Sequence[BrokerCapacity],
    topic: TopicSpec,
    measure: Callable[[Placement], float],
    *,
    seed: int = 0,
    k: int | None = None,
) -> Choice:
    """LB uses every broker. The others start from the fewest brokers whose ``rcap``
    covers the topic and add brokers (largest ``rcap`` first) until the measured p99
    meets the SLO; if none does, the best ``k`` is kept (the paper reports the best
    configuration when the SLO cannot be met). ``k`` forces a number of brokers."""
    ranked = [b for b in by_residual(brokers) if b.rcap > 0]
    if policy == "lb" and k is None:
        p = place("lb", brokers, topic, seed)
        p99 = measure(p)
        n = len(p.assignments)
        return Choice(p, n, p99, {n: p99}, p99 <= topic.slo_p99_ms)
    if k is not None:
        ks = [k]
    else:
        start = max(1, len(fewest_brokers(brokers, topic.load)))
        ks = list(range(start, len(ranked) + 1))
    tried: dict[int, float] = {}
    best: tuple[float, int, Placement] | None = None
    for n in ks:
        p = on_brokers(policy, ranked[:n], topic, seed)
        if p.problem is not None or p.unassigned:
            continue
        p99 = measure(p)
        tried[n] = p99
        if best is None or p99 < best[0]:
            best = (p99, n, p)
        if p99 <= topic.slo_p99_ms:
            return Choice(p, n, p99, tried, True)
    if best is None:
        raise ValueError(f"{policy}: the topic fits on none of 1..{len(ranked)} brokers")
    return Choice(best[2], best[1], best[0], tried, False)
