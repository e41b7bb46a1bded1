"""Forwarding and ALL_PUBLISHERS replication live: an in-process controller pushing routes
to three broker processes. A plain NSQ publisher moved by ``POST /topics/NAME/move`` keeps
publishing to its old broker and every message is delivered once; a replicated topic
with three channels delivers every message exactly once on each channel."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nsq_raw import RawClient
from srtm.client import Publisher, Received, Subscriber
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, new_token
from srtm.protocol import Dpub, Pub
from support import controlled_broker, eventually

pytestmark = pytest.mark.slow


@dataclass
class Live:
    service: ControllerService
    brokers: dict[str, BrokerProcess]
    url: str
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        async with self.http.request(method, self.url + path, json=doc) as r:
            return r.status, await r.json()

    async def route(self, broker: str, topic: str) -> dict[str, Any] | None:
        """The broker's route of ``topic`` with its counters (None: none)."""
        path = f"/srtm/route?topic={topic}"
        try:
            doc: dict[str, Any] = await asyncio.to_thread(self.brokers[broker].json, path)
        except OSError:  # 404: no route
            return None
        return doc


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    token = new_token()
    opts = ControllerOptions(
        db=tmp_path / "c.db", http_port=0, tick_s=0.2, token=token, broker_timeout_s=15.0,
        forward_grace_s=30.0,
    )  # fmt: skip
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None
    url = "http://{}:{}".format(*service.http_address)
    brokers: dict[str, BrokerProcess] = {}
    try:
        for i in (1, 2, 3):
            brokers[str(i)] = await asyncio.to_thread(
                controlled_broker, tmp_path, i, url, token, 1000
            )
        await eventually(lambda: len(service.ctrl.up()) == 3, "three brokers registered")
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            yield Live(service, brokers, url, http)
    finally:
        await service.stop()
        for b in brokers.values():
            b.stop()


async def plain(address: str, client_id: str) -> RawClient:
    """A plain NSQ publisher's connection: IDENTIFY with nothing of SRTM's."""
    host, port = address.rsplit(":", 1)
    c = await RawClient.connect(host, int(port))
    await c.identify(client_id=client_id)
    return c


async def pub(c: RawClient, topic: str, body: bytes) -> None:
    await c.send(Pub(topic, body))
    assert await c.response() == b"OK"


def collector(got: list[bytes]) -> Any:
    def record(r: Received) -> None:
        got.append(r.message.body)

    return record


async def test_a_plain_publisher_moved_keeps_publishing_through_its_old_broker(
    live: Live,
) -> None:
    doc = {"name": "f", "slo_p99_ms": 100, "burst": 50,
           "publishers": [{"id": "p0", "rate": 20}, {"id": "p1", "rate": 20}]}  # fmt: skip
    status, body = await live.call("POST", "/topics", doc)
    assert status == 201, body
    (old,) = [b["id"] for b in body["brokers"]]
    new = next(b for b in live.brokers if b != old)
    got: list[bytes] = []
    sub = Subscriber("f", "all", controller=live.url, on_message=collector(got), refresh_s=0.2)
    conn = await plain(live.brokers[old].tcp_address, "p0")
    sent: list[bytes] = []
    try:
        for k in range(50):
            sent.append(b"p0:%d" % k)
            await pub(conn, "f", sent[-1])
        await sub.start()
        status, body = await live.call("POST", "/topics/f/move",
                                       {"publishers": ["p0", "p1"], "to": new})  # fmt: skip
        assert status == 200, body
        route = await eventually(lambda: live.route(old, "f"), "the old broker's route")
        assert route["forward"]["to"] == live.brokers[new].tcp_address
        # The same plain connection, still to the old broker: forwarded to the new one.
        for k in range(50, 250):
            sent.append(b"p0:%d" % k)
            await pub(conn, "f", sent[-1])
        counters = await live.route(old, "f")
        assert counters is not None and counters["counters"]["forwarded"] > 0
        for k in range(250, 260):  # DPUB too (nsqd's deferred publish): forwarded alike
            sent.append(b"p0:%d" % k)
            await conn.send(Dpub("f", 20, sent[-1]))
            assert await conn.response() == b"OK"
        later = await live.route(old, "f")
        assert later is not None

        def relayed(doc: dict[str, Any]) -> int:  # forwarded, or kept if B was too slow
            return int(doc["counters"]["forwarded"] + doc["counters"]["fallback_local"])

        assert relayed(later) == relayed(counters) + 10  # the relay's, not accepted as is
        await eventually(lambda: len(got) >= len(sent), "every message delivered", timeout=30)
        await eventually(lambda: sub.brokers, "subscribed to the new broker",
                         until=lambda b: live.brokers[new].tcp_address in b)  # fmt: skip
    finally:
        await conn.close()
        await sub.close()
    assert sorted(got) == sorted(sent), "published = delivered, once each"
    topic = live.service.ctrl.topics["f"]
    assert topic.routing.left == {old: ["p0", "p1"]}


