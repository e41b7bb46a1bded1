"""``srtm calibrate``: measure the broker on this machine and write a model for the
simulator, or (``--cost``) fit the utility optimizer's cost model; progress, the tables
and, for ``--cost``, the JSON document."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.cli.experiment import console, out_console

if TYPE_CHECKING:
    from srtm.experiments.calibrate_cost import CostPlan

OnProgress = Callable[[str, float, float], None]


@contextmanager
def _bar(console: Console, label: str, total: float) -> Iterator[OnProgress]:
    """A progress bar for one calibration, moved by the ``(what, done, total)`` callback
    this yields (the caller reports "done" itself: a failed run leaves the bar where it
    stopped)."""
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(label, total=total)

        def on_progress(what: str, done: float, total: float) -> None:
            progress.update(task, description=what, completed=done, total=total)

        yield on_progress


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


def run_cost(plan: CostPlan, as_json: bool, console: Console, out: Console) -> int:
    """Measure, fit and print; the exit status (1 if measuring or fitting failed)."""
    from srtm.experiments.calibrate_cost import document, fit, fitted, measure

    with _bar(console, "calibrating the cost model", plan.steps()) as on_progress:
        try:
            steps = measure(plan, on_progress)
            result = fit(steps)
        except (RuntimeError, OSError, ValueError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
        on_progress("done", plan.steps(), plan.steps())
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


def calibrate(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Where to write the model (JSON).")
    ] = Path("srtm-model.json"),
    slo_ms: Annotated[
        float, typer.Option(help="p99 SLO (ms) the capacity is measured against.", min=0.01)
    ] = 1.0,
    step_s: Annotated[
        float,
        typer.Option(
            help="Seconds of paced load per measured rate (with --cost: the measured "
            "window of each rate and consumer count, after a 0.5 s warm-up).",
            min=0.5,
        ),
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
    cost: Annotated[
        bool,
        typer.Option(
            "--cost",
            help="Fit the cost model instead (docs/utility.md): CPU = idle + A·rate + "
            "B·rate·consumers, from the broker's CPU at every pair of --rates and "
            "--consumers (each consumer its own channel, so each receives every message); "
            "prints the samples and A and B, writes no file (about 40 s).",
        ),
    ] = False,
    rates: Annotated[
        str | None,
        typer.Option(
            help="With --cost: publish rates (msg/s), comma-separated, at least two "
            "(default 2000,5000,10000; with --quick 1000,3000)."
        ),
    ] = None,
    consumers: Annotated[
        str | None,
        typer.Option(
            help="With --cost: consumer counts, comma-separated, at least two "
            "(default 1,4,16; with --quick 1,4)."
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="With --cost: a short run (1.2 s steps, 1,000 and 3,000 msg/s × 1 and 4 "
            "consumers; about 12 s): a smoke test, not a calibration.",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="With --cost: print one JSON document on stdout (tables go to stderr): "
            '{"a_cpu_s_per_msg", "b_cpu_s_per_delivery", "idle_cpu", "r2", "rms_residual", '
            '"held_at_zero", "samples": [{"rate", "consumers", "cpu", "offered", '
            '"deliveries_per_message", "behind", "fitted"}], "cpus", "measured_at"}.',
        ),
    ] = False,
) -> None:
    """Measure the broker on this machine (service time, capacity at the SLO, overhead per
    connection) and write a model for the simulator (about 30 s). With --cost: fit the
    utility optimizer's cost model (CPU per message and per delivery) instead."""
    if cost:
        _calibrate_cost(rates, consumers, quick, as_json, step_s, broker_arg)
        return
    if quick or as_json or rates is not None or consumers is not None:
        console.print("[red]error:[/red] --quick, --json, --rates and --consumers need --cost")
        raise typer.Exit(2)
    from srtm.experiments.calibrate import CalibrationPlan
    from srtm.experiments.calibrate import calibrate as measure_broker
    from srtm.sim.model import save

    plan = CalibrationPlan(
        slo_p99_ms=slo_ms,
        step_s=step_s,
        saturation_s=saturation_s,
        trickle_rate=trickle_rate,
        broker_args=tuple(broker_arg or ()),
        # An emulated server takes messages faster than it delivers them: bounded, so
        # that one saturation step's backlog does not hold it through the next steps.
        max_undelivered=200 if any(a.startswith("--capacity") for a in broker_arg or ()) else 0,
    )
    with _bar(console, "calibrating", plan.steps()) as on_progress:
        try:
            model = measure_broker(plan, on_progress)
        except (RuntimeError, OSError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc
        on_progress("done", plan.steps(), plan.steps())
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
        ("revision / machine", f"{notes['revision']} / {notes['machine']['description']}"),
        ("machine during the calibration", "; ".join(
            [notes["validity"]["verdict"], *notes["validity"]["reasons"]])),
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


def _calibrate_cost(
    rates: str | None,
    consumers: str | None,
    quick: bool,
    as_json: bool,
    step_s: float,
    broker_arg: list[str] | None,
) -> None:
    from dataclasses import replace

    from srtm.experiments.calibrate_cost import QUICK, CostPlan

    plan = QUICK if quick else CostPlan(step_s=step_s)
    try:
        if rates is not None:
            plan = replace(plan, rates=parse_list(rates, "--rates", float))
        if consumers is not None:
            counts = parse_list(consumers, "--consumers", int)
            plan = replace(plan, consumers=tuple(int(n) for n in counts))
        if broker_arg:
            plan = replace(plan, broker_args=(*plan.broker_args, *broker_arg))
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    raise typer.Exit(run_cost(plan, as_json, console, out_console))
