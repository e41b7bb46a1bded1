"""Job 1, ``latency``: end-to-end latency, token wait and processing per (run, topic, broker)
and per (run, topic), exact quantiles, SLO violations and the DRL penalty of the tail.

Per delivery (one subscriber row): ``e2e = t_recv − t_send``. A run whose metadata gives a
measured window counts only the deliveries of messages *sent* in it and the broker rows of
messages that *arrived* in it (arrival trails sending by the transit, well under a
millisecond here, so the two sets differ at most at the window's edges). Per message (one broker
row): ``token wait = t_release − t_arrive`` and ``processing = t_dispatch − t_release``.
The two sides join on (run, broker, msg_id). Quantiles are nearest-rank
(``srtm.pipeline.quantiles``), exact, over all deliveries of the group. The *tail* of a
group is its deliveries with ``e2e ≥ p99``; ``tail_token_share`` is the tail's total token
wait over its total e2e latency (the share of tail latency spent waiting for tokens: the
DRL penalty), over the tail deliveries that have a broker row.

Plan (no Python UDF, four Spark actions): (1) subscriber side → histogram per (group,
log-bucket) with counts, sums and SLO violations; (2) the rows of the buckets that hold a
quantile or the tail → exact quantiles by sorting those alone; (3) the tail rows, keyed by
message, broadcast-joined to the broker side, aggregated with the broker-side statistics
of all messages; (4) write. Inside the passes a group is keyed by the 64-bit xxhash64 of
its names (hash maps on longs are much faster than on strings, and the messages are joined
on a 64-bit key too, then confirmed on the full id); names come back with the quantiles,
and two groups whose names hash alike are refused, not merged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from srtm.pipeline.dataset import Traces, in_window, read_side
from srtm.pipeline.quantiles import QUANTILES, bucket_column, locate

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

GROUP = ["run", "topic", "broker"]
QUANTILE_COLUMNS = tuple(name for name, _ in QUANTILES)
#: Above this many tail deliveries the tail is shuffle-joined instead of broadcast.
BROADCAST_ROWS = 2_000_000

#: Output column → meaning (the documented schema of ``OUT/latency/``).
COLUMNS: dict[str, str] = {
    "run": "run name (partition of the trace dataset)",
    "policy": "placement policy of the run (runs/<run>.json; null without it)",
    "scenario": "scenario of the run (runs/<run>.json; null without it)",
    "topic": "topic",
    "broker": "broker id; null on the per-topic rows that cover all of the topic's brokers",
    "brokers": "number of brokers the row covers",
    "count": "deliveries (subscriber rows; of the measured window where the run has one)",
    "mean_ns": "mean end-to-end latency, ns",
    "p50_ns": "end-to-end latency, nearest-rank 50th percentile, ns",
    "p95_ns": "… 95th percentile, ns",
    "p99_ns": "… 99th percentile, ns",
    "p999_ns": "… 99.9th percentile, ns",
    "max_ns": "largest end-to-end latency, ns",
    "slo_p99_ns": "the run's SLO on p99 latency, ns (null without run metadata)",
    "slo_violations": "deliveries with e2e latency above the SLO (null without an SLO)",
    "slo_met": "p99_ns <= slo_p99_ns (null without an SLO)",
    "messages": "broker-side rows (messages traced by the broker)",
    "token_wait_mean_ns": "mean token wait (release − arrival) of those messages, ns",
    "delayed_share": "share of those messages that waited for tokens at all",
    "tail_count": "tail deliveries (e2e >= p99) that have a broker row",
    "tail_token_share": "their total token wait / their total e2e latency (DRL penalty)",
    "tail_processing_share": "their total processing (dispatch − release) / total e2e",
}


def schema() -> StructType:
    from pyspark.sql.types import (
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    kinds: dict[str, Any] = {
        "brokers": IntegerType(),
        "mean_ns": DoubleType(),
        "token_wait_mean_ns": DoubleType(),
        "delayed_share": DoubleType(),
        "tail_token_share": DoubleType(),
        "tail_processing_share": DoubleType(),
        "slo_met": BooleanType(),
    }
    strings = {"run", "policy", "scenario", "topic", "broker"}
    return StructType(
        [
            StructField(
                name,
                StringType() if name in strings else kinds.get(name, LongType()),
                name not in ("run", "topic"),
            )
            for name in COLUMNS
        ]
    )


def compute(spark: SparkSession, traces: Traces) -> pd.DataFrame:
    """The latency table as pandas (small: one row per group), columns as ``COLUMNS``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sub = (
        read_side(spark, traces, "subscriber", [*GROUP, "msg_id", "t_send_ns", "t_recv_ns"])
        .where(F.col("topic").isNotNull() & F.col("broker").isNotNull())  # unattributable
        .where(in_window(traces, "t_send_ns"))
        .withColumn("e2e", F.col("t_recv_ns") - F.col("t_send_ns"))
        .withColumn("bucket", bucket_column(F.col("e2e")))
        .withColumn("k", F.xxhash64(*GROUP))
        .withColumn("kt", F.xxhash64("run", "topic"))
    )
    hist = _histogram(sub, traces)
    if hist.empty:
        return empty()
    plan = _plan(hist)
    keys_df = F.broadcast(spark.createDataFrame(plan.keys))
    # A numeric pre-filter first: cheap, and only the rows it keeps decode their strings.
    cand = (
        sub.where(F.col("bucket").isin(sorted({int(b) for b in plan.keys["bucket"]})))
        .join(keys_df, ["k", "bucket"], "left_semi")
        .select("k", "kt", *GROUP, "msg_id", "e2e", "bucket")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        picks = _pick(spark, cand, plan.targets)
        _check_names(picks)
        pairs = hist[["k", "kt"]].drop_duplicates()
        broker_stats = _broker_side(spark, traces, cand, picks, pairs, plan.tail_rows)
    finally:
        cand.unpersist()
    return _assemble(traces, hist, picks, broker_stats)


def _slo_column(traces: Traces) -> Column:
    """The run's SLO in ns for each row (a CASE on the partition column: no join)."""
    from pyspark.sql import functions as F

    slo = F.lit(None).cast("long")
    for info in traces.runs:
        if info.slo_ns is not None:
            slo = F.when(F.col("run") == info.run, F.lit(info.slo_ns)).otherwise(slo)
    return slo


def _histogram(sub: DataFrame, traces: Traces) -> pd.DataFrame:
    """Pass 1: per (group, bucket) counts, sums, maxima and SLO violations.

    Groups are keyed by 64-bit hashes of their names: a hash map on longs is much faster
    than one on strings, and the names come back with the quantiles in pass 2.
    """
    from pyspark.sql import functions as F

    over = F.coalesce((F.col("e2e") > _slo_column(traces)).cast("long"), F.lit(0))
    return (
        sub.groupBy("k", "kt", "bucket")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(over).alias("viol"),
            F.sum("e2e").alias("sum"),
            F.max("e2e").alias("max"),
        )
        .toPandas()
    )


