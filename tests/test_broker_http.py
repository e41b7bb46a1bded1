"""nsqd's HTTP API, /metrics and /srtm/bucket, against an in-process broker."""

from __future__ import annotations

import asyncio
import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from srtm.broker.documents import StatsDoc
from srtm.broker.stats import Recorder
from srtm.version import NSQD_VERSION
from support import BrokerApi, call


async def test_ping_info(broker_api: BrokerApi) -> None:
    broker, s = broker_api
    assert await call(s, "GET", "/ping") == (200, "OK")
    status, info = await call(s, "GET", "/info")
    assert status == 200 and info["tcp_port"] == broker.tcp_address[1]  # type: ignore[index]
    assert info["version"] == NSQD_VERSION


async def test_pub_mpub_text_and_binary(broker_api: BrokerApi) -> None:
    broker, s = broker_api
    assert await call(s, "POST", "/topic/create?topic=h") == (200, "")
    assert await call(s, "POST", "/channel/create?topic=h&channel=c") == (200, "")
    assert await call(s, "POST", "/pub?topic=h", b"one") == (200, "OK")
    assert await call(s, "POST", "/mpub?topic=h", b"two\nthree\n") == (200, "OK")
    binary = struct.pack(">I", 2) + b"".join(struct.pack(">I", len(m)) + m for m in (b"4", b"5\n5"))
    assert await call(s, "POST", "/mpub?topic=h&binary=true", binary) == (200, "OK")
    assert await call(s, "POST", "/pub?topic=h&defer=60000", b"later") == (200, "OK")
    ch = broker.topics["h"].channels["c"]
    assert [m.body for m in ch.queue.memory()] == [b"one", b"two", b"three", b"4", b"5\n5"]
    assert broker.topics["h"].deferred_count == 1  # in the topic until due, then shaped
    status, doc = await call(s, "GET", "/stats?format=json&topic=h")
    assert status == 200
    (channel,) = doc["topics"][0]["channels"]
    assert channel["deferred_count"] == 1 and channel["depth"] == 5  # as nsqd's channel


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/pub?topic=bad*name", b"x", 400, "INVALID_TOPIC"),
        ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("POST", "/pub?topic=t", b"x" * ((1 << 20) + 1), 413, "MSG_TOO_BIG"),
        ("POST", "/pub?topic=t&defer=soon", b"x", 400, "INVALID_DEFER"),
        (
            "POST",
            "/mpub?topic=t&binary=true",
            b"\x00\x00\x00\x02\x00\x00\x00\x01x",
            400,
            "INVALID_BODY",
        ),
        ("POST", "/topic/delete?topic=nope", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/pause?topic=nope&channel=c", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=t", b"", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/srtm/bucket?topic=t&rate=0&burst=5", b"", 400, "INVALID_BUCKET"),
        ("POST", "/srtm/bucket?topic=t&rate=fast&burst=5", b"", 400, "INVALID_RATE"),
        ("POST", "/srtm/bucket?topic=t&rate=5", b"", 400, "MISSING_ARG_BURST"),
    ],
)
async def test_bad_requests_name_what_was_wrong(
    broker_api: BrokerApi,
    method: str,
    path: str,
    body: bytes,
    status: int,
    code: str,
) -> None:
    broker, s = broker_api
    got_status, doc = await call(s, method, path, body)
    assert (got_status, doc["message"]) == (status, code)
    assert "t" not in broker.topics or broker.topics["t"].message_count == 0


