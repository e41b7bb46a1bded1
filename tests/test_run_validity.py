"""A live run's own validity checks (issue 14, finding 11): the pure check against its
thresholds, the /proc arithmetic, and a disturbed run's table, JSON, HTML and exit code
(with injected figures: no real load, no timing)."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from srtm.experiments import host, validity
from srtm.experiments.scenarios import report
from srtm.experiments.validity import RunFigures, check

# A calm run's figures (the demo's SRTM run on a calm machine, rounded).
QUIET = RunFigures(
    slo_p99_ms=20.0, max_late_ms=10.0, send_late_p99_ms=2.0, send_late_p999_ms=3.8,
    due=90_000, skipped_late=60, broker_late_p99_ms=3.4, run_queue_wait=0.22, steal=0.0,
    foreign_cpu=0.1, load_per_cpu=1.1, cpus=2,
)  # fmt: skip


def test_a_quiet_run_is_valid() -> None:
    v = check(QUIET)
    assert not v.disturbed and v.reasons == () and v.status == "valid"
    assert v.thresholds["send_late_p99_ms"] == pytest.approx(5.0)  # half the skip limit
    assert v.thresholds["broker_late_p99_ms"] == pytest.approx(10.0)  # half the SLO


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"send_late_p99_ms": 5.5}, "the emulator sent late: p99 5.5 ms > 5 ms"),
        ({"send_late_p999_ms": 9.0}, "the emulator sent late: p99.9 9.0 ms > 8 ms"),
        ({"skipped_late": 500}, "skipped 500 of 90,000 events as too late (0.6% > 0.5%)"),
        ({"broker_late_p99_ms": 12.0}, "a broker released late: p99 12.0 ms > 10 ms"),
        ({"run_queue_wait": 0.45}, "waited for a CPU 45% of the window"),
        ({"steal": 0.2}, "the hypervisor stole 20%"),
        ({"send_late_p99_ms": math.nan}, "the emulator sent late: p99 nan ms"),
    ],
)
def test_each_figure_over_its_threshold_disturbs_the_run(
    change: dict[str, float], reason: str
) -> None:
    v = check(dataclasses.replace(QUIET, **change))
    assert v.disturbed and v.status == "disturbed"
    assert any(reason in r for r in v.reasons), v.reasons
    # Where the CPU went is added as context, and it is the only other line.
    assert len(v.reasons) == 2 and v.reasons[-1].startswith("(other processes used 10%")


def test_thresholds_follow_the_slo_and_missing_figures_are_not_reasons() -> None:
    late = dataclasses.replace(QUIET, broker_late_p99_ms=15.0)
    assert check(late).disturbed
    assert not check(dataclasses.replace(late, slo_p99_ms=40.0)).disturbed
    slow = dataclasses.replace(QUIET, send_late_p99_ms=7.0)
    assert check(slow).disturbed
    assert not check(dataclasses.replace(slow, max_late_ms=20.0)).disturbed
    unknown = dataclasses.replace(
        QUIET, broker_late_p99_ms=None, run_queue_wait=None, steal=None, foreign_cpu=None
    )
    assert not check(unknown).disturbed
    # Everything bad at once: one reason per figure, and the load as context.
    bad = RunFigures(20.0, 10.0, 9.0, 9.9, 1_000, 500, 40.0, 0.6, "broker 2", 0.3, 1.7, 2.0, 2)
    v = check(bad)
    assert len(v.reasons) == 7 and "load average up to 4.0" in v.reasons[-1]
    assert "broker 2 waited for a CPU 60% of the window (> 40%)" in v.reasons


def test_stored_validity_round_trips() -> None:
    v = check(dataclasses.replace(QUIET, skipped_late=1_000, waited_most="broker 1"))
    back = validity.from_summary({"validity": json.loads(json.dumps(v.to_json()))})
    assert back == v
    assert validity.from_summary({}) is None


def test_host_figures_are_shares_of_the_interval() -> None:
    a = host.Sample(10.0, total_s=100.0, busy_s=40.0, steal_s=1.0, load1=1.0,
                    procs={1: host.ProcSample(5.0, 1.0), 2: host.ProcSample(3.0, 0.0)})  # fmt: skip
    # 4 s on 2 CPUs (8 CPU-s): 6 busy, of which our two processes used 2; 0.4 stolen;
    # process 2 waited 1.2 s for a CPU, process 1 0.2 s; process 3 appeared meanwhile.
    b = host.Sample(14.0, total_s=108.0, busy_s=46.0, steal_s=1.4, load1=3.0,
                    procs={1: host.ProcSample(6.0, 1.2), 2: host.ProcSample(4.0, 1.2),
                           3: host.ProcSample(9.0, 9.0)})  # fmt: skip
    f = host.between(a, b, 2)
    assert f.run_queue_wait == pytest.approx(0.3) and f.waited_most == 2
    assert f.steal == pytest.approx(0.05)
    assert f.foreign_cpu == pytest.approx(0.5) and f.run_cpus == pytest.approx(0.5)
    nothing = host.between(host.Sample(1.0), host.Sample(2.0), 2)
    assert (nothing.run_queue_wait, nothing.steal, nothing.foreign_cpu) == (None, None, None)


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="Linux /proc only")
def test_host_reads_this_process() -> None:
    s = host.take([os.getpid(), 2**22 + 1])  # the second pid does not exist
    assert set(s.procs) == {os.getpid()}
    assert s.procs[os.getpid()].cpu_s > 0 and s.procs[os.getpid()].wait_s >= 0
    assert s.total_s is not None and s.busy_s is not None and 0 < s.busy_s <= s.total_s


# -- what a disturbed run prints --------------------------------------------------------
def summary(policy: str, p99: float, figures: RunFigures) -> dict[str, Any]:
    return {
        "run": f"correlated-sensors-{policy}", "scenario": "correlated-sensors",
        "policy": policy, "slo_p99_ms": 20.0, "duration_s": 8.0,
        "e2e_ms": {"p50": p99 / 4, "p95": p99 / 2, "p99": p99},
        "brokers_used": 6 if policy == "lb" else 3, "token_share_tail": 0.1,
        "fitting_rounds": [] if policy == "lb" else [3],
        "accounting": {"published": 24_000, "delivered": 24_000, "lost": 0, "duplicates": 0},
        "emulator": {"skipped_late": figures.skipped_late, "max_late_ms": 10.0},
        "analysis": {"engine": "in-process (pandas)"},
        "validity": check(figures).to_json(),
    }  # fmt: skip


STARVED = dataclasses.replace(QUIET, send_late_p99_ms=7.5, broker_late_p99_ms=31.0)
# (the starved demo: SRTM p99 90.3 ms against LB 41.8 ms)


def test_a_disturbed_run_carries_the_flag_and_no_conclusion(tmp_path: Path) -> None:
    """The figures of the issue's starved demo (SRTM 90.3 ms against LB 41.8 ms): the
    table says DISTURBED and does not judge the SLO, the JSON has the reasons and a null
    conclusion, the HTML says so; a quiet pair gets its conclusion."""
    runs = [summary("lb", 41.8, QUIET), summary("srtm", 90.3, STARVED)]
    rows = {r[0]: r for r in report.rows(runs)}
    col = {h: i for i, (h, _, _) in enumerate(report.COLUMNS)}
    assert rows["srtm"][col["run"]] == "DISTURBED" and rows["srtm"][col["SLO"]] == "n/a"
    assert rows["lb"][col["run"]] == "ok" and rows["lb"][col["SLO"]] == "no"
    doc = report.compact(runs)
    assert doc["disturbed"] is True and doc["conclusion"] is None
    assert doc["policies"]["srtm"]["validity"] == "disturbed"
    assert any("broker released late" in r for r in doc["policies"]["srtm"]["disturbed_by"])
    assert doc["policies"]["lb"]["disturbed_by"] == []
    note = report.disturbed_note(runs)
    assert note is not None and note.startswith("No conclusion: the run of SRTM was disturbed")
    page = report.write_html(runs, [], tmp_path, _Scenario()).read_text()
    assert "Disturbed run." in page and "No conclusion: the run of SRTM" in page
    assert "a broker released late" in page
    assert "Lowest p99" not in page

    quiet = [summary("lb", 39.9, QUIET), summary("srtm", 10.4, QUIET)]
    assert report.disturbed_note(quiet) is None
    text = report.conclusion(quiet)
    assert text is not None and "Within the SLO (p99 ≤ 20 ms): SRTM; outside it: LB" in text
    assert "Lowest p99: SRTM 10.4 ms (LB 39.9 ms)" in text
    assert report.compact(quiet)["conclusion"] == text
    assert text in report.write_html(quiet, [], tmp_path, _Scenario()).read_text()


@dataclasses.dataclass
class _Scenario:
    name: str = "correlated-sensors"
    description: str = "test"
    scale: str = "test"
    slo_p99_ms: float = 20.0


@pytest.mark.parametrize("strict", [False, True])
def test_compare_prints_the_disturbance_and_fails_only_when_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strict: bool
) -> None:
    """`srtm experiment compare` on injected runs: the disturbance and why instead of a
    conclusion, exit 0, or 3 with --strict."""
    from srtm.cli import app
    from srtm.experiments import experiment, scenarios

    runs = [summary("lb", 41.8, QUIET), summary("srtm", 90.3, STARVED)]
    monkeypatch.setattr(scenarios, "run_policies", lambda *_: runs)
    monkeypatch.setattr(report, "plots", lambda *_: [])
    args = ["experiment", "compare", "correlated-sensors", "--policies", "lb,srtm",
            "--out", str(tmp_path), "--analysis", "local", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args + (["--strict"] if strict else []))
    assert result.exit_code == (experiment.EXIT_DISTURBED if strict else 0), result.output
    text = " ".join(result.stdout.split())
    assert "No conclusion: the run of SRTM was disturbed" in text
    assert "a broker released late: p99 31.0 ms > 10 ms" in text
    assert "Re-run on a quieter machine" in text and "Lowest p99" not in text
    assert json.loads(result.stdout.strip().splitlines()[-1])["conclusion"] is None
    assert "Disturbed run" in (tmp_path / "report.html").read_text()


def test_what_the_drain_did_not_see_is_not_called_lost() -> None:
    acc = {"published": 100, "delivered": 60, "lost": 40, "duplicates": 0}
    assert report.loss_text({"accounting": acc, "drained": True}) == "lost 40"
    late = report.loss_text({"accounting": acc, "drained": False})
    assert late.startswith("40 undelivered when the drain ended") and "lost 40" not in late
    assert report.loss_text({"accounting": acc | {"lost": 0}, "drained": False}) == "lost 0"


# -- what the policy did: findings (issue 28, item 3) -----------------------------------
def run(
    policy: str,
    p99: float,
    per_broker_p99: dict[str, tuple[int, float]],
    **extra: Any,
) -> dict[str, Any]:
    """A summary shaped like a real one (the slower machine's demo, /tmp/demo-slow1): a
    valid check, per-broker (messages, p99), the plan's and emulator's figures."""
    fitted = policy != "lb"
    doc = summary(policy, p99, QUIET) | {
        "per_broker": {
            b: {"messages": n, "p50": q / 5, "p95": q / 2, "p99": q, "p999": q * 1.2}
            for b, (n, q) in per_broker_p99.items()
        },
        "brokers_used": len(per_broker_p99), "brokers_assigned": len(per_broker_p99),
        "brokers_available": 6, "publishers": 300, "unplaced_publishers": 0,
        "fitting_rounds": [5, 6, 6] if fitted else [], "fitting_state": "done" if fitted else None,
        "emulator": {"skipped_late": 60, "max_late_ms": 10.0, "unrouted": 0},
    }  # fmt: skip
    return doc | extra


LB_P99 = [34.5, 21.1, 27.2, 20.9, 21.2, 39.9]  # the slower machine's LB run, per broker
LB = run("lb", 32.6, {str(b): (15_000, q) for b, q in enumerate(LB_P99, 1)})
# The starved sub-bucket: fitting used all 6 brokers after 17 rounds, broker 5
# carried 800 messages at p99 1,158 ms while the others were at 11–16 ms.
STARVED_BROKERS = {"1": (15_000, 11.2), "2": (15_000, 12.5), "3": (15_000, 13.1),
                   "4": (15_000, 14.0), "5": (800, 1_158.0), "6": (15_000, 16.3)}  # fmt: skip
# /tmp/demo-slow1's SRTM run: 131 of 300 publishers placed, the others never sent.
UNPLACED = {
    "unplaced_publishers": 169,
    "emulator": {"skipped_late": 0, "max_late_ms": 10.0, "unrouted": 54_080},
}
CALM_SRTM = {"1": (6_000, 6.6), "2": (15_000, 7.0), "3": (6_000, 7.3)}


def texts(s: dict[str, Any]) -> list[str]:
    return [f.text for f in report.findings(s)]


def ranked_and_within(text: str) -> tuple[str, str]:
    """(the conclusion's 'Within the SLO' list, the policy it calls lowest or '')."""
    within = text.split(": ", 1)[1].split(";", 1)[0]
    lowest = text.split("Lowest p99: ", 1)[1] if "Lowest p99: " in text else ""
    return within, lowest.split(" ", 1)[0]


@pytest.mark.parametrize("p99", [18.0, 45.0])  # the topic's p99 within the SLO, or not
def test_a_starved_broker_is_stated_and_the_policy_is_not_within_the_slo(p99: float) -> None:
    """The valid run of the issue: one broker 70× the others. Within the topic's p99 (18
    ms) the old conclusion called SRTM within the SLO with the lowest p99; above it (45 ms)
    it said 'Lowest p99: LB'. Now neither: the starvation is said, SRTM is not ranked."""
    srtm = run("srtm", p99, STARVED_BROKERS)
    assert report.status(srtm) == "valid"
    assert texts(srtm) == [
        "fitting used all 6 brokers after 17 rounds",
        "broker 5 starved: p99 1,158 ms on its 800 messages against 11.2–16.3 ms on the others",
    ]
    assert report.within_slo(srtm) is False
    col = {h: i for i, (h, _, _) in enumerate(report.COLUMNS)}
    assert report.rows([srtm])[0][col["SLO"]] == "no"
    text = report.conclusion([LB, srtm])
    assert text is not None
    within, lowest = ranked_and_within(text)
    assert within == "none" and lowest == ""
    assert "outside it: LB, SRTM (broker 5 starved: p99 1,158 ms" in text
    assert text.endswith("Not compared by p99: SRTM.")
    row = report.compact([LB, srtm])["policies"]["srtm"]
    assert row["within_slo"] is False
    assert row["worst_broker"] == {"broker": "5", "messages": 800, "p99_ms": 1_158.0}
    assert [f["kind"] for f in row["findings"]] == ["all_brokers", "starved_broker"]
    assert [f["fails_slo"] for f in row["findings"]] == [False, True]


def test_brokers_of_a_working_placement_are_not_starved() -> None:
    """LB's spread (21–40 ms, all over the SLO) and a calm SRTM run are no finding; a broker
    over the SLO while the topic's p99 is within it is one, starved or not."""
    assert texts(LB) == [] and report.within_slo(LB) is False
    assert texts(run("srtm", 10.4, CALM_SRTM)) == []
    over = run("srtm", 10.4, CALM_SRTM | {"4": (900, 23.1)})
    assert texts(over) == [
        "broker 4's p99 is over the SLO: 23.1 ms on its 900 messages, the topic's 10.4 ms"
    ]
    assert report.within_slo(over) is False
    # Ten times the others' median but within the SLO: fast brokers, no starvation.
    assert texts(run("srtm", 2.0, {"1": (900, 0.5), "2": (900, 0.6), "3": (900, 9.0)})) == []


def test_unplaced_publishers_make_the_slo_impossible() -> None:
    """/tmp/demo-slow1's SRTM run: fitting left 169 of 300 publishers unassigned, 54,080
    messages were never sent, published = delivered held. The served part's p99 (7 ms) is
    not 'within the SLO', and it is not compared with LB's, which served everyone."""
    srtm = run("srtm", 7.1, CALM_SRTM, **UNPLACED)
    assert texts(srtm) == ["169 of 300 publishers were left unplaced: 54,080 messages never sent"]
    assert report.within_slo(srtm) is False
    col = {h: i for i, (h, _, _) in enumerate(report.COLUMNS)}
    rows = report.rows([LB, srtm])
    assert rows[0][col["placed"]] == "300/300" and rows[1][col["placed"]] == "131/300"
    assert rows[1][col["SLO"]] == "no"
    text = report.conclusion([LB, srtm])
    assert text == (
        "Within the SLO (p99 ≤ 20 ms): none; outside it: LB, SRTM (169 of 300 publishers "
        "were left unplaced: 54,080 messages never sent). Not compared by p99: SRTM."
    )
    row = report.compact([LB, srtm])["policies"]["srtm"]
    assert (row["publishers"], row["unplaced_publishers"], row["unrouted_messages"]) == (
        300, 169, 54_080,
    )  # fmt: skip
    # A summary from before the plan's figures were recorded: the emulator's count says it.
    old = {k: v for k, v in srtm.items() if k not in ("publishers", "unplaced_publishers")}
    assert texts(old) == [
        "54,080 messages were never sent: their publishers had no broker when they were due"
    ]
    assert report.within_slo(old) is False and report.rows([old])[0][col["placed"]] == "-"


@pytest.mark.parametrize(
    ("state", "said"),
    [("failed", "fitting failed after 17 rounds"),
     ("interrupted", "fitting was interrupted after 17 rounds"),
     ("running", "fitting had not finished when the run stopped waiting for it")],
)  # fmt: skip
def test_a_fitting_that_did_not_finish_is_said_and_not_within_the_slo(
    state: str, said: str
) -> None:
    srtm = run("srtm", 10.4, CALM_SRTM, fitting_state=state)
    (found,) = report.findings(srtm)
    assert found.kind is validity.Kind.FITTING_UNFINISHED and found.text.startswith(said)
    assert report.within_slo(srtm) is False
    assert "Lowest p99" not in (report.conclusion([LB, srtm]) or "")


def test_all_brokers_used_is_said_but_a_healthy_run_keeps_its_conclusion(tmp_path: Path) -> None:
    """Fitting that needed every broker is a fact about the placement, not a failure: the
    run is still within the SLO, and the conclusion keeps its wording."""
    six = {str(b): (5_000, q) for b, q in enumerate([6.6, 7.0, 7.3, 7.4, 7.1, 8.0], 1)}
    srtm = run("srtm", 10.4, six)
    lb = run("lb", 39.9, {b: (15_000, 39.9) for b in six})
    assert texts(srtm) == ["fitting used all 6 brokers after 17 rounds"]
    assert texts(lb) == []  # LB places on every broker by design
    assert report.within_slo(srtm) is True
    assert report.conclusion([lb, srtm]) == (
        "Within the SLO (p99 ≤ 20 ms): SRTM; outside it: LB. Lowest p99: SRTM 10.4 ms (LB 39.9 ms)."
    )
    page = report.write_html([lb, srtm], [], tmp_path, _Scenario()).read_text()
    assert "<h2>Findings</h2>" in page
    assert "srtm: fitting used all 6 brokers after 17 rounds" in page


@pytest.mark.parametrize(
    "srtm",
    [run("srtm", 18.0, STARVED_BROKERS), run("srtm", 7.1, CALM_SRTM, **UNPLACED),
     run("srtm", 10.4, CALM_SRTM | {"4": (900, 23.1)}),
     run("srtm", 10.4, CALM_SRTM, fitting_state="failed"),
     run("srtm", 7.1, STARVED_BROKERS, **UNPLACED)],
    ids=["starved", "unplaced", "broker-over-slo", "fitting-failed", "all-at-once"],
)  # fmt: skip
def test_the_conclusion_never_calls_a_failed_policy_within_the_slo_or_lowest(
    srtm: dict[str, Any], tmp_path: Path
) -> None:
    """Whatever the finding, against a slower LB and a conc run that served everyone: the
    conclusion's 'within' list and its 'lowest p99' never name SRTM; the table, the JSON
    and the HTML carry the findings."""
    even = {b: (15_000, 25.0) for b in "123"}
    conc = run("conc", 25.0, even, fitting_rounds=[], fitting_state=None)
    runs = [LB, conc, srtm]
    text = report.conclusion(runs)
    assert text is not None
    within, lowest = ranked_and_within(text)
    assert "SRTM" not in within and lowest == "CONC"
    assert "Not compared by p99: SRTM." in text and "SRTM 7.1 ms" not in text
    failing = [f for f in report.findings(srtm) if f.fails_slo]
    assert failing and all(f.text in text for f in failing)
    doc = report.compact(runs)
    assert doc["conclusion"] == text and doc["policies"]["srtm"]["within_slo"] is False
    page = report.write_html(runs, [], tmp_path, _Scenario()).read_text()
    assert all(f"srtm: {html.escape(f.text)}" in page for f in failing)


def test_compare_prints_the_findings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`srtm experiment compare` on the slower machine's runs: each finding under the table,
    the conclusion without 'within' or 'lowest' for SRTM, the fields in the JSON."""
    from srtm.cli import app
    from srtm.experiments import scenarios

    runs = [LB, run("srtm", 18.0, STARVED_BROKERS, **UNPLACED)]
    monkeypatch.setattr(scenarios, "run_policies", lambda *_: runs)
    monkeypatch.setattr(report, "plots", lambda *_: [])
    args = ["experiment", "compare", "correlated-sensors", "--policies", "lb,srtm",
            "--out", str(tmp_path), "--analysis", "local", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "srtm: fitting used all 6 brokers after 17 rounds" in text
    assert "srtm: broker 5 starved: p99 1,158 ms on its 800 messages" in text
    assert "srtm: 169 of 300 publishers were left unplaced: 54,080 messages never sent" in text
    assert "duplicates 0; 54,080 never sent: their publishers had no broker)" in text
    assert "Within the SLO (p99 ≤ 20 ms): none;" in text and "Lowest p99" not in text
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["policies"]["srtm"]["unplaced_publishers"] == 169
    assert doc["policies"]["srtm"]["worst_broker"]["broker"] == "5"


def test_a_run_summary_records_what_the_findings_need(tmp_path: Path) -> None:
    """``live._summarize`` keeps the final plan's unassigned publishers, the cluster's
    brokers and the fitting's state (no traces here: the figures are empty)."""
    from srtm.experiments import scenarios
    from srtm.experiments.scenarios import live

    sc = scenarios.load("correlated-sensors")
    plan = {"brokers": [{"id": "1", "publishers": ["s0"]}], "unassigned": ["s1", "s2"]}
    info = live.LiveRun("x", "srtm", plan=plan, fitting={"state": "failed", "rounds": [2]})
    s = live._summarize(sc, info, tmp_path, 5.0)
    assert (s["publishers"], s["unplaced_publishers"], s["brokers_available"]) == (300, 2, 6)
    assert [f.kind for f in report.findings(s)] == [
        validity.Kind.UNPLACED, validity.Kind.FITTING_UNFINISHED,
    ]  # fmt: skip
    before = live._summarize(sc, live.LiveRun("x", "lb"), tmp_path, 5.0)
    assert before["unplaced_publishers"] is None  # no plan: not known, not zero
