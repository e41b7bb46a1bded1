"""The controller's HTTP API: one route table, ``ROUTES`` (as nsqd's http.go), from which
both the aiohttp app and the OpenAPI document are built, its handlers named methods of
``ControllerAPI`` (brokers, the controller's own, the console), ``TopicsApi``
(``srtm.control.topics_api``) and ``Lookupd`` (``srtm.control.lookupd``). nsqlookupd's
routes (/lookup, /topics, /nodes, /ping, /info) answer as nsqlookupd does, so NSQ readers
given the controller find every broker.

Every refusal is ``{"message": ...}`` with its status; every request but a read needs
the cluster token when the controller has one (401 ``E_UNAUTHORIZED``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from srtm.control import console
from srtm.control.actions import Hold, SetBucket
from srtm.control.documents import (
    AssignQuery,
    BrokerReport,
    Brokers,
    ChannelList,
    ChannelParams,
    Debug,
    Deleted,
    Deregistered,
    Error,
    Info,
    Lookup,
    Move,
    NewPublishers,
    NewTopic,
    Nodes,
    Plan,
    PublisherAssignment,
    Registered,
    Registration,
    ReplicaCount,
    Taken,
    TombstoneParams,
    TopicChange,
    TopicList,
    TopicParam,
    TopicStatus,
    UtilityRun,
    parse,
)
from srtm.control.handlers import Service, read_json, saved, to_leader
from srtm.control.lookupd import Lookupd, nsq_content_type
from srtm.control.topics_api import TopicsApi
from srtm.control.validate import ControlError
from srtm.httpkit import Handler, HttpError, add_routes, error_middleware, ok, token_required
from srtm.openapi import OpenApiDoc, Route, document

log = logging.getLogger("srtm.control")

#: What a request may do without the cluster token: read.
READ_METHODS = ("GET", "HEAD")


def needs_token(method: str, path: str) -> bool:
    """Every request but a read needs ``Authorization: Bearer <token>`` (when the
    controller has one), whatever its path."""
    return method not in READ_METHODS


class ControllerAPI:
    """The handlers of the brokers' routes, the controller's own and the console's."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.ctrl = service.ctrl
        #: The console's reads of the brokers' /stats (closed with the app).
        self.latency = console.LatencyReader()

    # -- brokers ---------------------------------------------------------------------------
    async def register(self, request: web.Request) -> web.Response:
        """Register a broker (again after a restart)."""
        doc = parse(Registration, await read_json(request))
        actions = self.ctrl.register(
            doc.id, doc.tcp_address, doc.http_address, doc.mcap, time.monotonic(), doc.host
        )
        # Its own shares and holds go in the answer, not in pushes: it applies them on
        # receipt (a push may reach it first, while its lease has lapsed, and be refused).
        own = [a for a in actions if isinstance(a, SetBucket | Hold) and a.broker == doc.id]
        rest = [a for a in actions if a not in own]
        await saved(self.service.save_state(), self.service.execute(rest))
        # A topic whose share change is on its way is held here: its share comes by the
        # change's push, after the other brokers' decreases (the answer's would not wait).
        buckets, held = self.ctrl.shares(doc.id)
        moving = sorted(n for n in buckets if not self.service.in_place(n))
        buckets = {n: p for n, p in buckets.items() if n not in moving}
        held = held + moving
        return web.json_response({
            "id": doc.id, "registered": True, "lease_s": self.ctrl.lease_s,
            "buckets": {n: self.ctrl.bucket_doc(n, p) for n, p in buckets.items()},
            "held": held,
            # With etcd: where it watches brokers' liveness keys (a broker checks it).
            "live_prefix": None if self.ctrl.live is None else self.ctrl.live.prefix,
            "order": self.service.next_order(),
        })  # fmt: skip

    async def report(self, request: web.Request) -> web.Response:
        """A broker's report (every second): its load and each topic's window."""
        doc = parse(BrokerReport, await read_json(request))  # refused whole, never half stored
        repairs = self.ctrl.report(
            request.match_info["id"], doc.load, doc.windows(), time.monotonic(), doc.depths(),
            doc.waiting(), doc.arrived(), doc.carried(), doc.seen(),
            None if doc.resources is None else dict(doc.resources), doc.demand(),
            doc.arrived_bytes(), doc.storage_latency_ms(),
        )  # fmt: skip
        if repairs:
            self.service.repair(repairs)
        return web.json_response({"ok": True})

    async def deregister(self, request: web.Request) -> web.Response:
        """A broker stopping cleanly: down at once (its publishers move), gone from
        /lookup and /nodes."""
        broker_id = request.match_info["id"]
        written = self.service.execute(self.ctrl.deregister(broker_id))
        await saved(written, self.service.save_state())
        log.info("broker %s deregistered", broker_id)
        return web.json_response({"id": broker_id, "registered": False})

    async def brokers(self, request: web.Request) -> web.Response:
        """Every registered broker, up or down, with its capacity ledger."""
        rows = [
            {"id": b.id, "host": b.host, "tcp_address": b.tcp_address,
             "http_address": b.http_address, "mcap": e.mcap, "allocated": e.allocated,
             "measured": e.measured, "rcap": e.rcap, "down": b.down,
             "over": e.allocated > e.mcap * (1 + 1e-9)}
            for e in self.ctrl.ledger()
            for b in (self.ctrl.brokers[e.id],)
        ]  # fmt: skip
        return web.json_response({"brokers": rows})

    async def ping(self, request: web.Request) -> web.Response:
        """OK while the controller serves."""
        return ok()

    async def info(self, request: web.Request) -> web.Response:
        """Version; ticks run, stalls of the controller itself and their total length
        (s); whether TLS and the token are on."""
        return web.json_response(self.service.info())

    async def openapi(self, request: web.Request) -> web.Response:
        """This API's OpenAPI 3.1 document."""
        return web.json_response(_openapi())

    # -- the console -----------------------------------------------------------------------
    async def ui(self, request: web.Request) -> web.Response:
        """The SRTM console: a page that polls ``/ui/state``."""
        return web.Response(body=console.asset("index.html"), content_type="text/html")

    async def ui_asset(self, request: web.Request) -> web.Response:
        """The console's script and style sheet (``console.js``, ``console.css``)."""
        name = request.match_info["asset"]
        if name not in console.ASSETS:
            raise ControlError(404, f"no such file: {name!r}")
        return web.Response(body=console.asset(name), content_type=console.ASSETS[name])

    async def ui_state(self, request: web.Request) -> web.Response:
        """Everything the console shows: brokers with their ledger, topics with SLO,
        delivery p99 and backlog (from the brokers' /stats), plan, sub-buckets, DRL
        penalty, fitting and events."""
        readings = await self.latency.read(self.ctrl.up())
        drl = await asyncio.to_thread(console.drl_penalties, console.drl_inputs(self.ctrl))
        doc = console.console_state(self.ctrl, readings, self.service.info(), time.monotonic(), drl)
        return web.json_response(doc)