async def test_a_replicated_topic_delivers_each_message_once_per_channel(live: Live) -> None:
    doc = {"name": "r", "slo_p99_ms": 100, "burst": 50,
           "publishers": [{"id": "p0", "rate": 40}]}  # fmt: skip
    status, body = await live.call("POST", "/topics", doc)
    assert status == 201, body
    status, body = await live.call("POST", "/topics/r/replicas", {"count": 3})
    assert status == 200, body
    replicas = body["replicas"]
    assert len(replicas) == 3
    channels = ("c1", "c2", "c3")
    got: dict[str, list[bytes]] = {c: [] for c in channels}
    by: dict[str, set[str]] = {c: set() for c in channels}  # who delivered each channel

    def on(c: str) -> Any:
        def record(r: Received) -> None:
            got[c].append(r.message.body)
            by[c].add(r.broker)

        return record

    subs = [
        Subscriber("r", c, controller=live.url, on_message=on(c), refresh_s=0.2) for c in channels
    ]
    for s in subs:
        await s.start()
    await eventually(lambda: all(len(s.brokers) == 3 for s in subs), "every replica subscribed")

    async def homed() -> bool:
        routes = [await live.route(b, "r") for b in replicas]
        return all(r is not None and len(r["replicas"]["homes"]) == 3 for r in routes)

    await eventually(homed, "every channel homed on every replica")
    homes = live.service.ctrl.topics["r"].routing.homes
    assert len(set(homes.values())) == 3  # one channel per replica: nobody's egress yet
    publisher = Publisher("r", "p0", controller=live.url)
    await publisher.start()
    side = await plain(live.brokers[replicas[1]].tcp_address, "p0")  # a replica, not primary
    sent: list[bytes] = []
    try:
        for k in range(150):
            sent.append(b"m:%d" % k)
            await publisher.publish(sent[-1])
        await publisher.flush()
        for k in range(150, 200):
            sent.append(b"m:%d" % k)
            await pub(side, "r", sent[-1])

        def delivered() -> int:
            return min(len(got[c]) for c in channels)

        await eventually(delivered, "every channel got everything", timeout=30,
                         until=lambda n: n >= len(sent))  # fmt: skip
        # let any duplicate in flight arrive, then count
        mark = {c: len(got[c]) for c in channels}
        await pub(side, "r", b"last")
        sent.append(b"last")
        await eventually(lambda: all(len(got[c]) > mark[c] for c in channels), "the last one")
    finally:
        await side.close()
        await publisher.close()
        for s in subs:
            await s.close()
    for c in channels:  # each channel from its home only, whoever a message was sent to
        assert by[c] == {live.brokers[homes[c]].tcp_address}, (c, by[c], homes)
        dups = {m: n for m, n in Counter(got[c]).items() if n > 1}
        assert not dups, f"{c}: duplicates {list(dups)[:5]}"
        assert sorted(got[c]) == sorted(sent), f"{c}: published = delivered"
    relayed = [await live.route(b, "r") for b in replicas]
    assert all(r is not None and r["counters"]["relayed"] > 0 for r in relayed[:2])
