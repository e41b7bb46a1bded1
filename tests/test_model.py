"""The M/D/1 model of Eq. (1) against simulated Poisson traces, and Proposition 1."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from srtm.analysis import (
    bucket_model,
    grid_delays,
    mean_excess,
    poisson_batches,
    simulate_split,
    split_model,
    work_cdf,
)
from srtm.ratelimit import Grid

RATE = 10_000.0


@pytest.mark.parametrize("load", [0.5, 0.8, 0.9])
def test_work_distribution_basics(load: float) -> None:
    assert work_cdf(0.0, load) == pytest.approx(1 - load)
    assert mean_excess(load, 0.0) == pytest.approx(load / (2 * (1 - load)))
    values = [work_cdf(x, load) for x in np.linspace(0, 60, 121)]
    assert values == sorted(values)
    assert values[-1] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize(
    ("load", "burst", "k"),
    [
        (0.5, 4.0, 1),
        (0.5, 8.0, 4),
        (0.8, 8.0, 1),
        (0.8, 8.0, 2),
        (0.9, 8.0, 1),
        (0.9, 16.0, 4),
    ],
)
def test_model_matches_simulated_poisson_within_5_percent(
    load: float, burst: float, k: int
) -> None:
    rng = np.random.default_rng(2024)
    arrivals = poisson_batches(rng, load * RATE, 4_000_000)
    sim = simulate_split(arrivals, RATE, burst, k, 1, rng)
    model = split_model(load, RATE, burst, k)
    assert sim.prob_delayed > 0.01  # enough delayed messages to measure
    assert model.prob_delayed == pytest.approx(sim.prob_delayed, rel=0.05)
    assert model.mean_s == pytest.approx(sim.mean_s, rel=0.05)


def test_split_penalty_is_at_least_k_fold() -> None:
    # Eq. (1): with r_l = r/k the mean delay grows at least k-fold.
    one = bucket_model(0.8, RATE, 12.0)
    for k in (2, 3, 4):
        assert split_model(0.8, RATE, 12.0, k).mean_s >= k * one.mean_s


def test_model_rejects_impossible_inputs() -> None:
    with pytest.raises(ValueError, match=r"load \(λ/r\) must be in \(0, 1\)"):
        bucket_model(1.0, RATE, 4.0)
    with pytest.raises(ValueError, match=r"burst 3.0 split 4 ways gives 0.75 < 1 token"):
        split_model(0.5, RATE, 3.0, 4)


def running_delay_sums(arrivals: np.ndarray, delays: np.ndarray, at: np.ndarray) -> np.ndarray:
    """S(t): delay accrued by all messages up to each time in ``at``."""
    accrued = np.clip(at[:, None] - arrivals[None, :], 0, delays[None, :])
    return accrued.sum(axis=1)


@st.composite
def split_systems(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, Grid, list[Grid]]:
    """A bucket and a k-way split with Σ r_l = r and Σ b_l = b exactly on the ns grid."""
    k = draw(st.integers(min_value=2, max_value=4))
    shares = draw(st.lists(st.integers(1, 4), min_size=k, max_size=k))
    total = sum(shares)
    # T_l = T·C/c_l is whole when T is a multiple of C·lcm(c_l).
    unit = total * int(np.lcm.reduce(shares))
    t = unit * draw(st.integers(min_value=1, max_value=2000))
    bursts = draw(st.lists(st.integers(1, 5), min_size=k, max_size=k))
    big = Grid(t, (sum(bursts) - 1) * t)
    subs = []
    for c, b_l in zip(shares, bursts, strict=True):
        t_l = t * total // c
        subs.append(Grid(t_l, (b_l - 1) * t_l))
    n = draw(st.integers(min_value=1, max_value=60))
    gaps = draw(st.lists(st.integers(0, 2 * t), min_size=n, max_size=n))
    arrivals = np.cumsum(np.array(gaps, dtype=np.int64))
    owner = np.array(draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    return arrivals, owner, big, subs


@given(split_systems())
def test_proposition_1_splitting_never_reduces_the_running_delay(
    system: tuple[np.ndarray, np.ndarray, Grid, list[Grid]],
) -> None:
    arrivals, owner, big, subs = system
    one = grid_delays(arrivals, big)
    split = np.zeros_like(one)
    for i, g in enumerate(subs):
        mine = owner == i
        split[mine] = grid_delays(arrivals[mine], g)
    assume(one.size > 0)
    at = np.unique(np.concatenate([arrivals, arrivals + one, arrivals + split]))
    assert np.all(running_delay_sums(arrivals, split, at) >= running_delay_sums(arrivals, one, at))
