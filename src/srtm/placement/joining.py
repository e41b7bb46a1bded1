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

``join`` reads the current placement only through its sums (per broker, per group, per
group on a broker), so a caller that keeps them (``Sums``, the controller's per topic)
places a newcomer at a cost independent of the topic's publishers. Sums are exact
(``exact``): the same, to the last bit, as ``math.fsum`` over every rate, whatever the
order publishers came in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from srtm.placement.model import BrokerCapacity, PublisherLoad, RateSum
from srtm.placement.policies import Policy, maxmin_quotas, parse_policy

__all__ = ["Exact", "Joined", "Sums", "exact", "join", "value"]

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Joined:
    """Where each newcomer goes (broker -> new publisher ids) and who fits nowhere."""

    placed: dict[str, tuple[str, ...]]
    unassigned: tuple[str, ...] = ()


#: An exact sum: non-overlapping floats, largest first, whose exact total is the exact
#: total of what was summed (empty: 0). Its first term is that total correctly rounded.
Exact = tuple[float, ...]


def exact(values: Iterable[float]) -> Exact:
    """The exact sum of ``values``: each term is ``math.fsum`` (correctly rounded) of what
    the terms before it left. Canonical: equal totals give equal tuples, so a running sum
    (``exact((*s, x))``) equals the sum taken again from scratch."""
    rest, terms = list(values), []
    while (s := math.fsum(rest)) != 0.0:
        terms.append(s)
        if not math.isfinite(s):  # nothing is left to peel off an inf or a NaN
            break
        rest.append(-s)
    return tuple(terms)


def value(s: Exact) -> float:
    """The exact sum ``s`` correctly rounded: what ``math.fsum`` gives over its values."""
    return s[0] if s else 0.0


@dataclass(eq=True)
class Sums:
    """A placed topic's running sums: its publishers by id, their exact total and the
    largest; per broker of ``assignment`` (broker -> publisher ids) its publishers'
    exact rate and count; per group (None: on its own) the placed publishers' exact rate,
    overall and per broker. ``Sums.of`` takes them from scratch (linear); ``joined`` and
    ``placed`` bring them up to date as publishers join and are appended to a broker."""

    by_id: dict[str, PublisherLoad] = field(default_factory=dict)
    total: Exact = ()
    top: PublisherLoad | None = None
    broker: dict[str, Exact] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    group: dict[str | None, Exact] = field(default_factory=dict)
    group_broker: dict[tuple[str | None, str], Exact] = field(default_factory=dict)

    @classmethod
    def of(
        cls, publishers: Sequence[PublisherLoad], assignment: Mapping[str, Sequence[str]]
    ) -> Sums:
        """Taken from scratch: ``assignment`` is broker -> publisher ids."""
        by_id = {p.id: p for p in publishers}
        placed = {b: [by_id[i] for i in ids if i in by_id] for b, ids in assignment.items()}
        return cls.placed_as(publishers, placed)

    @classmethod
    def placed_as(
        cls, publishers: Sequence[PublisherLoad], placed: Mapping[str, Sequence[PublisherLoad]]
    ) -> Sums:
        """Taken from scratch: ``placed`` is broker -> its publishers."""
        groups: dict[str | None, list[float]] = {}
        pairs: dict[tuple[str | None, str], list[float]] = {}
        for b, ps in placed.items():
            for p in ps:
                groups.setdefault(p.group, []).append(p.rate)
                pairs.setdefault((p.group, b), []).append(p.rate)
        return cls(
            {p.id: p for p in publishers},
            exact(p.rate for p in publishers),
            max(publishers, key=lambda p: p.rate) if publishers else None,
            {b: exact(p.rate for p in ps) for b, ps in placed.items()},
            {b: len(ps) for b, ps in placed.items()},
            {g: exact(rs) for g, rs in groups.items()},
            {k: exact(rs) for k, rs in pairs.items()},
        )

    def rate_sum(self, new: Sequence[PublisherLoad] = ()) -> RateSum:
        """The publishers', with ``new`` joined after them."""
        top = self.top
        for p in new:
            if top is None or p.rate > top.rate:  # ``max`` keeps the first of equals
                top = p
        total = exact((*self.total, *(p.rate for p in new))) if new else self.total
        return RateSum(len(self.by_id) + len(new), value(total), top)

    def rate(self, broker: str) -> float:
        """The rate of the publishers on ``broker`` (``math.fsum`` of theirs)."""
        return value(self.broker.get(broker, ()))

    def joined(self, new: Sequence[PublisherLoad]) -> None:
        """``new`` joined the topic (placed or not)."""
        self.top = self.rate_sum(new).top
        self.total = exact((*self.total, *(p.rate for p in new)))
        self.by_id.update((p.id, p) for p in new)

    def placed(self, broker: str, ids: Sequence[str]) -> None:
        """Publishers ``ids`` (joined) were appended to ``broker``'s list."""
        ps = [self.by_id[i] for i in ids]
        self.broker[broker] = exact((*self.broker.get(broker, ()), *(p.rate for p in ps)))
        self.size[broker] = self.size.get(broker, 0) + len(ids)
        for p in ps:
            self.group[p.group] = exact((*self.group.get(p.group, ()), p.rate))
            k = (p.group, broker)
            self.group_broker[k] = exact((*self.group_broker.get(k, ()), p.rate))


def join(
    policy: Policy,
    fleet: Sequence[BrokerCapacity],
    current: Mapping[str, Sequence[PublisherLoad]] | Sums,
    new: Sequence[PublisherLoad],
    scale: float = 1.0,
) -> Joined:
    """Place ``new`` beside ``current`` under ``policy`` (see the module's rules).
    Brokers of ``current`` missing from ``fleet`` (down) take nobody. ``scale``: what the
    ledger counts per msg/s of publisher rate (the topic's ``rate / load``, e.g. 1.1), so
    that a join never promises a broker more than its ``rcap``. ``current``: broker ->
    its publishers, or their ``Sums`` (then the work is independent of how many)."""
    policy = parse_policy(policy)
    if not isinstance(current, Sums):
        current = Sums.placed_as([p for ps in current.values() for p in ps], current)
    by_id = {b.id: b for b in fleet}
    load = {b.id: current.rate(b.id) for b in fleet}
    groups = {p.group for p in new}
    got = {  # (group, broker) -> rate, for the newcomers' groups
        (g, b.id): value(current.group_broker[g, b.id])
        for g in groups
        for b in fleet
        if (g, b.id) in current.group_broker
    }
    group_rate = {g: value(current.group[g]) for g in groups if g in current.group}
    used = [b.id for b in fleet if load[b.id] > 0 or current.size.get(b.id)]
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
