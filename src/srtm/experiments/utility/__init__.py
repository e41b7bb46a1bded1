"""The utility-aware allocation paper's experiments (Bhola et al.): trading day, excess
capacity, latency effects. ``sim`` runs them by the optimizer per stage at the paper's
scale, ``scenario`` defines them at the live runs' small scale (pure), ``live`` runs them
on a local controller and broker, ``report`` shows a live run. Simulated only, second by
second (``dynamics``): mixed reliability (Fig. 7, ``reliability``) and model correction
(Fig. 10, ``correction``)."""

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


#: The experiments simulated over time only: Fig. 7 and Fig. 10.
OVER_TIME = ("mixed-reliability", "model-correction")


@dataclass(frozen=True)
class UtilityOverTime:
    """Fig. 7 or Fig. 10 of the utility paper, simulated second by second (no live run:
    both need a disk and a CPU model error under the experiment's control)."""

    name: str
    sim_options: ClassVar[frozenset[Option]] = frozenset()

    @property
    def description(self) -> str:
        return (
            "the utility-aware allocation paper's "
            + {
                "mixed-reliability": "Fig. 7 (mixed reliability, the storage-latency bound)",
                "model-correction": "Fig. 10 (the cost model corrected online)",
            }[self.name]
        )

    def sim(self, run: RunSettings) -> Summary:
        from srtm.experiments.figures.report import print_figure
        from srtm.experiments.utility import correction, reliability

        make = {
            "mixed-reliability": reliability.mixed_reliability,
            "model-correction": correction.model_correction,
        }[self.name]
        result = make(run.out)
        print_figure(result, run.term)
        ok = all(c["ok"] for c in result.data["claims"])
        done = verdict(disturbed=False, ok=ok)
        return Summary(self.name, Mode.sim, (json.dumps(result.data),), done, tuple(result.files))


@dataclass(frozen=True)
class MeasuredCongestion:
    """Rate control on the broker's measured CPU, live only (``congestion``): a broker
    pushed over its CPU budget by a load generator; the managed topic's rate falls,
    its SLO holds, and the rate recovers when the load leaves."""

    name: str = "measured-congestion"
    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.quick, Option.strict, Option.scale}
    )

    @property
    def description(self) -> str:
        return "rate control driven by a broker's measured CPU (the utility paper, live)"

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.utility import congestion

        unsized(run.scale, self.name, congestion.NOT_SIZED, run.term)
        with progress(run.term, f"{self.name} live") as update:
            summary = congestion.run(run.out, quick=run.quick, on_progress=update)
        png = congestion.plot(summary, run.out)
        for c in summary["claims"]:
            mark = "✓" if c["ok"] else "✗"
            run.term.out.print(f"{mark} {c['paper']}: {c['sim']}", highlight=False)
        run.term.out.print(
            "disturbed: " + summary["disturbed"] if summary["disturbed"] else "not disturbed",
            highlight=False,
        )
        ok = all(c["ok"] for c in summary["claims"])
        return Summary(
            self.name,
            Mode.live,
            (json.dumps(summary),),
            verdict(disturbed=bool(summary["disturbed"]), ok=ok),
            (run.out / "measured-congestion-live.json", png),
        )


EXPERIMENTS: tuple[UtilityExperiment | UtilityOverTime | MeasuredCongestion, ...] = (
    *(UtilityExperiment(name) for name in NAMES),
    *(UtilityOverTime(name) for name in OVER_TIME),
    MeasuredCongestion(),
)