#: What each refusal means, for every route that can answer it (401: ``srtm.openapi``).
_REFUSALS = {
    400: "A malformed request: the message names the field",
    401: "Joining this open topic needs its join secret or the cluster token",
    404: "No such topic, broker or publisher",
    409: "The topic or publisher id exists, the topic is being fitted, the broker id is "
    "registered at another address and up, or a replicated topic's publishers would leave "
    "its one broker (or a topic to replicate is on several)",
    413: "More publishers than the controller's --max-publishers",
    503: "No broker up, or the publisher is unassigned (capacity is short), or a joining "
    "publisher cannot be placed (the topic is left unchanged)",
}


def _refusals(*statuses: int) -> dict[int, str]:
    return {status: _REFUSALS[status] for status in statuses}


ROUTES: tuple[Route, ...] = (
    Route("POST", "/brokers", ControllerAPI.register, body=Registration, answer=Registered,
          errors=_refusals(400, 409)),
    Route("DELETE", "/brokers/{id}", ControllerAPI.deregister, answer=Deregistered,
          errors=_refusals(404)),
    Route("POST", "/brokers/{id}/report", ControllerAPI.report, body=BrokerReport, answer=Taken,
          errors=_refusals(400, 404)),
    Route("POST", "/topics", TopicsApi.create_topic, body=NewTopic, answer=TopicStatus,
          status=201, errors=_refusals(400, 409, 413, 503)),
    Route("GET", "/topics/{name}", TopicsApi.get_topic, answer=TopicStatus,
          errors=_refusals(404)),
    Route("DELETE", "/topics/{name}", TopicsApi.delete_topic, answer=Deleted,
          errors=_refusals(404, 409)),
    Route("PATCH", "/topics/{name}", TopicsApi.change_topic, body=TopicChange,
          answer=TopicStatus, errors=_refusals(400, 404, 409, 503)),
    Route("POST", "/topics/{name}/publishers", TopicsApi.add_publishers, body=NewPublishers,
          answer=TopicStatus, errors=_refusals(400, 404, 409, 413, 503)),
    Route("DELETE", "/topics/{name}/publishers/{id}", TopicsApi.remove_publisher,
          answer=TopicStatus, errors=_refusals(404, 409)),
    Route("POST", "/topics/{name}/move", TopicsApi.move, body=Move, answer=Plan,
          errors=_refusals(400, 404, 409)),
    Route("POST", "/topics/{name}/replicas", TopicsApi.replicas, body=ReplicaCount,
          answer=TopicStatus, errors=_refusals(400, 404, 409)),
    Route("GET", "/plan", TopicsApi.plan, query=TopicParam, answer=Plan,
          errors=_refusals(400, 404)),
    Route("GET", "/assign", TopicsApi.assign, query=AssignQuery, answer=PublisherAssignment,
          errors=_refusals(400, 401, 404, 409, 413, 503)),
    Route("GET", "/lookup", Lookupd.lookup, query=TopicParam, answer=Lookup,
          errors=_refusals(400, 404)),
    Route("GET", "/topics", Lookupd.topics, answer=TopicList),
    Route("GET", "/channels", Lookupd.channels, query=TopicParam, answer=ChannelList,
          errors=_refusals(400)),
    Route("GET", "/nodes", Lookupd.nodes, answer=Nodes),
    Route("POST", "/topic/create", Lookupd.lookupd_create_topic, query=TopicParam,
          errors=_refusals(400)),
    Route("POST", "/topic/delete", Lookupd.lookupd_delete_topic, query=TopicParam,
          errors=_refusals(400)),
    Route("POST", "/channel/create", Lookupd.lookupd_create_channel,
          query=ChannelParams, errors=_refusals(400)),
    Route("POST", "/channel/delete", Lookupd.lookupd_delete_channel,
          query=ChannelParams, errors=_refusals(400, 404)),
    Route("POST", "/topic/tombstone", Lookupd.tombstone, query=TombstoneParams,
          errors=_refusals(400)),
    Route("GET", "/debug", Lookupd.debug, answer=Debug),
    Route("GET", "/brokers", ControllerAPI.brokers, answer=Brokers),
    Route("GET", "/utility", TopicsApi.utility, answer=UtilityRun),
    Route("GET", "/ping", ControllerAPI.ping, text="text/plain"),
    Route("GET", "/info", ControllerAPI.info, answer=Info),
    Route("GET", "/openapi.json", ControllerAPI.openapi, answer=OpenApiDoc),
    Route("GET", "/ui", ControllerAPI.ui, text="text/html"),
    Route("GET", "/ui/state", ControllerAPI.ui_state, answer=console.ConsoleState),
    Route("GET", "/ui/{asset}", ControllerAPI.ui_asset, text="text/*",
          errors={404: "No such file of the page"}),
)  # fmt: skip


