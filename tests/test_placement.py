"""Load-distribution policies: the paper's Fig. 6 scenario, group proportionality, properties."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.placement import (
    POLICIES,
    BrokerCapacity,
    PublisherLoad,
    TopicSpec,
    parse_brokers,
    parse_policy,
    parse_topic,
    place,
)
from srtm.placement.policies import equal_total_quotas, maxmin_quotas


def fig6_brokers() -> list[BrokerCapacity]:
    """Brokers 1–6 preloaded with 10…80 kmsg/s, mcap 90 kmsg/s (the paper's Fig. 6)."""
    loads = (10, 40, 50, 60, 70, 80)
    return [BrokerCapacity(f"b{i + 1}", 90_000, load * 1_000) for i, load in enumerate(loads)]


def topic_of(
    n: int, rate: float = 10.0, group_size: int | None = None, burst: float = 500
) -> TopicSpec:
    pubs = tuple(
        PublisherLoad(f"p{i}", rate, None if group_size is None else f"g{i // group_size}")
        for i in range(n)
    )
    return TopicSpec("t", pubs, burst, 1.0, 1.1 * n * rate)


def shares(policy: str, brokers: list[BrokerCapacity], topic: TopicSpec) -> dict[str, float]:
    placement = place(policy, brokers, topic)  # type: ignore[arg-type]
    assert placement.shortfall == 0
    return {a.broker: a.rate for a in placement.assignments}


def test_fig6_brokers_chosen_by_each_policy() -> None:
    topic = topic_of(14_000)  # 140 kmsg/s: residual capacity 80 + 50 + 40 needs three brokers
    for policy in ("conc", "maxmin", "srtm"):
        assert sorted(shares(policy, fig6_brokers(), topic)) == ["b1", "b2", "b3"]
    # LB spreads over every broker below the common level; b6 (80 k) is already above it.
    assert sorted(shares("lb", fig6_brokers(), topic)) == ["b1", "b2", "b3", "b4", "b5"]


def test_fig6_third_broker_share_conc_versus_maxmin() -> None:
    topic = topic_of(14_000)
    conc = shares("conc", fig6_brokers(), topic)
    maxmin = shares("maxmin", fig6_brokers(), topic)
    # Conc levels total loads: 10+70 = 40+40 = 50+30 = 80 k, so b3 gets 30 k.
    assert conc == {"b1": 70_000, "b2": 40_000, "b3": 30_000}
    # MaxMin fills from the smallest residual: b3 min(40, 140/3) = 40, b2 min(50, 100/2) = 50.
    assert maxmin == {"b1": 50_000, "b2": 50_000, "b3": 40_000}
    assert min(maxmin.values()) > min(conc.values())
    # SRTM keeps MaxMin's quotas while it splits groups of 25 over the three brokers.
    assert shares("srtm", fig6_brokers(), topic_of(14_000, group_size=25)) == maxmin


def test_lb_levels_total_load_over_all_brokers() -> None:
    lb = shares("lb", fig6_brokers(), topic_of(14_000))
    totals = {b.id: b.load + lb.get(b.id, 0) for b in fig6_brokers()}
    assert {totals[b] for b in lb} == {74_000}  # (310 k + 140 k − 80 k) / 5


def test_quota_rules_directly() -> None:
    brokers = [
        BrokerCapacity("a", 100, 0),
        BrokerCapacity("b", 100, 60),
        BrokerCapacity("c", 100, 90),
    ]
    # rcap 100, 40, 10: MaxMin from the smallest: 10, then min(40, 90/2), then the rest.
    assert maxmin_quotas(brokers, 100) == pytest.approx([50, 40, 10])
    # Equal total load: a and b meet at 80 (c, at 90 already, gets nothing).
    assert equal_total_quotas(brokers, 100) == pytest.approx([80, 20, 0])


def test_srtm_takes_every_group_in_proportion() -> None:
    topic = topic_of(1_000, group_size=25)  # 40 groups of 25
    placement = place("srtm", fig6_brokers(), topic)
    quota_share = {a.broker: a.rate / topic.load for a in placement.assignments}
    group_of = {p.id: p.group for p in topic.publishers}
    for a in placement.assignments:
        per_group = Counter(group_of[p] for p in a.publishers)
        ideal = 25 * quota_share[a.broker]
        for g in {p.group for p in topic.publishers}:
            assert math.floor(ideal) - 1 <= per_group[g] <= math.ceil(ideal) + 1, (a.broker, g)


def test_srtm_splits_bursts_maxmin_does_not() -> None:
    brokers = [BrokerCapacity(f"b{i}", 1_000, 0) for i in range(3)]
    topic = topic_of(300, rate=10, group_size=30)  # 3 kmsg/s: all three brokers needed
    for policy, spread in (("srtm", True), ("maxmin", False)):
        placement = place(policy, brokers, topic)
        group_of = {p.id: p.group for p in topic.publishers}
        brokers_per_group = Counter()
        for a in placement.assignments:
            for g in {group_of[p] for p in a.publishers}:
                brokers_per_group[g] += 1
        assert all(n == 3 for n in brokers_per_group.values()) is spread


def test_shortfall_is_a_result_naming_what_is_missing() -> None:
    brokers = [BrokerCapacity("a", 1_000, 900), BrokerCapacity("b", 1_000, 500)]  # 600 msg/s left
    topic = topic_of(100, rate=10)  # 1,000 msg/s
    for policy in POLICIES:
        placement = place(policy, brokers, topic)
        assert placement.shortfall == pytest.approx(400)
        assert len(placement.unassigned) == 40
        assert placement.brokers_needed == 1
        assert math.fsum(a.rate for a in placement.assignments) == pytest.approx(600)
    none_left = place("srtm", [BrokerCapacity("a", 100, 100)], topic)
    assert none_left.assignments == () and len(none_left.unassigned) == 100
    assert none_left.brokers_needed == 10


def test_same_seed_same_placement() -> None:
    topic = topic_of(2_000, group_size=7)
    a = place("srtm", fig6_brokers(), topic, seed=3)
    b = place("srtm", fig6_brokers(), topic, seed=3)
    assert a == b


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[BrokerCapacity], TopicSpec]:
    n_brokers = draw(st.integers(1, 6))
    brokers = [
        BrokerCapacity(f"b{i}", draw(st.floats(100, 10_000)), draw(st.floats(0, 10_000)))
        for i in range(n_brokers)
    ]
    n = draw(st.integers(1, 120))
    pubs = tuple(
        PublisherLoad(
            f"p{i}",
            draw(st.floats(0.5, 200)),
            draw(st.one_of(st.none(), st.sampled_from(["g1", "g2", "g3", "g4"]))),
        )
        for i in range(n)
    )
    load = math.fsum(p.rate for p in pubs)
    return brokers, TopicSpec("t", pubs, draw(st.floats(1, 5_000)), 1.0, 1.1 * load)


