"""``srtm experiment …`` and ``srtm demo``: live runs with progress bars, comparison tables,
plots and an HTML report; ``srtm calibrate``: a broker model measured on this machine."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.experiments import scenarios
from srtm.placement import POLICIES, Policy, parse_policy

if TYPE_CHECKING:
    from srtm.experiments.live import OnProgress
    from srtm.experiments.sizing import Sizing

# live and report (pandas, pyarrow) are imported where used: `srtm broker` starts through
# this same command line and should not pay for them.

app = typer.Typer(help="Run the paper's experiments: live on local brokers, or simulated.")
console = Console(stderr=True)
# Results go to stdout; piped (make demo | tee, CI logs) rich would wrap them at 80
# columns and cut the numbers, so a pipe gets room for the whole table.
out_console = Console(width=None if sys.stdout.isatty() else 140)

ScenarioArg = Annotated[
    str,
    typer.Argument(
        help="A shipped scenario (see `srtm experiment list`), a TOML file, or with --sim "
        "one of the paper's figures (fig4 … fig9, table1). `multi-tenant`: many topics "
        "arriving, one deleted, sensors joining, on capacity-limited brokers (live, or with "
        "--sim at the paper's scale, SRTM against LB). `trading-day`, `excess-capacity`, "
        "`latency-effects`: the utility-aware allocation paper's experiments (live at small "
        "scale, or with --sim at the paper's)."
    ),
]
OutOpt = Annotated[
    Path, typer.Option(help="Where traces, summaries, plots and the report are written.")
]
DurationOpt = Annotated[
    float | None,
    typer.Option(
        help="Seconds of the measured window per policy (default: the scenario's).", min=1
    ),
]
WarmupOpt = Annotated[
    float | None,
    typer.Option(
        help="Seconds of traffic before the measured window (fitting runs in it; default: "
        "the scenario's).",
        min=0,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result as one JSON document at the end.")
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Exit with code 3 when a run was disturbed (the machine too busy to measure "
        "on); without it a disturbed run is reported as such and the exit code is 0.",
    ),
]
ScaleOpt = Annotated[
    str,
    typer.Option(
        help="Live runs: 'auto' measures this machine for about a second and slows the "
        "scenario in time by its speed relative to the development machine (rates times "
        "the scale, the SLO and other queueing durations divided by it; never above 1), "
        "so that a slower machine runs the same experiment with the same headroom. A "
        "number in (0, 1] gives the scale instead (1: the scenario as written). The "
        "shipped scenarios and multi-tenant are sized; diurnal, trading-day, "
        "excess-capacity and latency-effects are not CPU-bound and run as written "
        "('auto' or 1). Not with --sim."
    ),
]
#: The exit code of --strict when a run was disturbed.
EXIT_DISTURBED = 3


class Analysis(StrEnum):
    """Who computes a run's latency figures from its traces."""

    auto = "auto"
    spark = "spark"
    local = "local"


AnalysisOpt = Annotated[
    Analysis,
    typer.Option(
        help="Who computes the latency figures from the traces: 'spark' (the Spark "
        "pipeline's latency job, over the measured window), 'local' (pandas, in this "
        "process), or 'auto' (Spark, and local if Spark cannot start, e.g. without Java)."
    ),
]
SparkMasterOpt = Annotated[
    str | None,
    typer.Option(
        "--spark-master", help="Spark master for --analysis spark/auto (default local[*])."
    ),
]


