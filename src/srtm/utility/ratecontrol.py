"""Rate control between optimizer runs (Bhola et al., §IV-C), pure: every second each
flow's rate moves by what its brokers' congestion says, and each optimizer run snaps the
rates back to its own.

- A flow whose brokers are all free (neither congested nor full) **raises** its rate by
  ``up_gain · (r_max − r_min) · min(1, U'(r) / Ū')``: proportional to its marginal utility
  ``U'(r)`` (with its admitted consumers), normalised by its average slope ``Ū'`` over
  ``[r_min, r_max]`` so that the step does not depend on the utility's units. A flow at
  ``r_max``, or with no admitted consumer, has no marginal utility and does not rise.
- A flow with a share on a *full* broker (``full``: its use within ``FULL_BAND`` of its
  capacity, ``pressure``) and none on a congested one **holds** its rate: at the plan the
  optimizer has filled its bottleneck to the capacity, and rising there would only be
  taken back (lowered, or snapped back by the next run).
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
- ``FULL_BAND = 0.05``: the dead band around a broker's capacity where flows hold. The
  optimizer fills a bottleneck exactly to its capacity, so without a band a measurement
  at the plan says "room" or "over" by its noise alone and the rates chatter around the
  plan; rising at the plan is what made the live latency-effects run at 48769cb
  measure a request-response flow planned at its r_min 17 % above it. 5 % is wider than
  the noise of the rates use is judged from (each topic's ten-second window at its
  broker: tenths of a percent at tens of msg/s), and narrow enough that a broker left
  5 % short of its plan fills again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from srtm.utility.optimizer import FlowKind, FlowSpec, Problem

#: A broker's use within this fraction of its capacity is full (its flows hold); above
#: ``1 + FULL_BAND`` times it, congested (they lower).
FULL_BAND = 0.05


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


def coefficient(flow: FlowSpec, resource: str, admitted: Mapping[tuple[str, str], int]) -> float:
    """The flow's use of ``resource`` per msg/s with its admitted consumers:
    ``A + Σ_j B_j·n_j``."""
    return flow.cost.get(resource, 0.0) + math.fsum(
        c.cost.get(resource, 0.0) * admitted.get((flow.name, c.name), 0) for c in flow.classes
    )


def broker_use(
    flows: Iterable[FlowSpec],
    rates: Mapping[str, Mapping[str, float]],
    admitted: Mapping[tuple[str, str], int],
) -> dict[str, dict[str, float]]:
    """Per broker, per resource: what the flows use there by their costs, from ``rates``
    (per flow, per broker: the rate it carries there). A flow's costs are those of its
    problem: declared ones as declared, modelled ones as the cost model (corrected) gave."""
    out: dict[str, dict[str, float]] = {}
    for f in flows:
        resources = {*f.cost, *(r for c in f.classes for r in c.cost)}
        for broker, rate in rates.get(f.name, {}).items():
            use = out.setdefault(broker, {})
            for r in resources:
                use[r] = use.get(r, 0.0) + coefficient(f, r, admitted) * rate
    return out


def pressure(
    use: Mapping[str, Mapping[str, float]],
    capacity: Mapping[str, Mapping[str, float]],
    band: float = FULL_BAND,
) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """``(congested, full)`` per broker: the resources it uses beyond ``(1 + band)`` of
    its capacity, and those within ``band`` of it. A resource without a capacity is
    never either."""
    over: dict[str, frozenset[str]] = {}
    full: dict[str, frozenset[str]] = {}
    for broker, per in use.items():
        caps = capacity.get(broker, {})
        hot = {r for r, u in per.items() if r in caps and u > (1 + band) * caps[r]}
        near = {r for r, u in per.items() if r in caps and u >= (1 - band) * caps[r]} - hot
        if hot:
            over[broker] = frozenset(hot)
        if near:
            full[broker] = frozenset(near)
    return over, full


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
            coef = coefficient(flow, resource, admitted)
            out += share * coef * rate / cap if cap > 0 else math.inf
    return out


def step_rate(
    flow: FlowSpec,
    rate: float,
    admitted: Mapping[tuple[str, str], int],
    capacity: Mapping[str, Mapping[str, float]],
    congested: Mapping[str, frozenset[str]],
    settings: RateControlSettings = RateControlSettings(),
    full: Mapping[str, frozenset[str]] | None = None,
) -> float:
    """One flow's next rate; ``congested`` and ``full``: per broker, its congested and
    its full resources."""
    rate = min(max(rate, flow.r_min), flow.r_max)
    mine = [b for b, share in flow.shares.items() if share > 0]
    on_congested = any(congested.get(b) for b in mine)
    if on_congested:
        load = congested_load(flow, rate, admitted, capacity, congested)
        cut = (
            settings.down_max
            if math.isinf(load)
            else min(settings.down_max, settings.down_gain * load)
        )
        return max(flow.r_min, rate * (1.0 - cut))
    if full and any(full.get(b) for b in mine):
        return rate
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
    full: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, float]:
    """Every flow's next rate (a flow missing from ``rates`` starts at its ``r_min``)."""
    caps = problem.capacity
    return {
        f.name: step_rate(f, rates.get(f.name, f.r_min), admitted, caps, congested, settings, full)
        for f in problem.flows
    }
