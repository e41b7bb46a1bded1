"""Job 5, ``report``: tables, PNG plots and one HTML page from the other jobs' outputs.

Reads ``OUT/latency``, ``OUT/adaptor-stats``, ``OUT/profile-buckets`` and
``OUT/correlation`` (whichever exist) and writes ``OUT/report/``: ``index.html``, one PNG
per figure and ``summary.parquet`` (one row per run). One run gives that run's page;
several runs are compared side by side (bars per run, one row per run in the summary).
Plots use matplotlib's object API (no pyplot state, the Agg canvas, no display needed).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

INPUTS = ("latency", "adaptor-stats", "profile-buckets", "correlation")

SUMMARY_COLUMNS: dict[str, str] = {
    "run": "run name",
    "policy": "placement policy",
    "scenario": "scenario",
    "topics": "topics with deliveries",
    "deliveries": "subscriber rows",
    "worst_p99_ms": "largest per-topic p99 e2e latency, ms",
    "slo_p99_ms": "the run's SLO on p99, ms",
    "topics_meeting_slo": "topics whose p99 meets the SLO",
    "mean_tail_token_share": "mean over topics of the tail's token-wait share",
    "mean_ari": "mean adjusted Rand index of the correlation proposal (null if no truth)",
}


@dataclass
class PipelineReport:
    """What was written."""

    directory: Path
    page: Path
    figures: list[Path] = field(default_factory=list)
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)


def load(out: Path, runs: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """The job outputs present under ``out`` (optionally only some runs)."""
    tables = {}
    for job in INPUTS:
        path = out / job
        if path.is_dir():
            frame = pd.read_parquet(path)
            tables[job] = frame if runs is None else frame[frame["run"].isin(list(runs))]
    return tables


def summarise(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per run (``SUMMARY_COLUMNS``)."""
    lat = tables.get("latency", pd.DataFrame(columns=["run", "broker"]))
    topics = lat[lat["broker"].isna()]
    rows = []
    for run, g in topics.groupby("run", sort=True):
        slo = g["slo_p99_ns"].dropna()
        rows.append(
            {
                "run": run,
                "policy": g["policy"].iloc[0],
                "scenario": g["scenario"].iloc[0],
                "topics": len(g),
                "deliveries": int(g["count"].sum()),
                "worst_p99_ms": float(g["p99_ns"].max()) / 1e6,
                "slo_p99_ms": float(slo.iloc[0]) / 1e6 if len(slo) else None,
                "topics_meeting_slo": int(g["slo_met"].fillna(False).astype(bool).sum()),
                "mean_tail_token_share": _mean(g["tail_token_share"]),
                "mean_ari": None,
            }
        )
    summary = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    corr = tables.get("correlation")
    if corr is not None and not corr.empty and not summary.empty:
        ari = corr.drop_duplicates(["run", "topic"]).groupby("run")["ari"].mean()
        summary["mean_ari"] = summary["run"].map(ari)
    return summary


def _mean(series: pd.Series) -> float | None:
    values = series.dropna()
    return float(values.mean()) if len(values) else None


def _bars(ax: object, frame: pd.DataFrame, value: str, scale: float = 1.0) -> None:
    """Grouped bars: one group per topic, one bar per run."""
    runs = sorted(frame["run"].unique())
    topics = sorted(frame["topic"].unique())
    width = 0.8 / max(len(runs), 1)
    x = np.arange(len(topics))
    for i, run in enumerate(runs):
        g = frame[frame["run"] == run].set_index("topic").reindex(topics)
        ax.bar(x + i * width, g[value].astype(float) * scale, width, label=run)  # type: ignore[attr-defined]
    ax.set_xticks(x + width * (len(runs) - 1) / 2, topics, rotation=30, ha="right")  # type: ignore[attr-defined]
    ax.legend(title="run", fontsize="small")  # type: ignore[attr-defined]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def figures(tables: dict[str, pd.DataFrame], directory: Path) -> list[Path]:
    """Every figure the data allows, as PNG files in ``directory``."""
    made = []
    lat = tables.get("latency")
    if lat is not None and not lat.empty:
        topics = lat[lat["broker"].isna()]
        fig = Figure(figsize=(8, 4.5))
        ax = fig.subplots()
        _bars(ax, topics, "p99_ns", 1e-6)
        for slo in sorted(topics["slo_p99_ns"].dropna().unique()):
            ax.axhline(float(slo) / 1e6, color="red", linestyle="--", linewidth=1)
        ax.set_ylabel("p99 end-to-end latency (ms)")
        ax.set_title("p99 latency per topic (dashed: SLO)")
        made.append(_save(fig, directory / "latency_p99.png"))
        fig = Figure(figsize=(8, 4.5))
        ax = fig.subplots()
        _bars(ax, topics, "tail_token_share", 100.0)
        ax.set_ylabel("token wait / e2e latency in the tail (%)")
        ax.set_title("DRL penalty: share of tail latency spent waiting for tokens")
        made.append(_save(fig, directory / "tail_token_share.png"))
    stats = tables.get("adaptor-stats")
    if stats is not None and not stats.empty:
        made.append(_adaptor_figure(stats, directory / "adaptor_rates.png"))
    prof = tables.get("profile-buckets")
    if prof is not None and prof["b"].notna().any():
        fig = Figure(figsize=(8, 4.5))
        ax = fig.subplots()
        _bars(ax, prof, "b")
        ax.set_ylabel("burst b (tokens)")
        ax.set_title("Profiled bucket depth per topic (r = 1.1 × rate, 99 % never wait)")
        made.append(_save(fig, directory / "profile_burst.png"))
    corr = tables.get("correlation")
    if corr is not None and corr["ari"].notna().any():
        fig = Figure(figsize=(8, 4.5))
        ax = fig.subplots()
        _bars(ax, corr.drop_duplicates(["run", "topic"]), "ari")
        ax.set_ylim(min(0.0, float(corr["ari"].min())), 1.05)
        ax.set_ylabel("adjusted Rand index")
        ax.set_title("Correlation groups found vs ground truth")
        made.append(_save(fig, directory / "correlation_ari.png"))
    return made


