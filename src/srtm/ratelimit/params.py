"""Token-bucket parameters and the integer time grid every GCRA computation shares.

GCRA state is kept in *ticks* of 1/TICKS_PER_NS ns so that the emission interval
``T = 1/r`` is exact enough for any practical rate without floating point drift.
``T`` is rounded up and the tolerance ``τ = (b − 1)·T`` down, so the quantised
bucket never admits more than the ``(r, b)`` envelope allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

TICKS_PER_NS = 1024
NS_PER_S = 1_000_000_000
_TICKS_PER_S = NS_PER_S * TICKS_PER_NS


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
    """GCRA constants in ticks: emission interval ``t`` and tolerance ``tau``."""

    t: int
    tau: int


def grid(rate: float, burst: float) -> Grid:
    """Quantise ``(rate, burst)`` onto the tick grid (exact rational arithmetic)."""
    r = Fraction(check_rate(rate))
    b = Fraction(check_burst(burst))
    t = math.ceil(_TICKS_PER_S / r)
    return Grid(t=t, tau=math.floor((b - 1) * t))
