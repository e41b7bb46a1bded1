from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from srtm.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args", [["--help"], ["drl-penalty", "--help"]])
def test_help_explains_every_option(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    if args[0] == "drl-penalty":
        for option in ("--rate", "--burst", "--load", "--k-max", "--batch", "--json"):
            assert option in result.output


def test_drl_penalty_json_shows_the_penalty_growing_with_k() -> None:
    result = runner.invoke(
        app, ["drl-penalty", "--k-max", "4", "--messages", "200000", "--burst", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [r["k"] for r in rows] == [1, 2, 3, 4]
    means = [r["model"]["mean_s"] for r in rows]
    assert means == sorted(means) and means[-1] > 4 * means[0]
    sims = [r["sim"]["mean_s"] for r in rows]
    assert sims[-1] > sims[0]


def test_drl_penalty_table_marks_infeasible_splits() -> None:
    result = runner.invoke(
        app, ["drl-penalty", "--k-max", "3", "--burst", "2", "--messages", "10000"]
    )
    assert result.exit_code == 0, result.output
    assert "DRL penalty" in result.output
    assert "infeasible: b/k = 0.667 < 1" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--burst", "0.5"], "burst must be a finite number >= 1"),
        (["--load", "1.2"], "load must be in (0, 1)"),
        (["--rate", "-3"], "rate must be a finite number > 0"),
    ],
)
def test_drl_penalty_bad_input(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["drl-penalty", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
