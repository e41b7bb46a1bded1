"""A broker keeps its relay routes across a restart (``meta.json``): it forwards and
replicates before the controller sets them again; a forward whose grace ran out while it
was down is not restored; the controller's routes replace the restored ones at
registration; a saved route that does not fit is skipped. Real brokers on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.relay import counters_of
from srtm.broker.reporter import apply_registration
from srtm.broker.routes import (
    MAX_ENTRIES,
    Forward,
    Replicas,
    TopicRoute,
    restored_route,
    saved_route,
)
from srtm.protocol import Pub
from support import tcp_address as tcp

Start = Callable[..., Awaitable[Broker]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """``await start(name)``: a broker on ephemeral ports with data dir ``name`` (the same
    name again: a restart on what the last one left)."""
    running: list[Broker] = []

    async def make(name: str, broker_id: int = 0) -> Broker:
        opts = BrokerOptions(tcp_port=0, http_port=0, broker_id=broker_id, data_dir=tmp_path / name)
        broker = Broker(opts)
        await broker.start()
        running.append(broker)
        return broker

    yield make
    for b in reversed(running):
        await b.stop()


async def publish(broker: Broker, topic: str, n: int) -> None:
    assert broker.tcp_address is not None
    c = await RawClient.connect(*broker.tcp_address)
    await c.identify()
    await c.send(*(Pub(topic, b"m%d" % i) for i in range(n)))
    for _ in range(n):
        assert await c.response() == b"OK"
    await c.close()


def count(broker: Broker, topic: str) -> int:
    t = broker.topics.get(topic)
    return 0 if t is None else t.message_count


def routes_of(a: Broker, b: Broker) -> None:
    """On ``a`` (id "0"): "fwd" forwarded to ``b``, "rep" replicated to it, "both" both."""
    relay, peers = a.relay, {"0": tcp(a), "1": tcp(b)}
    reps = Replicas(peers, "0", {"c1": "1"})
    relay.set_route(TopicRoute("fwd", "0", Forward(tcp(b), {}, 600.0), None, 0.0))
    relay.set_route(TopicRoute("rep", "0", None, reps, 0.0))
    relay.set_route(TopicRoute("both", "0", Forward(tcp(b), {"p": tcp(b)}, 600.0), reps, 0.0))


def meta(broker: Broker) -> Path:
    return broker.options.data_dir / "meta.json"


async def test_routes_survive_a_restart_and_forward_at_once(start: Start) -> None:
    b = await start("b", 1)
    a = await start("a")
    routes_of(a, b)
    await a.stop()
    a = await start("a")  # no controller: nothing but meta.json sets its routes
    fwd, rep, both = (a.relay.get_route(t) for t in ("fwd", "rep", "both"))
    assert fwd is not None and fwd.forward == Forward(tcp(b), {}, 600.0) and fwd.restored
    assert rep is not None and rep.replicas is not None and rep.replicas.homes == {"c1": "1"}
    assert (
        both is not None and both.forward is not None and both.forward.publishers == {"p": tcp(b)}
    )
    assert "c0" not in a.topics["rep"].channels and "c1" not in a.topics["rep"].channels
    await publish(a, "fwd", 10)
    await publish(a, "rep", 4)
    assert counters_of(fwd)["forwarded"] == 10 and counters_of(rep)["relayed"] == 4
    assert (count(a, "fwd"), count(b, "fwd"), count(b, "rep")) == (0, 10, 4)


async def test_a_forward_whose_grace_ended_while_down_is_not_restored(start: Start) -> None:
    b = await start("b", 1)
    a = await start("a")
    routes_of(a, b)
    await a.stop()
    doc = json.loads(meta(a).read_text())
    assert {r["topic"] for r in doc["routes"]} == {"fwd", "rep", "both"}
    doc["saved_at_s"] -= 3600  # down for an hour: longer than the 600 s grace
    meta(a).write_text(json.dumps(doc))
    a = await start("a")
    assert a.relay.get_route("fwd") is None  # forwarding only: nothing left of it
    both = a.relay.get_route("both")
    assert both is not None and both.forward is None and both.replicas is not None
    await publish(a, "fwd", 3)
    assert (count(a, "fwd"), count(b, "fwd")) == (3, 0)  # accepted here


async def test_the_controllers_routes_replace_the_restored_ones_at_registration(
    start: Start,
) -> None:
    b = await start("b", 1)
    a = await start("a")
    routes_of(a, b)
    await a.stop()
    a = await start("a")
    # The controller pushed "rep" again before its registration answer came back.
    again = Replicas({"0": tcp(a), "1": tcp(b)}, "1", {})
    a.relay.set_route(TopicRoute("rep", "0", None, again, 0.0))
    apply_registration(a, time.monotonic(), {"lease_s": None})
    assert set(a.relay.routes) == {"rep"}
    route = a.relay.get_route("rep")
    assert route is not None and route.replicas == again and not route.restored
    await a.stop()
    a = await start("a")
    assert set(a.relay.routes) == {"rep"}  # what was dropped is not saved either


async def test_saved_routes_that_do_not_fit_are_skipped(
    start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    peers = {"1": "127.0.0.1:1"}
    good = {"topic": "ok", "self": "0", "forward": None,
            "replicas": {"peers": peers, "primary": "0", "homes": {}}}  # fmt: skip
    many = {str(i): "127.0.0.1:1" for i in range(MAX_ENTRIES + 1)}
    huge = {**good, "topic": "huge", "replicas": {"peers": many, "primary": "0"}}
    bad = [
        "x",
        {**good, "topic": 7},
        {**good, "topic": "bad name!"},
        {**good, "topic": "stranger", "replicas": {**good["replicas"], "primary": "9"}},
        {**good, "topic": "nan", "forward": {"to": "h:1", "grace_s": math.nan, "grace_left_s": 1}},
        huge,
    ]
    (tmp_path / "a").mkdir()
    doc = {"version": 1, "next_id": 0, "topics": [], "routes": [*bad, good], "saved_at_s": 0}
    (tmp_path / "a" / "meta.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.ERROR, "srtm.broker.relay"):
        a = await start("a")
    assert set(a.relay.routes) == {"ok"}
    assert sum("not restored" in r.getMessage() for r in caplog.records) == len(bad)


def test_a_saved_route_keeps_the_grace_it_had_left() -> None:
    route = TopicRoute("t", "0", Forward("h:1", {"p": "h:2"}, 100.0), None, 1000.0)
    doc = saved_route(route, 1030.0)
    assert doc is not None and doc["forward"]["grace_left_s"] == 70.0
    back = restored_route(json.loads(json.dumps(doc)), 5.0, 20.0)
    assert back is not None and back.forward == route.forward and back.restored
    assert back.forward_target(None, 5.0 + 49.0) == "h:1"  # 70 - 20 s down: 50 s left
    assert back.forward_target(None, 5.0 + 50.0) is None
    assert restored_route(doc, 5.0, 70.0) is None  # its grace ended while down
    assert restored_route(doc, 5.0, math.inf) is None  # when saved is unknown
    assert saved_route(route, 1100.0) is None  # ended before the save


def test_a_restored_route_checks_what_it_reads() -> None:
    doc: dict[str, Any] = {"topic": "t", "self": "0", "forward": None, "replicas": None}
    assert restored_route(doc, 0.0, 0.0) is None
    for broken in ({**doc, "self": ""}, {**doc, "forward": []}, {**doc, "replicas": {}}):
        with pytest.raises(ValueError):
            restored_route(broken, 0.0, 0.0)
