"""Job 2, ``adaptor-stats``: the TB Adaptor's inputs replayed from broker-side arrivals.

Per (run, topic, broker) and second: the arrivals in that 1 s bin and, over the sliding
window of the ``window_s`` seconds ending with it, the average rate (arrivals / window_s)
and the largest virtual backlog, in tokens, of a meter bucket at the sub-bucket's rate —
what the broker's ``RateWindow`` reports each second (``srtm.broker.stats``). The backlog of a
message is the meter's unfinished work right after booking it, ``(X_n − t_n + T)·r``, from
``srtm.analysis.virtual_backlog``. The meter rate is the sub-bucket's rate from
``runs/<run>.json`` (``buckets``) when it is there, else ``margin`` × the stream's measured
rate. Then, per (run, topic, second), each broker's share of the rates and of the
backlogs: the split the adaptor asks for (before its floors and hysteresis), and the
proposed sub-bucket when the topic's total bucket is known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd

from srtm.analysis import virtual_backlog
from srtm.pipeline.dataset import Traces, read_side, runs_frame
from srtm.ratelimit import NS_PER_S, grid

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

COLUMNS: dict[str, str] = {
    "run": "run name",
    "policy": "placement policy of the run (null without run metadata)",
    "topic": "topic",
    "broker": "broker id",
    "second": "the 1 s bin: Unix time in whole seconds (arrival clock)",
    "count": "messages that arrived in this second",
    "window_rate": "mean arrivals/s over the window ending with this second",
    "window_max_backlog": "largest virtual backlog (tokens) over that window",
    "meter_rate": "rate (tokens/s) of the meter the backlog is measured against",
    "meter_source": "'metadata' (runs/<run>.json buckets) or 'measured' (margin × rate)",
    "rate_share": "this broker's share of the topic's window_rate in this second",
    "burst_share": "its share of the topic's window_max_backlog (rate_share if all are 0)",
    "proposed_rate": "topic rate × rate_share (null unless the metadata gives the buckets)",
    "proposed_burst": "topic burst × burst_share (same)",
}


def udf_schema() -> StructType:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("run", StringType()),
            StructField("topic", StringType()),
            StructField("broker", StringType()),
            StructField("second", LongType()),
            StructField("count", LongType()),
            StructField("window_rate", DoubleType()),
            StructField("window_max_backlog", DoubleType()),
            StructField("meter_rate", DoubleType()),
            StructField("meter_source", StringType()),
        ]
    )


def schema() -> StructType:
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    fields = {f.name: f for f in udf_schema().fields}
    fields["policy"] = StructField("policy", StringType())
    for name in ("rate_share", "burst_share", "proposed_rate", "proposed_burst"):
        fields[name] = StructField(name, DoubleType())
    return StructType([fields[name] for name in COLUMNS])


def windows(
    arrivals_ns: npt.NDArray[np.int64], rate: float, window_s: int
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]
]:
    """Per second from the first arrival's to the last's: (second, count, window mean
    rate, window max backlog in tokens). ``arrivals_ns`` must be sorted."""
    t = grid(rate, 1).t
    backlog = (virtual_backlog(arrivals_ns, rate) + t) * rate / NS_PER_S
    sec = arrivals_ns // NS_PER_S
    first = int(sec[0])
    idx = (sec - first).astype(np.int64)
    span = int(idx[-1]) + 1
    counts = np.bincount(idx, minlength=span)
    peak = np.zeros(span)
    np.maximum.at(peak, idx, backlog)
    csum = np.concatenate([[0], np.cumsum(counts)])
    lo = np.maximum(np.arange(span) - window_s + 1, 0)
    rates = (csum[1:] - csum[lo]) / window_s
    padded = np.concatenate([np.zeros(window_s - 1), peak])
    maxima = np.lib.stride_tricks.sliding_window_view(padded, window_s).max(axis=1)
    return np.arange(first, first + span, dtype=np.int64), counts, rates, maxima


def replay(
    frame: pd.DataFrame,
    *,
    rates: Mapping[tuple[str, str, str], float],
    margin: float,
    window_s: int,
) -> pd.DataFrame:
    """applyInPandas body for one (run, topic, broker): its rows of seconds."""
    run, topic, broker = (str(frame[c].iloc[0]) for c in ("run", "topic", "broker"))
    arrivals = np.sort(frame["t_arrive_ns"].to_numpy(dtype=np.int64))
    rate = rates.get((run, topic, broker))
    source = "metadata"
    if rate is None:
        source = "measured"
        span = int(arrivals[-1] - arrivals[0])
        measured = (arrivals.size - 1) * NS_PER_S / span if span > 0 else 1.0
        rate = margin * max(measured, 1.0)
    seconds, counts, window_rates, maxima = windows(arrivals, rate, window_s)
    return pd.DataFrame(
        {
            "run": run,
            "topic": topic,
            "broker": broker,
            "second": seconds,
            "count": counts.astype(np.int64),
            "window_rate": window_rates,
            "window_max_backlog": maxima,
            "meter_rate": float(rate),
            "meter_source": source,
        }
    )


def compute(
    spark: SparkSession, traces: Traces, *, margin: float = 1.1, window_s: int = 10
) -> DataFrame:
    """The adaptor-stats table as a Spark DataFrame (columns as ``COLUMNS``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if window_s < 1:
        raise ValueError(f"window_s must be >= 1, got {window_s}")
    rates = {
        (info.run, topic, broker): rate
        for info in traces.runs
        for (topic, broker), (rate, _) in info.buckets.items()
    }

    def body(frame: pd.DataFrame) -> pd.DataFrame:
        return replay(frame, rates=rates, margin=margin, window_s=window_s)

    arrivals = read_side(spark, traces, "broker", ["run", "topic", "broker", "t_arrive_ns"])
    per_second = (
        arrivals.where(F.col("topic").isNotNull() & F.col("broker").isNotNull())
        .groupBy("run", "topic", "broker")
        .applyInPandas(body, udf_schema())
    )
    topic_second = Window.partitionBy("run", "topic", "second")
    total_rate = F.sum("window_rate").over(topic_second)
    total_backlog = F.sum("window_max_backlog").over(topic_second)
    rate_share = F.col("window_rate") / F.when(total_rate > 0, total_rate)
    burst_share = F.when(total_backlog > 0, F.col("window_max_backlog") / total_backlog).otherwise(
        rate_share
    )
    totals = _topic_buckets(spark, traces)
    return (
        per_second.join(
            F.broadcast(runs_frame(spark, traces).select("run", "policy")), "run", "left"
        )
        .withColumn("rate_share", rate_share)
        .withColumn("burst_share", burst_share)
        .join(F.broadcast(totals), ["run", "topic"], "left")
        .withColumn("proposed_rate", F.col("topic_rate") * F.col("rate_share"))
        .withColumn("proposed_burst", F.col("topic_burst") * F.col("burst_share"))
        .select(*COLUMNS)
    )


def _topic_buckets(spark: SparkSession, traces: Traces) -> DataFrame:
    """(run, topic, topic_rate, topic_burst): the sum of the sub-buckets in the metadata."""
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    sums: dict[tuple[str, str], tuple[float, float]] = {}
    for info in traces.runs:
        for (topic, _), (rate, burst) in info.buckets.items():
            r, b = sums.get((info.run, topic), (0.0, 0.0))
            sums[(info.run, topic)] = (r + rate, b + burst)
    schema = StructType(
        [
            StructField("run", StringType()),
            StructField("topic", StringType()),
            StructField("topic_rate", DoubleType()),
            StructField("topic_burst", DoubleType()),
        ]
    )
    return spark.createDataFrame([(r, t, a, b) for (r, t), (a, b) in sums.items()], schema)