async def test_topic_and_channel_actions(broker_api: BrokerApi) -> None:
    broker, s = broker_api
    # nsqd: an empty body; a channel of a missing topic is 404.
    status, doc = await call(s, "POST", "/channel/create?topic=a&channel=c")
    assert (status, doc["message"]) == (404, "TOPIC_NOT_FOUND") and "a" not in broker.topics
    for path in ("/topic/create?topic=a", "/channel/create?topic=a&channel=c"):
        assert await call(s, "POST", path) == (200, "")
    await call(s, "POST", "/pub?topic=a", b"x")
    assert await call(s, "POST", "/channel/pause?topic=a&channel=c") == (200, "")
    assert broker.topics["a"].channels["c"].paused
    assert await call(s, "POST", "/channel/unpause?topic=a&channel=c") == (200, "")
    assert await call(s, "POST", "/channel/empty?topic=a&channel=c") == (200, "")
    assert broker.topics["a"].channels["c"].depth == 0
    assert await call(s, "POST", "/topic/pause?topic=a") == (200, "")
    await call(s, "POST", "/pub?topic=a", b"y")
    assert broker.topics["a"].depth == 1 and broker.topics["a"].channels["c"].depth == 0
    assert await call(s, "POST", "/topic/unpause?topic=a") == (200, "")
    assert broker.topics["a"].channels["c"].depth == 1
    assert await call(s, "POST", "/channel/delete?topic=a&channel=c") == (200, "")
    assert await call(s, "POST", "/topic/delete?topic=a") == (200, "")
    assert "a" not in broker.topics


async def test_stats_has_nsqd_shape_and_srtm_section(
    broker_api: BrokerApi,
) -> None:
    _broker, s = broker_api
    await call(s, "POST", "/srtm/bucket?topic=st&rate=1000&burst=4")
    await call(s, "POST", "/channel/create?topic=st&channel=c")
    await call(s, "POST", "/mpub?topic=st", b"a\nb\nc\nd\ne\nf\n")
    status, doc = await call(s, "GET", "/stats?format=json")
    assert status == 200 and doc["health"] == "OK"
    (topic,) = doc["topics"]
    assert topic["topic_name"] == "st" and topic["message_count"] == 6
    (channel,) = topic["channels"]
    for key in ("depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count"):
        assert key in channel
    (srtm,) = doc["srtm"]["topics"]
    assert srtm["bucket"]["rate"] == 1000 and srtm["bucket"]["burst"] == 4
    assert srtm["window"]["seconds"] == 10
    assert srtm["window"]["max_backlog"] == pytest.approx(6)  # 6 arrivals at once, 1 token each
    for key in ("token_wait_ns", "latency_ns", "release_lateness_ns", "release_lateness_held_ns"):
        assert set(srtm[key]) == {"count", "mean", "p50", "p95", "p99", "p999"}
    assert "gap_ns" in doc["srtm"]["arrival_stamps"]
    status, text = await call(s, "GET", "/stats")
    assert status == 200 and "[st" in text