@given(scenarios(), st.sampled_from(POLICIES), st.integers(0, 3))
def test_every_publisher_once_capacity_kept_sums_exact(
    scenario: tuple[list[BrokerCapacity], TopicSpec], policy: str, seed: int
) -> None:
    brokers, topic = scenario
    placement = place(policy, brokers, topic, seed)  # type: ignore[arg-type]
    seen = [p for a in placement.assignments for p in a.publishers] + list(placement.unassigned)
    assert sorted(seen) == sorted(p.id for p in topic.publishers)
    rcap = {b.id: b.rcap for b in brokers}
    rate_of = {p.id: p.rate for p in topic.publishers}
    for a in placement.assignments:
        assert a.publishers
        assert a.rate == pytest.approx(math.fsum(rate_of[p] for p in a.publishers))
        assert a.rate <= rcap[a.broker] * (1 + 1e-9)
    if placement.problem is None and not placement.unassigned:
        buckets = [a.bucket for a in placement.assignments]
        assert all(b is not None and b.burst >= 1 for b in buckets)
        assert math.fsum(b.rate for b in buckets if b) == topic.rate
        assert math.fsum(b.burst for b in buckets if b) == topic.burst
    if placement.unassigned:
        assert placement.shortfall == pytest.approx(
            math.fsum(rate_of[p] for p in placement.unassigned)
        )


