"""A share handed over from one broker to another (docs/broker.md, "Handoff"), over real
sockets between two in-process brokers: the destination is armed (POST /srtm/bucket/arm),
nothing changes there until the source's decrease sends HANDOFF on its relay link, after
everything it forwarded before. A wrong, spent or lapsed token, or a client that is not a
relay link, changes nothing; the controller's own push replaces an armed share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nsq_raw import RawClient
from srtm.broker import Broker
from srtm.broker.handoff import ARM_TTL_S, Arms
from srtm.broker.http import serve_http
from srtm.broker.options import BrokerOptions
from srtm.protocol import Handoff, Pub, Rdy, Sub, encode_command
from srtm.protocol.frames import FrameType, decode_message
from srtm.protocol.parser import Parser
from support import BrokerNode, eventually

TOKEN = "0123abcd"


class Node(BrokerNode):
    def share(self, topic: str) -> tuple[float, float] | str | None:
        """The topic's live sub-bucket here, "held", or None (neither)."""
        t = self.broker.topics.get(topic)
        if t is None:
            return None
        if t.bucket is not None:
            return t.bucket.rate, t.bucket.burst
        return "held" if t.on_hold else None

    async def raw(self, **identity: Any) -> RawClient:
        host, port = self.tcp.rsplit(":", 1)
        c = await RawClient.connect(host, int(port))
        await c.identify(**identity)
        return c


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    """Two brokers with their HTTP APIs: the source (id 0) and the destination (id 1)."""
    nodes, runners = [], []
    for i in range(2):
        opts = BrokerOptions(tcp_port=0, http_port=0, broker_id=i, data_dir=tmp_path / f"b{i}")
        broker = Broker(opts)
        await broker.start()
        runner, port = await serve_http(broker)
        runners.append(runner)
        nodes.append(Node(broker, aiohttp.ClientSession(f"http://127.0.0.1:{port}")))
    yield nodes[0], nodes[1]
    for node, runner in zip(reversed(nodes), reversed(runners), strict=True):
        await node.http.close()
        await runner.cleanup()
        await node.broker.stop()


async def held_and_armed(dest: Node, topic: str = "t") -> None:
    status, _ = await dest.call("POST", f"/srtm/bucket/hold?topic={topic}")
    assert status == 200
    status, body = await dest.call(
        "POST", f"/srtm/bucket/arm?topic={topic}&rate=200&burst=20&token={TOKEN}"
    )
    assert status == 200, body
    assert body == {"topic": topic, "bucket": {"rate": 200.0, "burst": 20.0},
                    "expires_in_s": ARM_TTL_S}  # fmt: skip
    assert dest.share(topic) == "held"  # armed is not live


async def consume(node: Node, topic: str, n: int) -> list[bytes]:
    c = await node.raw()
    try:
        await c.send(Sub(topic, "c"), Rdy(1000))
        assert await c.response() == b"OK"
        got: list[bytes] = []
        while len(got) < n:
            f = await c.frame(timeout=10)
            if f.kind is FrameType.MESSAGE:
                got.append(decode_message(f.data).body)
        return got
    finally:
        await c.close()


async def test_the_source_hold_forwards_and_hands_over_in_one_step(pair: tuple[Node, Node]) -> None:
    """The hold carries the forwarding route: what the source forwards from then on reaches
    the destination after the HANDOFF, which the destination took after the source's
    decrease, and everything is delivered at the destination's share."""
    src, dest = pair
    await held_and_armed(dest)
    status, _ = await src.call("POST", "/srtm/bucket?topic=t&rate=200&burst=20")
    assert status == 200
    at_handoff: list[tuple[Any, int]] = []
    take = dest.broker.handoffs.take

    def spy(topic: str, token: str) -> bool:
        at_handoff.append((src.share(topic), dest.broker.topics[topic].message_count))
        return take(topic, token)

    dest.broker.handoffs.take = spy  # type: ignore[method-assign,assignment]
    route = {"topic": "t", "self": "s", "forward": {"to": dest.tcp, "publishers": {}}}
    status, body = await src.call(
        "POST", f"/srtm/bucket/hold?topic=t&handoff={dest.tcp}&token={TOKEN}", route
    )
    assert status == 200 and body["held"] and body["handoff"], body
    await eventually(lambda: dest.share("t"), "handed over", until=lambda s: s == (200.0, 20.0))
    # The source had given its share up when the destination took it; nothing had been
    # forwarded yet (the route came in the same step as the hold).
    assert at_handoff == [("held", 0)]
    pub = await src.raw()
    await pub.send(*(Pub("t", b"m%d" % i) for i in range(30)))
    for _ in range(30):
        assert await pub.response() == b"OK"
    await pub.close()
    assert sorted(await consume(dest, "t", 30)) == sorted(b"m%d" % i for i in range(30))
    assert src.broker.topics["t"].message_count == 0  # all forwarded


