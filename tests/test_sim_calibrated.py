"""The simulator's ground truth: the calibration it ships, the one factor that puts it on
the paper's brokers, the verdict a calibration records, and ``--model``."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.experiments.figures.common import figure_model, model_named
from srtm.sim.model import (
    PAPER_CORES,
    PAPER_MCAP,
    BrokerModel,
    Dist,
    at_paper_speed,
    calibrated,
    load,
    paper,
    save,
)

MEASURED = BrokerModel(
    "measured",
    40_000.0,
    1,
    8e-6,
    20e-6,
    2.0,
    Dist("quantiles", q=(0, 0.5, 1), values=(1e-4, 2e-4, 9e-4)),
)


def test_at_paper_speed_scales_every_service_time_by_one_factor() -> None:
    m = at_paper_speed(MEASURED)
    assert (m.mcap, m.cores) == (PAPER_MCAP, PAPER_CORES)
    # cores/per_message_s is the batched throughput: the paper's mcap
    assert m.cores / m.per_message_s == pytest.approx(PAPER_MCAP)
    factor = m.per_message_s / MEASURED.per_message_s
    assert factor == pytest.approx(PAPER_CORES / PAPER_MCAP / 8e-6)
    assert m.notes["service_time_factor"] == pytest.approx(factor)
    # the shape stays as measured: event/message ratio, spread, base latency
    assert m.per_event_s / m.per_message_s == pytest.approx(20e-6 / 8e-6)
    assert m.service_cv == MEASURED.service_cv and m.base == MEASURED.base
    assert m.capacity_at_slo is None  # not the measured broker's any more
    assert at_paper_speed(MEASURED, mcap=55_000, cores=1).per_message_s == pytest.approx(1 / 55_000)


def test_at_paper_speed_refuses_what_it_cannot_scale() -> None:
    with pytest.raises(ValueError, match="mcap"):
        at_paper_speed(MEASURED, mcap=0)
    with pytest.raises(ValueError, match="cores"):
        at_paper_speed(MEASURED, cores=0)
    with pytest.raises(ValueError, match="capacity"):
        at_paper_speed(MEASURED.emulated(2_000))


def test_the_shipped_calibration_says_how_where_and_whether_it_was_disturbed() -> None:
    m = calibrated()
    assert m.name == "calibrated" and m.source == "srtm calibrate" and m.cores == 1
    notes = m.notes
    assert notes["command"].startswith("srtm calibrate")
    assert notes["revision"] and notes["revision"] != "unknown"
    assert notes["machine"]["description"] and notes["measured_at"]
    assert notes["validity"]["verdict"] in ("disturbed", "not disturbed")
    assert notes["steps"] and notes["saturation_msg_per_s"]["mpub10"] > 0
    # what the simulated figures run on by default
    assert figure_model() == at_paper_speed(m) == model_named(None) == model_named("calibrated")


def test_model_named_keeps_paper_as_chosen_and_scales_a_calibration_file(tmp_path: Path) -> None:
    assert model_named("paper") == paper()
    save(MEASURED, tmp_path / "m.json")
    assert model_named(str(tmp_path / "m.json")) == at_paper_speed(load(tmp_path / "m.json"))
    (tmp_path / "bad.json").write_text('{"name": "x"}')
    with pytest.raises(ValueError, match=r"bad\.json: missing model fields"):
        model_named(str(tmp_path / "bad.json"))


def test_the_command_line_refuses_a_bad_model_naming_the_flag(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    res = CliRunner().invoke(
        app,
        ["run", "fig4", "--sim", "--model", str(missing), "--out", str(tmp_path / "o")],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 2 and "--model" in res.output and "nope.json" in res.output
    res = CliRunner().invoke(
        app,
        ["run", "diurnal", "--sim", "--model", "paper", "--out", str(tmp_path / "o")],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 2 and "--model" in res.output and "does not take" in res.output
