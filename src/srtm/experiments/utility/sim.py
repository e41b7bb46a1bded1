"""The experiments of Bhola et al. (seed 002, §V), simulated: the greedy optimizer
(``srtm.utility.optimize``) run once per stage of each scenario, at the paper's numbers.

- ``trading-day`` (§V-A, Figs. 5–6): four sector flows, gold/silver/bronze at 100·r, 10·r, r,
  200/400/800 consumers spread equally, six population segments.
- ``excess-capacity`` (§V-B, Fig. 8): four equal one-class flows allocated 140 msg/s; flow 0's
  producers drop to 50 msg/s and its share goes to the others.
- ``latency-effects`` (§V-C, Fig. 9): a gold flow and the paper's request-response flow;
  gold consumers 200, 400, …, 1,000.

The paper's numbers: flows, rate ranges, classes, utilities, populations, the CPU constants
A and B, the request-response flow, 140 and 50 msg/s. Ours: the capacities (the paper
does not state its utilization threshold), the excess-capacity flows' consumers, the
latency-effects gold flow's rate. What the paper measured through rate control between
optimizer runs (its oscillation, the dips at segment boundaries) is not simulated: each
stage is the optimizer's allocation, the state rate control is snapped to.

Every verdict (``data["claims"]``) is computed from the allocations, never fixed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import FigureResult, claim, pyplot, write
from srtm.utility import (
    Allocation,
    ConsumerClass,
    FlowKind,
    FlowSpec,
    Problem,
    RequestResponse,
    Utility,
    optimize,
    usage,
)

BROKER = "b1"
CPU = "cpu"
#: The paper's best-effort one-to-many constants (§V).
A_BEST_EFFORT = 0.00146092
B_BEST_EFFORT = 0.00103146
#: The paper's request-response constant (§V).
A_REQUEST_RESPONSE = 0.1347943

CLASSES = ("gold", "silver", "bronze")
#: Trading day (§V-A): utility per consumer (·r) and total consumers per class.
SLOPES = {"gold": 100.0, "silver": 10.0, "bronze": 1.0}
TOTALS = {"gold": 200, "silver": 400, "bronze": 800}
SECTORS = 4
R_MIN, R_MAX = 10.0, 200.0
#: Fig. 5: population as a percentage of the start (gold, silver, bronze).
SEGMENTS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("Start of Day", (100, 100, 100)),
    ("Coffee Break", (10, 25, 100)),
    ("After Coffee Break", (100, 100, 100)),
    ("Lunch", (0, 5, 100)),
    ("After Lunch", (100, 100, 100)),
    ("End of Day", (0, 0, 100)),
)
#: Ours: the CPU capacity in the units of A and B (perhaps percent of a CPU; the paper
#: does not say, nor its threshold).
TRADING_CAPACITY = 100.0
#: "Near r_max": at least this share of it (ours).
NEAR = 0.9

#: Excess capacity (§V-B): allocated 140 of 200 msg/s; flow 0 drops to 50.
EXCESS_ALLOCATED = 140.0
EXCESS_DROPPED = 50.0
EXCESS_CONSUMERS = 10  # per flow, ours
EXCESS_SLOPE = 1.0  # identical utility, ours

#: Latency effects (§V-C): the paper's request-response flow; gold population steps.
RR = RequestResponse(clients=20, think_s=0.100, exec_s=0.008, deadline_s=0.500, c=6000.0)
LATENCY_STEPS = (200, 400, 600, 800, 1000)
#: Ours (the paper gives neither): the gold flow's fixed rate and the CPU capacity. With the
#: linear cost model the request-response rate falls linearly with the gold consumers
#: once the capacity binds; 70 msg/s is about where it starts falling just before 600
#: consumers, and 69.6 where 900 gold consumers and the flow at r_min fill the CPU.
LATENCY_GOLD_RATE = 70.0
LATENCY_CAPACITY = 69.6


def _cpu(problem_capacity: float) -> Mapping[str, Mapping[str, float]]:
    return {BROKER: {CPU: problem_capacity}}


def _sector(i: int, available: Mapping[str, int]) -> FlowSpec:
    classes = tuple(
        ConsumerClass(
            c,
            Utility.linear(SLOPES[c], R_MIN, R_MAX),
            available[c],
            {CPU: B_BEST_EFFORT},
        )
        for c in CLASSES
    )
    return FlowSpec(
        f"sector-{i}", FlowKind.ONE_TO_MANY, R_MIN, R_MAX, {CPU: A_BEST_EFFORT},
        {BROKER: 1.0}, classes=classes,
    )  # fmt: skip


def _spread(total: int, percent: int) -> list[int]:
    """``percent`` of ``total`` consumers spread equally over the sectors."""
    n = total * percent // 100
    return [n // SECTORS + (1 if i < n % SECTORS else 0) for i in range(SECTORS)]


def _admitted(problem: Problem, alloc: Allocation, cls: str) -> int:
    return sum(alloc.admitted.get((f.name, cls), 0) for f in problem.flows)


def _cpu_used(problem: Problem, alloc: Allocation) -> float:
    return usage(problem, alloc.rates, alloc.admitted)[(BROKER, CPU)]


def trading_day_segments(capacity: float = TRADING_CAPACITY) -> list[dict[str, Any]]:
    """The optimizer's allocation in each of the six segments."""
    out = []
    for name, percents in SEGMENTS:
        per_class = {c: _spread(TOTALS[c], p) for c, p in zip(CLASSES, percents, strict=True)}
        flows = tuple(_sector(i, {c: per_class[c][i] for c in CLASSES}) for i in range(SECTORS))
        problem = Problem(flows, _cpu(capacity))
        alloc = optimize(problem)
        out.append({
            "name": name,
            "percent": dict(zip(CLASSES, percents, strict=True)),
            "available": {c: sum(per_class[c]) for c in CLASSES},
            "admitted": {c: _admitted(problem, alloc, c) for c in CLASSES},
            "rates": [alloc.rates[f.name] for f in flows],
            "utility": alloc.utility,
            "cpu_used": _cpu_used(problem, alloc),
            "cpu_capacity": capacity,
        })  # fmt: skip
    return out


