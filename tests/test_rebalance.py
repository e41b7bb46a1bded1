"""The rebalancer (srtm.placement.rebalance): properties over random clusters, one unit case
per rule, the load averager, and ``srtm rebalance``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from srtm.cli import app
from srtm.placement.rebalance import (
    BrokerWindow,
    Decision,
    Despawn,
    LoadAverager,
    RebalanceSettings,
    RebalanceState,
    Relocate,
    Replicate,
    Spawn,
    Unreplicate,
    apply,
    load_ratios,
    rebalance,
)
from srtm.placement.whatif import parse_state

NOW = 100.0
SETTINGS = RebalanceSettings()
runner = CliRunner()


def _topic(doc: dict[str, Any]) -> dict[str, Any]:
    return {"slo_p99_ms": 20, "burst": 100, **doc}


def _state(brokers: list[dict[str, Any]], topics: list[dict[str, Any]]) -> RebalanceState:
    return parse_state({"brokers": brokers, "topics": [_topic(t) for t in topics]})


def _pubs(prefix: str, n: int, rate: float, groups: int = 1) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "rate": rate, "group": f"g{i % groups}"} for i in range(n)]


def _ids(pubs: list[dict[str, Any]]) -> list[str]:
    return [p["id"] for p in pubs]


# -- properties ------------------------------------------------------------------------------
@st.composite
def clusters(draw: st.DrawFn, locks: bool = True, cpu: bool = True) -> RebalanceState:
    n_brokers = draw(st.integers(2, 5))
    brokers: list[dict[str, Any]] = []
    for i in range(n_brokers):
        b: dict[str, Any] = {"id": f"b{i}", "mcap": 1000}
        b["slo_streak"] = draw(st.sampled_from([0, 0, 0, 1, 2]))
        if draw(st.booleans()):
            b["egress_max"] = 1e6  # 1 MB/s: egress decides, replicas appear
        if cpu and draw(st.booleans()):
            b["cpu"] = draw(st.floats(0, 0.95))
        brokers.append(b)
    topics = []
    for t in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 12))
        rate = draw(st.sampled_from([10, 25, 40, 80, 150]))
        groups = draw(st.integers(1, 3))
        pubs = _pubs(f"t{t}p", n, rate, groups)
        if draw(st.booleans()):  # on one broker, as placement leaves a small topic
            homes = [draw(st.integers(0, n_brokers - 1))] * n
        else:
            homes = draw(st.lists(st.integers(0, n_brokers - 1), min_size=n, max_size=n))
        plan: dict[str, list[str]] = {}
        for p, h in zip(pubs, homes, strict=True):
            plan.setdefault(f"b{h}", []).append(p["id"])
        doc: dict[str, Any] = {"name": f"t{t}", "publishers": pubs, "plan": plan}
        doc["subscribers"] = draw(st.sampled_from([1, 2, 4, 20]))
        doc["message_bytes"] = draw(st.sampled_from([100, 500]))
        if locks and draw(st.booleans()):
            doc["last_change_s"] = draw(st.floats(0, NOW))
        topics.append(doc)
    return _state(brokers, topics)


def _parts(state: RebalanceState) -> dict[tuple[str, str], float]:
    return {(t.name, b): t.part(b) for t in state.topics for b in t.plan}


@given(clusters())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decisions_respect_the_target_slivers_and_the_interval(state: RebalanceState) -> None:
    decisions = rebalance(state, SETTINGS, NOW)
    assert decisions == rebalance(state, SETTINGS, NOW)  # deterministic
    locked = {
        t.name
        for t in state.topics
        if t.last_change_s is not None and NOW - t.last_change_s < SETTINGS.min_plan_interval_s
    }
    for d in decisions:
        assert not isinstance(d, Relocate | Replicate | Unreplicate) or d.topic not in locked
    after = load_ratios(apply(state, decisions, SETTINGS, NOW), SETTINGS)
    for d in decisions:
        if isinstance(d, Relocate | Replicate):
            assert after[d.to] <= SETTINGS.target + 1e-9, (d, after)
    # no move leaves a new part below the minimum share on either side
    current = state
    for d in decisions:
        if not isinstance(d, Relocate):
            continue
        topic = next(t for t in current.topics if t.name == d.topic)
        floor = SETTINGS.min_slice_share * topic.spec.load
        current = apply(current, [d], SETTINGS, NOW)
        moved = next(t for t in current.topics if t.name == d.topic)
        left, at_dest = moved.part(d.source), moved.part(d.to)
        if left > 0:  # a slice: both sides keep at least the minimum share
            assert min(left, at_dest) >= floor * (1 - 1e-9), (d, left, at_dest, floor)
        # a whole part moved keeps its size (merged at the destination, it only grows)


@given(clusters(locks=False, cpu=False))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_after_the_moves_nobody_is_overloaded_or_a_spawn_is_asked(state: RebalanceState) -> None:
    decisions = rebalance(state, SETTINGS, NOW)
    after = load_ratios(apply(state, decisions, SETTINGS, NOW), SETTINGS)
    if any(isinstance(d, Spawn) for d in decisions):
        assert max(load_ratios(state, SETTINGS).values()) > SETTINGS.overload
    else:
        assert max(after.values()) <= SETTINGS.overload + 1e-9, (decisions, after)
    assert not any(isinstance(d, Despawn) for d in decisions) or not any(
        lr > SETTINGS.overload for lr in load_ratios(state, SETTINGS).values()
    )


# -- unit cases ---------------------------------------------------------------------------------
def test_an_overloaded_broker_sheds_its_busiest_topic_whole_to_the_least_loaded() -> None:
    hot, cold = _pubs("h", 4, 100), _pubs("c", 2, 150)
    state = _state(
        [{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000}, {"id": "b3", "mcap": 1000}],
        [
            {"name": "hot", "rate": 400, "publishers": hot, "plan": {"b1": _ids(hot)}},
            {"name": "cold", "rate": 300, "publishers": cold, "plan": {"b1": _ids(cold)}},
            {"name": "x", "rate": 100, "publishers": _pubs("x", 1, 100), "plan": {"b2": ["x0"]}},
        ],
    )
    assert load_ratios(state, SETTINGS)["b1"] == pytest.approx(0.7)
    keep = RebalanceSettings(min_brokers=3)
    assert rebalance(state, keep, NOW) == []  # 0.7 is not an overload
    heavier = _state(
        [{"id": "b1", "mcap": 800}, {"id": "b2", "mcap": 1000}, {"id": "b3", "mcap": 1000}],
        [
            {"name": "hot", "rate": 400, "publishers": hot, "plan": {"b1": _ids(hot)}},
            {"name": "cold", "rate": 300, "publishers": cold, "plan": {"b1": _ids(cold)}},
            {"name": "x", "rate": 100, "publishers": _pubs("x", 1, 100), "plan": {"b2": ["x0"]}},
        ],
    )
    decisions = rebalance(heavier, SETTINGS, NOW)
    assert decisions == [Relocate("hot", tuple(_ids(hot)), "b1", "b3")]
    after = load_ratios(apply(heavier, decisions, SETTINGS, NOW), SETTINGS)
    assert after["b1"] < SETTINGS.target and after["b3"] == pytest.approx(0.4)


def test_a_part_goes_first_to_a_broker_already_carrying_the_topic() -> None:
    pubs = _pubs("p", 10, 50)
    state = _state(
        [{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000, "ingress": 200},
         {"id": "b3", "mcap": 1000}],
        [{"name": "t", "rate": 500, "publishers": pubs,
          "plan": {"b1": _ids(pubs)[:2], "b2": _ids(pubs)[2:]}},
         {"name": "u", "rate": 850, "publishers": _pubs("u", 1, 850), "plan": {"b1": ["u0"]}}],
    )  # fmt: skip
    # b1 carries 100 of t and 850 of u (LR 0.95). u (one publisher of 850) fits nowhere
    # under the target; t's part goes to b2, already in t's plan, not to the idler b3
    # (the topic gains no broker); b1 stays overloaded, so a broker is asked for.
    decisions = rebalance(state, SETTINGS, NOW)
    assert decisions == [Relocate("t", ("p0", "p1"), "b1", "b2"), Spawn(1)]


def test_a_slice_takes_every_group_in_proportion() -> None:
    pubs = _pubs("p", 12, 100, groups=3)  # 1,200 msg/s on one broker of 1,500
    state = _state(
        [{"id": "b1", "mcap": 1400}, {"id": "b2", "mcap": 1000}],
        [{"name": "t", "rate": 1200, "publishers": pubs, "plan": {"b1": _ids(pubs)}}],
    )
    decisions = rebalance(state, SETTINGS, NOW)
    (move,) = [d for d in decisions if isinstance(d, Relocate)]
    groups = [int(p[1:]) % 3 for p in move.publishers]
    assert len(move.publishers) == 6 and sorted(groups) == [0, 0, 1, 1, 2, 2]


def test_no_sliver_is_moved_and_a_spawn_is_asked_instead() -> None:
    pubs = _pubs("p", 20, 50)  # 1,000 msg/s on b1 (LR 1.0); b2 has room for 100 only
    state = _state(
        [{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000, "ingress": 500}],
        [{"name": "t", "rate": 1000, "publishers": pubs, "plan": {"b1": _ids(pubs)}}],
    )
    decisions = rebalance(state, SETTINGS, NOW)
    assert decisions == [Spawn(1)]  # 100 msg/s would be a tenth of the topic: a sliver
    loose = RebalanceSettings(min_slice_share=0.05)
    moves = [d for d in rebalance(state, loose, NOW) if isinstance(d, Relocate)]
    assert moves and sum(50 for d in moves for _ in d.publishers) == 100


def test_an_slo_violation_two_windows_running_is_an_overload() -> None:
    pubs = _pubs("p", 4, 100)

    def state(streak: int) -> RebalanceState:
        return _state(
            [{"id": "b1", "mcap": 1000, "slo_streak": streak}, {"id": "b2", "mcap": 1000}],
            [{"name": "t", "rate": 400, "publishers": pubs, "plan": {"b1": _ids(pubs)}}],
        )

    two = RebalanceSettings(min_brokers=2)  # no despawn: b2 is idle
    assert rebalance(state(1), two, NOW) == []  # LR 0.4, one window: nothing
    assert rebalance(state(2), two, NOW) == [Relocate("t", tuple(_ids(pubs)), "b1", "b2")]
    assert rebalance(state(2), replace(two, slo_windows=3), NOW) == []


def test_a_topic_changed_less_than_the_interval_ago_is_left_alone() -> None:
    pubs = _pubs("p", 9, 100)
    doc = {"name": "t", "rate": 900, "publishers": pubs, "plan": {"b1": _ids(pubs)}}
    brokers = [{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000}]
    recent = _state(brokers, [{**doc, "last_change_s": NOW - 19.9}])
    assert rebalance(recent, SETTINGS, NOW) == []  # no spawn either: it only waits
    assert rebalance(recent, SETTINGS, NOW + 0.2) != []


def test_despawn_only_when_the_average_stays_under_the_threshold() -> None:
    def state(load: float) -> RebalanceState:
        topics = [
            {"name": f"t{i}", "rate": load, "publishers": _pubs(f"t{i}p", 2, load / 2),
             "plan": {f"b{i}": [f"t{i}p0", f"t{i}p1"]}}
            for i in range(3)
        ]  # fmt: skip
        return _state([{"id": f"b{i}", "mcap": 1000} for i in range(3)], topics)

    # average 0.25: without one broker 0.375 < 0.60; the least loaded (ties: by id) goes,
    # its part moved whole to a broker with room under the target
    low = state(250)
    decisions = rebalance(low, SETTINGS, NOW)
    assert decisions[-1] == Despawn("b0") and isinstance(decisions[0], Relocate)
    after = load_ratios(apply(low, decisions, SETTINGS, NOW), SETTINGS)
    assert "b0" not in after and max(after.values()) <= SETTINGS.target
    assert rebalance(state(400), SETTINGS, NOW) == []  # 0.4 × 3/2 = 0.6: stays
    assert rebalance(low, RebalanceSettings(min_brokers=3), NOW) == []


def test_despawn_picks_the_least_loaded_stoppable_broker() -> None:
    topics = [
        {"name": f"t{i}", "rate": load, "publishers": _pubs(f"t{i}p", 2, load / 2),
         "plan": {f"b{i}": [f"t{i}p0", f"t{i}p1"]}}
        for i, load in enumerate((100, 200, 300))
    ]  # fmt: skip
    brokers = [{"id": f"b{i}", "mcap": 1000} for i in range(3)]
    assert rebalance(_state(brokers, topics), SETTINGS, NOW)[-1] == Despawn("b0")
    brokers[0]["stoppable"] = False  # b0 was started some other way: b1 goes instead
    decisions = rebalance(_state(brokers, topics), SETTINGS, NOW)
    assert decisions[-1] == Despawn("b1")
    assert all(d.source == "b1" for d in decisions if isinstance(d, Relocate))
    for b in brokers:
        b["stoppable"] = False
    assert rebalance(_state(brokers, topics), SETTINGS, NOW) == []


def test_min_and_max_brokers_bound_spawns() -> None:
    pubs = _pubs("p", 10, 100)
    doc = {"name": "t", "rate": 1000, "publishers": pubs, "plan": {"b1": _ids(pubs)}}
    full = _state([{"id": "b1", "mcap": 1000}], [doc])
    assert rebalance(full, SETTINGS, NOW) == [Spawn(1)]
    assert rebalance(full, RebalanceSettings(max_brokers=1), NOW) == []
    spawning = RebalanceState(full.brokers, full.topics, spawning=1)
    assert rebalance(spawning, RebalanceSettings(max_brokers=2), NOW) == []
    assert rebalance(full, RebalanceSettings(min_brokers=3), NOW) == [Spawn(2)]


def test_a_home_of_several_replicated_topics_gets_under_the_overload() -> None:
    """Found by hypothesis: replication sizes each topic alone (t0 on 3 carriers, t2 on 2,
    each under target), which left their home at 0.9 of its egress with no spawn asked
    for. The home now widens its topics' replicas until it is under target."""
    brokers = [{"id": f"b{i}", "mcap": 1000} for i in range(5)]
    brokers[0]["egress_max"] = 1e6
    topics = [
        {"name": "t0", "publishers": _pubs("t0p", 1, 150), "plan": {"b0": ["t0p0"]},
         "subscribers": 20, "message_bytes": 500},
        {"name": "t1", "publishers": _pubs("t1p", 1, 10), "plan": {"b0": ["t1p0"]},
         "subscribers": 1, "message_bytes": 100},
        {"name": "t2", "publishers": _pubs("t2p", 1, 80), "plan": {"b0": ["t2p0"]},
         "subscribers": 20, "message_bytes": 500},
    ]  # fmt: skip
    state = _state(brokers, topics)
    assert load_ratios(state, SETTINGS)["b0"] > 2
    decisions = rebalance(state, SETTINGS, NOW)
    after = load_ratios(apply(state, decisions, SETTINGS, NOW), SETTINGS)
    assert not any(isinstance(d, Spawn) for d in decisions)
    assert max(after.values()) <= SETTINGS.target + 1e-9, (decisions, after)