@dataclass(frozen=True)
class _Plan:
    #: level ("b": key is k, "t": key is kt), key, name, bucket, offset: where each quantile is
    targets: pd.DataFrame
    #: (k, bucket) whose rows pass 2 reads: quantile buckets and tails
    keys: pd.DataFrame
    #: rows in the tails' buckets (an upper bound on the tail deliveries)
    tail_rows: int


def _plan(hist: pd.DataFrame) -> _Plan:
    """Where every quantile of every broker row and topic row lies, from the histogram."""
    rows = []
    for k, g in hist.groupby("k", sort=False):
        rows += [("b", k, t.name, t.bucket, t.offset) for t in locate(g["bucket"], g["n"])]
    per_topic = hist.groupby(["kt", "bucket"], as_index=False)["n"].sum()
    for kt, g in per_topic.groupby("kt", sort=False):
        rows += [("t", kt, t.name, t.bucket, t.offset) for t in locate(g["bucket"], g["n"])]
    targets = pd.DataFrame(rows, columns=["level", "key", "name", "bucket", "offset"])
    p99 = targets[targets["name"] == "p99_ns"]
    b99 = p99[p99["level"] == "b"].set_index("key")["bucket"]
    t99 = p99[p99["level"] == "t"].set_index("key")["bucket"]
    lowest = np.minimum(hist["k"].map(b99).to_numpy(), hist["kt"].map(t99).to_numpy())
    in_tail = hist["bucket"].to_numpy() >= lowest
    b_hit = _member(hist, ["k", "bucket"], targets[targets["level"] == "b"], ["key", "bucket"])
    t_hit = _member(hist, ["kt", "bucket"], targets[targets["level"] == "t"], ["key", "bucket"])
    keys = hist.loc[in_tail | b_hit | t_hit, ["k", "bucket"]].reset_index(drop=True)
    return _Plan(targets, keys, int(hist.loc[in_tail, "n"].sum()))


