"""The paper's Figs. 4–9 and Table I, simulated at full scale.

The broker is the one ``srtm calibrate`` measured (``srtm.sim.model.calibrated``), put at
the paper's speed (110 kmsg/s over 2 cores: ``at_paper_speed``); ``--model paper`` runs
the earlier model whose service times were chosen to make the paper's thresholds hold.

Every run follows the paper's setup (Sec. VI): brokers of 110 kmsg/s ``mcap``, 10 msg/s
per publisher, a 1 ms p99 SLO, and a topic bucket profiled on the topic's trace (rate
1.1 × the measured rate, the smallest burst with which 99 % of messages wait zero); here
the profiled trace is the simulated one, so a topic on one broker never waits for
tokens and every token wait is the DRL penalty of the split. Baselines other than LB use
the fewest brokers whose ``rcap`` covers the topic and add brokers until the simulated
p99 meets the SLO, reporting the best configuration when none does (Sec. VI-B).

Each figure function writes ``<name>.png`` (a plot in the paper's layout), ``<name>.md``
(the table) and ``<name>.json`` (``data``) into the output directory and returns a
``FigureResult``. ``data["claims"]`` lists the paper's conclusions for the figure, with
what the simulation shows and whether it agrees. ``quick=True`` shrinks every figure
(fewer points, shorter traces) for tests.

One module per figure; ``common`` (the paper's setup, one configuration simulated, the
files and plotting every figure shares) and ``groups`` (what Figs. 7–9 share) below them;
``validation`` compares live runs with the simulator; ``report`` prints a figure in the
terminal. Each figure is a ``Simulated`` experiment (``EXPERIMENTS``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from srtm.experiments.experiment import (
    Mode,
    Option,
    RunSettings,
    Summary,
    UsageError,
    verdict,
)
from srtm.experiments.figures.common import FigureResult, model_named
from srtm.experiments.figures.fig4 import fig4
from srtm.experiments.figures.fig5 import fig5
from srtm.experiments.figures.fig6 import fig6
from srtm.experiments.figures.fig7 import fig7
from srtm.experiments.figures.fig8 import fig8
from srtm.experiments.figures.fig9 import fig9
from srtm.experiments.figures.table1 import fit_topic, table1
from srtm.experiments.figures.validation import validate_live

FIGURES: dict[str, Callable[..., FigureResult]] = {
    "fig4": fig4,
    "fig5": fig5,
    "fig6": fig6,
    "fig7": fig7,
    "fig8": fig8,
    "fig9": fig9,
    "table1": table1,
}


def run_figure(name: str, out_dir: Path, **options: Any) -> FigureResult:
    """Run one reproduction by name, writing its files into ``out_dir``."""
    try:
        fn = FIGURES[name]
    except KeyError:
        raise ValueError(f"unknown figure {name!r} (one of {', '.join(FIGURES)})") from None
    return fn(out_dir, **options)


@dataclass(frozen=True)
class Figure:
    """One of the paper's figures as an experiment: simulated only, at full scale."""

    name: str
    sim_options: ClassVar[frozenset[Option]] = frozenset({Option.model})

    @property
    def description(self) -> str:
        return "one of the paper's figures, simulated at full scale"

    def sim(self, run: RunSettings) -> Summary:
        from srtm.experiments.figures.report import print_figure

        try:
            model = model_named(run.model)
        except (OSError, ValueError) as exc:
            raise UsageError(Option.model.value, str(exc)) from None
        result = run_figure(self.name, run.out, model=model)
        print_figure(result, run.term)
        ok = all(c["ok"] for c in result.data.get("claims", []))
        return Summary(
            self.name,
            Mode.sim,
            (json.dumps(result.data),),
            verdict(disturbed=False, ok=ok),
            tuple(result.files),
        )


@dataclass(frozen=True)
class TableOne(Figure):
    """Table I: simulated like the other figures, and live (``table1_live``): online
    fitting on local brokers, measured-only and model-assisted."""

    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.quick, Option.strict, Option.model}
    )

    @property
    def description(self) -> str:
        return (
            "Table I: online fitting rounds per group size, simulated at full scale or "
            "live on local brokers (measured-only and model-assisted)"
        )

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.figures.table1_live import run_live

        return run_live(run)


EXPERIMENTS = tuple(TableOne(n) if n == "table1" else Figure(n) for n in FIGURES)

__all__ = [
    "EXPERIMENTS",
    "FIGURES",
    "Figure",
    "FigureResult",
    "TableOne",
    "fig4",
    "fig5",
    "fig6",
    "fig7",
    "fig8",
    "fig9",
    "fit_topic",
    "run_figure",
    "table1",
    "validate_live",
]
