"""The TB Adaptor's rule: shares follow traffic, sums stay (r, b), depths >= 1, no barrier."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.placement.adaptor import AdaptorSettings, WindowReport, adapt
from srtm.ratelimit import BucketParams, split

TOTAL = BucketParams(11_000, 200)


def even(brokers: list[str]) -> dict[str, BucketParams]:
    return dict(zip(brokers, split(TOTAL.rate, TOTAL.burst, [1] * len(brokers)), strict=True))


def test_rates_and_depths_follow_a_traffic_shift() -> None:
    current = even(["a", "b"])
    reports = {"a": WindowReport(9_000, 90, at_s=10), "b": WindowReport(1_000, 10, at_s=10)}
    new = adapt(TOTAL, current, reports, now_s=10)
    assert new["a"].rate == pytest.approx(9_900) and new["b"].rate == pytest.approx(1_100)
    assert new["a"].burst == pytest.approx(180) and new["b"].burst == pytest.approx(20)
    assert sum(p.rate for p in new.values()) == TOTAL.rate
    assert sum(p.burst for p in new.values()) == TOTAL.burst


def test_small_changes_are_ignored() -> None:
    current = even(["a", "b"])
    reports = {"a": WindowReport(5_200, 52, at_s=1), "b": WindowReport(4_800, 48, at_s=1)}
    assert adapt(TOTAL, current, reports, now_s=1) == current


def test_a_silent_broker_keeps_its_share_and_holds_nobody_up() -> None:
    current = even(["a", "b", "c"])
    reports = {
        "a": WindowReport(8_000, 80, at_s=100),
        "b": WindowReport(1_000, 10, at_s=100),
        "c": WindowReport(5_000, 50, at_s=90),  # 10 s old: stale
    }
    new = adapt(TOTAL, current, reports, now_s=100, settings=AdaptorSettings(stale_after_s=3))
    assert new["c"] == current["c"]
    assert new["a"].rate > 4 * new["b"].rate
    assert math.fsum(p.rate for p in new.values()) == pytest.approx(TOTAL.rate, rel=1e-12)
    assert math.fsum(p.burst for p in new.values()) == pytest.approx(TOTAL.burst, rel=1e-12)
    assert adapt(TOTAL, current, {}, now_s=100) == current  # nobody reported: nothing moves


def test_an_idle_broker_keeps_a_token_and_some_rate() -> None:
    current = even(["busy", "idle"])
    reports = {"busy": WindowReport(10_000, 150, at_s=0), "idle": WindowReport(0, 0, at_s=0)}
    new = adapt(TOTAL, current, reports, now_s=0)
    assert new["idle"].burst == 1.0 and new["idle"].rate > 0
    assert new["busy"].burst == TOTAL.burst - 1


@given(
    st.lists(st.tuples(st.floats(0, 1e5), st.floats(0, 1e3), st.booleans()), min_size=1, max_size=8)
)
def test_any_reports_keep_the_invariants(rows: list[tuple[float, float, bool]]) -> None:
    brokers = [f"b{i}" for i in range(len(rows))]
    current = even(brokers)
    reports = {
        b: WindowReport(rate, backlog, at_s=0 if fresh else -100)
        for b, (rate, backlog, fresh) in zip(brokers, rows, strict=True)
    }
    new = adapt(TOTAL, current, reports, now_s=0)
    assert set(new) == set(brokers)
    assert all(p.burst >= 1 and p.rate > 0 for p in new.values())
    assert math.fsum(p.rate for p in new.values()) == pytest.approx(TOTAL.rate, rel=1e-12)
    assert math.fsum(p.burst for p in new.values()) == pytest.approx(TOTAL.burst, rel=1e-12)
    for b, (_, _, fresh) in zip(brokers, rows, strict=True):
        if not fresh:
            assert new[b] == current[b]


# -- queues behind a sub-bucket (issue 28) ------------------------------------------------
def test_a_small_share_handed_a_backlog_gets_the_headroom_to_drain_it() -> None:
    # b carries 1,000 msg/s on 1,100: a queue of 500 would drain at 100/s (5 s), delaying
    # everything behind it; the topic's 1,000/s of headroom drains it in about a second.
    current = {"a": BucketParams(9_900, 180), "b": BucketParams(1_100, 20)}
    reports = {"a": WindowReport(9_000, 90, at_s=0), "b": WindowReport(1_000, 10, 0, waiting=500)}
    new = adapt(TOTAL, current, reports, now_s=0)
    assert new["b"].rate == pytest.approx(1_550)
    assert new["a"].rate == pytest.approx(9_450) and new["a"].rate > 9_000  # a keeps up
    assert math.fsum(p.rate for p in new.values()) == pytest.approx(TOTAL.rate, rel=1e-12)


def test_a_deep_queue_moves_rate_while_the_plan_settles() -> None:
    # Just after a plan change the windows under-report; only a queue deeper than its
    # bucket moves rate, at most max_take of the other shares.
    current = {"a": BucketParams(10_000, 180), "b": BucketParams(1_000, 20)}
    reports = {"a": WindowReport(2_000, 9, at_s=0), "b": WindowReport(100, 1, 0, waiting=300)}
    new = adapt(TOTAL, current, reports, now_s=0, settling=True)
    assert new["b"].rate == pytest.approx(1_000 * 10_700 / 11_000 + 300)
    assert new["a"].rate >= 0.95 * current["a"].rate
    assert new["a"].burst == current["a"].burst and new["b"].burst == current["b"].burst
    assert math.fsum(p.rate for p in new.values()) == pytest.approx(TOTAL.rate, rel=1e-12)
    # Without a deep queue, nothing moves while settling (the windows cannot be trusted).
    calm = {**reports, "b": WindowReport(100, 1, 0, waiting=5)}
    assert adapt(TOTAL, current, calm, now_s=0, settling=True) == current


@given(
    st.lists(
        st.tuples(st.floats(0, 1e5), st.floats(0, 1e3), st.floats(0, 1e5), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
def test_any_queues_keep_the_invariants(
    rows: list[tuple[float, float, float, bool]], settling: bool
) -> None:
    brokers = [f"b{i}" for i in range(len(rows))]
    current = even(brokers)
    reports = {
        b: WindowReport(rate, backlog, at_s=0 if fresh else -100, waiting=waiting)
        for b, (rate, backlog, waiting, fresh) in zip(brokers, rows, strict=True)
    }
    new = adapt(TOTAL, current, reports, now_s=0, settling=settling)
    assert all(p.burst >= 1 and p.rate > 0 for p in new.values())
    assert math.fsum(p.rate for p in new.values()) == pytest.approx(TOTAL.rate, rel=1e-12)
    assert math.fsum(p.burst for p in new.values()) == pytest.approx(TOTAL.burst, rel=1e-12)
    if settling:  # no share loses more than max_take of itself
        assert all(new[b].rate >= 0.95 * current[b].rate - 1e-9 for b in brokers)
