"""The utility-aware allocation paper's experiments, simulated (srtm.experiments.utility.sim):
the document's shape, verdicts computed from the run, the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.experiments.utility import sim as u


def oks(result: u.FigureResult) -> list[bool]:
    return [c["ok"] for c in result.data["claims"]]


def test_trading_day_document_has_the_six_segments(tmp_path: Path) -> None:
    result = u.trading_day(tmp_path)
    segments = result.data["segments"]
    assert [s["name"] for s in segments] == [name for name, _ in u.SEGMENTS]
    for s in segments:
        assert set(s) >= {"name", "available", "admitted", "rates"}
        assert set(s["available"]) == set(s["admitted"]) == {"gold", "silver", "bronze"}
        assert len(s["rates"]) == 4
        assert all(s["admitted"][c] <= s["available"][c] for c in u.CLASSES)
        assert s["cpu_used"] <= s["cpu_capacity"] * (1 + 1e-6)
    assert segments[0]["available"] == {"gold": 200, "silver": 400, "bronze": 800}
    assert segments[1]["available"] == {"gold": 20, "silver": 100, "bronze": 800}
    assert all(f.exists() for f in result.files)
    assert {f.suffix for f in result.files} == {".png", ".md", ".json"}


def test_trading_day_reproduces_the_paper_at_our_capacity(tmp_path: Path) -> None:
    result = u.trading_day(tmp_path)
    assert oks(result) == [True] * 4
    end = result.data["segments"][-1]
    assert end["admitted"]["bronze"] == 800 and max(end["rates"]) < u.NEAR * u.R_MAX


@pytest.mark.parametrize(
    ("capacity", "flipped"),
    [(5.0, 2), (300.0, 3)],  # too little: rates low; plenty: no need to lower the rate
)
def test_trading_day_verdicts_follow_the_run(tmp_path: Path, capacity: float, flipped: int) -> None:
    result = u.trading_day(tmp_path, u.Knobs(trading_capacity=capacity))
    assert not oks(result)[flipped]


def test_trading_day_order_verdict_catches_bronze_before_silver() -> None:
    segments = u.trading_day_segments()
    bad = [dict(s, admitted=dict(s["admitted"])) for s in segments]
    bad[0]["admitted"]["bronze"] = 1  # silver is short in the first segment
    assert not u.trading_day_claims(bad)[1]["ok"]
    bad[0]["admitted"]["gold"] = 0
    assert not u.trading_day_claims(bad)[0]["ok"]


def test_excess_capacity_hands_flow_0s_share_to_the_others(tmp_path: Path) -> None:
    result = u.excess_capacity(tmp_path)
    before, after = result.data["segments"]
    assert before["rates"] == pytest.approx([140.0] * 4)
    assert after["rates"] == pytest.approx([50.0, 170.0, 170.0, 170.0])
    assert oks(result) == [True] * 3
    plenty = u.excess_capacity(tmp_path, u.Knobs(excess_capacity=20.0))
    assert oks(plenty) == [False, False, False]


def test_latency_effects_reproduce_and_depend_on_capacity(tmp_path: Path) -> None:
    result = u.latency_effects(tmp_path)
    assert oks(result) == [True] * 4
    last = result.data["segments"][-1]
    assert last["available"]["gold"] == 1000 and 855 <= last["admitted"]["gold"] <= 945
    assert last["rr_rate"] == pytest.approx(u.RR.r_min, rel=0.02)
    assert oks(u.latency_effects(tmp_path, u.Knobs(latency_capacity=100.0)))[1:] == [False] * 3


def test_cli_json_and_live_refusal(tmp_path: Path) -> None:
    runner = CliRunner()
    for name in u.EXPERIMENTS:
        res = runner.invoke(app, ["run", name, "--sim", "--json", "--out", str(tmp_path)])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout.strip().splitlines()[-1])
        assert doc["experiment"] == name and doc["segments"] and doc["claims"]
        assert (tmp_path / f"{name}.png").exists()
        # Live runs are built (tests/test_utility_live.py); a bad decider is refused first.
        live = runner.invoke(app, ["run", name, "--decide", "nobody", "--out", str(tmp_path)])
        assert live.exit_code == 2
        assert "--decide" in live.output


# -- Fig. 7 and Fig. 10 over time (dynamics, reliability, correction) ----------------------
def test_mixed_reliability_reproduces_fig_7(tmp_path: Path) -> None:
    from srtm.experiments.utility import reliability

    result = reliability.mixed_reliability(tmp_path)
    assert oks(result) == [True] * 6
    before, first, settled, _ = result.data["windows"]
    assert before["gold"] == 10 and settled["gold"] == 200
    assert settled["gdfloor_allowed"] < first["gdfloor_allowed"]
    assert all(f.exists() for f in result.files)


def test_mixed_reliability_verdicts_follow_the_disk() -> None:
    """A disk fast enough never caps gdfloor: the latency verdict and bronze's return fail."""
    import dataclasses

    from srtm.experiments.utility import dynamics, reliability
    from srtm.utility.storage import Logger

    fast = dataclasses.replace(reliability.scenario(), logger=Logger(2e9, 1e-5))
    rows = reliability.windows(dynamics.run(fast))
    no_bound = dataclasses.replace(dynamics.Loops(), bound=False)
    unbounded = reliability.windows(dynamics.run(fast, no_bound))[-1]
    verdicts = [c["ok"] for c in reliability.claims(rows, unbounded)]
    assert verdicts[0] and not verdicts[3] and not verdicts[4] and not verdicts[5]


def test_model_correction_reproduces_fig_10_and_needs_the_correction(tmp_path: Path) -> None:
    import dataclasses

    from srtm.experiments.utility import correction, dynamics

    result = correction.model_correction(tmp_path)
    assert oks(result) == [True] * 4
    tests = {r["test"]: r for r in result.data["tests"]}
    assert set(tests) == set(correction.PAPER)
    assert all(r["low"] <= r["average"] <= r["high"] for r in tests.values())
    off = correction.model_correction(
        tmp_path / "off", dataclasses.replace(dynamics.Loops(), correct=False)
    )
    assert not oks(off)[2] and not oks(off)[3]


def test_dynamics_is_deterministic_and_keeps_rates_in_range() -> None:
    from srtm.experiments.utility import correction, dynamics

    sc = correction.excess_capacity()
    a, b = dynamics.run(sc), dynamics.run(sc)
    assert [t.cpu for t in a] == [t.cpu for t in b]
    for t in a:
        for f in sc.flows:
            assert f.r_min - 1e-9 <= t.allowed[f.name] <= f.r_max + 1e-9
    # After flow 0's producers drop to 50, the others take its share (Fig. 8's effect).
    after = dynamics.window(a, correction.EXCESS_DROP_S + 60, correction.EXCESS_S)
    assert dynamics.mean([t.rates["flow-0"] for t in after]) <= 50
    assert dynamics.mean([t.rates["flow-1"] for t in after]) > 150
