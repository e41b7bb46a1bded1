from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_broker_help_lists_its_options() -> None:
    result = runner.invoke(app, ["broker", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ("--tcp-address", "--http-address", "--broker-id", "--data-dir", "--trace-dir"):
        assert option in result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--tcp-address", "localhost"], "--tcp-address"),
        (["--http-address", "127.0.0.1:99999"], "--http-address"),
        (["--arrival-stamps", "wall"], "--arrival-stamps"),
        (["--release-timer", "hpet"], "--release-timer"),
    ],
)
def test_broker_refuses_bad_flags_naming_them(args: list[str], named: str) -> None:
    result = runner.invoke(app, ["broker", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert named in result.output


def test_broker_refuses_an_out_of_range_id(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "broker",
            "--broker-id",
            "5000",
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path),
            "--insecure-loopback",
        ],
    )
    assert result.exit_code == 2
    assert "--broker-id" in result.output


def test_broker_config_file_sets_defaults_and_rejects_unknown_keys(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[broker]\ntcp-address = "nowhere"\n')
    result = runner.invoke(app, ["broker", "--config", str(bad)], env={"COLUMNS": "200"})
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "bad.toml: tcp_address" in output  # the TOML value is used
    typo = tmp_path / "typo.toml"
    typo.write_text("[broker]\nmem_queue = 5\n")
    result = runner.invoke(app, ["broker", "--config", str(typo)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "mem_queue" in result.output


def _place_files(tmp_path: Path, loads: list[int], n: int) -> tuple[Path, Path]:
    brokers = tmp_path / "brokers.json"
    topic = tmp_path / "topic.json"
    brokers.write_text(
        json.dumps([{"id": f"b{i + 1}", "mcap": 90_000, "load": x} for i, x in enumerate(loads)])
    )
    pubs = [{"id": f"p{i}", "rate": 10, "group": f"g{i // 25}"} for i in range(n)]
    # rate = load, as in the paper's quota example: placed as promised, 1 msg/s per msg/s
    doc = {"name": "t", "slo_p99_ms": 1.0, "burst": 2000, "rate": 10 * n, "publishers": pubs}
    topic.write_text(json.dumps(doc))
    return brokers, topic


def test_place_json_follows_the_documented_shape(tmp_path: Path) -> None:
    brokers, topic = _place_files(
        tmp_path, [10_000, 40_000, 50_000, 60_000, 70_000, 80_000], 14_000
    )
    args = ["place", "--policy", "maxmin", "--brokers", str(brokers), "--topic", str(topic)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["policy"] == "maxmin" and doc["shortfall"] == 0 and doc["unassigned"] == []
    assert [(b["id"], b["rate"]) for b in doc["brokers"]] == [
        ("b1", 50_000),
        ("b2", 50_000),
        ("b3", 40_000),
    ]
    assert sum(len(b["publishers"]) for b in doc["brokers"]) == 14_000
    assert sum(b["bucket"]["rate"] for b in doc["brokers"]) == pytest.approx(140_000)
    table = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "b3" in table.output and "40,000" in table.output


def test_place_reports_a_shortfall_and_bad_input(tmp_path: Path) -> None:
    brokers, topic = _place_files(tmp_path, [89_000], 200)
    result = runner.invoke(
        app, ["place", "--brokers", str(brokers), "--topic", str(topic), "--json"]
    )
    doc = json.loads(result.output)
    assert result.exit_code == 0 and doc["shortfall"] == 1_000 and len(doc["unassigned"]) == 100
    topic.write_text('{"name": "t", "burst": 5, "publishers": [{"id": "p", "rate": 1}]}')
    result = runner.invoke(app, ["place", "--brokers", str(brokers), "--topic", str(topic)])
    assert result.exit_code == 2 and "slo_p99_ms" in result.output
    result = runner.invoke(app, ["place", "--policy", "random", "--topic", str(topic)])
    assert result.exit_code == 2 and "--policy" in result.output


def test_place_several_topics_counts_what_each_was_promised(tmp_path: Path) -> None:
    """The ledger case: two topics of 800 msg/s on brokers of mcap 1000 land on two brokers
    (each placed on what the one before left), and the ledger after each is printed."""
    brokers = tmp_path / "brokers.json"
    brokers.write_text(json.dumps([{"id": "b0", "mcap": 1000}, {"id": "b1", "mcap": 1000}]))
    pubs = [{"id": f"p{i}", "rate": 80} for i in range(10)]
    one = {"name": "one", "slo_p99_ms": 20, "burst": 50, "publishers": pubs}
    two = {**one, "name": "two"}
    first, second = tmp_path / "one.json", tmp_path / "both.json"
    first.write_text(json.dumps(one))
    second.write_text(json.dumps([two]))
    args = ["place", "--brokers", str(brokers), "--topic", str(first), "--topic", str(second)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    docs = json.loads(result.output)
    assert [d["topic"] for d in docs] == ["one", "two"]
    assert [[b["id"] for b in d["brokers"]] for d in docs] == [["b0"], ["b1"]]
    ledger = {e["id"]: e for e in docs[1]["ledger"]}
    assert ledger["b0"]["allocated"] == pytest.approx(880) and ledger["b1"]["rcap"] == (
        pytest.approx(120)
    )
    table = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0 and table.output.count("ledger after") == 2


def _said(result: Any) -> str:
    """What a command printed, its lines and boxes undone (rich wraps its error panel)."""
    return " ".join(result.output.replace("│", " ").split())


def test_place_names_where_a_file_stops_being_json(tmp_path: Path) -> None:
    brokers, topic = _place_files(tmp_path, [0], 1)
    args = ["place", "--brokers", str(brokers), "--topic", str(topic)]
    wide = {"COLUMNS": "1000"}
    topic.write_text('{"name": "t", "slo_p99_ms": 5, "burst": 20,\n "publishers": [{"id": "p",]}')
    result = runner.invoke(app, args, env=wide)
    assert result.exit_code == 2
    assert (
        f"Invalid value for --topic: {topic} is not JSON: expecting property name enclosed in "
        "double quotes at line 2 column 28" in _said(result)
    ), result.output
    topic.write_bytes(b'{"name": "\xff"}')
    result = runner.invoke(app, args, env=wide)
    assert result.exit_code == 2 and f"{topic} is not JSON: not UTF-8 text at byte 10" in _said(
        result
    )
    brokers.write_text("")
    result = runner.invoke(app, args, env=wide)
    assert result.exit_code == 2 and f"{brokers} is empty, not JSON" in _said(result)


def test_place_quotes_the_publisher_rate_behind_a_refused_topic_rate(tmp_path: Path) -> None:
    brokers, topic = _place_files(tmp_path, [0], 1)
    doc = {"name": "t", "slo_p99_ms": 5, "burst": 20, "publishers": [{"id": "p1", "rate": 1e9}]}
    topic.write_text(json.dumps(doc))
    result = runner.invoke(
        app, ["place", "--brokers", str(brokers), "--topic", str(topic)], env={"COLUMNS": "1000"}
    )
    assert result.exit_code == 2
    assert (
        "topic: publisher 'p1' rate 1e+09 msg/s gives the topic a rate of 1.1e+09 msg/s "
        "(1.1 × the sum of its publishers), over the limit of 1e+09 msg/s" in _said(result)
    ), result.output
