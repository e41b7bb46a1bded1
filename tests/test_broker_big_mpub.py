"""A big MPUB is taken in slices: the broker's loop keeps turning (issue 29, finding 6).

One 5 MiB MPUB of one-byte messages is a million messages; taken in one loop turn it
stalled the broker for seconds (shaped: 10 s), long enough for the controller to mark it
down. The live tests time /ping on a real broker while it takes one (the bound is loose
for a loaded machine: the issue's 50 ms is measured by the closing note, not here); the
in-process ones check what slicing must keep: order on the connection, the OK after all
of it, and all of it or nothing across a stop.
"""

from __future__ import annotations

import asyncio
import gc
import json
import struct
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.queue import PUBLISH_SLICE
from srtm.broker.takes import _GEN2_THRESHOLD, _TAKE_GEN2_THRESHOLD, Takes
from srtm.launch import BrokerProcess
from srtm.protocol import Auth, Fin, Mpub, Pub, Rdy, Sub
from support import BrokerApi, MakeBroker, call, eventually

#: As many one-byte messages as fit in nsqd's default 5 MiB MPUB body.
MILLION = (5 * 1024 * 1024 - 4) // 5
#: /ping's slowest answer allowed while the MPUB is taken. Loose: on a loaded 2-core
#: machine the scheduler alone costs tens of ms; the stall it guards against took 1-10 s.
PING_BOUND_S = 0.25


def mpub_frame(topic: str, n: int) -> bytes:
    """MPUB of ``n`` one-byte messages, framed by hand (a million ``bytes`` to encode
    would take the test longer than the broker)."""
    body = struct.pack(">l", n) + b"\x00\x00\x00\x01x" * n
    return f"MPUB {topic}\n".encode() + struct.pack(">l", len(body)) + body


def binary_mpub_body(n: int) -> bytes:
    return struct.pack(">l", n) + b"\x00\x00\x00\x01x" * n


async def pings_while(http: str, busy: asyncio.Future[object]) -> list[tuple[float, float]]:
    """GET /ping one after another until ``busy`` is done: each one's (start, latency)."""
    out: list[tuple[float, float]] = []
    async with aiohttp.ClientSession(f"http://{http}") as session:
        while not busy.done():
            start = time.monotonic()
            async with session.get("/ping") as resp:
                assert resp.status == 200
                await resp.read()
            out.append((start, time.monotonic() - start))
    return out


def check_pings(pings: list[tuple[float, float]], sent: float, acked: float) -> None:
    """/ping answered throughout, and several times while the MPUB was taken (after it
    was sent, before its OK): the loop turned in between, it did not take it in one go."""
    assert pings, "no /ping was answered"
    worst = max(latency for _, latency in pings)
    assert worst < PING_BOUND_S, f"/ping took {worst * 1000:.0f} ms during the MPUB"
    during = [p for p in pings if p[0] >= sent and p[0] + p[1] <= acked]
    assert len(during) >= 3, f"{len(during)} pings answered while the MPUB was taken"


async def publish_tcp(proc: BrokerProcess, topic: str, n: int) -> tuple[bytes, float, float]:
    """Send one MPUB of ``n`` one-byte messages: its answer, when it was sent and when
    the answer came (monotonic s)."""
    host, port = proc.tcp
    client = await RawClient.connect(host, port)
    try:
        await client.send(mpub_frame(topic, n))
        sent = time.monotonic()
        answer = await client.frame(timeout=60)  # shaped: seconds to book every one
        return answer.data, sent, time.monotonic()
    finally:
        await client.close()


def depth(proc: BrokerProcess, topic: str) -> int:
    """Messages the topic took: its channel's count, or what waits behind its bucket."""
    (t,) = proc.stats(topic)["topics"]
    return int(t["message_count"])


@pytest.mark.parametrize("shaped", [False, pytest.param(True, marks=pytest.mark.slow)])
async def test_tcp_mpub_of_a_million_keeps_ping_answered(
    broker_proc: BrokerProcess, shaped: bool
) -> None:
    topic = "big"
    if shaped:  # a sub-bucket: each message is booked on the meter as it is taken
        broker_proc.post(f"/srtm/bucket?topic={topic}&rate=100&burst=10")
    else:
        broker_proc.post(f"/topic/create?topic={topic}")
        broker_proc.post(f"/channel/create?topic={topic}&channel=c")
    mpub = asyncio.ensure_future(publish_tcp(broker_proc, topic, MILLION))
    pings = await pings_while(broker_proc.http_address, mpub)
    answer, sent, acked = await mpub
    assert answer == b"OK"
    assert depth(broker_proc, topic) == MILLION
    check_pings(pings, sent, acked)


async def test_http_mpub_of_a_million_keeps_ping_answered(broker_proc: BrokerProcess) -> None:
    topic = "big_http"
    broker_proc.post(f"/topic/create?topic={topic}")
    broker_proc.post(f"/channel/create?topic={topic}&channel=c")
    times: dict[str, float] = {}

    async def mpub() -> int:
        async with aiohttp.ClientSession(f"http://{broker_proc.http_address}") as session:
            times["sent"] = time.monotonic()
            url = f"/mpub?topic={topic}&binary=true"
            async with session.post(url, data=binary_mpub_body(MILLION)) as resp:
                times["acked"] = time.monotonic()
                return resp.status

    task = asyncio.ensure_future(mpub())
    pings = await pings_while(broker_proc.http_address, task)
    assert await task == 200
    assert depth(broker_proc, topic) == MILLION
    # "sent" is when the request began: its upload is part of the window, and the
    # upload alone never stalled the broker, so the bound still tells.
    check_pings(pings, times["sent"], times["acked"])


