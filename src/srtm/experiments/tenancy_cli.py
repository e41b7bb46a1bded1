"""``srtm experiment run multi-tenant [--sim]``: progress, tables and verdicts in the
terminal for the multi-tenant scenario (``tenancy_sim`` and ``tenancy_live``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.placement import Policy

if TYPE_CHECKING:
    from srtm.experiments.sizing import Sizing
    from srtm.experiments.tenancy import TenancyScenario

NAME = "multi-tenant"
DESCRIPTION = (
    "six tenants (live; 54 with --sim at the paper's scale) with different SLOs, rates and "
    "correlation arriving over time, one deleted midway, sensors joining one by one"
)


def _bar(console: Console, label: str) -> Progress:
    return Progress(
        TextColumn(f"[bold]{label}[/bold] {{task.description}}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _verdicts(out: Console, checks: Sequence[dict[str, Any]]) -> None:
    for c in checks:
        mark = "[green]✓[/green]" if c["ok"] else "[red]✗[/red]"
        out.print(f"{mark} {c['check']}: {c['detail']}", highlight=False)


def run_sim(out_dir: Path, as_json: bool, console: Console, out: Console) -> None:
    """The paper-scale simulation, SRTM against LB."""
    from srtm.experiments.tenancy_sim import POLICIES, multi_tenant_sim

    with _bar(console, f"{NAME} --sim") as bar:
        task = bar.add_task("starting", total=1.0)

        def update(phase: str, done: float, total: float) -> None:
            bar.update(task, description=phase, completed=done / total if total else 1.0)

        result = multi_tenant_sim(out_dir, on_progress=update)
        bar.update(task, description="done", completed=1.0)
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
    for f in result.files:
        console.print(f"wrote {f}")
    if as_json:
        print(json.dumps(data))


def sized_line(how: Sizing, sc: TenancyScenario) -> str:
    """What ``--scale`` chose for the live scenario, and what the slowed one runs at."""
    slos = "/".join(f"{s:g}" for s in sorted({t.slo_p99_ms for t in sc.tenants}))
    return how.explain(
        f"brokers process {sc.capacity:,.0f} msg/s (mcap {sc.mcap:,.0f}), the tenants "
        f"offer {sum(t.load for t in sc.tenants):,.0f} msg/s, SLOs p99 ≤ {slos} ms"
    )


def run_live(
    out_dir: Path, policy: Policy, as_json: bool, console: Console, out: Console,
    sc: TenancyScenario | None = None, sizing: Sizing | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The live scenario (``sc``, by default ``tenancy.live_scale()``) on local brokers
    under ``policy``; returns its summary."""
    from srtm.experiments import tenancy_live, tenancy_report

    with _bar(console, f"{NAME} / {policy}") as bar:
        task = bar.add_task("starting", total=1.0)

        def update(phase: str, done: float, total: float) -> None:
            share = done / total if total > 0 else 1.0
            bar.update(task, description=phase, completed=min(1.0, max(0.0, share)))

        summary = tenancy_live.run(out_dir, policy, sc=sc, on_progress=update, sizing=sizing)
        bar.update(task, description="done", completed=1.0)
    table = Table(title=f"{NAME}, live: {summary['brokers']} brokers of "
                  f"{summary['capacity']:g} msg/s, mcap {summary['mcap']:g}")  # fmt: skip
    for col in ("topic", "kind", "msg/s", "SLO ms", "p99 ms", "token p99 ms", "brokers",
                "met", "published", "delivered"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("topic", "kind") else "right")
    for t in summary["topics"]:
        table.add_row(*tenancy_report.topic_row(t))
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
    png = tenancy_report.plot(summary, out_dir)
    page = tenancy_report.write_html(summary, png, out_dir)
    console.print(f"report: {page}")
    if as_json:
        print(json.dumps({k: v for k, v in summary.items() if k != "ledger"}))
    return summary
