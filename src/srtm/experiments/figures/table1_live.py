"""Table I live: online fitting on local capacity-limited brokers, measured-only and
model-assisted, beside the paper's rounds and the simulator's.

The paper's Table I topic (1,000 publishers, one event a second each, groups of 5–30
firing together, arriving at six idle brokers of 110 kmsg/s against a 1 ms p99 SLO) is
scaled down to what this machine holds: 300 periodic publishers of one message a second
in groups of 5–30, on six brokers that process 1,000 msg/s each (``--capacity``: 1 ms a
message) against a 20 ms SLO, 2-s rounds instead of 60-s ones. A group's burst then takes
``group`` ms to serve, against the paper's 0.09 × ``group`` ms: the bursts are about half
as long beside the SLO as the paper's (batch 1 here, so that the model the controller
simulates, which knows publishers only by rate and group, sees the workload's shape), and
the brokers run at 30 % of their capacity instead of 9 %: more bursts a second, so that a
2-s round holds enough of them.

Each group size runs twice on a fresh cluster (``scenarios.live``): measured-only
fitting, then model-assisted fitting with ``fit.model`` set to a model of these brokers:
``srtm calibrate`` on a broker run as they are, at the same SLO, with their emulated
server in front (``calibrate_model``), calibrated as part of the run; or ``--model PATH``,
a model file written so earlier. A short measured window follows each fitting, so every
row carries the run's validity verdict.

``assemble`` (pure) makes the table and the JSON from the paper's figures, the
simulator's (``table1.fit_topic`` at the paper's scale) and the live rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from srtm.experiments.experiment import (
    Mode,
    RunSettings,
    Summary,
    UsageError,
    ctrl_c_wins,
    progress,
    verdict,
)
from srtm.experiments.figures.table1 import PAPER_TABLE1, fit_topic
from srtm.experiments.scenarios.scenario import Fit, ProfileTrace, PublisherClass, Scenario

#: Group sizes of the full run and of ``--quick``.
LIVE_GROUPS = (5, 10, 15, 20, 30)
QUICK_GROUPS = (5, 20)
#: The paper's total load distribution time per group size (Table I, last column), s.
PAPER_TIME_S = {5: 64, 10: 189, 15: 558, 20: 745, 25: 871, 30: 1058}
#: The paper's round (s) and the simulator's, which follows it.
PAPER_ROUND_S = 60.0

PUBLISHERS = 300
RATE = 1.0
BROKERS = 6
#: Messages/s a live broker processes (``srtm broker --capacity``) and advertises.
CAPACITY = 1000.0
MCAP = 600.0
SLO_MS = 20.0
ROUND_S = 2.0
MIN_SAMPLES = 200
SETTLE_S = 1.0
#: The measured window after fitting (its validity verdict is the row's).
MEASURE_S = 3.0
#: The longest a run waits for fitting: 17 rounds (the paper's worst row) of 2 s, 1 s of
#: settling and, after a move, up to 5 s for the broker's backlog to drain (90 s left
#: groups of 30 unfinished after 14 rounds).
FIT_BUDGET_S = 150.0
#: The broker's flags ``srtm calibrate`` measures with: the live brokers', less the
#: emulated server (``calibrate_model`` puts it in front of the model).
CALIBRATE_ARGS = ("--release-spin-us", "0", "--busy-poll-us", "0")
MODEL_FILE = "table1-model.json"


class FitMode(StrEnum):
    """How fitting ran: on measurements alone, or with a broker model first."""

    measured = "measured"
    model_assisted = "model_assisted"


@dataclass(frozen=True)
class FitRow:
    """One fitting: rounds per iteration, seconds, final brokers; live rows add how it
    ended, the measured window's p99 and the run's validity."""

    rounds: tuple[int, ...]
    seconds: float | None
    brokers: int
    outcome: str | None = None
    p99_ms: float | None = None
    disturbed: bool | None = None
    disturbed_by: tuple[str, ...] = ()
    #: The fitting's measured rounds: (iteration, round, broker, publishers, p99, verdict).
    steps: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        return sum(self.rounds)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "rounds": list(self.rounds),
            "total": self.total,
            "seconds": self.seconds,
            "brokers": self.brokers,
        }
        if self.disturbed is not None:
            doc |= {
                "outcome": self.outcome,
                "p99_ms": self.p99_ms,
                "validity": "disturbed" if self.disturbed else "not disturbed",
                "disturbed_by": list(self.disturbed_by),
                "steps": list(self.steps),
            }
        return doc

    def cell(self) -> str:
        """``rounds (total) · seconds · → brokers`` for the table."""
        secs = "?" if self.seconds is None else f"{self.seconds:.0f} s"
        mark = " [disturbed]" if self.disturbed else ""
        return f"{' '.join(map(str, self.rounds))} ({self.total}) · {secs} → {self.brokers}{mark}"


def paper_row(group: int) -> FitRow:
    rounds = PAPER_TABLE1[group]
    return FitRow(rounds, float(PAPER_TIME_S[group]), len(rounds))


def sim_row(group: int, mode: FitMode, seed: int = 0) -> FitRow:
    """The simulator's fitting of the paper's topic at the paper's scale (60-s rounds)."""
    done, _, _ = fit_topic(
        group, assisted=mode is FitMode.model_assisted, window_s=PAPER_ROUND_S, seed=seed
    )
    return FitRow(tuple(done.rounds), sum(done.rounds) * PAPER_ROUND_S, len(done.assignment))