def _higher_rates(s: Mapping[str, Any]) -> list[float]:
    """The rates of the flows with gold or silver available: per flow where the segment
    says (live runs: at small scale a class may be on some flows only), else all."""
    flows = s.get("flows")
    if not flows:
        return list(s["rates"])
    return [f["rate"] for f in flows
            if f["available"].get("gold", 0) + f["available"].get("silver", 0) > 0]  # fmt: skip


def trading_day_claims(
    segments: Sequence[Mapping[str, Any]], r_max: float = R_MAX, near: float = NEAR
) -> list[dict[str, Any]]:
    """The paper's conclusions (§V-A), checked on the segments (simulated or measured)."""
    gold = [s for s in segments if s["admitted"]["gold"] < s["available"]["gold"]]
    order = [
        s for s in segments
        if s["admitted"]["bronze"] > 0
        and any(s["admitted"][c] < s["available"][c] for c in ("gold", "silver"))
    ]  # fmt: skip
    higher = [s for s in segments if s["available"]["gold"] + s["available"]["silver"] > 0]
    only_bronze = [s for s in segments if s not in higher and s["available"]["bronze"] > 0]
    low = [s for s in higher if min(_higher_rates(s)) < near * r_max]
    lowered = [s for s in only_bronze if max(s["rates"]) < near * r_max]

    def names(ss: Sequence[Mapping[str, Any]]) -> str:
        return ", ".join(s["name"] for s in ss) or "none"

    def rate_range(rates: list[float]) -> str:
        return f"{min(rates):.0f}–{max(rates):.0f} msg/s" if rates else "no such segment"

    return [
        claim("gold consumers, when available, are always admitted",
              f"every gold consumer admitted in {len(segments) - len(gold)} of {len(segments)} "
              f"segments (short: {names(gold)})", not gold),
        claim("bronze is admitted only after all available higher-utility consumers",
              f"segments admitting bronze with gold or silver left out: {names(order)}",
              not order),
        claim(f"the rate stays near r_max ({r_max:g}) while gold or silver are available",
              f"rates {rate_range([r for s in higher for r in _higher_rates(s)])} in "
              f"{len(higher)} segments; below {near:.0%} of r_max in: {names(low)}",
              bool(higher) and not low),
        claim("with only bronze left, the rate is lowered to admit more of them",
              f"rates {rate_range([r for s in only_bronze for r in s['rates']])}, bronze "
              "admitted " + ", ".join(f"{s['admitted']['bronze']}/{s['available']['bronze']}"
                                      for s in only_bronze) + f" in {names(only_bronze)}",
              bool(only_bronze) and len(lowered) == len(only_bronze)),
    ]  # fmt: skip


