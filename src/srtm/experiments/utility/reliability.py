"""The utility paper's Fig. 7 ("increase high utility", mixed reliability), simulated over
time (``srtm.experiments.utility.dynamics``): ``srtm experiment run mixed-reliability --sim``.

The paper (§V-A, second experiment): two reliable flows and one best-effort flow, rates
10–200 msg/s. ``gdfloor`` (reliable) hosts gold (100·r) and bronze (r) consumers; the
best-effort flow hosts bronze; the other reliable flow carries load. At first 10 gold on
gdfloor and about 140 bronze on the best-effort flow; bronze on gdfloor is never
admitted (same utility, higher cost). At time 1000 the gold population rises to 200:
bronze on the best-effort flow falls; the higher fan-out of the reliable flow makes its
messages queue for the disk, the latency caps gdfloor's rate and lowers its allocation,
and bronze is admitted again.

The paper's: the flows, rate ranges, utilities, the reliable and best-effort CPU
constants, 10 → 200 gold at t = 1000, about 140 bronze. Ours: 140 bronze available on
each flow, the CPU capacity (32), the load flow (100 msg/s to 10 consumers, outside the
optimizer), the disk (one synchronous write 2 ms unloaded, 20 MB/s), 1 KB messages
(1,064 bytes logged per write), one gdfloor producer, the truth (reliable flows cost
12 % more CPU than modelled, best-effort 4 %: the paper's error term three times larger
for reliable flows), and the run's length (2,000 s).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import FigureResult, claim, pyplot, write
from srtm.experiments.utility import dynamics as dyn
from srtm.experiments.utility.sim import (
    A_BEST_EFFORT,
    B_BEST_EFFORT,
    R_MAX,
    R_MIN,
    SLOPES,
)
from srtm.utility import ConsumerClass, FlowKind, FlowSpec, Utility
from srtm.utility.storage import Logger

#: The paper's reliable one-to-many constants (§V).
A_RELIABLE = 0.0148354
B_RELIABLE = 0.00113717
GDFLOOR, BEST_EFFORT = "gdfloor", "best-effort"
GOLD_BEFORE, GOLD_AFTER = 10, 200
BRONZE = 140
RISE_S = 1000
DURATION_S = 2000
CAPACITY = 32.0
LOAD_RATE, LOAD_CONSUMERS = 100.0, 10
RECORD_BYTES = 1000 + 64
LOGGER = Logger(bandwidth_bps=20e6, write_s=0.002)
PRODUCERS = 1
TRUTH = {GDFLOOR: 1.12, BEST_EFFORT: 1.04}
TRUTH_LOAD = 1.12
DEFAULT_KNOBS = dyn.Loops()


def _flow(name: str, a: float, b: float, classes: tuple[str, ...]) -> FlowSpec:
    cs = tuple(
        ConsumerClass(c, Utility.linear(SLOPES[c], R_MIN, R_MAX), 0, {dyn.CPU: b}) for c in classes
    )
    return FlowSpec(
        name, FlowKind.ONE_TO_MANY, R_MIN, R_MAX, {dyn.CPU: a}, {dyn.BROKER: 1.0}, classes=cs
    )


def scenario() -> dyn.Timeline:
    flows = (
        _flow(GDFLOOR, A_RELIABLE, B_RELIABLE, ("gold", "bronze")),
        _flow(BEST_EFFORT, A_BEST_EFFORT, B_BEST_EFFORT, ("bronze",)),
    )

    def stage(name: str, start: int, gold: int) -> dyn.Phase:
        avail = {
            (GDFLOOR, "gold"): gold,
            (GDFLOOR, "bronze"): BRONZE,
            (BEST_EFFORT, "bronze"): BRONZE,
        }
        return dyn.Phase(name, start, avail)

    load_cpu = (A_RELIABLE + LOAD_CONSUMERS * B_RELIABLE) * LOAD_RATE
    return dyn.Timeline(
        "mixed-reliability", flows, CAPACITY,
        (stage(f"{GOLD_BEFORE} gold", 0, GOLD_BEFORE),
         stage(f"{GOLD_AFTER} gold", RISE_S, GOLD_AFTER)),
        DURATION_S, TRUTH, {GDFLOOR: dyn.Reliable(PRODUCERS, RECORD_BYTES)}, LOGGER,
        background_cpu=load_cpu * TRUTH_LOAD,
        background_bps=LOAD_RATE * (1 + LOAD_CONSUMERS) * RECORD_BYTES,
    )  # fmt: skip


def _row(label: str, ticks: list[dyn.Tick]) -> dict[str, Any]:
    m = dyn.mean
    return {
        "window": label,
        "gold": m([t.admitted.get((GDFLOOR, "gold"), 0) for t in ticks]),
        "gdfloor_bronze": max(t.admitted.get((GDFLOOR, "bronze"), 0) for t in ticks),
        "bronze": m([t.admitted.get((BEST_EFFORT, "bronze"), 0) for t in ticks]),
        "bronze_min": min(t.admitted.get((BEST_EFFORT, "bronze"), 0) for t in ticks),
        "gdfloor_allowed": m([t.allowed[GDFLOOR] for t in ticks]),
        "gdfloor_rate": m([t.rates[GDFLOOR] for t in ticks]),
        "best_effort_rate": m([t.rates[BEST_EFFORT] for t in ticks]),
        "latency_ms": m([t.latency_s * 1e3 for t in ticks]),
        "cpu_share": m([t.cpu for t in ticks]) / CAPACITY,
        "utility": m([t.utility for t in ticks]),
    }


def windows(ticks: list[dyn.Tick]) -> list[dict[str, Any]]:
    """Before the rise, the first optimizer period after it, and settled."""
    w = dyn.window
    return [
        _row(f"before ({RISE_S // 2}–{RISE_S} s)", w(ticks, RISE_S // 2, RISE_S)),
        _row(f"first period after ({RISE_S}–{RISE_S + 20} s)", w(ticks, RISE_S, RISE_S + 20)),
        _row(f"settled ({(RISE_S + DURATION_S) // 2}–{DURATION_S} s)",
             w(ticks, (RISE_S + DURATION_S) // 2, DURATION_S)),
    ]  # fmt: skip


def claims(rows: list[dict[str, Any]], unbounded: dict[str, Any]) -> list[dict[str, Any]]:
    before, first, settled = rows
    never = max(r["gdfloor_bronze"] for r in rows)
    return [
        claim("bronze consumers on gdfloor are never admitted (same utility, higher cost)",
              f"at most {never} admitted in any second", never == 0),
        claim(f"at first {GOLD_BEFORE} gold on gdfloor and about 140 bronze on the "
              "best-effort flow",
              f"{before['gold']:.0f} gold, {before['bronze']:.0f} bronze",
              before["gold"] == GOLD_BEFORE and abs(before["bronze"] - 140) <= 14),
        claim(f"gold rising to {GOLD_AFTER} lowers the best-effort flow's bronze",
              f"{first['bronze_min']} bronze in the first period after (before: "
              f"{before['bronze']:.0f})", first["bronze_min"] < before["bronze"]),
        claim("the disk's latency caps gdfloor's rate and lowers its allocation",
              f"disk latency {before['latency_ms']:.1f} → {settled['latency_ms']:.1f} ms; "
              f"gdfloor allowed {first['gdfloor_allowed']:.0f} → "
              f"{settled['gdfloor_allowed']:.0f} msg/s",
              settled["gdfloor_allowed"] < 0.9 * first["gdfloor_allowed"]
              and settled["latency_ms"] > before["latency_ms"]),
        claim("as gdfloor's rate falls, bronze is admitted again",
              f"{settled['bronze']:.0f} bronze settled (low after the rise: "
              f"{first['bronze_min']})", settled["bronze"] > first["bronze_min"]),
        claim("without the latency bound the optimizer over-allocates and needlessly "
              "denies other consumers (§III-C)",
              f"no bound: gdfloor allowed {unbounded['gdfloor_allowed']:.0f}, reaches "
              f"{unbounded['gdfloor_rate']:.0f} msg/s, {unbounded['bronze']:.0f} bronze, CPU "
              f"{unbounded['cpu_share']:.0%} of capacity (bound: reaches "
              f"{settled['gdfloor_rate']:.0f}, {settled['bronze']:.0f} bronze, CPU "
              f"{settled['cpu_share']:.0%})",
              unbounded["gdfloor_allowed"] > 1.5 * unbounded["gdfloor_rate"]
              and unbounded["bronze"] < settled["bronze"]),
    ]  # fmt: skip


def _plot(ticks: list[dyn.Tick], unbounded: list[dyn.Tick], title: str) -> Any:
    plt = pyplot()
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    ts = [t.t_s for t in ticks]
    a.plot(
        ts,
        [t.admitted.get((GDFLOOR, "gold"), 0) for t in ticks],
        color="#d4a017",
        label="gold admitted (gdfloor)",
    )
    a.plot(
        ts,
        [t.admitted.get((BEST_EFFORT, "bronze"), 0) for t in ticks],
        color="#cd7f32",
        label="bronze admitted (best-effort)",
    )
    a.plot(
        ts,
        [t.admitted.get((GDFLOOR, "bronze"), 0) for t in ticks],
        color="k",
        lw=0.8,
        label="bronze admitted (gdfloor)",
    )
    a.plot(
        ts,
        [t.admitted.get((BEST_EFFORT, "bronze"), 0) for t in unbounded],
        ":",
        color="#cd7f32",
        label="bronze, no latency bound",
    )
    a.set_ylabel("consumers")
    a.legend(fontsize=7, loc="upper left")
    b.plot(ts, [t.allowed[GDFLOOR] for t in ticks], label="gdfloor allowed")
    b.plot(ts, [t.rates[GDFLOOR] for t in ticks], label="gdfloor reached")
    b.plot(ts, [t.rates[BEST_EFFORT] for t in ticks], label="best-effort")
    b.set_ylabel("msg/s")
    b.legend(fontsize=7, loc="upper left")
    c.plot(ts, [t.latency_s * 1e3 for t in ticks], label="disk latency")
    c.set_ylabel("ms")
    c.set_xlabel("time (s)")
    a.set_title(title, fontsize=10)
    return fig  # fmt: skip


def mixed_reliability(out_dir: Path, knobs: dyn.Loops = DEFAULT_KNOBS) -> FigureResult:
    started = time.perf_counter()
    sc = scenario()
    ticks = dyn.run(sc, knobs)
    unbounded_ticks = dyn.run(sc, dataclasses.replace(knobs, bound=False))
    rows = windows(ticks)
    unbounded = windows(unbounded_ticks)[-1] | {"window": "settled, no latency bound"}
    shown: list[dict[str, Any]] = [*rows, unbounded]
    data = {
        "experiment": "mixed-reliability",
        "cpu_capacity": CAPACITY,
        "windows": shown,
        "claims": claims(rows, unbounded),
    }
    cols = ["window", "gold adm", "gdfloor bronze adm", "best-effort bronze adm",
            "gdfloor allowed msg/s", "gdfloor reached msg/s", "best-effort msg/s",
            "disk latency ms", "CPU / capacity", "utility"]  # fmt: skip
    keys = ["window", "gold", "gdfloor_bronze", "bronze", "gdfloor_allowed", "gdfloor_rate",
            "best_effort_rate", "latency_ms", "cpu_share", "utility"]  # fmt: skip
    result = FigureResult(
        "mixed-reliability",
        "Mixed reliability (Bhola et al. Fig. 7): gold on gdfloor 10 → 200 at t = 1000 s",
        data,
        cols,
        [[r[k] for k in keys] for r in shown],
    )
    return write(result, out_dir, _plot(ticks, unbounded_ticks, result.title), started)
