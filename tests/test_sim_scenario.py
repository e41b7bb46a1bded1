"""Live scenarios simulated: predictions from the schedule, replays of recorded arrivals,
and the validation table against (here synthetic) live runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from srtm.ratelimit import BucketParams
from srtm.sim.arrivals import homogeneous
from srtm.sim.model import BrokerModel, Dist
from srtm.sim.scenario import LiveSetup, predict, replay, trace_of

MODEL = BrokerModel("t", 1_000.0, 1, 50e-6, 0.0, 0.0, Dist("constant", 300e-6))


def setup(**changes: object) -> LiveSetup:
    specs = homogeneous(60, process="periodic", group_size=10, prefix="sensor-")
    base = LiveSetup(specs, BucketParams(660.0, 30.0), 20.0, 3, 400.0, 300.0,
                     spread_s=0.002, seed=7, duration_s=6.0)  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_replaying_the_schedule_gives_the_schedules_prediction() -> None:
    s = setup()
    ids = [p.id for p in s.specs]
    assignment = {"1": ids[0::2], "2": ids[1::2]}
    buckets = {"1": BucketParams(330.0, 15.0), "2": BucketParams(330.0, 15.0)}
    pred = predict(s, MODEL, "srtm", assignment=assignment, buckets=buckets, warmup_s=2.0)
    trace = trace_of(s)
    index = trace.index()
    arrivals = {
        b: trace.t_ns[trace.rows_of([index[p] for p in ps])] for b, ps in assignment.items()
    }
    rep = replay(arrivals, buckets, MODEL, s.capacity, (2 * 10**9, 6 * 10**9))
    for b in assignment:
        assert np.array_equal(np.sort(rep.brokers[b].latency_ns),
                              np.sort(pred.result.brokers[b].latency_ns))  # fmt: skip
    assert rep.p99_ms == pytest.approx(pred.p99_ms)


def test_emulated_capacity_makes_an_overloaded_broker_queue() -> None:
    s = setup()
    ids = [p.id for p in s.specs]
    one = predict(s, MODEL, "lb", assignment={"1": ids}, buckets={"1": s.bucket})
    three = predict(s, MODEL, "lb")  # 600 msg/s on three brokers of 400
    assert len(three.assignment) == 3
    assert one.p99_ms > 10 * three.p99_ms  # 600 msg/s into a 400 msg/s server


def test_a_bucket_too_small_to_split_leaves_the_topic_unshaped_as_the_controller_does() -> None:
    s = setup(bucket=BucketParams(660.0, 2.0))  # 3 brokers cannot each hold a token
    ids = [p.id for p in s.specs]
    assignment = {"1": ids[:58], "2": ids[58:59], "3": ids[59:]}
    pred = predict(s, MODEL, "lb", assignment=assignment)
    assert set(pred.result.brokers) == {"1", "2", "3"}
    assert pred.result.topic.token_p99_ms == 0.0  # no sub-bucket anywhere


def test_without_an_assignment_the_simulator_places_and_fits() -> None:
    p = predict(setup(), MODEL, "srtm")
    placed = sorted(x for ps in p.assignment.values() for x in ps)
    assert placed == sorted(x.id for x in setup().specs) and sum(p.fitting_rounds) >= 1


def write_run(root: Path, policy: str, s: LiveSetup, measured_p99: float) -> None:
    """A run directory shaped like ``srtm experiment run``'s, with its broker traces."""
    name = f"correlated-sensors-{policy}"
    ids = [p.id for p in s.specs]
    assignment = {"1": ids[0::2], "2": ids[1::2]}
    trace = trace_of(s)
    t0 = 1_700_000_000 * 10**9
    rows: dict[str, list[object]] = {k: [] for k in
                                     ("broker", "topic", "msg_id", "publisher", "t_arrive_ns",
                                      "t_release_ns", "t_dispatch_ns")}  # fmt: skip
    for b, ps in assignment.items():
        sel = trace.rows_of([trace.index()[p] for p in ps])
        for n, r in enumerate(sel):
            t = int(trace.t_ns[r]) + t0
            rows["broker"].append(b)
            rows["topic"].append("sensors")
            rows["msg_id"].append(f"{b}{n:015d}")
            rows["publisher"].append(ids[trace.publisher[r]])
            rows["t_arrive_ns"].append(t)
            rows["t_release_ns"].append(t)
            rows["t_dispatch_ns"].append(t)
    d = root / "traces" / "broker" / f"run={name}"
    d.mkdir(parents=True)
    pq.write_table(pa.table(rows), d / "part-0.parquet")
    buckets = {b: {"rate": 330.0, "burst": 15.0} for b in assignment}
    meta = {"run": name, "assignment": assignment, "buckets": buckets, "capacity": 400.0,
            "window_start_ns": t0 + 2 * 10**9, "window_end_ns": t0 + 6 * 10**9}  # fmt: skip
    (root / "traces" / "runs").mkdir(parents=True, exist_ok=True)
    (root / "traces" / "runs" / f"{name}.json").write_text(json.dumps(meta))
    summary = {"e2e_ms": {"p99": measured_p99}, "token_wait_ms": {"p99": 0.0}}
    (root / f"{name}.json").write_text(json.dumps(summary))


def test_validation_reads_live_runs_and_tables_the_predictions(tmp_path: Path) -> None:
    from srtm.experiments.figures import validate_live
    from srtm.experiments.scenarios import load

    sc = load("correlated-sensors")
    s = setup(specs=sc.specs(), seed=sc.seed, spread_s=sc.spread_ms / 1e3)
    write_run(tmp_path / "runs", "lb", s, measured_p99=5.0)
    res = validate_live(tmp_path / "out", [tmp_path / "runs"], MODEL)
    (entry,) = res.data["runs"]
    assert entry["policy"] == "lb" and entry["measured_p99_ms"] == 5.0
    assert entry["replay_ok"] == (abs(entry["replay_p99_ms"] / 5.0 - 1) <= 0.3)
    assert (tmp_path / "out" / "validation.png").exists()


def test_validation_simulates_a_scaled_run_at_its_scale() -> None:
    # A run on a slow machine ran the scenario slowed in time (its summary's sizing.scale):
    # the nominal schedule on its slowed brokers would overload them.
    from srtm.experiments.figures.validation import live_setup
    from srtm.experiments.scenarios import load

    sc = load("correlated-sensors")
    nominal, _ = live_setup(sc)
    slow, preload = live_setup(sc, 0.55)
    assert slow.capacity == pytest.approx(0.55 * nominal.capacity)
    assert slow.mcap == pytest.approx(0.55 * nominal.mcap)
    assert slow.slo_p99_ms == pytest.approx(nominal.slo_p99_ms / 0.55, rel=1e-2)
    rate = sum(p.rate for p in slow.specs)
    assert rate == pytest.approx(0.55 * sum(p.rate for p in nominal.specs))
    assert slow.bucket.rate < nominal.bucket.rate
    assert preload == {str(p.broker): 0.55 * p.rate for p in sc.preload}