@contextmanager
def _progress(label: str) -> Iterator[OnProgress]:
    """A rich progress bar per run, following the phases ``live.run`` reports."""
    with Progress(
        TextColumn("[bold]{task.fields[label]}[/bold] {task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("starting", total=1.0, label=label)

        def update(phase: str, done: float, total: float) -> None:
            share = done / total if total > 0 else 1.0
            bar.update(task, description=phase, completed=min(1.0, max(0.0, share)))

        yield update
        bar.update(task, description="done", completed=1.0)


def _load(name: str) -> scenarios.Scenario:
    try:
        return scenarios.load(name)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


def _auto(scale: str) -> bool:
    return scale.strip().lower() == "auto"


def sizing_of(scale: str) -> Sizing:
    """The sizing ``--scale`` asks for: this machine measured for 'auto', else the scale
    given. Each live family slows its own scenario by it."""
    from srtm.experiments import sizing

    if _auto(scale):
        with console.status("measuring this machine's speed (about a second)"):
            return sizing.choose(None)
    try:
        return sizing.choose(float(scale))
    except ValueError as exc:
        raise typer.BadParameter(
            f"'auto' or a number in (0, 1], got {scale!r}", param_hint="--scale"
        ) from exc


def sized(sc: scenarios.Scenario, scale: str) -> tuple[scenarios.Scenario, Sizing]:
    """``sc`` at the scale ``--scale`` asks for (measuring this machine for 'auto')."""
    from srtm.experiments import sizing

    how = sizing_of(scale)
    out = sizing.scaled(sc, how.scale)
    console.print(how.describe(out), highlight=False)
    return out, how


def unsized(scale: str, name: str, why: str) -> None:
    """An experiment not sized to the machine (``why``): it runs as written, which
    ``--scale`` may say ('auto', 1) but not change."""
    try:
        as_written = _auto(scale) or float(scale) == 1.0
    except ValueError:
        as_written = False
    if not as_written:
        raise typer.BadParameter(
            f"{name} is not sized to the machine ({why}); 'auto' or 1, got {scale!r}",
            param_hint="--scale",
        )
    console.print(f"{name} runs as written, not sized to this machine: {why}.", highlight=False)


@contextmanager
def _ctrl_c_wins() -> Iterator[None]:
    """Ctrl-C reaches the run's servers too (one process group): one that dies of it
    first can make the run raise its own error (a broker gone, a subscriber that exited)
    before the interrupt does. Once Ctrl-C was pressed, any error is the interrupt
    (typer exits 130), never a traceback about a server that was told to stop."""
    pressed: list[int] = []

    def on_int(signum: int, frame: Any) -> None:
        pressed.append(signum)
        signal.default_int_handler(signum, frame)

    before = signal.signal(signal.SIGINT, on_int)
    try:
        yield
    except Exception:
        if pressed:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, before)


def run_policies(
    sc: scenarios.Scenario,
    policies: Sequence[Policy],
    out: Path,
    duration: float | None,
    warmup: float | None,
    how: Sizing | None = None,
) -> list[dict[str, Any]]:
    from srtm.experiments import live

    summaries = []
    for policy in policies:
        with _progress(f"{sc.name} / {policy}") as update, _ctrl_c_wins():
            summaries.append(
                live.run(
                    sc, policy, out, duration_s=duration, warmup_s=warmup, on_progress=update,
                    sizing=how,
                )
            )  # fmt: skip
    return summaries


def print_table(summaries: Sequence[dict[str, Any]], title: str) -> None:
    from srtm.experiments import report

    table = Table(title=title)
    for heading, _, _ in report.COLUMNS:
        table.add_column(heading, justify="left" if heading == "policy" else "right")
    for row in report.rows(summaries):
        table.add_row(*row)
    out_console.print(table)
    out_console.print(report.LEGEND, style="dim")
    out_console.print(f"latency figures computed by: {report.engine(summaries)}", style="dim")
    for s in summaries:
        acc = s["accounting"]
        same = "=" if acc["published"] == acc["delivered"] and acc["lost"] == 0 else "≠"
        out_console.print(
            f"{s['policy']}: published {acc['published']:,} {same} delivered "
            f"{acc['delivered']:,} ({report.loss_text(s)}, duplicates {acc['duplicates']}"
            f"{report.unsent_text(s)}); "
            f"{s['emulator']['skipped_late']:,} events skipped as over "
            f"{s['emulator']['max_late_ms']:g} ms late; measured window: "
            f"{report.checks_line(s)}",
            highlight=False,
        )
    for line in report.findings_lines(summaries):
        out_console.print(line, style="yellow", highlight=False, markup=False)
    _print_verdict(summaries)


def _print_verdict(summaries: Sequence[dict[str, Any]]) -> None:
    """The conclusion, or, when a run was disturbed, that and why instead."""
    from srtm.experiments import report

    note = report.disturbed_note(summaries)
    if note is not None:
        first, *rest = note.splitlines()
        out_console.print(f"[bold red]{first}[/bold red]", highlight=False)
        for line in rest:
            out_console.print(line, highlight=False, markup=False)
        return
    text = report.conclusion(summaries)
    if text and len(summaries) > 1:
        out_console.print(f"[bold]{text}[/bold]", highlight=False)


def _strict_exit(summaries: Sequence[dict[str, Any]], strict: bool) -> None:
    from srtm.experiments import report

    if strict and report.disturbances(summaries):
        raise typer.Exit(EXIT_DISTURBED)


def analyse(
    summaries: list[dict[str, Any]], out: Path, engine: Analysis, master: str | None
) -> None:
    """Recompute the summaries' latency figures with the Spark pipeline unless ``engine``
    is local; with auto, fall back to the in-process figures if Spark fails."""
    from srtm.experiments import live, spark_analysis

    if engine is Analysis.local or not summaries:
        return
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as bar:
        bar.add_task("analysing the traces with the Spark pipeline", total=None)
        try:
            done = spark_analysis.analyse(summaries, out / "traces", master)
        except Exception as exc:  # no Java, no free port, a failed job: all mean "not here"
            if engine is Analysis.spark:
                console.print(f"[red]error:[/red] the Spark analysis failed: {exc}")
                raise typer.Exit(1) from exc
            console.print(
                f"[yellow]Spark is not available here ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); the figures are "
                "in-process.[/yellow]"
            )
            return
    for s in summaries:
        live.save_summary(out, s)
    console.print(f"latency figures by the Spark pipeline ({done['master']}), {done['seconds']} s")


def _policies(text: str) -> list[Policy]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if names:
            return [parse_policy(p) for p in names]
    except ValueError:
        pass
    raise typer.BadParameter(
        f"policies are {', '.join(POLICIES)}; got {text!r}", param_hint="--policy"
    )


@app.command("list")
def list_scenarios() -> None:
    """The shipped live scenarios."""
    table = Table(title="live scenarios")
    for col in ("name", "brokers", "capacity msg/s", "load msg/s", "SLO p99 ms", "description"):
        table.add_column(col)
    for name in scenarios.available():
        sc = scenarios.load(name)
        table.add_row(
            name, str(sc.brokers), f"{sc.capacity:,.0f}", f"{sc.rate:,.0f}",
            f"{sc.slo_p99_ms:g}", sc.description,
        )  # fmt: skip
    from srtm.experiments import tenancy, tenancy_cli

    mt = tenancy.live_scale()
    table.add_row(
        tenancy_cli.NAME, str(mt.brokers), f"{mt.capacity:,.0f}",
        f"{sum(t.load for t in mt.tenants):,.0f}",
        "/".join(f"{s:g}" for s in sorted({t.slo_p99_ms for t in mt.tenants})),
        tenancy_cli.DESCRIPTION,
    )  # fmt: skip
    out_console.print(table)


@app.command("run")
def run_cmd(
    scenario: ScenarioArg,
    policy: Annotated[
        str, typer.Option(help="Placement policy: lb, conc, maxmin or srtm.")
    ] = "srtm",
    duration: DurationOpt = None,
    warmup: WarmupOpt = None,
    out: OutOpt = Path("out/experiments"),
    sim: Annotated[
        bool,
        typer.Option(help="Simulate one of the paper's figures at full scale instead."),
    ] = False,
    as_json: JsonOpt = False,
    analysis: AnalysisOpt = Analysis.auto,
    spark_master: SparkMasterOpt = None,
    strict: StrictOpt = False,
    quick: Annotated[
        bool,
        typer.Option(
            help="trading-day, excess-capacity, latency-effects live: short stages "
            "(7 s each) for tests."
        ),
    ] = False,
    decide: Annotated[
        str,
        typer.Option(
            help="trading-day, excess-capacity, latency-effects live: who chooses "
            "rates and admitted counts, 'controller' (its utility optimizer) or "
            "'driver' (driver-optimized: this process runs the optimizer and "
            "sets the brokers)."
        ),
    ] = "controller",
    only: Annotated[
        str | None,
        typer.Option(
            help="diurnal live: run only the loop 'on' or 'off' half (default both: on, "
            "then off; the loop-off verdict needs both)."
        ),
    ] = None,
    scale: ScaleOpt = "auto",
) -> None:
    """Run SCENARIO once: start a local cluster, create and place (fit) the topic, emulate
    the workload, collect traces, stop everything, and print the summary."""
    if sim and not _auto(scale):
        # Nothing simulated depends on this machine's speed: a scale there would be
        # ignored, and a command that ignores what it is told misleads.
        raise typer.BadParameter(
            f"sizes live runs to this machine; --sim simulates at the paper's scale "
            f"(leave --scale out), got {scale!r}",
            param_hint="--scale",
        )
    if scenario == "multi-tenant":
        _run_tenancy(out, sim, _policies(policy), as_json, strict, scale)
        return
    if scenario == "diurnal":
        _run_diurnal(out, sim, as_json, duration, only, scale)
        return
    from srtm.experiments import utility_sim

    if scenario in utility_sim.EXPERIMENTS:
        _run_utility(scenario, out, sim, as_json, quick, decide, strict, scale)
        return
    if sim:
        _run_sim(scenario, out, as_json)
        return
    sc, how = sized(_load(scenario), scale)
    summaries = run_policies(sc, _policies(policy), out, duration, warmup, how)
    analyse(summaries, out, analysis, spark_master)
    print_table(summaries, f"{sc.name}: SLO p99 ≤ {sc.slo_p99_ms:g} ms")
    console.print(f"summaries and traces under {out}")
    if as_json:
        from srtm.experiments import report

        print(json.dumps(report.compact(summaries)))
    _strict_exit(summaries, strict)


@app.command("compare")
def compare_cmd(
    scenario: ScenarioArg,
    policies: Annotated[
        str, typer.Option("--policies", help="Comma-separated policies to run, in order.")
    ] = "lb,conc,maxmin,srtm",
    duration: DurationOpt = None,
    warmup: WarmupOpt = None,
    out: OutOpt = Path("out/experiments"),
    as_json: JsonOpt = False,
    analysis: AnalysisOpt = Analysis.auto,
    spark_master: SparkMasterOpt = None,
    strict: StrictOpt = False,
    scale: ScaleOpt = "auto",
) -> None:
    """Run SCENARIO under several policies and print them side by side, with plots and an
    HTML report in OUT."""
    sc, how = sized(_load(scenario), scale)
    summaries = run_policies(sc, _policies(policies), out, duration, warmup, how)
    analyse(summaries, out, analysis, spark_master)
    _finish(sc, summaries, out, as_json)
    _strict_exit(summaries, strict)


def _finish(
    sc: scenarios.Scenario, summaries: list[dict[str, Any]], out: Path, as_json: bool
) -> None:
    from srtm.experiments import report

    print_table(summaries, f"{sc.name}: SLO p99 ≤ {sc.slo_p99_ms:g} ms")
    images = report.plots(summaries, out / "traces", out)
    page = report.write_html(summaries, images, out, sc)
    console.print(f"report: {page}")
    if as_json:
        print(json.dumps(report.compact(summaries)))


def _run_tenancy(
    out: Path, sim: bool, policies: Sequence[Policy], as_json: bool, strict: bool,
    scale: str = "auto",
) -> None:  # fmt: skip
    """``multi-tenant``: simulated (SRTM against LB), or live under each policy, sized to
    this machine (``--scale``); exit 1 when a live run fails a check."""
    from srtm.experiments import tenancy, tenancy_cli

    if sim:
        tenancy_cli.run_sim(out, as_json, console, out_console)
        return
    how = sizing_of(scale)
    sc = tenancy.scaled(tenancy.live_scale(), how.scale)
    console.print(tenancy_cli.sized_line(how, sc), highlight=False)
    failed = False
    for policy in policies:
        summary = tenancy_cli.run_live(
            out, policy, as_json, console, out_console, sc=sc, sizing=how
        )
        failed |= not all(c["ok"] for c in summary["checks"])
    if failed and strict:
        raise typer.Exit(1)


def _run_utility(
    name: str, out: Path, sim: bool, as_json: bool, quick: bool, decide: str, strict: bool,
    scale: str = "auto",
) -> None:  # fmt: skip
    """The utility-aware allocation paper's experiments: simulated, or live at small scale
    (exit 1 with --strict when a verdict fails, 3 when the run was disturbed)."""
    from srtm.experiments import utility_sim

    if sim:
        _print_figure(utility_sim.EXPERIMENTS[name](out), as_json)
        return
    from srtm.experiments import utility_live, utility_report, utility_scale

    if decide not in utility_live.MODES:
        raise typer.BadParameter(f"'controller' or 'driver', got {decide!r}", param_hint="--decide")
    unsized(scale, name, utility_live.NOT_SIZED)
    exp = utility_scale.EXPERIMENTS[name]()
    mode: utility_live.Mode = "driver" if decide == "driver" else "controller"
    with _progress(f"{name} live ({decide})") as update:
        summary = utility_live.run(exp, out, mode, quick=quick, on_progress=update)
    by = summary["segments"][0]["expected"]["by"] if summary["segments"] else "n/a"
    table = Table(title=f"{summary['title']} [decided by: {summary['mode']}; planned: {by}]")
    for col in utility_report.HEAD:
        table.add_column(col, justify="left" if col == "stage" else "right")
    for s in summary["segments"]:
        table.add_row(*utility_report.stage_row(s))
    out_console.print(table)
    for r in summary["refused"][:5]:
        out_console.print(f"[yellow]refused:[/yellow] {r}", highlight=False)
    if summary["disturbed"]:
        out_console.print(f"[bold red]DISTURBED: the machine was too busy to measure on: "
                          f"{summary['disturbed']}[/bold red]", highlight=False)  # fmt: skip
    for c in summary["claims"]:
        mark = "[green]✓[/green]" if c["ok"] else "[red]✗[/red]"
        out_console.print(f"{mark} {c['paper']}: {c['sim']}", highlight=False)
    png = utility_report.plot(summary, out)
    page = utility_report.write_html(summary, png, out)
    utility_report.write_markdown(summary, out)
    console.print(f"report: {page}")
    if as_json:
        print(json.dumps(summary))
    if strict and summary["disturbed"]:
        raise typer.Exit(EXIT_DISTURBED)
    if strict and not all(c["ok"] for c in summary["claims"]):
        raise typer.Exit(1)


def _run_diurnal(
    out: Path, sim: bool, as_json: bool, duration: float | None, only: str | None = None,
    scale: str = "auto",
) -> None:  # fmt: skip
    """``diurnal``: the rebalancer's loop on and off over a compressed day, simulated
    (``--sim``) or live on local brokers (``--duration``: the day's length in s; ``--only
    on|off``: one of the two live runs; not sized to the machine, ``--scale``)."""
    from srtm.experiments import diurnal_cli
    from srtm.experiments.diurnal_live import NOT_SIZED, RUNS

    if only is not None and only not in RUNS:
        console.print(f"[red]error:[/red] --only must be one of {', '.join(RUNS)}, got {only!r}")
        raise typer.Exit(2)

    if sim:
        diurnal_cli.run_sim(out, as_json, console, out_console)
        return
    unsized(scale, "diurnal", NOT_SIZED)
    from dataclasses import replace

    from srtm.experiments.diurnal_live import LiveDiurnal

    s = LiveDiurnal() if duration is None else replace(LiveDiurnal(), day_s=duration)
    loops = RUNS if only is None else (only,)
    diurnal_cli.run_live(out, as_json, console, out_console, s, loops)


def _run_sim(name: str, out: Path, as_json: bool) -> None:
    try:
        from srtm.experiments import figures
    except ImportError as exc:
        console.print(f"[red]error:[/red] the simulator is not available: {exc}")
        raise typer.Exit(2) from exc
    try:
        result = figures.run_figure(name, out)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    _print_figure(result, as_json)


def _print_figure(result: Any, as_json: bool) -> None:
    """A ``figures.FigureResult`` as a table, the files it wrote, and optionally JSON."""
    table = Table(title=f"{result.title} (simulated in {result.elapsed_s:.1f} s)")
    for col in result.columns:
        table.add_column(str(col))
    for row in result.rows:
        table.add_row(*(f"{x:.4g}" if isinstance(x, float) else str(x) for x in row))
    out_console.print(table)
    for claim in result.data.get("claims", []):
        mark = "[green]✓[/green]" if claim["ok"] else "[red]✗[/red]"
        console.print(f"{mark} {claim['paper']}: {claim['sim']}")
    for f in result.files:
        console.print(f"wrote {f}")
    if as_json:
        print(json.dumps(result.data))


@app.command("validate")
def validate_cmd(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Output directories of live runs (`srtm experiment run/compare --out`, "
            "`srtm demo --out`): each holds <scenario>-<policy>.json and traces/."
        ),
    ],
    model: Annotated[
        str,
        typer.Option(
            help="Broker model for the simulator: 'paper' or a file from `srtm calibrate`."
        ),
    ],
    scenario: Annotated[
        str, typer.Option(help="The scenario the runs ran (its workload is simulated).")
    ] = "correlated-sensors",
    out: OutOpt = Path("out/validation"),
    as_json: JsonOpt = False,
) -> None:
    """Predict each live run's p99 with the simulator (replaying the arrivals the brokers
    recorded, the nominal schedule on the run's placement, and the simulator's own
    placement) and compare it with the measured p99 (target: within ±30 %)."""
    from srtm.experiments import figures

    missing = [str(r) for r in runs if not r.is_dir()]
    if missing:
        raise typer.BadParameter(f"not a directory: {', '.join(missing)}", param_hint="RUNS")
    try:
        result = figures.validate_live(out, runs, model, scenario)
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if not result.data["runs"]:
        console.print(f"[red]error:[/red] no finished run of {scenario!r} with sub-buckets in "
                      f"{', '.join(map(str, runs))}")  # fmt: skip
        raise typer.Exit(2)
    _print_figure(result, as_json)


