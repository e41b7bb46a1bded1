"""The storage-latency bound (srtm.utility.storage): a reliable flow's producers wait for
each acknowledgement, so the disk's latency bounds the rate they can send."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.utility.storage import (
    LatencyEstimate,
    Logger,
    closed_loop_rates,
    inherent_latency,
    rate_bound,
    reachable_rate,
    unloaded_write_s,
)


def test_inherent_latency_leaves_out_the_schedulers_wait() -> None:
    assert inherent_latency(1_000_000, 6_000_000, 2_000_000) == pytest.approx(0.003)
    assert inherent_latency(0, 1_000, 5_000) == 0.0
    with pytest.raises(ValueError, match="before received"):
        inherent_latency(10, 5)


def test_rate_bound_is_producers_over_latency_within_the_range() -> None:
    assert rate_bound(10, 200, 2, 0.020) == pytest.approx(100)
    assert rate_bound(10, 200, 2, 0.001) == 200  # not binding
    assert rate_bound(10, 200, 1, 1.0) == 10  # never under r_min
    assert rate_bound(10, 200, 4, 0.02, per_transaction=2) == 200
    assert rate_bound(10, 200, 1, None) == 200  # no estimate yet
    with pytest.raises(ValueError):
        rate_bound(10, 200, -1, 0.1)


def test_logger_latency_grows_with_load_and_is_infinite_at_its_bandwidth() -> None:
    disk = Logger(bandwidth_bps=10e6, write_s=0.002)
    assert disk.latency(0) == pytest.approx(0.002)
    assert disk.latency(5e6) == pytest.approx(0.004)
    assert math.isinf(disk.latency(10e6))
    assert unloaded_write_s(disk.latency(5e6), 5e6, 10e6) == pytest.approx(0.002)
    assert unloaded_write_s(math.inf, 5e6, 10e6) is None


@given(
    producers=st.integers(1, 20),
    write_ms=st.floats(0.1, 20),
    record=st.floats(100, 1e5),
    other=st.floats(0, 0.9),
)
def test_reachable_rate_is_the_closed_loops_fixed_point(
    producers: int, write_ms: float, record: float, other: float
) -> None:
    disk = Logger(bandwidth_bps=50e6, write_s=write_ms / 1e3)
    got, latency = closed_loop_rates(
        disk, {"f": 1e9}, {"f": producers}, {"f": record}, background_bps=other * 50e6
    )
    want = reachable_rate(producers, write_ms / 1e3, 50e6, record, other * 50e6)
    assert got["f"] == pytest.approx(want, rel=1e-6)
    assert got["f"] == pytest.approx(producers / latency, rel=1e-6)


def test_an_allowance_under_the_bound_is_what_the_flow_sends() -> None:
    disk = Logger(bandwidth_bps=20e6, write_s=0.002)
    got, latency = closed_loop_rates(disk, {"f": 50.0}, {"f": 1}, {"f": 1064.0 * 201})
    assert got["f"] == 50.0
    assert latency < 1 / 50


def test_latency_estimate_smooths_and_skips_nonsense() -> None:
    est = LatencyEstimate(alpha=0.5)
    assert est.update(0.010) == 0.010
    assert est.update(0.020) == pytest.approx(0.015)
    assert est.update(math.nan) == pytest.approx(0.015)
    assert est.update(-1) == pytest.approx(0.015)
    with pytest.raises(ValueError):
        LatencyEstimate(alpha=0)
