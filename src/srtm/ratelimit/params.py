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
