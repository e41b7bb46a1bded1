"""The broker's HTTP API under hostile requests: the token guards every mutating /srtm/
endpoint, numbers must be finite, measurement rounds are bounded and end with their
client, bodies are bounded; and the command line will not start an open broker by mistake.
Real servers on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.broker import Broker, BrokerOptions
from srtm.broker.http import serve_http
from srtm.launch import start_broker
from srtm.protocol import MAGIC_V2, Identify, encode_command
from srtm.security import require_auth_choice
from support import eventually

TOKEN = "t0ps3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def serve(tmp_path: Path, token: str | None) -> tuple[Broker, Any, int]:
    opts = BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data", token=token)
    broker = Broker(opts)
    await broker.start()
    runner, port = await serve_http(broker)
    return broker, runner, port


@pytest.fixture(params=[TOKEN, None], ids=["token", "open"])
async def api(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Broker, aiohttp.ClientSession]]:
    broker, runner, port = await serve(tmp_path, request.param)
    headers = AUTH if request.param else {}
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", headers=headers) as session:
        yield broker, session
    await runner.cleanup()
    await broker.stop()


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[tuple[Broker, aiohttp.ClientSession]]:
    """A broker with a token and a session that does not send it."""
    broker, runner, port = await serve(tmp_path, TOKEN)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        yield broker, session
    await runner.cleanup()
    await broker.stop()


async def call(
    s: aiohttp.ClientSession,
    method: str,
    path: str,
    data: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with s.request(method, path, data=data, headers=headers) as resp:
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, await resp.text()


async def orders_client(broker: Broker, publisher: str) -> tuple[Any, Any]:
    """A raw TCP client that IDENTIFYs as ``publisher`` taking SRTM orders."""
    assert broker.tcp_address is not None
    reader, writer = await asyncio.open_connection(*broker.tcp_address)
    ident = Identify({"srtm_publisher": publisher, "srtm_orders": True})
    writer.write(MAGIC_V2 + encode_command(ident))
    await reader.readexactly(4 + 4 + 2)  # size, frame type, "OK"
    return reader, writer


# -- finding 9: the token ---------------------------------------------------------------
MUTATING = [
    ("POST", "/srtm/migrate?topic=t&publisher=p1&to=127.0.0.1:1"),
    ("POST", "/srtm/bucket?topic=t&rate=10&burst=2"),
    ("DELETE", "/srtm/bucket?topic=t"),
    ("POST", "/srtm/measure?topic=t&window_ms=5"),
    ("PUT", "/srtm/anything"),
]


@pytest.mark.parametrize(("method", "path"), MUTATING)
@pytest.mark.parametrize(
    "headers",
    [None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
     {"Authorization": f"Basic {TOKEN}"}],
    ids=["none", "wrong", "no-scheme", "basic"],
)  # fmt: skip
async def test_mutating_srtm_endpoints_need_the_token(
    guarded: tuple[Broker, aiohttp.ClientSession],
    method: str,
    path: str,
    headers: dict[str, str] | None,
) -> None:
    broker, s = guarded
    broker.topic("t")
    assert await call(s, method, path, headers=headers) == (401, {"message": "E_UNAUTHORIZED"})
    async with s.request(method, path, headers=headers) as resp:
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert broker.topics["t"].bucket is None


async def test_a_stranger_cannot_move_a_live_publisher(
    guarded: tuple[Broker, aiohttp.ClientSession],
) -> None:
    """The attack of finding 9: POST /srtm/migrate ... to=<their server>."""
    broker, s = guarded
    reader, writer = await orders_client(broker, "p1")
    try:
        evil = "/srtm/migrate?topic=t&publisher=p1&to=evil.example:4150"
        assert (await call(s, "POST", evil))[0] == 401
        status, doc = await call(s, "POST", evil, headers=AUTH)
        assert (status, doc) == (200, {"notified": 1})  # the holder of the token may
        frame = await reader.read(1 << 16)
        assert b"evil.example:4150" in frame and frame.count(b"migrate") == 1
    finally:
        writer.close()


async def test_reads_and_nsqd_endpoints_stay_open(
    guarded: tuple[Broker, aiohttp.ClientSession],
) -> None:
    """nsqd's own API is open as in nsqd (NSQ tools need it); SRTM reads are open."""
    _, s = guarded
    assert await call(s, "POST", "/topic/create?topic=t") == (200, "")
    assert await call(s, "POST", "/pub?topic=t", b"x") == (200, "OK")
    assert (await call(s, "GET", "/srtm/bucket?topic=t"))[0] == 200
    assert (await call(s, "GET", "/stats?format=json"))[0] == 200
    assert (await call(s, "GET", "/ping")) == (200, "OK")


