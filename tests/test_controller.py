"""The controller with real brokers on 127.0.0.1: registration, placement, lookup, the TB
Adaptor following a traffic shift, and a restart that keeps the plans."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.launch import BrokerProcess, ServerProcess, start_cluster, start_controller
from srtm.protocol import Pub
from support import eventually


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServerProcess, list[BrokerProcess]]]:
    c = start_cluster(
        tmp_path,
        2,
        broker_args=["--mcap", "600", "--window-s", "2"],
        # No settling after a plan change here (tests/test_control_state.py covers it):
        # these tests follow a traffic shift, not a move.
        controller_args=["--broker-timeout-s", "5", "--adapt-settle-s", "0"],
    )
    try:
        yield c.controller, c.brokers
    finally:
        c.stop()


def create(ctrl: ServerProcess, doc: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(ctrl.post("/topics", json.dumps(doc).encode()))
    return result


def topic_doc(name: str, n: int = 100) -> dict[str, Any]:
    pubs = [{"id": f"p{i}", "rate": 10, "group": f"g{i // 10}"} for i in range(n)]
    return {"name": name, "slo_p99_ms": 1.0, "burst": 20, "policy": "maxmin", "publishers": pubs}


def buckets(brokers: list[BrokerProcess], topic: str) -> list[dict[str, float] | None]:
    """Each broker's sub-bucket for ``topic`` (None until the controller has sent it)."""
    out = []
    for b in brokers:
        try:
            out.append(b.json(f"/srtm/bucket?topic={topic}")["bucket"])
        except urllib.error.HTTPError as err:
            assert err.code == 404  # no such topic there yet
            out.append(None)
    return out


def test_topics_are_placed_pushed_and_found(
    cluster: tuple[ServerProcess, list[BrokerProcess]],
) -> None:
    ctrl, brokers = cluster
    plan = create(ctrl, topic_doc("placed"))  # 1,000 msg/s over two brokers of 600
    assert plan["version"] == 1 and len(plan["brokers"]) == 2
    got = eventually.blocking(
        lambda: buckets(brokers, "placed"), "sub-buckets on both brokers", until=all
    )
    assert math.fsum(b["rate"] for b in got) == pytest.approx(1_100)
    assert math.fsum(b["burst"] for b in got) == pytest.approx(20)
    lookup = ctrl.json("/lookup?topic=placed")
    assert sorted(p["tcp_port"] for p in lookup["producers"]) == sorted(b.tcp[1] for b in brokers)
    who = ctrl.json("/assign?topic=placed&publisher=p3")
    assert who["tcp_address"] in {b.tcp_address for b in brokers}
    assert ctrl.json("/topics")["topics"] == ["placed"]
    assert "/plan" in ctrl.json("/openapi.json")["paths"]


@pytest.mark.parametrize(
    ("doc", "status", "field"),
    [
        ({"name": "x", "burst": 5, "publishers": [{"id": "p", "rate": 1}]}, 400, "slo_p99_ms"),
        ({**topic_doc("y"), "policy": "random"}, 400, "policy"),
        ({**topic_doc("z"), "burst": "profile"}, 400, "arrivals_ns"),
    ],
)
def test_bad_topics_get_4xx_naming_the_field(
    cluster: tuple[ServerProcess, list[BrokerProcess]], doc: dict[str, Any], status: int, field: str
) -> None:
    ctrl, _ = cluster
    with pytest.raises(urllib.error.HTTPError) as err:
        create(ctrl, doc)
    assert err.value.code == status and field in json.loads(err.value.read())["message"]


