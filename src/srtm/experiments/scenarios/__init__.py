"""The shipped live scenarios (TOML files beside this package, loaded by ``scenario``):
each one ``Live`` experiment, run under one policy (``srtm experiment run``), several side
by side (``compare``) or LB against SRTM on correlated sensors (``demo``), and
``Simulated`` too (``run --sim``: ``simulated``). ``live`` runs one policy, ``report``
makes the tables, plots and the HTML page."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import typer

from srtm.experiments.experiment import (
    Analysis,
    Mode,
    Option,
    RunSettings,
    RunVerdict,
    Summary,
    Terminal,
    UsageError,
    ctrl_c_wins,
    progress,
    sizing_of,
)
from srtm.experiments.scenarios.scenario import (
    PublisherOrder,
    Scenario,
    available,
    load,
    parse,
    parse_publisher_order,
)

if TYPE_CHECKING:
    from rich.console import Console

    from srtm.experiments.sizing import Sizing
    from srtm.placement import Policy

__all__ = [
    "PublisherOrder",
    "Scenario",
    "ScenarioExperiment",
    "analyse",
    "available",
    "demo",
    "find",
    "load",
    "parse",
    "parse_publisher_order",
    "run_policies",
]


@dataclass(frozen=True)
class ScenarioExperiment:
    """One live scenario (shipped, or a TOML file) as an experiment."""

    scenario: Scenario
    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.policy, Option.duration, Option.warmup, Option.analysis,
         Option.spark_master, Option.strict, Option.scale, Option.publisher_order,
         Option.quick}
    )  # fmt: skip

    #: ``--sim``: every policy asked for (``--policy lb,conc,maxmin,srtm``).
    sim_options: ClassVar[frozenset[Option]] = frozenset({Option.policy})

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def description(self) -> str:
        return self.scenario.description

    def live(self, run: RunSettings) -> Summary:
        """The scenario under each policy of ``run``, and their table (no HTML page)."""
        import json

        from srtm.experiments.scenarios import report

        sc, how = sized(self.scenario.with_order(run.publisher_order), run.scale, run.term)
        duration, warmup = spans(run)
        summaries = run_policies(sc, run.policies, run.out, duration, warmup, how, run.term)
        analyse(summaries, run.out, run.analysis, run.spark_master, run.term.err)
        report.print_table(summaries, _title(sc), run.term.out)
        run.term.err.print(f"summaries and traces under {run.out}")
        document = json.dumps(report.compact(summaries))
        return _summary(self.name, summaries, (document,), saved(summaries, run.out))

    def sim(self, run: RunSettings) -> Summary:
        """The scenario as written under each policy of ``run``, in the simulator
        (``simulated``), its table printed and its JSON saved in ``run.out``."""
        import json

        from srtm.experiments.scenarios import simulated

        sc = self.scenario
        with run.term.err.status(f"simulating {sc.name} under {', '.join(run.policies)}"):
            rows = simulated.simulate(sc, run.policies)
        run.term.out.print(simulated.table(sc, rows))
        doc = simulated.document(sc, rows)
        path = simulated.save(run.out, sc, doc)
        return Summary(self.name, Mode.sim, (json.dumps(doc),), report=(path,))

    def compare(self, run: RunSettings) -> Summary:
        """The scenario under each policy of ``run``, side by side, with plots and an HTML
        report in ``run.out``; with ``run.slo_ms``, at that SLO (``with_slo``)."""
        sc = self.scenario.with_order(run.publisher_order)
        sc = sc if run.slo_ms is None else with_slo(sc, run.slo_ms)
        sc, how = sized(sc, run.scale, run.term)
        duration, warmup = spans(run)
        summaries = run_policies(sc, run.policies, run.out, duration, warmup, how, run.term)
        analyse(summaries, run.out, run.analysis, run.spark_master, run.term.err)
        return finish(sc, summaries, run.out, run.term)


#: ``--quick``: the measured window and the warm-up (s) unless given; fitting still runs to
#: its end in the warm-up. Long enough for a table of every policy and the run check's
#: figures, far too short to judge a p99 by (a few thousand messages).
QUICK_DURATION_S = 4.0
QUICK_WARMUP_S = 2.0


def with_slo(sc: Scenario, slo_ms: float) -> Scenario:
    """``sc`` judged against ``slo_ms`` instead of its own SLO, on the same brokers and
    workload. The emulator's skip limit keeps its ratio to the SLO (the run check's
    send-lateness limits are shares of it), as the broker-lateness limit does."""
    if not (slo_ms > 0 and slo_ms < float("inf")):
        raise UsageError("--slo-ms", f"must be a number of ms > 0, got {slo_ms!r}")
    ratio = slo_ms / sc.slo_p99_ms
    return replace(sc, slo_p99_ms=slo_ms, max_send_late_ms=sc.max_send_late_ms * ratio)


def spans(run: RunSettings) -> tuple[float | None, float | None]:
    """The measured window and warm-up a run asks for (None: the scenario's)."""
    if not run.quick:
        return run.duration_s, run.warmup_s
    return (
        QUICK_DURATION_S if run.duration_s is None else run.duration_s,
        QUICK_WARMUP_S if run.warmup_s is None else run.warmup_s,
    )


def find(name: str) -> ScenarioExperiment:
    """The shipped scenario ``name``, or the one in the TOML file ``name``."""
    try:
        return ScenarioExperiment(load(name))
    except ValueError as exc:
        raise UsageError("SCENARIO", str(exc)) from exc


def shipped() -> list[ScenarioExperiment]:
    return [ScenarioExperiment(load(name)) for name in available()]


def demo(run: RunSettings, orders: Sequence[PublisherOrder] = tuple(PublisherOrder)) -> Summary:
    """The main job: correlated sensors under LB, then SRTM, with publishers handed over
    in each of ``orders`` (block: each group whole, the blind policy's worst case; shuffled:
    the order a user meets), with the HTML report."""
    term = run.term
    sc = find("correlated-sensors").scenario
    started = time.monotonic()
    term.err.print(f"[bold]{sc.name}[/bold]: {sc.description}")
    sc, how = sized(sc, run.scale, term)
    term.err.print(
        f"SLO p99 ≤ {sc.slo_p99_ms:g} ms; {sc.brokers} brokers on 127.0.0.1; "
        f"{run.duration_s:g} s measured per policy; publishers in "
        f"{' and '.join(orders)} order."
    )
    summaries = []
    for order in orders:
        summaries += run_policies(
            sc.with_order(order), run.policies, run.out, run.duration_s, run.warmup_s, how, term
        )
    analyse(summaries, run.out, run.analysis, run.spark_master, term.err)
    done = finish(sc, summaries, run.out, term)
    term.err.print(f"finished in {time.monotonic() - started:.0f} s")
    return done


def sized(sc: Scenario, scale: str, term: Terminal) -> tuple[Scenario, Sizing]:
    """``sc`` at the scale ``--scale`` asks for (measuring this machine for 'auto')."""
    from srtm.experiments import sizing

    how = sizing_of(scale, term)
    out = sizing.scaled(sc, how.scale)
    term.err.print(how.describe(out), highlight=False)
    return out, how


def run_policies(
    sc: Scenario,
    policies: Sequence[Policy],
    out: Path,
    duration: float | None,
    warmup: float | None,
    how: Sizing | None,
    term: Terminal,
) -> list[dict[str, Any]]:
    from srtm.experiments.scenarios import live

    summaries = []
    shuffled = "" if sc.publisher_order is PublisherOrder.block else f" / {sc.publisher_order}"
    for policy in policies:
        with progress(term, f"{sc.name} / {policy}{shuffled}") as update, ctrl_c_wins():
            summaries.append(
                live.run(
                    sc, policy, out, duration_s=duration, warmup_s=warmup, on_progress=update,
                    sizing=how,
                )
            )  # fmt: skip
    return summaries


def analyse(
    summaries: list[dict[str, Any]],
    out: Path,
    engine: Analysis,
    master: str | None,
    err: Console | None = None,
) -> None:
    """Recompute the summaries' latency figures with the Spark pipeline unless ``engine``
    is local; with auto, fall back to the in-process figures if Spark fails (with spark,
    exit 1)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from srtm.experiments import spark_analysis
    from srtm.experiments.scenarios import live

    if engine is Analysis.local or not summaries:
        return
    console = err or Console(stderr=True)
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


def finish(sc: Scenario, summaries: list[dict[str, Any]], out: Path, term: Terminal) -> Summary:
    """The table of each publisher order's runs, the plots and the HTML page of
    ``summaries``; one JSON document per order."""
    import json

    from srtm.experiments.scenarios import report

    groups = report.by_order(summaries)
    for order, group in groups.items():
        report.print_table(group, _title(sc.with_order(PublisherOrder(order))), term.out)
    images = report.plots(summaries, out / "traces", out)
    page = report.write_html(summaries, images, out, sc)
    term.err.print(f"report: {page}")
    documents = tuple(json.dumps(report.compact(g)) for g in groups.values())
    return _summary(sc.name, summaries, documents, (*saved(summaries, out), *images, page))


def _title(sc: Scenario) -> str:
    return f"{sc.name}, publishers in {sc.publisher_order} order: SLO p99 ≤ {sc.slo_p99_ms:g} ms"


def saved(summaries: Sequence[dict[str, Any]], out: Path) -> tuple[Path, ...]:
    """The runs' summaries as ``live.run`` saved them in ``out`` (Spark's analysis
    rewrites the same files)."""
    from srtm.experiments.scenarios import live

    return tuple(live.summary_path(out, s["run"]) for s in summaries)


def _summary(
    name: str,
    summaries: Sequence[dict[str, Any]],
    documents: tuple[str, ...],
    report: tuple[Path, ...],
) -> Summary:
    from srtm.experiments.scenarios import report as tables

    bad = bool(tables.disturbances(summaries))
    verdict = RunVerdict.disturbed if bad else RunVerdict.ok
    return Summary(name, Mode.live, documents, verdict, report)
