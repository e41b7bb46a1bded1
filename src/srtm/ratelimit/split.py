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


def split_floored(rate: float, burst: float, weights: Sequence[float]) -> list[BucketParams]:
    """As ``split``, but a share whose burst would fall below one token gets exactly one,
    taken from the others in proportion (the TB Adaptor's floor), so that a small share
    pays a large DRL penalty instead of leaving the topic without sub-buckets.

    Equal to ``split`` whenever ``split`` succeeds. Raises ValueError if ``burst`` is less
    than one token per share, or a share would get no rate.
    """
    rate = check_rate(rate)
    burst = check_burst(burst)
    exact = _check_weights(weights)
    try:
        return split(rate, burst, weights)
    except ValueError:
        pass
    if burst < len(exact):
        raise ValueError(f"burst {burst!r} cannot give each of {len(exact)} sub-buckets one token")
    rates = _apportion(rate, exact)
    bursts = split_amount(burst, [float(w) for w in exact], minimum=1.0)
    for i, r_l in enumerate(rates):
        if r_l <= 0:
            raise ValueError(f"share {i} (weight {float(weights[i])!r}) would get rate 0")
    return [BucketParams(r_l, b_l) for r_l, b_l in zip(rates, bursts, strict=True)]


def split_amount(total: float, weights: Sequence[float], minimum: float = 0.0) -> list[float]:
    """``total`` in parts proportional to ``weights``, none below ``minimum``; sums exact.

    A part whose share would fall below ``minimum`` gets exactly ``minimum`` and the others
    share the rest (in proportion, or evenly when their weights are all 0). Raises
    ValueError if ``total`` cannot give every part ``minimum``.
    """
    if not math.isfinite(total) or total < 0:
        raise ValueError(f"total must be a finite number >= 0, got {total!r}")
    exact = [Fraction(float(w)) for w in weights]
    if not exact or any(w < 0 for w in exact):
        raise ValueError(f"weights must be a non-empty list of numbers >= 0, got {weights!r}")
    if total < minimum * len(exact):
        raise ValueError(
            f"total {total!r} cannot give each of {len(exact)} parts at least {minimum!r}"
        )
    if total == 0:
        return [0.0] * len(exact)
    quantum = Fraction(math.ulp(total))
    units = int(Fraction(total) / quantum)
    low = math.ceil(Fraction(minimum) / quantum)  # the minimum, in whole quanta
    if low * len(exact) > units:
        raise ValueError(
            f"total {total!r} cannot give each of {len(exact)} parts at least {minimum!r}"
        )
    fixed: set[int] = set()
    while True:  # each pass fixes at least one part at the minimum; one always stays free
        free = [i for i in range(len(exact)) if i not in fixed]
        rest = units - low * len(fixed)
        wsum = sum(exact[i] for i in free)
        share = {i: rest * exact[i] / wsum if wsum else Fraction(rest, len(free)) for i in free}
        below = [i for i in free if share[i] < low]
        if not below:
            break
        fixed.update(below)
    parts = dict.fromkeys(fixed, low)
    parts |= {i: math.floor(share[i]) for i in free}
    leftover = rest - sum(parts[i] for i in free)
    for i in sorted(free, key=lambda i: (-(share[i] - parts[i]), i))[:leftover]:
        parts[i] += 1
    return [float(parts[i] * quantum) for i in range(len(exact))]


def merge(parts: Iterable[BucketParams]) -> BucketParams:
    """The bucket whose rate and burst are the sums of the parts'."""
    items = list(parts)
    if not items:
        raise ValueError("merge needs at least one sub-bucket")
    return BucketParams(math.fsum(p.rate for p in items), math.fsum(p.burst for p in items))
