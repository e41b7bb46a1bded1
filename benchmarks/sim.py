"""The simulator at the paper's scale: 6,000 publishers, 6 brokers, 60 s.

Run with ``.venv/bin/python benchmarks/sim.py`` (``--runs N``, ``--publishers``,
``--duration-s``, ``--json PATH``). Each run generates the arrivals (Poisson, 10 msg/s per
publisher, batch 1), profiles the topic's bucket, places the publishers with LB over six
idle brokers of the paper's model (every broker gets a share and a sub-bucket) and
simulates every message through its sub-bucket and its broker's queue, brokers carrying
10–80 kmsg/s of other traffic. The table gives the median of the runs, min–max beside,
and the anchor measured in the same run: ``np.sort`` of as many random int64 arrival
times as the scenario has messages.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from srtm.analysis import profile_bucket
from srtm.placement import BrokerCapacity, place
from srtm.sim.arrivals import generate, homogeneous
from srtm.sim.engine import Background, simulate
from srtm.sim.model import paper
from srtm.sim.placing import shares_of, topic_of

PRELOADS = (10_000.0, 40_000.0, 50_000.0, 60_000.0, 70_000.0, 80_000.0)
STAGES = ("arrivals", "profile", "placement", "simulate", "total")


def one_run(publishers: int, duration_s: float, seed: int) -> tuple[dict[str, float], int, float]:
    """Seconds per stage, messages simulated and the topic's p99 (ms)."""
    model = paper()
    t0 = time.perf_counter()
    specs = homogeneous(publishers)
    trace = generate(specs, duration_s, seed=seed)
    t1 = time.perf_counter()
    topic = topic_of(specs, profile_bucket(trace.t_ns), 1.0)
    t2 = time.perf_counter()
    brokers = [BrokerCapacity(f"b{i + 1}", model.mcap) for i in range(len(PRELOADS))]
    placement = place("lb", brokers, topic)
    shares = shares_of(placement, trace)
    t3 = time.perf_counter()
    background = {b.id: Background(load, 10) for b, load in zip(brokers, PRELOADS, strict=True)}
    result = simulate(trace, shares, model, background, seed=seed, warmup_s=1.0)
    t4 = time.perf_counter()
    stages = {
        "arrivals": t1 - t0,
        "profile": t2 - t1,
        "placement": t3 - t2,
        "simulate": t4 - t3,
        "total": t4 - t0,
    }
    return stages, trace.messages, result.topic.p99_ms


def anchor(messages: int, seed: int) -> float:
    """Seconds for ``np.sort`` of ``messages`` random int64 times (one minute in ns)."""
    values = np.random.default_rng(seed).integers(0, 60 * 10**9, messages)
    t = time.perf_counter()
    np.sort(values)
    return time.perf_counter() - t


def main(
    runs: Annotated[int, typer.Option(help="Runs; the table shows their median.", min=1)] = 5,
    publishers: Annotated[int, typer.Option(help="Publishers of the topic.", min=1)] = 6_000,
    duration_s: Annotated[float, typer.Option(help="SyntheticRun seconds.", min=1)] = 60.0,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw numbers here.")
    ] = None,
) -> None:
    """Time the simulator on the paper's scale against np.sort of as many arrivals."""
    console = Console()
    samples: dict[str, list[float]] = {s: [] for s in (*STAGES, "anchor")}
    messages, p99s = 0, []
    for r in range(runs):
        stages, messages, p99 = one_run(publishers, duration_s, seed=r)
        for k, v in stages.items():
            samples[k].append(v)
        samples["anchor"].append(anchor(messages, seed=r))
        p99s.append(p99)
        console.print(f"run {r + 1}/{runs}: {stages['total']:.2f} s, topic p99 {p99:.2f} ms")
    med_anchor = statistics.median(samples["anchor"])
    table = Table(
        title=f"{publishers:,} publishers, 6 brokers, {duration_s:g} s: "
        f"{messages:,} messages (median of {runs} runs)"
    )
    for col in ("stage", "seconds", "min–max", "× anchor", "M msg/s"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for k in (*STAGES, "anchor"):
        xs = samples[k]
        med = statistics.median(xs)
        label = "anchor: np.sort of the arrivals" if k == "anchor" else k
        table.add_row(
            label,
            f"{med:.3f}",
            f"{min(xs):.3f}–{max(xs):.3f}",
            f"{med / med_anchor:.1f}",
            f"{messages / med / 1e6:.1f}",
        )
    console.print(table)
    total = statistics.median(samples["total"])
    verdict = "met" if total < 10 else "missed"
    console.print(f"target: under 10 s for the whole scenario: {total:.2f} s ({verdict})")
    if json_path is not None:
        doc = {"publishers": publishers, "duration_s": duration_s, "messages": messages,
               "samples": samples, "p99_ms": p99s}  # fmt: skip
        json_path.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    typer.run(main)