def test_a_topic_with_too_much_egress_gets_all_publishers_replicas() -> None:
    pubs = _pubs("p", 2, 50)  # 100 msg/s × 1,000 subscribers × 1 kB = 100 MB/s
    doc = {"name": "t", "rate": 100, "publishers": pubs, "plan": {"b1": _ids(pubs)},
           "subscribers": 1000, "message_bytes": 1000}  # fmt: skip
    brokers = [{"id": f"b{i}", "mcap": 1000} for i in (1, 2, 3)]
    state = _state(brokers, [doc])
    decisions = rebalance(state, SETTINGS, NOW)  # 100 MB/s > 0.6 × 125 MB/s: two replicas
    assert decisions == [Replicate("t", "b2", "all_publishers")]
    after = load_ratios(apply(state, decisions, SETTINGS, NOW), SETTINGS)
    assert after["b1"] == after["b2"] == pytest.approx(0.4)
    quiet = _state(brokers, [{**doc, "subscribers": 100, "replicas": ["b2"]}])
    assert rebalance(quiet, SETTINGS, NOW) == [Unreplicate("t", "b2")]


def test_load_ratio_is_the_worst_of_ingress_egress_and_cpu() -> None:
    pubs = _pubs("p", 1, 100)
    doc = {"name": "t", "rate": 110, "publishers": pubs, "plan": {"b1": ["p0"]}}
    ratios = load_ratios(
        _state([{"id": "b1", "mcap": 1000, "cpu": 0.3, "egress": 5e7}], [doc]), SETTINGS
    )
    assert ratios["b1"] == pytest.approx(0.4)  # egress 50 MB/s of 125
    ratios = load_ratios(_state([{"id": "b1", "mcap": 1000, "cpu": 0.9}], [doc]), SETTINGS)
    assert ratios["b1"] == pytest.approx(0.9)
    ratios = load_ratios(_state([{"id": "b1", "mcap": 100}], [doc]), SETTINGS)
    assert ratios["b1"] == pytest.approx(1.1)  # the ledger counts the bucket rate, 110


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="target"):
        RebalanceSettings(target=0.9)
    with pytest.raises(ValueError, match="min_brokers"):
        RebalanceSettings(min_brokers=5, max_brokers=2)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"brokers": []}, "brokers"),
        ({"brokers": [{"id": "b1"}]}, "brokers[0]: missing field 'mcap'"),
        ({"brokers": [{"id": "b1", "mcap": 1, "cpu": -1}]}, "brokers[0].cpu"),
        ({"brokers": [{"id": "b1", "mcap": 1, "stoppable": "no"}]}, "brokers[0].stoppable"),
        ({"brokers": [{"id": "b1", "mcap": 1}], "topics": [{"name": "t"}]}, "topics[0]"),
        (
            {
                "brokers": [{"id": "b1", "mcap": 1}],
                "topics": [
                    _topic(
                        {"name": "t", "publishers": [{"id": "p", "rate": 1}], "plan": {"b9": ["p"]}}
                    )
                ],
            },
            "topics[0].plan: unknown broker 'b9'",
        ),
    ],
)
def test_parse_state_names_the_bad_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_state(doc)
    assert field in str(info.value)


