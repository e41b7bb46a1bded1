"""PySpark jobs over SRTM trace datasets (DESIGN.md, Data): latency and DRL tables, TB
Adaptor statistics, bucket profiles, correlation groups and reports.

Importing this package is cheap: Spark starts only when a job or ``latency_summary``
runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from srtm.pipeline.dataset import SchemaError

JOBS = ("latency", "adaptor-stats", "profile-buckets", "correlation", "report")

__all__ = ["JOBS", "SchemaError", "latency_summary"]


def latency_summary(
    traces_dir: Path, runs: Sequence[str] | None = None, master: str | None = None
) -> list[dict[str, object]]:
    """Per (run, policy, topic): count, p50/p95/p99/p99.9 end-to-end latency (ns,
    nearest-rank), SLO violations, the tail's token-wait share, the brokers used and their
    count and quantiles (``per_broker``) — the ``latency`` job's rows, without writing
    anything; over each run's measured window where its metadata gives one. Reuses the
    active SparkSession (or starts one on ``master``, ``local[*]`` by default)."""
    from srtm.pipeline import latency
    from srtm.pipeline.dataset import open_traces
    from srtm.pipeline.session import get_session

    traces = open_traces(Path(traces_dir), list(runs) if runs is not None else None)
    spark = get_session(master)
    return list(latency.summary_rows(latency.compute(spark, traces)))