def live_row(summary: Mapping[str, Any], fitting: Mapping[str, Any] | None) -> FitRow:
    """A live row from a run's summary (``scenarios.live``) and its fitting document."""
    validity = summary.get("validity") or {}
    outcome = summary.get("fitting_outcome") or summary.get("fitting_state")
    reasons = list(validity.get("reasons", ()))
    if outcome == "disturbed":  # fitting stopped: its rounds measured the machine
        reasons.insert(0, f"fitting: {summary.get('fitting_note')}")
    return FitRow(
        tuple(summary.get("fitting_rounds") or ()),
        summary.get("fitting_s"),
        int(summary.get("brokers_assigned", 0)),
        outcome,
        (summary.get("e2e_ms") or {}).get("p99"),
        # No verdict (the window was never measured) counts as disturbed: nothing known.
        validity.get("status", "disturbed") == "disturbed" or outcome == "disturbed",
        tuple(reasons),
        tuple((fitting or {}).get("steps", ())),
    )


#: The table's columns.
COLUMNS = (
    "group",
    "paper (measured)",
    "sim measured",
    "sim model-assisted",
    "live measured",
    "live model-assisted",
)


def assemble(
    groups: Sequence[int],
    sim: Mapping[int, Mapping[FitMode, FitRow]],
    live: Mapping[int, Mapping[FitMode, FitRow]],
) -> tuple[dict[str, Any], list[list[str]]]:
    """The JSON document's ``groups`` and claims, and the table's rows: per group size,
    the paper's fitting, the simulator's and the live one in both modes."""
    data: dict[str, Any] = {"groups": {}}
    rows = []
    for g in groups:
        entry = {
            "paper": paper_row(g).to_json(),
            "sim": {m.value: sim[g][m].to_json() for m in FitMode},
            "live": {m.value: live[g][m].to_json() for m in FitMode},
        }
        data["groups"][str(g)] = entry
        rows.append([
            str(g), paper_row(g).cell(),
            *(sim[g][m].cell() for m in FitMode), *(live[g][m].cell() for m in FitMode),
        ])  # fmt: skip
    data["claims"] = claims(groups, live)
    return data, rows


def claims(
    groups: Sequence[int], live: Mapping[int, Mapping[FitMode, FitRow]]
) -> list[dict[str, Any]]:
    """What the live rows say of the paper's and issue 7's conclusions (judged only on
    rows not disturbed; a claim with none is not judged: ``ok`` None)."""
    quiet = [g for g in groups if not any(live[g][m].disturbed for m in FitMode)]
    measured = [live[g][FitMode.measured].total for g in quiet]
    assisted = {g: live[g][FitMode.model_assisted] for g in quiet}
    brokers = [live[g][FitMode.measured].brokers for g in quiet]
    one_round = [g for g, r in assisted.items() if r.total == 1]
    return [
        {
            "paper": "fitting takes longer (more rounds) as the groups grow",
            "live": f"measured-only, groups {quiet}: {measured} rounds",
            "ok": (measured == sorted(measured) and measured[0] < measured[-1])
            if len(quiet) > 1
            else None,
        },
        {
            "paper": "bigger groups need more brokers",
            "live": f"measured-only, groups {quiet}: {brokers} brokers",
            "ok": (brokers == sorted(brokers) and brokers[0] < brokers[-1])
            if len(quiet) > 1
            else None,
        },
        {
            "paper": "(issue 7 target) model-assisted fitting converges in one round",
            "live": f"in one round for groups {one_round} of {sorted(assisted)}",
            "ok": len(one_round) == len(assisted) if assisted else None,
        },
    ]


