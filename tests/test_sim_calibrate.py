"""Calibration: fitting a model to measurements, and a short run against a real broker."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from srtm.experiments.calibrate import (
    CalibrationMeasurements,
    CalibrationPlan,
    fit,
    measure,
    measured_capacity,
    validity,
)
from srtm.experiments.host import HostFigures
from srtm.sim.model import BrokerModel, Dist, load, save
from srtm.sim.probe import probe


def test_capacity_is_where_the_measured_p99_crosses_the_slo() -> None:
    steps = [(1_000.0, 0.2, 0.5, 100), (2_000.0, 0.3, 0.8, 100), (3_000.0, 0.5, 3.2, 100)]
    cap = measured_capacity(steps, 1.0)
    assert 2_000 < cap < 3_000
    # log-linear between (2000, 0.8) and (3000, 3.2): p99 doubles every 500 msg/s
    assert cap == pytest.approx(2_000 + 1_000 * math.log(1 / 0.8) / math.log(4), rel=1e-9)
    assert measured_capacity(steps[:2], 1.0) == 2_000  # never crossed: a lower bound
    assert measured_capacity([(1_000.0, 2.0, 5.0, 10)], 1.0) == 0.0


@pytest.mark.slow
def test_fit_recovers_a_known_broker() -> None:
    truth = BrokerModel("truth", 1.0, 1, 8e-6, 12e-6, 1.0, Dist("constant", 150e-6))
    plan = CalibrationPlan(step_s=2.0, fractions=(0.2, 0.5, 0.7, 0.85, 0.95))
    m = CalibrationMeasurements(saturation={"pub": 60_000.0, "mpub10": 1 / (8e-6 + 1.2e-6),
                                 "pub_16conn": 55_000.0})  # fmt: skip
    rng = np.random.default_rng(0)
    m.trickle_ns = list((150e-6 + 9.2e-6 + rng.exponential(5e-6, 2_000)) * 1e9)
    top = truth.throughput
    for f in plan.fractions:
        s = probe(truth, f * top, plan.step_s, seed=11)
        m.steps.append((f * top, s.p50_ms, s.p99_ms, s.messages))
    model = fit(m, plan)
    assert model.per_event_s == pytest.approx(12e-6, rel=0.35)
    assert model.notes["fit_mean_abs_log_error"] < 0.15
    assert model.mcap == pytest.approx(model.notes["measured_capacity_at_slo"])
    assert 0.8 * top < model.capacity_at_slo < top  # type: ignore[operator]


@pytest.mark.slow
def test_a_short_calibration_against_a_real_broker(tmp_path: Path) -> None:
    plan = CalibrationPlan(step_s=0.6, saturation_s=0.5, trickle_rate=400, fractions=(0.1, 0.3))
    seen: list[str] = []
    m = measure(plan, lambda what, done, total: seen.append(what))
    assert len(seen) == plan.steps() and seen[0] == "starting a broker"
    assert m.saturation["mpub10"] > 1_000 and m.saturation["pub"] > 1_000
    assert len(m.trickle_ns) > 100 and all(x > 0 for x in m.trickle_ns)
    assert [n > 0 for _, _, _, n in m.steps] == [True, True]
    model = fit(m, replace(plan))
    save(model, tmp_path / "m.json")
    assert load(tmp_path / "m.json") == model and model.mcap > 0
    notes = model.notes
    assert notes["command"].startswith("srtm calibrate") and notes["revision"]
    assert notes["validity"]["verdict"] in ("disturbed", "not disturbed")


def test_saturating_an_emulated_server_leaves_no_backlog_for_the_next_step(
    tmp_path: Path,
) -> None:
    """A ``--capacity`` broker takes messages faster than its server delivers them: the
    first saturation step's backlog held the server through the next ones, which then
    delivered nothing (and calibration divided by zero). Bounded, each step delivers."""
    from srtm.experiments.calibrate import _generator
    from srtm.launch import start_broker

    broker = start_broker(tmp_path / "b", ["--capacity", "1000", "--release-spin-us", "0"])
    try:
        with _generator(broker.tcp, []) as call:
            rates = [
                call("saturate", 30, batch=batch, connections=1, seconds=0.8, max_undelivered=200)
                for batch in (1, 10, 1)
            ]
    finally:
        broker.stop()
    assert all(300 < r < 1_100 for r in rates), rates


def _figures(wait: float | None = 0.1, foreign: float | None = 0.05) -> HostFigures:
    return HostFigures(run_queue_wait=wait, waited_most=42, steal=0.0, foreign_cpu=foreign, cpus=2)


def test_a_calibration_on_a_busy_machine_is_disturbed_and_says_why() -> None:
    quiet = validity(_figures())
    assert quiet["verdict"] == "not disturbed" and quiet["reasons"] == []
    busy = validity(_figures(foreign=0.69))
    assert busy["verdict"] == "disturbed"
    assert busy["reasons"] == [
        "other processes used 69% of the 2 CPUs (at most 25% leaves the broker and the "
        "generator theirs)"
    ]
    starved = validity(_figures(wait=0.5, foreign=0.3))
    assert starved["verdict"] == "disturbed"
    assert starved["reasons"][0] == "42 waited for a CPU 50% of the calibration"
    assert len(starved["reasons"]) == 2  # the foreign share once, beside it
    assert validity(None)["verdict"] == "unknown"
    json.dumps(busy)  # kept in the model file as it is


def test_the_plan_names_the_command_that_measures_it() -> None:
    assert CalibrationPlan().command() == "srtm calibrate"
    plan = CalibrationPlan(slo_p99_ms=20, step_s=4, broker_args=("--capacity", "2000"))
    assert plan.command() == (
        "srtm calibrate --slo-ms 20 --step-s 4 --broker-arg=--capacity --broker-arg=2000"
    )