async def test_sub_bucket_rates_follow_a_traffic_shift(
    cluster: tuple[ServerProcess, list[BrokerProcess]],
) -> None:
    ctrl, brokers = cluster
    create(ctrl, topic_doc("shift"))
    await asyncio.to_thread(
        eventually.blocking, lambda: buckets(brokers, "shift"), "sub-buckets", until=all
    )
    pub = await RawClient.connect(*brokers[0].tcp)
    ticks = ctrl.json("/info")["ticks"]

    async def shifted() -> list[dict[str, float]]:
        """Send the next 40 messages, all to the first broker; the sub-buckets then."""
        await pub.send(*[Pub("shift", b"x") for _ in range(40)])
        for _ in range(40):
            await pub.response()
        return buckets(brokers, "shift")  # type: ignore[return-value]

    # Polling every 100 ms paces the traffic (about 400 msg/s), it is not a wait.
    now = await eventually(
        shifted,
        "the first broker's rate over 3x the second's",
        until=lambda now: now[0]["rate"] > 3 * now[1]["rate"],
        timeout=30,
        interval=0.1,
    )
    await pub.close()
    # The TB Adaptor runs once a tick: the rates follow within a few of its rounds (2 when
    # measured: a report of the shifted window, then the round that reads it).
    rounds = ctrl.json("/info")["ticks"] - ticks
    assert rounds <= 4, f"followed after {rounds} TB Adaptor rounds"
    # Read between a decrease and its increase the shares sum below r (never above);
    # once the pushes in flight land they sum to r.
    assert math.fsum(b["rate"] for b in now) <= 1_100 * (1 + 1e-9)
    settled = await asyncio.to_thread(
        eventually.blocking,
        lambda: buckets(brokers, "shift"),
        "the shares summing to r",
        until=lambda now: math.fsum(b["rate"] for b in now) == pytest.approx(1_100, rel=1e-9),
        timeout=5,
    )
    assert settled[0]["rate"] > 3 * settled[1]["rate"]


def test_plans_survive_a_controller_restart(
    cluster: tuple[ServerProcess, list[BrokerProcess]], tmp_path: Path
) -> None:
    ctrl, _ = cluster
    create(ctrl, topic_doc("durable"))
    before = ctrl.json("/plan?topic=durable")
    port = ctrl.http[1]
    assert ctrl.stop() == 0
    again = start_controller(
        tmp_path / "controller.db", ["--http-address", f"127.0.0.1:{port}"], token=ctrl.token
    )
    try:
        # The same plan; whether its shares are pushed yet is each process's own.
        without = lambda plan: {k: v for k, v in plan.items() if k != "in_place"}  # noqa: E731
        assert without(again.json("/plan?topic=durable")) == without(before)
    finally:
        again.stop()


def test_burst_profiled_from_a_trace(cluster: tuple[ServerProcess, list[BrokerProcess]]) -> None:
    import numpy as np

    from srtm.analysis import profile_bucket

    ctrl, _ = cluster
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1e6, 5_000)).astype(np.int64)  # ~1,000 msg/s
    doc = {**topic_doc("profiled", n=10), "burst": "profile", "arrivals_ns": arrivals.tolist()}
    created = create(ctrl, doc)
    expected = profile_bucket(arrivals)
    assert created["rate"] == pytest.approx(expected.rate)
    assert created["burst"] == math.ceil(expected.burst)


def test_a_dead_broker_is_marked_down_and_its_publishers_placed_again(tmp_path: Path) -> None:
    c = start_cluster(
        tmp_path, 2, broker_args=["--mcap", "600"], controller_args=["--broker-timeout-s", "1"]
    )
    ctrl, brokers = c.controller, c.brokers
    try:
        plan = create(ctrl, topic_doc("failover", n=80))  # 800 msg/s: both brokers
        assert len(plan["brokers"]) == 2
        brokers[1].proc.kill()
        # On a busy machine the survivor's 1-s timeout may lapse too for a moment (a
        # plan with neither); it registers again and the plan ends on it alone.
        after = eventually.blocking(
            lambda: ctrl.json("/plan?topic=failover"),
            "a new plan on the surviving broker alone",
            until=lambda p: p["version"] > 1 and [b["id"] for b in p["brokers"]] == ["1"],
        )
        assert len(after["brokers"][0]["publishers"]) + len(after["unassigned"]) == 80
        assert [p["tcp_port"] for p in ctrl.json("/lookup?topic=failover")["producers"]] == [
            brokers[0].tcp[1]
        ]
    finally:
        c.stop()
