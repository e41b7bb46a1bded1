"""The quantiles SRTM reports, how they are spelled, and one helper that computes them.

Spelling: in identifiers, dict keys, JSON fields and column names a quantile is ``p`` and
its percentage without the point, ``p50``, ``p95``, ``p99``, ``p999``, followed by the unit
where there is one (``p999_ms``); in text for people it is ``p99.9``.

``quantiles`` is numpy's default definition (linear interpolation between the closest
ranks). The pipeline's exact nearest rank, for Spark, is ``srtm.pipeline.quantiles``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: The quantiles a latency summary reports, as (key, fraction).
REPORTED: tuple[tuple[str, float], ...] = (
    ("p50", 0.5),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p999", 0.999),
)
#: Their fractions alone, for ``quantiles``.
REPORTED_Q: tuple[float, ...] = tuple(q for _, q in REPORTED)


def _percent(q: float) -> str:
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is in [0, 1], got {q!r}")
    return format(q * 100, ".6g")


def key(q: float) -> str:
    """The identifier spelling of quantile ``q``: 0.999 -> ``p999``."""
    return "p" + _percent(q).replace(".", "")


def label(q: float) -> str:
    """The human spelling of quantile ``q``: 0.999 -> ``p99.9``."""
    return "p" + _percent(q)


def quantiles(
    values: npt.ArrayLike,
    qs: Sequence[float] = REPORTED_Q,
    *,
    scale: float = 1.0,
    suffix: str = "",
    empty: float = math.nan,
) -> dict[str, float]:
    """``{key(q) + suffix: quantile q of values / scale}`` for each ``q`` in ``qs``;
    every value is ``empty`` when there are no values."""
    names = [key(q) + suffix for q in qs]
    arr = np.asarray(values)
    if arr.size == 0:
        return dict.fromkeys(names, empty)
    found = np.quantile(arr, list(qs)) / scale
    return dict(zip(names, (float(x) for x in found), strict=True))
