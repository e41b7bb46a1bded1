"""TLS (IDENTIFY tls_v1, --tls-required, client certificates, HTTPS) and nsqd's AUTH
against an auth server on 127.0.0.1, over real sockets, with raw clients and pynsq.

Certificates are made at test time with the ``openssl`` command (a CA, a server
certificate for 127.0.0.1, a client certificate).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nsq
import pytest
import tornado.ioloop
from aiohttp import web

from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.auth import AuthError, auth_url, parse_reply
from srtm.broker.documents import ClientDoc
from srtm.broker.http import serve_http
from srtm.broker.report import client_doc
from srtm.launch import start_broker
from srtm.protocol import Auth, Mpub, Nop, Pub, Rdy, Sub
from support import collector_off, eventually

MakeBroker = Callable[..., Awaitable[Broker]]


# -- certificates ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(d: Path, name: str, cn: str, ext: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d,
    )  # fmt: skip
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("certs")
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=srtm test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d,
    )  # fmt: skip
    _issue(d, "server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _issue(d, "client", "alice", "extendedKeyUsage=clientAuth\n")
    return Certs(
        d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key"
    )


# -- an auth server -------------------------------------------------------------------------
@dataclass
class AuthServer:
    """Answers GET /auth: secret "good" gets ``grants`` (as ``klass``: SRTM's srtm_class,
    when set), "relay" the same grants as another broker's relay link (SRTM's srtm_relay);
    anything else 403. ``gate`` (when set) holds every answer until it is set."""

    grants: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {"topic": "^allowed", "channels": [".*"], "permissions": ["publish", "subscribe"]}
        ]
    )
    ttl: int = 3600
    klass: str | None = None
    queries: list[dict[str, str]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    address: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        if self.gate is not None:
            await self.gate.wait()
        if request.query.get("secret") == "huge":  # a 2 MiB answer, over the broker's limit
            return web.json_response({"ttl": 5, "identity": "x" * (2 << 20)})
        secret = request.query.get("secret")
        if secret not in ("good", "relay"):
            return web.json_response({"message": "NOT_AUTHORIZED"}, status=403)
        doc: dict[str, Any] = {
            "ttl": self.ttl,
            "identity": "alice" if secret == "good" else "broker",
            "identity_url": "https://example.invalid/alice",
            "authorizations": self.grants,
        }
        if secret == "relay":
            doc["srtm_relay"] = True
        elif self.klass is not None:
            doc["srtm_class"] = self.klass
        return web.json_response(doc)


@pytest.fixture
async def auth_server() -> AsyncIterator[AuthServer]:
    server = AuthServer()
    app = web.Application()
    app.router.add_get("/auth", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.address = f"{host}:{port}"
    yield server
    if server.gate is not None:
        server.gate.set()
    await runner.cleanup()


# -- in-process brokers ---------------------------------------------------------------------
@pytest.fixture
async def make_broker(tmp_path: Path) -> AsyncIterator[MakeBroker]:
    started: list[tuple[Broker, web.AppRunner]] = []

    async def make(**options: Any) -> Broker:
        opts = BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data", **options)
        broker = Broker(opts)
        await broker.start()
        runner, _ = await serve_http(broker)
        started.append((broker, runner))
        return broker

    yield make
    for b, runner in started:
        await runner.cleanup()
        await b.stop()


def tls_options(certs: Certs, **more: Any) -> dict[str, Any]:
    return {"tls_cert": certs.server_cert, "tls_key": certs.server_key, **more}


async def connect(broker: Broker) -> RawClient:
    assert broker.tcp_address is not None
    return await RawClient.connect(*broker.tcp_address)


async def upgrade(client: RawClient, ctx: ssl.SSLContext) -> None:
    """The client's half of nsqd's upgrade: handshake, then the broker's OK over TLS."""
    await client.writer.start_tls(ctx, server_hostname="127.0.0.1")
    assert await client.response() == b"OK"


