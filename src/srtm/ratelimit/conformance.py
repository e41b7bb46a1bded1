"""Checking that a release schedule stays inside a token-bucket envelope."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from srtm.ratelimit.params import NS_PER_S, check_burst, check_rate


@dataclass(frozen=True, slots=True)
class Violation:
    """Releases ``start_index..end_index`` (inclusive) exceed ``b + r·(end − start)``."""

    start_index: int
    end_index: int
    start_ns: int
    end_ns: int
    count: int
    allowed: float


def check_conformance(releases_ns: Sequence[int], rate: float, burst: float) -> Violation | None:
    """Return the first interval with more than ``b + r·Δ`` releases, or None.

    ``releases_ns`` must be sorted; a release of several tokens appears several
    times. One pass in exact integer arithmetic: with ``h_i = r·s_i − i`` (scaled
    to integers), releases ``i..j`` violate iff ``max_{i≤j} h_i − h_j > b − 1``.
    """
    r = Fraction(check_rate(rate))
    b = Fraction(check_burst(burst))
    if len(releases_ns) == 0:
        return None
    # Scale r·s/1e9 − i by NS_PER_S·den(r)·den(b) so that everything is an integer.
    a = r.numerator * b.denominator
    k = NS_PER_S * r.denominator * b.denominator
    limit = NS_PER_S * r.denominator * (b.numerator - b.denominator)
    _check_sorted(releases_ns)
    origin = int(releases_ns[0])
    best_h = 0
    best_i = 0
    for j, s in enumerate(releases_ns):
        h = a * (int(s) - origin) - k * j
        if h > best_h:
            best_h, best_i = h, j
        if best_h - h > limit:
            start = int(releases_ns[best_i])
            return Violation(
                start_index=best_i,
                end_index=j,
                start_ns=start,
                end_ns=int(s),
                count=j - best_i + 1,
                allowed=float(b + r * (int(s) - start) / NS_PER_S),
            )
    return None


def _check_sorted(releases_ns: Sequence[int]) -> None:
    for j in range(1, len(releases_ns)):
        if releases_ns[j] < releases_ns[j - 1]:
            raise ValueError(
                f"releases_ns must be sorted: releases_ns[{j}]={releases_ns[j]} "
                f"< releases_ns[{j - 1}]={releases_ns[j - 1]}"
            )