async def test_mpub_is_taken_in_slices_and_what_follows_waits(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More than a slice: taken over several turns; a PUB sent right behind it on the
    same connection is run after all of it (nsqd runs a connection's commands in order),
    and its OK comes after the MPUB's."""
    broker = await make_broker()
    slices: list[int] = []
    take_slice = Takes._slice

    thresholds: list[int] = []

    def counted(self: Takes, take: object, n: int) -> None:
        slices.append(n)
        thresholds.append(gc.get_threshold()[2])
        take_slice(self, take, n)  # type: ignore[arg-type]

    monkeypatch.setattr(Takes, "_slice", counted)
    host, port = broker.tcp_address  # type: ignore[misc]
    n = 3 * PUBLISH_SLICE + 5
    bodies = [b"%d" % i for i in range(n)]
    sub = await RawClient.connect(host, port)
    pub = await RawClient.connect(host, port)
    try:
        await sub.send(Sub("t", "c"))
        assert await sub.response() == b"OK"
        await pub.send(Mpub("t", bodies), Pub("t", b"after"))  # one write: one read
        assert await pub.response() == b"OK"
        assert await pub.response() == b"OK"
        assert len(slices) > 1
        # Full collections wait while it is taken, and come back as they were after.
        assert set(thresholds) == {_TAKE_GEN2_THRESHOLD}
        assert gc.get_threshold()[2] == _GEN2_THRESHOLD != _TAKE_GEN2_THRESHOLD
        await sub.send(Rdy(1000))
        got: list[bytes] = []
        while len(got) < n + 1:
            batch = [await sub.message() for _ in range(min(1000, n + 1 - len(got)))]
            got += [m.body for m in batch]
            await sub.send(*[Fin(m.id) for m in batch])
        assert got == [*bodies, b"after"]
    finally:
        await pub.close()
        await sub.close()


async def test_stop_while_taking_saves_the_whole_mpub(tmp_path: Path) -> None:
    """Stopped between two slices: the rest is taken before the save, so the restart has
    every message of it (never part: its OK was not sent, a retry brings it again)."""
    opts = BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data")
    broker = Broker(opts)
    await broker.start()
    n = 20 * PUBLISH_SLICE
    host, port = broker.tcp_address  # type: ignore[misc]
    pub = await RawClient.connect(host, port)
    try:
        await pub.send(mpub_frame("t", n))

        def taken() -> int:
            topic = broker.topics.get("t")
            return 0 if topic is None else topic.message_count

        await eventually(taken, "part of the MPUB taken", until=lambda k: k > 0, interval=0)
        assert taken() < n  # stopped mid-way, not after
        await broker.stop()
    finally:
        await pub.close()
    again = Broker(opts)
    await again.start()
    try:
        assert again.topics["t"].depth == n
    finally:
        await again.stop()


async def test_http_binary_mpub_of_mixed_sizes_is_all_or_nothing(
    broker_api: BrokerApi,
) -> None:
    """Bodies of different sizes are cut by a loop that lets the broker's loop turn
    between pieces: a body found bad at its end is still refused whole."""
    broker, s = broker_api
    n = 3 * 16384 + 7
    msgs = [b"x" * (1 + i % 3) for i in range(n)]
    body = struct.pack(">I", n) + b"".join(struct.pack(">I", len(m)) + m for m in msgs)
    status, doc = await call(s, "POST", "/mpub?topic=v&binary=true", body + b"!")
    assert (status, doc) == (
        400,
        {"message": "INVALID_BODY", "detail": "bytes left after the last message"},
    )
    assert "v" not in broker.topics
    assert await call(s, "POST", "/mpub?topic=v&binary=true", body) == (200, "OK")
    topic = broker.topics["v"]
    assert topic.message_count == n and topic.held.head_arrival_ns() is not None


async def test_behind_auth_what_follows_a_big_mpub_still_waits_for_it(
    make_broker: MakeBroker,
) -> None:
    """Commands held while the auth server answers are run one by one when it does: the
    ones after a big MPUB wait for it there too (the gate's replay path)."""
    answer = asyncio.Event()
    grant = {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}

    asked: list[str] = []

    async def auth(request: web.Request) -> web.Response:
        asked.append(request.query["secret"])
        await answer.wait()
        return web.json_response({"ttl": 3600, "identity": "a", "authorizations": [grant]})

    app = web.Application()
    app.router.add_get("/auth", auth)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        broker = await make_broker(auth_http_address=(f"{host}:{port}",))
        # Under one read (32 KiB) with AUTH: the gate holds all of it, not the socket.
        n = PUBLISH_SLICE + 3
        bodies = [struct.pack(">H", i) for i in range(n)]
        c = await RawClient.connect(*broker.tcp_address)  # type: ignore[misc]
        await c.identify()
        await c.send(Auth(b"secret"), Mpub("t", bodies), Pub("t", b"after"))
        await eventually(lambda: asked, "the auth server asked")  # the rest waits
        answer.set()
        assert json.loads(await c.response())["permission_count"] == 1
        assert [await c.response() for _ in range(2)] == [b"OK", b"OK"]
        held = [m.body for m in broker.topics["t"].held.memory()]
        assert held == [*bodies, b"after"]
        await c.close()
    finally:
        answer.set()
        await runner.cleanup()
