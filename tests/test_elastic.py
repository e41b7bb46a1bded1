"""Elasticity glue (srtm.control.elastic, pure) and the command-hook provisioner."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from srtm.control.actions import Migrate
from srtm.control.elastic import Elastic, carries, slo_violated
from srtm.control.model import Resources
from srtm.control.provision import CommandProvisioner, ProvisionError
from srtm.control.state import Controller
from srtm.placement import PublisherLoad, TopicSpec
from srtm.placement.rebalance import Despawn, RebalanceSettings


def topic(name: str, n: int, rate: float) -> TopicSpec:
    pubs = tuple(PublisherLoad(f"{name}{i}", rate, f"g{i % 2}") for i in range(n))
    return TopicSpec(name, pubs, 100, 1.0, 1.1 * rate * n)


def reg(c: Controller, bid: str, port: int, now: float = 0.0) -> None:
    c.register(bid, f"127.0.0.1:{port}", f"127.0.0.1:{port + 1000}", 100.0, now)


def elastic(**kw: float) -> Elastic:
    s = RebalanceSettings(window_s=1.0, min_plan_interval_s=0.0, **kw)  # type: ignore[arg-type]
    return Elastic(s)


def test_overload_spawns_then_moves_onto_the_new_broker() -> None:
    c = Controller()
    reg(c, "9", 4150)
    c.create_topic(topic("t", 4, 20.0), "srtm", now=0)  # r = 88 of mcap 100: LR 0.88
    el = elastic(max_brokers=3)
    el.observe(c, 1.0)
    step = el.step(c, 1.0, lambda b: True)
    assert step.start == ["1001"] and not step.actions
    el.observe(c, 2.0)
    assert el.step(c, 2.0, lambda b: True).start == []  # one being started counts
    reg(c, "1001", 4160, now=2.5)
    el.observe(c, 3.0)
    step = el.step(c, 3.0, lambda b: True)
    assert not el.spawning
    moved = [a for a in step.actions if isinstance(a, Migrate)]
    assert moved and all(a.broker == "9" for a in moved)
    assert c.topics["t"].assignment.get("1001")
    assert c.topics["t"].assignment.get("9")  # a slice, not everything


def _spawned_and_busy() -> tuple[Controller, Elastic]:
    """An overloaded broker 9 (r = 88 of mcap 100: LR 0.88), 1001 spawned for it and
    registered at 1.5 s, its first report at 0.9 of a core, observed at 1.6 s."""
    c = Controller()
    reg(c, "9", 4150)
    c.create_topic(topic("t", 4, 20.0), "srtm", now=0)
    el = elastic(max_brokers=3)
    el.observe(c, 1.0)
    assert el.step(c, 1.0, lambda b: True).start == ["1001"]
    reg(c, "1001", 4160, now=1.5)
    c.brokers["1001"].resources = Resources.from_json({"cpu": 0.9, "egress_bps": 0.0})
    el.observe(c, 1.6)
    return c, el


def test_no_second_spawn_while_the_new_broker_carries_nothing_yet() -> None:
    """The first report of a broker just started counts its start: at 0.9 of a core it
    has no room, and the rebalancer asks for another broker. None is started until the
    new one carries something or its load window (1 s here) has passed."""
    c, el = _spawned_and_busy()
    step = el.step(c, 1.6, lambda b: True)
    assert step.start == [] and not step.actions and el.settling == {"1001": 1.6}
    assert el.events[-1].endswith("spawn of 1 deferred: 1001 carries nothing yet")
    el.observe(c, 2.0)
    assert el.step(c, 2.0, lambda b: True).start == []
    assert sum("deferred" in e for e in el.events) == 1  # told once
    c.brokers["1001"].resources = Resources.from_json({"cpu": 0.01, "egress_bps": 0.0})
    el.observe(c, 2.7)  # the start's sample has left the 1 s window
    step = el.step(c, 2.7, lambda b: True)
    assert step.start == [] and c.topics["t"].assignment.get("1001")
    assert not el.settling  # it carries a slice now


def test_a_new_broker_that_stays_unusable_defers_a_spawn_only_for_a_window() -> None:
    c, el = _spawned_and_busy()  # and it stays busy with something else
    assert el.step(c, 1.6, lambda b: True).start == []
    el.observe(c, 2.7)
    assert el.step(c, 2.7, lambda b: True).start == ["1002"]


def test_max_brokers_bounds_spawns() -> None:
    c = Controller()
    reg(c, "9", 4150)
    c.create_topic(topic("t", 4, 20.0), "srtm", now=0)
    el = elastic(max_brokers=1)
    el.observe(c, 1.0)
    assert el.step(c, 1.0, lambda b: True).start == []


def _two_brokers() -> Controller:
    c = Controller()
    reg(c, "9", 4150)
    reg(c, "1001", 4160)
    c.create_topic(topic("a", 3, 10.0), "srtm", now=0)
    c.create_topic(topic("b", 1, 10.0), "srtm", now=0)
    c.set_assignment("a", {"9": ["a0", "a1", "a2"]}, [], "test")
    c.set_assignment("b", {"1001": ["b0"]}, [], "test")
    return c


def test_despawn_waits_until_the_broker_carries_nothing() -> None:
    c = _two_brokers()
    el = elastic()
    el.observe(c, 1.0)
    step = el.step(c, 1.0, lambda b: b == "1001")
    assert c.topics["b"].assignment == {"9": ["b0"]}
    assert step.stop == [] and "1001" in el.despawning
    assert carries(c, "1001")  # draining: its report must show the topic settled
    el.observe(c, 2.0)
    assert el.step(c, 2.0, lambda b: True).stop == []
    for _ in range(3):  # reports numbered 2 after the drop, nothing arriving
        c.report("1001", 0.0, {}, now=2.0, arrived={"b": 5})
    c.tick(2.1)
    assert not carries(c, "1001")
    el.observe(c, 3.0)
    assert el.step(c, 3.0, lambda b: True).stop == ["1001"]
    assert not el.despawning and el.despawned == 1


def test_min_brokers_and_foreign_brokers_are_not_despawned() -> None:
    for kw, can_stop in (({"min_brokers": 2}, True), ({}, False)):
        c = _two_brokers()
        el = elastic(**kw)
        el.observe(c, 1.0)
        step = el.step(c, 1.0, lambda b, ok=can_stop: ok)
        assert step.stop == [] and not step.actions and not el.despawning
        assert c.topics["b"].assignment == {"1001": ["b0"]}  # its moves dropped too
        # refused at the step (min_brokers) or never proposed (nothing stoppable)
        assert can_stop or not any(isinstance(d, Despawn) for d in step.decisions)


def test_a_static_broker_never_blocks_despawning_a_spawned_one() -> None:
    c = Controller()
    reg(c, "1", 4150)  # started by hand: the provisioner cannot stop it
    reg(c, "1001", 4160)
    c.create_topic(topic("a", 3, 10.0), "srtm", now=0)
    c.create_topic(topic("b", 1, 10.0), "srtm", now=0)
    c.set_assignment("a", {"1001": ["a0", "a1", "a2"]}, [], "test")
    c.set_assignment("b", {"1": ["b0"]}, [], "test")  # "1" is the least loaded, and first by id
    el = elastic()
    el.observe(c, 1.0)
    el.step(c, 1.0, lambda b: b == "1001")
    assert list(el.despawning) == ["1001"]
    assert c.topics["a"].assignment == {"1": ["a0", "a1", "a2"]}
    assert c.topics["b"].assignment == {"1": ["b0"]}


def test_an_empty_broker_is_stopped_at_once() -> None:
    c = Controller()
    reg(c, "9", 4150)
    c.create_topic(topic("a", 3, 10.0), "srtm", now=0)
    reg(c, "1001", 4160)
    el = elastic()
    el.observe(c, 1.0)
    assert el.step(c, 1.0, lambda b: b == "1001").stop == ["1001"]


def _hook(tmp_path: Path, body: str) -> str:
    script = tmp_path / "hook.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return f"{script} --region 'eu west'"


async def test_command_hook_gets_its_arguments(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    prov = CommandProvisioner(_hook(tmp_path, f'echo "$@" >> {log}; echo started'))
    await prov.start("1001")
    await prov.stop("1001")
    assert log.read_text().splitlines() == [
        "--region eu west start 1001",
        "--region eu west stop 1001",
    ]
    assert prov.can_stop("anything")


async def test_command_hook_failures_and_timeouts_raise(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match="exit code 3"):
        await CommandProvisioner(_hook(tmp_path, "exit 3")).start("1001")
    with pytest.raises(ProvisionError, match="no exit"):
        await CommandProvisioner(_hook(tmp_path, "exec sleep 30"), timeout_s=0.3).stop("x")
    with pytest.raises(ProvisionError):
        await CommandProvisioner(str(tmp_path / "missing")).start("1001")


def test_a_joining_publisher_does_not_lock_its_topic_but_a_move_does() -> None:
    """The one plan per interval is the rebalancer's: a sensor joining (a new plan version)
    leaves the topic movable; the loop's own move locks it for the interval."""
    c = Controller()
    reg(c, "9", 4150)
    reg(c, "10", 4160)
    c.create_topic(topic("t", 4, 20.0), "srtm", now=0)  # r = 88 of mcap 100 on one broker
    c.set_assignment("t", {"9": [f"t{i}" for i in range(4)]}, [], "test")
    el = Elastic(RebalanceSettings(window_s=1.0, min_plan_interval_s=20.0, min_brokers=2))
    el.observe(c, 1.0)
    version = c.topics["t"].version
    c.add_publishers("t", [PublisherLoad("late", 1.0, "g0")])
    assert c.topics["t"].version != version
    el.observe(c, 2.0)
    step = el.step(c, 2.0, lambda b: False)
    assert any(isinstance(a, Migrate) for a in step.actions), el.events
    el.observe(c, 3.0)
    assert el.state(c, 3.0).topics[0].last_change_s == 2.0  # the move: locked until 22