def _one_class_flow(i: int, r_max: float) -> FlowSpec:
    cls = ConsumerClass(
        "gold", Utility.linear(EXCESS_SLOPE, R_MIN, R_MAX), EXCESS_CONSUMERS,
        {CPU: B_BEST_EFFORT},
    )  # fmt: skip
    return FlowSpec(
        f"flow-{i}", FlowKind.ONE_TO_MANY, R_MIN, r_max, {CPU: A_BEST_EFFORT}, {BROKER: 1.0},
        classes=(cls,),
    )  # fmt: skip


def excess_capacity_default() -> float:
    """Ours: the capacity at which four flows of 10 consumers each get the paper's 140."""
    return SECTORS * EXCESS_ALLOCATED * (A_BEST_EFFORT + EXCESS_CONSUMERS * B_BEST_EFFORT)


def excess_capacity_stages(capacity: float | None = None) -> list[dict[str, Any]]:
    """Before: every flow's producers at 200 msg/s. After: flow 0's at 50, its bound the
    paper's effective r_max (the producers' rate), the state rate control moves toward."""
    cap = excess_capacity_default() if capacity is None else capacity
    out = []
    for name, first in (("all producers at 200 msg/s", R_MAX),
                        (f"flow 0 drops to {EXCESS_DROPPED:g} msg/s", EXCESS_DROPPED)):  # fmt: skip
        flows = tuple(_one_class_flow(i, first if i == 0 else R_MAX) for i in range(SECTORS))
        problem = Problem(flows, _cpu(cap))
        alloc = optimize(problem)
        out.append({
            "name": name,
            "available": {"gold": SECTORS * EXCESS_CONSUMERS},
            "admitted": {"gold": _admitted(problem, alloc, "gold")},
            "rates": [alloc.rates[f.name] for f in flows],
            "utility": alloc.utility,
            "cpu_used": _cpu_used(problem, alloc),
            "cpu_capacity": cap,
        })  # fmt: skip
    return out


def excess_capacity_claims(
    stages: Sequence[Mapping[str, Any]], r_max: float = R_MAX,
    allocated: float = EXCESS_ALLOCATED, dropped: float = EXCESS_DROPPED, tol: float = 0.0,
) -> list[dict[str, Any]]:  # fmt: skip
    """The paper's conclusions (§V-B); ``tol`` widens each comparison by that share (live
    runs measure rates, the sim computes them)."""
    before, after = stages
    equal = max(before["rates"]) - min(before["rates"]) <= max(1e-6, tol) * r_max
    near = all(abs(r - allocated) <= max(0.02, tol) * allocated for r in before["rates"])
    others = after["rates"][1:]
    freed = (before["rates"][0] - after["rates"][0]) / len(others)
    gained = [r - b for r, b in zip(others, before["rates"][1:], strict=True)]
    handed = (all(abs(g - freed) <= max(0.01, 3 * tol) * max(freed, 1e-9) for g in gained)
              and freed > 0)  # fmt: skip
    return [
        claim(f"every flow wants {r_max:g} msg/s but is allocated about {allocated:g}",
              "rates " + ", ".join(f"{r:.1f}" for r in before["rates"]) + " msg/s",
              equal and near and before["rates"][0] < r_max),
        claim(f"flow 0 dropping to {dropped:g} msg/s hands its share equally to flows 1–3",
              f"flow 0 at {after['rates'][0]:.1f}; flows 1–3 each +"
              + ", +".join(f"{g:.1f}" for g in gained) + f" msg/s (its freed share: "
              f"{freed:.1f} each)", handed),
        claim("the capacity freed is used (no excess left)",
              f"CPU {after['cpu_used']:.3g} of {after['cpu_capacity']:.3g}",
              after["cpu_used"] >= (0.99 - tol) * after["cpu_capacity"]),
    ]  # fmt: skip


def _latency_problem(available: int, capacity: float, rr: RequestResponse) -> Problem:
    gold = ConsumerClass(
        "gold", Utility.linear(SLOPES["gold"], LATENCY_GOLD_RATE, LATENCY_GOLD_RATE),
        available, {CPU: B_BEST_EFFORT},
    )  # fmt: skip
    flows = (
        FlowSpec("gold-flow", FlowKind.ONE_TO_MANY, LATENCY_GOLD_RATE, LATENCY_GOLD_RATE,
                 {CPU: A_BEST_EFFORT}, {BROKER: 1.0}, classes=(gold,)),
        FlowSpec("rr-flow", FlowKind.REQUEST_RESPONSE, rr.r_min, rr.r_max,
                 {CPU: A_REQUEST_RESPONSE}, {BROKER: 1.0}, utility=rr.utility()),
    )  # fmt: skip
    return Problem(flows, _cpu(capacity))


