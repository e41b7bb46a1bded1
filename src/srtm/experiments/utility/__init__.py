"""The utility-aware allocation paper's experiments (Bhola et al.): trading day, excess
capacity, latency effects. ``sim`` runs them by the optimizer per stage at the paper's
scale, ``scenario`` defines them at the live runs' small scale (pure), ``live`` runs them
on a local controller and broker, ``report`` shows a live run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from srtm.experiments.experiment import (
    Mode,
    Option,
    RunSettings,
    Summary,
    UsageError,
    progress,
    unsized,
    verdict,
)

NAMES = ("trading-day", "excess-capacity", "latency-effects")


@dataclass(frozen=True)
class UtilityExperiment:
    """One of the three: simulated, or live at small scale, decided by the controller or
    by the run itself (``--decide``; ``--quick``: short stages); not sized to the
    machine (``--scale``). Its verdict: disturbed, or failed when a claim fails."""

    name: str
    sim_options: ClassVar[frozenset[Option]] = frozenset()
    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.quick, Option.decide, Option.strict, Option.scale}
    )

    @property
    def description(self) -> str:
        return "the utility-aware allocation paper's experiment " + self.name

    def sim(self, run: RunSettings) -> Summary:
        from srtm.experiments.figures.report import print_figure
        from srtm.experiments.utility import sim

        result = sim.EXPERIMENTS[self.name](run.out)
        print_figure(result, run.term)
        ok = all(c["ok"] for c in result.data["claims"])
        document = json.dumps(result.data)
        done = verdict(disturbed=False, ok=ok)
        return Summary(self.name, Mode.sim, (document,), done, tuple(result.files))

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.utility import live, report, scenario

        if run.decide not in live.MODES:
            raise UsageError("--decide", f"'controller' or 'driver', got {run.decide!r}")
        unsized(run.scale, self.name, live.NOT_SIZED, run.term)
        exp = scenario.EXPERIMENTS[self.name]()
        mode: live.Mode = "driver" if run.decide == "driver" else "controller"
        with progress(run.term, f"{self.name} live ({run.decide})") as update:
            summary = live.run(exp, run.out, mode, quick=run.quick, on_progress=update)
        report.print_live(summary, run.term.out)
        png = report.plot(summary, run.out)
        page = report.write_html(summary, png, run.out)
        table = report.write_markdown(summary, run.out)
        run.term.err.print(f"report: {page}")
        ok = all(c["ok"] for c in summary["claims"])
        return Summary(
            self.name,
            Mode.live,
            (json.dumps(summary),),
            verdict(disturbed=bool(summary["disturbed"]), ok=ok),
            (live.summary_path(run.out, exp.name), png, page, table),
        )


EXPERIMENTS = tuple(UtilityExperiment(name) for name in NAMES)
