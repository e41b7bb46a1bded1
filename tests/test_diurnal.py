"""The diurnal scenario simulated (issue 18 item 5, --sim): document, verdicts, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtm.experiments.diurnal.sim import DiurnalSettings, diurnal_sim, offered_fraction, run

#: A small day: 1/10 of the paper's brokers and sensors, 12 windows, short simulations.
SMALL = DiurnalSettings(windows=12, sim_s=0.5, warmup_s=0.1, topics=36, scale=10, slo_ms=60.0)


def test_offered_ramps_from_low_to_peak_and_back() -> None:
    f = [offered_fraction(SMALL, i) for i in range(SMALL.windows)]
    assert f[0] < 0.35 and f[-1] < 0.35 and max(f) > 0.95
    assert f.index(max(f)) in (5, 6)


def test_document_shape(tmp_path: Path) -> None:
    res = diurnal_sim(tmp_path, SMALL)
    doc = json.loads((tmp_path / "diurnal.json").read_text())["data"]
    assert len(doc["windows"]) == SMALL.windows
    for w in doc["windows"]:
        assert set(w) == {"t_s", "offered_msgs", "brokers", "p99_ms", "slo_met"}
    for key in ("spawned", "despawned", "published", "delivered"):
        assert isinstance(doc[key], int)
    assert doc["delivered"] <= doc["published"]
    assert {c["ok"] for c in doc["claims"]} <= {True, False} and len(doc["claims"]) == 5
    assert (tmp_path / "diurnal.png").stat().st_size > 0
    assert res.rows and len(res.rows) == SMALL.windows


def test_loop_off_never_spawns_and_loses_the_killed_brokers_excess() -> None:
    off = run(SMALL, loop=False)
    assert off["spawned"] == off["despawned"] == off["moves"] == 0
    assert [w["brokers"] for w in off["windows"]][-1] == SMALL.start_brokers - 1
    assert any(e["kind"] == "kill" for e in off["events"])


def test_verdicts_follow_the_settings(tmp_path: Path) -> None:
    """A loose SLO passes the SLO verdict; one below any latency flips it."""
    loose = diurnal_sim(tmp_path / "a", replace(SMALL, slo_ms=1e6)).data["claims"]
    tight = diurnal_sim(tmp_path / "b", replace(SMALL, slo_ms=1e-3)).data["claims"]
    slo = "loop on: SLO held in ≥ 95 % of windows"
    assert next(c for c in loose if c["paper"] == slo)["ok"] is True
    assert next(c for c in tight if c["paper"] == slo)["ok"] is False


def test_loop_on_spawns_at_the_peak() -> None:
    on = run(SMALL, loop=True)
    b = [w["brokers"] for w in on["windows"]]
    assert max(b) > b[0] and on["spawned"] > 0


@pytest.mark.parametrize("flag", ["--json"])
def test_cli_sim_json_is_one_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    from srtm.cli.experiment import app
    from srtm.experiments.diurnal import sim as sim_module

    real = sim_module.diurnal_sim
    monkeypatch.setattr(sim_module, "diurnal_sim", lambda out, s=None: real(out, SMALL))
    result = CliRunner().invoke(app, ["run", "diurnal", "--sim", flag, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(doc["windows"]) == SMALL.windows and "published" in doc