def _adaptor_figure(stats: pd.DataFrame, path: Path) -> Path:
    """Window rate per broker over time, for the busiest topic of each run."""
    runs = sorted(stats["run"].unique())
    fig = Figure(figsize=(8, 3 * len(runs)))
    axes = np.atleast_1d(fig.subplots(len(runs), 1, squeeze=False).ravel())
    for ax, run in zip(axes, runs, strict=True):
        mine = stats[stats["run"] == run]
        topic = mine.groupby("topic")["count"].sum().idxmax()
        for broker, g in mine[mine["topic"] == topic].groupby("broker"):
            g = g.sort_values("second")
            ax.plot(g["second"] - mine["second"].min(), g["window_rate"], label=str(broker))
        ax.set_title(f"{run}: {topic}, TB Adaptor window rate per broker")
        ax.set_xlabel("s since the run's first arrival")
        ax.set_ylabel("msg/s")
        ax.legend(title="broker", fontsize="small")
    return _save(fig, path)


def _table(frame: pd.DataFrame) -> str:
    text: str = frame.to_html(index=False, na_rep="—", float_format=lambda v: f"{v:,.4g}", border=0)
    return text


def _latency_view(lat: pd.DataFrame) -> pd.DataFrame:
    view = lat.copy()
    for col in ("p50_ns", "p95_ns", "p99_ns", "p999_ns", "max_ns"):
        view[col.replace("_ns", "_ms")] = view[col].astype(float) / 1e6
    cols = ["run", "policy", "topic", "broker", "count", "p50_ms", "p95_ms", "p99_ms"]
    cols += ["p999_ms", "slo_met", "slo_violations", "tail_token_share"]
    return view[cols]


def page(tables: dict[str, pd.DataFrame], summary: pd.DataFrame, pictures: list[Path]) -> str:
    """The HTML page (self-contained but for the PNGs beside it)."""
    runs = ", ".join(html.escape(str(r)) for r in summary["run"]) or "no runs"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>SRTM report: {runs}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:80em}"
        "table{border-collapse:collapse;font-size:90%}td,th{padding:2px 8px;"
        "border-bottom:1px solid #ddd;text-align:right}img{max-width:100%}</style>",
        "</head><body>",
        f"<h1>SRTM report: {runs}</h1>",
        "<h2>Runs</h2>",
        _table(summary),
    ]
    for picture in pictures:
        parts.append(f"<p><img src='{html.escape(picture.name)}' alt='{picture.stem}'></p>")
    lat = tables.get("latency")
    if lat is not None:
        parts += ["<h2>Latency (nearest-rank percentiles)</h2>", _table(_latency_view(lat))]
    prof = tables.get("profile-buckets")
    if prof is not None:
        parts += ["<h2>Profiled buckets</h2>", _table(prof)]
    corr = tables.get("correlation")
    if corr is not None:
        per_topic = corr.drop_duplicates(["run", "topic"])[
            ["run", "policy", "topic", "groups_found", "groups_true", "ari"]
        ]
        parts += ["<h2>Correlation groups</h2>", _table(per_topic)]
    stats = tables.get("adaptor-stats")
    if stats is not None and not stats.empty:
        peak = stats.groupby(["run", "topic", "broker"], as_index=False).agg(
            seconds=("second", "size"),
            peak_window_rate=("window_rate", "max"),
            peak_backlog=("window_max_backlog", "max"),
            mean_rate_share=("rate_share", "mean"),
        )
        parts += ["<h2>TB Adaptor inputs (per broker, over the run)</h2>", _table(peak)]
    parts.append("</body></html>")
    return "\n".join(parts)


def build(out: Path, runs: Sequence[str] | None = None) -> PipelineReport:
    """Write ``out/report/`` from the outputs under ``out``."""
    tables = load(out, runs)
    directory = out / "report"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.png"):
        stale.unlink()  # re-running replaces the report, figures included
    summary = summarise(tables)
    pictures = figures(tables, directory)
    summary.to_parquet(directory / "summary.parquet", index=False)
    target = directory / "index.html"
    target.write_text(page(tables, summary, pictures))
    return PipelineReport(directory, target, pictures, summary)