# -- TLS on the TCP protocol ---------------------------------------------------------------
async def test_tls_v1_upgrades_and_messages_flow_over_tls(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(**tls_options(certs))
    pub, sub = await connect(broker), await connect(broker)
    for c in (pub, sub):
        reply = await c.identify(tls_v1=True)
        assert reply["tls_v1"] is True and reply["snappy"] is False and reply["deflate"] is False
        await upgrade(c, certs.client_context())
        ssl_obj = c.writer.get_extra_info("ssl_object")
        assert ssl_obj is not None and ssl_obj.version() in ("TLSv1.2", "TLSv1.3")
    await sub.send(Sub("secure", "ch"), Rdy(10))
    assert await sub.response() == b"OK"
    bodies = [b"x" * n for n in (1, 100, 70_000)]  # one spans several TLS records
    await pub.send(Pub("secure", bodies[0]), Mpub("secure", bodies[1:]))
    assert [await pub.response() for _ in range(2)] == [b"OK", b"OK"]
    assert [(await sub.message()).body for _ in bodies] == bodies
    assert all(c.tls is not None and c.tls.established for c in broker.clients)
    # A second IDENTIFY over TLS does not upgrade again; the session goes on.
    assert (await pub.identify(tls_v1=True))["tls_v1"] is False
    await pub.send(Pub("secure", b"again"))
    assert await pub.response() == b"OK"
    for c in (pub, sub):
        await c.close()


async def test_without_a_certificate_tls_v1_is_declined(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    c = await connect(broker)
    assert (await c.identify(tls_v1=True))["tls_v1"] is False
    await c.send(Pub("plain", b"x"))
    assert await c.response() == b"OK"  # the session went on in plain text
    await c.close()


async def test_tls_required_refuses_commands_before_the_upgrade(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(**tls_options(certs, tls_required="tcp-https"))
    plain = await connect(broker)
    await plain.send(Pub("t", b"x"))
    assert (await plain.error()).startswith("E_INVALID cannot PUB in current state")
    assert await plain.closed()
    secure = await connect(broker)
    await secure.identify(tls_v1=True)
    await upgrade(secure, certs.client_context())
    await secure.send(Pub("t", b"x"))
    assert await secure.response() == b"OK"
    await secure.close()


async def test_a_handshake_that_never_comes_is_ended(make_broker: MakeBroker, certs: Certs) -> None:
    broker = await make_broker(**tls_options(certs, tls_handshake_timeout_ms=200))
    c = await connect(broker)
    await c.identify(tls_v1=True)
    assert await c.closed(timeout=5.0)  # it sent nothing after IDENTIFY
    await eventually(lambda: not broker.clients, "the client closed")


async def test_plain_text_after_identify_tls_is_not_run(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(**tls_options(certs))
    c = await connect(broker)
    await c.identify(tls_v1=True)
    await c.send(Pub("sneaky", b"x"))  # not a ClientHello: the handshake fails
    assert await c.closed()
    assert "sneaky" not in broker.topics


async def test_client_certificates_are_required_and_verified(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(
        **tls_options(certs, tls_root_ca_file=certs.ca, tls_client_auth_policy="require-verify")
    )
    anonymous = await connect(broker)
    await anonymous.identify(tls_v1=True)
    with pytest.raises((ssl.SSLError, ConnectionError, EOFError, AssertionError)):
        await upgrade(anonymous, certs.client_context())
    await anonymous.close()
    known = await connect(broker)
    await known.identify(tls_v1=True)
    await upgrade(known, certs.client_context(with_cert=True))
    await known.send(Nop(), Pub("t", b"x"))
    assert await known.response() == b"OK"
    (client,) = broker.clients
    assert client.tls is not None and client.tls.common_name == "alice"
    await known.close()


# -- HTTPS ----------------------------------------------------------------------------------
async def test_https_serves_the_api_and_tls_required_refuses_plain_http(
    make_broker: MakeBroker, certs: Certs
) -> None:
    broker = await make_broker(**tls_options(certs, tls_required="true", https_port=0))
    assert broker.https_address is not None and broker.http_address is not None
    async with aiohttp.ClientSession() as http:
        secure = f"https://127.0.0.1:{broker.https_address[1]}"
        async with http.post(
            f"{secure}/pub?topic=web", data=b"hi", ssl=certs.client_context()
        ) as r:
            assert (r.status, await r.text()) == (200, "OK")
        async with http.get(f"http://127.0.0.1:{broker.http_address[1]}/ping") as r:
            assert r.status == 403 and await r.json() == {"message": "TLS_REQUIRED"}
    assert broker.topics["web"].message_count == 1


def test_bad_tls_settings_are_refused_with_the_flag_named(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ValueError, match="--tls-cert and --tls-key"):
        Broker(BrokerOptions(data_dir=tmp_path, tls_cert=certs.server_cert))
    with pytest.raises(ValueError, match="--tls-required"):
        Broker(BrokerOptions(data_dir=tmp_path, **tls_options(certs, tls_required="yes")))
    with pytest.raises(ValueError, match="need --tls-cert"):
        Broker(BrokerOptions(data_dir=tmp_path, https_port=0))
    with pytest.raises(ValueError, match="cannot load"):
        Broker(BrokerOptions(data_dir=tmp_path, tls_cert=certs.ca, tls_key=certs.client_key))


# -- AUTH -----------------------------------------------------------------------------------
async def test_without_an_auth_server_auth_is_disabled(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    c = await connect(broker)
    assert (await c.identify())["auth_required"] is False
    await c.send(Auth(b"good"))
    assert (await c.error()).startswith("E_AUTH_DISABLED")
    await c.close()


async def test_auth_governs_pub_and_sub(make_broker: MakeBroker, auth_server: AuthServer) -> None:
    broker = await make_broker(auth_http_address=(auth_server.address,))
    early = await connect(broker)
    assert (await early.identify())["auth_required"] is True
    await early.send(Pub("allowed", b"x"))
    assert (await early.error()).startswith("E_AUTH_FIRST AUTH required before PUB")
    assert await early.closed()

    c = await connect(broker)
    await c.identify()
    await c.send(Auth(b"good"))
    doc = json.loads(await c.response())
    assert doc == {
        "identity": "alice",
        "identity_url": "https://example.invalid/alice",
        "permission_count": 1,
    }
    (q,) = auth_server.queries
    assert q == {"remote_ip": "127.0.0.1", "tls": "false", "secret": "good", "common_name": ""}
    await c.send(Pub("allowed_topic", b"x"))
    assert await c.response() == b"OK"
    await c.send(Pub("forbidden", b"x"))
    assert (await c.error()) == 'E_UNAUTHORIZED AUTH failed for PUB on "forbidden" ""'
    assert await c.closed()
    assert "forbidden" not in broker.topics

    s = await connect(broker)
    await s.identify()
    await s.send(Auth(b"good"), Sub("allowed_topic", "ch"), Rdy(1))
    json.loads(await s.response())
    assert await s.response() == b"OK"
    assert (await s.message()).body == b"x"
    await s.close()


async def test_a_refused_or_unreachable_auth_server_fails_auth(
    make_broker: MakeBroker, auth_server: AuthServer
) -> None:
    broker = await make_broker(auth_http_address=(auth_server.address,))
    c = await connect(broker)
    await c.identify()
    await c.send(Auth(b"wrong"))
    assert await c.error() == "E_AUTH_FAILED AUTH failed"
    assert await c.closed()

    huge = await connect(broker)
    await huge.identify()
    await huge.send(Auth(b"huge"))
    assert await huge.error() == "E_AUTH_FAILED AUTH failed"

    # A port nobody listens on (bound, then closed): connection refused.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    broker2 = await make_broker(auth_http_address=(dead,))
    c2 = await connect(broker2)
    await c2.identify()
    await c2.send(Auth(b"good"))
    assert await c2.error() == "E_AUTH_FAILED AUTH failed"
    # ...and a second address is tried when the first fails.
    broker3 = await make_broker(auth_http_address=(dead, auth_server.address))
    c3 = await connect(broker3)
    await c3.identify()
    await c3.send(Auth(b"good"))
    assert json.loads(await c3.response())["identity"] == "alice"
    await c3.close()


async def test_commands_wait_in_order_for_the_answer_without_blocking_the_broker(
    make_broker: MakeBroker, auth_server: AuthServer
) -> None:
    auth_server.gate = asyncio.Event()
    broker = await make_broker(auth_http_address=(auth_server.address,))
    c = await connect(broker)
    await c.identify()
    await c.send(Auth(b"good"), Pub("allowed", b"1"), Pub("allowed", b"2"), Nop())
    await eventually(lambda: len(auth_server.queries), "one auth query", until=lambda n: n == 1)
    # The broker's loop is free while the auth server thinks: another client is served.
    other = await connect(broker)
    assert (await other.identify())["auth_required"] is True
    await other.close()
    assert "allowed" not in broker.topics  # nothing ran ahead of AUTH's answer
    auth_server.gate.set()
    assert json.loads(await c.response())["permission_count"] == 1
    assert [await c.response() for _ in range(2)] == [b"OK", b"OK"]
    assert broker.topics["allowed"].message_count == 2
    await c.close()


async def test_an_expired_authorization_is_asked_again(
    make_broker: MakeBroker, auth_server: AuthServer
) -> None:
    broker = await make_broker(auth_http_address=(auth_server.address,))
    c = await connect(broker)
    await c.identify()
    await c.send(Auth(b"good"))
    json.loads(await c.response())
    (client,) = broker.clients
    assert client.gate is not None
    later = time.time_ns() + (auth_server.ttl + 1) * 1_000_000_000
    client.gate.clock_ns = lambda: later  # the TTL has passed
    auth_server.grants = [{"topic": "^other$", "channels": [".*"], "permissions": ["publish"]}]
    await c.send(Pub("allowed", b"x"))
    assert (await c.error()).startswith("E_UNAUTHORIZED")
    assert len(auth_server.queries) == 2  # asked again, and the new answer applied


async def test_auth_over_tls_reports_tls_and_the_certificate_name(
    make_broker: MakeBroker, auth_server: AuthServer, certs: Certs
) -> None:
    broker = await make_broker(
        auth_http_address=(f"http://{auth_server.address}",),
        **tls_options(certs, tls_root_ca_file=certs.ca, tls_client_auth_policy="require"),
    )
    c = await connect(broker)
    await c.identify(tls_v1=True)
    await upgrade(c, certs.client_context(with_cert=True))
    await c.send(Auth(b"good"))
    json.loads(await c.response())
    assert auth_server.queries[0]["tls"] == "true"
    assert auth_server.queries[0]["common_name"] == "alice"
    # nsqd's client stats fields, as the document declares them
    doc = ClientDoc.model_validate(client_doc(next(iter(broker.clients))))
    assert doc.tls is True and doc.tls_version.startswith("TLSv1") and doc.tls_cipher_suite
    assert (doc.authed, doc.auth_identity) == (True, "alice")
    await c.close()


async def test_a_closed_tls_and_auth_connection_leaves_no_cyclic_garbage(
    make_broker: MakeBroker, auth_server: AuthServer, certs: Certs
) -> None:
    """Its gate (TLS, AUTH) lets go of it once it is closed, as the other parts do
    (``test_broker_tcp``), and its TLS handshake's deadline is cancelled: it is freed at
    once, nothing of it left for the collector."""
    broker = await make_broker(
        auth_http_address=(auth_server.address,), **tls_options(certs, tls_required="true")
    )
    with collector_off() as cyclic_parts:
        c = await connect(broker)
        await c.identify(tls_v1=True)
        await upgrade(c, certs.client_context())
        await c.send(Auth(b"good"))
        json.loads(await c.response())
        await c.send(Pub("allowed_topic", b"x"))
        assert await c.response() == b"OK"
        (client,) = broker.clients
        assert client.gate is not None and client.tls is not None
        gone = weakref.ref(client)
        del client
        await c.close()
        await eventually(lambda: not broker.clients, "the connection closed")
        await asyncio.sleep(0)  # its parts let go of it a loop turn after the close
        assert gone() is None  # freed by reference counting (its handshake timer too)
        assert cyclic_parts() == Counter()


def test_auth_answers_are_checked_as_nsqd_does() -> None:
    grant = {"topic": "t", "channels": ["c"], "permissions": ["subscribe"]}
    state = parse_reply(json.dumps({"ttl": 5, "authorizations": [grant]}).encode(), 0)
    assert state.expires_ns == 5_000_000_000 and not state.expired(4_999_999_999)
    assert state.allows("my_t", "xcx") and not state.allows("t", "") and not state.allows("x", "c")
    for bad in (
        {"ttl": 0},
        {"ttl": "5"},
        {"ttl": 5, "authorizations": [{**grant, "permissions": ["admin"]}]},
        {"ttl": 5, "authorizations": [{**grant, "topic": "("}]},
        [],
    ):
        with pytest.raises(AuthError):
            parse_reply(json.dumps(bad).encode(), 0)
    url = auth_url("h:1", "10.0.0.1", True, "s&x=1", "cn")
    assert url == "http://h:1/auth?common_name=cn&remote_ip=10.0.0.1&secret=s%26x%3D1&tls=true"
    assert auth_url("https://h:1/", "ip", False, "s", "").startswith("https://h:1/auth?")


# -- pynsq, with TLS and AUTH, against a broker process ------------------------------------
def test_pynsq_publishes_and_consumes_with_tls_and_auth(tmp_path: Path, certs: Certs) -> None:
    """pynsq's Reader and Writer negotiate tls_v1, then AUTH, with a broker process that
    requires TLS; the auth server runs on the test's own (tornado's asyncio) loop."""
    server = AuthServer()
    tls = {
        "ca_certs": str(certs.ca),
        "cert_reqs": ssl.CERT_REQUIRED,
        "ssl_version": ssl.PROTOCOL_TLS_CLIENT,  # pynsq's default (TLSv1_2) is deprecated
    }
    got: list[bytes] = []
    responses: list[object] = []

    def handler(message: nsq.Message) -> bool:
        got.append(message.body)
        return True

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/auth", server.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        address = "{}:{}".format(*runner.addresses[0][:2])
        args = [
            "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
            "--tls-required", "true", "--auth-http-address", address,
            "--https-address", "127.0.0.1:0", "--tls-root-ca-file", str(certs.ca),
        ]  # fmt: skip
        proc = await asyncio.to_thread(start_broker, tmp_path / "data", args)
        common = {"tls_v1": True, "tls_options": tls}
        reader = writer = refused = None
        try:
            reader = nsq.Reader(
                "allowed_t", "ch", message_handler=handler,
                nsqd_tcp_addresses=[proc.tcp_address], auth_secret="good", **common,
            )  # fmt: skip
            writer = nsq.Writer([proc.tcp_address], auth_secret="good", **common)
            refused = nsq.Writer([proc.tcp_address], auth_secret="bad", **common)
            await eventually(
                lambda: any(c.connected() for c in writer.conns.values()), "Writer connected"
            )
            for body in (b"one", b"two"):
                writer.pub("allowed_t", body, callback=lambda conn, data: responses.append(data))
            await eventually(lambda: got, "both messages received", until=lambda g: len(g) == 2)
            await eventually(
                lambda: any(q["secret"] == "bad" for q in server.queries), "refused writer"
            )
        finally:
            for client in (reader, writer, refused):
                for conn in list(client.conns.values()) if client else ():
                    conn.close()
            if reader is not None and reader.redist_periodic is not None:
                reader.redist_periodic.stop()
            await asyncio.to_thread(proc.stop)
            await runner.cleanup()

    loop = tornado.ioloop.IOLoop(make_current=False)
    try:
        loop.run_sync(main, timeout=60)
    finally:
        loop.close(all_fds=True)
    assert got == [b"one", b"two"] and responses == [b"OK", b"OK"]
    assert {q["tls"] for q in server.queries} == {"true"}  # AUTH came after the upgrade
    assert {q["secret"] for q in server.queries} == {"good", "bad"}
