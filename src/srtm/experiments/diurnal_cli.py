"""``srtm experiment run diurnal --sim``: tables, verdicts and the JSON document."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from srtm.experiments.diurnal import DiurnalSettings, diurnal_sim


def run_sim(
    out_dir: Path, as_json: bool, console: Console, out: Console,
    settings: DiurnalSettings | None = None,
) -> None:  # fmt: skip
    """Both runs at the paper's scale; prints the per-window table, the counts and the
    verdicts (and with ``as_json`` one JSON document on stdout)."""
    with console.status("diurnal --sim: loop on, then off"):
        result = diurnal_sim(out_dir, settings)
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
    if as_json:
        print(json.dumps(data))
