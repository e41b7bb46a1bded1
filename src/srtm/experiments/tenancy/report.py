"""The multi-tenant scenario's report: in the terminal, the simulation's tables (per topic
p99 and brokers under each policy, the capacity ledger) and a live run's (per topic p99
against its SLO, per broker the ledger), with the verdicts; for a live run a PNG and an
HTML page beside the summary."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from srtm.experiments.figures.common import FigureResult, pyplot

if TYPE_CHECKING:
    from srtm.experiments.sizing import Sizing
    from srtm.experiments.tenancy.scenario import TenancyScenario

NAME = "multi-tenant"


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


def _verdicts(out: Console, checks: Sequence[dict[str, Any]]) -> None:
    for c in checks:
        mark = "[green]✓[/green]" if c["ok"] else "[red]✗[/red]"
        out.print(f"{mark} {c['check']}: {c['detail']}", highlight=False)


def print_sim(result: FigureResult, out: Console) -> None:
    """The paper-scale simulation, SRTM against LB: per topic, the ledger, the summary."""
    from srtm.experiments.tenancy.sim import POLICIES

    data = result.data
    runs = data["policies"]
    table = Table(title=f"{result.title} (simulated in {result.elapsed_s:.1f} s)")
    for col in ("topic", "kind", "msg/s", "SLO ms"):
        table.add_column(col, justify="left" if col in ("topic", "kind") else "right")
    for p in POLICIES:
        for col in ("p99 ms", "brokers", "met"):
            table.add_column(f"{p.upper()} {col}", justify="right")
    for i, t in enumerate(runs["srtm"]["topics"]):
        note = " (deleted)" if t["topic"] == data["scenario"]["deleted"] else (
            " (joining)" if t["topic"] == data["scenario"]["joining"] else "")  # fmt: skip
        cells = [t["topic"] + note, t["kind"], f"{t['load']:,.0f}", f"{t['slo_p99_ms']:g}"]
        for p in POLICIES:
            x = runs[p]["topics"][i]
            cells += [f"{x['p99_ms']:.3g}", str(x["brokers"]), "yes" if x["met"] else "no"]
        table.add_row(*cells)
    out.print(table)
    ledger = Table(title="capacity ledger per broker: allocated msg/s (peak over the "
                   f"{runs['srtm']['ledger']['events_total']} events, and at the end)")  # fmt: skip
    ledger.add_column("broker")
    for p in POLICIES:
        ledger.add_column(f"{p.upper()} peak", justify="right")
        ledger.add_column(f"{p.upper()} end", justify="right")
    ledger.add_column("mcap", justify="right")
    for b in runs["srtm"]["ledger"]["peak"]:
        cells = [b]
        for p in POLICIES:
            led = runs[p]["ledger"]
            cells += [f"{led['peak'][b]:,.0f}", f"{led['final'][b]:,.0f}"]
        ledger.add_row(*cells, f"{data['scenario']['mcap']:,.0f}")
    out.print(ledger)
    summary = Table(title="summary")
    for col in ("policy", "topics meeting their SLO", "brokers per topic", "brokers used",
                "peak allocated / mcap"):  # fmt: skip
        summary.add_column(col, justify="right")
    for p, s in data["summary"].items():
        summary.add_row(p.upper(), f"{s['met']} of {s['topics']}",
                        f"{s['brokers_per_topic']:.2f}", str(s["brokers_used"]),
                        f"{s['max_allocated_share']:.1%}")  # fmt: skip
    out.print(summary)
    _verdicts(out, [{"check": c["paper"], "detail": c["sim"], "ok": c["ok"]}
                    for c in data["claims"]])  # fmt: skip


def print_live(summary: dict[str, Any], out: Console) -> None:
    """A live run under one policy: per topic, the ledger, the verdicts."""
    table = Table(title=f"{NAME}, live: {summary['brokers']} brokers of "
                  f"{summary['capacity']:g} msg/s, mcap {summary['mcap']:g}")  # fmt: skip
    for col in ("topic", "kind", "msg/s", "SLO ms", "p99 ms", "token p99 ms", "brokers",
                "met", "published", "delivered"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("topic", "kind") else "right")
    for t in summary["topics"]:
        table.add_row(*topic_row(t))
    out.print(table)
    ledger = Table(title=f"capacity ledger (GET /brokers, {len(summary['ledger'])} samples "
                   "a second apart): peak allocated and measured msg/s")  # fmt: skip
    for col in ("broker", "peak allocated", "peak measured", "mcap"):
        ledger.add_column(col, justify="right")
    ids = [b["id"] for b in summary["ledger"][0]["brokers"]] if summary["ledger"] else []
    for b in ids:
        rows = [x for s in summary["ledger"] for x in s["brokers"] if x["id"] == b]
        peak = max(r["allocated"] for r in rows)
        measured = max(r["measured"] for r in rows)
        ledger.add_row(b, f"{peak:,.0f}", f"{measured:,.0f}", f"{summary['mcap']:,.0f}")
    out.print(ledger)
    if summary["disturbed"]:
        out.print(f"[bold red]DISTURBED: the machine was too busy to measure latency on: "
                  f"{summary['disturbed']}[/bold red]", highlight=False)  # fmt: skip
    _verdicts(out, summary["checks"])


def sized_line(how: Sizing, sc: TenancyScenario) -> str:
    """What ``--scale`` chose for the live scenario, and what the slowed one runs at."""
    slos = "/".join(f"{s:g}" for s in sorted({t.slo_p99_ms for t in sc.tenants}))
    return how.explain(
        f"brokers process {sc.capacity:,.0f} msg/s (mcap {sc.mcap:,.0f}), the tenants "
        f"offer {sum(t.load for t in sc.tenants):,.0f} msg/s, SLOs p99 ≤ {slos} ms"
    )
