"""The four load-distribution policies, as pure functions of brokers, topic and seed.

- **LB**: every broker, topic load spread to equalise brokers' *total* load;
- **Conc**: the fewest brokers whose residual capacity covers the topic, total load
  equalised over them (concentration);
- **MaxMin**: the same brokers, quotas by water-filling from the smallest residual capacity
  (``min(rcap, left / brokers_left)``), which maximises the smallest share;
- **SRTM**: MaxMin's quotas, publishers taken from every correlation group in proportion
  to the group's size, so each broker gets a slice of every burst.

LB, Conc and MaxMin are blind to groups: they fill each broker with consecutive
publishers of the manifest, as a balancer that sees connections arrive would.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Collection, Sequence
from typing import Literal, get_args

from srtm.placement.model import Assignment, BrokerCapacity, Placement, PublisherLoad, TopicSpec
from srtm.ratelimit import split_floored

#: The placement policies, by the names the CLI, the controller's documents and the traces
#: use (a Literal, not an enum, so plain strings in JSON and code type-check as they are).
Policy = Literal["lb", "conc", "maxmin", "srtm"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
# Rates are floats: a share may exceed its quota by rounding noise, never by a publisher.
_EPS = 1e-9


def by_residual(
    brokers: Sequence[BrokerCapacity], hosts_used: Collection[str] = ()
) -> list[BrokerCapacity]:
    """Largest residual capacity first; ties by id, so results are deterministic. Where
    brokers share hosts (``BrokerCapacity.host``), ties go to a host ranked fewer times
    before (``spread_hosts``; ``hosts_used``: hosts the topic already has, as ranked once):
    a topic's sub-buckets reach a new host before a second process of a host it has."""
    ranked = sorted(brokers, key=lambda b: (-b.rcap, b.id))
    if any(b.host for b in ranked):
        return spread_hosts(ranked, hosts_used)
    return ranked


def spread_hosts(
    ranked: Sequence[BrokerCapacity], hosts_used: Collection[str] = ()
) -> list[BrokerCapacity]:
    """``ranked`` with each run of equal ``rcap`` reordered so that the host ranked the
    fewest times so far comes next (``hosts_used`` count as ranked once; ties: the host
    whose broker came first; within a host, ``ranked``'s order). Equal capacity on two
    hosts beats two processes of one: a host's processes share its NIC, memory and fate."""
    out: list[BrokerCapacity] = []
    seen = dict.fromkeys(hosts_used, 1)  # host -> brokers of it ranked so far
    start = 0
    while start < len(ranked):
        end = start
        while end < len(ranked) and ranked[end].rcap == ranked[start].rcap:
            end += 1
        queues: dict[str, deque[BrokerCapacity]] = {}
        for b in ranked[start:end]:
            queues.setdefault(b.host_key, deque()).append(b)
        heap = [(seen.get(h, 0), i, h) for i, h in enumerate(queues)]
        heapq.heapify(heap)
        while heap:
            count, i, h = heapq.heappop(heap)
            out.append(queues[h].popleft())
            seen[h] = count + 1
            if queues[h]:
                heapq.heappush(heap, (count + 1, i, h))
        start = end
    return out


def fewest_brokers(
    brokers: Sequence[BrokerCapacity], load: float, hosts_used: Collection[str] = ()
) -> list[BrokerCapacity]:
    """The fewest brokers, largest ``rcap`` first, whose ``rcap`` covers ``load``
    (every broker with capacity left if none do; ``hosts_used``: ``by_residual``)."""
    chosen: list[BrokerCapacity] = []
    total = 0.0
    for b in by_residual(brokers, hosts_used):
        if b.rcap <= 0:
            break
        chosen.append(b)
        total += b.rcap
        if total >= load * (1 - _EPS):
            break
    return chosen


