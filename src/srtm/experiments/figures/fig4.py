"""Fig. 4: the DRL penalty, one Poisson topic spread evenly over k = 1..6 idle brokers."""

from __future__ import annotations

import time
from pathlib import Path

from srtm.experiments.figures.common import (
    BROKERS,
    SLO_MS,
    FigureResult,
    Setup,
    axes,
    claim,
    duration_for,
    run,
    scaled,
    slo_axis,
    write,
)
from srtm.sim.arrivals import homogeneous


def fig4(out_dir: Path, *, seed: int = 0, quick: bool = False) -> FigureResult:
    """6,000 Poisson publishers (batch 1) spread evenly over k = 1..6 idle brokers."""
    t0 = time.perf_counter()
    n = 1_500 if quick else 6_000
    setup = Setup(homogeneous(n), duration_s=duration_for(n, quick), seed=seed)
    if quick:  # a quarter of the load on a quarter of the capacity keeps the shape
        setup = Setup(setup.publishers, duration_s=setup.duration_s, seed=seed, model=scaled(4))
    rows, per_k = [], {}
    for k in range(1, BROKERS + 1):
        o = run(setup, "conc", k=k)
        s = o.result.topic
        per_k[k] = {
            "p50_ms": s.p50_ms,
            "p95_ms": s.p95_ms,
            "p99_ms": s.p99_ms,
            "token_p99_ms": s.token_p99_ms,
        }
        rows.append([k, s.p50_ms, s.p95_ms, s.p99_ms, s.token_p99_ms])
    p99 = {k: v["p99_ms"] for k, v in per_k.items()}
    best = min(p99, key=lambda k: p99[k])
    rising = all(p99[k + 1] > p99[k] for k in range(2, BROKERS))
    claims = [
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
    data = {
        "publishers": n,
        "p99_ms": {str(k): v for k, v in p99.items()},
        "by_k": {str(k): v for k, v in per_k.items()},
        "claims": claims,
    }
    fig, (ax,) = axes(1, f"Fig. 4: DRL penalty, {n:,} Poisson publishers, batch 1")
    ks = list(per_k)
    for key, label in (("p50_ms", "median"), ("p95_ms", "95th"), ("p99_ms", "99th")):
        ax.plot(ks, [per_k[k][key] for k in ks], marker="o", label=label)
    slo_axis(ax)
    ax.set_ylabel("latency (ms)")
    ax.set_xlabel("brokers k")
    ax.legend()
    res = FigureResult(
        "fig4",
        "Fig. 4: DRL penalty for Poisson traffic",
        data,
        ["k", "p50 ms", "p95 ms", "p99 ms", "token p99 ms"],
        rows,
    )
    return write(res, out_dir, fig, t0)