def test_a_small_share_gets_one_token_taken_from_the_others() -> None:
    brokers = [BrokerCapacity("b1", 300, 0), BrokerCapacity("b2", 11, 0)]
    placement = place("conc", brokers, topic_of(31, rate=10, burst=20))
    small = next(a for a in placement.assignments if a.broker == "b2")
    assert placement.problem is None and len(small.publishers) == 1
    assert small.bucket is not None and small.bucket.burst == 1.0  # 20/31 of a token, floored
    assert math.fsum(a.bucket.burst for a in placement.assignments if a.bucket) == 20


def test_a_share_too_small_for_one_token_is_reported() -> None:
    brokers = [BrokerCapacity(f"b{i}", 100, 0) for i in range(4)]
    placement = place("lb", brokers, topic_of(40, rate=10, burst=2))
    assert placement.problem is not None and "burst" in placement.problem
    assert all(a.bucket is None for a in placement.assignments)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "non-empty"),
        ([{"id": "b1"}], r"brokers\[0\]: missing field 'mcap'"),
        ([{"id": "b1", "mcap": -5}], r"brokers\[0\].mcap must be > 0"),
        ([{"id": "b1", "mcap": 5}, {"id": "b1", "mcap": 5}], "duplicate ids"),
        ([{"id": "", "mcap": 5}], r"brokers\[0\].id"),
    ],
)
def test_bad_brokers_name_the_field(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_brokers(doc)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"slo_p99_ms": 1, "burst": 5, "publishers": [{"id": "p", "rate": 1}]}, "topic.name"),
        ({"name": "t", "slo_p99_ms": 1, "burst": 0.5, "publishers": [{"id": "p", "rate": 1}]},
         "topic.burst must be >= 1"),
        ({"name": "t", "slo_p99_ms": 1, "burst": 5, "publishers": []}, "topic.publishers"),
        ({"name": "t", "slo_p99_ms": 1, "burst": 5, "publishers": [{"id": "p"}]},
         r"topic.publishers\[0\]: missing field 'rate'"),
        ({"name": "t", "burst": 5, "publishers": [{"id": "p", "rate": 1}]}, "slo_p99_ms"),
        ({"name": "t", "slo_p99_ms": 1, "burst": 5, "publishers": [{"id": "p", "rate": 1,
          "group": 3}]}, "group must be a string"),
    ],
)  # fmt: skip
def test_bad_topics_name_the_field(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_topic(doc)


def test_topic_rate_defaults_to_the_papers_margin_and_extra_fields_pass() -> None:
    topic = parse_topic(
        {"name": "t", "slo_p99_ms": 1.0, "burst": 200, "note": "extra", "publishers": [
            {"id": "p1", "rate": 10, "group": "g1", "site": "x"}, {"id": "p2", "rate": 30}]}
    )  # fmt: skip
    assert topic.rate == pytest.approx(44.0) and topic.load == 40
    assert topic.publishers[1].group is None


def test_policy_names_parse_to_themselves_and_others_are_refused() -> None:
    assert [parse_policy(str(p)) for p in POLICIES] == list(POLICIES)
    with pytest.raises(ValueError, match="policy must be one of lb, conc, maxmin, srtm, got 'LB'"):
        parse_policy("LB")
    with pytest.raises(ValueError, match="got 'random'"):
        place("random", fig6_brokers(), topic_of(10, rate=10))  # type: ignore[arg-type]
