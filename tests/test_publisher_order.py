"""Blind baselines in any order (issue 33): a scenario hands its publishers to the
controller in block order (each correlation group's members one after another) or in a
seeded shuffled order. The blind policies fill brokers with consecutive publishers, so
the order decides whether they keep groups whole; SRTM slices every group either way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from srtm.cli import app
from srtm.experiments import scenarios
from srtm.experiments.scenarios import report
from srtm.experiments.scenarios.live import run_name, topic_document
from srtm.experiments.scenarios.scenario import (
    PublisherOrder,
    groups_per_broker,
    ordered,
    parse_publisher_order,
)
from srtm.placement import Policy, parse_topic
from support import registered

CORRELATED = scenarios.load("correlated-sensors")
GROUPS = 10  # correlated-sensors: 300 sensors in 10 groups of 30


def test_the_shuffle_is_a_permutation_fixed_by_the_seed() -> None:
    specs = CORRELATED.specs()
    shuffled = ordered(specs, PublisherOrder.shuffled, CORRELATED.seed)
    assert sorted(shuffled, key=lambda p: p.id) == sorted(specs, key=lambda p: p.id)
    assert shuffled != specs
    assert shuffled == ordered(specs, PublisherOrder.shuffled, CORRELATED.seed)
    assert shuffled != ordered(specs, PublisherOrder.shuffled, CORRELATED.seed + 1)
    assert ordered(specs, PublisherOrder.block, CORRELATED.seed) == specs
    sc = CORRELATED.with_order(PublisherOrder.shuffled)
    assert sc.placement_specs() == shuffled
    # The workload (and so its schedule) is the same: only the hand-over order differs.
    assert sc.specs() == specs and CORRELATED.placement_specs() == specs


def placed(policy: Policy, order: PublisherOrder) -> dict[str, list[str]]:
    """The scenario's topic created on a pure controller with its six brokers, the
    publishers in ``order``, as a live run sends the topic's document."""
    sc = CORRELATED.with_order(order)
    c = registered(sc.brokers, mcap=sc.mcap)
    spec = parse_topic(topic_document(sc, policy, sc.placement_specs()))
    c.create_topic(spec, policy, now=0.0)
    return {b: ps for b, ps in c.topics[sc.topic].assignment.items() if ps}


@pytest.mark.parametrize("policy", ["lb", "conc", "maxmin"])
def test_a_blind_policy_keeps_groups_whole_only_in_block_order(policy: Policy) -> None:
    whole = placed(policy, PublisherOrder.block)
    block = groups_per_broker(whole, CORRELATED.specs())
    shuffled = groups_per_broker(placed(policy, PublisherOrder.shuffled), CORRELATED.specs())
    # Block: a group is cut at most once, where one broker's quota ends.
    group = {p.id: p.group for p in CORRELATED.specs()}
    for g in {p.group for p in CORRELATED.specs()}:
        holding = [b for b, ps in whole.items() if any(group[p] == g for p in ps)]
        assert len(holding) <= 2, (g, holding)
    assert max(block.values()) < 0.5 * GROUPS, block
    # Shuffled: every broker has a slice of most groups.
    assert min(shuffled.values()) >= 0.7 * GROUPS, shuffled
    assert len(shuffled) == len(block)  # the same brokers, only the slices differ


def test_srtm_slices_every_group_in_either_order() -> None:
    block = placed("srtm", PublisherOrder.block)
    shuffled = placed("srtm", PublisherOrder.shuffled)
    specs = CORRELATED.specs()
    for assignment in (block, shuffled):
        assert set(groups_per_broker(assignment, specs).values()) == {GROUPS}, assignment
    assert sorted(map(len, block.values())) == sorted(map(len, shuffled.values()))