def _member(
    frame: pd.DataFrame, cols: list[str], other: pd.DataFrame, other_cols: list[str]
) -> npt.NDArray[np.bool_]:
    """Which rows of ``frame`` have their ``cols`` among ``other``'s ``other_cols``."""
    index = pd.MultiIndex.from_frame(other[other_cols].set_axis(cols, axis=1))
    return np.asarray(pd.MultiIndex.from_frame(frame[cols]).isin(index), dtype=bool)


def _pick(spark: SparkSession, cand: DataFrame, targets: pd.DataFrame) -> pd.DataFrame:
    """Pass 2: the exact value of every target (sort its bucket's rows, take its offset),
    with the group's names."""
    from pyspark.sql import functions as F

    tdf = F.broadcast(
        spark.createDataFrame(targets.rename(columns={"key": "t_key", "bucket": "t_bucket"}))
    )
    on_b = (F.col("k") == F.col("t_key")) & (F.col("bucket") == F.col("t_bucket"))
    on_t = (F.col("kt") == F.col("t_key")) & (F.col("bucket") == F.col("t_bucket"))
    by_broker = cand.join(tdf.where(F.col("level") == "b"), on_b)
    by_topic = cand.join(tdf.where(F.col("level") == "t"), on_t)
    name = F.when(F.col("level") == "b", F.concat_ws("\u0000", *GROUP)).otherwise(
        F.concat_ws("\u0000", "run", "topic")
    )
    return (
        by_broker.unionByName(by_topic)
        .groupBy("level", "t_key", "name", "offset")
        .agg(
            F.sort_array(F.collect_list("e2e")).alias("values"),
            F.min(name).alias("lo"),
            F.max(name).alias("hi"),
            F.first("run").alias("run"),
            F.first("topic").alias("topic"),
            F.first("broker").alias("broker"),
        )
        .select(
            "level",
            F.col("t_key").alias("key"),
            "name",
            F.element_at("values", (F.col("offset") + 1).cast("int")).alias("value"),
            "run",
            "topic",
            "broker",
            "lo",
            "hi",
        )
        .toPandas()
    )