# -- the averager -------------------------------------------------------------------------------
def test_the_averager_means_the_last_window() -> None:
    avg = LoadAverager(window_s=10.0)
    for t in range(20):
        avg.add("b1", float(t), ingress=100.0 if t < 10 else 300.0, egress=1e3, cpu=0.5)
    w = avg.window("b1", 1000.0, 19.0)
    assert w == BrokerWindow("b1", 1000.0, 300.0, 1e3, 0.5, 0)
    assert avg.window("b1", 1000.0, 14.5).ingress == pytest.approx(300.0)
    assert avg.window("nobody", 5.0, 19.0) == BrokerWindow("nobody", 5.0)


def test_the_averager_counts_consecutive_violated_windows() -> None:
    avg = LoadAverager(window_s=10.0)
    avg.add("b1", 5.0, 0, 0, 0, slo_violated=True)
    assert avg.window("b1", 1.0, 9.0).slo_streak == 1
    avg.add("b1", 12.0, 0, 0, 0, slo_violated=False)
    assert avg.window("b1", 1.0, 12.0).slo_streak == 1  # the window before counts
    avg.add("b1", 15.0, 0, 0, 0, slo_violated=True)
    assert avg.window("b1", 1.0, 15.0).slo_streak == 2
    assert avg.window("b1", 1.0, 35.0).slo_streak == 0  # a quiet window in between
    avg.forget("b1")
    assert avg.window("b1", 1.0, 15.0).slo_streak == 0


