"""A live scenario in the simulator (``srtm experiment run SCENARIO --sim``): the same
workload schedule, topic bucket, brokers (``--capacity`` emulated) and SLO, placed by each
policy and fitted by simulated rounds (``srtm.sim.scenario.predict``), on a broker model
whose base latency stands in for the machine's own. With the shipped ``paper`` model
(0.4 ms base) it says what a scenario shows where the machine adds the paper's latency
rather than this machine's: the rest of a comparison the machine cannot hold live at
its SLO (the 1 ms one, docs/results/live.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from srtm.experiments.scenarios.scenario import Scenario
from srtm.placement import Policy

#: The broker model the simulated scenarios use.
MODEL = "paper"


@dataclass(frozen=True)
class SimulatedPolicy:
    """One policy's simulated run of a scenario."""

    policy: Policy
    p50_ms: float
    p95_ms: float
    p99_ms: float
    #: p99 of the token wait alone (the DRL penalty's tail).
    token_p99_ms: float
    brokers_used: int
    fitting_rounds: tuple[int, ...]
    #: The worst broker's p99: the SLO must hold on each.
    worst_broker_p99_ms: float
    #: Publishers fitting left without a broker (their messages are not simulated).
    unplaced_publishers: int
    #: How fitting ended (``FitOutcome``'s value; None: not fitted).
    fitting_outcome: str | None
    #: p99 within the SLO on every broker, with every publisher placed.
    within_slo: bool

    def to_json(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["fitting_rounds"] = list(self.fitting_rounds)
        return doc


def simulate(sc: Scenario, policies: Sequence[Policy], model: str = MODEL) -> list[SimulatedPolicy]:
    """``sc`` under each of ``policies`` in the simulator with broker ``model``."""
    from srtm.experiments.scenarios.live import profile
    from srtm.ratelimit import BucketParams
    from srtm.sim.model import load
    from srtm.sim.scenario import LiveSetup, predict

    rate, burst = profile(sc)
    setup = LiveSetup(
        sc.specs(), BucketParams(rate, burst), sc.slo_p99_ms, sc.brokers, sc.capacity,
        sc.mcap, sc.spread_ms / 1e3, sc.seed, sc.duration_s,
        {str(p.broker): p.rate for p in sc.preload},
        sc.fit.window_s if sc.fit else None,
    )  # fmt: skip
    broker_model = load(model)
    out = []
    for policy in policies:
        done = predict(setup, broker_model, policy)
        runs = [r for r in done.result.brokers.values() if r.stats.messages]
        worst = max((r.stats.p99_ms for r in runs), default=float("nan"))
        topic = done.result.topic
        held = topic.p99_ms <= sc.slo_p99_ms and worst <= sc.slo_p99_ms and not done.unplaced
        outcome = None if done.fitting_outcome is None else done.fitting_outcome.value
        out.append(
            SimulatedPolicy(
                policy, topic.p50_ms, topic.p95_ms, topic.p99_ms, topic.token_p99_ms,
                len(runs), done.fitting_rounds, worst, len(done.unplaced), outcome, held,
            )
        )  # fmt: skip
    return out


def document(sc: Scenario, rows: Sequence[SimulatedPolicy], model: str = MODEL) -> dict[str, Any]:
    """The simulated comparison as one JSON document (what ``--json`` prints)."""
    return {
        "scenario": sc.name,
        "mode": "sim",
        "model": model,
        "slo_p99_ms": sc.slo_p99_ms,
        "capacity": sc.capacity,
        "policies": {r.policy: r.to_json() for r in rows},
    }


def table(sc: Scenario, rows: Sequence[SimulatedPolicy], model: str = MODEL) -> Table:
    t = Table(title=f"{sc.name}, simulated ({model} model): SLO p99 ≤ {sc.slo_p99_ms:g} ms")
    for col in ("policy", "p50 ms", "p95 ms", "p99 ms", "token p99 ms", "worst broker p99",
                "brokers", "unplaced", "rounds", "fitting", "SLO"):  # fmt: skip
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        t.add_row(
            r.policy, f"{r.p50_ms:.2f}", f"{r.p95_ms:.2f}", f"{r.p99_ms:.2f}",
            f"{r.token_p99_ms:.2f}", f"{r.worst_broker_p99_ms:.2f}", str(r.brokers_used),
            str(r.unplaced_publishers), " + ".join(map(str, r.fitting_rounds)) or "-",
            r.fitting_outcome or "-", "met" if r.within_slo else "missed",
        )  # fmt: skip
    return t


def save(out: Path, sc: Scenario, doc: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{sc.name}-sim.json"
    path.write_text(json.dumps(doc, indent=2))
    return path
