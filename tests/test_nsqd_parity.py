"""The same raw checks against the real nsqd 1.3.0 and ``srtm broker``: IDENTIFY's rules,
deflate, snappy and sampling, MPUB's errors, in-flight messages of a consumer that leaves, and the
HTTP API's answers (issue 17's differences).

nsqd comes from ``../shared/anchors/nsq-1.3.0/`` beside the checkout (or beside the main
checkout of a worktree), or from ``$SRTM_NSQ_BIN`` (``support.nsq_bin``); without it they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nsq_raw import RawClient
from srtm.broker.broker import Broker
from srtm.broker.http import serve_http
from srtm.broker.options import BrokerOptions
from srtm.protocol import FrameReader, FrameType, Identify, Pub, Rdy, Sub, decode_message
from srtm.protocol.frames import Frame
from support import eventually, nsq_bin

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


@dataclass
class Target:
    name: str
    tcp: int
    http: aiohttp.ClientSession


@contextlib.contextmanager
def _nsqd(data: Path) -> Iterator[tuple[int, int]]:
    where = nsq_bin()
    data.mkdir()
    log = data / "nsqd.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(where / "nsqd"), f"--tcp-address={HOST}:0", f"--http-address={HOST}:0",
             f"--data-path={data}"],
            stderr=out,
        )  # fmt: skip
    try:

        def listening() -> dict[str, int]:
            found = re.findall(r"(TCP|HTTP): listening on [\d.]+:(\d+)", log.read_text())
            return {kind: int(port) for kind, port in found}

        ports = eventually.blocking(listening, "nsqd listening", until=lambda p: len(p) == 2)
        yield ports["TCP"], ports["HTTP"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(params=["nsqd", "srtm"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    if request.param == "nsqd":
        with _nsqd(tmp_path / "nsqd") as (tcp, http):
            async with aiohttp.ClientSession(f"http://{HOST}:{http}") as session:
                yield Target("nsqd", tcp, session)
        return
    broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data"))
    await broker.start()
    runner, port = await serve_http(broker)
    assert broker.tcp_address is not None
    try:
        async with aiohttp.ClientSession(f"http://{HOST}:{port}") as session:
            yield Target("srtm", broker.tcp_address[1], session)
    finally:
        await runner.cleanup()
        await broker.stop()


async def connect(t: Target) -> RawClient:
    return await RawClient.connect(HOST, t.tcp)


async def first_frame(t: Target, config: dict[str, Any]) -> Frame:
    c = await connect(t)
    try:
        await c.send(Identify({"feature_negotiation": True, **config}))
        return await c.frame()
    finally:
        await c.close()


# -- IDENTIFY ---------------------------------------------------------------------------------
REFUSED = [
    ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ({"sample_rate": -1}, "E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
    ({"output_buffer_size": 63}, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
    ({"output_buffer_size": 65537}, "E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
    ({"output_buffer_timeout": 24}, "E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid"),
    ({"output_buffer_timeout": 30001},
     "E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid"),
    ({"heartbeat_interval": 999}, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
    ({"heartbeat_interval": 60001}, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
    ({"heartbeat_interval": -2}, "E_BAD_BODY IDENTIFY heartbeat interval (-2) is invalid"),
    ({"msg_timeout": 999}, "E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    ({"msg_timeout": 900001}, "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
    ({"snappy": True, "deflate": True},
     "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"),
    ({"sample_rate": "1"}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ({"heartbeat_interval": 1.5}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ({"client_id": 5}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ({"deflate": 1}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "said"), REFUSED, ids=[str(c) for c, _ in REFUSED])
async def test_identify_refuses_what_nsqd_refuses(
    target: Target, config: dict[str, Any], said: str
) -> None:
    f = await first_frame(target, config)
    assert (f.kind, f.data.decode()) == (FrameType.ERROR, said)


ACCEPTED = [
    ({"output_buffer_size": -1}, {"output_buffer_size": 1, "output_buffer_timeout": 0}),
    ({"output_buffer_size": 64, "output_buffer_timeout": 25},
     {"output_buffer_size": 64, "output_buffer_timeout": 25}),
    ({"output_buffer_timeout": -1}, {"output_buffer_size": 16384, "output_buffer_timeout": 0}),
    ({"sample_rate": 99}, {"sample_rate": 99}),
    ({"deflate_level": 9}, {"deflate": False, "deflate_level": 6, "max_deflate_level": 6}),
    ({"msg_timeout": 5000, "hostname": None}, {"msg_timeout": 5000}),
    ({"tls_v1": True}, {"tls_v1": False}),
]  # fmt: skip


@pytest.mark.parametrize(("config", "answer"), ACCEPTED, ids=[str(c) for c, _ in ACCEPTED])
async def test_identify_answers_what_nsqd_answers(
    target: Target, config: dict[str, Any], answer: dict[str, Any]
) -> None:
    f = await first_frame(target, config)
    assert f.kind is FrameType.RESPONSE, f
    reply = json.loads(f.data)
    assert {k: reply[k] for k in answer} == answer


class DeflateClient:
    """A raw client that turns to raw DEFLATE both ways after IDENTIFY, as go-nsq does."""

    def __init__(self, raw: RawClient) -> None:
        self.raw = raw
        self.inflate = zlib.decompressobj(-15)
        self.deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        self.frames = FrameReader()
        self.pending: list[Frame] = []

    async def identify(self, level: int) -> dict[str, Any]:
        await self.raw.send(Identify({"feature_negotiation": True, "deflate": True,
                                      "deflate_level": level}))  # fmt: skip
        data = b""
        while len(data) < 8 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            data += await self.raw.reader.read(1 << 16)
        size = 4 + struct.unpack(">i", data[:4])[0]
        reply: dict[str, Any] = json.loads(data[8:size])
        self.pending = self.frames.feed(self.inflate.decompress(data[size:]))
        return reply

    async def send(self, *cmds: Any) -> None:
        from srtm.protocol import encode_command

        plain = b"".join(encode_command(c) for c in cmds)
        self.raw.writer.write(self.deflate.compress(plain) + self.deflate.flush(zlib.Z_SYNC_FLUSH))
        await self.raw.writer.drain()

    async def frame(self) -> Frame:
        async with asyncio.timeout(10):
            while True:
                while self.pending:
                    f = self.pending.pop(0)
                    if f.data != b"_heartbeat_":
                        return f
                data = await self.raw.reader.read(1 << 16)
                if not data:
                    raise EOFError("closed")
                self.pending += self.frames.feed(self.inflate.decompress(data))


async def test_deflate_stream_after_the_identify_reply(target: Target) -> None:
    c = DeflateClient(await connect(target))
    try:
        reply = await c.identify(3)
        assert (reply["deflate"], reply["deflate_level"]) == (True, 3)
        ok = await c.frame()  # the OK comes through the compressed stream
        assert (ok.kind, ok.data) == (FrameType.RESPONSE, b"OK")
        await c.send(Pub("deflated", b"squeeze me " * 20))
        assert (await c.frame()).data == b"OK"
        await c.send(Sub("deflated", "c"), Rdy(1))
        assert (await c.frame()).data == b"OK"
        f = await c.frame()
        assert f.kind is FrameType.MESSAGE
        assert decode_message(f.data).body == b"squeeze me " * 20
    finally:
        await c.raw.close()


class SnappyClient(DeflateClient):
    """A raw client that turns to Snappy's framing format both ways after IDENTIFY, as
    go-nsq does (cramjam's codec; chunks cut from the stream by SnappyReader)."""

    def __init__(self, raw: RawClient) -> None:
        import cramjam

        from srtm.broker.snappy import SnappyReader

        super().__init__(raw)
        self.reader = SnappyReader()
        self.compressor = cramjam.snappy.Compressor()

    async def identify_snappy(self, **config: Any) -> dict[str, Any]:
        await self.raw.send(Identify({"feature_negotiation": True, "snappy": True, **config}))
        data = b""
        while len(data) < 8 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            data += await self.raw.reader.read(1 << 16)
        size = 4 + struct.unpack(">i", data[:4])[0]
        reply: dict[str, Any] = json.loads(data[8:size])
        self.snappy_bytes = data[size:]
        self.pending = self.frames.feed(self.reader.feed(data[size:]))
        return reply

    async def read_stream_start(self, n: int) -> bytes:
        """The first ``n`` bytes after the IDENTIFY reply (they may come in a later read)."""
        while len(self.snappy_bytes) < n:
            data = await self.raw.reader.read(1 << 16)
            if not data:
                raise EOFError("closed")
            self.snappy_bytes += data
            self.pending += self.frames.feed(self.reader.feed(data))
        return self.snappy_bytes[:n]

    async def send(self, *cmds: Any) -> None:
        from srtm.protocol import encode_command

        self.compressor.compress(b"".join(encode_command(c) for c in cmds))
        await self.send_raw(bytes(self.compressor.flush()))

    async def send_raw(self, data: bytes) -> None:
        self.raw.writer.write(data)
        await self.raw.writer.drain()

    async def frame(self) -> Frame:
        async with asyncio.timeout(10):
            while True:
                while self.pending:
                    f = self.pending.pop(0)
                    if f.data != b"_heartbeat_":
                        return f
                data = await self.raw.reader.read(1 << 16)
                if not data:
                    raise EOFError("closed")
                self.pending += self.frames.feed(self.reader.feed(data))

    async def closed_silently(self) -> None:
        """The connection ends (FIN or reset) with no frame sent after what was read."""
        with contextlib.suppress(ConnectionResetError):
            async with asyncio.timeout(10):
                while data := await self.raw.reader.read(1 << 16):
                    self.pending += self.frames.feed(self.reader.feed(data))
        assert [f for f in self.pending if f.data != b"_heartbeat_"] == []


async def test_snappy_stream_after_the_identify_reply(target: Target) -> None:
    c = SnappyClient(await connect(target))
    try:
        reply = await c.identify_snappy()
        assert (reply["snappy"], reply["deflate"]) == (True, False)
        # nsqd: the stream identifier and the OK in one uncompressed chunk (CRC-32C masked).
        assert await c.read_stream_start(10) == b"\xff\x06\x00\x00sNaPpY"
        ok = await c.frame()  # through the framed stream
        assert (ok.kind, ok.data) == (FrameType.RESPONSE, b"OK")
        big = b"squeeze me " * 10_000  # over 64 KiB: several chunks each way
        await c.send(Pub("snappied", big))
        assert (await c.frame()).data == b"OK"
        await c.send(Sub("snappied", "c"), Rdy(1))
        assert (await c.frame()).data == b"OK"
        f = await c.frame()
        assert f.kind is FrameType.MESSAGE
        assert decode_message(f.data).body == big
        # Padding and reserved skippable chunks are skipped, a repeated identifier too.
        await c.send_raw(b"\xfe\x02\x00\x00\x00\x00\x80\x01\x00\x00x" + b"\xff\x06\x00\x00sNaPpY")
        await c.send(Pub("snappied", b"small"))
        assert (await c.frame()).data == b"OK"
    finally:
        await c.raw.close()


def _bad_crc(chunk: bytes) -> bytes:
    broken = bytearray(chunk)
    broken[4] ^= 1  # the first byte of the masked CRC-32C
    return bytes(broken)


BROKEN_STREAMS = {
    "bad crc": lambda chunk: _bad_crc(chunk),
    "chunk longer than golang/snappy reads": lambda _: b"\x00\xff\xff\xff" + bytes(100),
    "block over 64 KiB": lambda _: b"\x01\x05\x00\x01" + bytes(65541),
    "reserved unskippable chunk": lambda _: b"\x02\x01\x00\x00x",
    "bad stream identifier": lambda chunk: b"\xff\x06\x00\x00sNaPpX" + chunk,
}


@pytest.mark.parametrize("broken", BROKEN_STREAMS.values(), ids=list(BROKEN_STREAMS))
async def test_broken_snappy_stream_closes_without_an_answer(target: Target, broken: Any) -> None:
    c = SnappyClient(await connect(target))
    try:
        await c.identify_snappy()
        assert (await c.frame()).data == b"OK"
        c.compressor.compress(b"NOP\n")
        await c.send_raw(broken(bytes(c.compressor.flush())))
        await c.closed_silently()
    finally:
        await c.raw.close()


async def test_snappy_stream_must_start_with_its_identifier(target: Target) -> None:
    c = SnappyClient(await connect(target))
    try:
        await c.identify_snappy()
        assert (await c.frame()).data == b"OK"
        c.compressor.compress(b"NOP\n")
        await c.send_raw(bytes(c.compressor.flush())[10:])
        await c.closed_silently()
    finally:
        await c.raw.close()


async def channel_stats(t: Target, topic: str) -> dict[str, Any]:
    async with t.http.get("/stats", params={"format": "json", "topic": topic}) as resp:
        doc = await resp.json()
    chans = doc["topics"][0]["channels"] if doc["topics"] else []
    return chans[0] if chans else {}


async def test_sample_rate_delivers_a_share(target: Target) -> None:
    """nsqd drops what a sampling consumer does not get: the channel ends empty, and what
    is in flight is what was sent (about half at rate 50; 0 or all would be ~1e-120)."""
    n = 400
    c = await connect(target)
    try:
        await c.identify(sample_rate=50)
        await c.send(Sub("sampled", "c"), Rdy(n))
        assert await c.response() == b"OK"
        body = b"\n".join(b"m%d" % i for i in range(n))
        async with target.http.post("/mpub", params={"topic": "sampled"}, data=body) as r:
            assert r.status == 200

        async def settled() -> dict[str, Any]:
            return await channel_stats(target, "sampled")

        # Put on the channel (nsqd's topic hands them over after the MPUB's answer), then
        # taken off it: sent to the client or dropped.
        stats = await eventually(
            settled,
            "every message put on the channel and taken off it",
            until=lambda s: s.get("message_count") == n and s.get("depth") == 0,
        )
        sent = stats["in_flight_count"]
        assert n // 4 < sent < 3 * n // 4
        got = {(await c.message()).body for _ in range(sent)}
        assert len(got) == sent
    finally:
        await c.close()


# -- PUB / MPUB and the protocol magic ------------------------------------------------------
def mpub_body(*bodies: bytes, count: int | None = None) -> bytes:
    parts = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    return struct.pack(">I", len(bodies) if count is None else count) + parts


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (mpub_body(b"a", b""), "E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
        (mpub_body(b"", b""), "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
        (mpub_body(b"a", b"", count=1000), "E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
        (mpub_body(b"a", count=0), "E_BAD_BODY MPUB invalid message count 0"),
    ],
    ids=["second-empty", "both-empty", "count-beyond-body", "count-zero"],
)
async def test_mpub_errors(target: Target, body: bytes, said: str) -> None:
    c = await connect(target)
    try:
        await c.send(b"MPUB t\n" + struct.pack(">I", len(body)) + body)
        assert await c.error() == said
    finally:
        await c.close()


async def test_a_bad_magic_is_said_as_nsqd_says_it(target: Target) -> None:
    c = await RawClient.connect(HOST, target.tcp, magic=b"  V1")
    try:
        assert await c.error() == "E_BAD_PROTOCOL"
    finally:
        await c.close()


# -- a consumer that leaves -------------------------------------------------------------------
async def test_in_flight_of_a_gone_consumer_waits_for_its_timeout(target: Target) -> None:
    gone = await connect(target)
    await gone.identify(msg_timeout=1000)
    await gone.send(Sub("left", "c"), Rdy(1))
    assert await gone.response() == b"OK"
    await gone.send(Pub("left", b"owed"))
    frames = sorted([await gone.frame(), await gone.frame()], key=lambda f: f.kind.value)
    assert [f.kind for f in frames] == [FrameType.RESPONSE, FrameType.MESSAGE]
    first = decode_message(frames[1].data)
    await gone.close()

    async def stats() -> dict[str, Any]:
        return await channel_stats(target, "left")

    s = await eventually(stats, "the consumer gone", until=lambda s: s.get("client_count") == 0)
    assert (s["in_flight_count"], s["requeue_count"], s["timeout_count"]) == (1, 0, 0)
    # nsqd counts the timeout a moment before the message is back in the queue: wait for both
    s = await eventually(
        stats, "its message timed out and queued", until=lambda s: s["timeout_count"] and s["depth"]
    )
    assert (s["timeout_count"], s["requeue_count"], s["depth"]) == (1, 0, 1)
    again = await connect(target)
    try:
        await again.send(Sub("left", "c"), Rdy(1))
        assert await again.response() == b"OK"
        m = await again.message()
        assert (m.id, m.body, m.attempts) == (first.id, b"owed", 2)
    finally:
        await again.close()


# -- HTTP -------------------------------------------------------------------------------------
async def test_channel_create_needs_its_topic(target: Target) -> None:
    async with target.http.post("/channel/create", params={"topic": "no", "channel": "c"}) as r:
        assert (r.status, r.content_type, await r.json()) == (
            404, "application/json", {"message": "TOPIC_NOT_FOUND"}
        )  # fmt: skip


ACTIONS = [
    "/topic/create", "/topic/pause", "/topic/unpause", "/topic/empty",
    "/channel/create", "/channel/pause", "/channel/unpause", "/channel/empty",
    "/channel/delete", "/topic/delete",
]  # fmt: skip


async def test_actions_answer_empty_bodies(target: Target) -> None:
    for path in ACTIONS:
        async with target.http.post(path, params={"topic": "act", "channel": "c"}) as r:
            assert (r.status, await r.read()) == (200, b""), path
            assert "Content-Type" not in r.headers, path
    for path in ("/pub", "/mpub"):
        async with target.http.post(path, params={"topic": "act"}, data=b"x") as r:
            assert (r.status, await r.text()) == (200, "OK"), path
            assert r.content_type == "text/plain", path


async def test_not_found_and_method_not_allowed_are_json(target: Target) -> None:
    async with target.http.get("/nothing/here") as r:
        assert (r.status, await r.json()) == (404, {"message": "NOT_FOUND"})
    async with target.http.delete("/ping") as r:
        assert (r.status, await r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})


async def test_info_has_nsqds_limits(target: Target) -> None:
    async with target.http.get("/info") as r:
        info = await r.json()
    assert {k: info[k] for k in ("max_heartbeat_interval", "max_output_buffer_size",
                                 "max_output_buffer_timeout", "max_deflate_level")} == {
        "max_heartbeat_interval": 60_000_000_000, "max_output_buffer_size": 65536,
        "max_output_buffer_timeout": 30_000_000_000, "max_deflate_level": 6,
    }  # fmt: skip


MEMORY_KEYS = {
    "heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
    "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
    "gc_total_runs",
}  # fmt: skip


async def test_stats_memory_and_names_in_order(target: Target) -> None:
    for name in ("zeta", "alpha", "mid"):
        async with target.http.post("/topic/create", params={"topic": name}):
            pass
    for ch in ("z", "a"):
        async with target.http.post("/channel/create", params={"topic": "mid", "channel": ch}):
            pass
    async with target.http.get("/stats", params={"format": "json"}) as r:
        doc = await r.json()
    assert set(doc["memory"]) == MEMORY_KEYS
    assert doc["memory"]["heap_objects"] > 0 and doc["memory"]["heap_in_use_bytes"] > 0
    assert [t["topic_name"] for t in doc["topics"]] == ["alpha", "mid", "zeta"]
    assert [c["channel_name"] for c in doc["topics"][1]["channels"]] == ["a", "z"]
    params = {"format": "json", "include_mem": "false"}
    async with target.http.get("/stats", params=params) as r:
        assert "memory" not in await r.json()


async def test_config_log_level_and_lookupd_addresses(target: Target) -> None:
    http = target.http
    async with http.put("/config/log_level", data=b"warn") as r:
        assert (r.status, await r.json()) == (200, 3)
    async with http.get("/config/log_level") as r:
        assert await r.json() == 3
    async with http.put("/config/log_level", data=b"warning") as r:
        assert (r.status, await r.json()) == (400, {"message": "INVALID_VALUE"})
    async with http.put("/config/log_level", data=b"INFO") as r:
        assert (r.status, await r.json()) == (200, 2)
    addresses = [f"{HOST}:4160"]
    async with http.put("/config/nsqlookupd_tcp_addresses", json=addresses) as r:
        assert (r.status, await r.json()) == (200, addresses)
    async with http.get("/config/nsqlookupd_tcp_addresses") as r:
        assert await r.json() == addresses
    async with http.put("/config/nsqlookupd_tcp_addresses", data=b'"one"') as r:
        assert (r.status, await r.json()) == (400, {"message": "INVALID_VALUE"})
    async with http.put("/config/nsqlookupd_tcp_addresses", data=b"[]") as r:
        assert (r.status, await r.json()) == (200, [])
    async with http.get("/config/no_such_option") as r:
        assert (r.status, (await r.json())["message"]) == (400, "INVALID_OPTION")
    async with http.post("/config/log_level") as r:
        assert (r.status, await r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
