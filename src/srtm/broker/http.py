"""nsqd's HTTP API (aiohttp), plus /metrics and SRTM's ``/srtm/bucket``.

With a token (``BrokerOptions.token``) every mutating ``/srtm/*`` request needs
``Authorization: Bearer <token>``; nsqd's own endpoints stay open, as in nsqd, for NSQ's
tools. Numbers must be finite, bodies and measurement rounds are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import re
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from srtm.broker.measurement import MAX_MEASURE_NS, MIN_MEASURE_NS, MeasurementsBusy
from srtm.broker.metrics import BrokerCollector
from srtm.broker.report import stats_document
from srtm.broker.state import LimitReached
from srtm.broker.tls import http_requires_tls
from srtm.protocol import ProtocolError, errors, is_valid_name
from srtm.security import E_UNAUTHORIZED, bearer_matches, require_loopback_without_token

if TYPE_CHECKING:
    from srtm.broker.broker import Broker

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    """An nsqd-style error reply: ``{"message": CODE}`` (with SRTM's ``detail``)."""

    def __init__(self, status: int, code: str, detail: str = "") -> None:
        super().__init__(code)
        self.status, self.code, self.detail = status, code, detail


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HttpError as err:
        body = {"message": err.code} | ({"detail": err.detail} if err.detail else {})
        return web.json_response(body, status=err.status)
    except LimitReached as err:  # --max-topics / --max-channels-per-topic
        return web.json_response({"message": err.http_code, "detail": err.message}, status=403)


_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def _auth(token: str | None) -> Middleware:
    """Mutating ``/srtm/*`` requests need the token (when there is one)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            token is not None
            and request.path.startswith("/srtm/")
            and request.method not in _READS
            and not bearer_matches(request.headers.get("Authorization"), token)
        ):
            headers = {"WWW-Authenticate": 'Bearer realm="srtm"'}  # RFC 6750
            return web.json_response({"message": E_UNAUTHORIZED}, status=401, headers=headers)
        return await handler(request)

    return auth


@contextlib.contextmanager
def _pub_failed() -> Iterator[None]:
    """A publish the broker refuses (a disk queue cannot write): 503 E_PUB_FAILED."""
    try:
        yield
    except ProtocolError as err:
        if err.code != errors.E_PUB_FAILED or isinstance(err, LimitReached):
            raise  # a limit is the client's 403, not the disk's 503
        raise HttpError(503, err.code, err.message) from err


@web.middleware
async def _tls_required(request: web.Request, handler: Handler) -> web.StreamResponse:
    """nsqd's --tls-required=true: the plain HTTP API answers 403 TLS_REQUIRED."""
    if not request.secure:
        return web.json_response({"message": "TLS_REQUIRED"}, status=403)
    return await handler(request)


def _topic_name(request: web.Request) -> str:
    name = request.query.get("topic")
    if not name:
        raise HttpError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(name):
        raise HttpError(400, "INVALID_TOPIC", f"topic name {name!r} is not valid")
    return name


def _channel_name(request: web.Request) -> str:
    name = request.query.get("channel")
    if not name:
        raise HttpError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(name):
        raise HttpError(400, "INVALID_CHANNEL", f"channel name {name!r} is not valid")
    return name


def _number(request: web.Request, key: str) -> float:
    raw = request.query.get(key)
    if raw is None:
        raise HttpError(400, f"MISSING_ARG_{key.upper()}")
    try:
        value = float(raw)
    except ValueError:
        raise HttpError(400, f"INVALID_{key.upper()}", f"{key} {raw!r} is not a number") from None
    if not math.isfinite(value):  # nan passes every range check; inf overflows later
        raise HttpError(400, f"INVALID_{key.upper()}", f"{key} {raw!r} is not finite")
    return value


def _whole(raw: str, key: str, most: int) -> int:
    """A decimal integer 0..most (ASCII digits only: ``str.isdigit`` takes "²" and "४")."""
    digits = raw.isascii() and raw.isdigit() and len(raw) <= len(str(most))  # int() caps
    if not digits or int(raw) > most:  # strings at 4,300 digits with a ValueError
        raise HttpError(400, f"INVALID_{key.upper()}", f"{key} {raw!r} is not an integer 0..{most}")
    return int(raw)


_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")  # fmt: skip


def valid_host_port(value: str) -> bool:
    """``HOST:PORT`` with a host name or IP address and a port 1..65535 (what a publisher
    can connect to, and nothing else: no path, query, user or spaces)."""
    host, sep, port = value.rpartition(":")
    digits = port.isascii() and port.isdigit() and len(port) <= 5
    if not sep or not digits or not 0 < int(port) < 65536:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOSTNAME.fullmatch(host) is not None


async def _bounded_body(request: web.Request, most: int) -> bytes:
    """The body, refused with 413 beyond ``most`` bytes before it is read when declared."""
    if request.content_length is not None and request.content_length > most:
        raise HttpError(413, "BODY_TOO_BIG", f"{request.content_length} > {most} bytes")
    body = await request.read()
    if len(body) > most:
        raise HttpError(413, "BODY_TOO_BIG", f"{len(body)} > {most} bytes")
    return body


def split_mpub(body: bytes, binary: bool, max_msg: int) -> list[bytes]:
    """/mpub bodies: newline-separated text, or nsqd's binary ``[count]([size][body])*``."""
    if not binary:
        msgs = [m for m in body.split(b"\n") if m]
    else:
        if len(body) < 4:
            raise HttpError(400, "INVALID_BODY", "binary body shorter than its count")
        (count,) = struct.unpack_from(">I", body)
        msgs, pos = [], 4
        for i in range(count):
            if pos + 4 > len(body):
                raise HttpError(400, "INVALID_BODY", f"message {i}: size missing")
            (size,) = struct.unpack_from(">I", body, pos)
            pos += 4
            if size == 0 or pos + size > len(body):
                raise HttpError(400, "INVALID_BODY", f"message {i}: bad size {size}")
            msgs.append(body[pos : pos + size])
            pos += size
        if pos != len(body):
            raise HttpError(400, "INVALID_BODY", "bytes left after the last message")
    if not msgs:
        raise HttpError(400, "MSG_EMPTY")
    for m in msgs:
        if len(m) > max_msg:
            raise HttpError(413, "MSG_TOO_BIG", f"{len(m)} > {max_msg} bytes")
    return msgs


def make_app(broker: Broker) -> web.Application:
    limits = broker.options.limits
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker))

    async def ping(request: web.Request) -> web.Response:
        problem = broker.health()  # nsqd's form: 500 and "NOK - <why>" when unhealthy
        if problem is not None:
            return web.Response(status=500, text=f"NOK - {problem}")
        return web.Response(text="OK")

    async def info(request: web.Request) -> web.Response:
        opts = broker.options
        tcp = broker.tcp_address or (opts.tcp_host, opts.tcp_port)
        return web.json_response(
            {
                "version": broker.version,
                "broadcast_address": tcp[0],
                "hostname": tcp[0],
                "tcp_port": tcp[1],
                "http_port": broker.http_address[1] if broker.http_address else opts.http_port,
                "start_time": broker.started_ns // 1_000_000_000,
                "srtm": {"broker_id": opts.broker_id},
            }
        )

    async def pub(request: web.Request) -> web.Response:
        arrival = time.time_ns()
        topic = _topic_name(request)
        if request.content_length and request.content_length > limits.max_msg_size:
            raise HttpError(413, "MSG_TOO_BIG")
        body = await request.read()
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        if len(body) > limits.max_msg_size:
            raise HttpError(413, "MSG_TOO_BIG")
        publisher = request.query.get("publisher", "")
        if "defer" in request.query:
            defer = request.query["defer"]
            ms = _whole(defer, "defer", limits.max_req_timeout_ms)
            with _pub_failed():
                broker.publish_deferred(topic, body, ms, arrival, publisher)
        else:
            with _pub_failed():
                written = broker.publish(topic, [body], arrival, publisher)
            if written is not None:
                await asyncio.shield(written)  # acknowledged once on disk (the OS)
        return web.Response(text="OK")

    async def mpub(request: web.Request) -> web.Response:
        arrival = time.time_ns()
        topic = _topic_name(request)
        if request.content_length and request.content_length > limits.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        body = await request.read()
        if len(body) > limits.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        binary = request.query.get("binary", "false").lower() in ("true", "1")
        msgs = split_mpub(body, binary, limits.max_msg_size)
        with _pub_failed():
            written = broker.publish(topic, msgs, arrival, request.query.get("publisher", ""))
        if written is not None:
            await asyncio.shield(written)  # acknowledged once on disk (the OS)
        return web.Response(text="OK")

    async def stats(request: web.Request) -> web.Response:
        q = request.query
        doc = stats_document(
            broker,
            q.get("topic") or None,
            q.get("channel") or None,
            q.get("include_clients", "true") != "false",
        )
        if q.get("format") == "json":
            return web.json_response(doc)
        return web.Response(text=_stats_text(doc))

    def topic_action(action: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            name = _topic_name(request)
            if action == "create":
                broker.topic(name)
            elif name not in broker.topics:
                raise HttpError(404, "TOPIC_NOT_FOUND")
            elif action == "delete":
                broker.delete_topic(name)
            elif action == "empty":
                broker.topics[name].empty()
            else:
                broker.pause_topic(name, action == "pause")
            return web.Response(text="OK")

        return handler

    def channel_action(action: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            topic, channel = _topic_name(request), _channel_name(request)
            if action == "create":
                broker.channel(topic, channel)
                return web.Response(text="OK")
            if topic not in broker.topics:
                raise HttpError(404, "TOPIC_NOT_FOUND")
            if channel not in broker.topics[topic].channels:
                raise HttpError(404, "CHANNEL_NOT_FOUND")
            if action == "delete":
                broker.delete_channel(topic, channel)
            elif action == "empty":
                broker.topics[topic].channels[channel].empty()
            else:
                broker.pause_channel(topic, channel, action == "pause")
            return web.Response(text="OK")

        return handler

    async def metrics(request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def bucket_get(request: web.Request) -> web.Response:
        name = _topic_name(request)
        topic = broker.topics.get(name)
        if topic is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        b = topic.bucket
        doc = None if b is None else {"rate": b.rate, "burst": b.burst, "tokens": b.tokens()}
        return web.json_response({"topic": name, "bucket": doc})

    async def bucket_set(request: web.Request) -> web.Response:
        name = _topic_name(request)
        rate, burst = _number(request, "rate"), _number(request, "burst")
        try:
            b = broker.set_bucket(name, rate, burst)
        except (ValueError, OverflowError, ProtocolError) as exc:
            raise HttpError(400, "INVALID_BUCKET", str(exc)) from None
        return web.json_response({"topic": name, "bucket": {"rate": b.rate, "burst": b.burst}})

    async def bucket_delete(request: web.Request) -> web.Response:
        name = _topic_name(request)
        if name not in broker.topics:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        broker.clear_bucket(name)
        return web.json_response({"topic": name, "bucket": None})

    async def migrate(request: web.Request) -> web.Response:
        """Tell a publisher's connections (those that take SRTM orders) to move to ``to``."""
        topic = _topic_name(request)
        q = request.query
        publisher, to = q.get("publisher"), q.get("to")
        if not publisher:
            raise HttpError(400, "MISSING_ARG_PUBLISHER")
        if not to or not valid_host_port(to):
            raise HttpError(400, "INVALID_TO", f"to must be HOST:PORT, got {to!r}")
        version = _whole(q.get("version", "0"), "version", 2**63 - 1)
        order = {"migrate": {"topic": topic, "to": to, "version": version}}
        return web.json_response({"notified": broker.order(publisher, order)})

    async def measure(request: web.Request) -> web.Response:
        """A measurement round: p99 of the estimated end-to-end latency of the topic's
        messages from ``publishers`` (body ``{"publishers": [...]}``; all if absent) over
        ``window_ms`` (1 ms..60 s), answered when the window ends. At most
        ``broker.max_measurements`` rounds run at once (429 beyond); a client that goes
        away ends its round (the server cancels the handler)."""
        topic = _topic_name(request)
        window = _number(request, "window_ms")
        if not MIN_MEASURE_NS <= window * 1_000_000 <= MAX_MEASURE_NS:
            raise HttpError(400, "INVALID_WINDOW_MS", f"window_ms {window} is not in 1..60000")
        pubs = None
        body = await _bounded_body(request, limits.max_msg_size)
        if body:
            try:
                doc = json.loads(body)
            except ValueError:
                raise HttpError(400, "INVALID_BODY", "body must be JSON") from None
            listed = doc.get("publishers") if isinstance(doc, dict) else None
            if listed is not None:
                if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
                    raise HttpError(400, "INVALID_PUBLISHERS", "publishers must be strings")
                pubs = frozenset(listed)
        try:
            m = await broker.measure(topic, pubs, int(window * 1_000_000))
        except MeasurementsBusy as exc:
            raise HttpError(429, "TOO_MANY_MEASUREMENTS", str(exc)) from None
        s = m.latency.summary()
        return web.json_response(
            {"topic": topic, "window_ms": window, "samples": int(s["count"]),
             "p99_ms": s["p99"] / 1e6 if s["count"] else None,
             "p50_ms": s["p50"] / 1e6 if s["count"] else None}
        )  # fmt: skip

    middlewares = [_errors, _auth(broker.options.token)]
    if http_requires_tls(broker.options):
        middlewares.insert(0, _tls_required)
    # No body beyond the largest the protocol takes (an MPUB's) is ever read.
    app = web.Application(middlewares=middlewares, client_max_size=limits.max_body_size + 1024)
    app.router.add_post("/srtm/migrate", migrate)
    app.router.add_post("/srtm/measure", measure)
    app.router.add_get("/ping", ping)
    app.router.add_get("/info", info)
    app.router.add_post("/pub", pub)
    app.router.add_post("/mpub", mpub)
    app.router.add_get("/stats", stats)
    for action in ("create", "delete", "empty", "pause", "unpause"):
        app.router.add_post(f"/topic/{action}", topic_action(action))
        app.router.add_post(f"/channel/{action}", channel_action(action))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/srtm/bucket", bucket_get)
    app.router.add_post("/srtm/bucket", bucket_set)
    app.router.add_delete("/srtm/bucket", bucket_delete)
    return app


def _stats_text(doc: dict[str, object]) -> str:
    lines = [f"nsqd v{doc['version']} (srtm)", f"start_time {doc['start_time']}", ""]
    for t in doc["topics"]:  # type: ignore[attr-defined]
        lines.append(
            f"[{t['topic_name']:<24}] depth: {t['depth']:<5} be-depth: {t['backend_depth']:<5} "
            f"msgs: {t['message_count']:<8}"
        )
        for c in t["channels"]:
            lines.append(
                f"    [{c['channel_name']:<20}] depth: {c['depth']:<5} "
                f"be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} "
                f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8}"
            )
    return "\n".join(lines) + "\n"


async def serve_http(broker: Broker) -> tuple[web.AppRunner, int]:
    """Start the HTTP API; returns the runner (to stop it) and the bound port."""
    opts = broker.options
    require_loopback_without_token(opts.token, [opts.http_host])
    app = make_app(broker)
    # Cancel a handler whose client went away: a measurement round must not outlive it
    # (the other handlers do their work after their last await, so they finish or not).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    opts = broker.options
    site = web.TCPSite(runner, opts.http_host, opts.http_port)
    await site.start()
    port = int(runner.addresses[0][1])
    broker.http_address = (opts.http_host, port)
    if opts.https_port is not None and broker.tls_context is not None:
        # nsqd's --https-address: the same API, with the TCP protocol's certificate.
        secure = web.TCPSite(
            runner, opts.https_host, opts.https_port, ssl_context=broker.tls_context
        )
        await secure.start()
        broker.https_address = (opts.https_host, int(runner.addresses[-1][1]))
    return runner, port
