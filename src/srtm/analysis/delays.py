"""Vectorised token-bucket evaluation of arrival traces.

For a FIFO GCRA shaper the virtual start ``X_n = max(TAT_n, t_n)`` obeys Lindley's
recursion ``X_n = max(X_{n−1} + T, t_n)``, whose solution is
``X_n = n·T + max_{j≤n}(t_j − j·T)``: a cumulative maximum. Message ``n`` waits
``max(0, X_n − τ − t_n)``. The arithmetic is the integer nanosecond grid of
``srtm.ratelimit``, so results equal ``TokenBucket.reserve`` exactly.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from srtm.ratelimit import NS_PER_S, BucketParams, Grid, check_rate, grid

IntArray = npt.NDArray[np.int64]

_CHUNK = 1 << 20
_INT64_SAFE = 1 << 61


def as_arrivals(arrivals_ns: npt.ArrayLike, name: str = "arrivals_ns") -> IntArray:
    """Validate a sorted 1-D array of integer nanosecond timestamps."""
    arr = np.asarray(arrivals_ns)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer nanoseconds, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size > 1:
        drops = np.flatnonzero(arr[1:] < arr[:-1])
        if drops.size:
            i = int(drops[0]) + 1
            later, earlier = int(arr[i]), int(arr[i - 1])
            raise ValueError(
                f"{name} must be sorted: {name}[{i}]={later} < {name}[{i - 1}]={earlier}"
            )
    return arr


def virtual_backlog(arrivals_ns: npt.ArrayLike, rate: float) -> IntArray:
    """Per message, ``X_n − t_n`` in ns: the work ahead of it, independent of burst.

    Message ``n`` waits for tokens iff this exceeds the tolerance ``τ`` of the burst.
    """
    return _backlog(as_arrivals(arrivals_ns), grid(check_rate(rate), 1).t)


def _backlog(arr: IntArray, t: int) -> IntArray:
    out = np.empty(arr.size, dtype=np.int64)
    chunk = max(1, min(_CHUNK, _INT64_SAFE // t))
    carry: int | None = None  # X_{s-1} − t_s for the chunk starting at s
    for s in range(0, arr.size, chunk):
        e = min(s + chunk, arr.size)
        span = int(arr[e - 1] - arr[s])
        if span > _INT64_SAFE:
            raise ValueError(f"arrivals_ns[{s}:{e}] spans {span} ns, beyond the int64 range")
        local = arr[s:e] - arr[s]
        steps = np.arange(e - s, dtype=np.int64) * t
        m = np.maximum.accumulate(local - steps)
        if carry is not None and carry + t > 0:  # else the chunk starts on an idle bucket
            if carry + t > _INT64_SAFE:
                raise ValueError(f"backlog before arrivals_ns[{s}] exceeds the int64 range")
            np.maximum(m, carry + t, out=m)
        d = steps + m - local
        out[s:e] = d
        if e < arr.size:
            carry = int(d[-1]) - int(arr[e] - arr[e - 1])
    return out


def token_delays(arrivals_ns: npt.ArrayLike, rate: float, burst: float) -> IntArray:
    """Per-message token wait (ns) of a FIFO ``(rate, burst)`` shaper, bucket full at start."""
    return grid_delays(arrivals_ns, grid(rate, burst))


def grid_delays(arrivals_ns: npt.ArrayLike, g: Grid) -> IntArray:
    """``token_delays`` for GCRA constants given directly in nanoseconds."""
    if g.t < 1 or g.tau < 0:
        raise ValueError(f"grid needs t >= 1 and tau >= 0, got {g!r}")
    return np.maximum(_backlog(as_arrivals(arrivals_ns), g.t) - g.tau, 0)


def required_burst(arrivals_ns: npt.ArrayLike, rate: float, quantile: float = 0.99) -> float:
    """Smallest burst with which at least ``quantile`` of the messages wait zero."""
    q = float(quantile)
    if not 0 < q <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
    d = virtual_backlog(arrivals_ns, rate)
    if d.size == 0:
        raise ValueError("arrivals_ns is empty: no burst can be derived from no messages")
    k = math.ceil(q * d.size) - 1
    needed = int(np.partition(d, k)[k])
    return _smallest_burst_for(needed, grid(rate, 1).t)


def _smallest_burst_for(tau: int, t: int) -> float:
    """Smallest float ``b`` with ``floor((b − 1)·T) ≥ tau``."""

    def enough(b: float) -> bool:
        return (Fraction(b) - 1) * t >= tau

    b = float(1 + Fraction(tau, t))
    while not enough(b):
        b = math.nextafter(b, math.inf)
    while b > 1 and enough(math.nextafter(b, 0)):
        b = math.nextafter(b, 0)
    return b


def profile_bucket(arrivals_ns: npt.ArrayLike, margin: float = 1.1) -> BucketParams:
    """``(r, b)`` as the paper's evaluation configures a topic from its trace.

    ``r`` is ``margin`` times the measured rate; ``b`` is the smallest burst with
    which 99 % of the messages wait zero at that rate.
    """
    arr = as_arrivals(arrivals_ns)
    m = float(margin)
    if not math.isfinite(m) or m <= 0:
        raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
    span = int(arr[-1] - arr[0]) if arr.size else 0
    if arr.size < 2 or span <= 0:
        raise ValueError(
            f"arrivals_ns must hold at least two arrivals spanning a positive time "
            f"to measure a rate (got {arr.size} arrivals over {span} ns)"
        )
    rate = m * (arr.size - 1) * NS_PER_S / span
    return BucketParams(rate, required_burst(arr, rate, 0.99))