def equal_total_quotas(brokers: Sequence[BrokerCapacity], load: float) -> list[float]:
    """Quotas that bring the brokers' total loads to one level (capped at each ``rcap``)."""
    caps = [b.rcap for b in brokers]
    if math.fsum(caps) <= load:
        return caps

    def placed(level: float) -> float:
        return math.fsum(min(max(level - b.load, 0.0), b.rcap) for b in brokers)

    lo, hi = min(b.load for b in brokers), max(b.mcap for b in brokers)
    for _ in range(200):  # bisection on the water level; 200 halvings reach float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if placed(mid) < load else (lo, mid)
    quotas = [min(max(hi - b.load, 0.0), b.rcap) for b in brokers]
    scale = load / math.fsum(quotas)
    return [q * scale for q in quotas]


def maxmin_quotas(brokers: Sequence[BrokerCapacity], load: float) -> list[float]:
    """Water-filling from the smallest ``rcap``: each takes ``min(rcap, left / brokers_left)``."""
    order = sorted(range(len(brokers)), key=lambda i: (brokers[i].rcap, brokers[i].id))
    quotas = [0.0] * len(brokers)
    left = load
    for n, i in enumerate(order):
        quotas[i] = min(brokers[i].rcap, left / (len(order) - n))
        left -= quotas[i]
    return quotas


def fill_in_order(
    publishers: Sequence[PublisherLoad], quotas: Sequence[float], caps: Sequence[float]
) -> tuple[list[list[PublisherLoad]], list[PublisherLoad]]:
    """Blind selection: consecutive publishers to each broker up to its quota (the one that
    crosses it goes where it lands closer); what is left goes wherever capacity remains."""
    out: list[list[PublisherLoad]] = [[] for _ in quotas]
    totals = [0.0] * len(quotas)
    i = 0
    pending = list(publishers)
    rest: list[PublisherLoad] = []
    for p in pending:
        while i < len(quotas) and (
            totals[i] + p.rate / 2 > quotas[i] + _EPS or totals[i] + p.rate > caps[i] + _EPS
        ):
            i += 1
        if i == len(quotas):
            rest.append(p)
            continue
        out[i].append(p)
        totals[i] += p.rate
    unassigned = []
    for p in rest:  # first fit into whatever capacity is left
        j = next((j for j in range(len(caps)) if totals[j] + p.rate <= caps[j] + _EPS), None)
        if j is None:
            unassigned.append(p)
        else:
            out[j].append(p)
            totals[j] += p.rate
    return out, unassigned


def fill_by_group(
    publishers: Sequence[PublisherLoad],
    quotas: Sequence[float],
    caps: Sequence[float],
    seed: int = 0,
) -> tuple[list[list[PublisherLoad]], list[PublisherLoad]]:
    """Correlation-aware selection: every broker takes from every group in proportion to its
    quota. Members that fit a broker's share of their group go first; the remainder of each
    group goes one per broker still short of its share, the furthest behind on its quota
    first.
    Ungrouped publishers form one group. Which members go where is shuffled by ``seed``."""
    n = len(quotas)
    total_quota = math.fsum(quotas)
    shares = [q / total_quota if total_quota else 0.0 for q in quotas]
    out: list[list[PublisherLoad]] = [[] for _ in range(n)]
    totals = [0.0] * n
    groups: dict[str | None, list[PublisherLoad]] = {}
    for p in publishers:
        groups.setdefault(p.group, []).append(p)
    unassigned: list[PublisherLoad] = []
    rng = random.Random(seed)
    for members in groups.values():
        members = list(members)
        rng.shuffle(members)
        members.sort(key=lambda p: -p.rate)  # stable: the shuffle decides among equals
        group_rate = math.fsum(p.rate for p in members)
        got = [0.0] * n
        remainder = []
        for p in members:  # phase 1: whole members within each broker's share of the group
            room = [
                shares[j] * group_rate - got[j]
                if totals[j] + p.rate <= caps[j] + _EPS
                else -math.inf
                for j in range(n)
            ]
            j = max(range(n), key=lambda j: (room[j], -j))
            if room[j] + _EPS >= p.rate:
                out[j].append(p)
                got[j] += p.rate
                totals[j] += p.rate
            else:
                remainder.append(p)
        for p in remainder:  # phase 2: one each to brokers still short of their share
            fits = [j for j in range(n) if totals[j] + p.rate <= caps[j] + _EPS]
            if not fits:
                unassigned.append(p)
                continue
            short = [j for j in fits if got[j] < shares[j] * group_rate - _EPS] or fits
            # The broker furthest behind its quota, relatively: absolute shortfalls would
            # send every remainder to the brokers with the largest quotas.
            j = max(short, key=lambda j: ((quotas[j] - totals[j]) / (quotas[j] or 1), -j))
            out[j].append(p)
            got[j] += p.rate
            totals[j] += p.rate
    return out, unassigned


