"""A broker model under plain load: the p99 of an unshaped Poisson stream at a given rate,
and the rate at which that p99 reaches the SLO (the model's capacity at the SLO)."""

from __future__ import annotations

import numpy as np

from srtm.sim.arrivals import NS_PER_S, Trace
from srtm.sim.engine import Share, Stats, simulate
from srtm.sim.model import BrokerModel
from srtm.workload import PublisherSpec


def poisson_trace(rate: float, duration_s: float, seed: int = 0, batch: int = 1) -> Trace:
    """One stream of Poisson events at ``rate / batch`` per second, ``batch`` messages each."""
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate / batch * duration_s)
    events = np.sort(rng.uniform(0, duration_s * NS_PER_S, n)).astype(np.int64)
    first = np.zeros(n * batch, dtype=bool)
    first[::batch] = True
    spec = PublisherSpec("load", rate, "poisson", batch)
    return Trace(
        np.repeat(events, batch), np.zeros(n * batch, np.int32), first, (spec,), duration_s
    )


def probe(
    model: BrokerModel, rate: float, duration_s: float = 10.0, seed: int = 0, batch: int = 1
) -> Stats:
    """Latency of ``rate`` msg/s of unshaped Poisson load alone on one broker."""
    trace = poisson_trace(rate, duration_s, seed, batch)
    r = simulate(
        trace, [Share("b", [0], None)], model, seed=seed, warmup_s=min(1.0, duration_s / 10)
    )
    return r.topic


def capacity_at_slo(
    model: BrokerModel, slo_ms: float | None = None, duration_s: float = 10.0, seed: int = 0
) -> float:
    """The Poisson batch-1 rate (msg/s) whose p99 is the SLO, by bisection (0 if even a
    trickle misses it, since the base latency alone does)."""
    slo = model.slo_p99_ms if slo_ms is None else slo_ms
    lo, hi = 0.0, model.throughput
    if probe(model, hi * 0.01, duration_s, seed).p99_ms > slo:
        return 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if probe(model, mid, duration_s, seed).p99_ms <= slo:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.002 * hi:
            break
    return lo
