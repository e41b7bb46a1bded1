"""``srtm demo``: the main job, LB against SRTM on correlated sensors, with publishers
handed over in block and in shuffled order, with the HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from srtm.cli.experiment import (
    TERMINAL,
    AnalysisOpt,
    JsonOpt,
    ScaleOpt,
    SparkMasterOpt,
    StrictOpt,
    finish,
    usage,
)
from srtm.experiments.experiment import Analysis, RunSettings, UsageError

if TYPE_CHECKING:
    from srtm.experiments.scenarios.scenario import PublisherOrder


def demo(
    duration: Annotated[
        float,
        typer.Option(
            help="Seconds measured per run (after a short warm-up); a run per policy and "
            "publisher order.",
            min=1,
        ),
    ] = 15.0,
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
    publisher_order: Annotated[
        str,
        typer.Option(
            "--publisher-order",
            help="The order the publishers are handed to the placement policy: 'both' "
            "(default: block, then shuffled), 'block' (each correlation group's members "
            "one after another: LB keeps every group whole on one broker, its worst "
            "case) or 'shuffled' (seeded: LB gives each broker a slice of most groups).",
        ),
    ] = "both",
) -> None:
    """The main job: correlated sensors on a local cluster, placed by load balancing (LB)
    and by SRTM, with the publishers handed over in block order and in shuffled order;
    the traces analysed by the Spark pipeline; a comparison table per order, what SRTM
    gains in each, and OUT/report.html with plots. --json prints one document per order."""
    from srtm.experiments import scenarios

    orders = orders_of(publisher_order)

    run = RunSettings(out, TERMINAL, as_json, ("lb", "srtm"), duration, warmup, analysis,
                      spark_master, scale)  # fmt: skip
    try:
        summary = scenarios.demo(run, orders)
    except UsageError as exc:
        raise usage(exc) from exc
    finish(summary, as_json, strict)


def orders_of(text: str) -> tuple[PublisherOrder, ...]:
    """The demo's ``--publisher-order``: both orders, or one; exit 2 naming the option."""
    from srtm.experiments.scenarios.scenario import PublisherOrder, parse_publisher_order

    if text == "both":
        return tuple(PublisherOrder)
    try:
        return (parse_publisher_order(text),)
    except ValueError:
        raise typer.BadParameter(
            f"'both', 'block' or 'shuffled', got {text!r}", param_hint="--publisher-order"
        ) from None