def parse_policy(name: str) -> Policy:
    """``name`` as a ``Policy``; ValueError naming the choices when it is none."""
    for policy in POLICIES:
        if name == policy:
            return policy
    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")


def place(
    policy: Policy,
    brokers: Sequence[BrokerCapacity],
    topic: TopicSpec,
    seed: int = 0,
    hosts_used: Collection[str] = (),
) -> Placement:
    """Where ``topic``'s publishers go under ``policy``, and each broker's sub-bucket.
    ``hosts_used``: hosts the topic already has elsewhere (placing part of it: a
    failover, publishers left unassigned), spread over last (``by_residual``).

    Capacity short of the topic's load is a result, not an error: what fits is placed,
    the rest listed as unassigned with the shortfall in msg/s.
    """
    policy = parse_policy(policy)  # callers from untyped JSON
    load = topic.load
    if policy == "lb":
        chosen = [b for b in by_residual(brokers, hosts_used) if b.rcap > 0]
    else:
        chosen = fewest_brokers(brokers, load, hosts_used)
    if not chosen:
        return _placement(policy, topic, [], [], list(topic.publishers), brokers)
    if policy in ("lb", "conc"):
        quotas = equal_total_quotas(chosen, load)
    else:
        quotas = maxmin_quotas(chosen, load)
    caps = [b.rcap for b in chosen]
    if policy == "srtm":
        groups, left = fill_by_group(topic.publishers, quotas, caps, seed)
    else:
        groups, left = fill_in_order(topic.publishers, quotas, caps)
    return _placement(policy, topic, chosen, groups, left, brokers)


def _placement(
    policy: Policy,
    topic: TopicSpec,
    chosen: Sequence[BrokerCapacity],
    groups: Sequence[Sequence[PublisherLoad]],
    unassigned: Sequence[PublisherLoad],
    brokers: Sequence[BrokerCapacity],
) -> Placement:
    used = [(b, ps) for b, ps in zip(chosen, groups, strict=True) if ps]
    rates = [math.fsum(p.rate for p in ps) for _, ps in used]
    shortfall = math.fsum(p.rate for p in unassigned)
    largest = max((b.mcap for b in brokers), default=0.0)
    needed = math.ceil(shortfall / largest) if shortfall and largest else 0
    problem = None
    assignments: list[Assignment] = []
    if used:
        # Sub-buckets share out the part of (r, b) that belongs to the placed traffic
        # (all of it, exactly, when everything was placed).
        placed = 1.0 if not unassigned else math.fsum(rates) / topic.load
        try:
            buckets = split_floored(topic.rate * placed, max(1.0, topic.burst * placed), rates)
        except ValueError as exc:
            problem = f"no sub-buckets: {exc}"
            buckets = []
        for i, (b, ps) in enumerate(used):
            bucket = buckets[i] if buckets else None
            assignments.append(Assignment(b.id, tuple(p.id for p in ps), rates[i], bucket))
    return Placement(
        policy,
        tuple(assignments),
        tuple(p.id for p in unassigned),
        shortfall,
        needed,
        problem,
    )
