"""The utility paper's experiments live at small scale: the scaled stages, the verdicts on
measured stages, the report, and (slow) a quick live trading day through the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.experiments.utility import live as utility_live
from srtm.experiments.utility import report as utility_report
from srtm.experiments.utility import scenario as utility_scale
from srtm.experiments.utility.scenario import BROKER, CPU, LiveExperiment
from srtm.experiments.utility.sim import live_claims
from srtm.utility import usage


def planned(exp: LiveExperiment) -> list[dict[str, Any]]:
    """Each stage as a live run would report it had it got exactly the plan."""
    out = []
    for stage in exp.stages:
        alloc = utility_scale.plan(exp, stage)
        flows = [
            {"name": f.name, "available": dict(f.consumers), "rate": alloc.rates[f.name],
             "admitted": {c: alloc.admitted.get((f.name, c), 0) for c in f.consumers}}
            for f in stage.flows
        ]  # fmt: skip
        used = usage(utility_scale.problem(exp, stage), alloc.rates, alloc.admitted)
        out.append({
            "name": stage.name,
            "available": {c: sum(f.consumers.get(c, 0) for f in stage.flows) for c in exp.classes},
            "admitted": {c: sum(f["admitted"].get(c, 0) for f in flows) for c in exp.classes},
            "rates": [f["rate"] for f in flows], "flows": flows,
            "cpu_used": used[(BROKER, CPU)], "cpu_capacity": exp.cpu_capacity,
            "expected": {"rates": [f["rate"] for f in flows], "admitted": {}},
        })  # fmt: skip
    return out


def test_the_trading_day_is_the_papers_scaled_down() -> None:
    exp = utility_scale.trading_day()
    assert exp.stages[0].name == "Start of Day" and len(exp.stages) == 6
    start = planned(exp)[0]
    assert start["available"] == {"gold": 12, "silver": 24, "bronze": 48}
    coffee = planned(exp)[1]
    assert coffee["available"] == {"gold": 1, "silver": 6, "bronze": 48}
    for f in exp.stages[0].flows:
        assert f.utility["kind"] == "one-to-many"
        assert [c["utility"]["slope"] for c in f.utility["classes"]] == [100.0, 10.0, 1.0]


@pytest.mark.parametrize("name", sorted(utility_scale.EXPERIMENTS))
def test_the_plan_at_the_live_scale_keeps_the_papers_conclusions(name: str) -> None:
    exp = utility_scale.EXPERIMENTS[name]()
    claims = live_claims(name, planned(exp), exp.params)
    assert claims and all(c["ok"] for c in claims), claims


def test_a_broker_with_room_for_everyone_fails_the_lowered_rate_verdict() -> None:
    exp = utility_scale.trading_day(capacity=10 * utility_scale.TRADING_CAPACITY)
    claims = live_claims(exp.name, planned(exp), exp.params)
    assert [c["ok"] for c in claims] == [True, True, True, False]


def test_bronze_measured_in_before_gold_fails_two_verdicts() -> None:
    exp = utility_scale.trading_day()
    stages = planned(exp)
    stages[0]["admitted"] = {"gold": 11, "silver": 13, "bronze": 1}
    claims = live_claims(exp.name, stages, exp.params)
    assert [c["ok"] for c in claims] == [False, False, True, True]
    assert "Start of Day" in claims[0]["sim"]


def test_a_flow_without_higher_classes_may_run_slower_while_others_have_them() -> None:
    """Lunch at small scale: one silver consumer, on one flow; the other flows carry only
    bronze and are lowered. Judged per flow, the rate verdict holds."""
    exp = utility_scale.trading_day()
    lunch = planned(exp)[3]
    assert lunch["available"]["silver"] == 1 and min(lunch["rates"]) < 0.9 * utility_scale.R_MAX
    del lunch["flows"]
    claims = live_claims(exp.name, [lunch], exp.params)
    assert not claims[2]["ok"]  # judged over every flow it would fail


def test_excess_capacity_verdicts_follow_the_rates() -> None:
    exp = utility_scale.excess_capacity()
    stages = planned(exp)
    assert all(c["ok"] for c in live_claims(exp.name, stages, exp.params))
    stages[1]["rates"] = [12.5, 35.0, 35.0, 35.0]  # nobody took flow 0's share
    stages[1]["cpu_used"] = 0.7 * exp.cpu_capacity
    claims = live_claims(exp.name, stages, exp.params)
    assert [c["ok"] for c in claims] == [True, False, False]


def test_the_report_writes_a_plot_and_a_page(tmp_path: Path) -> None:
    exp = utility_scale.latency_effects()
    stages = planned(exp)
    for s in stages:
        s["broker_cpu"] = None
    summary = {
        "experiment": exp.name, "title": exp.title, "mode": "driver-optimized",
        "stage_s": 7.0, "segments": stages, "claims": live_claims(exp.name, stages, exp.params),
        "disturbed": "a run process waited for a CPU 55% of the run",
    }  # fmt: skip
    png = utility_report.plot(summary, tmp_path)
    assert png.read_bytes()[:4] == b"\x89PNG"
    page = utility_report.write_html(summary, png, tmp_path).read_text()
    assert "DISTURBED" in page and "driver-optimized" in page and "✓" in page
    assert utility_report.stage_row(stages[4])[1] == "gold 36/40"


def test_producers_short_of_their_schedule_mark_the_run_disturbed() -> None:
    info = utility_live.Run(utility_scale.excess_capacity(), "driver", 7.0)
    ok = {"name": "flow-0", "producer_sent": 100, "producer_due": 101.0}
    info.stages = [{"name": "s", "flows": [ok]}]
    assert utility_live.disturbed(info) is None
    info.stages[0]["flows"].append({"name": "flow-1", "producer_sent": 50, "producer_due": 100.0})
    why = utility_live.disturbed(info)
    assert why is not None and "flow-1" in why


@pytest.mark.slow
@pytest.mark.parametrize("decide", ["controller", "driver"])
def test_a_quick_live_trading_day_admits_gold_before_bronze(tmp_path: Path, decide: str) -> None:
    res = CliRunner().invoke(
        app,
        ["run", "trading-day", "--quick", "--decide", decide, "--json", "--out", str(tmp_path)],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["live"] is True and doc["refused"] == []
    assert doc["mode"] == ("controller" if decide == "controller" else "driver-optimized")
    segments = doc["segments"]
    assert [s["name"] for s in segments] == [s.name for s in utility_scale.trading_day().stages]
    for s in segments:
        assert set(s) >= {"name", "available", "admitted", "rates", "delivered", "flows"}
        assert set(s["available"]) == set(s["admitted"]) == {"gold", "silver", "bronze"}
        assert len(s["rates"]) == 4
        # Gold before bronze, counted at the broker: all gold in whenever bronze is.
        assert s["admitted"]["gold"] == s["available"]["gold"], s
        if s["admitted"]["bronze"] > 0:
            assert s["admitted"]["silver"] == s["available"]["silver"], s
    assert segments[0]["admitted"]["bronze"] == 0 and segments[-1]["admitted"]["bronze"] > 0
    assert (tmp_path / "trading-day-live.png").exists()
    assert (tmp_path / "trading-day-live.html").exists()
