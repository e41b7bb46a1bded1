"""Incremental placement: where publishers joining a placed topic go, moving nobody.

``join`` takes the topic's current placement (broker -> its publishers) and the fleet
as placement sees it *without this topic's own plan* (``Controller.fleet(exclude=...)``),
so a broker's room for the topic is its ``rcap`` less what the topic already sends there
(publisher rates times ``scale``, the topic's rate per msg/s of load: what the ledger
will count once the bucket is re-split). Publishers already placed never move; each
newcomer, largest rate first, goes where its policy would have put it:

- **SRTM**: to the broker furthest below its quota *for the newcomer's group* (the group's
  rate × the broker's max-min share of the topic, shares by ``maxmin_quotas`` over the
  brokers in use), ties to the one furthest below its whole quota; a new broker (largest
  ``rcap`` first) only when no broker in use has room. Groups stay proportional.
- **MaxMin**: the broker in use furthest below its max-min quota; a new broker as SRTM.
- **Conc**: the broker in use with the lowest total load (all topics), equalising totals;
  a new broker as SRTM.
- **LB**: any broker with room, lowest total load first (LB uses every broker).

A newcomer that fits nowhere is listed as unassigned. Leaving needs no rule here: the
publisher is taken out and the bucket re-split; nobody else moves. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from srtm.placement.model import BrokerCapacity, PublisherLoad
from srtm.placement.policies import Policy, maxmin_quotas, parse_policy

__all__ = ["Joined", "join"]

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Joined:
    """Where each newcomer goes (broker -> new publisher ids) and who fits nowhere."""

    placed: dict[str, tuple[str, ...]]
    unassigned: tuple[str, ...] = ()


def join(
    policy: Policy,
    fleet: Sequence[BrokerCapacity],
    current: Mapping[str, Sequence[PublisherLoad]],
    new: Sequence[PublisherLoad],
    scale: float = 1.0,
) -> Joined:
    """Place ``new`` beside ``current`` under ``policy`` (see the module's rules).
    Brokers of ``current`` missing from ``fleet`` (down) take nobody. ``scale``: what the
    ledger counts per msg/s of publisher rate (the topic's ``rate / load``, e.g. 1.1), so
    that a join never promises a broker more than its ``rcap``."""
    policy = parse_policy(policy)
    by_id = {b.id: b for b in fleet}
    load = {b.id: 0.0 for b in fleet}
    got: dict[tuple[str | None, str], float] = {}  # (group, broker) -> rate
    group_rate: dict[str | None, float] = {}
    for broker, pubs in current.items():
        for p in pubs:
            group_rate[p.group] = group_rate.get(p.group, 0.0) + p.rate
            if broker in load:
                load[broker] += p.rate
                got[p.group, broker] = got.get((p.group, broker), 0.0) + p.rate
    used = [b.id for b in fleet if load[b.id] > 0 or current.get(b.id)]
    placed: dict[str, list[str]] = {}
    unassigned: list[str] = []
    for p in sorted(new, key=lambda p: -p.rate):  # stable: equal rates keep their order

        def fits(b: str, p: PublisherLoad = p) -> bool:
            return (load[b] + p.rate) * scale <= by_id[b].rcap * (1 + _EPS) + _EPS

        pool = list(by_id) if policy == "lb" else used
        candidates = [b for b in pool if fits(b)]
        if not candidates:
            fresh = sorted((b for b in fleet if b.id not in used and fits(b.id)),
                           key=lambda b: (-b.rcap, b.id))  # fmt: skip
            if not fresh:
                unassigned.append(p.id)
                continue
            used.append(fresh[0].id)
            candidates = [fresh[0].id]
        group_rate[p.group] = group_rate.get(p.group, 0.0) + p.rate
        target = _choose(policy, p, candidates, used, by_id, load, got, group_rate)
        placed.setdefault(target, []).append(p.id)
        load[target] += p.rate
        got[p.group, target] = got.get((p.group, target), 0.0) + p.rate
    return Joined({b: tuple(ps) for b, ps in placed.items()}, tuple(unassigned))


def _choose(
    policy: Policy,
    p: PublisherLoad,
    candidates: list[str],
    used: list[str],
    by_id: Mapping[str, BrokerCapacity],
    load: Mapping[str, float],
    got: Mapping[tuple[str | None, str], float],
    group_rate: Mapping[str | None, float],
) -> str:
    if policy in ("lb", "conc"):  # equalise brokers' total loads
        return min(candidates, key=lambda b: (by_id[b].load + load[b], b))
    total = math.fsum(load[b] for b in used) + p.rate
    quotas = maxmin_quotas([by_id[b] for b in used], total)
    quota = dict(zip(used, quotas, strict=True))
    whole = math.fsum(quotas) or 1.0

    def behind(b: str) -> float:  # relative: absolute shortfalls favour the big quotas
        return (quota[b] - load[b]) / (quota[b] or 1.0)

    if policy == "maxmin":
        return max(candidates, key=lambda b: (behind(b), -used.index(b)))

    def group_gap(b: str) -> float:
        return quota[b] / whole * group_rate[p.group] - got.get((p.group, b), 0.0)

    return max(candidates, key=lambda b: (group_gap(b), behind(b), -used.index(b)))
