"""Fig. 4: the DRL penalty, one Poisson topic spread evenly over k = 1..6 idle brokers.

Two topics, as in the long version of the paper (000, Fig. 6): (a) 1,000 publishers, a
load one broker holds, so every split only adds the DRL penalty; (b) 6,000 publishers,
the short version's Fig. 4, which saturates one broker.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import (
    BROKERS,
    SLO_MS,
    FigureResult,
    Setup,
    axes,
    claim,
    duration_for,
    figure_model,
    run,
    scaled,
    slo_axis,
    write,
)
from srtm.sim.arrivals import homogeneous
from srtm.sim.model import BrokerModel

#: 000's Fig. 6a: the p99 at k = 6 the paper reports for 1,000 publishers.
PAPER_LIGHT_K6_P99_MS = 14.7


def _by_k(setup: Setup) -> dict[int, dict[str, float]]:
    """The topic held to k = 1..6 brokers (Conc: an even split), latencies per k."""
    per_k = {}
    for k in range(1, BROKERS + 1):
        s = run(setup, "conc", k=k).result.topic
        per_k[k] = {
            "p50_ms": s.p50_ms,
            "p95_ms": s.p95_ms,
            "p99_ms": s.p99_ms,
            "token_p99_ms": s.token_p99_ms,
        }
    return per_k


def _heavy_claims(p99: dict[int, float]) -> list[dict[str, Any]]:
    best = min(p99, key=lambda k: p99[k])
    rising = all(p99[k + 1] > p99[k] for k in range(2, BROKERS))
    return [
        claim(
            "k = 1 saturates one broker (large tail)",
            f"p99 {p99[1]:.3g} ms at k = 1",
            p99[1] > 5 * SLO_MS,
        ),
        claim("k = 2 is the best trade-off", f"lowest p99 at k = {best}", best == 2),
        claim(
            "beyond k = 2 the DRL penalty grows with k",
            "p99 " + ", ".join(f"{p99[k]:.2f}" for k in range(2, BROKERS + 1)) + " ms",
            rising,
        ),
    ]


def _light_claims(p99: dict[int, float]) -> list[dict[str, Any]]:
    rising = all(p99[k + 1] > p99[k] for k in range(1, BROKERS))
    return [
        claim(
            "(000, Fig. 6a) 1,000 publishers: one broker holds the topic within the SLO",
            f"p99 {p99[1]:.2f} ms at k = 1",
            p99[1] <= SLO_MS,
        ),
        claim(
            "(000, Fig. 6a) the p99 grows with every broker added, to "
            f"{PAPER_LIGHT_K6_P99_MS} ms at k = 6",
            "p99 " + ", ".join(f"{p99[k]:.2f}" for k in range(1, BROKERS + 1)) + " ms",
            rising,
        ),
    ]


def fig4(
    out_dir: Path, *, seed: int = 0, quick: bool = False, model: BrokerModel | None = None
) -> FigureResult:
    """1,000 and 6,000 Poisson publishers (batch 1) spread evenly over k = 1..6 idle
    brokers."""
    t0 = time.perf_counter()
    m = figure_model(model)
    # quick: a quarter of the load on a quarter of the capacity keeps the shape
    counts = (250, 1_500) if quick else (1_000, 6_000)
    if quick:
        m = scaled(4, m)
    rows: list[list[Any]] = []
    panels: dict[int, dict[int, dict[str, float]]] = {}
    for n in counts:
        setup = Setup(homogeneous(n), duration_s=duration_for(n, quick), seed=seed, model=m)
        panels[n] = _by_k(setup)
        rows += [
            [n, k, v["p50_ms"], v["p95_ms"], v["p99_ms"], v["token_p99_ms"]]
            for k, v in panels[n].items()
        ]
    light, heavy = ({k: v["p99_ms"] for k, v in panels[n].items()} for n in counts)
    data = {
        "model": m.name,
        "publishers": counts[1],
        "p99_ms": {str(k): v for k, v in heavy.items()},
        "by_k": {str(k): v for k, v in panels[counts[1]].items()},
        "light": {
            "publishers": counts[0],
            "by_k": {str(k): v for k, v in panels[counts[0]].items()},
        },
        "claims": _light_claims(light) + _heavy_claims(heavy),
    }
    fig, grid = axes(2, "Fig. 4: DRL penalty, Poisson publishers, batch 1")
    for ax, n in zip(grid, counts, strict=True):
        per_k = panels[n]
        ks = list(per_k)
        for key, label in (("p50_ms", "median"), ("p95_ms", "95th"), ("p99_ms", "99th")):
            ax.plot(ks, [per_k[k][key] for k in ks], marker="o", label=label)
        slo_axis(ax)
        ax.set_ylabel("latency (ms)")
        ax.set_xlabel("brokers k")
        ax.set_title(f"{n:,} publishers", fontsize=9)
        ax.legend()
    res = FigureResult(
        "fig4",
        "Fig. 4: DRL penalty for Poisson traffic (1,000 and 6,000 publishers)",
        data,
        ["publishers", "k", "p50 ms", "p95 ms", "p99 ms", "token p99 ms"],
        rows,
    )
    return write(res, out_dir, fig, t0)
