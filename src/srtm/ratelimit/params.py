"""Token-bucket parameters and the integer nanosecond grid every GCRA computation shares.

Release times are whole nanoseconds, and a schedule of whole nanoseconds can only
keep every gap ≥ ``1/r`` if the emission interval is a whole number of them: ``T``
is ``1/r`` rounded *up* to the nanosecond and the tolerance ``τ = (b − 1)·T``
rounded down. The bucket therefore never admits more than ``(r, b)`` allows, and
runs at most 1 ns per token slow (0.01 % at 100,000/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

NS_PER_S = 1_000_000_000


def check_rate(rate: float, name: str = "rate") -> float:
    """Return ``rate`` as a float, or raise ValueError unless it is finite and > 0."""
    value = float(rate)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {rate!r}")
    return value


def check_burst(burst: float, name: str = "burst") -> float:
    """Return ``burst`` as a float, or raise ValueError unless it is finite and ≥ 1."""
    value = float(burst)
    if not math.isfinite(value) or value < 1:
        raise ValueError(
            f"{name} must be a finite number >= 1 (a bucket holds at least one token), "
            f"got {burst!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class BucketParams:
    """A token-bucket envelope: ``rate`` tokens per second, ``burst`` tokens deep."""

    rate: float
    burst: float

    def __post_init__(self) -> None:
        check_rate(self.rate)
        check_burst(self.burst)


#: The range a bucket that schedules in int64 nanoseconds accepts (``TokenBucket``, and so
#: a broker's sub-bucket). At the lowest rate one token is 1,000 s: release times stay
#: below 2**63 ns (the year 2262) for a backlog of over 7 million messages on one bucket.
#: Above 1e9/s the emission interval would round to less than 1 ns.
MIN_RATE = 1e-3
MAX_RATE = 1e9
MAX_BURST = 1e9
#: The bucket's depth in time, (burst - 1)/rate, at most this (about 31.7 years).
MAX_TOLERANCE_NS = 10**18


def check_bucket(rate: float, burst: float) -> BucketParams:
    """``(rate, burst)`` checked for a bucket that schedules in int64 nanoseconds, or a
    ValueError naming the field: finite, ``MIN_RATE <= rate <= MAX_RATE``,
    ``1 <= burst <= MAX_BURST`` and ``(burst - 1)/rate`` at most ``MAX_TOLERANCE_NS``.

    ``BucketParams`` alone only asks for finite and positive: splits and offline analysis
    may describe tiny shares that no live bucket has to schedule.
    """
    r, b = check_rate(rate), check_burst(burst)
    if not MIN_RATE <= r <= MAX_RATE:
        raise ValueError(
            f"rate must be between {MIN_RATE:g} and {MAX_RATE:g} per second, got {rate!r}"
        )
    if b > MAX_BURST:
        raise ValueError(f"burst must be at most {MAX_BURST:g}, got {burst!r}")
    if (Fraction(b) - 1) * math.ceil(NS_PER_S / Fraction(r)) > MAX_TOLERANCE_NS:
        raise ValueError(
            f"burst {burst:g} at rate {rate:g} is {(b - 1) / r:.3g} s of tokens; "
            f"at most {MAX_TOLERANCE_NS / NS_PER_S:.3g} s (burst/rate) is allowed"
        )
    return BucketParams(r, b)


@dataclass(frozen=True, slots=True)
class Grid:
    """GCRA constants in nanoseconds: emission interval ``t`` and tolerance ``tau``."""

    t: int
    tau: int


def grid(rate: float, burst: float) -> Grid:
    """Quantise ``(rate, burst)`` onto the nanosecond grid (exact rational arithmetic)."""
    r = Fraction(check_rate(rate))
    b = Fraction(check_burst(burst))
    t = math.ceil(NS_PER_S / r)
    return Grid(t=t, tau=math.floor((b - 1) * t))
