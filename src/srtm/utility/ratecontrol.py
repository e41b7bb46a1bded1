"""Rate control between optimizer runs (Bhola et al., §IV-C), pure: every second each
flow's rate moves by what its brokers' congestion says, and each optimizer run snaps the
rates back to its own.

- A flow whose brokers are all uncongested **raises** its rate by
  ``up_gain · (r_max − r_min) · min(1, U'(r) / Ū')``: proportional to its marginal utility
  ``U'(r)`` (with its admitted consumers), normalised by its average slope ``Ū'`` over
  ``[r_min, r_max]`` so that the step does not depend on the utility's units. A flow at
  ``r_max``, or with no admitted consumer, has no marginal utility and does not rise.
- A flow with a share on a congested broker **lowers** its rate by
  ``rate · min(down_max, down_gain · load)``, where ``load`` is its cost coefficient
  (``A + Σ_j B_j·n_j``) times its rate, as a fraction of each congested resource's
  capacity, summed over them: the flows that cost most yield most.
- Never outside ``[r_min, r_max]``.

The constants (``RateControlSettings``' defaults) and why:

- ``up_gain = 0.05``: at the steepest, 5 % of the range per step, so a flow climbs its
  whole range in 20 steps: one optimizer period at 1 s steps. Between two runs rate
  control can take back at most what the optimizer would give, and rises slowly enough
  that a broker's one-second congestion signal catches an overshoot early.
- ``down_gain = 1``, ``down_max = 0.25``: a flow carrying 30 % of a congested resource
  drops 30 % of its rate; no flow more than a quarter per step. Decreases are faster than
  increases (as in TCP's AIMD), because a congested broker's queues grow every second it
  stays congested; a one-flow broker over its threshold (0.85 by default) at 100 % gets
  under it in one step (·0.75).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from srtm.utility.optimizer import FlowKind, FlowSpec, Problem


@dataclass(frozen=True)
class RateControlSettings:
    up_gain: float = 0.05
    down_gain: float = 1.0
    down_max: float = 0.25

    def __post_init__(self) -> None:
        if not (self.up_gain >= 0 and self.down_gain >= 0 and 0 <= self.down_max <= 1):
            raise ValueError("up_gain, down_gain >= 0 and 0 <= down_max <= 1")


def marginal(flow: FlowSpec, rate: float, admitted: Mapping[tuple[str, str], int]) -> float:
    """``U'(r)``: the right slope of the flow's utility at ``rate`` (0 at ``r_max``)."""
    if rate >= flow.r_max:
        return 0.0
    if flow.kind is FlowKind.ONE_TO_MANY:
        return math.fsum(
            admitted.get((flow.name, c.name), 0) * c.utility.slope(rate) for c in flow.classes
        )
    assert flow.utility is not None
    return flow.utility.slope(rate)


def mean_slope(flow: FlowSpec, admitted: Mapping[tuple[str, str], int]) -> float:
    """``Ū'``: the utility's rise over ``[r_min, r_max]`` per msg/s (0 for a point)."""
    span = flow.r_max - flow.r_min
    if span <= 0:
        return 0.0

    def value(r: float) -> float:
        if flow.kind is FlowKind.ONE_TO_MANY:
            return math.fsum(
                admitted.get((flow.name, c.name), 0) * c.utility.value(r) for c in flow.classes
            )
        assert flow.utility is not None
        return flow.utility.value(r)

    return (value(flow.r_max) - value(flow.r_min)) / span


def congested_load(
    flow: FlowSpec,
    rate: float,
    admitted: Mapping[tuple[str, str], int],
    capacity: Mapping[str, Mapping[str, float]],
    congested: Mapping[str, frozenset[str]],
) -> float:
    """The flow's use of every congested (broker, resource) as a fraction of its
    capacity, summed (0: it uses no congested resource)."""
    out = 0.0
    for broker, share in flow.shares.items():
        for resource in congested.get(broker, frozenset()):
            cap = capacity.get(broker, {}).get(resource, math.inf)
            coef = flow.cost.get(resource, 0.0) + math.fsum(
                c.cost.get(resource, 0.0) * admitted.get((flow.name, c.name), 0)
                for c in flow.classes
            )
            out += share * coef * rate / cap if cap > 0 else math.inf
    return out


def step_rate(
    flow: FlowSpec,
    rate: float,
    admitted: Mapping[tuple[str, str], int],
    capacity: Mapping[str, Mapping[str, float]],
    congested: Mapping[str, frozenset[str]],
    settings: RateControlSettings = RateControlSettings(),
) -> float:
    """One flow's next rate; ``congested``: per broker, its congested resources."""
    rate = min(max(rate, flow.r_min), flow.r_max)
    on_congested = any(congested.get(b) for b, share in flow.shares.items() if share > 0)
    if on_congested:
        load = congested_load(flow, rate, admitted, capacity, congested)
        cut = (
            settings.down_max
            if math.isinf(load)
            else min(settings.down_max, settings.down_gain * load)
        )
        return max(flow.r_min, rate * (1.0 - cut))
    slope, mean = marginal(flow, rate, admitted), mean_slope(flow, admitted)
    if slope <= 0 or mean <= 0:
        return rate
    up = settings.up_gain * (flow.r_max - flow.r_min) * min(1.0, slope / mean)
    return min(flow.r_max, rate + up)


def control_step(
    problem: Problem,
    rates: Mapping[str, float],
    admitted: Mapping[tuple[str, str], int],
    congested: Mapping[str, frozenset[str]],
    settings: RateControlSettings = RateControlSettings(),
) -> dict[str, float]:
    """Every flow's next rate (a flow missing from ``rates`` starts at its ``r_min``)."""
    return {
        f.name: step_rate(
            f, rates.get(f.name, f.r_min), admitted, problem.capacity, congested, settings
        )
        for f in problem.flows
    }
