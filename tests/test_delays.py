from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clocks import FakeClock
from srtm.analysis import delays as delays_module
from srtm.analysis import grid_delays, profile_bucket, required_burst, token_delays
from srtm.ratelimit import Grid, TokenBucket, grid

MS = 1_000_000


def reserve_one_by_one(arrivals: np.ndarray, rate: float, burst: float) -> np.ndarray:
    bucket = TokenBucket(rate, burst, clock=FakeClock())
    return np.array([bucket.reserve(at=int(a)).wait_ns for a in arrivals], dtype=np.int64)


def loaded_trace(rng: np.random.Generator, n: int, rate: float, load: float) -> np.ndarray:
    gaps = rng.exponential(1e9 / (load * rate), n)
    gaps[rng.random(n) < 0.2] = 0  # some simultaneous arrivals (bursts)
    return (1_700_000_000 * 10**9 + np.cumsum(gaps)).astype(np.int64)


@given(
    gaps=st.lists(st.integers(min_value=0, max_value=3 * MS), min_size=1, max_size=100),
    rate=st.floats(min_value=1.0, max_value=1e7),
    burst=st.floats(min_value=1.0, max_value=40.0),
)
def test_token_delays_equal_reserve_exactly(gaps: list[int], rate: float, burst: float) -> None:
    arrivals = np.cumsum(np.array(gaps, dtype=np.int64))
    assert np.array_equal(
        token_delays(arrivals, rate, burst), reserve_one_by_one(arrivals, rate, burst)
    )


@pytest.mark.parametrize("seed", range(4))
def test_token_delays_equal_reserve_on_random_loaded_traces(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rate = float(rng.uniform(100, 1e5))
    burst = float(rng.uniform(1, 30))
    arrivals = loaded_trace(rng, 20_000, rate, float(rng.uniform(0.7, 1.3)))
    expected = reserve_one_by_one(arrivals, rate, burst)
    assert (expected > 0).mean() > 0.05  # the trace really exercises the bucket
    assert np.array_equal(token_delays(arrivals, rate, burst), expected)


def test_chunked_evaluation_matches_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    arrivals = loaded_trace(rng, 5_000, 5000.0, 1.1)
    whole = token_delays(arrivals, 5000.0, 4.0)
    monkeypatch.setattr(delays_module, "_CHUNK", 7)
    assert np.array_equal(token_delays(arrivals, 5000.0, 4.0), whole)


@given(
    gaps=st.lists(st.integers(min_value=0, max_value=2 * MS), min_size=1, max_size=200),
    rate=st.sampled_from([500.0, 1000.0, 3333.0, 20_000.0]),
    quantile=st.sampled_from([0.5, 0.9, 0.99, 1.0]),
)
def test_required_burst_is_the_smallest(gaps: list[int], rate: float, quantile: float) -> None:
    arrivals = np.cumsum(np.array(gaps, dtype=np.int64))
    need = math.ceil(quantile * arrivals.size)
    b = required_burst(arrivals, rate, quantile)
    assert (token_delays(arrivals, rate, b) == 0).sum() >= need
    g = grid(rate, b)
    if g.tau > 0:  # one nanosecond less tolerance must not be enough
        smaller = grid_delays(arrivals, Grid(g.t, g.tau - 1))
        assert (smaller == 0).sum() < need


def test_profile_bucket_follows_the_papers_recipe() -> None:
    rng = np.random.default_rng(3)
    arrivals = loaded_trace(rng, 50_000, 10_000.0, 1.0)
    params = profile_bucket(arrivals)
    measured = (arrivals.size - 1) * 1e9 / (arrivals[-1] - arrivals[0])
    assert params.rate == pytest.approx(1.1 * measured, rel=1e-12)
    zero_wait = (token_delays(arrivals, params.rate, params.burst) == 0).mean()
    assert zero_wait >= 0.99
    assert params.burst == required_burst(arrivals, params.rate, 0.99)


@pytest.mark.parametrize(
    ("arrivals", "message"),
    [
        ([5, 3], r"arrivals_ns must be sorted: arrivals_ns\[1\]=3 < arrivals_ns\[0\]=5"),
        ([1.0, 2.0], r"arrivals_ns must hold integer nanoseconds, got dtype float64"),
        ([[1, 2]], r"arrivals_ns must be one-dimensional"),
    ],
)
def test_bad_arrivals_are_named(arrivals: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_delays(arrivals, 10.0, 1.0)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match=r"rate must be a finite number > 0, got nan"):
        token_delays([1, 2], math.nan, 1.0)
    with pytest.raises(ValueError, match=r"burst must be a finite number >= 1"):
        token_delays([1, 2], 10.0, 0.0)
    with pytest.raises(ValueError, match=r"quantile must be in \(0, 1\], got 1.5"):
        required_burst([1, 2], 10.0, 1.5)
    with pytest.raises(ValueError, match=r"at least two arrivals"):
        profile_bucket([5])
    with pytest.raises(ValueError, match=r"margin must be a finite number > 0"):
        profile_bucket([1, 2], margin=-1)


def test_empty_trace_has_no_delays() -> None:
    assert token_delays(np.array([], dtype=np.int64), 10.0, 1.0).size == 0
