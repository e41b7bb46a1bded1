"""``srtm calibrate --cost``: progress, the table of samples and the fit, the JSON
document."""

from __future__ import annotations

import json

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.experiments.calibrate_cost import CostPlan, document, fit, fitted, measure


def parse_list(text: str, what: str, kind: type[float] | type[int]) -> tuple[float, ...]:
    """``"2000,5000,10000"`` → numbers; ValueError naming ``what``."""
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(
            f"{what} must be a comma-separated list of numbers, got {text!r}"
        ) from None
    if len(set(values)) < 2:
        raise ValueError(f"{what} needs at least two different values, got {text!r}")
    return values


def run(plan: CostPlan, as_json: bool, console: Console, out: Console) -> int:
    """Measure, fit and print; the exit status (1 if measuring or fitting failed)."""
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("calibrating the cost model", total=plan.steps())

        def on_progress(what: str, done: float, total: float) -> None:
            progress.update(task, description=what, completed=done, total=total)

        try:
            steps = measure(plan, on_progress)
            result = fit(steps)
        except (RuntimeError, OSError, ValueError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
        progress.update(task, description="done", completed=plan.steps())
    out = console if as_json else out  # stdout holds the one JSON document
    used = {id(s) for s in fitted(steps)}
    m = result.model
    table = Table(title="broker CPU per step (cores: CPU-seconds per second)")
    for col in ("asked msg/s", "consumers", "msg/s", "deliv/msg", "CPU", "fit", "resid", ""):
        table.add_column(col, justify="right")
    for s in steps:
        predicted = m.predict([(s.rate, s.fan_out)])
        note = "behind" if s.behind else ""
        note += "" if id(s) in used else " (not fitted)"
        table.add_row(
            f"{s.offered:,.0f}", str(s.consumers), f"{s.rate:,.0f}", f"{s.fan_out:.2f}",
            f"{s.cpu:.3f}", f"{predicted:.3f}", f"{s.cpu - predicted:+.3f}", note.strip(),
        )  # fmt: skip
    out.print(table)
    summary = Table(title="cost model: cpu = idle + A·rate + B·rate·consumers")
    summary.add_column("parameter")
    summary.add_column("value", justify="right")
    rows = [
        ("A: CPU per message published", f"{m.a_cpu_s * 1e6:.2f} µs"),
        ("B: CPU per delivery (per message per consumer)", f"{m.b_cpu_s * 1e6:.2f} µs"),
        ("CPU at no load (the fit's constant)", f"{m.idle_cpu:.3f} cores"),
        ("R²", f"{result.r2:.3f}"),
        ("RMS residual", f"{result.rms_residual:.3f} cores"),
        ("steps fitted", f"{result.samples} of {len(steps)}"),
    ]
    if result.held_at_zero:
        rows.append(("held at 0 (the samples do not span the load)",
                     ", ".join(result.held_at_zero)))  # fmt: skip
    for k, v in rows:
        summary.add_row(k, v)
    out.print(summary)
    if any(s.behind for s in steps):
        out.print(
            "[yellow]behind[/yellow]: deliveries or the published rate fell below "
            "95 % of what was asked (the broker or the load generator could not keep up)."
        )
    if as_json:
        print(json.dumps(document(result, steps)))
    return 0
