"""Table I live: the table assembled from the paper's, the simulator's and live rows, the
live topic's scenario and its model-assisted topic document, the options, and (slow) the
quick live run end to end through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.experiments.figures.table1_live import (
    COLUMNS,
    QUICK_GROUPS,
    SLO_MS,
    FitMode,
    FitRow,
    assemble,
    check_model,
    live_row,
    model_view,
    scenario_for,
)
from srtm.experiments.scenarios.live import controller_args, topic_document

QUIET = {
    FitMode.measured: FitRow((2, 1), 10.5, 2, "fitted", 12.0, False),
    FitMode.model_assisted: FitRow((1,), 3.4, 3, "fitted", 9.0, False),
}


def test_the_table_sets_paper_sim_and_both_live_modes_side_by_side() -> None:
    sim = {g: {m: FitRow((1,), 60.0, 1) for m in FitMode} for g in (5, 20)}
    live = {5: QUIET, 20: {**QUIET, FitMode.measured: FitRow((4, 2, 1), 25.0, 3, "fitted")}}
    data, rows = assemble((5, 20), sim, live)
    assert [r[0] for r in rows] == ["5", "20"] and all(len(r) == len(COLUMNS) for r in rows)
    g20 = data["groups"]["20"]
    assert g20["paper"] == {"rounds": [5, 4, 2, 1], "total": 12, "seconds": 745.0, "brokers": 4}
    assert set(g20["sim"]) == set(g20["live"]) == {"measured", "model_assisted"}
    live20 = g20["live"]
    assert live20["measured"]["total"] == 7 and live20["measured"]["brokers"] == 3
    assert live20["model_assisted"] == {
        "rounds": [1], "total": 1, "seconds": 3.4, "brokers": 3, "outcome": "fitted",
        "p99_ms": 9.0, "validity": "not disturbed", "disturbed_by": [], "steps": [],
    }  # fmt: skip
    assert "4 2 1 (7) · 25 s → 3" in rows[1]
    more_rounds, more_brokers, one_round = data["claims"]
    assert more_rounds["ok"] is True and more_brokers["ok"] is True
    assert one_round["ok"] is True


def test_claims_are_judged_on_undisturbed_rows_only() -> None:
    sim = {g: {m: FitRow((1,), 60.0, 1) for m in FitMode} for g in (5, 20)}
    busy = {m: FitRow((3,), 9.0, 1, "disturbed", None, True, ("loop lag",)) for m in FitMode}
    data, rows = assemble((5, 20), sim, {5: QUIET, 20: busy})
    assert "[disturbed]" in rows[1][4]
    assert [c["ok"] for c in data["claims"]][:2] == [None, None]  # one quiet group: no trend
    assert data["groups"]["20"]["live"]["measured"]["validity"] == "disturbed"
    # Model-assisted in more than one round is reported as not converging in one.
    slow = {**QUIET, FitMode.model_assisted: FitRow((2, 1), 9.0, 3, "fitted", 9.0, False)}
    data, _ = assemble((5, 20), sim, {5: QUIET, 20: slow})
    assert data["claims"][2]["ok"] is False and "[5]" in data["claims"][2]["live"]


def test_a_live_row_reads_a_runs_summary_and_a_stopped_fitting_is_disturbed() -> None:
    summary = {
        "fitting_rounds": [3, 1], "fitting_s": 14.2, "brokers_assigned": 2,
        "fitting_outcome": "fitted", "e2e_ms": {"p99": 15.5},
        "validity": {"status": "valid", "reasons": []},
    }  # fmt: skip
    steps = [{"iteration": 1, "round": 1, "broker": "1", "p99_ms": 30.0}]
    row = live_row(summary, {"steps": steps})
    assert (row.rounds, row.total, row.seconds, row.brokers) == ((3, 1), 4, 14.2, 2)
    assert row.p99_ms == 15.5 and row.disturbed is False and row.steps == tuple(steps)
    stopped = live_row(
        summary | {"fitting_outcome": "disturbed", "fitting_note": "loop lagged"}, None
    )
    assert stopped.disturbed is True and stopped.disturbed_by[0] == "fitting: loop lagged"
    assert live_row({"fitting_rounds": [1]}, None).disturbed is True  # never measured


def test_the_model_assisted_topic_names_its_model_under_the_controllers_models_dir(
    tmp_path: Path,
) -> None:
    model = tmp_path / "m.json"
    sc = scenario_for(20, FitMode.model_assisted, model)
    assert sc.rate == 300.0 and len({p.group for p in sc.specs()}) == 15
    doc = topic_document(sc, "srtm", sc.specs())
    assert doc["fit"]["model"] == "m.json"
    assert controller_args(sc) == ["--models-dir", str(tmp_path.resolve())]
    plain = scenario_for(20, FitMode.measured, model)
    assert "model" not in topic_document(plain, "srtm", plain.specs())["fit"]
    assert controller_args(plain) == []


def test_a_bad_model_file_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json"):
        check_model(bad)
    result = CliRunner().invoke(
        app,
        ["run", "table1", "--live", "--model", str(bad), "--out", str(tmp_path)],
        env={"COLUMNS": "400"},  # the error box must not wrap the long temporary path
    )
    assert result.exit_code == 2 and "bad.json" in result.output  # before any broker starts
    sim = CliRunner().invoke(app, ["run", "table1", "--sim", "--model", str(bad)])
    assert sim.exit_code == 2 and "--model" in sim.output  # the simulation takes none


def test_the_model_view_is_what_the_controllers_predictor_says_of_one_broker() -> None:
    # The paper's broker serves a message in 9 µs: the topic's 300 msg/s fit one broker
    # in the model too, once its Poisson draw has a bucket that fits it (before, token
    # waits alone put p99 at 290 ms and the model kept none).
    view = model_view(5, Path("paper"))
    assert view["publishers"] == 300 and view["keeps"] == 300
    assert 0 < view["p99_all_on_one_ms"] < 0.5 * SLO_MS and view["burst"] >= 1


@pytest.mark.slow
def test_table1_live_quick_end_to_end(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["run", "table1", "--live", "--quick", "--out", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["mode"] == "live" and doc["validity"] in ("disturbed", "not disturbed")
    assert Path(doc["model"]).is_file()  # calibrated in the run
    assert sorted(doc["groups"]) == sorted(str(g) for g in QUICK_GROUPS)
    for entry in doc["groups"].values():
        assert set(entry) == {"paper", "sim", "live", "model_view"}
        assert set(entry["live"]) == {"measured", "model_assisted"}
        for row in entry["live"].values():
            assert row["total"] == sum(row["rounds"]) >= 1
            assert row["brokers"] >= 1 and row["validity"] in ("disturbed", "not disturbed")
            assert row["steps"]  # the rounds it measured
    assert (tmp_path / "table1-live.json").is_file() and (tmp_path / "table1-live.md").is_file()
