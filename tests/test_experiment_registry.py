"""Every experiment in one shape: found by name, simulated and/or live, and an option a
run does not take refused naming it (issue 30)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.experiments import registry
from srtm.experiments.experiment import Live, Mode, Option, Simulated, UsageError, refuse


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
        refuse(registry.find("correlated-sensors"), Mode.sim, [])


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