def test_a_scenario_file_may_say_its_order_and_a_bad_one_is_named() -> None:
    import tomllib
    from importlib import resources

    text = (resources.files(scenarios) / "correlated-sensors.toml").read_text()
    doc = tomllib.loads(text)
    assert scenarios.parse(doc).publisher_order is PublisherOrder.block
    sc = scenarios.parse(doc | {"publisher_order": "shuffled"})
    assert sc.publisher_order is PublisherOrder.shuffled
    assert run_name(sc, "lb") == "correlated-sensors-lb-shuffled"
    assert run_name(CORRELATED, "lb") == "correlated-sensors-lb"
    with pytest.raises(ValueError, match="publisher order must be one of block, shuffled"):
        scenarios.parse(doc | {"publisher_order": "random"}, "x.toml")
    with pytest.raises(ValueError, match="got 'sideways'"):
        parse_publisher_order("sideways")


@pytest.mark.parametrize(
    "args",
    [
        ["experiment", "compare", "correlated-sensors", "--publisher-order", "sideways"],
        ["experiment", "run", "correlated-sensors", "--publisher-order", "sideways"],
        ["demo", "--publisher-order", "sideways"],
    ],
)
def test_the_command_line_refuses_a_bad_order_naming_the_option(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "--publisher-order" in said and "sideways" in said and "shuffled" in said


def test_an_experiment_without_publishers_in_order_refuses_the_option() -> None:
    args = ["experiment", "run", "multi-tenant", "--publisher-order", "shuffled"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--publisher-order" in result.output and "does not take" in result.output


# -- the comparison's report ------------------------------------------------------------
def summary(policy: str, order: str, p99: float) -> dict[str, Any]:
    """A finished, undisturbed run's summary, as far as the report reads it."""
    return {
        "run": f"correlated-sensors-{policy}", "scenario": "correlated-sensors",
        "policy": policy, "publisher_order": order, "slo_p99_ms": 20.0, "duration_s": 5.0,
        "e2e_ms": {"p50": 1.0, "p95": 2.0, "p99": p99}, "brokers_used": 6,
        "brokers_available": 6, "publishers": 300, "unplaced_publishers": 0,
        "groups_per_broker": {str(b): 1 if order == "block" else 9 for b in range(1, 7)},
        "token_share_tail": 0.5, "per_broker": {}, "fitting_rounds": [],
        "accounting": {"published": 10, "delivered": 10, "lost": 0, "duplicates": 0},
        "emulator": {"unrouted": 0, "skipped_late": 0, "max_late_ms": 10.0},
        "validity": {"status": "valid", "reasons": [], "figures": {}},
    }  # fmt: skip


def test_the_comparison_says_its_order_and_what_srtm_gains_in_it() -> None:
    block = [summary("lb", "block", 30.0), summary("srtm", "block", 10.0)]
    shuffled = [summary("lb", "shuffled", 12.0), summary("srtm", "shuffled", 10.0)]
    doc = json.loads(json.dumps(report.compact(shuffled)))
    assert doc["publisher_order"] == "shuffled"
    assert doc["srtm_gain"] == pytest.approx(1.2)
    assert doc["policies"]["lb"]["groups_per_broker"]["1"] == 9
    assert report.compact(block)["srtm_gain"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="one comparison per publisher order"):
        report.compact(block + shuffled)
    both = report.conclusion(block + shuffled) or ""
    assert both.startswith("Block order: Within the SLO") and "Shuffled order:" in both
    lines = report.gain_lines(block + shuffled)
    assert lines[0].startswith("publishers in block order: LB p99 30.0 ms")
    assert lines[1].endswith("SRTM's p99 1.2x lower")
    rows = report.rows(block + shuffled)
    assert [r[1] for r in rows] == ["block", "block", "shuffled", "shuffled"]
    # A disturbed run concludes nothing.
    busy = {"status": "disturbed", "reasons": ["busy"], "figures": {}}
    lb = summary("lb", "shuffled", 12.0) | {"validity": busy}
    assert report.compact([lb, shuffled[1]])["srtm_gain"] is None
    assert report.gain_lines([lb, shuffled[1]])[0].endswith("disturbed, no conclusion")
    # LB ahead is said as SRTM behind, never as a gain below one.
    behind = [summary("lb", "shuffled", 7.0), summary("srtm", "shuffled", 9.8)]
    assert report.gain_lines(behind)[0].endswith("SRTM's p99 1.4x higher, on 6 brokers")
