"""The diurnal day's report, simulated or live: in the terminal the per-window table, the
decisions and messages of each run, the verdicts; the plot of both runs over the day
(``sim`` and ``live`` write it) and the live run's HTML page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from srtm.experiments.diurnal import RUNS
from srtm.experiments.figures.common import FigureResult, pyplot

#: The live run's HTML page, in ``--out``.
PAGE = "diurnal-live.html"


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
    data: dict[str, Any], mcap: float, slo_ms: float, console: Console, out: Console,
    as_json: bool,
) -> None:  # fmt: skip
    """The live runs: the per-window table, the counts, whether each run was disturbed,
    the verdicts (on ``console`` with ``as_json``)."""
    out = console if as_json else out  # stdout holds the one JSON document
    table = Table(
        title=f"Diurnal day, live: {data['scenario']['peak_msgs_per_s']:,.0f} msg/s "
        f"at the peak, brokers of mcap {mcap:g} msg/s, SLO p99 ≤ {slo_ms:g} ms"
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


def plot(data: dict[str, Any]) -> Any:
    """Over time, per run: offered load, brokers, load ratio per broker, p99 vs SLO, and
    the events marked."""
    plt = pyplot()
    fig, axes = plt.subplots(4, 2, figsize=(13, 11), sharex=True)
    slo = data["scenario"]["slo_ms"]
    marks = {"move": ("tab:blue", ":"), "spawn": ("tab:green", "--"),
             "despawn": ("tab:orange", "--"), "kill": ("tab:red", "-")}  # fmt: skip
    for col, name in enumerate(RUNS):
        run_ = data["runs"][name]
        ws = run_["windows"]
        t = [w["t_s"] for w in ws]
        ax = axes[0][col]
        ax.plot(t, [w["offered_msgs"] / data["scenario"]["window_s"] / 1e3 for w in ws])
        ax.set_ylabel("offered kmsg/s")
        ax.set_title(f"loop {name}", fontsize=10)
        ax = axes[1][col]
        ax.step(t, [w["brokers"] for w in ws], where="post")
        ax.set_ylabel("brokers")
        ax = axes[2][col]
        ids = sorted({b for w in ws for b in w["load_ratio"]})
        for b in ids:
            ax.plot(t, [w["load_ratio"].get(b, math.nan) for w in ws], lw=0.8, label=b)
        ax.axhline(0.8, color="grey", ls="--", lw=0.8)
        ax.set_ylabel("load ratio")
        if ids:  # a run left out (the live test runs the loop on only) has no broker
            ax.legend(fontsize=6, ncol=4)
        ax = axes[3][col]
        ax.plot(t, [w["p99_ms"] for w in ws], marker=".")
        ax.axhline(slo, color="black", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("p99 ms (dashed: SLO)")
        ax.set_xlabel("scenario time (s)")
        for ev in run_["events"]:
            colour, ls = marks.get(ev["kind"], ("grey", ":"))
            for row in axes[:, col]:
                row.axvline(ev["t_s"], color=colour, ls=ls, lw=0.6, alpha=0.6)
    fig.suptitle("diurnal: red kill, green spawn, orange despawn, blue dotted move", fontsize=10)
    return fig


def for_plot(data: dict[str, Any]) -> dict[str, Any]:
    """The live document as ``plot`` reads it (both columns; a missing run empty)."""
    empty: dict[str, list[Any]] = {"windows": [], "events": []}
    runs = {}
    for name in RUNS:
        r = data["runs"].get(name, empty)
        nan = [{**w, "p99_ms": math.nan if w["p99_ms"] is None else w["p99_ms"]}
               for w in r["windows"]]  # fmt: skip
        runs[name] = {**r, "windows": nan}
    return {**data, "runs": runs}


def write_html(data: dict[str, Any], png: Path, out: Path) -> Path:
    """``diurnal-live.html``: the verdicts, the per-window table of both runs, the plot."""
    import html

    esc = html.escape
    claims = "".join(
        f"<li>{'✓' if c['ok'] else '✗'} {esc(c['paper'])}: {esc(c['sim'])}</li>"
        for c in data.get("claims", [])
    )
    notes = "".join(
        f"<p><b>loop {esc(n)}: {'DISTURBED: ' + esc(d) if d else 'not disturbed'}</b></p>"
        for n, d in data["disturbed"].items()
    )
    head = ["t s", "offered msgs"] + [f"{n}: {c}" for n in data["runs"]
                                      for c in ("brokers", "p99 ms", "SLO")]  # fmt: skip
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in table_rows(data)
    )
    sc = data["scenario"]
    page = (
        "<!doctype html><meta charset='utf-8'><title>diurnal live</title>"
        f"<h1>Diurnal day, live: loop on against off</h1><p>a {sc['day_s']:g}-s day, "
        f"{sc['peak_msgs_per_s']:,.0f} msg/s at the peak, brokers of mcap {sc['mcap']:g} "
        f"msg/s, starting on {sc['start_brokers']} (min {sc['min_brokers']}, max "
        f"{sc['max_brokers']}), one killed at {sc['kill_at_s']:g} s, SLO p99 ≤ "
        f"{sc['slo_ms']:g} ms</p>{notes}<ul>{claims}</ul>"
        f"<table border=1><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr>{rows}</table>"
        f"<p><img src='{esc(png.name)}'></p>"
    )
    path = out / PAGE
    path.write_text(page)
    return path


def table_rows(data: dict[str, Any]) -> list[list[Any]]:
    """Per window: time, offered messages, then per run brokers, p99 and SLO met."""
    runs = list(data["runs"].values())
    rows = []
    for i, w in enumerate(runs[0]["windows"]):
        row: list[Any] = [w["t_s"], w["offered_msgs"]]
        for r in runs:
            x = r["windows"][i]
            p99 = "—" if x["p99_ms"] is None else f"{x['p99_ms']:.2f}"
            row += [x["brokers"], p99, "yes" if x["slo_met"] else "no"]
        rows.append(row)
    return rows
