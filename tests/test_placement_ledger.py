"""The capacity ledger, pure: allocated is summed from plans, rcap counts the larger of
promised and measured, never goes negative, and is the rcap the policies see."""

from __future__ import annotations

import pytest

from srtm.placement import BrokerCapacity, LedgerEntry, allocated, for_topic, ledger, place
from srtm.placement.model import PublisherLoad, TopicSpec
from srtm.ratelimit import BucketParams


def test_allocated_sums_every_plans_sub_bucket_rates_per_broker() -> None:
    plans = [
        {"a": BucketParams(300.0, 10.0), "b": BucketParams(200.0, 5.0)},
        {"a": BucketParams(0.1, 1.0)},
        {},
    ]
    assert allocated(plans) == {"a": pytest.approx(300.1), "b": 200.0}
    assert allocated([]) == {}


def test_rcap_is_mcap_less_the_larger_of_allocated_and_measured() -> None:
    assert LedgerEntry("a", 1000, allocated=880, measured=100).rcap == pytest.approx(120)
    assert LedgerEntry("a", 1000, allocated=100, measured=700).rcap == pytest.approx(300)
    assert LedgerEntry("a", 1000).rcap == 1000
    # Over-promised or over-measured: zero, never negative.
    assert LedgerEntry("a", 1000, allocated=1500).rcap == 0.0
    assert LedgerEntry("a", 1000, measured=2000).rcap == 0.0


def test_the_ledger_keeps_broker_order_and_gives_the_policies_the_same_rcap() -> None:
    rows = ledger(
        [("b", 1000.0, 50.0), ("a", 1000.0, 0.0), ("c", 500.0, 0.0)],
        [{"a": BucketParams(880.0, 10.0)}, {"zzz": BucketParams(5.0, 1.0)}],
    )
    assert [r.id for r in rows] == ["b", "a", "c"]  # a plan's unknown broker adds no row
    assert [r.allocated for r in rows] == [0.0, 880.0, 0.0]
    for r in rows:
        cap = r.capacity()
        assert isinstance(cap, BrokerCapacity) and cap.rcap == pytest.approx(r.rcap)


def test_a_placement_on_the_ledger_avoids_what_is_promised() -> None:
    spec = TopicSpec("t", tuple(PublisherLoad(f"p{i}", 100.0) for i in range(8)), 10, 5, 880)
    rows = ledger([("a", 1000.0, 0.0), ("b", 1000.0, 0.0)], [{"a": BucketParams(880, 10)}])
    assert place("srtm", [r.capacity() for r in rows], spec, 0).brokers == ("b",)


@pytest.mark.parametrize("policy", ["srtm", "maxmin", "conc", "lb"])
def test_placing_for_the_topic_never_promises_a_broker_more_than_its_mcap(policy: str) -> None:
    # 950 msg/s of publishers fits one broker of 1000, but its bucket (rate 1045) does
    # not: placed in the topic's units, it takes two brokers and neither is over.
    pubs = tuple(PublisherLoad(f"p{i}", 95.0, f"g{i % 2}") for i in range(10))
    spec = TopicSpec("t", pubs, burst=10.0, slo_p99_ms=1.0, rate=1045.0)
    rows = ledger([("a", 1000.0, 0.0), ("b", 1000.0, 0.0)], [])
    fleet = [r.capacity() for r in rows]
    result = place(policy, for_topic(spec, fleet), spec)  # type: ignore[arg-type]
    plan = {a.broker: a.bucket for a in result.assignments if a.bucket is not None}
    assert len(plan) == 2
    for row in ledger([("a", 1000.0, 0.0), ("b", 1000.0, 0.0)], [plan]):
        assert row.allocated <= row.mcap * (1 + 1e-9)
    # Seen with the topic's own units the fleet is smaller, by rate/load exactly.
    assert [b.mcap for b in for_topic(spec, fleet)] == pytest.approx([1000 / 1.1] * 2)
