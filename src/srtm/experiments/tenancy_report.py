"""The live multi-tenant run's report: per topic p99 against its SLO, per broker the ledger
(allocated, measured, mcap) over time; a PNG and an HTML page beside the summary."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import pyplot


def plot(summary: dict[str, Any], out: Path) -> Path:
    """``multi-tenant-live.png``: p99 / SLO per topic, and one ledger panel per broker."""
    plt = pyplot()
    ids = [b["id"] for b in summary["ledger"][0]["brokers"]] if summary["ledger"] else []
    fig, axes = plt.subplots(1 + max(1, len(ids)), 1, figsize=(8, 2.4 * (1 + len(ids))))
    ax = axes[0]
    topics = summary["topics"]
    ax.bar(
        [t["topic"] for t in topics],
        [t["p99_ms"] for t in topics],
        color=["tab:green" if t["met"] else "tab:red" for t in topics],
        label="p99",
    )
    ax.scatter([t["topic"] for t in topics], [t["slo_p99_ms"] for t in topics],
               marker="_", s=600, color="black", label="SLO", zorder=3)  # fmt: skip
    ax.set_ylabel("ms")
    ax.set_title(f"{summary['policy'].upper()}: p99 per topic against its SLO", fontsize=9)
    ax.legend(fontsize=8)
    for ax, b in zip(axes[1:], ids, strict=False):
        t = [s["t_s"] for s in summary["ledger"]]
        rows = [next(x for x in s["brokers"] if x["id"] == b) for s in summary["ledger"]]
        ax.step(t, [r["allocated"] for r in rows], where="post", label="allocated")
        ax.plot(t, [r["measured"] for r in rows], lw=0.8, label="measured")
        ax.axhline(summary["mcap"], color="black", ls="--", lw=0.8, label="mcap")
        ax.set_ylabel(f"broker {b}\nmsg/s")
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("scenario time (s)")
    fig.tight_layout()
    png = out / f"{summary['run']}.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def write_html(summary: dict[str, Any], png: Path, out: Path) -> Path:
    """``multi-tenant-live.html``: the checks, the per-topic table and the plot."""
    esc = html.escape
    checks = "".join(
        f"<li>{'✓' if c['ok'] else '✗'} {esc(c['check'])}: {esc(c['detail'])}</li>"
        for c in summary["checks"]
    )
    head = ("topic", "kind", "msg/s", "SLO ms", "p99 ms", "token p99 ms", "brokers", "met",
            "published", "delivered")  # fmt: skip
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in topic_row(t)) + "</tr>"
        for t in summary["topics"]
    )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>{esc(summary['run'])}</title>"
        f"<h1>Multi-tenant service, live ({esc(summary['policy'])})</h1>"
        f"<p>{summary['brokers']} brokers, capacity {summary['capacity']:g} msg/s, "
        f"mcap {summary['mcap']:g} msg/s</p><ul>{checks}</ul>"
        f"<table border=1><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{rows}</table>"
        f"<p><img src='{esc(png.name)}'></p>"
    )
    path = out / f"{summary['run']}.html"
    path.write_text(page)
    return path


def topic_row(t: dict[str, Any]) -> list[str]:
    """One topic's cells (the table of the terminal and of the page)."""
    acc = t["accounting"]
    note = " (deleted)" if t["deleted"] else " (joining)" if t["joining"] else ""
    return [
        t["topic"] + note, t["kind"], f"{t['load']:,.0f}", f"{t['slo_p99_ms']:g}",
        f"{t['p99_ms']:.2f}", f"{t['token_p99_ms']:.2f}", str(t["brokers"]),
        "yes" if t["met"] else "no", f"{acc['published']:,}", f"{acc['delivered']:,}",
    ]  # fmt: skip