def _broker_side(
    spark: SparkSession,
    traces: Traces,
    cand: DataFrame,
    picks: pd.DataFrame,
    pairs: pd.DataFrame,
    tail_rows: int,
) -> pd.DataFrame:
    """Pass 3, per group key k: broker-side statistics of all messages, and token wait,
    processing and e2e summed over the broker row's and the topic row's tails."""
    from pyspark.sql import functions as F

    p99 = picks[picks["name"] == "p99_ns"]
    b99 = p99[p99["level"] == "b"][["key", "value"]].rename(columns={"key": "k", "value": "p99_b"})
    t99 = p99[p99["level"] == "t"][["key", "value"]].rename(columns={"key": "kt", "value": "p99_t"})
    thr_df = F.broadcast(spark.createDataFrame(pairs.merge(b99, on="k").merge(t99, on="kt")))
    in_b = F.col("e2e") >= F.col("p99_b")
    in_t = F.col("e2e") >= F.col("p99_t")
    tail = (
        cand.join(thr_df, ["k", "kt"])
        .where(in_b | in_t)
        .groupBy("run", "broker", "msg_id")  # one row per message: its deliveries summed
        .agg(
            F.sum(in_b.cast("long")).alias("nb"),
            F.sum(F.when(in_b, F.col("e2e")).otherwise(0)).alias("eb"),
            F.sum(in_t.cast("long")).alias("nt"),
            F.sum(F.when(in_t, F.col("e2e")).otherwise(0)).alias("et"),
        )
        .select(
            F.xxhash64("run", "broker", "msg_id").alias("tail_key"),
            F.concat_ws("\u0000", "run", "broker", "msg_id").alias("tail_id"),
            "nb",
            "eb",
            "nt",
            "et",
        )
    )
    if tail_rows <= BROADCAST_ROWS:
        tail = F.broadcast(tail)
    cols = ["run", "topic", "broker", "msg_id", "t_arrive_ns", "t_release_ns", "t_dispatch_ns"]
    bro = read_side(spark, traces, "broker", cols).where(in_window(traces, "t_arrive_ns"))
    bro = bro.select(
        F.xxhash64(*GROUP).alias("k"),
        F.xxhash64("run", "broker", "msg_id").alias("msg_key"),
        *GROUP,
        "msg_id",
        (F.col("t_release_ns") - F.col("t_arrive_ns")).alias("tw"),
        (F.col("t_dispatch_ns") - F.col("t_release_ns")).alias("proc"),
    )
    # Hash on the 64-bit message key alone (a long hash map), then confirm the full id on
    # the few matches. The confirmation is two prefix tests, not an equality, on purpose:
    # the planner would make any equality (even of lengths) part of the hash key and build
    # the id string for all 10⁷ probing rows.
    full = F.concat_ws("\u0000", "run", "broker", "msg_id")
    same = F.col("tail_id").startswith(full) & full.startswith(F.col("tail_id"))
    nb, nt = F.coalesce(F.col("nb"), F.lit(0)), F.coalesce(F.col("nt"), F.lit(0))
    return (
        bro.join(tail, (F.col("msg_key") == F.col("tail_key")) & same, "left")
        .groupBy("k")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("tw").alias("tw_sum"),
            F.sum((F.col("tw") > 0).cast("long")).alias("delayed"),
            F.sum(nb).alias("tb_n"),
            F.sum(F.col("tw") * nb).alias("tb_tw"),
            F.sum(F.col("proc") * nb).alias("tb_proc"),
            F.sum(F.coalesce(F.col("eb"), F.lit(0))).alias("tb_e2e"),
            F.sum(nt).alias("tt_n"),
            F.sum(F.col("tw") * nt).alias("tt_tw"),
            F.sum(F.col("proc") * nt).alias("tt_proc"),
            F.sum(F.coalesce(F.col("et"), F.lit(0))).alias("tt_e2e"),
        )
        .toPandas()
    )


def _ratio(num: pd.Series, den: pd.Series) -> pd.Series:
    den = den.astype("float64")
    return (num.astype("float64") / den.where(den > 0)).astype("float64")


def _check_names(picks: pd.DataFrame) -> None:
    """Two groups whose names hash alike would be merged: refuse rather than mislead."""
    clash = picks[picks["lo"] != picks["hi"]]
    if not clash.empty:
        a, b = clash.iloc[0][["lo", "hi"]]
        raise RuntimeError(f"64-bit hash collision between groups {a!r} and {b!r}")


def _level(hist: pd.DataFrame, picks: pd.DataFrame, bstats: pd.DataFrame, key: str) -> pd.DataFrame:
    """The rows of one level (``k``: per broker, ``kt``: per topic), keyed by ``key``."""
    g = hist.groupby(key).agg(
        count=("n", "sum"),
        slo_violations=("viol", "sum"),
        total=("sum", "sum"),
        max_ns=("max", "max"),
    )
    mine = picks[picks["level"] == ("b" if key == "k" else "t")]
    g = g.join(mine.pivot_table(index="key", columns="name", values="value", aggfunc="first"))
    g = g.join(mine.groupby("key")[["run", "topic", "broker"]].first())
    stats = bstats.merge(hist[["k", "kt"]].drop_duplicates(), on="k")
    suffix = "b" if key == "k" else "t"
    sums = stats.groupby(key).agg(
        messages=("messages", "sum"),
        tw_sum=("tw_sum", "sum"),
        delayed=("delayed", "sum"),
        tail_count=(f"t{suffix}_n", "sum"),
        tail_tw=(f"t{suffix}_tw", "sum"),
        tail_proc=(f"t{suffix}_proc", "sum"),
        tail_e2e=(f"t{suffix}_e2e", "sum"),
    )
    g = g.join(sums)
    if key == "k":
        g["brokers"] = 1
    else:
        g["broker"] = None
        g["brokers"] = hist.groupby("kt")["k"].nunique()
    return g.reset_index(drop=True)


