"""The DRL penalty of k-way equal splits: the M/D/1 model beside a simulated trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from srtm.analysis.delays import IntArray, token_delays
from srtm.analysis.md1 import DelayModel, bucket_model
from srtm.ratelimit import NS_PER_S, check_burst, check_rate, split


@dataclass(frozen=True, slots=True)
class SimDelay:
    """Token delay measured on a simulated trace."""

    prob_delayed: float
    mean_s: float
    p99_s: float


@dataclass(frozen=True, slots=True)
class DrlRow:
    """One split width ``k``: sub-bucket, model prediction (None if infeasible) and simulation."""

    k: int
    sub_rate: float
    sub_burst: float
    model: DelayModel | None
    sim: SimDelay | None
    note: str = ""


def poisson_batches(
    rng: np.random.Generator, rate: float, messages: int, batch: int = 1
) -> IntArray:
    """Batch-Poisson arrival times (ns): events at ``rate/batch`` of ``batch`` messages each."""
    events = -(-messages // batch)
    gaps = rng.exponential(NS_PER_S * batch / rate, events)
    return np.cumsum(gaps).astype(np.int64)


def simulate_split(
    arrivals: IntArray, rate: float, burst: float, k: int, batch: int, rng: np.random.Generator
) -> SimDelay:
    """Token delays when each batch goes to one of ``k`` equal sub-buckets at random."""
    subs = split(rate, burst, [1.0] * k)
    owner = rng.integers(0, k, arrivals.size)
    delays = []
    for i, sub in enumerate(subs):
        mine = np.repeat(arrivals[owner == i], batch)
        delays.append(token_delays(mine, sub.rate, sub.burst))
    d = np.concatenate(delays)
    return SimDelay(
        prob_delayed=float(np.mean(d > 0)),
        mean_s=float(d.mean()) / NS_PER_S,
        p99_s=float(np.quantile(d, 0.99)) / NS_PER_S,
    )


def drl_table(
    rate: float,
    burst: float,
    load: float,
    k_max: int,
    batch: int = 1,
    messages: int = 1_000_000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> list[DrlRow]:
    """Model and simulation for ``k = 1..k_max``.

    With ``batch > 1`` the model counts in batches (rate, burst and arrival rate
    divided by the batch size, as the paper argues), so it describes the last
    message of each batch; the simulation releases every message on its own.
    """
    rate = check_rate(rate)
    burst = check_burst(burst)
    if not 0 < load < 1:
        raise ValueError(f"load must be in (0, 1), got {load!r}")
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max!r}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch!r}")
    if messages < 1:
        raise ValueError(f"messages must be >= 1, got {messages!r}")
    rng = np.random.default_rng(seed)
    arrivals = poisson_batches(rng, load * rate, messages, batch)
    rows = []
    for k in range(1, k_max + 1):
        sub_rate, sub_burst = rate / k, burst / k
        if sub_burst < 1:
            note = f"infeasible: b/k = {sub_burst:.3g} < 1"
            rows.append(DrlRow(k, sub_rate, sub_burst, None, None, note))
        else:
            model_burst = sub_burst / batch
            model = bucket_model(load, sub_rate / batch, model_burst) if model_burst >= 1 else None
            sim = simulate_split(arrivals, rate, burst, k, batch, rng)
            note = "" if model else f"no model: b/(k·batch) = {model_burst:.3g} < 1"
            rows.append(DrlRow(k, sub_rate, sub_burst, model, sim, note))
        if progress:
            progress(k)
    return rows
