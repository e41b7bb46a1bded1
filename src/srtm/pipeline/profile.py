"""Job 3, ``profile-buckets``: each topic's token bucket as the paper configures it.

Per (run, topic), over the arrivals at all of the topic's brokers (one clock):
``r = margin × measured rate`` and ``b`` = the smallest burst with which ``quantile`` of the
messages wait no time for tokens at rate ``r`` — ``srtm.analysis.profile_bucket`` and
``required_burst``, run by ``applyInPandas`` on each topic's arrivals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from srtm.analysis import required_burst
from srtm.pipeline.dataset import Traces, read_side, runs_frame
from srtm.ratelimit import NS_PER_S

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

COLUMNS: dict[str, str] = {
    "run": "run name",
    "policy": "placement policy of the run (null without run metadata)",
    "topic": "topic",
    "messages": "broker-side rows of the topic",
    "brokers": "brokers the topic arrived at",
    "span_s": "last arrival − first arrival, s",
    "rate": "measured rate: (messages − 1) / span_s, msg/s",
    "r": "profiled token rate: margin × rate, tokens/s",
    "b": "profiled burst: smallest depth with zero token wait for `quantile` of messages",
    "quantile": "the share of messages that must not wait (default 0.99)",
    "configured_rate": "sum of the topic's sub-bucket rates in runs/<run>.json (or null)",
    "configured_burst": "sum of its sub-bucket depths there (or null)",
    "note": "why r and b are null (fewer than two arrivals, or no time between them)",
}


def udf_schema() -> StructType:
    from pyspark.sql.types import (
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    return StructType(
        [
            StructField("run", StringType()),
            StructField("topic", StringType()),
            StructField("messages", LongType()),
            StructField("brokers", IntegerType()),
            StructField("span_s", DoubleType()),
            StructField("rate", DoubleType()),
            StructField("r", DoubleType()),
            StructField("b", DoubleType()),
            StructField("quantile", DoubleType()),
            StructField("note", StringType()),
        ]
    )


def schema() -> StructType:
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    fields = {f.name: f for f in udf_schema().fields}
    fields["policy"] = StructField("policy", StringType())
    fields["configured_rate"] = StructField("configured_rate", DoubleType())
    fields["configured_burst"] = StructField("configured_burst", DoubleType())
    return StructType([fields[name] for name in COLUMNS])


def profile(frame: pd.DataFrame, *, margin: float, quantile: float) -> pd.DataFrame:
    """applyInPandas body for one (run, topic): one row."""
    arrivals = np.sort(frame["t_arrive_ns"].to_numpy(dtype=np.int64))
    span = int(arrivals[-1] - arrivals[0])
    row: dict[str, object] = {
        "run": str(frame["run"].iloc[0]),
        "topic": str(frame["topic"].iloc[0]),
        "messages": int(arrivals.size),
        "brokers": int(frame["broker"].nunique()),
        "span_s": span / NS_PER_S,
        "rate": None,
        "r": None,
        "b": None,
        "quantile": quantile,
        "note": None,
    }
    if arrivals.size < 2 or span <= 0:
        row["note"] = f"{arrivals.size} arrival(s) over {span} ns: no rate to measure"
    else:
        rate = (arrivals.size - 1) * NS_PER_S / span
        r = margin * rate
        row.update(rate=rate, r=r, b=required_burst(arrivals, r, quantile))
    return pd.DataFrame([row])


def compute(
    spark: SparkSession, traces: Traces, *, margin: float = 1.1, quantile: float = 0.99
) -> DataFrame:
    """The profile-buckets table as a Spark DataFrame (columns as ``COLUMNS``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    if not (margin > 0 and 0 < quantile <= 1):
        raise ValueError(f"need margin > 0 and 0 < quantile <= 1, got {margin}, {quantile}")

    def body(frame: pd.DataFrame) -> pd.DataFrame:
        return profile(frame, margin=margin, quantile=quantile)

    arrivals = read_side(spark, traces, "broker", ["run", "topic", "broker", "t_arrive_ns"])
    rows = (
        arrivals.where(F.col("topic").isNotNull())
        .groupBy("run", "topic")
        .applyInPandas(body, udf_schema())
    )
    configured = [
        (info.run, topic, sum(r for (t, _), (r, _) in info.buckets.items() if t == topic),
         sum(b for (t, _), (_, b) in info.buckets.items() if t == topic))
        for info in traces.runs
        for topic in sorted({t for t, _ in info.buckets})
    ]  # fmt: skip
    cschema = StructType(
        [
            StructField("run", StringType()),
            StructField("topic", StringType()),
            StructField("configured_rate", DoubleType()),
            StructField("configured_burst", DoubleType()),
        ]
    )
    return (
        rows.join(F.broadcast(runs_frame(spark, traces).select("run", "policy")), "run", "left")
        .join(F.broadcast(spark.createDataFrame(configured, cschema)), ["run", "topic"], "left")
        .select(*COLUMNS)
    )
