"""A live run's own validity checks (issue 14, finding 11): the pure check against its
thresholds, the /proc arithmetic, and a disturbed run's table, JSON, HTML and exit code
(with injected figures: no real load, no timing)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from srtm.experiments import host, report, validity
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
    from srtm.experiments import cli

    runs = [summary("lb", 41.8, QUIET), summary("srtm", 90.3, STARVED)]
    monkeypatch.setattr(cli, "run_policies", lambda *_: runs)
    monkeypatch.setattr(report, "plots", lambda *_: [])
    args = ["experiment", "compare", "correlated-sensors", "--policies", "lb,srtm",
            "--out", str(tmp_path), "--analysis", "local", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args + (["--strict"] if strict else []))
    assert result.exit_code == (cli.EXIT_DISTURBED if strict else 0), result.output
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
