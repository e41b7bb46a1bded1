"""Every experiment in one shape: found by name, simulated and/or live, an option a run
does not take refused naming it, and a run's summary naming the files of its report
(issue 30)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.experiments import registry
from srtm.experiments.experiment import (
    Live,
    Mode,
    Option,
    RunSettings,
    Simulated,
    Terminal,
    UsageError,
    refuse,
)


def test_every_experiment_is_simulated_or_live_and_found_by_name() -> None:
    found = registry.experiments()
    assert {"fig4", "table1", "correlated-sensors", "multi-tenant", "diurnal"} <= set(found)
    assert {"trading-day", "excess-capacity", "latency-effects"} <= set(found)
    for name, exp in found.items():
        assert exp.name == name
        assert isinstance(exp, (Simulated, Live)), name
        assert registry.find(name) == exp


def test_the_utility_names_are_the_simulated_ones() -> None:
    from srtm.experiments import utility
    from srtm.experiments.utility import sim

    assert tuple(sim.EXPERIMENTS) == utility.NAMES


def test_an_option_not_taken_is_refused_naming_it() -> None:
    diurnal = registry.find("diurnal")
    refuse(diurnal, Mode.live, [Option.duration, Option.only, Option.scale])
    with pytest.raises(UsageError, match="does not take") as refused:
        refuse(diurnal, Mode.live, [Option.duration, Option.quick])
    assert refused.value.option == "--quick"
    with pytest.raises(UsageError) as sim_only:
        refuse(registry.find("fig4"), Mode.live, [])
    assert sim_only.value.option == "--sim"
    with pytest.raises(UsageError, match="not simulated"):
        refuse(registry.find("control-plane-faults"), Mode.sim, [])
    refuse(registry.find("correlated-sensors"), Mode.sim, [Option.policy])
    with pytest.raises(UsageError, match="does not take") as sim_scale:
        refuse(registry.find("correlated-sensors"), Mode.sim, [Option.scale])
    assert sim_scale.value.option == "--scale"


@pytest.mark.parametrize(
    "args",
    [
        ["diurnal", "--quick"],
        ["multi-tenant", "--sim", "--policy", "lb"],
        ["fig4", "--sim", "--strict"],
        ["trading-day", "--only", "on"],
        ["correlated-sensors", "--decide", "driver"],
    ],
)
def test_the_command_line_refuses_what_a_run_would_ignore(tmp_path: Path, args: list[str]) -> None:
    res = CliRunner().invoke(app, ["run", *args, "--out", str(tmp_path)], env={"COLUMNS": "200"})
    flag = next(a for a in args[1:] if a.startswith("--") and a != "--sim")
    assert res.exit_code == 2 and flag in res.output and "does not take" in res.output
    assert not any(tmp_path.iterdir())


def test_an_unknown_name_lists_the_experiments(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", "nonsense", "--out", str(tmp_path)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "multi-tenant" in said and "fig4" in said


def test_list_shows_what_each_experiment_takes() -> None:
    res = CliRunner().invoke(app, ["list"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    diurnal = next(line for line in res.output.splitlines() if "│ diurnal" in line)
    assert "--only" in diurnal and "--quick" not in diurnal


# -- a run's report -------------------------------------------------------------------------
def _quick_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    from srtm.experiments import figures

    real = figures.run_figure
    monkeypatch.setattr(
        figures, "run_figure", lambda name, out, **kw: real(name, out, quick=True, **kw)
    )


def _quick_tenancy(monkeypatch: pytest.MonkeyPatch) -> None:
    from srtm.experiments.tenancy import sim

    real = sim.multi_tenant_sim
    monkeypatch.setattr(
        sim, "multi_tenant_sim", lambda out, **kw: real(out, topics=12, window_s=1.0, **kw)
    )


def _quick_diurnal(monkeypatch: pytest.MonkeyPatch) -> None:
    from srtm.experiments.diurnal import sim

    small = sim.DiurnalSettings(windows=12, sim_s=0.5, warmup_s=0.1, topics=36, scale=10)
    real = sim.diurnal_sim
    monkeypatch.setattr(sim, "diurnal_sim", lambda out, s=None: real(out, small))


def _as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    pass


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("name", "quick"),
    [
        ("fig4", _quick_figure),
        pytest.param("multi-tenant", _quick_tenancy, marks=pytest.mark.slow),  # ~10 s
        ("diurnal", _quick_diurnal),
        ("trading-day", _as_is),
        ("correlated-sensors-1ms", _as_is),
    ],
)
def test_a_simulated_run_returns_the_files_of_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, quick: Any
) -> None:
    # One experiment of each family with a simulation, shrunk
    # where the paper's scale is slow; a file there before the run is not its report.
    quick(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.json").write_text("{}")
    before = _files(out)
    quiet = Terminal(Console(file=io.StringIO()), Console(file=io.StringIO()))
    exp = registry.find(name)
    assert isinstance(exp, Simulated)
    summary = exp.sim(RunSettings(out=out, term=quiet))
    assert summary.report, f"{name} returned no report"
    assert len(set(summary.report)) == len(summary.report), summary.report
    for f in summary.report:
        assert f.is_relative_to(out) and f.stat().st_size > 0, f
    assert set(summary.report) == _files(out) - before


def _fake_utility_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from srtm.experiments.utility import live

    def fake(exp: Any, out: Path, mode: str, **_: Any) -> dict[str, Any]:
        summary = {"experiment": exp.name, "title": exp.title, "mode": mode, "stage_s": 7.0,
                   "segments": [], "claims": [], "disturbed": None, "refused": []}  # fmt: skip
        live.summary_path(out, exp.name).write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(live, "run", fake)


def _fake_diurnal_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from srtm.experiments.diurnal import live

    def fake(out: Path, s: Any, loop: bool, on_progress: Any = None) -> dict[str, Any]:
        w = {"t_s": 0.0, "offered_msgs": 10, "brokers": 1, "p99_ms": 1.0, "slo_met": True,
             "load_ratio": {"0": 0.5}}  # fmt: skip
        summary = {"windows": [w], "events": [], "moves": 0, "spawned": 0, "despawned": 0,
                   "published": 10, "delivered": 10, "failed": 0, "slo_windows_met": 1,
                   "disturbed": None}  # fmt: skip
        live.summary_path(out, "on" if loop else "off").write_text(json.dumps(summary))
        return summary

    monkeypatch.setattr(live, "run", fake)


@pytest.mark.parametrize(
    ("name", "fake"), [("latency-effects", _fake_utility_run), ("diurnal", _fake_diurnal_run)]
)
def test_a_live_run_returns_the_files_of_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, fake: Any
) -> None:
    # No brokers: each run is faked (it writes its summary where the real one does) and
    # the report the family writes from it is real.
    fake(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    quiet = Terminal(Console(file=io.StringIO()), Console(file=io.StringIO()))
    exp = registry.find(name)
    assert isinstance(exp, Live)
    summary = exp.live(RunSettings(out=out, term=quiet))
    assert len(set(summary.report)) == len(summary.report), summary.report
    assert all(f.stat().st_size > 0 for f in summary.report)
    assert set(summary.report) == _files(out)
