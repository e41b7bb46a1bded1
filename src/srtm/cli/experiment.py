"""``srtm experiment …``: run an experiment by name (simulated, or live on local
brokers), compare policies on a live scenario, list the live scenarios, check the
simulator against live runs. Each command parses its flags and calls
``srtm.experiments``, whose experiments print their own reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from srtm.experiments.experiment import (
    Analysis,
    Mode,
    Option,
    RunSettings,
    RunVerdict,
    Summary,
    Terminal,
    UsageError,
    start,
)
from srtm.placement import POLICIES, Policy, parse_policy

if TYPE_CHECKING:
    from srtm.experiments.scenarios.scenario import PublisherOrder

# The experiments' packages (pandas, pyarrow, the simulator) are imported where used:
# `srtm broker` starts through this same command line and should not pay for them.

app = typer.Typer(help="Run the paper's experiments: live on local brokers, or simulated.")
console = Console(stderr=True)
# Results go to stdout; piped (make demo | tee, CI logs) rich would wrap them at 80
# columns and cut the numbers, so a pipe gets room for the whole table.
out_console = Console(width=None if sys.stdout.isatty() else 140)
TERMINAL = Terminal(console, out_console)

ScenarioArg = Annotated[
    str,
    typer.Argument(
        help="A shipped scenario (see `srtm experiment list`; with --sim, in the simulator "
        "on the paper's broker model), a TOML file, or with --sim one of the paper's "
        "figures (fig4 … fig9, table1; table1 also live: online fitting on local brokers, "
        "measured-only and model-assisted). `multi-tenant`: many topics "
        "arriving, one deleted, sensors joining, on capacity-limited brokers (live, or with "
        "--sim at the paper's scale, SRTM against LB). `trading-day`, `excess-capacity`, "
        "`latency-effects`: the utility-aware allocation paper's experiments (live at small "
        "scale, or with --sim at the paper's). `control-plane-faults`: 3 etcd members, 3 "
        "controllers and 4 brokers under load through the control plane's faults (live). "
        "`dynamoth-replication`, `dynamoth-clients`, `dynamoth-move`: Dynamoth's evaluation "
        "(live)."
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
AnalysisOpt = Annotated[
    Analysis,
    typer.Option(
        help="Who computes the latency figures from the traces: 'spark' (the Spark "
        "pipeline's latency job, over the measured window), 'local' (pandas, in this "
        "process), or 'auto' (Spark, and local if Spark cannot start, e.g. without Java)."
    ),
]
PublisherOrderOpt = Annotated[
    str | None,
    typer.Option(
        "--publisher-order",
        help="Live scenarios: the order the publishers are handed to the controller and "
        "its placement policy. 'block' (default): each correlation group's members one "
        "after another, as the scenario lists them, so the blind policies (LB, Conc, "
        "MaxMin), which fill each broker with consecutive publishers, keep every group "
        "whole on one broker, their worst case. 'shuffled': a permutation seeded by the "
        "scenario's seed, so a blind policy gives each broker a slice of most groups, as "
        "it would for publishers connecting in any order. The groups and the workload are "
        "the same. Default: the scenario's own (`publisher_order` in its file; block).",
    ),
]
SparkMasterOpt = Annotated[
    str | None,
    typer.Option(
        "--spark-master", help="Spark master for --analysis spark/auto (default local[*])."
    ),
]


def finish(summary: Summary, as_json: bool, strict: bool) -> None:
    """Print the run's JSON documents (``--json``); with ``--strict`` exit with its
    verdict."""
    if as_json:
        for document in summary.documents:
            print(document)
    if strict and summary.verdict is not RunVerdict.ok:
        raise typer.Exit(summary.verdict.value)


def given_on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter ``name`` was given (on the command line or by a variable),
    not left to its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def usage(exc: UsageError) -> typer.BadParameter:
    return typer.BadParameter(str(exc), param_hint=exc.option)


def order_of(text: str | None) -> PublisherOrder | None:
    """``--publisher-order``'s value (None when not given), or exit 2 naming the option
    and the choices."""
    from srtm.experiments.scenarios.scenario import parse_publisher_order

    if text is None:
        return None
    try:
        return parse_publisher_order(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--publisher-order") from exc


def policies_of(text: str) -> tuple[Policy, ...]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if names:
            return tuple(parse_policy(p) for p in names)
    except ValueError:
        pass
    raise typer.BadParameter(
        f"policies are {', '.join(POLICIES)}; got {text!r}", param_hint="--policy"
    )


@app.command("list")
def list_scenarios() -> None:
    """The shipped live scenarios, and the options each experiment takes."""
    from srtm.experiments import registry

    table = Table(title="live scenarios")
    for col in registry.LIVE_COLUMNS:
        table.add_column(col)
    for row in registry.live_rows():
        table.add_row(*row)
    out_console.print(table)
    takes = Table(title="what `srtm experiment run NAME` takes (others are refused)")
    for col in registry.OPTION_COLUMNS:
        takes.add_column(col)
    for row in registry.option_rows():
        takes.add_row(*row)
    out_console.print(takes)


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    scenario: ScenarioArg,
    policy: Annotated[
        str,
        typer.Option(
            help="Placement policy: lb, conc, maxmin or srtm (a live scenario takes several, "
            "comma-separated, live or with --sim)."
        ),
    ] = "srtm",
    duration: DurationOpt = None,
    warmup: WarmupOpt = None,
    out: OutOpt = Path("out/experiments"),
    sim: Annotated[
        bool,
        typer.Option(
            "--sim/--live",
            help="Simulate at the paper's scale instead: the figures, multi-tenant, diurnal "
            "and the utility experiments; a live scenario as written, on the paper's "
            "broker model (--live, the default: on local brokers).",
        ),
    ] = False,
    as_json: JsonOpt = False,
    analysis: AnalysisOpt = Analysis.auto,
    spark_master: SparkMasterOpt = None,
    strict: StrictOpt = False,
    quick: Annotated[
        bool,
        typer.Option(
            help="trading-day, excess-capacity, latency-effects live: short stages "
            "(7 s each) for tests; control-plane-faults: short warm-up and settling, an "
            "8-s outage (unless --outage-s); table1 live: groups of 5 and 20 only, a "
            "shorter calibration; a live scenario: a 4-s measured window after a 2-s "
            "warm-up (unless --duration, --warmup); dynamoth-*: fewer, shorter steps."
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
    outage_s: Annotated[
        float | None,
        typer.Option(
            "--outage-s",
            help="control-plane-faults: how long every controller is down (default 60 s).",
            min=1,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="The broker model. The paper's figures and table1 with --sim: "
            "'calibrated' (default: `srtm calibrate` on the development machine, at the "
            "paper's speed), 'paper' (service times chosen to make the paper's thresholds "
            "hold) or the path of a `srtm calibrate` file (put at the paper's speed). "
            "table1 live: a file from an earlier `srtm calibrate` on brokers run as the "
            "experiment's, for model-assisted fitting (default: calibrate as part of the run).",
        ),
    ] = None,
    publisher_order: PublisherOrderOpt = None,
) -> None:
    """Run SCENARIO once: start a local cluster, create and place (fit) the topic, emulate
    the workload, collect traces, stop everything, and print the summary; with --sim,
    simulate it instead. Each experiment takes only the options that apply to it (`srtm
    experiment list` shows which); one it does not take is refused (exit 2)."""
    from srtm.experiments import registry

    given = [o for o in Option if given_on_command_line(ctx, o.name)]
    mode = Mode.sim if sim else Mode.live
    run = RunSettings(
        out, TERMINAL, as_json, policies_of(policy), duration, warmup, analysis, spark_master,
        scale, quick, decide, only, outage_s, model, order_of(publisher_order),
    )  # fmt: skip
    try:
        summary = start(registry.find(scenario), mode, given, run)
    except UsageError as exc:
        raise usage(exc) from exc
    finish(summary, as_json, strict)


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
    publisher_order: PublisherOrderOpt = None,
    quick: Annotated[
        bool,
        typer.Option(
            help="A 4-s measured window after a 2-s warm-up (fitting still runs to its "
            "end), unless --duration or --warmup says otherwise: for tests, not results."
        ),
    ] = False,
    slo_ms: Annotated[
        float | None,
        typer.Option(
            "--slo-ms",
            help="Judge the topic against this p99 SLO (ms) instead of the scenario's, on "
            "the same brokers and workload (placement, fitting and the run check all use "
            "it; the emulator's skip limit keeps its ratio to the SLO). With --scale, the "
            "SLO given is then scaled like the scenario's own.",
            min=0.001,
        ),
    ] = None,
) -> None:
    """Run SCENARIO under several policies and print them side by side, with plots and an
    HTML report in OUT."""
    from srtm.experiments import scenarios

    run = RunSettings(
        out, TERMINAL, as_json, policies_of(policies), duration, warmup, analysis,
        spark_master, scale, quick, slo_ms=slo_ms,
        publisher_order=order_of(publisher_order),
    )  # fmt: skip
    try:
        summary = scenarios.find(scenario).compare(run)
    except UsageError as exc:
        raise usage(exc) from exc
    finish(summary, as_json, strict)


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
            help="Broker model for the simulator: 'calibrated' (the shipped `srtm "
            "calibrate` of the development machine), 'paper' or a file from `srtm calibrate`."
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
    from srtm.experiments.figures.report import print_figure

    print_figure(result, TERMINAL)
    if as_json:
        print(json.dumps(result.data))
