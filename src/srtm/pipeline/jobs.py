"""The jobs by name, what each writes, and ``all`` in order."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.dataset as ds

from srtm.pipeline import JOBS, adaptor, correlation, latency, profile, report
from srtm.pipeline.dataset import Side, Traces, open_traces, write_output
from srtm.pipeline.session import (
    SparkSettings,
    executor_ids,
    get_session,
    size_shuffle,
    stop_session,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "JOBS",
    "READS",
    "JobResult",
    "Options",
    "PipelineRun",
    "run_job",
    "run_jobs",
    "run_pipeline",
]

#: Job → the trace sides it reads (for sizing and rows/s).
READS: dict[str, tuple[Side, ...]] = {
    "latency": ("subscriber", "broker"),
    "adaptor-stats": ("broker",),
    "profile-buckets": ("broker",),
    "correlation": ("broker", "subscriber"),
    "report": (),
}


@dataclass(frozen=True)
class Options:
    """Job parameters (the CLI's options)."""

    runs: tuple[str, ...] | None = None
    margin: float = 1.1
    quantile: float = 0.99
    window_s: int = 10
    correlation: correlation.Settings = field(default_factory=correlation.Settings)


@dataclass(frozen=True)
class JobResult:
    job: str
    output: Path
    rows: int
    seconds: float
    input_rows: int


def output_rows(path: Path) -> int:
    """Rows of a written Parquet dataset (from its footers)."""
    if path.is_file():
        return int(ds.dataset(path).count_rows())
    return int(ds.dataset(path, format="parquet").count_rows()) if path.is_dir() else 0


def _pandas_to_spark(spark: SparkSession, frame: pd.DataFrame, schema: StructType) -> DataFrame:
    def plain(v: object) -> object:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        item = getattr(v, "item", None)  # numpy scalars → Python
        return item() if callable(item) else v

    names = [f.name for f in schema.fields]
    frame = frame[names].astype(object).where(frame[names].notna(), None)
    rows = [tuple(plain(v) for v in row) for row in frame.itertuples(index=False)]
    return spark.createDataFrame(rows, schema)


def _tune(spark: SparkSession, traces: Traces, job: str) -> None:
    """Shuffle partitions and scan splits sized to what the job reads."""
    size = sum(traces.bytes(side) for side in READS[job])
    size_shuffle(spark, size)
    cores = spark.sparkContext.defaultParallelism
    # About four scan tasks per core: balanced waves without tiny tasks.
    split = max(4 << 20, math.ceil(size / max(1, len(READS[job])) / (4 * cores)))
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))


def run_job(
    job: str, spark: SparkSession, traces: Traces, out: Path, options: Options | None = None
) -> JobResult:
    """Run one job on ``traces``; its output replaces ``out/<job>``."""
    opts = options or Options()
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; jobs: {', '.join(JOBS)}")
    start = time.perf_counter()
    target = out / job
    if job == "report":
        missing = [j for j in report.INPUTS if not (out / j).is_dir()]
        for j in missing:  # a report needs the others' outputs: make what is missing
            run_job(j, spark, traces, out, opts)
        built = report.build(out, opts.runs)
        rows = len(built.summary)
    else:
        _tune(spark, traces, job)
        frame = _compute(job, spark, traces, opts)
        write_output(frame, target)
        rows = output_rows(target)
    input_rows = sum(traces.rows(side) for side in READS[job])
    return JobResult(job, target, rows, time.perf_counter() - start, input_rows)


def _compute(job: str, spark: SparkSession, traces: Traces, opts: Options) -> DataFrame:
    if job == "latency":
        return _pandas_to_spark(spark, latency.compute(spark, traces), latency.schema())
    if job == "adaptor-stats":
        return adaptor.compute(spark, traces, margin=opts.margin, window_s=opts.window_s)
    if job == "profile-buckets":
        return profile.compute(spark, traces, margin=opts.margin, quantile=opts.quantile)
    table = correlation.compute(spark, traces, opts.correlation)
    return _pandas_to_spark(spark, table, correlation.schema())


def run_jobs(
    jobs: Sequence[str],
    spark: SparkSession,
    traces: Path | Traces,
    out: Path,
    options: Options | None = None,
    on_start: Callable[[str], None] | None = None,
) -> list[JobResult]:
    """Run ``jobs`` in order on a trace directory (checked once here) or checked traces."""
    opts = options or Options()
    if not isinstance(traces, Traces):
        traces = open_traces(traces, opts.runs)
    results = []
    for job in jobs:
        if on_start is not None:
            on_start(job)
        results.append(run_job(job, spark, traces, out, opts))
    return results


@dataclass(frozen=True)
class PipelineRun:
    """What ``run_pipeline`` did, and where: the Spark application and its executors."""

    results: list[JobResult]
    application: str
    #: Executor ids (none: the driver JVM ran the tasks).
    executors: list[str]


def run_pipeline(
    jobs: Sequence[str],
    traces: Path,
    out: Path,
    settings: SparkSettings,
    options: Options | None = None,
    on_start: Callable[[str], None] | None = None,
) -> PipelineRun:
    """``run_jobs`` in a session on ``settings``: the traces are checked before Spark
    starts (errors come at once); a session started here is stopped with its JVM at the
    end, one already running (a notebook, tests) is left running."""
    from pyspark.sql import SparkSession

    opts = options or Options()
    owned = SparkSession.getActiveSession() is None
    spark = None
    try:
        checked = open_traces(traces, opts.runs)
        spark = get_session(settings.master, settings)
        app_id = spark.sparkContext.applicationId
        results = run_jobs(jobs, spark, checked, out, opts, on_start)
        # After the jobs: on a cluster, executors register while the first job waits.
        executors = executor_ids(spark)
    finally:
        if owned and spark is not None:
            stop_session(spark)
    return PipelineRun(results, app_id, executors)
