"""Adjusted Rand index of two clusterings (Hubert and Arabie's correction for chance).

Pair-counting over the contingency table ``n_ij`` of the two labelings::

    index    = Σ C(n_ij, 2)
    expected = Σ_i C(a_i, 2) · Σ_j C(b_j, 2) / C(n, 2)
    maximum  = (Σ_i C(a_i, 2) + Σ_j C(b_j, 2)) / 2
    ARI      = (index − expected) / (maximum − expected)

1 for identical partitions (whatever the label names), about 0 for independent ones.
When ``maximum == expected`` (both all-singletons, or both one cluster) the partitions
are identical and the ARI is 1.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt
from scipy.special import comb


def _codes(labels: Sequence[Hashable]) -> npt.NDArray[np.int64]:
    index: dict[Hashable, int] = {}
    return np.array([index.setdefault(x, len(index)) for x in labels], dtype=np.int64)


def adjusted_rand_index(truth: Sequence[Hashable], proposed: Sequence[Hashable]) -> float:
    """ARI of two labelings of the same items (labels are any hashable values)."""
    if len(truth) != len(proposed):
        raise ValueError(f"labelings differ in length: {len(truth)} != {len(proposed)}")
    n = len(truth)
    if n < 2:
        return 1.0
    a, b = _codes(truth), _codes(proposed)
    table = np.zeros((int(a.max()) + 1, int(b.max()) + 1), dtype=np.int64)
    np.add.at(table, (a, b), 1)
    index = float(comb(table, 2).sum())
    rows = float(comb(table.sum(axis=1), 2).sum())
    cols = float(comb(table.sum(axis=0), 2).sum())
    expected = rows * cols / float(comb(n, 2))
    maximum = (rows + cols) / 2
    if maximum == expected:
        return 1.0
    return (index - expected) / (maximum - expected)
