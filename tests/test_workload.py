"""Workload schedules: Poisson passes KS, periodic phases are uniform, groups fire within
their spread, batch sizes are exact, seeds reproduce."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

from srtm.workload import PublisherSpec, build


def test_poisson_inter_arrivals_pass_kolmogorov_smirnov() -> None:
    sched = build([PublisherSpec("p", 200.0)], duration_s=60, seed=1)
    gaps = np.diff(sched.t_ns) / 1e9
    assert len(gaps) > 10_000
    assert stats.kstest(gaps, "expon", args=(0, 1 / 200)).pvalue > 0.01
    # ... and the same gaps are clearly not a different rate.
    assert stats.kstest(gaps, "expon", args=(0, 1 / 180)).pvalue < 1e-6


def test_periodic_phases_are_uniform_and_periods_exact() -> None:
    pubs = [PublisherSpec(f"p{i}", 10.0, "periodic") for i in range(2_000)]
    sched = build(pubs, duration_s=1.0, seed=2)
    first = np.full(len(pubs), np.inf)
    np.minimum.at(first, sched.publisher, sched.t_ns / 1e9)
    assert stats.kstest(first / 0.1, "uniform").pvalue > 0.01  # phase / period
    one = np.sort(sched.t_ns[sched.publisher == 0])
    assert np.allclose(np.diff(one), 100_000_000, atol=1)


@pytest.mark.parametrize("spread_ms", [0.0, 2.0, 16.0])
def test_group_members_fire_within_the_spread(spread_ms: float) -> None:
    pubs = [PublisherSpec(f"p{i}", 10.0, "poisson", group=f"g{i // 25}") for i in range(100)]
    sched = build(pubs, duration_s=2.0, spread_s=spread_ms / 1e3, seed=3)
    for g in range(4):
        members = [i for i, p in enumerate(pubs) if p.group == f"g{g}"]
        per_member = [np.sort(sched.t_ns[sched.publisher == i]) for i in members]
        events = per_member[0]  # offset 0: the group's own events
        assert len(events) > 5
        for j, t in enumerate(per_member):  # later members may miss events near the end
            offset = t[: len(events)] - events[: len(t)]
            expected = round(j * spread_ms * 1e6 / 24)
            assert np.all(np.abs(offset - expected) <= 1), (g, j)  # evenly spread, in [0, spread]


def test_batch_sizes_are_exact_and_messages_counted() -> None:
    pubs = [PublisherSpec("a", 100.0, batch=10), PublisherSpec("b", 50.0, "periodic", batch=5)]
    sched = build(pubs, duration_s=10, seed=4)
    assert set(sched.batch[sched.publisher == 0]) == {10}
    assert set(sched.batch[sched.publisher == 1]) == {5}
    assert sched.messages == int(sched.batch.sum()) == len(sched.arrivals_ns())
    assert abs((sched.batch[sched.publisher == 0].sum()) / 10 - 100) < 15  # ~100 msg/s
    assert sched.batch[sched.publisher == 1].sum() == 500  # periodic: exactly 50/s


def test_same_seed_same_schedule_other_seed_other() -> None:
    pubs = [PublisherSpec(f"p{i}", 20.0, group=f"g{i % 3}") for i in range(30)]
    a, b = build(pubs, 5, seed=9), build(pubs, 5, seed=9)
    assert np.array_equal(a.t_ns, b.t_ns) and np.array_equal(a.publisher, b.publisher)
    assert not np.array_equal(a.t_ns, build(pubs, 5, seed=10).t_ns)
    assert np.all(np.diff(a.t_ns) >= 0)


def test_the_schedule_writes_an_arrival_trace(tmp_path: Path) -> None:
    pubs = [
        PublisherSpec("a", 100.0, batch=3, group="g"),
        PublisherSpec("b", 100.0, batch=3, group="g"),
    ]
    sched = build(pubs, 1.0, spread_s=0.001, seed=5)
    sched.write_trace(tmp_path / "trace.parquet")
    rows = pq.read_table(tmp_path / "trace.parquet")
    assert rows.num_rows == sched.messages
    assert rows.column("t_arrive_ns").to_pylist() == sched.arrivals_ns().tolist()
    assert set(rows.column("group").to_pylist()) == {"g"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"id": "p", "rate": 0.0}, "rate"),
        ({"id": "p", "rate": 1.0, "batch": 0}, "batch"),
        ({"id": "p", "rate": 1.0, "process": "bursty"}, "process"),
    ],
)
def test_bad_publishers_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PublisherSpec(**kwargs)  # type: ignore[arg-type]


def test_group_members_must_fire_alike() -> None:
    pubs = [PublisherSpec("a", 10.0, group="g"), PublisherSpec("b", 20.0, group="g")]
    with pytest.raises(ValueError, match=r"group 'g'.*'b'"):
        build(pubs, 1.0)