async def test_the_handoff_comes_after_what_was_forwarded_before(pair: tuple[Node, Node]) -> None:
    """A route set before the decrease: what the source forwarded meanwhile is at the
    destination (held there) before the HANDOFF arrives on the same link."""
    src, dest = pair
    await held_and_armed(dest)
    route = {"topic": "t", "self": "s", "forward": {"to": dest.tcp, "publishers": {}}}
    status, _ = await src.call("POST", "/srtm/route", route)
    assert status == 200
    pub = await src.raw()
    await pub.send(*(Pub("t", b"m%d" % i) for i in range(20)))
    for _ in range(20):
        assert await pub.response() == b"OK"
    await pub.close()
    assert dest.share("t") == "held"
    counts: list[int] = []
    take = dest.broker.handoffs.take

    def spy(topic: str, token: str) -> bool:
        counts.append(dest.broker.topics[topic].message_count)
        return take(topic, token)

    dest.broker.handoffs.take = spy  # type: ignore[method-assign,assignment]
    status, body = await src.call(
        "POST", f"/srtm/bucket?topic=t&rate=1&burst=1&handoff={dest.tcp}&token={TOKEN}"
    )
    assert status == 200 and body["handoff"], body
    await eventually(lambda: dest.share("t"), "handed over", until=lambda s: s == (200.0, 20.0))
    assert counts == [20]
    assert len(await consume(dest, "t", 20)) == 20


async def test_a_wrong_token_a_spent_one_or_a_lapsed_arm_changes_nothing(
    pair: tuple[Node, Node],
) -> None:
    _, dest = pair
    await held_and_armed(dest)
    link = await dest.raw(srtm_relay=True)
    await link.send(Handoff("t", "wrong"))
    assert await link.response() == b"OK"  # ignored, never an error on a relay link
    assert dest.share("t") == "held"
    await link.send(Handoff("t", TOKEN))
    assert await link.response() == b"OK"
    assert dest.share("t") == (200.0, 20.0)
    await dest.call("POST", "/srtm/bucket/hold?topic=t")
    await link.send(Handoff("t", TOKEN))  # spent
    assert await link.response() == b"OK"
    assert dest.share("t") == "held"
    await held_and_armed(dest)
    dest.broker.handoffs.arms.armed["t"].until_s = 0.0  # lapsed
    await link.send(Handoff("t", TOKEN))
    assert await link.response() == b"OK"
    assert dest.share("t") == "held"
    await link.send(Pub("t", b"still up"))  # the link is still open and working
    assert await link.response() == b"OK"
    await link.close()


async def test_a_client_not_a_relay_link_cannot_hand_over(pair: tuple[Node, Node]) -> None:
    _, dest = pair
    await held_and_armed(dest)
    plain = await dest.raw(client_id="someone")
    await plain.send(Handoff("t", TOKEN))
    assert (await plain.error()).startswith("E_INVALID")
    await plain.close()
    assert dest.share("t") == "held"
    link = await dest.raw(srtm_relay=True)  # the armed share is still there for the source
    await link.send(Handoff("t", TOKEN))
    assert await link.response() == b"OK"
    assert dest.share("t") == (200.0, 20.0)
    await link.close()