def scenario_for(group: int, mode: FitMode, model: Path | None) -> Scenario:
    """The live topic of ``group``-sized groups; model-assisted with ``model``."""
    fit = Fit(
        ROUND_S,
        MIN_SAMPLES,
        SETTLE_S,
        str(model) if mode is FitMode.model_assisted and model is not None else None,
    )
    return Scenario(
        name=f"table1-g{group}-{'model' if mode is FitMode.model_assisted else 'measured'}",
        description=f"Table I live: groups of {group}, {mode.value} fitting",
        scale=__doc__ or "",
        brokers=BROKERS,
        capacity=CAPACITY,
        mcap=MCAP,
        topic="table1",
        slo_p99_ms=SLO_MS,
        publishers=(PublisherClass(PUBLISHERS, RATE, "periodic", 1, group, "p"),),
        duration_s=MEASURE_S,
        warmup_s=0.0,
        seed=7,
        fit=fit,
        # Periodic sensors keep their phases: another draw would be other sensors, whose
        # bucket need not fit these (docs/results/table1.md).
        profile_trace=ProfileTrace.run,
    )


def calibrate_model(out: Path, quick: bool, term: Any) -> Path:
    """``srtm calibrate`` on a broker run as the live brokers are, without their emulated
    server: the model of the broker itself (its base latency, its cost per message and
    per read). The live brokers' ``--capacity`` server (1/CAPACITY s a message, one per
    broker) is then put in front of it (``BrokerModel.emulated``), as ``srtm experiment
    validate`` models these brokers. Calibrated with the server in place, the model would
    fit a deterministic 1-ms server as a CPU cost and the trickle's queueing as base
    latency, counting the server twice. Written to ``out/table1-model.json``, with the
    brokers' advertised ``mcap``."""
    from dataclasses import replace

    from srtm.experiments.calibrate import CalibrationPlan, calibrate
    from srtm.sim.model import save

    plan = CalibrationPlan(
        slo_p99_ms=SLO_MS,
        step_s=1.5 if quick else 2.5,
        saturation_s=1.0 if quick else 2.0,
        broker_args=CALIBRATE_ARGS,
    )
    with progress(term, "calibrate") as update:
        model = calibrate(plan, update)
    path = out / MODEL_FILE
    save(replace(model.emulated(CAPACITY), mcap=MCAP), path)
    return path


def model_view(group: int, model: Path) -> dict[str, Any]:
    """What the controller's model says of the topic all on one idle broker, built as
    the controller builds it (``predictor_for_topic``: publishers known by rate and
    group only, the topic's profiled bucket): the simulated p99 and how many of the
    publishers, a slice of every group as fitting offers them (``balanced_order``), it
    predicts one broker keeps within its target. A model that keeps none on an idle
    broker plans nothing, and fitting falls back to the measured search."""
    from srtm.experiments.scenarios.live import profile
    from srtm.placement import BrokerCapacity
    from srtm.placement.fitting import balanced_order
    from srtm.placement.model import PublisherLoad, TopicSpec
    from srtm.sim.model import load
    from srtm.sim.predict import predictor_for_topic

    sc = scenario_for(group, FitMode.model_assisted, model)
    rate, burst = profile(sc)
    pubs = [PublisherLoad(p.id, p.rate, p.group) for p in sc.specs()]
    spec = TopicSpec(sc.topic, tuple(pubs), burst, sc.slo_p99_ms, rate)
    predict = predictor_for_topic(spec, [BrokerCapacity("1", MCAP)], load(model))
    p99, _ = predict.sims["1"].p99([p.id for p in pubs])
    return {
        "rate": rate, "burst": burst, "p99_all_on_one_ms": p99,
        "keeps": predict("1", [], balanced_order(pubs)), "publishers": len(pubs),
    }  # fmt: skip