@pytest.mark.parametrize(
    "to", ["evil", "evil:", ":4150", "host:port", "h:0", "h:65536", "h:-1", "a b:1",
           "h:1/x", "h:1?x=1", "h:४१", "h:" + "1" * 5000],
)  # fmt: skip
async def test_migrate_target_must_be_host_port(
    api: tuple[Broker, aiohttp.ClientSession], to: str
) -> None:
    _, s = api
    async with s.post("/srtm/migrate", params={"topic": "t", "publisher": "p", "to": to}) as resp:
        status, doc = resp.status, await resp.json()
    assert status == 400 and doc["message"] == "INVALID_TO", (to, doc)


async def test_migrate_accepts_names_and_addresses(
    api: tuple[Broker, aiohttp.ClientSession],
) -> None:
    _, s = api
    for to in ("127.0.0.1:4150", "broker-2.local:4150", "::1:4150"):
        async with s.post(
            "/srtm/migrate", params={"topic": "t", "publisher": "p", "to": to}
        ) as resp:
            assert resp.status == 200, (to, await resp.text())


async def test_an_open_api_binds_loopback_only(tmp_path: Path) -> None:
    opts = BrokerOptions(tcp_port=0, http_host="0.0.0.0", http_port=0, data_dir=tmp_path)
    with pytest.raises(ValueError, match="without a token"):
        await serve_http(Broker(opts))


def test_require_auth_choice() -> None:
    require_auth_choice("tok", False, ["0.0.0.0"])
    require_auth_choice(None, True, ["127.0.0.1", "localhost", "::1"])
    with pytest.raises(ValueError, match="--insecure-loopback"):
        require_auth_choice(None, False, ["127.0.0.1"])
    with pytest.raises(ValueError, match=r"0\.0\.0\.0"):
        require_auth_choice(None, True, ["127.0.0.1", "0.0.0.0"])
    with pytest.raises(ValueError, match=r"\*"):
        require_auth_choice(None, True, [""])
    with pytest.raises(ValueError, match="empty"):
        require_auth_choice(" ", False, ["127.0.0.1"])


def _srtm_broker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "srtm", "broker", "--tcp-address", "127.0.0.1:0",
           "--http-address", "127.0.0.1:0", *args]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SRTM_")}
    return subprocess.run(
        cmd, env=environ | (env or {}), capture_output=True, text=True, timeout=60
    )


def test_cli_refuses_an_open_broker_unless_told(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path)]
    done = _srtm_broker(*data)
    assert done.returncode == 2 and "--insecure-loopback" in done.stderr, done
    exposed = _srtm_broker(*data, "--insecure-loopback", "--http-address", "0.0.0.0:0")
    assert exposed.returncode == 2 and "0.0.0.0" in exposed.stderr, exposed
    via_env = _srtm_broker(*data, "--tcp-address", "0.0.0.0:0", env={"SRTM_INSECURE_LOOPBACK": "1"})
    assert via_env.returncode == 2 and "0.0.0.0" in via_env.stderr, via_env


