"""``srtm demo``: the main job, LB against SRTM on correlated sensors, with the HTML
report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
    from srtm.experiments import scenarios

    run = RunSettings(out, TERMINAL, as_json, ("lb", "srtm"), duration, warmup, analysis,
                      spark_master, scale)  # fmt: skip
    try:
        summary = scenarios.demo(run)
    except UsageError as exc:
        raise usage(exc) from exc
    finish(summary, as_json, strict)