def _assemble(
    traces: Traces, hist: pd.DataFrame, picks: pd.DataFrame, bstats: pd.DataFrame
) -> pd.DataFrame:
    meta = pd.DataFrame(
        [(r.run, r.policy, r.scenario, r.slo_ns) for r in traces.runs],
        columns=["run", "policy", "scenario", "slo_p99_ns"],
    )
    levels = [_level(hist, picks, bstats, key) for key in ("kt", "k")]
    out = pd.concat(levels, ignore_index=True).merge(meta, on="run", how="left")
    out["mean_ns"] = out["total"] / out["count"]
    out["token_wait_mean_ns"] = _ratio(out["tw_sum"], out["messages"])
    out["delayed_share"] = _ratio(out["delayed"], out["messages"])
    out["tail_token_share"] = _ratio(out["tail_tw"], out["tail_e2e"])
    out["tail_processing_share"] = _ratio(out["tail_proc"], out["tail_e2e"])
    has_slo = out["slo_p99_ns"].notna()
    out["slo_violations"] = out["slo_violations"].where(has_slo)
    out["slo_met"] = (out["p99_ns"] <= out["slo_p99_ns"]).where(has_slo)
    out = out.sort_values(["run", "topic", "broker"], na_position="first", kind="stable")
    return _typed(out[list(COLUMNS)].reset_index(drop=True))


def empty() -> pd.DataFrame:
    return _typed(pd.DataFrame({name: [] for name in COLUMNS}))


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Nullable pandas dtypes matching ``schema()`` (integers stay integers beside nulls)."""
    from pyspark.sql.types import BooleanType, DoubleType, IntegerType, StringType

    types: dict[str, str] = {}
    for f in schema().fields:
        if isinstance(f.dataType, StringType):
            types[f.name] = "object"
        elif isinstance(f.dataType, DoubleType):
            types[f.name] = "float64"
        elif isinstance(f.dataType, BooleanType):
            types[f.name] = "boolean"
        elif isinstance(f.dataType, IntegerType):
            types[f.name] = "Int32"
        else:
            types[f.name] = "Int64"
    frame = frame.astype(types)
    return frame.astype(object).where(frame.notna(), None).astype(types)


def summary_rows(frame: pd.DataFrame) -> Iterable[dict[str, object]]:
    """Per (run, policy, topic): what ``srtm.pipeline.latency_summary`` returns."""
    topics = frame[frame["broker"].isna()]
    per_broker = frame[frame["broker"].notna()]
    by_topic = {key: g for key, g in per_broker.groupby(["run", "topic"])}
    for row in topics.itertuples(index=False):
        mine = by_topic.get((row.run, row.topic), per_broker.iloc[:0])
        yield {
            "run": row.run,
            "policy": row.policy,
            "topic": row.topic,
            "count": int(row.count),
            "p50_ns": int(row.p50_ns),
            "p95_ns": int(row.p95_ns),
            "p99_ns": int(row.p99_ns),
            "p999_ns": int(row.p999_ns),
            "slo_violations": None if pd.isna(row.slo_violations) else int(row.slo_violations),
            "tail_token_share": None
            if pd.isna(row.tail_token_share)
            else float(row.tail_token_share),
            "brokers": sorted(str(b) for b in mine["broker"]),
            "per_broker": {
                str(b.broker): {"count": int(b.count)}
                | {q: int(getattr(b, q)) for q in QUANTILE_COLUMNS}
                for b in mine.itertuples(index=False)
            },
        }
