"""Rate control on a broker's measured CPU: the live experiment's verdicts (pure) and the
run itself (slow: a controller, a broker and a load generator on 127.0.0.1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from srtm.experiments.utility import congestion as cg

PHASES = cg.Phases(10.0, 30.0, 50.0)


def _points(fall_at: float | None, back_at: float | None, over: bool = True) -> list[cg.Point]:
    out = []
    for k in range(100):
        t = k / 2
        loaded = PHASES.load_start_s + 1 <= t < PHASES.load_end_s
        cpu = 0.3 if loaded and over else 0.08
        low = fall_at is not None and t >= fall_at and (back_at is None or t < back_at)
        out.append(cg.Point(t, cg.R_MIN if low else cg.R_MAX, cpu))
    return out


def test_verdicts_pass_when_rates_fall_and_recover_in_time() -> None:
    got = cg.verdicts(_points(13.0, 32.0), PHASES, {"quiet": 5.0, "load": 9.0, "after": 4.0})
    assert [c["ok"] for c in got] == [True, True, True, True]


@pytest.mark.parametrize(
    ("points", "failed"),
    [
        (_points(19.0, 32.0), 1),  # 8 s after the CPU went over: too slow
        (_points(13.0, None), 3),  # never back
        (_points(13.0, 48.0), 3),  # back 18 s after the load left
        (_points(None, None, over=False), 0),  # the load never pushed the CPU over
    ],
)
def test_verdicts_fail_on_a_slow_or_missing_reaction(points: list[cg.Point], failed: int) -> None:
    got = cg.verdicts(points, PHASES, {"load": 9.0})
    assert not got[failed]["ok"]


def _cpu_follows_the_rate(cut_to: float | None, load_cpu: float) -> list[cg.Point]:
    """The broker's CPU 0.25 ms a message of the topic, plus ``load_cpu`` under the load;
    the rate cut to ``cut_to`` 2 s into the load (None: never) until the load leaves."""
    out = []
    for k in range(100):
        t = k / 2
        loaded = PHASES.load_start_s + 1 <= t < PHASES.load_end_s
        cut = cut_to is not None and PHASES.load_start_s + 2 <= t < PHASES.load_end_s
        rate = cut_to if cut and cut_to is not None else cg.R_MAX
        out.append(cg.Point(t, rate, 0.00025 * rate + (load_cpu if loaded else 0.0)))
    return out


def test_a_partial_cut_that_brings_the_cpu_back_within_its_budget_is_a_fall() -> None:
    # The load alone under the budget (0.12 of 0.2): at 280 msg/s the CPU is within it.
    got = cg.verdicts(_cpu_follows_the_rate(280.0, 0.12), PHASES, {"load": 9.0})
    assert got[1]["ok"], got[1]
    assert "under 200 never; cut with the CPU back within its budget after 1.0 s" in got[1]["sim"]


@pytest.mark.parametrize("load_cpu", [0.12, 0.2])
def test_no_cut_is_no_fall_even_if_the_cpu_comes_back(load_cpu: float) -> None:
    points = _cpu_follows_the_rate(None, load_cpu)
    # The load eases by itself after 2 s: the CPU is back within budget, the rate uncut.
    points = [p if p.t_s < PHASES.load_start_s + 3 else dataclasses.replace(p, broker_cpu=0.15)
              for p in points]  # fmt: skip
    got = cg.verdicts(points, PHASES, {"load": 9.0})
    assert got[0]["ok"] and not got[1]["ok"], got


def test_an_slo_missed_in_any_phase_fails_its_verdict() -> None:
    got = cg.verdicts(_points(13.0, 32.0), PHASES, {"quiet": 5.0, "load": 80.0})
    assert not got[2]["ok"] and "80.0 ms" in got[2]["sim"]


@pytest.mark.slow
def test_rates_fall_under_measured_congestion_and_recover(tmp_path: Path) -> None:
    summary = cg.run(tmp_path, quick=True)
    claims = summary["claims"]
    assert claims[0]["ok"], claims[0]  # the broker's real CPU went over its budget
    assert claims[1]["ok"], claims[1]  # the rate fell within seconds
    assert claims[3]["ok"], claims[3]  # and came back when the load left
    # The SLO verdict is reported, not asserted: it is the machine's as much as ours.
    assert set(summary["p99_ms"]) == {"quiet", "load", "after"}
    assert (tmp_path / "measured-congestion-live.json").exists()
