"""Comparisons of live runs: one row per policy, PNG plots and an HTML page."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srtm.experiments import analysis

#: (heading, how to read it from a run summary, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("p50 ms", "e2e_ms.p50", "{:.1f}"),
    ("p95 ms", "e2e_ms.p95", "{:.1f}"),
    ("p99 ms", "e2e_ms.p99", "{:.1f}"),
    ("SLO", "slo_met", "{}"),
    ("brokers", "brokers_used", "{}"),
    ("tokens", "token_share_tail", "{:.0%}"),
    ("rounds", "fitting_rounds", "{}"),
    ("published", "accounting.published", "{:,}"),
    ("delivered", "accounting.delivered", "{:,}"),
)
#: What the short headings mean (printed under the table).
LEGEND = (
    "SLO: p99 within the SLO; brokers: brokers that carried the topic; tokens: share of the "
    "slowest 1 % of messages' latency spent waiting for tokens (the DRL penalty); rounds: "
    "measurement rounds of online fitting (LB is not fitted)."
)


def value(summary: dict[str, Any], path: str) -> Any:
    if path == "slo_met":
        return "yes" if summary["e2e_ms"]["p99"] <= summary["slo_p99_ms"] else "no"
    if path == "fitting_rounds":
        rounds = summary.get("fitting_rounds") or []
        return sum(rounds) if rounds else "-"
    out: Any = summary
    for key in path.split("."):
        out = out[key]
    return out


def rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[fmt.format(value(s, path)) for _, path, fmt in COLUMNS] for s in summaries]


def compact(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The comparison as one JSON document: per policy p50, p95, p99 (ms), brokers used."""
    return {
        "scenario": summaries[0]["scenario"] if summaries else None,
        "slo_p99_ms": summaries[0]["slo_p99_ms"] if summaries else None,
        "analysis": engine(summaries),
        "policies": {
            s["policy"]: {
                "p50_ms": s["e2e_ms"]["p50"],
                "p95_ms": s["e2e_ms"]["p95"],
                "p99_ms": s["e2e_ms"]["p99"],
                "brokers_used": s["brokers_used"],
                "token_share_tail": s["token_share_tail"],
                "published": s["accounting"]["published"],
                "delivered": s["accounting"]["delivered"],
            }
            for s in summaries
        },
    }


def engine(summaries: Sequence[dict[str, Any]]) -> str:
    """Who computed the latency figures ("spark", "in-process (pandas)", or both)."""
    names = sorted({s.get("analysis", {}).get("engine", "?") for s in summaries})
    return " and ".join(names)


def plots(summaries: Sequence[dict[str, Any]], traces: Path, out: Path) -> list[Path]:
    """Latency CDFs per policy and per-broker p99, as PNG files in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in summaries:
        _, sub = analysis.load(traces, s["run"])
        window = analysis.Window(s["window_start_ns"], s["window_end_ns"])
        x, y = analysis.cdf(analysis.e2e_ms(sub, window))
        ax.plot(x, y, label=f"{s['policy']} (p99 {s['e2e_ms']['p99']:.1f} ms)")
    ax.axvline(summaries[0]["slo_p99_ms"], color="grey", linestyle="--", label="SLO (p99)")
    ax.axhline(0.99, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (ms)")
    ax.set_ylabel("share of messages")
    ax.set_title("Latency CDF per policy")
    ax.legend()
    ax.grid(True, alpha=0.3)
    cdf_png = out / "latency_cdf.png"
    fig.tight_layout()
    fig.savefig(cdf_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(1, len(summaries))
    for i, s in enumerate(summaries):
        brokers = sorted(s["per_broker"], key=int)
        xs = [int(b) + (i - (len(summaries) - 1) / 2) * width for b in brokers]
        ax.bar(xs, [s["per_broker"][b]["p99"] for b in brokers], width, label=s["policy"])
    ax.axhline(summaries[0]["slo_p99_ms"], color="grey", linestyle="--", label="SLO (p99)")
    ax.set_xlabel("broker")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("p99 per broker (a missing bar: the policy did not use it)")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    broker_png = out / "broker_p99.png"
    fig.tight_layout()
    fig.savefig(broker_png, dpi=110)
    plt.close(fig)
    return [cdf_png, broker_png]


def write_html(
    summaries: Sequence[dict[str, Any]], images: Sequence[Path], out: Path, scenario: Any
) -> Path:
    """``report.html`` beside the images: the scenario, the table, the plots."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows(summaries)
    )
    figures = "".join(
        f'<figure><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}"></figure>'
        for p in images
    )
    accounting = "".join(
        f"<li>{html.escape(s['policy'])}: published {s['accounting']['published']:,}, "
        f"delivered {s['accounting']['delivered']:,}, lost {s['accounting']['lost']}, "
        f"duplicates {s['accounting']['duplicates']}</li>"
        for s in summaries
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SRTM demo: {html.escape(scenario.name)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}
img{{max-width:100%}}</style></head><body>
<h1>SRTM demo: {html.escape(scenario.name)}</h1>
<p>{html.escape(scenario.description)}</p>
<p><em>Scale:</em> {html.escape(scenario.scale)}</p>
<p>SLO: p99 &le; {scenario.slo_p99_ms:g} ms. Measured window: {summaries[0]["duration_s"]:g} s
per policy, after a warm-up in which the controller places (and, except for LB, fits) the
topic. {html.escape(LEGEND)}</p>
<table><tr>{head}</tr>{body}</table>
<p>Latency figures computed by: {html.escape(engine(summaries))}.</p>
<h2>Every message accounted for</h2><ul>{accounting}</ul>
{figures}
</body></html>
"""
    path = out / "report.html"
    path.write_text(page)
    return path
