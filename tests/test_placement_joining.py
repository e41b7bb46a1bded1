"""Incremental placement (srtm.placement.joining): publishers join a placed topic and
nobody already placed moves; no broker goes over its rcap; SRTM keeps groups proportional."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.placement import POLICIES, BrokerCapacity, Policy, PublisherLoad, TopicSpec, join, place


def pubs(n: int, groups: int, rate: float = 10.0, prefix: str = "p") -> list[PublisherLoad]:
    return [PublisherLoad(f"{prefix}{i}", rate, f"g{i % groups}") for i in range(n)]


def spread(current: dict[str, list[PublisherLoad]]) -> dict[str, Counter[str | None]]:
    return {b: Counter(p.group for p in ps) for b, ps in current.items()}


def test_a_new_group_member_goes_to_the_broker_furthest_below_its_group_quota() -> None:
    fleet = [BrokerCapacity("b0", 1000), BrokerCapacity("b1", 1000)]
    a = [PublisherLoad("a0", 10, "g"), PublisherLoad("a1", 10, "g"), PublisherLoad("h0", 10, "h")]
    b = [PublisherLoad("a2", 10, "g"), PublisherLoad("h1", 10, "h"), PublisherLoad("h2", 10, "h")]
    out = join("srtm", fleet, {"b0": a, "b1": b}, [PublisherLoad("new", 10, "g")])
    assert out.placed == {"b1": ("new",)}  # b1 has one of g, b0 two: equal quotas
    out = join("srtm", fleet, {"b0": a, "b1": b}, [PublisherLoad("new", 10, "h")])
    assert out.placed == {"b0": ("new",)}


def test_no_new_broker_while_the_used_ones_have_room() -> None:
    fleet = [BrokerCapacity("b0", 100), BrokerCapacity("b1", 1000)]
    current = {"b0": pubs(5, 2)}  # 50 of b0's 100
    out = join("srtm", fleet, current, pubs(5, 2, prefix="n"))
    assert out.placed == {"b0": tuple(f"n{i}" for i in range(5))}
    out = join("srtm", fleet, current, pubs(6, 2, prefix="n"))  # one does not fit on b0
    assert set(out.placed) == {"b0", "b1"} and len(out.placed["b1"]) == 1
    assert not out.unassigned


def test_what_fits_nowhere_is_unassigned() -> None:
    out = join("conc", [BrokerCapacity("b0", 25)], {"b0": pubs(2, 1)}, pubs(2, 1, prefix="n"))
    assert out.placed == {} and out.unassigned == ("n0", "n1")


def test_lb_uses_every_broker_and_evens_total_load() -> None:
    fleet = [BrokerCapacity("b0", 1000, 500), BrokerCapacity("b1", 1000)]
    out = join("lb", fleet, {"b0": pubs(1, 1)}, pubs(3, 1, prefix="n"))
    assert out.placed == {"b1": ("n0", "n1", "n2")}


brokers_st = st.lists(
    st.tuples(st.integers(20, 400), st.integers(0, 100)), min_size=1, max_size=5
).map(lambda xs: [BrokerCapacity(f"b{i}", float(m + u), float(u)) for i, (m, u) in enumerate(xs)])
pubs_st = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(POLICIES), brokers_st, pubs_st, pubs_st)
def test_nobody_moves_and_no_broker_goes_over_its_rcap(
    policy: Policy,
    fleet: list[BrokerCapacity],
    first: list[tuple[int, int]],
    later: list[tuple[int, int]],
) -> None:
    old = [PublisherLoad(f"o{i}", float(r), f"g{g}") for i, (r, g) in enumerate(first)]
    new = [PublisherLoad(f"n{i}", float(r), f"g{g}") for i, (r, g) in enumerate(later)]
    spec = TopicSpec("t", tuple(old), 10, 5, 1.1 * math.fsum(p.rate for p in old))
    placed = place(policy, fleet, spec)
    by_id = {p.id: p for p in old}
    current = {a.broker: [by_id[p] for p in a.publishers] for a in placed.assignments}
    out = join(policy, fleet, current, new)
    # every newcomer placed once or unassigned; nobody old is named
    named = [p for ps in out.placed.values() for p in ps] + list(out.unassigned)
    assert sorted(named) == sorted(p.id for p in new)
    rate = {p.id: p.rate for p in [*old, *new]}
    for b in fleet:
        total = math.fsum(rate[p] for p in [*(x.id for x in current.get(b.id, [])),
                                            *out.placed.get(b.id, ())])  # fmt: skip
        before = math.fsum(p.rate for p in current.get(b.id, []))
        if out.placed.get(b.id):  # a broker joined onto stays within its rcap
            assert total <= b.rcap * (1 + 1e-9) + 1e-9 or total == before
    # an unassigned newcomer fit nowhere
    loads = {b.id: math.fsum(rate[p.id] for p in current.get(b.id, [])) for b in fleet}
    for b, ps in out.placed.items():
        loads[b] += math.fsum(rate[p] for p in ps)
    for p in out.unassigned:
        assert all(loads[b.id] + rate[p] > b.rcap * (1 + 1e-9) for b in fleet)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.integers(0, 3), min_size=0, max_size=20),
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
)
def test_srtm_groups_stay_within_one_publisher_per_broker(
    k: int, first: list[int], later: list[int]
) -> None:
    """Equal rates, room everywhere, k brokers in use with equal quotas: every group's
    members differ by at most one between brokers, join after join."""
    fleet = [BrokerCapacity(f"b{i}", 1e6) for i in range(k)]
    current: dict[str, list[PublisherLoad]] = {f"b{i}": [] for i in range(k)}
    for i, g in enumerate(first):  # start balanced: round robin per group
        n = sum(1 for x in first[:i] if x == g)
        current[f"b{n % k}"].append(PublisherLoad(f"o{i}", 1.0, f"g{g}"))
    current["b0"].append(PublisherLoad("seed", 1.0, None))  # every broker in use
    for i in range(1, k):
        current[f"b{i}"].append(PublisherLoad(f"seed{i}", 1.0, None))
    for i, g in enumerate(later):
        p = PublisherLoad(f"n{i}", 1.0, f"g{g}")
        out = join("srtm", fleet, current, [p])
        ((b, ids),) = out.placed.items()
        assert ids == (p.id,)
        current[b].append(p)
        counts = spread(current)
        for grp in {q.group for ps in current.values() for q in ps}:
            per = [counts[b][grp] for b in current]
            assert max(per) - min(per) <= 1, (grp, per)
