"""The live utility experiments' report, in the terminal and on the page: per stage the
consumers admitted per class and the rates measured (beside the optimizer's plan), the
paper's conclusions checked; a PNG and an HTML page beside the summary."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from srtm.experiments.figures.common import pyplot

HEAD = ("stage", "admitted/available per class", "delivered msg/s per class",
        "measured msg/s per flow",
        "bucket msg/s per flow", "planned msg/s per flow", "planned admitted",
        "broker CPU (core)")  # fmt: skip


def stage_row(s: dict[str, Any]) -> list[str]:
    """One stage's cells (the terminal's table and the page's)."""
    adm = ", ".join(f"{c} {s['admitted'][c]}/{n}" for c, n in s["available"].items())
    cpu = "n/a" if s.get("broker_cpu") is None else f"{s['broker_cpu']:.3f}"
    return [
        s["name"], adm,
        ", ".join(f"{c} {r:,.0f}" for c, r in s.get("delivered", {}).items()) or "–",
        ", ".join(f"{r:.1f}" for r in s["rates"]),
        ", ".join("–" if f.get("bucket_rate") is None else f"{f['bucket_rate']:.1f}"
                  for f in s.get("flows", [])),
        ", ".join(f"{r:.1f}" for r in s["expected"]["rates"]),
        ", ".join(f"{c} {n}" for c, n in s["expected"]["admitted"].items()), cpu,
    ]  # fmt: skip


def plot(summary: dict[str, Any], out: Path) -> Path:
    """``NAME-live.png``: admitted consumers per class (stacked) and measured rates per
    stage; the plan's rates dotted."""
    plt = pyplot()
    stages = summary["segments"]
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    colours = {"gold": "#d4a017", "silver": "#a8a9ad", "bronze": "#cd7f32"}
    classes = list(stages[0]["available"]) if stages else []
    for c in classes:
        ys = [float(s["admitted"].get(c, 0)) for s in stages]
        ax.bar(xs, ys, bottom=bottom, color=colours.get(c), label=f"{c} admitted", width=0.6)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.set_xticks(xs, [s["name"] for s in stages], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("admitted consumers (measured at the broker)")
    twin = ax.twinx()
    names = [f["name"] for f in stages[0]["flows"]] if stages else []
    for k, name in enumerate(names):
        line = twin.plot(xs, [s["rates"][k] for s in stages], marker="o", label=name)
        twin.plot(xs, [s["expected"]["rates"][k] for s in stages], ls=":",
                  color=line[0].get_color())  # fmt: skip
    twin.set_ylabel("delivered rate, msg/s (dotted: planned)")
    twin.set_ylim(bottom=0)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=7, loc="upper left")
    mark = " (DISTURBED)" if summary.get("disturbed") else ""
    ax.set_title(f"{summary['title']} [{summary['mode']}]{mark}", fontsize=10)
    fig.tight_layout()
    png = out / f"{summary['experiment']}-live.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def write_html(summary: dict[str, Any], png: Path, out: Path) -> Path:
    """``NAME-live.html``: the verdicts, the stage table and the plot."""
    esc = html.escape
    claims = "".join(
        f"<li>{'✓' if c['ok'] else '✗'} {esc(c['paper'])}: {esc(c['sim'])}</li>"
        for c in summary["claims"]
    )
    rows = "".join(
        "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in stage_row(s)) + "</tr>"
        for s in summary["segments"]
    )
    note = (f"<p><b>DISTURBED</b>: {esc(summary['disturbed'])}</p>"
            if summary.get("disturbed") else "")  # fmt: skip
    page = (
        f"<!doctype html><meta charset='utf-8'><title>{esc(summary['experiment'])} live"
        f"</title><h1>{esc(summary['title'])}</h1>"
        f"<p>decided by: {esc(summary['mode'])}; {summary['stage_s']:g} s per stage, the last "
        f"part measured</p>{note}<ul>{claims}</ul>"
        f"<table border=1><tr>{''.join(f'<th>{h}</th>' for h in HEAD)}</tr>{rows}</table>"
        f"<p><img src='{esc(png.name)}'></p>"
    )
    path = out / f"{summary['experiment']}-live.html"
    path.write_text(page)
    return path


def write_markdown(summary: dict[str, Any], out: Path) -> Path:
    """``NAME-live.md``: the stage table and the verdicts, as docs/results quotes them."""
    lines = [f"| {' | '.join(HEAD)} |", "|" + "---|" * len(HEAD)]
    lines += [f"| {' | '.join(stage_row(s))} |" for s in summary["segments"]]
    lines += ["", "| paper's conclusion | measured | reproduced |", "|---|---|---|"]
    lines += [
        f"| {c['paper']} | {c['sim']} | {'yes' if c['ok'] else 'no'} |" for c in summary["claims"]
    ]
    if summary.get("disturbed"):
        lines += ["", f"DISTURBED: {summary['disturbed']}"]
    path = out / f"{summary['experiment']}-live.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def print_live(summary: dict[str, Any], out: Console) -> None:
    """A live run in the terminal: the stage table, what was refused, whether the run was
    disturbed, the paper's conclusions checked."""
    by = summary["segments"][0]["expected"]["by"] if summary["segments"] else "n/a"
    table = Table(title=f"{summary['title']} [decided by: {summary['mode']}; planned: {by}]")
    for col in HEAD:
        table.add_column(col, justify="left" if col == "stage" else "right")
    for s in summary["segments"]:
        table.add_row(*stage_row(s))
    out.print(table)
    for r in summary["refused"][:5]:
        out.print(f"[yellow]refused:[/yellow] {r}", highlight=False)
    if summary["disturbed"]:
        out.print(f"[bold red]DISTURBED: the machine was too busy to measure on: "
                  f"{summary['disturbed']}[/bold red]", highlight=False)  # fmt: skip
    for c in summary["claims"]:
        mark = "[green]✓[/green]" if c["ok"] else "[red]✗[/red]"
        out.print(f"{mark} {c['paper']}: {c['sim']}", highlight=False)
