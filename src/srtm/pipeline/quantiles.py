"""Exact quantiles in two passes: a log-bucket histogram, then the few buckets that matter.

Quantile definition (everywhere in the pipeline): the *nearest rank*, the
``⌈q·n⌉``-th smallest of ``n`` values (numpy's ``method="inverted_cdf"``), with ``q·n``
computed exactly from the decimal ``q``. It is always an observed value.

Why two passes: Spark's exact ``percentile`` aggregate keeps every distinct value of a group
in a hash map and sorts it, which at 10⁷ nanosecond latencies (nearly all distinct) is many
times slower than a scan. Instead pass 1 counts values per (group, bucket), buckets being
``SUB_BUCKETS`` per octave (0.27 % wide), which partial aggregation shrinks to a few
thousand rows per group; the rank of each quantile then names its bucket and its offset
there. Pass 2 reads back only the values of those buckets (well under 1 % of the rows
each) and sorts them. The result is exact, not an approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from srtm.quantiles import REPORTED

if TYPE_CHECKING:
    from pyspark.sql import Column

#: Output column name → quantile: the reported ones, in ns.
QUANTILES: tuple[tuple[str, float], ...] = tuple((f"{key}_ns", q) for key, q in REPORTED)
SUB_BUCKETS = 256


def rank(q: float, n: int) -> int:
    """0-based index of the nearest-rank ``q`` quantile among ``n`` sorted values."""
    if n < 1:
        raise ValueError("no quantile of no values")
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    return max(0, math.ceil(Fraction(str(q)) * n) - 1)


def nearest_rank(values: npt.ArrayLike, q: float) -> int:
    """Reference implementation on one array (the definition, for tests and small data)."""
    arr = np.sort(np.asarray(values, dtype=np.int64))
    return int(arr[rank(q, arr.size)])


def bucket_column(value: Column) -> Column:
    """Spark expression: the histogram bucket of an int64 column (monotone in the value,
    negatives included, as skewed clocks can give)."""
    from pyspark.sql import functions as F

    pos = F.floor(F.log2(value.cast("double") + 1.0) * SUB_BUCKETS)
    neg = -1 - F.floor(F.log2(1.0 - value.cast("double")) * SUB_BUCKETS)
    return F.when(value >= 0, pos).otherwise(neg).cast("long")


def bucket_of(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """``bucket_column`` in numpy (for tests)."""
    v = np.asarray(values, dtype=np.float64)
    pos = np.floor(np.log2(np.maximum(v, 0) + 1.0) * SUB_BUCKETS)
    neg = -1 - np.floor(np.log2(1.0 - np.minimum(v, 0)) * SUB_BUCKETS)
    out: npt.NDArray[np.int64] = np.where(v >= 0, pos, neg).astype(np.int64)
    return out


@dataclass(frozen=True, slots=True)
class Target:
    """Where a quantile is: in ``bucket``, the ``offset``-th smallest value (0-based)."""

    name: str
    bucket: int
    offset: int


def locate(
    buckets: npt.ArrayLike,
    counts: npt.ArrayLike,
    quantiles: Sequence[tuple[str, float]] = QUANTILES,
) -> list[Target]:
    """The bucket and in-bucket offset of each quantile, from one group's histogram."""
    b = np.asarray(buckets, dtype=np.int64)
    c = np.asarray(counts, dtype=np.int64)
    order = np.argsort(b, kind="stable")
    b, c = b[order], c[order]
    cum = np.cumsum(c)
    n = int(cum[-1]) if cum.size else 0
    out = []
    for name, q in quantiles:
        r = rank(q, n)
        i = int(np.searchsorted(cum, r, side="right"))
        before = int(cum[i - 1]) if i else 0
        out.append(Target(name, int(b[i]), r - before))
    return out