def test_cli_broker_with_a_token_guards_its_api(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", ["--token", TOKEN])
    try:
        with pytest.raises(Exception, match="401"):
            broker.post("/srtm/bucket?topic=t&rate=10&burst=2")
        broker.post("/topic/create?topic=t")
        import urllib.request

        req = urllib.request.Request(
            broker.url("/srtm/bucket?topic=t&rate=10&burst=2"), data=b"", headers=AUTH
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["bucket"] == {"rate": 10.0, "burst": 2.0}
    finally:
        broker.stop()


# -- finding 10: numbers, measurement rounds, bodies --------------------------------------
@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("/srtm/measure?topic=t&window_ms=nan", "INVALID_WINDOW_MS"),
        ("/srtm/measure?topic=t&window_ms=inf", "INVALID_WINDOW_MS"),
        ("/srtm/measure?topic=t&window_ms=-inf", "INVALID_WINDOW_MS"),
        ("/srtm/measure?topic=t&window_ms=0", "INVALID_WINDOW_MS"),
        ("/srtm/measure?topic=t&window_ms=0.5", "INVALID_WINDOW_MS"),
        ("/srtm/measure?topic=t&window_ms=60001", "INVALID_WINDOW_MS"),
        ("/srtm/measure?topic=t&window_ms=1e300", "INVALID_WINDOW_MS"),
        ("/srtm/bucket?topic=t&rate=nan&burst=5", "INVALID_RATE"),
        ("/srtm/bucket?topic=t&rate=inf&burst=5", "INVALID_RATE"),
        ("/srtm/bucket?topic=t&rate=5&burst=nan", "INVALID_BURST"),
        ("/srtm/bucket?topic=t&rate=5&burst=-inf", "INVALID_BURST"),
        ("/srtm/migrate?topic=t&publisher=p&to=h:1&version=%C2%B2", "INVALID_VERSION"),
        (
            "/srtm/migrate?topic=t&publisher=p&to=h:1&version=99999999999999999999",
            "INVALID_VERSION",
        ),
        ("/pub?topic=t&defer=%C2%B2", "INVALID_DEFER"),
        ("/pub?topic=t&defer=" + "1" * 5000, "INVALID_DEFER"),
        ("/srtm/migrate?topic=t&publisher=p&to=h:1&version=" + "1" * 5000, "INVALID_VERSION"),
    ],
)
async def test_numbers_must_be_finite_and_in_range(
    api: tuple[Broker, aiohttp.ClientSession], query: str, code: str
) -> None:
    """window_ms=nan was a 500; nan/inf buckets were accepted (finding 6)."""
    broker, s = api
    broker.topic("t")
    status, doc = await call(s, "POST", query, b"x")
    assert status == 400 and doc["message"] == code, doc
    assert broker.topics["t"].bucket is None and not broker.measurements


async def test_absurd_bucket_is_refused_not_stored(
    api: tuple[Broker, aiohttp.ClientSession],
) -> None:
    """rate=1e-300 used to make every PUB fail; whatever srtm.ratelimit refuses is a 400."""
    broker, s = api
    status, doc = await call(s, "POST", "/srtm/bucket?topic=t&rate=-1&burst=5")
    assert status == 400 and doc["message"] == "INVALID_BUCKET"
    assert "t" not in broker.topics or broker.topics["t"].bucket is None


async def post_measure(port: int, window_ms: int, token: str | None) -> tuple[Any, Any]:
    """A raw HTTP client that starts a measurement round and then just holds on."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(
        f"POST /srtm/measure?topic=t&window_ms={window_ms} HTTP/1.1\r\nHost: x\r\n{auth}"
        "Content-Length: 0\r\n\r\n".encode()
    )
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "open"])
async def test_a_measurement_round_ends_with_its_client(tmp_path: Path, token: str | None) -> None:
    broker, runner, port = await serve(tmp_path, token)
    try:
        _, writer = await post_measure(port, 60_000, token)
        await eventually(
            lambda: len(broker.measurements), "the round to start", until=lambda n: n == 1
        )
        writer.close()
        await eventually(lambda: not broker.measurements, "the round to end with its client")
    finally:
        await runner.cleanup()
        await broker.stop()


async def test_measurement_rounds_are_limited_per_broker(tmp_path: Path) -> None:
    broker, runner, port = await serve(tmp_path, None)
    broker.measurements.limit = 3
    writers = []
    try:
        for _ in range(3):
            writers.append((await post_measure(port, 60_000, None))[1])
        await eventually(lambda: len(broker.measurements), "three rounds", until=lambda n: n == 3)
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as s:
            status, doc = await call(s, "POST", "/srtm/measure?topic=t&window_ms=10")
            assert status == 429 and doc["message"] == "TOO_MANY_MEASUREMENTS"
            writers.pop().close()
            await eventually(
                lambda: len(broker.measurements), "one round to end", until=lambda n: n == 2
            )
            status, doc = await call(s, "POST", "/srtm/measure?topic=t&window_ms=10")
            assert status == 200 and doc["window_ms"] == 10
    finally:
        for w in writers:
            w.close()
        await runner.cleanup()
        await broker.stop()


async def test_bodies_are_bounded(api: tuple[Broker, aiohttp.ClientSession]) -> None:
    broker, s = api
    limits = broker.options.limits
    status, doc = await call(s, "POST", "/mpub?topic=t", b"x\n" * (limits.max_body_size // 2 + 1))
    assert status == 413
    big = json.dumps({"publishers": ["p" * 1000] * (limits.max_msg_size // 1000 + 1)})
    status, doc = await call(s, "POST", "/srtm/measure?topic=t&window_ms=5", big.encode())
    assert status == 413 and doc["message"] == "BODY_TOO_BIG"
    assert not broker.measurements