async def test_stats_lets_the_loop_run_between_topics(
    broker_api: BrokerApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its slice of the loop, /stats lets a due shaped release go (``clear``) and the
    loop run before the next topic; the document is the same as built in one go."""
    import srtm.broker.report as report
    from srtm.broker.report import stats_document

    broker, s = broker_api
    for name in ("sa", "sb", "sc"):
        await call(s, "POST", f"/topic/create?topic={name}")
        broker.stats.topic(name).latency.add(1_000)
    cleared = 0
    clear = broker.releaser.clear

    async def counted() -> None:
        nonlocal cleared
        cleared += 1
        await clear()

    monkeypatch.setattr(broker.releaser, "clear", counted)
    monkeypatch.setattr(report, "STATS_SLICE_NS", 10**15)  # a slice no machine outlasts
    status, whole = await call(s, "GET", "/stats?format=json")
    assert status == 200 and cleared == 0
    monkeypatch.setattr(report, "STATS_SLICE_NS", 0)
    status, sliced = await call(s, "GET", "/stats?format=json")
    assert status == 200 and cleared == 3
    assert [t["topic_name"] for t in sliced["topics"]] == ["sa", "sb", "sc"]
    at_once = stats_document(broker)
    for doc in (whole, sliced, at_once):
        for t in doc["topics"]:
            t.pop("channels")
        doc.pop("producers")
    assert sliced["topics"] == whole["topics"] == json.loads(json.dumps(at_once["topics"]))


def test_a_topic_deleted_while_stats_are_built_is_left_out(tmp_path: Path) -> None:
    """``stats_parts`` pauses after each topic; one deleted meanwhile is not reported, and
    gets no statistics made anew for it."""
    from srtm.broker import Broker, BrokerOptions
    from srtm.broker.report import stats_parts

    async def run() -> None:
        broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data"))
        await broker.start()
        try:
            for name in ("da", "db", "dc"):
                broker.topic(name)
            parts = stats_parts(broker)
            next(parts)  # "da" done
            broker.delete_topic("db")
            with pytest.raises(StopIteration) as built:
                while True:
                    next(parts)
            doc = built.value.value
            assert [t["topic_name"] for t in doc["topics"]] == ["da", "dc"]
            assert [t["topic"] for t in doc["srtm"]["topics"]] == ["da", "dc"]
            assert "db" not in broker.stats.topics
        finally:
            await broker.stop()

    asyncio.run(run())


async def test_stats_pools_release_lateness_of_the_topics_listed(
    broker_api: BrokerApi,
) -> None:
    """The section's release lateness is that of every release of the topics listed,
    counted once: not the highest of their own quantiles."""
    broker, s = broker_api
    rng = random.Random(32)
    values = {
        "la": [rng.randrange(1_000, 100_000) for _ in range(60)],
        "lb": [rng.randrange(50_000, 5_000_000) for _ in range(40)],
        "lc": [],
    }
    for name, late in values.items():
        await call(s, "POST", f"/topic/create?topic={name}")
        for v in late:
            broker.stats.topic(name).lateness.add(v)
        for v in late[::2]:  # as if every other one had waited for a token
            broker.stats.topic(name).lateness_held.add(v)
    together, held = Recorder(), Recorder()
    for v in values["la"] + values["lb"]:
        together.add(v)
    for v in values["la"][::2] + values["lb"][::2]:
        held.add(v)
    status, doc = await call(s, "GET", "/stats?format=json")
    assert status == 200
    pooled = doc["srtm"]["release_lateness_ns"]
    assert pooled == {k: int(v) for k, v in together.summary().items()}
    assert pooled["count"] == 100
    assert doc["srtm"]["release_lateness_held_ns"] == {k: int(v) for k, v in held.summary().items()}
    highest = max(t["release_lateness_ns"]["p99"] for t in doc["srtm"]["topics"])
    assert pooled["p99"] < highest
    _, doc = await call(s, "GET", "/stats?format=json&topic=la")
    (alone,) = doc["srtm"]["topics"]
    assert doc["srtm"]["release_lateness_ns"] == alone["release_lateness_ns"]
    assert alone["release_lateness_ns"]["count"] == 60
    StatsDoc.model_validate(doc)


async def test_metrics_are_prometheus_text(broker_api: BrokerApi) -> None:
    _broker, s = broker_api
    await call(s, "POST", "/srtm/bucket?topic=m&rate=50&burst=2")
    await call(s, "POST", "/mpub?topic=m", b"a\nb\nc\n")
    status, text = await call(s, "GET", "/metrics")
    assert status == 200
    assert 'srtm_topic_messages_total{topic="m"} 3.0' in text
    assert 'srtm_bucket_rate{topic="m"} 50.0' in text
    # No subscriber yet: what waits for one is backlog, and nothing is a delivery.
    (age,) = (ln for ln in text.splitlines() if ln.startswith("srtm_topic_backlog_age_seconds{"))
    assert float(age.split()[-1]) > 0
    assert 'srtm_topic_delivery_seconds{quantile="0.99",topic="m"}' not in text


async def test_bucket_get_set_delete(broker_api: BrokerApi) -> None:
    broker, s = broker_api
    status, doc = await call(s, "POST", "/srtm/bucket?topic=b&rate=100&burst=3")
    assert status == 200 and doc["bucket"] == {"rate": 100.0, "burst": 3.0}
    status, doc = await call(s, "GET", "/srtm/bucket?topic=b")
    assert doc["bucket"]["rate"] == 100.0
    await call(s, "POST", "/channel/create?topic=b&channel=c")
    await call(s, "POST", "/mpub?topic=b", b"\n".join(b"%d" % i for i in range(50)))
    assert len(broker.topics["b"].shaping) > 0  # most wait for tokens
    status, doc = await call(s, "DELETE", "/srtm/bucket?topic=b")
    assert status == 200 and doc["bucket"] is None
    assert len(broker.topics["b"].shaping) == 0  # released at once, none lost
    assert broker.topics["b"].channels["c"].depth == 50


async def test_measurement_rounds_estimate_e2e_for_named_publishers(
    broker_api: BrokerApi,
) -> None:
    from nsq_raw import RawClient
    from srtm.protocol import Fin, Pub, Rdy, Sub

    broker, s = broker_api
    assert broker.tcp_address is not None
    sub = await RawClient.connect(*broker.tcp_address)
    await sub.send(Sub("m", "c"), Rdy(100))
    assert await sub.response() == b"OK"
    pub = await RawClient.connect(*broker.tcp_address)
    await pub.identify(srtm_publisher="p1")

    async def traffic() -> int:
        n = 0
        for _ in range(20):
            await pub.send(*[Pub("m", b"x")] * 5)
            for _ in range(5):
                assert await pub.response() == b"OK"
                m = await sub.message()
                await sub.send(Fin(m.id))
                n += 1
            await asyncio.sleep(0.01)  # paces the traffic over the 400 ms window
        return n

    async def measure(who: str) -> dict[str, Any]:
        body = json.dumps({"publishers": [who]}).encode()
        return (await call(s, "POST", "/srtm/measure?topic=m&window_ms=400", body))[1]

    mine, other, sent = await asyncio.gather(measure("p1"), measure("p2"), traffic())
    assert 0 < mine["samples"] <= sent
    assert mine["p99_ms"] > 0 and mine["p50_ms"] <= mine["p99_ms"]
    assert other["samples"] == 0 and other["p99_ms"] is None
    status, doc = await call(s, "POST", "/srtm/measure?topic=m", b"")
    assert (status, doc["message"]) == (400, "MISSING_ARG_WINDOW_MS")
    assert mine["settled"] and mine["settle_ms"] < 100  # unshaped: nothing to wait for


async def test_a_round_opens_once_the_topics_backlog_has_drained(
    broker_api: BrokerApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a move leaves on the broker that lost publishers is a backlog waiting for
    tokens; a round measured on it measured the move. 50 messages with a burst of 3 at
    100 tokens/s take about 0.47 s to drain: the round waits for them first."""
    from srtm.broker import measurement

    broker, s = broker_api
    await call(s, "POST", "/srtm/bucket?topic=w&rate=100&burst=3")
    await call(s, "POST", "/channel/create?topic=w&channel=c")
    await call(s, "POST", "/mpub?topic=w", b"\n".join(b"%d" % i for i in range(50)))
    assert len(broker.topics["w"].shaping) > 40
    status, doc = await call(s, "POST", "/srtm/measure?topic=w&window_ms=50", b"")
    assert status == 200 and doc["settled"]
    assert 300 < doc["settle_ms"] < 3_000
    assert len(broker.topics["w"].shaping) == 0
    # A backlog that cannot drain in time: the round starts anyway, and says so.
    monkeypatch.setattr(measurement, "MAX_SETTLE_NS", 100_000_000)
    await call(s, "POST", "/srtm/bucket?topic=v&rate=1&burst=1")
    await call(s, "POST", "/channel/create?topic=v&channel=c")
    await call(s, "POST", "/mpub?topic=v", b"\n".join(b"%d" % i for i in range(20)))
    status, doc = await call(s, "POST", "/srtm/measure?topic=v&window_ms=50", b"")
    assert status == 200 and not doc["settled"] and 100 <= doc["settle_ms"] < 1_000