def latency_effects_steps(
    capacity: float = LATENCY_CAPACITY, rr: RequestResponse = RR
) -> list[dict[str, Any]]:
    out = []
    for n in LATENCY_STEPS:
        problem = _latency_problem(n, capacity, rr)
        alloc = optimize(problem)
        rate = alloc.rates["rr-flow"]
        out.append({
            "name": f"{n} consumers",
            "available": {"gold": n},
            "admitted": {"gold": _admitted(problem, alloc, "gold")},
            "rates": [alloc.rates["gold-flow"], rate],
            "rr_rate": rate,
            "rr_t_rt_ms": rr.t_rt(rate) * 1e3,
            "utility": alloc.utility,
            "cpu_used": _cpu_used(problem, alloc),
            "cpu_capacity": capacity,
        })  # fmt: skip
    return out


def latency_effects_claims(
    steps: Sequence[Mapping[str, Any]],
    rr: RequestResponse = RR,
    populations: Sequence[int] = LATENCY_STEPS,
    tol: float = 0.0,
) -> list[dict[str, Any]]:
    """The paper's conclusions (§V-C) at its populations (200 … 1,000) or ``populations``
    scaled the same way; ``tol`` widens the r_min comparison (live runs measure rates)."""
    by = {s["available"]["gold"]: s for s in steps}
    p = list(populations)
    upto = [by[n] for n in p[:2]]
    near = [s for s in upto if s["rr_rate"] < NEAR * rr.r_max]
    half = by[p[3]]["rr_rate"] / by[p[1]]["rr_rate"]
    last = by[p[4]]
    admitted = last["admitted"]["gold"]
    about = round(0.9 * p[4])
    return [
        claim(f"up to {p[1]:,} consumers the request-response rate stays near "
              f"{rr.r_max:.0f} msg/s",
              "rates " + ", ".join(f"{s['rr_rate']:.1f}" for s in upto) + " msg/s",
              not near),
        claim(f"at {p[2]:,} consumers the request-response rate is slightly reduced",
              f"{by[p[2]]['rr_rate']:.1f} msg/s (at {p[1]:,}: {by[p[1]]['rr_rate']:.1f})",
              0.7 * by[p[1]]["rr_rate"] <= by[p[2]]["rr_rate"] < by[p[1]]["rr_rate"]),
        claim(f"at {p[3]:,} consumers the request-response rate is halved",
              f"{by[p[3]]['rr_rate']:.1f} msg/s, {half:.2f} of the rate at {p[1]:,}; T_rt "
              f"{by[p[3]]['rr_t_rt_ms']:.1f} ms", 0.4 <= half <= 0.6),
        claim(f"at {p[4]:,} consumers the rate is at r_min ({rr.r_min:.2f}) and about "
              f"{about:,} are admitted",
              f"{last['rr_rate']:.2f} msg/s, T_rt {last['rr_t_rt_ms']:.0f} ms; {admitted} "
              "admitted",
              last["rr_rate"] <= (1.02 + tol) * rr.r_min
              and abs(admitted - about) <= 0.05 * p[4]),
    ]  # fmt: skip


#: How much wider a live verdict's comparisons are than the sim's: measured rates.
LIVE_TOLERANCE = 0.1


