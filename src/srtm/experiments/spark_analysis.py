"""Live runs analysed by the Spark pipeline: the headline figures of each run's summary
(end-to-end quantiles, per-broker quantiles, brokers used, SLO violations, the tail's
token share) recomputed by ``srtm.pipeline``'s latency job over the measured window.

The in-process figures stay in the summary under ``in_process`` for comparison. The
published = delivered accounting stays in process: it needs what the emulator's
publishers had acknowledged, which only the driver knows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srtm.quantiles import REPORTED

_HEADLINE = ("e2e_ms", "per_broker", "brokers_used", "slo_violations", "token_share_tail")


def _ms(row: dict[str, Any]) -> dict[str, float]:
    return {key: row[f"{key}_ns"] / 1e6 for key, _ in REPORTED}


def apply(summary: dict[str, Any], row: dict[str, Any], engine: dict[str, Any]) -> None:
    """Replace ``summary``'s headline figures by the pipeline's ``row`` (one of
    ``srtm.pipeline.latency_summary``'s), keeping the old ones under ``in_process``."""
    summary["in_process"] = {key: summary[key] for key in _HEADLINE}
    summary["e2e_ms"] = _ms(row)
    summary["per_broker"] = {
        b: {"messages": v["count"]} | _ms(v) for b, v in sorted(row["per_broker"].items())
    }
    summary["brokers_used"] = len(row["brokers"])
    count = row["count"]
    summary["slo_violations"] = (row["slo_violations"] or 0) / count if count else 0.0
    summary["token_share_tail"] = row["tail_token_share"] or 0.0
    summary["analysis"] = engine


def analyse(
    summaries: Sequence[dict[str, Any]], traces: Path, master: str | None = None
) -> dict[str, Any]:
    """Run the latency job over ``summaries``' runs and apply it to each; stops the
    Spark session (and its JVM) afterwards. Returns what ran it and how long it took."""
    from srtm.pipeline import latency_summary
    from srtm.pipeline.session import get_session, stop_session

    started = time.monotonic()
    spark = get_session(master)
    try:
        engine: dict[str, Any] = {"engine": "spark", "master": spark.sparkContext.master}
        rows = latency_summary(traces, runs=[s["run"] for s in summaries])
    finally:
        stop_session(spark)
    by_run = {r["run"]: r for r in rows}
    missing = [s["run"] for s in summaries if s["run"] not in by_run]
    if missing:
        raise RuntimeError(f"the latency job found no deliveries for run(s) {missing}")
    engine["seconds"] = round(time.monotonic() - started, 1)
    for s in summaries:
        apply(s, by_run[s["run"]], engine)
    return engine
