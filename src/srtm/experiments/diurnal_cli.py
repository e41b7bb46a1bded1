"""``srtm experiment run diurnal [--sim]``: tables, verdicts and the JSON document."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from srtm.experiments.diurnal import DiurnalSettings, diurnal_sim
from srtm.experiments.diurnal_live import RUNS, LiveDiurnal, diurnal_live, table_rows


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


def run_live(
    out_dir: Path, as_json: bool, console: Console, out: Console,
    settings: LiveDiurnal | None = None, loops: tuple[str, ...] = RUNS,
) -> dict[str, object]:  # fmt: skip
    """The live runs (``loops``: loop on, then off, by default) on local child processes;
    prints the per-window table, the counts, whether each run was disturbed, the verdicts
    (and with ``as_json`` one JSON document on stdout)."""
    s = settings or LiveDiurnal()
    which = ", then ".join(f"loop {x}" for x in loops)
    with console.status(f"diurnal live: a {s.day_s:g}-s day, {which}") as status:

        def progress(phase: str, done: float, total: float) -> None:
            status.update(f"diurnal live: {phase} ({done:.0f} of {total:.0f} s)")

        data = diurnal_live(out_dir, s, loops=loops, on_progress=progress)
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
    if as_json:
        print(json.dumps(data, default=_plain))
    return data


def _plain(x: object) -> object:
    return None if isinstance(x, float) else str(x)
