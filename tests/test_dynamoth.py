"""Dynamoth's evaluation live (docs/results/dynamoth.md): the subscribers' wait before a
broker gains a topic's traffic (the registry's rule, the controller's wait, and a live
move that no longer reaches its destination before the subscriber does), and (slow) the
three analogues' quick runs through the command line."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from srtm.cli.experiment import app
from srtm.control.push import Pusher
from srtm.control.registry import LookupRegistry
from srtm.experiments.dynamoth import move


def test_unread_names_the_channels_other_brokers_carry() -> None:
    reg = LookupRegistry()
    reg.carry("1", {"t": frozenset({"a", "b"}), "u": frozenset({"x"})})
    assert reg.unread("t", "2") == {"a", "b"}
    reg.carry("2", {"t": frozenset({"a"})})
    assert reg.unread("t", "2") == {"b"}
    assert reg.unread("t", "1") == frozenset()
    assert reg.unread("none", "2") == frozenset()


def _pusher(wait_s: float) -> tuple[Pusher, LookupRegistry]:
    reg = LookupRegistry()
    reg.carry("1", {"t": frozenset({"c"})})
    brokers = {b: SimpleNamespace(down=False) for b in ("1", "2")}
    pusher = Pusher(SimpleNamespace(registry=reg, brokers=brokers), None, 0.1)  # type: ignore[arg-type]
    pusher.subscriber_wait_s = wait_s
    return pusher, reg


async def test_a_gaining_broker_gets_traffic_once_its_subscribers_read_it() -> None:
    pusher, reg = _pusher(5.0)
    wait = asyncio.create_task(pusher._readers_found("t", ["2"]))
    await asyncio.sleep(0.1)
    assert not wait.done()  # broker 2 has not registered channel c: nobody reads it there
    reg.carry("2", {"t": frozenset({"c"})})
    await asyncio.wait_for(wait, 1.0)


async def test_the_wait_is_bounded_and_can_be_off() -> None:
    pusher, _ = _pusher(0.2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await pusher._readers_found("t", ["2"])
    assert 0.2 <= loop.time() - start < 1.0
    pusher.subscriber_wait_s = 0.0
    start = loop.time()
    await pusher._readers_found("t", ["2"])
    assert loop.time() - start < 0.05


@pytest.mark.slow
def test_a_move_reaches_its_destination_after_the_subscriber_does(tmp_path: Path) -> None:
    """Each topic moved to a broker its subscriber does not read yet: the first message
    arrives there only once the subscriber is in, and none waits there for one. With
    ``--subscriber-wait-s 0`` (the behaviour before) traffic arrived 24-490 ms after the
    move while the subscriber came 37-641 ms after it, and these assertions failed for 2
    of 3 moves in each of two tries (docs/results/dynamoth.md)."""
    s = move.MoveSettings(moves=3, gap_s=2.0)
    doc = move.run(tmp_path, s, variants=("after",))
    run = doc["runs"]["after"]
    assert run["sent"] == run["delivered"] > 0, run
    assert len(run["moves"]) == s.moves, run
    for m in run["moves"]:
        assert not math.isnan(m["subscriber_joined_ms"]), m
        assert m["first_arrival_ms"] > m["subscriber_joined_ms"], m
        assert m["wait_release_ms"] < 50 and m["wait_subscriber_ms"] < 50, m


def _quick(name: str, tmp_path: Path) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["run", name, "--quick", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["experiment"] == name
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    assert (tmp_path / f"{name}.md").read_text().startswith("| ")
    return doc


@pytest.mark.slow
def test_quick_replication_measures_egress_and_latency(tmp_path: Path) -> None:
    doc = _quick("dynamoth-replication", tmp_path)
    assert [r["replicas"] for r in doc["runs"]] == [1, 3]
    for r in doc["runs"]:
        assert [s["subscribers"] for s in r["steps"]] == [1, 5]
        assert "disturbed" in r
        for s in r["steps"]:
            assert s["egress_msg_s"] > 0 and 0 < s["p50_ms"] <= s["p99_ms"], s
            assert s["per_broker"], s
    # Replicated, the channels are spread over more than one broker.
    assert len(doc["runs"][1]["steps"][-1]["per_broker"]) > 1, doc["runs"][1]


@pytest.mark.slow
def test_quick_clients_measures_response_time(tmp_path: Path) -> None:
    doc = _quick("dynamoth-clients", tmp_path)
    assert [r["brokers"] for r in doc["runs"]] == [1, 3]
    for r in doc["runs"]:
        assert [s["clients"] for s in r["steps"]] == [10, 40]
        for s in r["steps"]:
            assert s["delivered_msg_s"] > 0 and 0 < s["p50_ms"] <= s["p99_ms"], s
            assert s["mean_ms"] > 0, s


@pytest.mark.slow
def test_quick_move_traces_both_runs(tmp_path: Path) -> None:
    doc = _quick("dynamoth-move", tmp_path)
    assert set(doc["runs"]) == {"before", "after"}
    for r in doc["runs"].values():
        assert r["moves"] and r["sent"] == r["delivered"], r
        for m in r["moves"]:
            assert len(m["hop_ms"]) == 4 and m["messages"] > 0, m


def test_a_live_run_starts_with_the_runs_before_it_collected() -> None:
    """The garbage of an earlier run in the same process is collected before the next
    starts, not by a full collection in its middle (which made dynamoth-move's second
    run send late)."""
    import gc
    import weakref

    from srtm.experiments.scenarios.live import _run_async

    class Left:
        me: object = None

    left = Left()
    left.me = left  # a cycle: only the cyclic collector frees it
    gone = weakref.ref(left)
    del left
    seen: list[bool] = []

    async def run() -> None:
        seen.append(gone() is None)

    gc.disable()  # no collection but the one the runner makes
    try:
        _run_async(run())
    finally:
        gc.enable()
    assert seen == [True]