def check_model(path: Path) -> Path:
    """``--model``: a model file ``srtm calibrate`` wrote (a UsageError if it is not)."""
    from srtm.sim.model import load

    try:
        load(path)
    except (OSError, ValueError) as exc:
        raise UsageError("--model", f"{path}: {exc}") from exc
    return path.resolve()


def run_one(sc: Scenario, out: Path, term: Any) -> FitRow:
    from srtm.experiments.scenarios import live

    with progress(term, sc.name) as update, ctrl_c_wins():
        summary = live.run(sc, "srtm", out, on_progress=update, fit_budget_s=FIT_BUDGET_S)
    meta = json.loads((out / "traces" / "runs" / f"{summary['run']}.json").read_text())
    return live_row(summary, meta.get("fitting"))


def run_live(run: RunSettings) -> Summary:
    """``srtm experiment run table1 --live``: calibrate (unless ``--model``), then each
    group size measured-only and model-assisted; the table, JSON and Markdown in
    ``run.out``."""
    started = time.monotonic()
    out = run.out
    out.mkdir(parents=True, exist_ok=True)
    groups = QUICK_GROUPS if run.quick else LIVE_GROUPS
    model = check_model(Path(run.model)) if run.model is not None else None
    if model is None:
        model = calibrate_model(out, run.quick, run.term)
    run.term.err.print(f"model-assisted fitting uses {model}")
    sim = {g: {m: sim_row(g, m) for m in FitMode} for g in groups}
    rows_live: dict[int, dict[FitMode, FitRow]] = {}
    for g in groups:
        rows_live[g] = {m: run_one(scenario_for(g, m, model), out, run.term) for m in FitMode}
    data, rows = assemble(groups, sim, rows_live)
    for g in groups:
        view = model_view(g, model)
        data["groups"][str(g)]["model_view"] = view
        run.term.err.print(
            f"groups of {g}: the model predicts p99 {view['p99_all_on_one_ms']:.1f} ms with "
            f"all {view['publishers']} publishers on one broker, and keeps {view['keeps']}",
            highlight=False,
        )
    disturbed = any(r.disturbed for by in rows_live.values() for r in by.values())
    data |= {
        "mode": "live",
        "quick": run.quick,
        "model": str(model),
        "setup": {
            "publishers": PUBLISHERS, "rate": RATE, "brokers": BROKERS, "capacity": CAPACITY,
            "mcap": MCAP, "slo_p99_ms": SLO_MS, "round_s": ROUND_S,
            "min_samples": MIN_SAMPLES, "settle_s": SETTLE_S,
        },
        "validity": "disturbed" if disturbed else "not disturbed",
        "elapsed_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    files = write(out, data, rows)
    show(data, rows, run.term)
    finished = all(
        r.outcome not in (None, "failed") and r.total >= 1 for by in rows_live.values()
        for r in by.values()
    )  # fmt: skip
    ok = finished and all(c["ok"] is not False for c in data["claims"])
    result = verdict(disturbed=disturbed, ok=ok)
    return Summary("table1", Mode.live, (json.dumps(data),), result, files)


def write(out: Path, data: Mapping[str, Any], rows: Sequence[Sequence[str]]) -> tuple[Path, ...]:
    js = out / "table1-live.json"
    js.write_text(json.dumps(data, indent=2))
    md = out / "table1-live.md"
    lines = [
        "# Table I live: online fitting rounds (rounds per iteration (total) · time → brokers)",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        f"Validity: {data['validity']}.",
    ]
    md.write_text("\n".join(lines) + "\n")
    return (js, md)


def show(data: Mapping[str, Any], rows: Sequence[Sequence[str]], term: Any) -> None:
    from rich.table import Table

    table = Table(
        title=f"Table I live: rounds per iteration (total) · time → brokers ({data['validity']})"
    )
    for col in COLUMNS:
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    term.out.print(table)
    for c in data["claims"]:
        mark = {True: "[green]✓[/green]", False: "[red]✗[/red]", None: "[yellow]?[/yellow]"}
        term.err.print(f"{mark[c['ok']]} {c['paper']}: {c['live']}")


__all__ = ["FitMode", "FitRow", "assemble", "run_live"]
