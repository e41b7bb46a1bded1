"""``srtm calibrate``: the command line of ``srtm.experiments.calibrate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def calibrate(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Where to write the model (JSON).")
    ] = Path("srtm-model.json"),
    slo_ms: Annotated[
        float, typer.Option(help="p99 SLO (ms) the capacity is measured against.", min=0.01)
    ] = 1.0,
    step_s: Annotated[
        float, typer.Option(help="Seconds of paced load per measured rate.", min=0.5)
    ] = 2.5,
    saturation_s: Annotated[
        float, typer.Option(help="Seconds of each saturation run.", min=0.5)
    ] = 2.0,
    trickle_rate: Annotated[
        float,
        typer.Option(help="Msg/s of the light load that gives the base latency.", min=10),
    ] = 500.0,
    broker_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--broker-arg",
            help="Extra flag for the measured broker, repeatable (e.g. --broker-arg=--capacity"
            " --broker-arg=5000).",
        ),
    ] = None,
) -> None:
    """Measure the broker on this machine (service time, capacity at the SLO, overhead per
    connection) and write a model for the simulator (about 30 s)."""
    from srtm.experiments.calibrate import Plan
    from srtm.experiments.calibrate import calibrate as run
    from srtm.sim.model import save

    plan = Plan(
        slo_p99_ms=slo_ms,
        step_s=step_s,
        saturation_s=saturation_s,
        trickle_rate=trickle_rate,
        broker_args=tuple(broker_arg or ()),
    )
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("calibrating", total=plan.steps())

        def on_progress(what: str, done: float, total: float) -> None:
            progress.update(task, description=what, completed=done, total=total)

        try:
            model = run(plan, on_progress)
        except (RuntimeError, OSError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc
        progress.update(task, description="done", completed=plan.steps())
    save(model, out)
    table = Table(title=f"broker model written to {out}")
    table.add_column("parameter")
    table.add_column("value", justify="right")
    notes = model.notes
    rows = [
        ("cost per message (reads of many)", f"{model.per_message_s * 1e6:.2f} µs"),
        ("cost per read event (a message on its own)", f"{model.per_event_s * 1e6:.2f} µs"),
        ("service-time CV (fitted)", f"{model.service_cv:g}"),
        ("overhead per extra busy connection", f"{notes['per_extra_connection_s'] * 1e6:.2f} µs"),
        ("base latency p50 / p99", f"{model.base.quantile(0.5) * 1e3:.3f} / "
                                   f"{model.base.quantile(0.99) * 1e3:.3f} ms"),
        ("capacity at the SLO, measured", f"{notes['measured_capacity_at_slo']:,.0f} msg/s"),
        ("capacity at the SLO, model", f"{model.capacity_at_slo or 0:,.0f} msg/s"),
        ("mcap written", f"{model.mcap:,.0f} msg/s"),
        ("fit error (mean |log|)", f"{notes['fit_mean_abs_log_error']:.2f}"),
    ]  # fmt: skip
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)
    steps = Table(title="paced Poisson load: measured vs model")
    for col in ("msg/s", "p50 ms", "model p50", "p99 ms", "model p99"):
        steps.add_column(col, justify="right")
    for s in notes["steps"]:
        steps.add_row(
            f"{s['rate']:,.0f}",
            f"{s['p50_ms']:.3f}",
            f"{s['model_p50_ms']:.3f}",
            f"{s['p99_ms']:.3f}",
            f"{s['model_p99_ms']:.3f}",
        )
    Console().print(steps)
