"""The greedy benefit/cost optimizer of Bhola et al. (§IV-B), pure.

Start with every flow at ``r_min`` and no consumers admitted; repeatedly raise the variable
(a flow's rate, or a class's admitted consumers) with the highest ratio of benefit (the
increase of total utility) to cost (the increase of the primary resource's consumption),
keeping every constraint; stop when no feasible increase has positive benefit. Run once
per resource taken as primary and keep the run with the best utility.

Choices the paper leaves open (docs/utility.md lists them):

- step sizes: a rate moves to its flow's next utility breakpoint (its benefit/cost ratio is
  constant there) or by ``rate_step``; a class admits as many consumers as fit (its ratio
  does not depend on its count) or ``consumer_step``;
- several brokers: a flow's load is spread over its brokers by fixed shares; a primary is
  a resource kind (each broker's use weighted by 1/capacity) or one broker's resource;
- ties (ratios within 1e-9): the tied variables move in turn, each at most its share of
  every constraint's slack, so equal flows grow equally;
- variables whose primary cost is zero go first (their ratio is infinite).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from srtm.utility.model import Utility

_TIE = 1e-9
_SLACK = 1e-9  # relative tolerance of a constraint


class FlowKind(StrEnum):
    ONE_TO_ONE = "one-to-one"
    ONE_TO_MANY = "one-to-many"
    REQUEST_RESPONSE = "request-response"


@dataclass(frozen=True)
class ConsumerClass:
    """Consumers of one class of a one-to-many flow: each earns ``utility(r)``; each costs
    ``cost[resource] · r`` (the paper's B_j for CPU; the message size for network)."""

    name: str
    utility: Utility
    available: int
    cost: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FlowSpec:
    """A flow (topic): rate bounds, per-message ``cost`` per resource (A_i for CPU), the
    utility of one-to-one and request-response flows, the classes of a one-to-many flow,
    and the share of its load each broker carries."""

    name: str
    kind: FlowKind
    r_min: float
    r_max: float
    cost: Mapping[str, float]
    shares: Mapping[str, float]
    utility: Utility | None = None
    classes: tuple[ConsumerClass, ...] = ()


@dataclass(frozen=True)
class Problem:
    """Flows and the brokers' capacities, ``capacity[broker][resource]`` (a resource a
    broker does not list is unlimited there)."""

    flows: tuple[FlowSpec, ...]
    capacity: Mapping[str, Mapping[str, float]]

    def constraints(self) -> list[tuple[str, str]]:
        return [(b, res) for b, caps in self.capacity.items() for res in caps]


@dataclass(frozen=True)
class Allocation:
    """The optimizer's answer: rates per flow, admitted consumers per (flow, class)."""

    rates: dict[str, float]
    admitted: dict[tuple[str, str], int]
    utility: float
    primary: str
    runs: tuple[tuple[str, float], ...]
    feasible: bool
    steps: int

    def usage(self, problem: Problem) -> dict[tuple[str, str], float]:
        return usage(problem, self.rates, self.admitted)


def flow_utility(flow: FlowSpec, rate: float, admitted: Mapping[tuple[str, str], int]) -> float:
    if flow.kind is FlowKind.ONE_TO_MANY:
        return math.fsum(
            admitted.get((flow.name, c.name), 0) * c.utility.value(rate) for c in flow.classes
        )
    assert flow.utility is not None
    return flow.utility.value(rate)


def total_utility(
    problem: Problem, rates: Mapping[str, float], admitted: Mapping[tuple[str, str], int]
) -> float:
    return math.fsum(flow_utility(f, rates[f.name], admitted) for f in problem.flows)


def _rate_coef(flow: FlowSpec, resource: str, admitted: Mapping[tuple[str, str], int]) -> float:
    """The coefficient of r in the flow's use of ``resource``: A + Σ_j B_j·n_j."""
    return flow.cost.get(resource, 0.0) + math.fsum(
        c.cost.get(resource, 0.0) * admitted.get((flow.name, c.name), 0) for c in flow.classes
    )


def usage(
    problem: Problem, rates: Mapping[str, float], admitted: Mapping[tuple[str, str], int]
) -> dict[tuple[str, str], float]:
    """Use of every constrained (broker, resource): Σ_i share·(A_i·r + Σ_j B_j·r·n_j)."""
    out = {key: 0.0 for key in problem.constraints()}
    for flow in problem.flows:
        for broker, share in flow.shares.items():
            for resource in problem.capacity.get(broker, {}):
                coef = _rate_coef(flow, resource, admitted)
                out[(broker, resource)] += share * coef * rates[flow.name]
    return out


@dataclass(frozen=True)
class _Var:
    flow: int
    cls: int | None  # None: the flow's rate


class _GreedyRun:
    """One greedy run with one primary: weights per (broker, resource)."""

    def __init__(
        self,
        problem: Problem,
        weights: Mapping[tuple[str, str], float],
        rate_step: float | None,
        consumer_step: int | None,
    ) -> None:
        self.p = problem
        self.weights = weights
        self.rate_step = rate_step
        self.consumer_step = consumer_step
        self.rates = {f.name: f.r_min for f in problem.flows}
        self.admitted = {(f.name, c.name): 0 for f in problem.flows for c in f.classes}
        self.used = usage(problem, self.rates, self.admitted)
        self.steps = 0
        self.vars = [
            _Var(i, j) for i, f in enumerate(problem.flows) for j in [None, *range(len(f.classes))]
        ]

    # The increase of the use of each constrained resource per unit of the variable.
    def _unit_use(self, v: _Var) -> dict[tuple[str, str], float]:
        flow = self.p.flows[v.flow]
        out = {}
        for broker, share in flow.shares.items():
            for resource in self.p.capacity.get(broker, {}):
                if v.cls is None:
                    coef = _rate_coef(flow, resource, self.admitted)
                else:
                    coef = flow.classes[v.cls].cost.get(resource, 0.0) * self.rates[flow.name]
                if share * coef > 0:
                    out[(broker, resource)] = share * coef
        return out

    def _unit_benefit(self, v: _Var) -> float:
        flow = self.p.flows[v.flow]
        rate = self.rates[flow.name]
        if v.cls is not None:
            return flow.classes[v.cls].utility.value(rate)
        if flow.kind is not FlowKind.ONE_TO_MANY:
            assert flow.utility is not None
            return flow.utility.slope(rate)
        return math.fsum(
            self.admitted[(flow.name, c.name)] * c.utility.slope(rate) for c in flow.classes
        )

    def _room(self, v: _Var) -> float:
        """How far ``v`` may rise before its ratio changes (breakpoint, class size, step)."""
        flow = self.p.flows[v.flow]
        if v.cls is not None:
            c = flow.classes[v.cls]
            left = c.available - self.admitted[(flow.name, c.name)]
            return float(left if self.consumer_step is None else min(left, self.consumer_step))
        rate = self.rates[flow.name]
        utilities = [c.utility for c in flow.classes] if flow.utility is None else [flow.utility]
        ends = [r for u in utilities for r in u.rates() if r > rate * (1 + 1e-12)]
        end = min([flow.r_max, *ends])
        room = max(0.0, end - rate)
        return room if self.rate_step is None else min(room, self.rate_step)

    def _slack(self) -> dict[tuple[str, str], float]:
        return {
            key: max(0.0, self.p.capacity[key[0]][key[1]] * (1 + _SLACK) - used)
            for key, used in self.used.items()
        }

    def _fits(
        self, unit: Mapping[tuple[str, str], float], allowance: Mapping[tuple[str, str], float]
    ) -> float:
        """The largest amount whose use stays within the allowance and the slack."""
        slack = self._slack()
        return min(
            (min(slack[key], allowance.get(key, math.inf)) / per for key, per in unit.items()),
            default=math.inf,
        )

    def _ratio(self, v: _Var, unit: Mapping[tuple[str, str], float]) -> float:
        cost = math.fsum(self.weights.get(k, 0.0) * per for k, per in unit.items())
        benefit = self._unit_benefit(v)
        return math.inf if cost <= 0 else benefit / cost

    def _step(self, v: _Var, allowance: Mapping[tuple[str, str], float]) -> bool:
        """Raise ``v`` as far as its room, the allowance and every slack allow."""
        unit = self._unit_use(v)
        amount = min(self._room(v), self._fits(unit, allowance))
        flow = self.p.flows[v.flow]
        if v.cls is not None:
            amount = math.floor(amount + 1e-9)
            if amount < 1:
                return False
            key = (flow.name, flow.classes[v.cls].name)
            self.admitted[key] += int(amount)
        else:
            if amount <= 1e-9 * max(1.0, flow.r_max):
                return False
            room = self._room(v)
            rate = self.rates[flow.name] + amount
            if amount >= room * (1 - 1e-12):  # land on the breakpoint itself
                rate = self.rates[flow.name] + room
            self.rates[flow.name] = min(rate, flow.r_max)
        self.used = usage(self.p, self.rates, self.admitted)
        self.steps += 1
        return True

    def run(self, max_steps: int) -> None:
        while self.steps < max_steps:
            scored = []
            for v in self.vars:
                if self._room(v) <= 0 or self._unit_benefit(v) <= 0:
                    continue
                unit = self._unit_use(v)
                need = 1.0 if v.cls is not None else 1e-9 * max(1.0, self.p.flows[v.flow].r_max)
                if self._fits(unit, {}) < need:
                    continue
                scored.append((self._ratio(v, unit), v))
            if not scored:
                return
            best = max(s for s, _ in scored)
            tied = [
                v
                for s, v in scored
                if s == best or (0 < best < math.inf and s >= best * (1 - _TIE))
            ]
            # Each tied variable may take its share of the slack as the round starts, so
            # equal flows grow equally (the paper's fairness among identical ratios).
            share = {k: s / len(tied) for k, s in self._slack().items()}
            moved = [self._step(v, share) for v in tied]
            # A share too small for a whole consumer: one at a time, in order.
            if not any(moved) and not any(self._step(v, {}) for v in tied):
                return


def primaries(problem: Problem) -> list[tuple[str, dict[tuple[str, str], float]]]:
    """Each resource kind (every broker's use weighted by 1/capacity), then each broker's
    resource on its own when there are several brokers."""
    keys = [k for k in problem.constraints() if problem.capacity[k[0]][k[1]] > 0]
    kinds = sorted({res for _, res in keys})
    out = [(kind, {k: 1.0 / problem.capacity[k[0]][k[1]] for k in keys if k[1] == kind})
           for kind in kinds]  # fmt: skip
    if len({b for b, _ in keys}) > 1:
        out += [(f"{b}.{res}", {(b, res): 1.0 / problem.capacity[b][res]}) for b, res in keys]
    return out or [("none", {})]


def optimize(
    problem: Problem,
    *,
    rate_step: float | None = None,
    consumer_step: int | None = None,
    max_steps: int = 1_000_000,
) -> Allocation:
    """The best of the greedy runs, one per primary; deterministic (ties between runs go to
    the first primary in ``primaries``' order). ``feasible`` is False when the minimum
    rates alone exceed a capacity: then nothing is raised and the rates stay at r_min."""
    if rate_step is not None and not rate_step > 0:
        raise ValueError(f"rate_step must be > 0, got {rate_step}")
    if consumer_step is not None and consumer_step < 1:
        raise ValueError(f"consumer_step must be >= 1, got {consumer_step}")
    best: _GreedyRun | None = None
    best_name = ""
    runs = []
    start = _GreedyRun(problem, {}, rate_step, consumer_step)
    feasible = all(start.used[k] <= problem.capacity[k[0]][k[1]] * (1 + _SLACK) for k in start.used)
    for name, weights in primaries(problem):
        run = _GreedyRun(problem, weights, rate_step, consumer_step)
        if feasible:
            run.run(max_steps)
        value = total_utility(problem, run.rates, run.admitted)
        runs.append((name, value))
        if best is None or value > total_utility(problem, best.rates, best.admitted):
            best, best_name = run, name
    assert best is not None
    return Allocation(
        rates=dict(best.rates),
        admitted=dict(best.admitted),
        utility=total_utility(problem, best.rates, best.admitted),
        primary=best_name,
        runs=tuple(runs),
        feasible=feasible,
        steps=best.steps,
    )
