"""The paper's figures, simulated: every one runs (quick), writes its files, returns JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srtm.experiments.figures import FIGURES, run_figure
from srtm.sim.model import paper


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_figure_runs_and_writes_its_files(name: str, tmp_path: Path) -> None:
    res = run_figure(name, tmp_path, quick=True)
    assert res.name == name and res.rows and res.columns
    assert all(len(r) == len(res.columns) for r in res.rows)
    for suffix in (".png", ".md", ".json"):
        assert (tmp_path / f"{name}{suffix}").stat().st_size > 0
    assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["data"] == json.loads(json.dumps(res.data))
    assert res.data["claims"] and all(isinstance(c["ok"], bool) for c in res.data["claims"])


def test_fig4_reports_p99_per_k_and_the_trade_off(tmp_path: Path) -> None:
    # the model chosen for the paper's thresholds: the harness, not the calibration, on test
    res = run_figure("fig4", tmp_path, quick=True, model=paper())
    p99 = {int(k): v for k, v in res.data["p99_ms"].items()}
    assert sorted(p99) == [1, 2, 3, 4, 5, 6]
    assert min(p99, key=lambda k: p99[k]) == 2  # saturation at 1, DRL penalty beyond 2
    # 000's Fig. 6a: a light topic, where every broker added only adds the DRL penalty
    light = {int(k): v["p99_ms"] for k, v in res.data["light"]["by_k"].items()}
    assert min(light, key=lambda k: light[k]) == 1
    assert all(light[k + 1] > light[k] for k in range(1, 6))
    assert res.data["model"] == "paper/4"


def test_table1_reports_rounds_per_group_and_method(tmp_path: Path) -> None:
    # the chosen model: a test of the fitting loop, not of the calibration
    res = run_figure("table1", tmp_path, quick=True, model=paper())
    for entry in res.data["groups"].values():
        assert set(entry) == {"paper", "measured", "model_assisted"}
        for method in ("measured", "model_assisted"):
            assert entry[method]["total"] == sum(entry[method]["rounds"])
            assert entry[method]["unassigned"] == 0
        assert entry["model_assisted"]["total"] <= 2
        assert entry["model_assisted"]["total"] <= entry["measured"]["total"]


def test_an_unknown_figure_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown figure"):
        run_figure("fig99", tmp_path)