async def test_the_controllers_push_replaces_an_armed_share(pair: tuple[Node, Node]) -> None:
    _, dest = pair
    await held_and_armed(dest)
    status, _ = await dest.call("POST", "/srtm/bucket?topic=t&rate=50&burst=5")
    assert status == 200 and "t" not in dest.broker.handoffs.arms.armed
    link = await dest.raw(srtm_relay=True)
    await link.send(Handoff("t", TOKEN))
    assert await link.response() == b"OK"
    assert dest.share("t") == (50.0, 5.0)
    await link.close()


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/srtm/bucket/hold?topic=t&handoff=127.0.0.1:1", "INVALID_HANDOFF"),
        ("/srtm/bucket?topic=t&rate=1&burst=1&token=abc", "INVALID_HANDOFF"),
        ("/srtm/bucket/hold?topic=t&handoff=127.0.0.1:1&token=no%20spaces", "INVALID_TOKEN"),
        ("/srtm/bucket/arm?topic=t&rate=1&burst=1", "MISSING_ARG_TOKEN"),
        ("/srtm/bucket/arm?topic=t&rate=-1&burst=1&token=abc", "INVALID_BUCKET"),
    ],
)
async def test_a_malformed_handoff_is_refused_and_changes_nothing(
    pair: tuple[Node, Node], path: str, code: str
) -> None:
    src, _ = pair
    status, body = await src.call("POST", path)
    assert status == 400 and body["message"] == code, body
    assert src.share("t") is None and not src.broker.handoffs.arms.armed


async def test_a_route_of_another_topic_is_refused_before_the_hold(
    pair: tuple[Node, Node],
) -> None:
    src, dest = pair
    route = {"topic": "other", "self": "s", "forward": {"to": dest.tcp, "publishers": {}}}
    status, body = await src.call(
        "POST", f"/srtm/bucket/hold?topic=t&handoff={dest.tcp}&token={TOKEN}", route
    )
    assert status == 400 and body["message"] == "INVALID_BODY", body
    assert src.share("t") is None and src.broker.relay.get_route("other") is None


def test_handoff_on_the_wire() -> None:
    wire = encode_command(Handoff("t", TOKEN))
    assert wire == b"HANDOFF t " + TOKEN.encode() + b"\n"
    assert Parser().feed(b"  V2" + wire) == [Handoff("t", TOKEN)]
    (bad,) = Parser().feed(b"  V2HANDOFF t\n")
    assert isinstance(bad, Exception) and "insufficient" in str(bad)


def test_an_armed_share_is_good_once_per_topic_and_lapses() -> None:
    arms = Arms()
    arms.arm("t", 1.0, 2.0, "a", now_s=0.0)
    arms.arm("t", 3.0, 4.0, "b", now_s=0.0)  # one per topic: the last one
    assert arms.take("t", "a", 0.1) is None
    assert arms.take("t", "b", 0.1) == (3.0, 4.0)
    assert arms.take("t", "b", 0.2) is None  # spent
    arms.arm("t", 1.0, 2.0, "a", now_s=0.0)
    assert arms.take("t", "a", ARM_TTL_S) is None  # lapsed
    arms.arm("u", 1.0, 2.0, "a", now_s=0.0)
    arms.arm("v", 1.0, 2.0, "a", now_s=ARM_TTL_S + 1)  # the lapsed one goes
    assert list(arms.armed) == ["v"]


async def test_a_handoff_to_a_closed_port_is_reported_not_raised(pair: tuple[Node, Node]) -> None:
    src, _ = pair
    lost: list[bool] = []
    assert src.broker.relay.link("127.0.0.1:1").send_handoff("t", TOKEN, lost.append)
    await eventually(lambda: lost, "settled", until=lambda x: x == [False])


async def test_a_carried_route_is_set_even_if_the_bucket_is_refused(
    pair: tuple[Node, Node],
) -> None:
    """The route does not depend on the share (as when pushed on its own): a decrease the
    broker refuses still leaves its publishers forwarded."""
    src, dest = pair
    route = {"topic": "t", "self": "s", "forward": {"to": dest.tcp, "publishers": {}}}
    status, body = await src.call(
        "POST", f"/srtm/bucket?topic=t&rate=-1&burst=1&handoff={dest.tcp}&token={TOKEN}", route
    )
    assert status == 400 and body["message"] == "INVALID_BUCKET", body
    assert src.broker.relay.get_route("t") is not None
    assert not src.broker.relay.links  # no handoff sent
