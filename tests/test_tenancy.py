"""The multi-tenant scenario: its definition, the replay of placement decisions on the
capacity ledger, the fleet simulation, and `srtm experiment run multi-tenant --sim`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from srtm.experiments.tenancy import scenario as tenancy
from srtm.experiments.tenancy.scenario import Tenant, events, paper_scale, replay
from srtm.experiments.tenancy.sim import claims, declare, interference, multi_tenant_sim
from srtm.placement import PublisherLoad, TopicSpec
from srtm.ratelimit import BucketParams
from srtm.sim import Share, generate, homogeneous, paper, simulate
from srtm.sim.fleet import simulate_fleet


def test_the_paper_scale_scenario_is_what_the_issue_asks() -> None:
    sc = paper_scale()
    assert len(sc.tenants) >= 50 and sc.brokers == 20 and sc.mcap == 110_000
    assert len({t.slo_p99_ms for t in sc.tenants}) >= 4
    assert len({t.load for t in sc.tenants}) >= 5
    assert len({(t.process, t.group) for t in sc.tenants}) >= 4
    assert [t.name for t in sc.tenants if t.delete_s is not None] == [sc.deleted.name]
    assert sc.joining.join_every_s is not None and sc.joining.publishers > 1
    arrivals = [t.arrive_s for t in sc.tenants]
    assert arrivals == sorted(arrivals) and arrivals[0] < arrivals[-1]


def test_events_create_before_joins_and_delete_after() -> None:
    sc = paper_scale(12)
    evs = events(sc)
    assert [e.t_s for e in evs] == sorted(e.t_s for e in evs)
    joining = [e for e in evs if e.topic == sc.joining.name]
    assert joining[0].what == "create" and len(joining[0].publishers) == 1
    assert all(e.what == "join" and len(e.publishers) == 1 for e in joining[1:])
    assert len(joining) == sc.joining.publishers
    assert [e.what for e in evs if e.topic == sc.deleted.name] == ["create", "delete"]


def _specs(sc: tenancy.TenancyScenario) -> dict[str, TopicSpec]:
    _, specs = declare(sc, 1.0, 0)
    return specs


@pytest.mark.parametrize("policy", ["srtm", "lb"])
def test_the_replay_keeps_allocated_within_mcap_and_moves_no_joined_sensor(policy: str) -> None:
    sc = paper_scale(12)
    specs = _specs(sc)
    rep = replay(sc, policy, specs)  # type: ignore[arg-type]
    assert len(rep.samples) == len(events(sc))
    for s in rep.samples:
        assert max(s.allocated.values()) <= sc.mcap * (1 + 1e-9), s.event
    # Each sensor of the joining topic stays where it first went.
    where: dict[str, str] = {}
    every = sc.joining.join_every_s or 0.0
    for k in (2, 300, 700, sc.joining.publishers):
        until = sc.joining.arrive_s + (k - 1) * every
        part = replay(sc, policy, specs, until_s=until)  # type: ignore[arg-type]
        plan = part.plans[sc.joining.name]
        now = {p.id: b for b, ps in plan.assignment.items() for p in ps}
        assert all(now[p] == b for p, b in where.items())
        where = now
    assert not rep.plans[sc.joining.name].unassigned


def test_deleting_a_topic_frees_its_share_of_the_ledger() -> None:
    sc = paper_scale(12)
    specs = _specs(sc)
    before = replay(sc, "srtm", specs, until_s=sc.deleted.delete_s - 1e-6)  # type: ignore[operator]
    after = replay(sc, "srtm", specs, until_s=sc.deleted.delete_s)  # type: ignore[arg-type]
    freed = before.plans[sc.deleted.name].buckets
    assert freed and sc.deleted.name not in after.plans
    for b, bucket in freed.items():
        drop = before.samples[-1].allocated[b] - after.samples[-1].allocated[b]
        assert drop == pytest.approx(bucket.rate)


def test_one_topic_alone_simulates_as_the_engine_does() -> None:
    pubs = homogeneous(200, batch=10, group_size=5)
    trace = generate(pubs, 2.0, seed=3)
    shares = [Share("b1", np.arange(200), BucketParams(2_200.0, 60.0))]
    one = simulate(trace, shares, paper(), seed=7, warmup_s=0.2)
    fleet = simulate_fleet({"t": trace}, {"t": shares}, paper(), seed=7, warmup_s=0.2)
    assert fleet.topics["t"] == one.topic


def test_a_topic_sharing_its_broker_waits_behind_the_other() -> None:
    quiet = generate(homogeneous(100, batch=10), 2.0, seed=1)
    loud = generate(homogeneous(8_000, batch=10, group_size=20), 2.0, seed=2)
    q = [Share("b1", np.arange(100), None)]
    alone = simulate_fleet({"q": quiet}, {"q": q}, paper(), seed=0)
    shared = simulate_fleet(
        {"q": quiet, "l": loud}, {"q": q, "l": [Share("b1", np.arange(8_000), None)]}, paper()
    )
    assert shared.topics["q"].p99_ms > 1.5 * alone.topics["q"].p99_ms
    assert shared.utilisation["b1"] > alone.utilisation["b1"]


def test_the_sim_compares_srtm_with_lb_from_the_run(tmp_path: Path) -> None:
    res = multi_tenant_sim(tmp_path, topics=12, window_s=1.0)
    data = res.data
    assert set(data["policies"]) == {"srtm", "lb"}
    for p, run in data["policies"].items():
        topics = run["topics"]
        assert len(topics) == 12
        assert data["summary"][p]["met"] == sum(t["met"] for t in topics)
        for t in topics:
            assert t["met"] == (t["p99_ms"] <= t["slo_p99_ms"] and not t["short"])
            assert set(t["p99_by_state"]) <= {"before the deletion", "end"}
        led = run["ledger"]
        assert len(led["t_s"]) == len(events(paper_scale(12)))
        assert led["max_share"] == max(led["peak"].values()) / led["mcap"]
    srtm = data["policies"]["srtm"]["ledger"]
    assert all(max(v) <= srtm["mcap"] * (1 + 1e-9) for v in srtm["allocated"].values())
    assert data["summary"]["srtm"]["brokers_per_topic"] < data["summary"]["lb"]["brokers_per_topic"]
    assert [c["ok"] for c in data["claims"]] == [c["ok"] for c in claims(data)]
    # The verdicts follow the data: one SRTM topic missing its SLO fails the first.
    worse = copy.deepcopy(data)
    worse["summary"]["srtm"]["met"] -= 1
    assert not claims(worse)[0]["ok"]
    doc = json.loads((tmp_path / "multi-tenant.json").read_text())
    assert doc["data"]["summary"] == json.loads(json.dumps(data["summary"]))
    assert (tmp_path / "multi-tenant.png").read_bytes()[:4] == b"\x89PNG"
    assert "| broker |" in (tmp_path / "multi-tenant.md").read_text()


def _topic(name: str, met: bool, token_p99_ms: float = 0.0, brokers: int = 1) -> dict[str, Any]:
    return {"topic": name, "met": met, "short": False, "brokers": brokers,
            "token_p99_ms": token_p99_ms}  # fmt: skip


def test_a_miss_by_interference_is_called_expected_and_no_other() -> None:
    """The scenario's known misses (docs/results/multitenant.md): topics on one broker,
    no token wait, late behind a neighbour's bursts. The ✗ says they are expected; a miss
    of any other kind (token wait: a split's DRL penalty, or a topic on several brokers)
    gets no such word."""
    known = [_topic("t0", True), _topic("t15", False), _topic("t33", False)]
    note = interference({"topics": known})
    assert note.startswith("; expected: t15, t33 each sit on one broker and wait for no token")
    assert "docs/results/multitenant.md" in note
    assert interference({"topics": [*known, _topic("t40", False, token_p99_ms=0.4)]}) == ""
    assert interference({"topics": [*known, _topic("t41", False, brokers=3)]}) == ""
    assert interference({"topics": [_topic("t0", True)]}) == ""
    srtm = {"topics": known}
    data = {
        "summary": {s: {"met": 1, "topics": 3, "brokers_per_topic": b, "brokers_used": 2}
                    for s, b in (("srtm", 1.0), ("lb", 2.0))},
        "policies": {"srtm": {**srtm, "ledger": {"max_share": 0.5}}},
    }  # fmt: skip
    first = claims(data)[0]
    assert not first["ok"] and first["sim"] == "1 of 3 topics" + note


def test_a_tenant_names_its_sensors_and_groups() -> None:
    t = Tenant("x", 5.0, 12, 10.0, "periodic", 10, 5, 0.0)
    specs = t.specs()
    assert [s.id for s in specs][:2] == ["x-s0", "x-s1"]
    assert {s.group for s in specs} == {"g0", "g1", "g2"}
    assert t.load == 120.0 and "groups of 5" in t.kind
    loads = [PublisherLoad(s.id, s.rate, s.group) for s in specs]
    assert sum(p.rate for p in loads) == t.load


def test_the_command_line_lists_and_explains_multi_tenant() -> None:
    from typer.testing import CliRunner

    from srtm.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["experiment", "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "multi-tenant" in listed.output
    helped = runner.invoke(app, ["experiment", "run", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0 and "multi-tenant" in helped.output
