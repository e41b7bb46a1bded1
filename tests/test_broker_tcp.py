"""The broker over real sockets on 127.0.0.1: nsqd's codes, ordering, liveness, shaping."""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from nsq_raw import RawClient
from srtm.broker import Broker
from srtm.protocol import Dpub as DpubCmd
from srtm.protocol import (
    Fin,
    FrameReader,
    FrameType,
    Identify,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Sub,
    Touch,
    decode_message,
    header,
)
from srtm.ratelimit import check_conformance
from support import MakeBroker, collector_off, eventually


async def connect(broker: Broker) -> RawClient:
    assert broker.tcp_address is not None
    return await RawClient.connect(*broker.tcp_address)


# -- nsqd's error codes ----------------------------------------------------------------
async def test_bad_magic_is_refused_and_closed(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    assert broker.tcp_address is not None
    c = await RawClient.connect(*broker.tcp_address, magic=b"  V1")
    assert (await c.error()).startswith("E_BAD_PROTOCOL")
    assert await c.closed()


async def test_a_fatal_error_reaches_a_client_that_kept_sending(make_broker: MakeBroker) -> None:
    """Commands after a fatal one are never run, but the client still reads the error:
    the broker closes with a FIN after reading what was sent, not with a reset that would
    make the client's kernel drop the unread error frame."""
    broker = await make_broker()
    assert broker.tcp_address is not None
    reader, writer = await asyncio.open_connection(*broker.tcp_address)
    junk = b"PUB t\n\x00\x00\x00\x01x" * 20_000  # 240 KB the broker will not run
    writer.write(b"  V2HELLO\n" + junk)
    await writer.drain()
    # closed (after lingering) before we read
    await eventually(lambda: not broker.clients, "the client closed")
    data = await reader.read()
    writer.close()
    first = FrameReader().feed(data)[0]
    assert first.kind is FrameType.ERROR and first.data.startswith(b"E_INVALID")
    assert broker.topics == {}  # nothing after the fatal command ran


async def test_a_consumer_s_fatal_error_ends_what_it_is_sent(make_broker: MakeBroker) -> None:
    """A consumer with room and messages waiting sends a bad command: it gets the error
    and then nothing (no message, no heartbeat), and the connection lingers as for any
    fatal error: the client, still sending, is not reset. (A message dispatched after the
    error failed to send on the shut socket, and that failure closed it with a reset.)"""
    broker = await make_broker()
    assert broker.tcp_address is not None
    ch = broker.channel("t", "c")
    ch.paused = True  # messages wait until the consumer has erred
    assert broker.publish("t", [b"m1", b"m2"], 1, "") is None
    reader, writer = await asyncio.open_connection(*broker.tcp_address)
    writer.write(b"  V2SUB t c\nRDY 5\n\n")  # the empty line is the bad command
    await eventually(lambda: any(c.output.closing for c in broker.clients), "the error")
    client = next(iter(broker.clients))
    assert ch.consumers == []
    ch.paused = False
    broker.mark_ready(ch)
    await asyncio.sleep(0)  # the dispatch runs at the turn's end (it finds no consumer)
    client.write(b"a late heartbeat")  # dropped: the write side is shut
    for _ in range(3):
        writer.write(b"PUB t\n\x00\x00\x00\x01x")  # discarded, not reset
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.close()
    frames = FrameReader().feed(await reader.read())
    assert [f.kind for f in frames] == [FrameType.RESPONSE, FrameType.ERROR]
    assert frames[1].data.startswith(b"E_INVALID")
    assert len(ch.queue) == 2 and not ch.in_flight  # nothing went to it


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (b"PUB bad*topic\n\x00\x00\x00\x01x", "E_BAD_TOPIC"),
        (b"SUB good bad/channel\n", "E_BAD_CHANNEL"),
        (b"PUB " + b"t" * 65 + b"\n\x00\x00\x00\x01x", "E_BAD_TOPIC"),
        (b"PUB t\n\x00\x10\x00\x01", "E_BAD_MESSAGE"),  # 1 MiB + 1, refused before it arrives
        (b"MPUB t\n\x00\x50\x00\x01", "E_BAD_BODY"),  # 5 MiB + 1
        (b"RDY 2501\n", "E_INVALID"),
        (b"HELLO\n", "E_INVALID"),
    ],
)
async def test_fatal_errors_get_nsqd_codes_and_close(
    make_broker: MakeBroker, command: bytes, code: str
) -> None:
    broker = await make_broker()
    c = await connect(broker)
    await c.send(command)
    assert (await c.error()).startswith(code)
    assert await c.closed()