def make_app(
    service: Service,
    token: str | None = None,
    models_dir: Path | None = None,
    joins_need_auth: bool = False,
) -> web.Application:
    """The aiohttp app serving ``ROUTES`` for ``service``."""
    api = ControllerAPI(service)
    topics = TopicsApi(service, models_dir, token, joins_need_auth)
    middlewares = [
        error_middleware(ValueError, _refusal, allow_separator=", "),
        token_required(token, needs_token, challenge=False),
        _leader_writes(service),
    ]
    app = web.Application(middlewares=middlewares, client_max_size=64 << 20)
    app.on_response_prepare.append(nsq_content_type)
    add_routes(app, ROUTES, api, topics, Lookupd(service.ctrl))
    app.on_cleanup.append(lambda _: api.latency.close())
    return app


def _leader_writes(service: Service) -> Middleware:
    """Only the controller that acts changes state: on any other (a standby, a leader
    whose lease lapsed) every request but a read goes to the leader (307) or waits for
    one (503 ``NO_LEADER``). Reads answer from the state it follows."""

    @web.middleware
    async def leader_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in READ_METHODS and not service.acting():
            return to_leader(service, request.path_qs)
        return await handler(request)

    return leader_only


@functools.cache
def _openapi() -> dict[str, Any]:
    doc = document(ROUTES, title="SRTM controller", needs_token=needs_token, error=Error)
    return doc.model_dump()


def _refusal(err: ValueError) -> HttpError:
    """A ``ControlError`` with its status; any other ValueError is a malformed document,
    its message naming the field (400)."""
    return HttpError(err.status if isinstance(err, ControlError) else 400, str(err))
