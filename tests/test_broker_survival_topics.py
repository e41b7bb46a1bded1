"""Issue 14, findings 3, 6 and 8 (part): what a topic costs, how many there may be, the
bucket parameters a broker accepts, and metadata that survives being lost or cut short."""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import threading
import time
import tracemalloc
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.message import Message
from srtm.broker.restart import restore
from srtm.broker.state import Channel, Topic
from srtm.launch import BrokerProcess, start_broker
from srtm.protocol import Fin, Mpub, Pub, Rdy, Sub
from srtm.ratelimit import MAX_RATE, MIN_RATE, TokenBucket, check_bucket
from support import eventually


async def metadata_written(broker: Broker) -> None:
    """No metadata write pending or in flight (a broker that writes synchronously never
    has one)."""
    await eventually(
        lambda: not broker.persistence.meta_pending, "the metadata written", timeout=20
    )


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"


def http_error(broker: BrokerProcess, path: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """POST ``path``, expecting an HTTP error: its status and JSON body."""
    with pytest.raises(urllib.error.HTTPError) as info:
        broker.post(path, body)
    return info.value.code, json.loads(info.value.read())


# -- finding 3: the cost of an idle topic ------------------------------------------------------
async def test_an_idle_topic_costs_little_memory_and_no_file(broker_dir: Path) -> None:
    """One PUB to each of many new names: bytes per idle topic (tracemalloc) were ~0.8 MB
    (three HDR histograms) and each held 2 files open."""
    broker = Broker(BrokerOptions(data_dir=broker_dir))
    broker.options.data_dir.mkdir(parents=True)
    broker.publish("warmup", [b"x"], time.time_ns(), "p")
    n = 200
    gc.collect()
    fds = open_fds()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(n):
            broker.publish(f"idle{i}", [b"x"], time.time_ns(), "p")
        await metadata_written(broker)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_topic = grown / n
    held_open = open_fds() - fds
    print(f"bytes per idle topic: {per_topic:,.0f}, files held open: {held_open}")
    assert (per_topic < 20_000, held_open) == (True, 0), f"{per_topic:,.0f} B, {held_open} fds"
    assert len(broker.topics) == n + 1
    await broker.stop()


async def test_new_topics_write_metadata_off_the_loop_a_few_times(
    broker_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 new names in one go (one read of PUBs) used to rewrite meta.json 1,000 times
    on the event loop (quadratic: each write lists every topic)."""
    writes: list[threading.Thread] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).name == "meta.json":
            writes.append(threading.current_thread())
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    broker = Broker(BrokerOptions(data_dir=broker_dir))
    broker.options.data_dir.mkdir(parents=True)
    n = 1000
    for i in range(n):
        broker.publish(f"name{i}", [b"x"], time.time_ns(), "p")
    await metadata_written(broker)
    on_loop = [t for t in writes if t is threading.main_thread()]
    assert not on_loop, f"{len(on_loop)} meta.json writes on the event loop"
    assert 1 <= len(writes) <= 3, f"{len(writes)} meta.json writes for {n} new topics"
    saved = json.loads((broker_dir / "meta.json").read_text())
    assert {t["name"] for t in saved["topics"]} == {f"name{i}" for i in range(n)}
    await broker.stop()
    assert [t for t in writes if t is threading.main_thread()], "no final write at stop"


def _fd_limit(n: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return apply


async def test_many_new_topic_names_under_a_small_fd_limit(broker_dir: Path) -> None:
    """Each new name held 2 files open: with 1,024 fds about 510 names ran the broker out."""
    broker = start_broker(broker_dir, preexec_fn=_fd_limit(256))
    try:
        pub = await RawClient.connect(*broker.tcp)
        n = 1000
        await pub.send(*[Pub(f"many{i}", b"m%d" % i) for i in range(n)])
        for _ in range(n):
            assert await pub.response() == b"OK"
        c = await RawClient.connect(*broker.tcp)
        await c.send(Sub(f"many{n - 1}", "c"), Rdy(1))
        assert await c.response() == b"OK"
        assert (await c.message()).body == b"m%d" % (n - 1)
        for client in (pub, c):
            await client.close()
    finally:
        assert broker.stop() == 0
    again = start_broker(broker_dir, preexec_fn=_fd_limit(256))
    try:
        assert len(again.stats()["topics"]) == 1000
    finally:
        assert again.stop() == 0


async def test_the_periodic_scan_visits_only_channels_with_timers(
    broker_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every 10 ms the scan looked at every channel of every topic (10,000 idle topics:
    about half a core); it visits the topics with deferred messages (DPUB) and the
    channels with timers (a delayed REQ, in-flight deadlines) only."""
    broker = Broker(BrokerOptions(data_dir=broker_dir))
    broker_dir.mkdir(parents=True)
    for i in range(500):
        broker.channel(f"idle{i}", "c")
    broker.publish_deferred("busy", b"later", 1, time.time_ns(), "p")
    ch = broker.channel("busy", "c")
    ch.defer(Message(b"%016x" % 1, b"requeued", 0, 0), 1)  # as a delayed REQ does
    visited: list[object] = []
    real_ch, real_topic = Channel.next_due_ns, Topic.next_deferred_ns

    def next_due_ns(self: Channel) -> int | None:
        visited.append(self)
        return real_ch(self)

    def next_deferred_ns(self: Topic) -> int | None:
        visited.append(self)
        return real_topic(self)

    monkeypatch.setattr(Channel, "next_due_ns", next_due_ns)
    monkeypatch.setattr(Topic, "next_deferred_ns", next_deferred_ns)
    broker.scan.scan(time.time_ns() + 10**9)
    assert set(visited) == {ch, broker.topics["busy"]}, f"{len(visited)} visited"
    assert ch.depth == 2  # the deferred message and the requeued one came due
    await broker.stop()


# -- finding 3: limits on topics and channels -------------------------------------------------
async def test_topic_and_channel_limits_refuse_new_ones_and_keep_the_rest(
    broker_dir: Path,
) -> None:
    broker = start_broker(broker_dir, ["--max-topics", "3", "--max-channels-per-topic", "2"])
    try:
        pub = await RawClient.connect(*broker.tcp)
        for i in range(3):
            await pub.send(Pub(f"t{i}", b"kept%d" % i))
            assert await pub.response() == b"OK"
        await pub.send(Pub("t3", b"refused"))
        err = await pub.error()
        assert err.startswith("E_PUB_FAILED") and "--max-topics" in err and "3" in err
        assert await pub.closed()
        # PUB to a topic that exists still works.
        pub = await RawClient.connect(*broker.tcp)
        await pub.send(Mpub("t0", [b"more0", b"more1"]))
        assert await pub.response() == b"OK"

        sub = await RawClient.connect(*broker.tcp)
        await sub.send(Sub("t4", "c"))
        err = await sub.error()
        assert err.startswith("E_SUB_FAILED") and "--max-topics" in err

        status, body = http_error(broker, "/pub?topic=t5", b"refused")
        assert (status, body["message"]) == (403, "TOO_MANY_TOPICS")
        assert "--max-topics" in body["detail"]
        status, body = http_error(broker, "/topic/create?topic=t6")
        assert (status, body["message"]) == (403, "TOO_MANY_TOPICS")

        broker.post("/topic/create?topic=t1")
        broker.post("/channel/create?topic=t1&channel=a")
        broker.post("/topic/create?topic=t1")
        broker.post("/channel/create?topic=t1&channel=b")
        status, body = http_error(broker, "/channel/create?topic=t1&channel=c")
        assert (status, body["message"]) == (403, "TOO_MANY_CHANNELS")
        assert "--max-channels-per-topic" in body["detail"]
        sub = await RawClient.connect(*broker.tcp)
        await sub.send(Sub("t1", "d"))
        err = await sub.error()
        assert err.startswith("E_SUB_FAILED") and "--max-channels-per-topic" in err

        # Nothing that was accepted is lost: t0's first channel gets all three.
        c = await RawClient.connect(*broker.tcp)
        await c.send(Sub("t0", "c"), Rdy(10))
        assert await c.response() == b"OK"
        got = sorted([(await c.message()).body for _ in range(3)])
        assert got == [b"kept0", b"more0", b"more1"]
        assert sorted(t["topic_name"] for t in broker.stats()["topics"]) == ["t0", "t1", "t2"]
        for client in (pub, sub, c):
            await client.close()
    finally:
        assert broker.stop() == 0


# -- finding 6: absurd bucket parameters -------------------------------------------------------
@pytest.mark.parametrize(
    ("rate", "burst", "field"),
    [
        (1e-10, 1.0, "rate"),
        (1e-300, 1.0, "rate"),
        (1e10, 1.0, "rate"),
        (math.nan, 1.0, "rate"),
        (math.inf, 1.0, "rate"),
        (1.0, 1e12, "burst"),
        (1.0, math.nan, "burst"),
        (1e-3, 1e9, "burst"),  # 31,700 years of tokens
    ],
)
def test_a_bucket_refuses_parameters_it_cannot_schedule(
    rate: float, burst: float, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        TokenBucket(rate, burst)
    with pytest.raises(ValueError, match=field):
        check_bucket(rate, burst)
    # Retuning a good bucket to the bad value is refused and changes nothing.
    good = (10.0, burst) if field == "rate" else (rate, 2.0)
    ok = TokenBucket(*good)
    with pytest.raises(ValueError, match=field):
        if field == "rate":
            ok.set_rate(rate)
        else:
            ok.set_burst(burst)
    assert (ok.rate, ok.burst) == good


def test_release_times_at_the_edges_of_the_range_fit_int64() -> None:
    now = time.time_ns()
    slow = TokenBucket(MIN_RATE, 1.0, clock=lambda: now)
    for _ in range(1000):
        res = slow.reserve()
    assert res.release_ns < 2**63 - 1
    fast = TokenBucket(MAX_RATE, 1e9, clock=lambda: now)
    assert fast.reserve().release_ns == now


async def test_absurd_rates_are_refused_and_a_stop_keeps_every_topic(broker_dir: Path) -> None:
    """rate=1e-10 was accepted; the next SIGTERM then crashed while persisting and lost
    another topic's acknowledged messages."""
    broker = start_broker(broker_dir, ["--mem-queue-size", "50"])
    try:
        for query in ("rate=1e-10&burst=1", "rate=1e-300&burst=1", "rate=5&burst=1e300"):
            status, body = http_error(broker, f"/srtm/bucket?topic=shaped&{query}")
            assert (status, body["message"]) == (400, "INVALID_BUCKET"), query
            assert "rate" in body["detail"] or "burst" in body["detail"]
        broker.post("/srtm/bucket?topic=shaped&rate=0.001&burst=1")
        pub = await RawClient.connect(*broker.tcp)
        await pub.send(Mpub("shaped", [b"s%d" % i for i in range(100)]))
        assert await pub.response() == b"OK"
        await pub.send(Mpub("other", [b"%d" % i for i in range(200)]))
        assert await pub.response() == b"OK"
        await pub.close()
    finally:
        assert broker.stop() == 0
    again = start_broker(broker_dir, ["--mem-queue-size", "50"])
    try:
        c = await RawClient.connect(*again.tcp)
        await c.send(Sub("other", "c"), Rdy(250))
        assert await c.response() == b"OK"
        bodies = []
        for _ in range(200):
            m = await c.message()
            bodies.append(m.body)
            await c.send(Fin(m.id))
        assert sorted(bodies) == sorted(b"%d" % i for i in range(200))
        doc = json.loads(again.get("/srtm/bucket?topic=shaped"))
        assert doc["bucket"]["rate"] == 0.001
        await c.close()
    finally:
        assert again.stop() == 0


async def test_one_queue_that_cannot_be_written_costs_no_other_its_messages(
    broker_dir: Path,
) -> None:
    """Persistence is per queue: a time out of int64's range (as an absurd rate made)
    is clamped, and a queue whose write fails is logged and skipped."""
    opts = BrokerOptions(data_dir=broker_dir)
    broker = Broker(opts)
    broker_dir.mkdir(parents=True)
    now = time.time_ns()
    broker.publish("bad", [b"b0", b"b1"], now, "p")
    broker.publish("good", [b"g0", b"g1", b"g2"], now, "p")
    broker.topic("broken")
    broker.publish("broken", [b"lost"], now, "p")
    # A release time past int64, as rate=1e-10 booked them.
    broker.topics["bad"].held.set_head_release(2**80)

    def fail(records: object) -> None:
        raise OSError(28, "No space left on device")

    broker.persistence.disks["broken"].save_head = fail  # type: ignore[method-assign]
    await broker.stop()

    again = Broker(opts)
    restore(again)
    assert [m.body for m in again.topics["good"].held.drain()] == [b"g0", b"g1", b"g2"]
    assert [m.body for m in again.topics["bad"].held.drain()] == [b"b0", b"b1"]
    assert "broken" in again.topics
    await again.stop()


async def test_a_saved_bucket_out_of_range_does_not_stop_a_restart(broker_dir: Path) -> None:
    """A meta.json written before the range existed (rate=1e-10) starts, unshaped."""
    broker_dir.mkdir(parents=True)
    meta = {
        "version": 1,
        "next_id": 7,
        "topics": [
            {"name": "old", "paused": False, "bucket": {"rate": 1e-10, "burst": 1}, "channels": []},
            {"name": "fine", "paused": True, "bucket": {"rate": 5.0, "burst": 2}, "channels": []},
        ],
    }
    (broker_dir / "meta.json").write_text(json.dumps(meta))
    broker = Broker(BrokerOptions(data_dir=broker_dir))
    restore(broker)
    assert broker.topics["old"].bucket is None
    bucket = broker.topics["fine"].bucket
    assert bucket is not None and (bucket.rate, bucket.burst) == (5.0, 2.0)
    assert broker.topics["fine"].paused
    await broker.stop()


# -- finding 8 (part): meta.json empty or corrupt ----------------------------------------------
@pytest.mark.parametrize(
    "content",
    [
        b"",  # renamed into place before its data reached the disk
        b'{"version": 1, "topics": [{"na',
        b"\x00" * 64,
        b"[1, 2]",
        b'{"topics": [{"name": "kept", "channels": 5}, 7, {"name": "../x"}]}',
    ],
)
async def test_a_broker_with_a_bad_meta_json_starts_and_delivers(
    broker_dir: Path, content: bytes
) -> None:
    first = start_broker(broker_dir, ["--mem-queue-size", "5"])
    try:
        first.post("/topic/create?topic=kept")
        first.post("/channel/create?topic=kept&channel=c")
        pub = await RawClient.connect(*first.tcp)
        await pub.send(Mpub("kept", [b"k%02d" % i for i in range(20)]))  # memory and disk
        assert await pub.response() == b"OK"
        await pub.send(Mpub("held", [b"h%d" % i for i in range(3)]))  # no channel yet
        assert await pub.response() == b"OK"
        await pub.close()
    finally:
        assert first.stop() == 0
    (broker_dir / "meta.json").write_bytes(content)

    second = start_broker(broker_dir, ["--mem-queue-size", "5"])
    try:
        c = await RawClient.connect(*second.tcp)
        await c.send(Sub("kept", "c"), Rdy(50))
        assert await c.response() == b"OK"
        got = []
        for _ in range(20):
            m = await c.message()
            got.append(m.body)
            await c.send(Fin(m.id))
        assert sorted(got) == [b"k%02d" % i for i in range(20)]
        h = await RawClient.connect(*second.tcp)
        await h.send(Sub("held", "first"), Rdy(10))
        assert await h.response() == b"OK"
        assert sorted([(await h.message()).body for _ in range(3)]) == [b"h0", b"h1", b"h2"]
        await c.close()
        await h.close()
    finally:
        assert second.stop() == 0
    meta = json.loads((broker_dir / "meta.json").read_text())
    assert {t["name"] for t in meta["topics"]} == {"kept", "held"}