async def test_rdy_before_sub_is_invalid(make_broker: MakeBroker) -> None:
    c = await connect(await make_broker())
    await c.send(Rdy(1))
    assert (await c.error()).startswith("E_INVALID")
    assert await c.closed()


async def test_fin_req_touch_of_unknown_ids_are_not_fatal(make_broker: MakeBroker) -> None:
    c = await connect(await make_broker())
    await c.send(Sub("t", "c"))
    assert await c.response() == b"OK"
    await c.send(Fin(b"f" * 16), b"REQ " + b"f" * 16 + b" 0\n", Touch(b"\xff" * 16))
    for code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
        assert (await c.error()).startswith(code)
    await c.send(Nop(), Rdy(1))
    assert not await c.closed(0.2)  # still connected


# -- ordering, delivery ----------------------------------------------------------------
async def test_pipelined_commands_are_answered_in_order(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    pub = await connect(broker)
    sub = await connect(broker)
    await pub.send(*[Pub("ordered", b"m%d" % i) for i in range(100)])
    for _ in range(100):
        assert await pub.response() == b"OK"
    await sub.send(Sub("ordered", "c"), Rdy(100))  # pynsq sends these in one write
    assert await sub.response() == b"OK"
    bodies = [(await sub.message()).body for _ in range(100)]
    assert bodies == [b"m%d" % i for i in range(100)]


async def test_two_channels_each_get_every_message(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    a, b, pub = await connect(broker), await connect(broker), await connect(broker)
    for c, ch in ((a, "a"), (b, "b")):
        await c.send(Sub("fan", ch), Rdy(50))
        assert await c.response() == b"OK"
    await pub.send(Mpub("fan", [b"x%d" % i for i in range(30)]))
    assert await pub.response() == b"OK"
    for c in (a, b):
        msgs = [await c.message() for _ in range(30)]
        assert [m.body for m in msgs] == [b"x%d" % i for i in range(30)]
        assert all(m.attempts == 1 for m in msgs)
        await c.send(*[Fin(m.id) for m in msgs])
    await eventually(
        lambda: all(not ch.in_flight for ch in broker.topics["fan"].channels.values()),
        "every channel settled",
    )


async def test_dpub_is_delivered_after_its_delay(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    c = await connect(broker)
    await c.send(Sub("later", "c"), Rdy(5))
    assert await c.response() == b"OK"
    p = await connect(broker)
    sent = time.monotonic()
    await p.send(DpubCmd("later", 300, b"deferred"), Pub("later", b"now"))
    assert await p.response() == b"OK" and await p.response() == b"OK"
    first = await c.message()
    assert first.body == b"now"
    second = await c.message()
    assert second.body == b"deferred"
    assert time.monotonic() - sent >= 0.3


async def test_heartbeats_and_silent_clients_are_disconnected(make_broker: MakeBroker) -> None:
    c = await connect(await make_broker())
    reply = await c.identify(heartbeat_interval=1000)
    assert reply["max_rdy_count"] == 2500 and reply["tls_v1"] is False
    assert reply["snappy"] is False and reply["deflate"] is False
    beat = await c.frame(timeout=3, skip_heartbeats=False)
    assert beat.data == b"_heartbeat_"
    # Silent for two intervals: the broker hangs up.
    assert await c.closed(timeout=4)


async def test_ephemeral_channel_and_topic_go_with_their_last_consumer(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    c = await connect(broker)
    await c.send(Sub("e#ephemeral", "c#ephemeral"))
    assert await c.response() == b"OK"
    assert "e#ephemeral" in broker.topics
    await c.close()
    await eventually(lambda: "e#ephemeral" not in broker.topics, "the ephemeral topic gone")


# -- shaping ---------------------------------------------------------------------------
async def test_shaped_burst_of_200_is_released_in_conformance(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    broker = await make_broker(trace_dir=tmp_path / "traces", run="burst")
    broker.shares.set_bucket("shaped", 1_000, 10)
    c = await connect(broker)
    await c.send(Sub("shaped", "c"), Rdy(250))
    assert await c.response() == b"OK"
    p = await connect(broker)
    await p.send(Mpub("shaped", [b"%03d" % i for i in range(200)]))
    assert await p.response() == b"OK"
    msgs = [await c.message() for _ in range(200)]
    assert sorted(m.body for m in msgs) == [b"%03d" % i for i in range(200)]
    await c.send(*[Fin(m.id) for m in msgs])
    await broker.stop()  # flushes the trace
    files = list((tmp_path / "traces" / "broker" / "run=burst").glob("*.parquet"))
    rows = pq.read_table(files).to_pylist()
    assert len(rows) == 200
    releases = sorted(r["t_release_ns"] for r in rows)
    assert check_conformance(releases, 1_000, 10) is None
    assert all(r["t_dispatch_ns"] >= r["t_release_ns"] >= r["t_arrive_ns"] for r in rows)
    # 190 messages beyond the burst at 1 ms each.
    assert releases[-1] - releases[0] >= 189_000_000


async def test_capacity_emulates_a_server_after_the_bucket(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    """With --capacity 1000, a 50-message burst through a (10,000/s, 50) bucket waits no
    token but leaves the broker 1 ms apart: the D/1 server, in release order."""
    broker = await make_broker(trace_dir=tmp_path / "traces", run="cap", capacity=1_000.0)
    broker.shares.set_bucket("slow", 10_000, 50)
    c = await connect(broker)
    await c.send(Sub("slow", "c"), Rdy(100))
    assert await c.response() == b"OK"
    p = await connect(broker)
    await p.send(Mpub("slow", [b"%02d" % i for i in range(50)]))
    assert await p.response() == b"OK"
    msgs = [await c.message() for _ in range(50)]
    assert [m.body for m in msgs] == [b"%02d" % i for i in range(50)]
    await c.send(*[Fin(m.id) for m in msgs])
    await broker.stop()
    rows = pq.read_table(tmp_path / "traces" / "broker" / "run=cap").to_pylist()
    assert len(rows) == 50
    assert all(r["t_release_ns"] == r["t_arrive_ns"] for r in rows)  # no token wait
    t0 = rows[0]["t_arrive_ns"]
    dispatch = sorted(r["t_dispatch_ns"] - t0 for r in rows)
    # The i-th leaves once i + 1 services are done, never earlier (a late wake-up can
    # make one gap shorter, so the gaps themselves are not checked).
    assert all(d >= (i + 1) * 1_000_000 for i, d in enumerate(dispatch))
    assert dispatch[-1] < 50_000_000 + 20_000_000


async def test_a_connection_can_attribute_messages_to_their_header(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    """An emulator multiplexes publishers on one connection: the broker's trace rows name
    the publisher each measurement header carries (other bodies: none)."""
    broker = await make_broker(trace_dir=tmp_path / "traces", run="mux")
    c = await connect(broker)
    await c.send(Sub("mux", "c"), Rdy(10))
    assert await c.response() == b"OK"
    p = await connect(broker)
    await p.identify(srtm_publisher="emulator-1", srtm_header_publisher=True)
    bodies = [header.encode(header.Header(f"sensor-{i}", "g", i, 0), 100) for i in range(3)]
    await p.send(Mpub("mux", [*bodies, b"opaque"]))
    assert await p.response() == b"OK"
    msgs = [await c.message() for _ in range(4)]
    await c.send(*[Fin(m.id) for m in msgs])
    await broker.stop()
    rows = pq.read_table(tmp_path / "traces" / "broker" / "run=mux").to_pylist()
    assert sorted(r["publisher"] for r in rows) == ["", "sensor-0", "sensor-1", "sensor-2"]


async def test_retuning_a_bucket_keeps_its_state(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    bucket = broker.shares.set_bucket("tuned", 10, 5)
    broker.publish("tuned", [b"x"] * 20, time.time_ns(), "p")
    owed = broker.topics["tuned"].shaping.peek_release_ns()
    assert owed is not None and len(broker.topics["tuned"].shaping) >= 14
    before = bucket.tokens()
    assert broker.shares.set_bucket("tuned", 10, 5) is bucket
    assert bucket.tokens() == pytest.approx(before, abs=0.05)
    with pytest.raises(ValueError, match="burst"):
        broker.shares.set_bucket("tuned", 10, 0.5)
    assert (bucket.rate, bucket.burst) == (10, 5)


@pytest.mark.parametrize("kernel", [True, False])
async def test_arrival_stamps_kernel_or_user(make_broker: MakeBroker, kernel: bool) -> None:
    broker = await make_broker(arrival_stamps="kernel" if kernel else "user")
    p = await connect(broker)
    await p.send(Pub("stamped", b"x"))
    assert await p.response() == b"OK"
    gaps = broker.stats.stamp_gaps.count
    assert (gaps > 0) is kernel


# -- bounded memory --------------------------------------------------------------------
async def test_queues_overflow_to_disk_and_come_back_in_order(make_broker: MakeBroker) -> None:
    broker = await make_broker(mem_queue_size=10)
    broker.channel("deep", "c")
    p = await connect(broker)
    await p.send(*[Pub("deep", b"%03d" % i) for i in range(100)])
    for _ in range(100):
        assert await p.response() == b"OK"
    ch = broker.topics["deep"].channels["c"]
    assert ch.queue.memory_depth == 10 and ch.queue.backend_depth == 90
    c = await connect(broker)
    await c.send(Sub("deep", "c"), Rdy(7))
    assert await c.response() == b"OK"
    got = []
    while len(got) < 100:
        m = await c.message()
        got.append(m.body)
        await c.send(Fin(m.id))
    assert got == [b"%03d" % i for i in range(100)]


async def test_an_internal_error_closes_only_that_client(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = await make_broker()
    bystander = await connect(broker)
    await bystander.send(Sub("other", "c"))
    assert await bystander.response() == b"OK"

    def broken(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(broker, "publish_deferred", broken)
    c = await connect(broker)
    await c.send(DpubCmd("t", 10, b"x"))
    assert (await c.error()).startswith("E_INVALID")
    assert await c.closed()
    await bystander.send(Nop())
    assert not await bystander.closed(0.2)


async def test_deleting_channels_and_topics_with_consumers_closes_them(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    a, b = await connect(broker), await connect(broker)
    await a.send(Sub("gone", "c#ephemeral"))
    await b.send(Sub("gone", "durable"))
    assert await a.response() == b"OK" and await b.response() == b"OK"
    broker.delete_channel("gone", "c#ephemeral")
    assert await a.closed()
    broker.delete_topic("gone")
    assert await b.closed()
    assert "gone" not in broker.topics
    assert not (broker.options.data_dir / "queues" / "q-gone:durable").exists()


async def test_orders_reach_only_clients_that_negotiated_them(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    srtm = await connect(broker)
    await srtm.identify(srtm_publisher="p1", srtm_orders=True)
    plain = await connect(broker)
    await plain.identify(srtm_publisher="p1")  # a plain NSQ client never sees SRTM frames
    order = {"migrate": {"topic": "t", "to": "127.0.0.1:1", "version": 2}}
    assert broker.order("p1", order) == 1
    f = await srtm.frame()
    assert f.kind is FrameType.SRTM and json.loads(f.data) == order
    await plain.send(Nop(), Pub("t", b"x"))
    assert await plain.response() == b"OK"  # the first thing it gets is its PUB's answer


# -- a closed connection is freed by reference counting ---------------------------------
async def test_closed_connections_leave_no_cyclic_garbage(make_broker: MakeBroker) -> None:
    """A publisher, a consumer that settled everything, deflate and snappy streams, and
    a connection the broker closed after a fatal error: once closed, none of their parts
    is left for the collector (each was a cycle, freed only by a full collection; the
    error's traceback held the read's events, a cycle too)."""
    broker = await make_broker()
    with collector_off() as cyclic_parts:
        pub = await connect(broker)
        await pub.send(Pub("t", b"a"), Pub("t", b"b"))
        assert [(await pub.frame()).data for _ in range(2)] == [b"OK", b"OK"]
        sub = await connect(broker)
        await sub.send(Sub("t", "c"), Rdy(2))
        assert (await sub.frame()).data == b"OK"
        ids = [decode_message((await sub.frame()).data).id for _ in range(2)]
        await sub.send(*[Fin(i) for i in ids])
        compressed = []
        for feature in ("deflate", "snappy"):
            c = await connect(broker)
            await c.send(Identify({"feature_negotiation": True, feature: True}))
            assert await c.reader.read(1)  # its reply: the stream is compressed from here on
            compressed.append(c)
        bad = await connect(broker)
        await bad.send(b"BOGUS\n")
        assert (await bad.error()).startswith("E_INVALID")
        await eventually(lambda: broker.channel("t", "c").in_flight == {}, "the FINs")
        gone = [weakref.ref(client) for client in broker.clients]
        assert len(gone) == 5
        for c in (pub, sub, *compressed, bad):
            c.writer.close()
        await eventually(lambda: not broker.clients, "every connection closed")
        await asyncio.sleep(0)  # their parts let go of them a loop turn after the close
        assert [ref() for ref in gone] == [None] * 5  # freed by reference counting
        assert cyclic_parts() == Counter()
