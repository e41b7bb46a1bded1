from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.ratelimit import BucketParams, merge, split

rates = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False, allow_infinity=False)
weights = st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=1, max_size=12)


@given(rate=rates, weights=weights, burst_per_share=st.floats(min_value=1.0, max_value=1e4))
def test_split_sums_are_exact_in_any_order(
    rate: float, weights: list[float], burst_per_share: float
) -> None:
    burst = burst_per_share * len(weights) * max(weights) / min(weights)
    parts = split(rate, burst, weights)
    assert len(parts) == len(weights)
    assert sum(p.rate for p in parts) == rate
    assert sum(p.rate for p in reversed(parts)) == rate
    assert sum(p.burst for p in parts) == burst
    assert sum(p.burst for p in reversed(parts)) == burst
    assert merge(parts) == BucketParams(rate, burst)
    assert all(p.burst >= 1 and p.rate > 0 for p in parts)


@given(weights=weights)
def test_split_is_proportional(weights: list[float]) -> None:
    parts = split(1000.0, 1000.0 * len(weights) * 100, weights)
    total = sum(weights)
    for p, w in zip(parts, weights, strict=True):
        assert math.isclose(p.rate, 1000.0 * w / total, rel_tol=1e-12, abs_tol=1e-9)


def test_split_refuses_a_sub_bucket_below_one_token() -> None:
    with pytest.raises(ValueError, match=r"share 2 \(weight 0\.1\) would get burst 0\.5"):
        split(100.0, 10.0, [1.0, 0.9, 0.1])


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([], "weights must not be empty"),
        ([0.0, 0.0], "weights must sum to a positive number"),
        ([1.0, -1.0], r"weights\[1\] must be a finite number >= 0, got -1\.0"),
        ([1.0, math.nan], r"weights\[1\] must be a finite number >= 0, got nan"),
        ([math.inf], r"weights\[0\] must be a finite number >= 0, got inf"),
    ],
)
def test_split_rejects_bad_weights(weights: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split(100.0, 10.0, weights)


@pytest.mark.parametrize(
    ("rate", "burst", "message"),
    [
        (0.0, 10.0, "rate must be a finite number > 0, got 0.0"),
        (-5.0, 10.0, "rate must be a finite number > 0, got -5.0"),
        (math.nan, 10.0, "rate must be a finite number > 0, got nan"),
        (math.inf, 10.0, "rate must be a finite number > 0, got inf"),
        (10.0, 0.5, r"burst must be a finite number >= 1 .* got 0\.5"),
        (10.0, math.nan, "burst must be .* got nan"),
    ],
)
def test_params_reject_bad_values(rate: float, burst: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketParams(rate, burst)
    with pytest.raises(ValueError, match=message):
        split(rate, burst, [1.0])


def test_merge_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"at least one"):
        merge([])
