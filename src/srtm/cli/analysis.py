"""``srtm drl-penalty``: the DRL penalty of k-way splits, model beside simulation."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.analysis import DrlRow, drl_table
from srtm.cli.common import fail, wide_console


def _fmt(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(value * scale, fmt)


def _render(rows: list[DrlRow], console: Console) -> None:
    table = Table(
        title="DRL penalty of a k-way equal split: token delay, M/D/1 model then simulation",
        caption="delays in ms; each model column is followed by its simulated 'sim'; Eq.1 = "
        "the paper's closed form of the mean; penalty = model mean / model mean at k=1",
    )
    headers = ("k", "r/k", "b/k", "P(wait)", "sim", "mean", "sim", "p99", "sim", "Eq.1", "penalty")
    for name in headers:
        table.add_column(name, justify="right")
    if any(row.note for row in rows):
        table.add_column("note", no_wrap=True)
    base = rows[0].model.mean_s if rows and rows[0].model else None
    for row in rows:
        m, s = row.model, row.sim
        cells = [
            str(row.k),
            f"{row.sub_rate:.6g}",
            f"{row.sub_burst:.4g}",
            _fmt(None if m is None else m.prob_delayed, ".4f"),
            _fmt(None if s is None else s.prob_delayed, ".4f"),
            _fmt(None if m is None else m.mean_s, ".4f", 1e3),
            _fmt(None if s is None else s.mean_s, ".4f", 1e3),
            _fmt(None if m is None else m.p99_s, ".3f", 1e3),
            _fmt(None if s is None else s.p99_s, ".3f", 1e3),
            _fmt(None if m is None else m.eq1_mean_s, ".4f", 1e3),
            "—" if m is None or not base else f"{m.mean_s / base:.0f}×",
        ]
        table.add_row(*cells, *([row.note] if len(table.columns) > len(cells) else []))
    console.print(table)


def drl_penalty(
    rate: Annotated[float, typer.Option(help="Topic token rate r (tokens/s).")] = 10_000.0,
    burst: Annotated[float, typer.Option(help="Topic bucket depth b (tokens, >= 1).")] = 20.0,
    load: Annotated[
        float, typer.Option(help="Utilisation ρ = λ/r of the Poisson arrivals, in (0, 1).")
    ] = 0.8,
    k_max: Annotated[int, typer.Option(help="Largest split width k to evaluate.")] = 6,
    batch: Annotated[
        int,
        typer.Option(
            help="Messages per arrival event (batch Poisson). Above 1 the model counts in "
            "batches and describes the last message of each batch."
        ),
    ] = 1,
    messages: Annotated[
        int, typer.Option(help="Messages in the simulated trace behind the 'sim' columns.")
    ] = 1_000_000,
    seed: Annotated[int, typer.Option(help="Seed of the simulated trace.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the rows as one JSON document instead.")
    ] = False,
) -> None:
    """Predicted (M/D/1, Eq. 1) and simulated token delay of k-way splits, k = 1..K.

    Each sub-bucket of a k-way split gets (r/k, b/k) and a random 1/k of the
    publishers' Poisson traffic; its delays grow with k: the DRL penalty.
    """
    console = wide_console(132)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("k={task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=as_json,
        ) as progress:
            task = progress.add_task("model and simulation", total=k_max)
            rows = drl_table(
                rate,
                burst,
                load,
                k_max,
                batch,
                messages,
                seed,
                progress=lambda k: progress.update(task, completed=k),
            )
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print(json.dumps({"rows": [asdict(r) for r in rows]}, indent=2))
    else:
        _render(rows, console)
