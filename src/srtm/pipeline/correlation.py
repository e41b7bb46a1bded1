"""Job 4, ``correlation``: which publishers' messages arrive together, and keys for them.

Per (run, topic), time (broker arrival clock, all brokers of the topic) is cut into windows
of ``window_ms``, twice: once from the first arrival and once shifted by half a window, so
that a burst cut in two by one grid lies whole in the other. Each publisher becomes a 0/1
vector of the windows it sent in; two publishers are *correlated* when the phi coefficient
(Pearson correlation) of their vectors reaches ``threshold``. Phi corrects for chance: two
busy but independent publishers often share a window, yet their phi stays near 0, while
members of one group share nearly every window they use. Groups are the connected
components of the correlated pairs; a group of two or more gets a key ``<topic>/c<i>``,
and a publisher with too few windows (``min_windows``) stays alone.

When the subscriber side carries ground-truth groups (``group``), each (run, topic) is
scored by the adjusted Rand index of proposal against truth (a publisher without a group
counts as a group of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from srtm.pipeline.ari import adjusted_rand_index
from srtm.pipeline.dataset import Traces, read_side

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

COLUMNS: dict[str, str] = {
    "run": "run name",
    "policy": "placement policy of the run (null without run metadata)",
    "topic": "topic",
    "publisher": "publisher id",
    "messages": "its broker-side rows",
    "windows": "windows (of both grids) it sent in",
    "correlation_key": "proposed key '<topic>/c<i>'; null for a publisher found alone",
    "group_size": "publishers sharing its key (1 when alone)",
    "true_group": "its ground-truth group from the subscriber side (null if none)",
    "ari": "adjusted Rand index of the (run, topic)'s proposal against truth",
    "groups_found": "keys proposed in the (run, topic)",
    "groups_true": "ground-truth groups (of two or more publishers) in the (run, topic)",
}


@dataclass(frozen=True)
class Settings:
    #: Twice the largest spread expected: a burst that long lies whole in one of the two
    #: grids. Longer windows merge groups whose bursts come within a window of each other.
    window_ms: float = 4.0
    threshold: float = 0.5
    min_windows: int = 5

    def __post_init__(self) -> None:
        if not self.window_ms > 0:
            raise ValueError(f"window_ms must be > 0, got {self.window_ms}")
        if not -1 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (-1, 1], got {self.threshold}")


def udf_schema() -> StructType:
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("run", StringType()),
            StructField("topic", StringType()),
            StructField("publisher", StringType()),
            StructField("messages", LongType()),
            StructField("windows", LongType()),
            StructField("cluster", IntegerType()),
        ]
    )


def schema() -> StructType:
    from pyspark.sql.types import (
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    kinds = {
        "messages": LongType(),
        "windows": LongType(),
        "group_size": IntegerType(),
        "ari": DoubleType(),
        "groups_found": IntegerType(),
        "groups_true": IntegerType(),
    }
    return StructType([StructField(n, kinds.get(n, StringType())) for n in COLUMNS])


def clusters(
    publisher: npt.NDArray[np.int64], t_ns: npt.NDArray[np.int64], settings: Settings
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Cluster labels of publishers ``0..max(publisher)`` from their arrival times, and the
    number of windows each sent in."""
    n_pub = int(publisher.max()) + 1
    width = max(1, round(settings.window_ms * 1e6))
    start = int(t_ns.min())
    cells = []
    offset = 0
    for shift in (0, width // 2):
        win = (t_ns - start + shift) // width
        cells.append(np.unique((win + offset) * n_pub + publisher))  # distinct (window, pub)
        offset += int(win.max()) + 1
    cell = np.concatenate(cells)
    total = offset  # windows of both grids, empty ones included
    rows, cols = np.divmod(cell, n_pub)
    presence = sparse.csr_matrix((np.ones(cell.size), (rows, cols)), shape=(total, n_pub))
    used = np.asarray(presence.sum(axis=0)).ravel()
    co = sparse.triu(presence.T @ presence, k=1).tocoo()
    i, j, c = co.row, co.col, co.data
    var_i, var_j = used[i] * (total - used[i]), used[j] * (total - used[j])
    ok = (var_i > 0) & (var_j > 0) & (used[i] >= settings.min_windows)
    ok &= used[j] >= settings.min_windows
    phi = np.zeros_like(c)
    phi[ok] = (total * c[ok] - used[i][ok] * used[j][ok]) / np.sqrt(var_i[ok] * var_j[ok])
    edge = ok & (phi >= settings.threshold)
    graph = sparse.coo_matrix((np.ones(int(edge.sum())), (i[edge], j[edge])), shape=(n_pub, n_pub))
    _, labels = connected_components(graph, directed=False)
    return labels.astype(np.int64), used.astype(np.int64)


def discover(frame: pd.DataFrame, *, settings: Settings) -> pd.DataFrame:
    """applyInPandas body for one (run, topic): one row per publisher."""
    names, code = np.unique(
        frame["publisher"].to_numpy(dtype=object).astype(str), return_inverse=True
    )
    labels, used = clusters(
        code.astype(np.int64), frame["t_arrive_ns"].to_numpy(np.int64), settings
    )
    messages = np.bincount(code, minlength=len(names))
    return pd.DataFrame(
        {
            "run": str(frame["run"].iloc[0]),
            "topic": str(frame["topic"].iloc[0]),
            "publisher": names,
            "messages": messages.astype(np.int64),
            "windows": used,
            "cluster": labels.astype(np.int32),
        }
    )


def compute(spark: SparkSession, traces: Traces, settings: Settings | None = None) -> pd.DataFrame:
    """The correlation table (pandas: one row per publisher), columns as ``COLUMNS``."""
    from pyspark.sql import functions as F

    cfg = settings or Settings()

    def body(frame: pd.DataFrame) -> pd.DataFrame:
        return discover(frame, settings=cfg)

    arrivals = read_side(spark, traces, "broker", ["run", "topic", "publisher", "t_arrive_ns"])
    found = (
        arrivals.where(F.col("topic").isNotNull() & F.col("publisher").isNotNull())
        .groupBy("run", "topic")
        .applyInPandas(body, udf_schema())
        .toPandas()
    )
    truth = (
        read_side(spark, traces, "subscriber", ["run", "topic", "publisher", "group"])
        .groupBy("run", "topic", "publisher")
        .agg(F.first("group", ignorenulls=True).alias("true_group"))
        .toPandas()
    )
    return assemble(traces, found, truth)


def assemble(traces: Traces, found: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """Keys, group sizes and scores from the clusters and the ground truth."""
    if found.empty:
        return pd.DataFrame({name: [] for name in COLUMNS})
    out = found.merge(truth, on=["run", "topic", "publisher"], how="left")
    policy = {r.run: r.policy for r in traces.runs}
    parts = [_score(g) for _, g in out.groupby(["run", "topic"], sort=True)]
    result = pd.concat(parts, ignore_index=True)
    result["policy"] = result["run"].map(policy)
    return result[list(COLUMNS)]


def _score(g: pd.DataFrame) -> pd.DataFrame:
    g = g.sort_values("publisher").reset_index(drop=True)
    size = g.groupby("cluster")["publisher"].transform("size").astype(int)
    # Keys numbered by each cluster's first publisher, so reruns give the same keys.
    grouped = g[size > 1].drop_duplicates("cluster")["cluster"].tolist()
    number = {c: i for i, c in enumerate(grouped)}
    topic = str(g["topic"].iloc[0])
    g["correlation_key"] = [f"{topic}/c{number[c]}" if c in number else None for c in g["cluster"]]
    g["group_size"] = size
    truth = [
        t if isinstance(t, str) else f"\0{p}"
        for t, p in zip(g["true_group"], g["publisher"], strict=True)
    ]
    proposed = [
        k if k is not None else f"\0{p}"
        for k, p in zip(g["correlation_key"], g["publisher"], strict=True)
    ]
    has_truth = g["true_group"].notna().any()
    g["ari"] = adjusted_rand_index(truth, proposed) if has_truth else np.nan
    g["groups_found"] = len(grouped)
    sizes = g["true_group"].value_counts()
    g["groups_true"] = int((sizes > 1).sum())
    return g