def live_claims(
    name: str, stages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The same verdicts on a live run's measured stages (``live``)."""
    if name == "trading-day":
        return trading_day_claims(stages, r_max=params["r_max"])
    if name == "excess-capacity":
        return excess_capacity_claims(
            stages, params["r_max"], params["allocated"], params["dropped"], LIVE_TOLERANCE
        )
    from srtm.utility import request_response

    rr = request_response(dict(params["rr"]), "rr")
    # The request-response flow is the second; T_rt is the model's (MVA) at the rate
    # measured, not a measured round trip.
    steps = [{**s, "rr_rate": s["rates"][1], "rr_t_rt_ms": rr.t_rt(s["rates"][1]) * 1e3}
             for s in stages]  # fmt: skip
    return latency_effects_claims(steps, rr, params["steps"], LIVE_TOLERANCE)


def _plot(
    title: str,
    stages: Sequence[Mapping[str, Any]],
    classes: Sequence[str],
    rate_label: str,
    rate_of: Callable[[Mapping[str, Any]], list[float]],
    series: Sequence[str],
) -> Any:
    """Admitted consumers per class stacked per stage; rates on the second axis."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    colours = {"gold": "#d4a017", "silver": "#a8a9ad", "bronze": "#cd7f32"}
    for c in classes:
        ys = [float(s["admitted"].get(c, 0)) for s in stages]
        ax.bar(xs, ys, bottom=bottom, color=colours.get(c), label=f"{c} admitted", width=0.6)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.set_xticks(xs, [s["name"] for s in stages], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("admitted consumers")
    twin = ax.twinx()
    rates = [rate_of(s) for s in stages]
    for k, name in enumerate(series):
        twin.plot(xs, [r[k] for r in rates], marker="o", label=name)
    twin.set_ylabel(rate_label)
    twin.set_ylim(bottom=0)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=10)
    return fig


@dataclass(frozen=True)
class Knobs:
    """The capacities (ours) each experiment runs at; tests perturb them."""

    trading_capacity: float = TRADING_CAPACITY
    excess_capacity: float | None = None
    latency_capacity: float = LATENCY_CAPACITY


def trading_day(out_dir: Path, knobs: Knobs = Knobs()) -> FigureResult:
    started = time.perf_counter()
    segments = trading_day_segments(knobs.trading_capacity)
    rows = [
        [s["name"], *(f"{s['admitted'][c]}/{s['available'][c]}" for c in CLASSES),
         sum(s["rates"]) / len(s["rates"]), s["utility"], s["cpu_used"]]
        for s in segments
    ]  # fmt: skip
    data = {
        "experiment": "trading-day",
        "cpu_capacity": knobs.trading_capacity,
        "segments": segments,
        "claims": trading_day_claims(segments),
    }
    result = FigureResult(
        "trading-day",
        f"Trading day (Bhola et al. Fig. 6): 4 flows, CPU capacity {knobs.trading_capacity:g}",
        data,
        ["segment", "gold adm/avail", "silver adm/avail", "bronze adm/avail",
         "mean rate msg/s", "utility", "CPU used"],
        rows,
    )  # fmt: skip
    fig = _plot(result.title, segments, CLASSES, "mean flow rate (msg/s)",
                lambda s: [sum(s["rates"]) / len(s["rates"])], ["mean flow rate"])  # fmt: skip
    return write(result, out_dir, fig, started)


def excess_capacity(out_dir: Path, knobs: Knobs = Knobs()) -> FigureResult:
    started = time.perf_counter()
    stages = excess_capacity_stages(knobs.excess_capacity)
    rows = [[s["name"], *s["rates"], s["utility"], s["cpu_used"]] for s in stages]
    data = {
        "experiment": "excess-capacity",
        "cpu_capacity": stages[0]["cpu_capacity"],
        "segments": stages,
        "claims": excess_capacity_claims(stages),
    }
    result = FigureResult(
        "excess-capacity",
        f"Excess capacity (Bhola et al. Fig. 8): CPU capacity {stages[0]['cpu_capacity']:.4g}",
        data,
        ["stage", *(f"flow {i} msg/s" for i in range(SECTORS)), "utility", "CPU used"],
        rows,
    )
    fig = _plot(result.title, stages, ["gold"], "allocated rate (msg/s)",
                lambda s: list(s["rates"]), [f"flow {i}" for i in range(SECTORS)])  # fmt: skip
    return write(result, out_dir, fig, started)


def latency_effects(out_dir: Path, knobs: Knobs = Knobs()) -> FigureResult:
    started = time.perf_counter()
    steps = latency_effects_steps(knobs.latency_capacity)
    rows = [
        [s["name"], s["admitted"]["gold"], s["rr_rate"], s["rr_t_rt_ms"], s["utility"],
         s["cpu_used"]]
        for s in steps
    ]  # fmt: skip
    data = {
        "experiment": "latency-effects",
        "cpu_capacity": knobs.latency_capacity,
        "request_response": {"r_min": RR.r_min, "r_max": RR.r_max},
        "segments": steps,
        "claims": latency_effects_claims(steps),
    }
    result = FigureResult(
        "latency-effects",
        f"Latency effects (Bhola et al. Fig. 9): CPU capacity {knobs.latency_capacity:g}",
        data,
        ["gold available", "gold admitted", "RR rate msg/s", "RR T_rt ms", "utility",
         "CPU used"],
        rows,
    )  # fmt: skip
    fig = _plot(result.title, steps, ["gold"], "request-response rate (msg/s)",
                lambda s: [s["rr_rate"]], ["request-response rate"])  # fmt: skip
    return write(result, out_dir, fig, started)


EXPERIMENTS: dict[str, Callable[..., FigureResult]] = {
    "trading-day": trading_day,
    "excess-capacity": excess_capacity,
    "latency-effects": latency_effects,
}