# -- the command --------------------------------------------------------------------------------
def _state_file(tmp_path: Path) -> Path:
    hot = _pubs("h", 4, 200, groups=2)
    path = tmp_path / "state.json"
    doc = {
        "now_s": NOW,
        "brokers": [{"id": "b1", "mcap": 1000, "cpu": 0.3}, {"id": "b2", "mcap": 1000},
                    {"id": "b3", "mcap": 1000}],
        "topics": [
            _topic({"name": "hot", "subscribers": 2, "message_bytes": 200, "publishers": hot,
                    "plan": {"b1": _ids(hot)}}),
            _topic({"name": "cold", "publishers": [{"id": "c1", "rate": 50}],
                    "plan": {"b2": ["c1"]}, "last_change_s": 95}),
        ],
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_rebalance_command_prints_decisions_and_ratios(tmp_path: Path) -> None:
    path = _state_file(tmp_path)
    result = runner.invoke(app, ["rebalance", "--state", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["now_s"] == NOW
    assert doc["decisions"] == [
        {"action": "move", "topic": "hot", "publishers": ["h0", "h1"], "from": "b1", "to": "b3"}
    ]
    ratios = {b["id"]: (b["before"], b["after"]) for b in doc["brokers"]}
    assert ratios["b1"][0] == pytest.approx(0.88) and ratios["b1"][1] == pytest.approx(0.44)
    assert math.isclose(ratios["b3"][1], 0.44)
    table = runner.invoke(app, ["rebalance", "--state", str(path)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "move" in table.output and "0.880" in table.output
    assert "0.440" in table.output


def test_rebalance_command_refuses_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"brokers": [{"id": "b1", "mcap": "lots"}]}))
    result = runner.invoke(app, ["rebalance", "--state", str(path)])
    assert result.exit_code == 2 and "brokers[0].mcap" in result.output
    result = runner.invoke(app, ["rebalance", "--state", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "--state" in result.output
    ok = _state_file(tmp_path)
    result = runner.invoke(app, ["rebalance", "--state", str(ok), "--target", "0.9"])
    assert result.exit_code == 2 and "target" in result.output


def test_decisions_print_as_documented() -> None:
    decisions: list[Decision] = [
        Relocate("t", ("p",), "a", "b"), Replicate("t", "c"), Unreplicate("t", "c"), Spawn(1),
        Despawn("a"),
    ]  # fmt: skip
    assert [d.to_json() for d in decisions] == [
        {"action": "move", "topic": "t", "publishers": ["p"], "from": "a", "to": "b"},
        {"action": "replicate", "topic": "t", "to": "c", "kind": "all_publishers"},
        {"action": "unreplicate", "topic": "t", "from": "c"},
        {"action": "spawn", "n": 1},
        {"action": "despawn", "broker": "a"},
    ]


def test_brokers_being_started_count_and_an_slo_violator_takes_nothing() -> None:
    pubs = _pubs("p", 10, 100)
    doc = {"name": "t", "rate": 1000, "publishers": pubs, "plan": {"b1": _ids(pubs)}}
    full = _state([{"id": "b1", "mcap": 1000}], [doc])
    needs_three = _state([{"id": "b1", "mcap": 500}], [doc])  # LR 2.0: (2.0 - 0.6) / 0.6
    assert rebalance(needs_three, SETTINGS, NOW) == [Spawn(3)]
    started = RebalanceState(needs_three.brokers, needs_three.topics, spawning=2)
    assert rebalance(started, SETTINGS, NOW) == [Spawn(1)]
    assert rebalance(RebalanceState(full.brokers, full.topics, spawning=1), SETTINGS, NOW) == []
    # the only other broker violates its SLO: it gets nothing, so a broker is asked for
    sick = _state([{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000, "slo_streak": 2}],
                  [doc])  # fmt: skip
    assert rebalance(sick, SETTINGS, NOW) == [Spawn(1)]


def test_a_destination_over_the_target_on_cpu_takes_nothing() -> None:
    pubs = _pubs("p", 9, 100)
    doc = {"name": "t", "rate": 900, "publishers": pubs, "plan": {"b1": _ids(pubs)}}
    busy = _state([{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000, "cpu": 0.7}], [doc])
    assert rebalance(busy, SETTINGS, NOW) == [Spawn(1)]


# -- whole parts first, slices only when no broker could take the part whole ----------------
def _fresh_takes_whole(state: RebalanceState, topic_name: str, source: str) -> bool:
    """Could an empty broker as large as the largest one take the part whole under target
    (ingress in the ledger's units and egress; the clusters below have no CPU)?"""
    topic = next(t for t in state.topics if t.name == topic_name)
    part = topic.part(source)
    mcap = max(b.mcap for b in state.brokers)
    emax = max(b.egress_max or SETTINGS.egress_max for b in state.brokers)
    out = part * topic.subscribers * topic.message_bytes
    return part * topic.scale <= SETTINGS.target * mcap and out <= SETTINGS.target * emax


@given(clusters(locks=False, cpu=False))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_slice_is_cut_only_from_a_part_no_new_broker_could_take(state: RebalanceState) -> None:
    """While the cluster can grow, a part that an empty broker could carry whole is never
    split: it moves whole, or waits for the spawn asked in the same decisions."""
    decisions = rebalance(state, SETTINGS, NOW)
    current = state
    for d in decisions:
        if not isinstance(d, Relocate):
            continue
        before = current
        current = apply(current, [d], SETTINGS, NOW)
        left = next(t for t in current.topics if t.name == d.topic).part(d.source)
        if left > 0:  # a slice
            assert not _fresh_takes_whole(before, d.topic, d.source), d


# Found by the full suite: t0 (egress 1.5 MB/s against b0's 1 MB/s) is replicated onto b1,
# then t1 sliced; judged without the replica, t0 looked as if it could move whole.
_REPLICA_THEN_SLICE = _state(
    [{"id": "b0", "mcap": 1000, "egress_max": 1e6}, {"id": "b1", "mcap": 1000}],
    [{"name": "t0", "publishers": _pubs("t0p", 1, 150), "plan": {"b0": ["t0p0"]},
      "subscribers": 20, "message_bytes": 500},
     {"name": "t1", "publishers": _pubs("t1p", 4, 150), "plan": {"b0": _ids(_pubs("t1p", 4, 150))},
      "subscribers": 1, "message_bytes": 100}],
)  # fmt: skip


@given(clusters(locks=False, cpu=False))
@example(_REPLICA_THEN_SLICE)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_slice_while_a_whole_part_of_that_broker_could_move(state: RebalanceState) -> None:
    """A slice is cut from a broker only when none of its movable parts fits whole on any
    other broker under target at that point (whole parts are tried first)."""
    decisions = rebalance(state, SETTINGS, NOW)
    current = state
    for d in decisions:
        after = apply(current, [d], SETTINGS, NOW)
        if not isinstance(d, Relocate):
            current = after  # a replica made before the slice carries its topic too
            continue
        left = next(t for t in after.topics if t.name == d.topic).part(d.source)
        if left > 0:
            for t in current.topics:
                part = t.part(d.source)
                if part <= 0 or t.replicas:
                    continue
                for b in current.brokers:
                    if b.id == d.source or b.slo_streak >= SETTINGS.slo_windows:
                        continue
                    whole = Relocate(t.name, tuple(t.plan[d.source]), d.source, b.id)
                    lr = load_ratios(apply(current, [whole], SETTINGS, NOW), SETTINGS)
                    assert lr[b.id] > SETTINGS.target + 1e-9, (d, whole, lr)
        current = after


def test_small_whole_topics_move_before_a_big_one_is_split() -> None:
    big, small = _pubs("b", 10, 50, groups=2), [_pubs(f"s{i}", 2, 50) for i in range(3)]
    # b1: big 500 (r 550) + three small of 100 (r 110): LR 0.88; b2 has room for 250
    state = _state(
        [{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000, "ingress": 350}],
        [{"name": "big", "publishers": big, "plan": {"b1": _ids(big)}}]
        + [{"name": f"s{i}", "publishers": p, "plan": {"b1": _ids(p)}}
           for i, p in enumerate(small)],
    )  # fmt: skip
    decisions = rebalance(state, SETTINGS, NOW)
    moves = [d for d in decisions if isinstance(d, Relocate)]
    assert moves and all(d.topic != "big" for d in moves)
    assert {d.topic for d in moves} <= {"s0", "s1", "s2"}
    after = load_ratios(apply(state, decisions, SETTINGS, NOW), SETTINGS)
    assert after["b2"] <= SETTINGS.target + 1e-9
    # b1 is still over the target: the big topic would fit a new broker whole, so one is
    # asked (early: b1 is no longer over the overload threshold)
    assert SETTINGS.target < after["b1"] < SETTINGS.overload and decisions[-1] == Spawn(1)


def test_a_part_a_new_broker_could_take_waits_for_the_spawn_unless_at_max() -> None:
    pubs = _pubs("p", 10, 50, groups=5)  # 500 msg/s, r 550, and u: 300 (r 330): LR 0.88
    u = _pubs("u", 1, 300)
    state = _state(
        [{"id": "b1", "mcap": 1000}, {"id": "b2", "mcap": 1000, "ingress": 350}],
        [{"name": "t", "publishers": pubs, "plan": {"b1": _ids(pubs)}},
         {"name": "u", "publishers": u, "plan": {"b1": ["u0"]}}],
    )  # fmt: skip
    assert rebalance(state, SETTINGS, NOW) == [Spawn(1)]  # no slice of t: it would fit whole
    at_max = rebalance(state, RebalanceSettings(max_brokers=2), NOW)
    (move,) = at_max
    assert isinstance(move, Relocate) and move.topic == "t" and 0 < len(move.publishers) < 10


def test_an_slo_violating_broker_sheds_a_split_part_first() -> None:
    big, split = _pubs("b", 4, 50), _pubs("s", 4, 25)
    state = _state(
        [{"id": "b1", "mcap": 1000, "slo_streak": 2}, {"id": "b2", "mcap": 1000}],
        [{"name": "big", "publishers": big, "plan": {"b1": _ids(big)}},
         {"name": "split", "publishers": split,
          "plan": {"b1": _ids(split)[:2], "b2": _ids(split)[2:]}}],
    )  # fmt: skip
    decisions = rebalance(state, RebalanceSettings(min_brokers=2), NOW)
    assert decisions == [Relocate("split", ("s0", "s1"), "b1", "b2")]  # the split is healed
