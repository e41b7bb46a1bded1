"""Splitting a topic's bucket into sub-buckets, and merging them back.

Every part is a multiple of the ulp of the total, so the parts add up to the
total exactly in floating point, in any order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

from srtm.ratelimit.params import BucketParams, check_burst, check_rate


def _check_weights(weights: Sequence[float]) -> list[Fraction]:
    if len(weights) == 0:
        raise ValueError("weights must not be empty")
    exact: list[Fraction] = []
    for i, w in enumerate(weights):
        wf = float(w)
        if not math.isfinite(wf) or wf < 0:
            raise ValueError(f"weights[{i}] must be a finite number >= 0, got {w!r}")
        exact.append(Fraction(wf))
    if sum(exact) <= 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)!r}")
    return exact


def _apportion(total: float, weights: list[Fraction]) -> list[float]:
    """Largest-remainder apportionment of ``total`` in units of ``ulp(total)``."""
    quantum = math.ulp(total)
    units = int(Fraction(total) / Fraction(quantum))
    wsum = sum(weights)
    ideal = [units * w / wsum for w in weights]
    floors = [math.floor(x) for x in ideal]
    leftover = units - sum(floors)
    by_remainder = sorted(range(len(ideal)), key=lambda i: (-(ideal[i] - floors[i]), i))
    for i in by_remainder[:leftover]:
        floors[i] += 1
    return [u * quantum for u in floors]


def split(rate: float, burst: float, weights: Sequence[float]) -> list[BucketParams]:
    """Split ``(rate, burst)`` in proportion to ``weights``; sums are exact.

    Raises ValueError naming the share whose sub-bucket would hold less than one
    token or get no rate at all.
    """
    rate = check_rate(rate)
    burst = check_burst(burst)
    exact = _check_weights(weights)
    rates = _apportion(rate, exact)
    bursts = _apportion(burst, exact)
    for i, (r_l, b_l) in enumerate(zip(rates, bursts, strict=True)):
        if b_l < 1:
            raise ValueError(
                f"share {i} (weight {float(weights[i])!r}) would get burst {b_l:.6g} < 1: "
                f"a sub-bucket must hold at least one token (burst {burst!r} split "
                f"{len(weights)} ways)"
            )
        if r_l <= 0:
            raise ValueError(f"share {i} (weight {float(weights[i])!r}) would get rate 0")
    return [BucketParams(r_l, b_l) for r_l, b_l in zip(rates, bursts, strict=True)]


def merge(parts: Iterable[BucketParams]) -> BucketParams:
    """The bucket whose rate and burst are the sums of the parts'."""
    items = list(parts)
    if not items:
        raise ValueError("merge needs at least one sub-bucket")
    return BucketParams(math.fsum(p.rate for p in items), math.fsum(p.burst for p in items))
