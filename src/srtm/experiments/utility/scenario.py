"""The utility-aware allocation paper's experiments (Bhola et al., seed 002, §V) at the
small scale the live runs use: the flows, classes, populations and costs of each stage as
``srtm utility optimize`` documents (FLOWS.json flows), and the optimizer's plan for them.

Pure: no I/O. ``srtm.experiments.utility.live`` runs these stages on local brokers.

Scaled down from the paper (``sim``): consumers 1/25 of the paper's (gold 12,
silver 24, bronze 48 over four flows; latency effects 8 to 40 gold consumers), rates 1/4
(2.5–50 msg/s instead of 10–200; excess capacity 35 of 50 wanted, the drop to 12.5),
the request-response flow the paper's (20 clients, 33.3–203.7 msg/s). The costs are CPU
seconds per message (A per publish, B per delivery; ours, a rough figure for this
broker, not the paper's) and the capacity a fraction of a core chosen, as the sim's, so
that the broker is short: all gold and some silver fit at ``r_max``, every bronze only at
a lower rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from srtm.experiments.utility.sim import CLASSES, SEGMENTS, SLOPES
from srtm.utility import Allocation, Problem, optimize, parse_problem

BROKER = "1"
CPU = "cpu"
#: CPU seconds per message published (A) and per message delivered to a consumer (B):
#: ours, of the order this broker spent in a first trading-day run (0.10–0.16 core for
#: 1,200–1,400 deliveries a second, idle consumers' retries included); the controller
#: may correct them online.
A_PUBLISH = 100e-6
B_DELIVERY = 62.5e-6
#: The request-response flow: a request and its reply per message.
A_REQUEST_RESPONSE = 2 * A_PUBLISH

#: Trading day, scaled: consumers per class over the four flows, and the rate range.
SECTORS = 4
TOTALS = {"gold": 12, "silver": 24, "bronze": 48}
R_MIN, R_MAX = 2.5, 50.0
#: A fraction of a core: gold and about half the silver fit at r_max (the sim's 279 of
#: 400 silver at capacity 100); with only bronze every flow falls to about 30 msg/s.
TRADING_CAPACITY = 0.1

#: Excess capacity, scaled: 4 one-class flows of EXCESS_CONSUMERS each, 35 of 50 msg/s
#: allocated (the paper's 140 of 200), flow 0's producers dropping to 12.5 (its 50).
EXCESS_CONSUMERS = 4
EXCESS_ALLOCATED = 35.0
EXCESS_DROPPED = 12.5

#: Latency effects, scaled: gold consumers 8..40 (the paper's 200..1000) on a flow at a
#: fixed rate, and the paper's request-response flow.
LATENCY_STEPS = (8, 16, 24, 32, 40)
LATENCY_GOLD_RATE = 42.0
RR_DOC = {"clients": 20, "think_ms": 100, "exec_ms": 8, "deadline_ms": 500, "c": 6000}


@dataclass(frozen=True)
class FlowDecl:
    """One flow in one stage: its utility document (a FLOWS.json flow without name and
    brokers: what ``POST /topics`` takes as ``utility``), its producers' rate and the
    consumers wanting to subscribe per class."""

    name: str
    utility: dict[str, Any]
    produce: float
    consumers: dict[str, int]


@dataclass(frozen=True)
class Stage:
    name: str
    flows: tuple[FlowDecl, ...]


@dataclass(frozen=True)
class LiveExperiment:
    name: str
    title: str
    cpu_capacity: float
    classes: tuple[str, ...]
    stages: tuple[Stage, ...]
    #: Anything the verdicts need (scaled r_max, allocated, steps, …).
    params: dict[str, Any] = field(default_factory=dict)


def _one_to_many(r_min: float, r_max: float, available: Mapping[str, int],
                 slopes: Mapping[str, float]) -> dict[str, Any]:  # fmt: skip
    return {
        "kind": "one-to-many", "r_min": r_min, "r_max": r_max, "cost": {CPU: A_PUBLISH},
        "classes": [{"name": c, "available": n, "utility": {"slope": slopes[c]},
                     "cost": {CPU: B_DELIVERY}} for c, n in available.items()],
    }  # fmt: skip


def _spread(total: int, percent: int, sectors: int = SECTORS) -> list[int]:
    n = total * percent // 100
    return [n // sectors + (1 if i < n % sectors else 0) for i in range(sectors)]


def trading_day(capacity: float = TRADING_CAPACITY) -> LiveExperiment:
    stages = []
    for name, percents in SEGMENTS:
        per = {c: _spread(TOTALS[c], p) for c, p in zip(CLASSES, percents, strict=True)}
        flows = []
        for i in range(SECTORS):
            avail = {c: per[c][i] for c in CLASSES}
            flows.append(FlowDecl(f"sector-{i}", _one_to_many(R_MIN, R_MAX, avail, SLOPES),
                                  R_MAX, avail))  # fmt: skip
        stages.append(Stage(name, tuple(flows)))
    return LiveExperiment(
        "trading-day", f"Trading day, live: 4 flows, CPU capacity {capacity:g} core",
        capacity, CLASSES, tuple(stages), {"r_max": R_MAX},
    )  # fmt: skip


def excess_default() -> float:
    """The capacity at which four flows of EXCESS_CONSUMERS each get EXCESS_ALLOCATED."""
    return SECTORS * EXCESS_ALLOCATED * (A_PUBLISH + EXCESS_CONSUMERS * B_DELIVERY)


def excess_capacity(capacity: float | None = None) -> LiveExperiment:
    cap = excess_default() if capacity is None else capacity
    stages = []
    for name, first in ((f"all producers at {R_MAX:g} msg/s", R_MAX),
                        (f"flow 0 drops to {EXCESS_DROPPED:g} msg/s", EXCESS_DROPPED)):  # fmt: skip
        flows = []
        for i in range(SECTORS):
            r_max = first if i == 0 else R_MAX
            avail = {"gold": EXCESS_CONSUMERS}
            flows.append(FlowDecl(f"flow-{i}", _one_to_many(R_MIN, r_max, avail, {"gold": 1.0}),
                                  r_max, avail))  # fmt: skip
        stages.append(Stage(name, tuple(flows)))
    return LiveExperiment(
        "excess-capacity", f"Excess capacity, live: CPU capacity {cap:.4g} core", cap,
        ("gold",), tuple(stages),
        {"r_max": R_MAX, "allocated": EXCESS_ALLOCATED, "dropped": EXCESS_DROPPED},
    )  # fmt: skip


def latency_default() -> float:
    """Ours: the request-response flow near r_max up to 16 gold consumers, about 36 of
    40 admitted with it at r_min (the sim's 400 and 900 of 1,000)."""
    rr_min = 20 / 0.6  # N / (D + think): the paper's r_min, 33.33
    gold = 36 * LATENCY_GOLD_RATE * B_DELIVERY + LATENCY_GOLD_RATE * A_PUBLISH
    return gold + rr_min * A_REQUEST_RESPONSE


def latency_effects(capacity: float | None = None) -> LiveExperiment:
    cap = latency_default() if capacity is None else capacity
    stages = []
    for n in LATENCY_STEPS:
        gold = _one_to_many(LATENCY_GOLD_RATE, LATENCY_GOLD_RATE, {"gold": n}, SLOPES)
        rr = {"kind": "request-response", "rr": dict(RR_DOC), "cost": {CPU: A_REQUEST_RESPONSE}}
        flows = (
            FlowDecl("gold-flow", gold, LATENCY_GOLD_RATE, {"gold": n}),
            FlowDecl("rr-flow", rr, 20 / 0.108 * 1.1, {"server": 1}),
        )
        stages.append(Stage(f"{n} consumers", flows))
    return LiveExperiment(
        "latency-effects", f"Latency effects, live: CPU capacity {cap:.4g} core", cap,
        ("gold",), tuple(stages), {"steps": LATENCY_STEPS, "rr": RR_DOC},
    )  # fmt: skip


EXPERIMENTS = {
    "trading-day": trading_day,
    "excess-capacity": excess_capacity,
    "latency-effects": latency_effects,
}


def problem(exp: LiveExperiment, stage: Stage) -> Problem:
    """The stage as ``srtm utility optimize`` reads it (one broker)."""
    doc = {
        "brokers": [{"id": BROKER, "capacity": {CPU: exp.cpu_capacity}}],
        "flows": [{"name": f.name, **f.utility} for f in stage.flows],
    }
    return parse_problem(doc)


def plan(exp: LiveExperiment, stage: Stage) -> Allocation:
    """The optimizer's allocation for the stage: what the live run should come near."""
    return optimize(problem(exp, stage))