def demo(
    duration: Annotated[
        float,
        typer.Option(help="Seconds measured per policy (after a short warm-up).", min=1),
    ] = 30.0,
    warmup: Annotated[
        float, typer.Option(help="Seconds of traffic before measuring (fitting runs in it).", min=0)
    ] = 5.0,
    out: Annotated[
        Path, typer.Option(help="Where traces, plots and report.html are written.")
    ] = Path("out/demo"),
    as_json: JsonOpt = False,
    analysis: AnalysisOpt = Analysis.auto,
    spark_master: SparkMasterOpt = None,
    strict: StrictOpt = False,
    scale: ScaleOpt = "auto",
) -> None:
    """The main job: correlated sensors on a local cluster, once placed by load balancing
    (LB) and once by SRTM; the traces analysed by the Spark pipeline; a comparison table,
    and OUT/report.html with plots."""
    sc = _load("correlated-sensors")
    started = time.monotonic()
    console.print(f"[bold]{sc.name}[/bold]: {sc.description}")
    sc, how = sized(sc, scale)
    console.print(
        f"SLO p99 ≤ {sc.slo_p99_ms:g} ms; {sc.brokers} brokers on 127.0.0.1; "
        f"{duration:g} s measured per policy."
    )
    summaries = run_policies(sc, ["lb", "srtm"], out, duration, warmup, how)
    analyse(summaries, out, analysis, spark_master)
    _finish(sc, summaries, out, as_json)
    console.print(f"finished in {time.monotonic() - started:.0f} s")
    _strict_exit(summaries, strict)


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
    from srtm.experiments.calibrate import calibrate as run
    from srtm.sim.model import save

    plan = CalibrationPlan(
        slo_p99_ms=slo_ms,
        step_s=step_s,
        saturation_s=saturation_s,
        trickle_rate=trickle_rate,
        broker_args=tuple(broker_arg or ()),
    )
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


def _calibrate_cost(
    rates: str | None,
    consumers: str | None,
    quick: bool,
    as_json: bool,
    step_s: float,
    broker_arg: list[str] | None,
) -> None:
    from dataclasses import replace

    from srtm.experiments import calibrate_cost_cli
    from srtm.experiments.calibrate_cost import QUICK, CostPlan

    plan = QUICK if quick else CostPlan(step_s=step_s)
    try:
        if rates is not None:
            plan = replace(plan, rates=calibrate_cost_cli.parse_list(rates, "--rates", float))
        if consumers is not None:
            counts = calibrate_cost_cli.parse_list(consumers, "--consumers", int)
            plan = replace(plan, consumers=tuple(int(n) for n in counts))
        if broker_arg:
            plan = replace(plan, broker_args=(*plan.broker_args, *broker_arg))
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    raise typer.Exit(calibrate_cost_cli.run(plan, as_json, console, out_console))
