"""The utility paper's control loops over time, simulated second by second (pure, seeded):
what the per-stage simulation (``srtm.experiments.utility.sim``) leaves out.

Every ``optimizer_s`` the greedy optimizer (``srtm.utility.optimize``) sets the rates and
admitted counts; every second in between rate control (``srtm.utility.ratecontrol``)
moves the rates by congestion; the broker's "measured" CPU is a truth the model does not
know, and the model is corrected online by measured ÷ predicted (``srtm.utility.cost
.correct``, the paper's proportional error correction); reliable flows log every message
to one disk (``srtm.utility.storage.Logger``) and their producers wait for each
acknowledgement, so the disk's latency caps what they can send, and the optimizer caps
their ``r_max`` at the rate their producers reach on the disk (``storage.reachable_rate``,
the write time inferred from the latency measured at the load measured; §III-C).

What is ours, not the paper's (it gives none of these): the truth (each flow's measured
CPU is ``truth[flow]`` times its model, plus ``connect_cpu`` per consumer joining or
leaving in that second, plus seeded ``noise``), consumers joining at most ``join_per_s``
a second (leaving at once), the logger's write time and bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from srtm.utility import cost
from srtm.utility.optimizer import FlowKind, FlowSpec, Problem, optimize
from srtm.utility.ratecontrol import FULL_BAND, control_step, pressure
from srtm.utility.storage import (
    LatencyEstimate,
    Logger,
    closed_loop_rates,
    reachable_rate,
    unloaded_write_s,
)

BROKER = "b1"
CPU = "cpu"

Key = tuple[str, str]


@dataclass(frozen=True)
class Reliable:
    """A reliable flow: ``producers`` each wait for their message's acknowledgement, and
    every message is logged once for the flow and once per consumer (its channel's
    durable queue), ``record_bytes`` each."""

    producers: int
    record_bytes: float


@dataclass(frozen=True)
class Phase:
    """From ``start_s``: consumers available per (flow, class), and the rate each flow's
    producers offer (a flow not named offers its ``r_max``)."""

    name: str
    start_s: float
    available: Mapping[Key, int]
    offered: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Timeline:
    """Flows with their declared (modelled) costs, one broker's CPU capacity, the stages,
    the truth, reliable flows and their logger, and a fixed load outside the optimizer
    (CPU in the capacity's units, bytes/s on the logger)."""

    name: str
    flows: tuple[FlowSpec, ...]
    capacity: float
    stages: tuple[Phase, ...]
    duration_s: int
    truth: Mapping[str, float]
    reliable: Mapping[str, Reliable] = field(default_factory=dict)
    logger: Logger | None = None
    background_cpu: float = 0.0
    background_bps: float = 0.0


@dataclass(frozen=True)
class Loops:
    """The loops and the truth's extras (ours)."""

    optimizer_s: int = 20
    correct: bool = True
    bound: bool = True
    connect_cpu: float = 0.01
    join_per_s: int = 50
    noise: float = 0.02
    seed: int = 0


@dataclass(frozen=True)
class Tick:
    """One second: the rates allowed and reached, admitted and connected consumers, the
    CPU measured and predicted (by the model as declared, and as corrected), the
    correction's scale, the logger's latency and each reliable flow's bound."""

    t_s: int
    stage: str
    allowed: dict[str, float]
    rates: dict[str, float]
    admitted: dict[Key, int]
    connected: dict[Key, int]
    cpu: float
    predicted: float
    scale: float
    latency_s: float
    bounds: dict[str, float]
    utility: float

    @property
    def ratio(self) -> float:
        """The paper's correction ratio: measured ÷ the declared model's prediction."""
        return self.cpu / self.predicted if self.predicted > 0 else math.nan


def modelled_cpu(
    flows: tuple[FlowSpec, ...], rates: Mapping[str, float], consumers: Mapping[Key, int]
) -> dict[str, float]:
    """Per flow, its declared model's CPU: ``A·r + Σ_j B_j·r·n_j``."""
    out = {}
    for f in flows:
        per = f.cost.get(CPU, 0.0) + math.fsum(
            c.cost.get(CPU, 0.0) * consumers.get((f.name, c.name), 0) for c in f.classes
        )
        out[f.name] = per * rates.get(f.name, 0.0)
    return out


def _utility(
    flows: tuple[FlowSpec, ...], rates: Mapping[str, float], n: Mapping[Key, int]
) -> float:
    total = 0.0
    for f in flows:
        r = rates.get(f.name, 0.0)
        if f.kind is FlowKind.ONE_TO_MANY:
            total += math.fsum(n.get((f.name, c.name), 0) * c.utility.value(r) for c in f.classes)
        elif r >= f.r_min and f.utility is not None:
            total += f.utility.value(r)
    return total


class Simulation:
    """One scenario run second by second (``run``)."""

    def __init__(self, scenario: Timeline, knobs: Loops = Loops()) -> None:
        self.s = scenario
        self.k = knobs
        self.rng = random.Random(knobs.seed)
        self.scale = 1.0
        self.allowed = {f.name: f.r_min for f in scenario.flows}
        self.admitted: dict[Key, int] = {}
        self.connected: dict[Key, int] = {}
        self.problem: Problem | None = None
        self.last_cpu = 0.0
        self.last_rates: dict[str, float] = {}
        #: The logger's unloaded write time, estimated from the latency measured at the
        #: load measured.
        self.latency = LatencyEstimate()

    def stage_at(self, t: int) -> Phase:
        return [s for s in self.s.stages if s.start_s <= t][-1]

    def per_message(self, name: str) -> float:
        """Bytes a reliable flow's message costs the logger: its record, and one per
        consumer connected (each channel's durable queue)."""
        n = sum(v for (fl, _), v in self.connected.items() if fl == name)
        return self.s.reliable[name].record_bytes * (1 + n)

    def bounds(self) -> dict[str, float]:
        """Each reliable flow's ``r_max`` capped at the rate its producers reach on the
        logger (``storage.reachable_rate``), from the write time estimated so far and
        the load the others put on it (none before the first estimate)."""
        out: dict[str, float] = {}
        if not self.k.bound or self.s.logger is None or self.latency.value_s is None:
            return out
        w = self.s.logger.bandwidth_bps
        for f in self.s.flows:
            rel = self.s.reliable.get(f.name)
            if rel is None:
                continue
            others = self.s.background_bps + math.fsum(
                self.last_rates.get(g, 0.0) * self.per_message(g)
                for g in self.s.reliable
                if g != f.name
            )
            reach = reachable_rate(rel.producers, self.latency.value_s, w,
                                   self.per_message(f.name), others)  # fmt: skip
            out[f.name] = max(f.r_min, min(f.r_max, reach))
        return out

    def build(self, stage: Phase) -> Problem:
        bounds = self.bounds()
        flows = []
        for f in self.s.flows:
            classes = tuple(
                dataclasses.replace(
                    c,
                    available=stage.available.get((f.name, c.name), 0),
                    cost={k: v * self.scale for k, v in c.cost.items()},
                )
                for c in f.classes
            )
            flows.append(dataclasses.replace(
                f, r_max=bounds.get(f.name, f.r_max), classes=classes,
                cost={k: v * self.scale for k, v in f.cost.items()},
            ))  # fmt: skip
        cap = max(0.0, self.s.capacity - self.s.background_cpu * self.scale)
        return Problem(tuple(flows), {BROKER: {CPU: cap}})

    def control(self) -> None:
        """One rate-control step: congested or full by the CPU measured (corrected runs:
        the paper's rate control sees real utilisation) or by the declared model."""
        assert self.problem is not None
        cap = self.problem.capacity
        use = {BROKER: {CPU: self.last_cpu - self.s.background_cpu * self.scale}}
        over, full = pressure(use, cap, FULL_BAND)
        self.allowed = control_step(self.problem, self.allowed, self.admitted, over, full=full)

    def reach(self, stage: Phase) -> tuple[dict[str, float], float]:
        """The rates the flows reach (at most allowed and offered; reliable ones against
        the logger) and the logger's latency."""
        rates = {
            f.name: min(self.allowed[f.name], stage.offered.get(f.name, f.r_max))
            for f in self.s.flows
        }
        if self.s.logger is None or not self.s.reliable:
            return rates, 0.0
        per_msg = {name: self.per_message(name) for name in self.s.reliable}
        got, latency = closed_loop_rates(
            self.s.logger,
            {f: rates[f] for f in self.s.reliable},
            {f: r.producers for f, r in self.s.reliable.items()},
            per_msg,
            self.s.background_bps,
        )
        return rates | got, latency

    def join(self) -> int:
        """Connected consumers move toward the admitted counts (leaving at once, joining
        at most ``join_per_s`` a class); the number that came or went."""
        moved = 0
        for key in {*self.admitted, *self.connected}:
            want, have = self.admitted.get(key, 0), self.connected.get(key, 0)
            new = want if want <= have else min(want, have + self.k.join_per_s)
            moved += abs(new - have)
            self.connected[key] = new
        return moved

    def step(self, t: int) -> Tick:
        stage = self.stage_at(t)
        if t % self.k.optimizer_s == 0:
            self.problem = self.build(stage)
            alloc = optimize(self.problem)
            self.allowed, self.admitted = dict(alloc.rates), dict(alloc.admitted)
        else:
            self.control()
        moved = self.join()
        rates, latency = self.reach(stage)
        # The model predicts from the allocation (admitted counts), as the optimizer
        # plans; the truth runs on the consumers connected so far.
        model = math.fsum(modelled_cpu(self.s.flows, rates, self.admitted).values())
        true = math.fsum(
            self.s.truth.get(name, 1.0) * c
            for name, c in modelled_cpu(self.s.flows, rates, self.connected).items()
        )
        noise = 1.0 + self.rng.gauss(0.0, self.k.noise)
        measured = max(0.0, (true + self.s.background_cpu) * noise + self.k.connect_cpu * moved)
        predicted = model + self.s.background_cpu
        if self.k.correct:
            shell = cost.CostModel(0.0, 0.0, scale=self.scale)
            self.scale = cost.correct(shell, measured, self.scale * predicted).scale
        if self.s.logger is not None and self.s.reliable:
            load = self.s.background_bps + math.fsum(
                rates[g] * self.per_message(g) for g in self.s.reliable
            )
            write_s = unloaded_write_s(latency, load, self.s.logger.bandwidth_bps)
            if write_s is not None:
                self.latency.update(write_s)
        self.last_rates = rates
        self.last_cpu = measured if self.k.correct else predicted
        return Tick(
            t, stage.name, dict(self.allowed), rates, dict(self.admitted), dict(self.connected),
            measured, predicted, self.scale, latency, self.bounds(),
            _utility(self.s.flows, rates, self.connected),
        )  # fmt: skip

    def run(self) -> list[Tick]:
        return [self.step(t) for t in range(self.s.duration_s)]


def run(scenario: Timeline, knobs: Loops = Loops()) -> list[Tick]:
    """The scenario second by second."""
    return Simulation(scenario, knobs).run()


def window(ticks: list[Tick], start: float, end: float) -> list[Tick]:
    """The ticks with ``start <= t < end``."""
    return [t for t in ticks if start <= t.t_s < end]


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan
