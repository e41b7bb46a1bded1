"""The diurnal day in the terminal, simulated or live: the per-window table, the
decisions and messages of each run, the verdicts. (The live run's PNG and HTML page are
written by ``live``.)"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from srtm.experiments.diurnal.live import LiveDiurnal, table_rows
from srtm.experiments.figures.common import FigureResult


def print_sim(result: FigureResult, console: Console, out: Console, as_json: bool) -> None:
    """Both runs at the paper's scale: the per-window table, the counts and the verdicts
    (on ``console`` with ``as_json``: stdout then holds the one JSON document)."""
    data = result.data
    out = console if as_json else out  # stdout holds the one JSON document
    table = Table(title=f"{result.title} (simulated in {result.elapsed_s:.1f} s)")
    for col in result.columns:
        table.add_column(col, justify="right")
    for row in result.rows:
        table.add_row(*(f"{c:,}" if isinstance(c, int) else str(c) for c in row))
    out.print(table)
    counts = Table(title="decisions and messages")
    for col in ("run", "moves", "spawned", "despawned", "published", "delivered", "SLO windows"):
        counts.add_column(col, justify="right")
    for name, r in data["runs"].items():
        counts.add_row(
            f"loop {name}", str(r["moves"]), str(r["spawned"]), str(r["despawned"]),
            f"{r['published']:,}", f"{r['delivered']:,}",
            f"{r['slo_windows_met']} of {len(r['windows'])}",
        )  # fmt: skip
    out.print(counts)
    for c in data["claims"]:
        mark = "[green]✓[/green]" if c["ok"] else "[red]✗[/red]"
        out.print(f"{mark} {c['paper']}: {c['sim']}")
    out.print(f"files: {', '.join(str(f) for f in result.files)}")


def print_live(
    data: dict[str, Any], s: LiveDiurnal, console: Console, out: Console, as_json: bool
) -> None:
    """The live runs: the per-window table, the counts, whether each run was disturbed,
    the verdicts (on ``console`` with ``as_json``)."""
    out = console if as_json else out  # stdout holds the one JSON document
    table = Table(
        title=f"Diurnal day, live: {data['scenario']['peak_msgs_per_s']:,.0f} msg/s "
        f"at the peak, brokers of mcap {s.mcap:g} msg/s, SLO p99 ≤ {s.slo_ms:g} ms"
    )
    cols = ["t s", "offered msgs"] + [f"{n}: {c}" for n in data["runs"]
                                      for c in ("brokers", "p99 ms", "SLO")]  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    for row in table_rows(data):
        table.add_row(*(f"{c:,}" if isinstance(c, int) else f"{c:g}" if isinstance(c, float)
                        else str(c) for c in row))  # fmt: skip
    out.print(table)
    counts = Table(title="decisions and messages")
    for col in ("run", "moves", "spawned", "despawned", "published", "delivered", "failed",
                "SLO windows", "disturbed"):  # fmt: skip
        counts.add_column(col, justify="right")
    for name, r in data["runs"].items():
        counts.add_row(
            f"loop {name}", str(r["moves"]), str(r["spawned"]), str(r["despawned"]),
            f"{r['published']:,}", f"{r['delivered']:,}", f"{r['failed']:,}",
            f"{r['slo_windows_met']} of {len(r['windows'])}",
            "DISTURBED" if r["disturbed"] else "no",
        )  # fmt: skip
    out.print(counts)
    for name, why in data["disturbed"].items():
        if why:
            out.print(f"[yellow]loop {name} DISTURBED[/yellow]: {why}")
    for c in data.get("claims", []):
        mark = "[green]✓[/green]" if c["ok"] else "[red]✗[/red]"
        out.print(f"{mark} {c['paper']}: {c['sim']}")
    out.print(f"files: {', '.join(data['files'])}")


def plain(x: object) -> object:
    return None if isinstance(x, float) else str(x)
