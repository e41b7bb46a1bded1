from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.ratelimit import BucketParams, merge, split, split_amount, split_floored

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


@given(
    st.floats(0.5, 1e7),
    st.lists(st.floats(0, 1e6), min_size=1, max_size=12),
    st.sampled_from([0.0, 1.0, 2.5]),
)
def test_split_amount_is_exact_proportional_and_floored(
    total: float, weights: list[float], minimum: float
) -> None:
    if total < minimum * len(weights):
        with pytest.raises(ValueError, match="at least"):
            split_amount(total, weights, minimum)
        return
    parts = split_amount(total, weights, minimum)
    assert sum(parts) == total and math.fsum(parts) == total
    assert all(p >= minimum for p in parts)
    # Parts above the minimum keep the weights' order.
    free = [(w, p) for w, p in zip(weights, parts, strict=True) if p > minimum]
    for (w1, p1), (w2, p2) in itertools.pairwise(free):
        if w1 > w2 * (1 + 1e-6) + 1e-9:
            assert p1 >= p2 * (1 - 1e-6)


def test_split_amount_raises_parts_to_the_minimum() -> None:
    assert split_amount(10, [1, 1, 1]) == pytest.approx([10 / 3] * 3)
    assert split_amount(3, [5, 0, 0], 1.0) == [1.0, 1.0, 1.0]
    assert split_amount(200, [0, 98, 1], 1.0) == pytest.approx([1, 199 * 98 / 99, 199 / 99])
    with pytest.raises(ValueError, match="weights"):
        split_amount(10, [])


@given(rate=rates, weights=weights, tokens_per_share=st.floats(min_value=1.0, max_value=50.0))
def test_split_floored_gives_every_share_a_token_and_keeps_the_sums(
    rate: float, weights: list[float], tokens_per_share: float
) -> None:
    burst = tokens_per_share * len(weights)
    parts = split_floored(rate, burst, weights)
    assert sum(p.rate for p in parts) == rate and sum(p.burst for p in parts) == burst
    assert all(p.burst >= 1 and p.rate > 0 for p in parts)
    try:
        strict = split(rate, burst, weights)
    except ValueError:
        assert min(p.burst for p in parts) == 1.0  # only the floor made it possible
    else:
        assert parts == strict


def test_split_floored_takes_the_floor_from_the_others_in_proportion() -> None:
    parts = split_floored(1645.0, 20.0, [920.0, 380.0, 190.0, 10.0])
    assert parts[3].burst == 1.0 and parts[3].rate == pytest.approx(1645.0 * 10 / 1500)
    rest = [p.burst for p in parts[:3]]
    assert sum(rest) == pytest.approx(19.0)
    assert rest[0] / rest[1] == pytest.approx(920 / 380)
    with pytest.raises(ValueError, match=r"burst 3\.0 cannot give each of 4 sub-buckets one token"):
        split_floored(100.0, 3.0, [1.0, 1.0, 1.0, 1.0])