def test_no_broker_is_started_for_min_brokers_within_the_grace() -> None:
    """A controller that starts (or restarts) with fewer brokers than --min-brokers waits
    for the ones that exist to register before starting any."""
    c = Controller()
    reg(c, "9", 4150)
    el = Elastic(RebalanceSettings(window_s=1.0, min_brokers=2), grace_s=5.0)
    el.observe(c, 10.0)
    assert el.step(c, 10.0, lambda b: True).start == []
    el.observe(c, 14.0)
    assert el.step(c, 14.0, lambda b: True).start == []
    el.observe(c, 15.0)
    assert el.step(c, 15.0, lambda b: True).start == ["1001"]


def test_a_shaping_queue_longer_than_the_slo_is_an_slo_violation() -> None:
    """Two windows running with a topic's queue outlasting its SLO make an overload: the
    broker sheds a part although its load ratio is low."""
    c = Controller()
    reg(c, "9", 4150)
    reg(c, "10", 4160)
    c.create_topic(topic("t", 2, 10.0), "srtm", now=0)  # r = 22: LR 0.22, SLO 1 ms
    home = next(iter(c.topics["t"].assignment))
    rate = c.topics["t"].buckets[home].rate
    c.brokers[home].waiting = {"t": int(rate * 0.0005)}  # half the SLO's worth: fine
    assert not slo_violated(c, home)
    c.brokers[home].waiting = {"t": int(rate * 0.01) + 1}  # 10 ms of tokens: violated
    assert slo_violated(c, home)
    el = Elastic(RebalanceSettings(window_s=1.0, min_plan_interval_s=0.0, min_brokers=2))
    for now in (0.5, 1.5):
        el.observe(c, now)
    assert (
        el.state(c, 1.5).brokers[0].slo_streak >= 2 or el.state(c, 1.5).brokers[1].slo_streak >= 2
    )
    step = el.step(c, 1.5, lambda b: False)
    assert any(isinstance(a, Migrate) for a in step.actions), el.events
