"""nsqd's HTTP API (aiohttp), plus /metrics and SRTM's ``/srtm/*`` endpoints.

As in nsqd's http.go, the handlers are named methods (``BrokerHttp``) and ``ROUTES`` is the
one table of ``(method, path, handler)`` the app is built from; a method a path does not
take is answered 405. The same table, with the documents each route takes and gives
(``srtm.broker.documents``), generates the OpenAPI document served at /srtm/openapi.json.

With a token (``BrokerOptions.token``) every mutating ``/srtm/*`` request needs
``Authorization: Bearer <token>``; nsqd's own endpoints stay open, as in nsqd, for NSQ's
tools. Numbers must be finite, bodies and measurement rounds are bounded. Requests are
read and refused by ``srtm.broker.http_requests``; the refusals' answers, the token's
middleware and the route binding are ``srtm.httpkit``'s, shared with the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from srtm.broker.accept import LISTEN_BACKLOG
from srtm.broker.documents import (
    AdmissionAnswer,
    AdmissionBody,
    AdmissionClassDoc,
    AdmissionDoc,
    ArmAnswer,
    ArmQuery,
    BoundSetDoc,
    BucketAnswer,
    BucketDoc,
    BucketNowDoc,
    BucketReading,
    BucketSetAnswer,
    BucketSetQuery,
    ChannelQuery,
    ConfigValue,
    Doc,
    ErrorDoc,
    HoldQuery,
    InfoDoc,
    InfoSrtmDoc,
    MeasureAnswer,
    MeasureBody,
    MeasureQuery,
    MigrateAnswer,
    MigrateDoc,
    MigrateQuery,
    MpubQuery,
    OrderDoc,
    PubQuery,
    RouteBody,
    RouteDoc,
    StatsDoc,
    StatsQuery,
    TopicQuery,
    flag,
    query_refusals,
)
from srtm.broker.handoff import ARM_TTL_S
from srtm.broker.http_requests import (
    bounded_body,
    defer_param,
    parse_body,
    parse_query,
    split_mpub,
    topic_param,
)
from srtm.broker.measurement import MeasurementsBusy
from srtm.broker.metrics import BrokerCollector
from srtm.broker.relay import route_document
from srtm.broker.report import admission_rows, bucket_now, memory_document, stats_sliced
from srtm.broker.routes import Forward, Replicas, TopicRoute
from srtm.broker.state import LeaseExpired, LimitReached
from srtm.broker.tls import http_requires_tls
from srtm.httpkit import (
    EpochFence,
    Handler,
    HttpError,
    add_routes,
    empty,
    epoch_fenced,
    error_middleware,
    error_response,
    has_token,
    ok,
    push_order,
    token_required,
    unauthorized,
)
from srtm.jsondoc import parse as parse_json
from srtm.openapi import OpenApiDoc, Route, document
from srtm.protocol import ProtocolError, errors
from srtm.protocol.session import (
    MAX_DEFLATE_LEVEL,
    MAX_HEARTBEAT_MS,
    MAX_OUTPUT_BUFFER_SIZE,
    MAX_OUTPUT_BUFFER_TIMEOUT_MS,
)
from srtm.ratelimit.overflow import DEFAULT_BOUND, check_bound
from srtm.security import require_loopback_without_token

if TYPE_CHECKING:
    from srtm.broker.admission import Admission
    from srtm.broker.broker import Broker

#: Methods that change nothing: open even when the broker has a token.
READS = frozenset({"GET", "HEAD", "OPTIONS"})
#: nsqd's endpoints that drop a topic's or a channel's messages or stop their delivery:
#: under --protect-managed, on a managed topic, they need the token too.
DESTRUCTIVE = frozenset(
    f"/{kind}/{action}" for kind in ("topic", "channel")
    for action in ("delete", "empty", "pause", "unpause")
)  # fmt: skip


def needs_token(method: str, path: str) -> bool:
    """Mutating ``/srtm/*`` requests need the token; nsqd's own endpoints stay open, as in
    nsqd, for NSQ's tools (but see ``_protect_managed``: on a managed topic, the
    destructive ones need it too). (The auth middleware and the document both ask this.)"""
    return path.startswith("/srtm/") and method not in READS


def _json(doc: Doc) -> web.Response:
    return web.json_response(doc.model_dump())


#: nsqd's log levels by name (its lg.ParseLogLevel, any case), and Python's for each.
LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
_PY_LEVELS = {
    1: logging.DEBUG,
    2: logging.INFO,
    3: logging.WARNING,
    4: logging.ERROR,
    5: logging.CRITICAL,
}
_SRTM_LOG = logging.getLogger("srtm")


def _log_level() -> int:
    """The srtm logger's level as nsqd's number (info where it is not set)."""
    level = _SRTM_LOG.getEffectiveLevel()
    return max((n for n, py in _PY_LEVELS.items() if py <= level), default=1)


def _limit(err: LimitReached) -> HttpError:
    """--max-topics / --max-channels-per-topic: 403 with the limit's code."""
    return HttpError(403, err.http_code, err.message)


def _protect_managed(broker: Broker, token: str) -> Middleware:
    """--protect-managed: nsqd's ``DESTRUCTIVE`` endpoints need the token on a topic the
    controller manages here (its tenant's acknowledged messages and SLO are at stake);
    on any other topic they stay open, as nsqd's, for NSQ's tools."""

    @web.middleware
    async def protect(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method == "POST"
            and request.path in DESTRUCTIVE
            and broker.shares.managed(name := request.query.get("topic", ""))
            and not has_token(request, token)
        ):
            detail = f"topic {name} is managed: {request.path} needs the cluster token"
            return unauthorized(detail, challenge=True)
        return await handler(request)

    return protect


@web.middleware
async def _tls_required(request: web.Request, handler: Handler) -> web.StreamResponse:
    """nsqd's --tls-required=true: the plain HTTP API answers 403 TLS_REQUIRED."""
    if not request.secure:
        return error_response(403, "TLS_REQUIRED")
    return await handler(request)


@contextlib.contextmanager
def _pub_failed() -> Iterator[None]:
    """A publish the broker refuses (a disk queue cannot write): 503 E_PUB_FAILED."""
    try:
        yield
    except ProtocolError as err:
        if err.code != errors.E_PUB_FAILED or isinstance(err, LimitReached):
            raise  # a limit is the client's 403, not the disk's 503
        raise HttpError(503, err.code, err.message) from err


#: The most a /srtm/admission body may be (MAX_CLASSES classes fit well within it).
_ADMISSION_BODY = 64 * 1024
_ROUTE_BODY = 4 << 20


def _classes(adm: Admission | None) -> list[AdmissionClassDoc]:
    return [AdmissionClassDoc(**row) for row in admission_rows(adm)]


class BrokerHttp:
    """The HTTP API's handlers, one method per route of ``ROUTES``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.limits = broker.options.limits
        self.registry = CollectorRegistry()
        self.registry.register(BrokerCollector(broker))
        #: /config's nsqlookupd_tcp_addresses: kept and answered, as nsqd keeps them, but
        #: an SRTM broker registers with its controller, not with an nsqlookupd.
        self.lookupd_tcp_addresses: list[str] | None = []

    def _known_topic(self, request: web.Request) -> str:
        name = parse_query(TopicQuery, request.query).topic
        if name not in self.broker.topics:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        return name

    def _known_channel(self, request: web.Request) -> tuple[str, str]:
        q = parse_query(ChannelQuery, request.query)
        if q.topic not in self.broker.topics:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        if q.channel not in self.broker.topics[q.topic].channels:
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        return q.topic, q.channel

    # -- nsqd's ----------------------------------------------------------------------------
    async def ping(self, request: web.Request) -> web.Response:
        """Health: OK, or 500 and "NOK - <why>" (nsqd's form)."""
        problem = self.broker.health()
        if problem is not None:
            return web.Response(status=500, text=f"NOK - {problem}")
        return ok()

    async def info(self, request: web.Request) -> web.Response:
        """Version and addresses."""
        broker, opts = self.broker, self.broker.options
        tcp = broker.tcp_address or (opts.tcp_host, opts.tcp_port)
        return _json(
            InfoDoc(
                version=broker.version,
                broadcast_address=tcp[0],
                hostname=tcp[0],
                tcp_port=tcp[1],
                http_port=broker.http_address[1] if broker.http_address else opts.http_port,
                start_time=broker.started_ns // 1_000_000_000,
                max_heartbeat_interval=MAX_HEARTBEAT_MS * 1_000_000,
                max_output_buffer_size=MAX_OUTPUT_BUFFER_SIZE,
                max_output_buffer_timeout=MAX_OUTPUT_BUFFER_TIMEOUT_MS * 1_000_000,
                max_deflate_level=MAX_DEFLATE_LEVEL,
                srtm=InfoSrtmDoc(broker_id=opts.broker_id),
            )
        )

    async def pub(self, request: web.Request) -> web.Response:
        """Publish the body as one message (after ``defer`` ms when given).

        Answered once the message is accepted (on disk where it overflowed to disk)."""
        arrival = time.time_ns()
        limits, query = self.limits, request.query
        topic = topic_param(query)
        if request.content_length and request.content_length > limits.max_msg_size:
            raise HttpError(413, "MSG_TOO_BIG")
        body = await request.read()
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        if len(body) > limits.max_msg_size:
            raise HttpError(413, "MSG_TOO_BIG")
        publisher = query.get("publisher", "")
        with _pub_failed():
            await self.broker.policing.within_bound(topic)
        if "defer" in query:
            ms = defer_param(query["defer"], limits.max_req_timeout_ms)
            with _pub_failed():
                written = self.broker.publish_deferred(topic, body, ms, arrival, publisher)
        else:
            with _pub_failed():
                written = self.broker.publish(topic, [body], arrival, publisher)
        if written is not None:
            await asyncio.shield(written)  # acknowledged once on disk (the OS) or relayed
        return ok()

    async def mpub(self, request: web.Request) -> web.Response:
        """Publish several messages: one per line, or nsqd's binary form."""
        arrival = time.time_ns()
        limits, query = self.limits, request.query
        topic = topic_param(query)
        if request.content_length and request.content_length > limits.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        body = await request.read()
        if len(body) > limits.max_body_size:
            raise HttpError(413, "BODY_TOO_BIG")
        msgs = await split_mpub(body, flag(query.get("binary", "false")), limits.max_msg_size)
        with _pub_failed():
            await self.broker.policing.within_bound(topic)
            written = self.broker.publish(topic, msgs, arrival, query.get("publisher", ""))
        if written is not None:
            await asyncio.shield(written)  # acknowledged once on disk (the OS)
        return ok()

    async def stats(self, request: web.Request) -> web.Response:
        """Topics, channels and clients (nsqd's document), and SRTM's section."""
        q = parse_query(StatsQuery, request.query)
        doc = await stats_sliced(self.broker, q.topic, q.channel, q.include_clients)
        if q.include_mem:
            doc = {**doc, "memory": memory_document()}
            doc["producers"] = doc.pop("producers")  # after memory, as nsqd's
            doc["srtm"] = doc.pop("srtm")
        if q.format == "json":
            return web.json_response(doc)
        return web.Response(text=_stats_text(doc))

    async def topic_create(self, request: web.Request) -> web.Response:
        """Create a topic (nothing changes if it exists)."""
        self.broker.topic(parse_query(TopicQuery, request.query).topic)
        return empty()

    async def topic_delete(self, request: web.Request) -> web.Response:
        """Delete a topic, its channels and their messages."""
        self.broker.delete_topic(self._known_topic(request))
        return empty()

    async def topic_empty(self, request: web.Request) -> web.Response:
        """Drop the messages waiting in the topic."""
        self.broker.topics[self._known_topic(request)].empty()
        return empty()

    async def topic_pause(self, request: web.Request) -> web.Response:
        """Stop copying the topic's messages to its channels."""
        self.broker.pause_topic(self._known_topic(request), True)
        return empty()

    async def topic_unpause(self, request: web.Request) -> web.Response:
        """Copy the topic's messages to its channels again."""
        self.broker.pause_topic(self._known_topic(request), False)
        return empty()

    async def channel_create(self, request: web.Request) -> web.Response:
        """Create a channel of an existing topic (nothing changes if it exists)."""
        q = parse_query(ChannelQuery, request.query)
        if q.topic not in self.broker.topics:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        self.broker.channel(q.topic, q.channel)
        return empty()

    async def channel_delete(self, request: web.Request) -> web.Response:
        """Delete a channel and its messages."""
        self.broker.delete_channel(*self._known_channel(request))
        return empty()

    async def channel_empty(self, request: web.Request) -> web.Response:
        """Drop the messages waiting in the channel."""
        topic, channel = self._known_channel(request)
        self.broker.topics[topic].channels[channel].empty()
        return empty()

    async def channel_pause(self, request: web.Request) -> web.Response:
        """Stop delivering the channel's messages."""
        self.broker.pause_channel(*self._known_channel(request), True)
        return empty()

    async def channel_unpause(self, request: web.Request) -> web.Response:
        """Deliver the channel's messages again."""
        self.broker.pause_channel(*self._known_channel(request), False)
        return empty()

    async def config_get(self, request: web.Request) -> web.Response:
        """An option's value: nsqlookupd_tcp_addresses, or log_level (nsqd's number)."""
        return web.json_response(self._config_value(request.match_info["opt"]))

    async def config_put(self, request: web.Request) -> web.Response:
        """Change an option: nsqlookupd_tcp_addresses (a JSON list of HOST:PORT), or
        log_level (debug, info, warn, error, fatal); answers its new value."""
        opt = request.match_info["opt"]
        body = await request.read()
        if not body or len(body) > self.limits.max_msg_size:
            raise HttpError(413, "INVALID_VALUE")
        if opt == "nsqlookupd_tcp_addresses":
            try:
                addresses = parse_json(body)
            except ValueError as exc:
                raise HttpError(400, "INVALID_VALUE", str(exc)) from None
            ok = addresses is None or (
                isinstance(addresses, list) and all(isinstance(a, str) for a in addresses)
            )
            if not ok:  # JSON, not a list: nsqd's answer exactly (test_nsqd_parity)
                raise HttpError(400, "INVALID_VALUE")
            self.lookupd_tcp_addresses = addresses
        elif opt == "log_level":
            level = LOG_LEVELS.get(body.decode(errors="replace").lower())
            if level is None:
                raise HttpError(400, "INVALID_VALUE")
            _SRTM_LOG.setLevel(_PY_LEVELS[level])
        else:
            raise HttpError(400, "INVALID_OPTION")
        return web.json_response(self._config_value(opt))

    def _config_value(self, opt: str) -> list[str] | int | None:
        if opt == "nsqlookupd_tcp_addresses":
            return self.lookupd_tcp_addresses
        if opt == "log_level":
            return _log_level()
        raise HttpError(400, "INVALID_OPTION", "SRTM has nsqlookupd_tcp_addresses and log_level")

    # -- SRTM's ----------------------------------------------------------------------------
    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus metrics."""
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def bucket_get(self, request: web.Request) -> web.Response:
        """The topic's sub-bucket and its tokens now (null: none)."""
        name = self._known_topic(request)
        self.broker.shares.lease_ok()  # never a stale bucket past the lease
        now = bucket_now(self.broker.topics[name].bucket)
        bucket = None if now is None else BucketNowDoc(**now)
        return _json(BucketReading(topic=name, bucket=bucket))

    async def bucket_set(self, request: web.Request) -> web.Response:
        """Give the topic a sub-bucket, or retune it keeping its state.

        The broker refuses a bucket it cannot schedule (INVALID_BUCKET names rate or burst).
        With ``handoff`` and ``token``, a decrease hands the share it gave up over to that
        broker (a HANDOFF on the relay link, after all this broker relayed to it before);
        a route in the body is set first, in the same step (even if the bucket is refused:
        it does not depend on it)."""
        q = parse_query(BucketSetQuery, request.query)
        route = await self._handoff_route(request, q.topic, q.handoff, q.token)
        self._in_order(request, q.topic)
        if route is not None:  # whatever becomes of the share: a route does not need it
            self.broker.relay.set_route(route)
        try:
            b = self.broker.shares.set_bucket(q.topic, q.rate, q.burst)
        except (ValueError, OverflowError, ProtocolError) as exc:
            raise HttpError(400, "INVALID_BUCKET", str(exc)) from None
        except LeaseExpired:
            raise HttpError(409, "LEASE_EXPIRED") from None
        bound = self.broker.topics[q.topic].bound
        if q.max_wait_ms is not None or q.overflow is not None:
            was = bound or DEFAULT_BOUND
            bound = check_bound(
                was.max_wait_ms if q.max_wait_ms is None else q.max_wait_ms,
                was.overflow if q.overflow is None else q.overflow,
            )
            self.broker.policing.set_bound(q.topic, bound)
        handed = self.broker.handoffs.send(q.topic, q.handoff, q.token)
        bucket = BucketDoc(rate=b.rate, burst=b.burst)
        bound_doc = None if bound is None else BoundSetDoc(
            max_wait_ms=bound.max_wait_ms, overflow=bound.overflow.value
        )  # fmt: skip
        return _json(BucketSetAnswer(topic=q.topic, bucket=bucket, handoff=handed, bound=bound_doc))

    async def bucket_hold(self, request: web.Request) -> web.Response:
        """Hold the topic: the controller manages it but gives this broker no share. What
        arrives is accepted and kept until a sub-bucket comes (then released at its pace)
        or the topic is unmanaged (then at once); a sub-bucket it had goes. Creates it.
        With ``handoff`` and ``token``: as POST /srtm/bucket's decrease."""
        q = parse_query(HoldQuery, request.query)
        route = await self._handoff_route(request, q.topic, q.handoff, q.token)
        self._in_order(request, q.topic)
        if route is not None:
            self.broker.relay.set_route(route)
        self.broker.shares.hold(q.topic)
        handed = self.broker.handoffs.send(q.topic, q.handoff, q.token)
        return _json(BucketAnswer(topic=q.topic, bucket=None, held=True, handoff=handed))

    async def bucket_arm(self, request: web.Request) -> web.Response:
        """Arm a share of the topic for a handoff: nothing changes here until a relay link
        sends HANDOFF with this token (the broker giving the share up, after its
        decrease); then it is applied as POST /srtm/bucket would. One per topic; good once
        and for a few seconds; a POST /srtm/bucket, hold or DELETE of the topic clears it."""
        q = parse_query(ArmQuery, request.query)
        self._in_order(request, q.topic)
        try:
            self.broker.handoffs.arm(q.topic, q.rate, q.burst, q.token)
        except (ValueError, OverflowError) as exc:
            raise HttpError(400, "INVALID_BUCKET", str(exc)) from None
        bucket = BucketDoc(rate=q.rate, burst=q.burst)
        return _json(ArmAnswer(topic=q.topic, bucket=bucket, expires_in_s=ARM_TTL_S))

    async def _handoff_route(
        self, request: web.Request, topic: str, handoff: str | None, token: str | None
    ) -> TopicRoute | None:
        """The route a share change carries in its body (None: none), checked before
        anything changes; and its handoff parameters, both or neither."""
        if (handoff is None) != (token is None):
            raise HttpError(400, "INVALID_HANDOFF", "handoff and token go together")
        body = await bounded_body(request, _ROUTE_BODY)
        if not body:
            return None
        route = self._route_of(body)
        if route.topic != topic:
            raise HttpError(400, "INVALID_BODY", "the route is of another topic")
        return route

    def _in_order(self, request: web.Request, topic: str) -> None:
        """409 ``STALE_PUSH`` to a share change its controller sent before one this
        broker already took (``Shares.admit``): it is old news, and nothing changes."""
        order = push_order(request)
        if not self.broker.shares.admit(topic, order):
            raise HttpError(409, "STALE_PUSH", f"order {order} is older than one taken")

    async def bucket_delete(self, request: web.Request) -> web.Response:
        """Unmanage the topic (no sub-bucket, no hold): what waits is released at once.
        A topic this broker does not have is not created (404)."""
        name = self._known_topic(request)
        self._in_order(request, name)
        self.broker.shares.clear(name)
        return _json(BucketAnswer(topic=name, bucket=None))

    async def admission_get(self, request: web.Request) -> web.Response:
        """The topic's consumer classes: admitted (null: unlimited) and connected counts.
        Any valid topic name is answered (counts may be set before the topic exists)."""
        name = parse_query(TopicQuery, request.query).topic
        adm = self.broker.admission.get(name)
        order = [] if adm is None else adm.order
        return _json(AdmissionDoc(topic=name, order=order, classes=_classes(adm)))

    async def admission_set(self, request: web.Request) -> web.Response:
        """Set the topic's admitted consumers per class and the classes' importance.

        A class not listed is unlimited. Consumers beyond a lowered count are disconnected
        at once, the lowest class first and the newest of a class first; a SUB beyond its
        class's count is refused (E_SUB_FAILED, not fatal). Does not create the topic."""
        name = parse_query(TopicQuery, request.query).topic
        body = await bounded_body(request, _ADMISSION_BODY)
        b = parse_body(AdmissionBody, body)
        adm, out = self.broker.set_admission(name, dict(b.classes), list(b.order))
        return _json(
            AdmissionAnswer(topic=name, order=adm.order, classes=_classes(adm), disconnected=out)
        )

    async def migrate(self, request: web.Request) -> web.Response:
        """Tell a publisher's connections (those that take SRTM orders) to move to ``to``."""
        q = parse_query(MigrateQuery, request.query)
        order = OrderDoc(migrate=MigrateDoc(topic=q.topic, to=q.to, version=q.version))
        return _json(MigrateAnswer(notified=self.broker.order(q.publisher, order.model_dump())))

    async def route_get(self, request: web.Request) -> web.Response:
        """The topic's relay route and its counters (404 ROUTE_NOT_FOUND without one)."""
        name = parse_query(TopicQuery, request.query).topic
        relay = self.broker.relay
        route = relay.get_route(name)
        if route is None:
            raise HttpError(404, "ROUTE_NOT_FOUND", f"topic {name!r} has no route")
        return _json(RouteDoc(**route_document(route, relay.clock())))

    async def route_set(self, request: web.Request) -> web.Response:
        """Set the topic's relay route, replacing any: forwarding (what is published here
        goes to the plan's broker; ends after ``grace_s`` without any) and/or replication
        (every message published here is copied once to each peer; a channel is delivered
        only by its home replica). Creates the topic, and the channels homed here."""
        route = self._route_of(await bounded_body(request, _ROUTE_BODY))
        relay = self.broker.relay
        route = relay.set_route(route)
        return _json(RouteDoc(**route_document(route, relay.clock())))

    def _route_of(self, body: bytes) -> TopicRoute:
        """The route a RouteBody describes (refused: 400), not yet set."""
        b = parse_body(RouteBody, body)
        forward = replicas = None
        if b.forward is not None:
            forward = Forward(b.forward.to, dict(b.forward.publishers), b.forward.grace_s)
        if (r := b.replicas) is not None:
            known = set(r.peers) | {b.self}
            strangers = sorted({r.primary, *r.homes.values()} - known)
            if strangers:
                raise HttpError(
                    400, "INVALID_REPLICAS", f"replicas: {strangers[0]!r} is not a peer or self"
                )
            replicas = Replicas(dict(r.peers), r.primary, dict(r.homes))
        return TopicRoute(b.topic, b.self, forward, replicas, self.broker.relay.clock())

    async def route_delete(self, request: web.Request) -> web.Response:
        """Remove the topic's route: what is published here is accepted here, every
        channel delivered (404 ROUTE_NOT_FOUND without one)."""
        name = parse_query(TopicQuery, request.query).topic
        relay = self.broker.relay
        route = relay.remove_route(name)
        if route is None:
            raise HttpError(404, "ROUTE_NOT_FOUND", f"topic {name!r} has no route")
        return _json(RouteDoc(**route_document(route, relay.clock())))

    async def measure(self, request: web.Request) -> web.Response:
        """A measurement round: p50 and p99 of the estimated end-to-end latency.

        Of the topic's messages from the body's ``publishers`` (all if absent) over
        ``window_ms``, answered when the window ends. The window opens once none of the
        topic's messages waits for tokens (at most 5 s later). At most
        ``broker.measurements.limit`` rounds run or wait at once (429 beyond); a client
        that goes away ends its round (the server cancels the handler)."""
        q = parse_query(MeasureQuery, request.query)
        pubs = None
        body = await bounded_body(request, self.limits.max_msg_size)
        if body:
            listed = parse_body(MeasureBody, body).publishers
            pubs = None if listed is None else frozenset(listed)
        try:
            m = await self.broker.measure(q.topic, pubs, int(q.window_ms * 1_000_000))
        except MeasurementsBusy as exc:
            raise HttpError(429, "TOO_MANY_MEASUREMENTS", str(exc)) from None
        s, lag = m.latency.summary(), m.lag.summary()
        return _json(
            MeasureAnswer(topic=q.topic, window_ms=q.window_ms, samples=int(s["count"]),
                          p99_ms=s["p99"] / 1e6 if s["count"] else None,
                          p50_ms=s["p50"] / 1e6 if s["count"] else None,
                          loop_lag_p99_ms=lag["p99"] / 1e6 if lag["count"] else None,
                          settle_ms=m.settle_ns / 1e6, settled=m.settled)
        )  # fmt: skip

    async def openapi(self, request: web.Request) -> web.Response:
        """This API's OpenAPI 3.1 document, generated from ROUTES."""
        return web.json_response(api_document().model_dump())


_TEXT = "text/plain"  # nsqd's "OK", and /stats without format=json
_BYTES = "application/octet-stream"  # message bodies, as they are
_NO_TOPIC = {404: "TOPIC_NOT_FOUND"}
_NO_CHANNEL = {404: "TOPIC_NOT_FOUND, CHANNEL_NOT_FOUND"}
#: ``DESTRUCTIVE`` endpoints on a managed topic without the token (--protect-managed).
_MANAGED = {401: "E_UNAUTHORIZED: a managed topic, without the cluster token"}
_FULL = {403: "TOO_MANY_TOPICS, TOO_MANY_CHANNELS"}  # --max-topics, --max-channels-per-topic
_PUB = {**_FULL, 503: "E_PUB_FAILED"}
_H = BrokerHttp
_ROUTE_REFUSALS = ("INVALID_BODY, MISSING_ARG_TOPIC, INVALID_TOPIC, MISSING_ARG_SELF, "
                   "INVALID_SELF, INVALID_FORWARD, INVALID_REPLICAS")  # fmt: skip

#: The HTTP API: every route, in nsqd's http.go order, then SRTM's.
ROUTES: tuple[Route, ...] = (
    Route("GET", "/ping", _H.ping,
          text=_TEXT),
    Route("GET", "/info", _H.info,
          answer=InfoDoc),
    Route("POST", "/pub", _H.pub,
          query=PubQuery, body=_BYTES, text=_TEXT,
          errors={400: "MSG_EMPTY", 413: "MSG_TOO_BIG", **_PUB}),
    Route("POST", "/mpub", _H.mpub,
          query=MpubQuery, body=_BYTES, text=_TEXT,
          errors={400: "MSG_EMPTY, INVALID_BODY", 413: "BODY_TOO_BIG, MSG_TOO_BIG", **_PUB}),
    Route("GET", "/stats", _H.stats,
          query=StatsQuery, answer=StatsDoc, text=_TEXT),
    Route("POST", "/topic/create", _H.topic_create,
          query=TopicQuery, errors=_FULL),
    Route("POST", "/topic/delete", _H.topic_delete,
          query=TopicQuery, errors={**_MANAGED, **_NO_TOPIC}),
    Route("POST", "/topic/empty", _H.topic_empty,
          query=TopicQuery, errors={**_MANAGED, **_NO_TOPIC}),
    Route("POST", "/topic/pause", _H.topic_pause,
          query=TopicQuery, errors={**_MANAGED, **_NO_TOPIC}),
    Route("POST", "/topic/unpause", _H.topic_unpause,
          query=TopicQuery, errors={**_MANAGED, **_NO_TOPIC}),
    Route("POST", "/channel/create", _H.channel_create,
          query=ChannelQuery, errors={**_FULL, **_NO_TOPIC}),
    Route("POST", "/channel/delete", _H.channel_delete,
          query=ChannelQuery, errors={**_MANAGED, **_NO_CHANNEL}),
    Route("POST", "/channel/empty", _H.channel_empty,
          query=ChannelQuery, errors={**_MANAGED, **_NO_CHANNEL}),
    Route("POST", "/channel/pause", _H.channel_pause,
          query=ChannelQuery, errors={**_MANAGED, **_NO_CHANNEL}),
    Route("POST", "/channel/unpause", _H.channel_unpause,
          query=ChannelQuery, errors={**_MANAGED, **_NO_CHANNEL}),
    Route("GET", "/config/{opt}", _H.config_get,
          answer=ConfigValue, errors={400: "INVALID_OPTION"}),
    Route("PUT", "/config/{opt}", _H.config_put,
          body=_TEXT, answer=ConfigValue,
          errors={400: "INVALID_OPTION, INVALID_VALUE", 413: "INVALID_VALUE"}),
    Route("GET", "/metrics", _H.metrics,
          text=CONTENT_TYPE_LATEST),
    Route("GET", "/srtm/bucket", _H.bucket_get,
          query=TopicQuery, answer=BucketReading, errors=_NO_TOPIC),
    Route("POST", "/srtm/bucket", _H.bucket_set,
          query=BucketSetQuery, body=RouteBody, body_required=False, answer=BucketSetAnswer,
          errors={400: "INVALID_BUCKET, INVALID_HANDOFF, BAD_ORDER, " + _ROUTE_REFUSALS,
                  409: "LEASE_EXPIRED, STALE_PUSH", 413: "BODY_TOO_BIG"}),
    Route("POST", "/srtm/bucket/hold", _H.bucket_hold,
          query=HoldQuery, body=RouteBody, body_required=False, answer=BucketAnswer,
          errors={**_FULL, 400: "INVALID_HANDOFF, BAD_ORDER, " + _ROUTE_REFUSALS,
                  409: "STALE_PUSH", 413: "BODY_TOO_BIG"}),
    Route("POST", "/srtm/bucket/arm", _H.bucket_arm,
          query=ArmQuery, answer=ArmAnswer,
          errors={400: "INVALID_BUCKET, BAD_ORDER", 409: "STALE_PUSH"}),
    Route("DELETE", "/srtm/bucket", _H.bucket_delete,
          query=TopicQuery, answer=BucketAnswer,
          errors={**_NO_TOPIC, 400: "BAD_ORDER", 409: "STALE_PUSH"}),
    Route("GET", "/srtm/admission", _H.admission_get,
          query=TopicQuery, answer=AdmissionDoc),
    Route("POST", "/srtm/admission", _H.admission_set,
          query=TopicQuery, body=AdmissionBody, answer=AdmissionAnswer,
          errors={400: "INVALID_BODY, MISSING_ARG_CLASSES, INVALID_CLASSES, INVALID_ORDER",
                  413: "BODY_TOO_BIG"}),
    Route("POST", "/srtm/migrate", _H.migrate,
          query=MigrateQuery, answer=MigrateAnswer),
    Route("GET", "/srtm/route", _H.route_get,
          query=TopicQuery, answer=RouteDoc, errors={404: "ROUTE_NOT_FOUND"}),
    Route("POST", "/srtm/route", _H.route_set,
          body=RouteBody, answer=RouteDoc,
          errors={400: _ROUTE_REFUSALS, 413: "BODY_TOO_BIG"}),
    Route("DELETE", "/srtm/route", _H.route_delete,
          query=TopicQuery, answer=RouteDoc, errors={404: "ROUTE_NOT_FOUND"}),
    Route("POST", "/srtm/measure", _H.measure,
          query=MeasureQuery, body=MeasureBody, body_required=False, answer=MeasureAnswer,
          errors={400: "INVALID_BODY, INVALID_PUBLISHERS", 413: "BODY_TOO_BIG",
                  429: "TOO_MANY_MEASUREMENTS"}),
    Route("GET", "/srtm/openapi.json", _H.openapi,
          answer=OpenApiDoc),
)  # fmt: skip


@functools.cache
def api_document() -> OpenApiDoc:
    """The OpenAPI document of ROUTES (built once: it only changes with the code)."""
    return document(
        ROUTES,
        title="SRTM broker",
        needs_token=needs_token,
        error=ErrorDoc,
        query_refusals=query_refusals,
    )


def make_app(broker: Broker) -> web.Application:
    """ROUTES bound to one ``BrokerHttp``, behind the error, token and TLS middlewares."""
    handlers = BrokerHttp(broker)
    opts = broker.options
    middlewares = [
        error_middleware(LimitReached, _limit, allow_separator=","),
        token_required(opts.token, needs_token, challenge=True),
        epoch_fenced(EpochFence()),  # after the token: only the cluster's epochs count
    ]
    if opts.protect_managed and opts.token is not None:
        middlewares.append(_protect_managed(broker, opts.token))
    if http_requires_tls(broker.options):
        middlewares.insert(0, _tls_required)
    # No body beyond the largest the protocol takes (an MPUB's) is ever read.
    limit = broker.options.limits.max_body_size + 1024
    app = web.Application(middlewares=middlewares, client_max_size=limit)
    add_routes(app, ROUTES, handlers)
    return app


def _stats_text(doc: dict[str, Any]) -> str:
    lines = [f"nsqd v{doc['version']} (srtm)", f"start_time {doc['start_time']}", ""]
    for t in doc["topics"]:
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
    site = web.TCPSite(runner, opts.http_host, opts.http_port, backlog=LISTEN_BACKLOG)
    await site.start()
    port = int(runner.addresses[0][1])
    broker.http_address = (opts.http_host, port)
    if opts.https_port is not None and broker.tls_context is not None:
        # nsqd's --https-address: the same API, with the TCP protocol's certificate.
        secure = web.TCPSite(
            runner, opts.https_host, opts.https_port, ssl_context=broker.tls_context,
            backlog=LISTEN_BACKLOG,
        )  # fmt: skip
        await secure.start()
        broker.https_address = (opts.https_host, int(runner.addresses[-1][1]))
    return runner, port
