"""``srtm pipeline …``: the Spark jobs from the command line.

Spark is imported only inside the commands, so ``srtm --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.cli.common import fail, wide_console
from srtm.pipeline import JOBS

if TYPE_CHECKING:
    import pandas as pd

    from srtm.pipeline.jobs import JobResult, Options

app = typer.Typer(
    help="Spark jobs over trace datasets: latency and DRL tables, TB Adaptor statistics, "
    "bucket profiles, correlation groups, reports. Outputs are Parquet under OUT/<job>/.",
    no_args_is_help=True,
    add_completion=False,
)

Traces = Annotated[
    Path,
    typer.Option(
        "--traces",
        help="Trace dataset: runs/<run>.json, broker/run=<run>/*.parquet, "
        "subscriber/run=<run>/*.parquet.",
    ),
]
Out = Annotated[Path, typer.Option("--out", help="Output directory; each job replaces OUT/<job>/.")]
Master = Annotated[
    str,
    typer.Option(
        help="Spark master URL: local[*] (default), local-cluster[N,cores,MB] for N separate "
        "executor processes, spark://HOST:PORT, …"
    ),
]
Runs = Annotated[
    list[str] | None,
    typer.Option("--run", help="Only this run (repeat for several); default: every run."),
]
DriverMemory = Annotated[
    str, typer.Option(help="Heap of the Spark driver JVM (which runs the tasks in local mode).")
]
Margin = Annotated[
    float, typer.Option(help="Bucket rate = margin × measured rate (profiles, adaptor meter).")
]
Quantile = Annotated[
    float, typer.Option(help="profile-buckets: share of messages that must never wait.")
]
WindowS = Annotated[int, typer.Option(help="adaptor-stats: sliding window in seconds.", min=1)]
CorrWindow = Annotated[
    float,
    typer.Option(help="correlation: co-occurrence window, ms; at least twice the groups' spread."),
]
CorrThreshold = Annotated[
    float, typer.Option(help="correlation: phi coefficient at which two publishers correlate.")
]

_err = Console(stderr=True)


def _options(
    runs: Sequence[str] | None,
    margin: float,
    quantile: float,
    window_s: int,
    corr_window_ms: float,
    corr_threshold: float,
) -> Options:
    from srtm.pipeline.correlation import Settings
    from srtm.pipeline.jobs import Options

    return Options(
        runs=tuple(runs) if runs else None,
        margin=margin,
        quantile=quantile,
        window_s=window_s,
        correlation=Settings(window_ms=corr_window_ms, threshold=corr_threshold),
    )


def _run(
    jobs: Sequence[str], traces: Path, out: Path, master: str, memory: str, opts: Options
) -> None:
    from srtm.pipeline.dataset import SchemaError
    from srtm.pipeline.jobs import run_pipeline
    from srtm.pipeline.session import SparkSettings

    console = wide_console(132)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=_err,
        transient=True,
    ) as progress:
        task = progress.add_task(f"starting Spark ({master})", total=None)
        try:
            run = run_pipeline(
                jobs,
                traces,
                out,
                SparkSettings(master=master, driver_memory=memory),
                opts,
                on_start=lambda job: progress.update(task, description=f"job {job}"),
            )
        except (SchemaError, ValueError) as exc:
            progress.stop()
            raise fail(str(exc)) from exc
    _print_results(console, run.results, f"{master} (application {run.application})", run.executors)
    _print_tables(console, out, run.results)


def _print_results(
    console: Console, results: list[JobResult], master: str, executors: list[str]
) -> None:
    where = f"{len(executors)} executor process(es) {executors}" if executors else "driver JVM"
    table = Table(title=f"srtm pipeline on {master} — tasks ran in the {where}")
    for name in ("job", "rows in", "rows out", "seconds", "rows/s", "output"):
        table.add_column(name, justify="left" if name in ("job", "output") else "right")
    for r in results:
        rate = f"{r.input_rows / r.seconds:,.0f}" if r.input_rows and r.seconds > 0 else "—"
        table.add_row(
            r.job, f"{r.input_rows:,}", f"{r.rows:,}", f"{r.seconds:.1f}", rate, str(r.output)
        )
    console.print(table)


def _ms(v: object) -> str:
    try:
        return f"{float(v) / 1e6:.3f}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "—"


def _frame_table(title: str, frame: pd.DataFrame, columns: dict[str, str]) -> Table:
    table = Table(title=title)
    for header in columns.values():
        table.add_column(header, justify="right")
    for row in frame.itertuples(index=False):
        cells = []
        for col in columns:
            value = getattr(row, col)
            if col.endswith("_ns"):
                cells.append(_ms(value))
            elif isinstance(value, float):
                cells.append("—" if value != value else f"{value:.4g}")
            else:
                cells.append("—" if value is None else str(value))
        table.add_row(*cells)
    return table


def _print_tables(console: Console, out: Path, results: list[JobResult]) -> None:
    """The results worth reading on a terminal (per-topic rows; the full data is in OUT)."""
    import pandas as pd

    done = {r.job for r in results}
    if "latency" in done:
        lat = pd.read_parquet(out / "latency")
        lat = lat[lat["broker"].isna()]
        cols = {"run": "run", "policy": "policy", "topic": "topic", "brokers": "brokers"}
        cols |= {"count": "count", "p50_ns": "p50 ms", "p95_ns": "p95 ms", "p99_ns": "p99 ms"}
        cols |= {"p999_ns": "p99.9 ms", "slo_met": "SLO met", "tail_token_share": "tail token"}
        console.print(_frame_table("latency per topic (e2e, nearest rank)", lat, cols))
    if "profile-buckets" in done:
        prof = pd.read_parquet(out / "profile-buckets")
        cols = {"run": "run", "topic": "topic", "messages": "messages", "rate": "rate/s"}
        cols |= {"r": "r", "b": "b", "configured_rate": "conf. r", "configured_burst": "conf. b"}
        console.print(_frame_table("profiled buckets", prof, cols))
    if "correlation" in done:
        corr = pd.read_parquet(out / "correlation").drop_duplicates(["run", "topic"])
        cols = {"run": "run", "topic": "topic", "groups_found": "groups found"}
        cols |= {"groups_true": "true groups", "ari": "ARI"}
        console.print(_frame_table("correlation groups", corr, cols))
    if "report" in done:
        console.print(f"report: {out / 'report' / 'index.html'}")


def _command(job: str, doc: str) -> None:
    def command(
        traces: Traces,
        out: Out,
        master: Master = "local[*]",
        run: Runs = None,
        driver_memory: DriverMemory = "2g",
        margin: Margin = 1.1,
        quantile: Quantile = 0.99,
        window_s: WindowS = 10,
        corr_window_ms: CorrWindow = 4.0,
        corr_threshold: CorrThreshold = 0.5,
    ) -> None:
        opts = _options(run, margin, quantile, window_s, corr_window_ms, corr_threshold)
        jobs = JOBS if job == "all" else (job,)
        _run(jobs, traces, out, master, driver_memory, opts)

    command.__doc__ = doc
    app.command(job)(command)


_command(
    "latency",
    "Join broker and subscriber rows; exact p50/p95/p99/p99.9 e2e latency per (run, topic, "
    "broker) and per (run, topic), SLO violations, token-wait share of the tail.",
)
_command(
    "adaptor-stats",
    "Per (topic, broker): 1 s arrival counts, sliding-window rate and max virtual backlog "
    "(the TB Adaptor's inputs) and the split it asks for.",
)
_command(
    "profile-buckets",
    "Per topic: r = margin × rate and the smallest b with zero token wait for a quantile of "
    "the messages (srtm.analysis via applyInPandas).",
)
_command(
    "correlation",
    "Groups of publishers whose arrivals co-occur; proposed correlation keys; adjusted Rand "
    "index against ground-truth groups.",
)
_command("report", "Tables, PNG plots and an HTML page (runs missing jobs first).")
_command("all", "Run latency, adaptor-stats, profile-buckets, correlation and report in order.")


@app.command("info")
def info(
    master: Master = "local[*]",
    driver_memory: DriverMemory = "2g",
) -> None:
    """Start a session and show where tasks run: executor ids, and the JVM that started each
    Python worker (distinct JVM pids: separate executor processes)."""
    import os

    from srtm.pipeline.session import SparkSettings, session_info

    info = session_info(SparkSettings(master=master, driver_memory=driver_memory))
    table = Table(title=f"Spark {info.version} on {info.master}")
    table.add_column("what")
    table.add_column("value")
    table.add_row("Python driver pid", str(os.getpid()))
    table.add_row("driver JVM pid", info.driver_jvm)
    ids = ", ".join(info.executors)
    table.add_row("executor ids", ids or "none (local mode: the driver JVM runs tasks)")
    table.add_row("JVM pids that ran tasks", ", ".join(sorted({str(j) for _, j in info.tasks})))
    table.add_row("Python worker pids", ", ".join(str(p) for p, _ in info.tasks))
    Console().print(table)
