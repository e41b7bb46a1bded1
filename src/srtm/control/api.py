"""The controller's HTTP API: handlers as named methods of ``ControllerAPI`` and one route
table, ``ROUTES`` (as nsqd's http.go), from which both the aiohttp app and the OpenAPI
document are built. nsqlookupd's routes (/lookup, /topics, /nodes, /ping, /info) answer
as nsqlookupd does, so NSQ readers given the controller find every broker.

Every refusal is ``{"message": ...}`` with its status; every request but a read needs
the cluster token when the controller has one (401 ``E_UNAUTHORIZED``)."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from srtm.control import console
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
    describe,
    parse,
)
from srtm.control.model import BrokerInfo
from srtm.control.validate import ControlError, parse_address
from srtm.jsondoc import parse as parse_json
from srtm.jsondoc import parse_object
from srtm.openapi import OpenApiDoc, Route, document
from srtm.placement import TopicSpec, place
from srtm.protocol import is_valid_name
from srtm.security import bearer_matches
from srtm.version import NSQD_VERSION

log = logging.getLogger("srtm.control")

if TYPE_CHECKING:
    from srtm.control.actions import Action
    from srtm.control.documents import FitSettings
    from srtm.control.state import Controller
    from srtm.sim.model import BrokerModel

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Q = TypeVar("Q", bound=BaseModel)

#: nsqlookupd's (and nsqd's) mark on a v1 answer.
NSQ_CONTENT_TYPE = "nsq; version=1.0"

#: The header a publisher joining an open topic shows its join secret in.
JOIN_SECRET_HEADER = "X-SRTM-Join-Secret"

#: What a request may do without the cluster token: read.
READ_METHODS = ("GET", "HEAD")


def needs_token(method: str, path: str) -> bool:
    """Every request but a read needs ``Authorization: Bearer <token>`` (when the
    controller has one), whatever its path."""
    return method not in READ_METHODS


#: The biggest model file ``fit.model`` may name (bytes).
MAX_MODEL_BYTES = 1 << 20
#: Request bodies above this are decoded on a thread, not on the event loop.
_THREADED_JSON_BYTES = 256 << 10


class Service(Protocol):
    """What the handlers ask of the controller process (``ControllerService``)."""

    ctrl: Controller

    def execute(self, actions: list[Action]) -> None: ...

    def save_state(self) -> asyncio.Future[None]: ...

    def save_topic(self, name: str) -> asyncio.Future[None]: ...

    def start_fitting(self, topic: str, fit: FitSettings, model: BrokerModel | None) -> None: ...

    def info(self) -> dict[str, Any]: ...

    def repair(self, actions: list[Action]) -> None: ...

    def utility_doc(self) -> dict[str, Any]: ...

    def in_place(self, topic: str) -> bool: ...


class ControllerAPI:
    def __init__(
        self,
        service: Service,
        models_dir: Path | None = None,
        token: str | None = None,
        joins_need_auth: bool = False,
    ) -> None:
        self.service = service
        #: The cluster token (it also lets a publisher join any open topic), and whether
        #: a join needs it or the topic's secret even where the topic has no secret.
        self.token, self.joins_need_auth = token, joins_need_auth
        self.ctrl = service.ctrl
        #: ``fit.model`` may name a file under this directory (None: built-in models only).
        self.models_dir = models_dir
        #: Held from reading the ledger to committing the plan: placements are serialised,
        #: so two concurrent ``POST /topics`` never both count on the same free capacity.
        self.placing = asyncio.Lock()
        #: The console's reads of the brokers' /stats (closed with the app).
        self.latency = console.LatencyReader()

    # -- brokers ---------------------------------------------------------------------------
    async def register(self, request: web.Request) -> web.Response:
        """Register a broker (again after a restart)."""
        doc = parse(Registration, await _json(request))
        actions = self.ctrl.register(
            doc.id, doc.tcp_address, doc.http_address, doc.mcap, time.monotonic()
        )
        self.service.save_state()
        self.service.execute(actions)
        # The answer carries the lease and the broker's shares: it applies them on receipt
        # (the pushes may reach it first, while its lease has lapsed, and be refused).
        buckets, held = self.ctrl.shares(doc.id)
        return web.json_response({
            "id": doc.id, "registered": True, "lease_s": self.ctrl.lease_s,
            "buckets": {n: self.ctrl.bucket_doc(n, p) for n, p in buckets.items()},
            "held": held,
        })  # fmt: skip

    async def report(self, request: web.Request) -> web.Response:
        """A broker's report (every second): its load and each topic's window."""
        doc = parse(BrokerReport, await _json(request))  # refused whole, never half stored
        repairs = self.ctrl.report(
            request.match_info["id"], doc.load, doc.windows(), time.monotonic(), doc.depths(),
            doc.waiting(), doc.arrived(), doc.carried(), doc.seen(),
            None if doc.resources is None else dict(doc.resources), doc.demand(),
            doc.arrived_bytes(),
        )  # fmt: skip
        if repairs:
            self.service.repair(repairs)
        return web.json_response({"ok": True})

    # -- topics ----------------------------------------------------------------------------
    async def create_topic(self, request: web.Request) -> web.Response:
        """Create a topic (its SLO, publishers and policy) and place it; with ``fit``,
        online fitting follows."""
        doc = await _json(request)
        pubs = doc.get("publishers")
        if isinstance(pubs, list) and len(pubs) > self.ctrl.max_publishers:
            raise ControlError(
                413, f"publishers: {len(pubs)} > {self.ctrl.max_publishers} per topic"
            )
        # Checking and placing are linear to quadratic in the publishers: on a thread,
        # so a big topic never stalls the loop (reports, ticks, lookups go on).
        new, spec = await asyncio.to_thread(self._new_topic, doc)
        model = None
        if new.fit is not None and new.fit.model is not None:
            model = await asyncio.to_thread(_read_model, new.fit.model)
        async with self.placing:  # read the ledger, place, commit: one at a time
            fleet = self.ctrl.check_new_topic(spec)
            placement = await asyncio.to_thread(place, new.policy, fleet, spec, self.ctrl.seed)
            actions = self.ctrl.create_topic(
                spec, new.policy, time.monotonic(), placement, placed_on=fleet,
                open=new.open, rate_auto=new.rate_auto, utility=new.utility,
                max_publisher_rate=new.max_publisher_rate, join_secret=new.join_secret,
                bound=new.bound,
            )  # fmt: skip
        self.service.execute(actions)
        if new.fit is not None:
            self.service.start_fitting(spec.name, new.fit, model)
        return web.json_response(self._topic(spec.name), status=201)

    async def delete_topic(self, request: web.Request) -> web.Response:
        """Stop managing a topic: brokers drop its sub-buckets, the ledger frees its
        share; messages already accepted are still delivered (/lookup lists the brokers
        holding them until they are empty)."""
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.delete_topic(name)
        log.info("topic %s deleted", name)
        self.service.execute(actions)
        return web.json_response({"topic": name, "deleted": True})

    async def change_topic(self, request: web.Request) -> web.Response:
        """Change a topic's SLO, rate, burst, policy or utility spec: a rate or burst
        re-splits its bucket, a policy places it again."""
        doc = parse(TopicChange, await _json(request))
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.change_topic(
                name, slo_p99_ms=doc.slo_p99_ms, rate=doc.rate, burst=doc.burst,
                policy=doc.policy, max_wait_ms=doc.max_wait_ms, overflow=doc.overflow,
            )  # fmt: skip
            if "utility" in doc.model_fields_set:
                self.ctrl.set_utility(name, doc.utility)
            joining = {k: getattr(doc, k) for k in ("max_publisher_rate", "join_secret")
                       if k in doc.model_fields_set}  # fmt: skip
            if joining:
                self.ctrl.set_join(name, **joining)
        return self._changed(name, actions)

    async def utility(self, request: web.Request) -> web.Response:
        """The utility optimizer's last run: each flow's rate, admitted consumers per
        class and utility (``t_s`` null: none yet)."""
        return web.json_response(self.service.utility_doc())

    async def add_publishers(self, request: web.Request) -> web.Response:
        """Publishers join: placed by the policy's incremental rule, nobody already placed
        moves; the bucket is re-split."""
        doc = parse(NewPublishers, await _json(request))
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.add_publishers(name, doc.loads())
        return self._changed(name, actions)

    async def remove_publisher(self, request: web.Request) -> web.Response:
        """A publisher leaves; the bucket is re-split over those left."""
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.remove_publisher(name, request.match_info["id"])
        return self._changed(name, actions)

    def _changed(self, name: str, actions: list[Action]) -> web.Response:
        """Carry a lifecycle change out (or only save it), warn of brokers over mcap."""
        for note in self.ctrl.note_over(name):
            log.warning("topic %s: %s", name, note)
        if actions:
            self.service.execute(actions)
        # Its own row too: a change without a new plan (a bound, a join secret) lives there.
        self.service.save_topic(name)
        return web.json_response(self._topic(name))

    def _new_topic(self, doc: dict[str, Any]) -> tuple[NewTopic, TopicSpec]:
        new = parse(NewTopic, doc, models_dir=self.models_dir)
        return new, new.to_topic()

    async def move(self, request: web.Request) -> web.Response:
        """Move publishers to a broker: a new plan, and migration orders."""
        doc = parse(Move, await _json(request))
        name = request.match_info["name"]
        async with self.placing:  # like every plan change: never between a read and a commit
            self.service.execute(self.ctrl.move(name, doc.publishers, doc.to))
        return self._plan(name)

    async def replicas(self, request: web.Request) -> web.Response:
        """ALL_PUBLISHERS replication: the topic on ``count`` brokers (1: one), each
        receiving every message and shaping with the whole ``(r, b)``, each channel
        delivered by one of them."""
        doc = parse(ReplicaCount, await _json(request))
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.set_replicas(name, doc.count)
        return self._changed(name, actions)

    async def get_topic(self, request: web.Request) -> web.Response:
        """A topic: its plan, SLO, events and fitting status."""
        return web.json_response(self._topic(request.match_info["name"]))

    async def plan(self, request: web.Request) -> web.Response:
        """The whole plan of a topic, with its version, and whether it is in place."""
        return self._plan(_query(request, TopicParam).topic)

    def _plan(self, topic: str) -> web.Response:
        doc = self.ctrl.plan(topic) | {"in_place": self.service.in_place(topic)}
        return web.json_response(doc)

    def _topic(self, name: str) -> dict[str, Any]:
        return self.ctrl.topic_doc(name) | {"in_place": self.service.in_place(name)}

    async def assign(self, request: web.Request) -> web.Response:
        """The broker a publisher should use; an unknown one of an open topic joins first.

        A joiner tells its rate (required, at most the topic's ``max_publisher_rate``) and
        group, and the topic's join secret if it has one (the ``X-SRTM-Join-Secret``
        header or the ``join_secret`` parameter; the cluster token as ``Authorization:
        Bearer`` also does: 401 without). A join that cannot be placed is refused (503)
        and changes nothing."""
        q = _query(request, AssignQuery)
        topic = self.ctrl.topics.get(q.topic)
        if topic is not None and topic.open and not self.ctrl.is_publisher(q.topic, q.publisher):
            self._may_join(request, topic.join_secret, q)
            async with self.placing:
                actions = self.ctrl.join_open(q.topic, q.publisher, q.rate, q.group)
            if actions:
                for note in self.ctrl.note_over(q.topic):
                    log.warning("topic %s: %s", q.topic, note)
                self.service.execute(actions)
        return web.json_response(self.ctrl.assign(q.topic, q.publisher))

    def _may_join(self, request: web.Request, secret: str | None, q: AssignQuery) -> None:
        """401 unless the joiner shows the topic's secret or the cluster token (a topic
        with no secret: anyone, unless ``--joins-need-auth``)."""
        if secret is None and not self.joins_need_auth:
            return
        if self.token is not None and bearer_matches(
            request.headers.get("Authorization"), self.token
        ):
            return
        given = request.headers.get(JOIN_SECRET_HEADER) or q.join_secret
        if secret is not None and given is not None and _same(given, secret):
            return
        raise ControlError(
            401, f"join_secret: joining topic {q.topic!r} needs its join secret "
            f"({JOIN_SECRET_HEADER} or join_secret) or the cluster token",
        )  # fmt: skip

    # -- nsqlookupd's ----------------------------------------------------------------------
    async def lookup(self, request: web.Request) -> web.Response:
        """nsqlookupd's /lookup: the topic's channels and where to read it: a managed
        topic's live brokers, then any live broker still holding its messages, then every
        broker carrying it (tombstoned ones left out)."""
        found = self.ctrl.lookup(_arg(request, "topic"), time.monotonic())
        if found is None:
            raise ControlError(404, "TOPIC_NOT_FOUND")
        channels, brokers = found
        return web.json_response({"channels": channels, "producers": _producers(brokers)})

    async def topics(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topics: every topic, managed or carried by a broker."""
        return web.json_response({"topics": self.ctrl.topic_names()})

    async def channels(self, request: web.Request) -> web.Response:
        """nsqlookupd's /channels: a topic's channels (none: ``[]``)."""
        return web.json_response({"channels": self.ctrl.registry.channels(_arg(request, "topic"))})

    async def nodes(self, request: web.Request) -> web.Response:
        """nsqlookupd's /nodes: every broker up, with its topics and tombstones."""
        rows = []
        for b, topics, tombstones in self.ctrl.nodes(time.monotonic()):
            for peer in _producers([b]):
                rows.append({**peer, "tombstones": tombstones, "topics": topics})
        return web.json_response({"producers": rows})

    async def lookupd_create_topic(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topic/create: the topic exists in the registry (no broker is
        told; nsqadmin creates it on brokers itself)."""
        self.ctrl.registry.create_topic(_valid(request, "topic"))
        return _empty()

    async def lookupd_delete_topic(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topic/delete: the topic and its channels leave the registry
        (brokers keep theirs; a managed topic stays managed: ``DELETE /topics/{name}``)."""
        self.ctrl.registry.delete_topic(_arg(request, "topic"))
        return _empty()

    async def lookupd_create_channel(self, request: web.Request) -> web.Response:
        """nsqlookupd's /channel/create: the channel (and its topic) in the registry."""
        topic, channel = _valid(request, "topic"), _valid(request, "channel")
        self.ctrl.registry.create_channel(topic, channel)
        return _empty()

    async def lookupd_delete_channel(self, request: web.Request) -> web.Response:
        """nsqlookupd's /channel/delete: the channel leaves the registry."""
        topic, channel = _valid(request, "topic"), _valid(request, "channel")
        if not self.ctrl.registry.delete_channel(topic, channel):
            raise ControlError(404, "CHANNEL_NOT_FOUND")
        return _empty()

    async def tombstone(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topic/tombstone: /lookup leaves out broker ``node``
        (``HOST:HTTP_PORT``, as /nodes gives it) for ``topic`` for the tombstone lifetime."""
        topic, node = _arg(request, "topic"), _arg(request, "node")
        now = time.monotonic()
        for b in self.ctrl.up():
            for peer in _producers([b]):
                if _join_host_port(peer["broadcast_address"], peer["http_port"]) == node:
                    self.ctrl.registry.tombstone(topic, b.id, now)
        return _empty()

    async def debug(self, request: web.Request) -> web.Response:
        """nsqlookupd's /debug: every registration with its brokers."""
        reg, now, wall = self.ctrl.registry, time.monotonic(), time.time_ns()
        doc: dict[str, list[dict[str, Any]]] = {}
        for (topic, channel), members in reg.keys.items():
            key = f"channel:{topic}:{channel}" if channel else f"topic:{topic}:"
            for broker_id in members:
                b = self.ctrl.brokers.get(broker_id)
                if b is None:
                    continue
                when = reg.tombstoned.get((topic, broker_id))
                for peer in _producers([b]):
                    doc.setdefault(key, []).append({
                        "id": broker_id, "hostname": peer["hostname"],
                        "broadcast_address": peer["broadcast_address"],
                        "tcp_port": peer["tcp_port"], "http_port": peer["http_port"],
                        "version": peer["version"],
                        "last_update": wall - int((self.ctrl.awake(now) - b.last_seen_s) * 1e9),
                        "tombstoned": when is not None and not channel,
                        "tombstoned_at": 0 if when is None else wall - int((now - when) * 1e9),
                    })  # fmt: skip
        return web.json_response(doc)

    async def deregister(self, request: web.Request) -> web.Response:
        """A broker stopping cleanly: down at once (its publishers move), gone from
        /lookup and /nodes."""
        broker_id = request.match_info["id"]
        self.service.execute(self.ctrl.deregister(broker_id))
        self.service.save_state()
        log.info("broker %s deregistered", broker_id)
        return web.json_response({"id": broker_id, "registered": False})

    async def brokers(self, request: web.Request) -> web.Response:
        """Every registered broker, up or down, with its capacity ledger."""
        rows = [
            {"id": b.id, "tcp_address": b.tcp_address, "http_address": b.http_address,
             "mcap": e.mcap, "allocated": e.allocated, "measured": e.measured,
             "rcap": e.rcap, "down": b.down, "over": e.allocated > e.mcap * (1 + 1e-9)}
            for e in self.ctrl.ledger()
            for b in (self.ctrl.brokers[e.id],)
        ]  # fmt: skip
        return web.json_response({"brokers": rows})

    async def ping(self, request: web.Request) -> web.Response:
        """OK while the controller serves."""
        return web.Response(text="OK")

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
    Route("POST", "/topics", ControllerAPI.create_topic, body=NewTopic, answer=TopicStatus,
          status=201, errors=_refusals(400, 409, 413, 503)),
    Route("GET", "/topics/{name}", ControllerAPI.get_topic, answer=TopicStatus,
          errors=_refusals(404)),
    Route("DELETE", "/topics/{name}", ControllerAPI.delete_topic, answer=Deleted,
          errors=_refusals(404, 409)),
    Route("PATCH", "/topics/{name}", ControllerAPI.change_topic, body=TopicChange,
          answer=TopicStatus, errors=_refusals(400, 404, 409, 503)),
    Route("POST", "/topics/{name}/publishers", ControllerAPI.add_publishers, body=NewPublishers,
          answer=TopicStatus, errors=_refusals(400, 404, 409, 413, 503)),
    Route("DELETE", "/topics/{name}/publishers/{id}", ControllerAPI.remove_publisher,
          answer=TopicStatus, errors=_refusals(404, 409)),
    Route("POST", "/topics/{name}/move", ControllerAPI.move, body=Move, answer=Plan,
          errors=_refusals(400, 404, 409)),
    Route("POST", "/topics/{name}/replicas", ControllerAPI.replicas, body=ReplicaCount,
          answer=TopicStatus, errors=_refusals(400, 404, 409)),
    Route("GET", "/plan", ControllerAPI.plan, query=TopicParam, answer=Plan,
          errors=_refusals(400, 404)),
    Route("GET", "/assign", ControllerAPI.assign, query=AssignQuery, answer=PublisherAssignment,
          errors=_refusals(400, 401, 404, 409, 413, 503)),
    Route("GET", "/lookup", ControllerAPI.lookup, query=TopicParam, answer=Lookup,
          errors=_refusals(400, 404)),
    Route("GET", "/topics", ControllerAPI.topics, answer=TopicList),
    Route("GET", "/channels", ControllerAPI.channels, query=TopicParam, answer=ChannelList,
          errors=_refusals(400)),
    Route("GET", "/nodes", ControllerAPI.nodes, answer=Nodes),
    Route("POST", "/topic/create", ControllerAPI.lookupd_create_topic, query=TopicParam,
          errors=_refusals(400)),
    Route("POST", "/topic/delete", ControllerAPI.lookupd_delete_topic, query=TopicParam,
          errors=_refusals(400)),
    Route("POST", "/channel/create", ControllerAPI.lookupd_create_channel,
          query=ChannelParams, errors=_refusals(400)),
    Route("POST", "/channel/delete", ControllerAPI.lookupd_delete_channel,
          query=ChannelParams, errors=_refusals(400, 404)),
    Route("POST", "/topic/tombstone", ControllerAPI.tombstone, query=TombstoneParams,
          errors=_refusals(400)),
    Route("GET", "/debug", ControllerAPI.debug, answer=Debug),
    Route("GET", "/brokers", ControllerAPI.brokers, answer=Brokers),
    Route("GET", "/utility", ControllerAPI.utility, answer=UtilityRun),
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
    api = ControllerAPI(service, models_dir, token, joins_need_auth)
    app = web.Application(middlewares=[_errors, _auth(token)], client_max_size=64 << 20)
    app.on_response_prepare.append(_nsq_content_type)
    for route in ROUTES:
        handler: Handler = getattr(api, route.handler.__name__)
        if route.method == "GET":
            app.router.add_get(route.path, handler)  # and HEAD
        else:
            app.router.add_route(route.method, route.path, handler)
    app.on_cleanup.append(lambda _: api.latency.close())
    return app


@functools.cache
def _openapi() -> dict[str, Any]:
    doc = document(ROUTES, title="SRTM controller", needs_token=needs_token, error=Error)
    return doc.model_dump()


# -- the edges of every request --------------------------------------------------------------
@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:  # no such route: nsqlookupd's JSON
        return web.json_response({"message": "NOT_FOUND"}, status=404)
    except web.HTTPMethodNotAllowed as err:
        return web.json_response(
            {"message": "METHOD_NOT_ALLOWED"},
            status=405,
            headers={"Allow": ", ".join(sorted(err.allowed_methods))},
        )
    except ControlError as err:
        return web.json_response({"message": str(err)}, status=err.status)
    except ValueError as err:  # a malformed document: its message names the field
        return web.json_response({"message": str(err)}, status=400)


async def _nsq_content_type(request: web.Request, response: web.StreamResponse) -> None:
    """nsqlookupd marks every answer but /ping's; go-nsq reads a /lookup without the
    mark as the pre-1.0 format and finds no producer in it, silently."""
    if request.path != "/ping":
        response.headers["X-NSQ-Content-Type"] = NSQ_CONTENT_TYPE


def _auth(token: str | None) -> Any:
    """Refuses every request but a read without the cluster token (401)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            token is not None
            and needs_token(request.method, request.path)
            and not bearer_matches(request.headers.get("Authorization"), token)
        ):
            return web.json_response({"message": "E_UNAUTHORIZED"}, status=401)
        return await handler(request)

    return auth


async def _json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object (refused naming the line and column where it stops being
    JSON); a big one is decoded off the event loop."""
    body = await request.read()
    try:
        if len(body) > _THREADED_JSON_BYTES:
            return await asyncio.to_thread(parse_object, body)
        return parse_object(body)
    except ValueError as exc:
        raise ControlError(400, str(exc)) from None


def _query(request: web.Request, model: type[Q]) -> Q:
    """The query as ``model``: each required parameter given and not empty; numbers
    parsed from their text (finite only)."""
    values = {}
    for key, info in model.model_fields.items():
        value = request.query.get(key)
        if not value:
            if not info.is_required():
                continue
            raise ControlError(400, f"missing query parameter {key!r}")
        values[key] = value
    try:
        return model.model_validate(values, strict=False)
    except ValidationError as exc:
        raise ControlError(400, describe(exc)) from None


def _same(given: str, secret: str) -> bool:
    """Compared in constant time: the answer's timing tells nothing of the secret."""
    return hmac.compare_digest(given.encode(), secret.encode())


def _arg(request: web.Request, key: str) -> str:
    """nsqlookupd's query argument: absent is ``MISSING_ARG_<KEY>`` (empty is given)."""
    value = request.query.get(key)
    if value is None:
        raise ControlError(400, f"MISSING_ARG_{key.upper()}")
    return value


def _valid(request: web.Request, key: str) -> str:
    """A topic or channel name, by NSQ's rule: else ``INVALID_ARG_<KEY>``."""
    value = _arg(request, key)
    if not is_valid_name(value):
        raise ControlError(400, f"INVALID_ARG_{key.upper()}")
    return value


def _empty() -> web.Response:
    """nsqlookupd's answer to a write: 200 with no body."""
    return web.Response(status=200)


def _join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``: how nsqlookupd names a node."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _producers(brokers: Sequence[BrokerInfo]) -> list[dict[str, Any]]:
    """nsqlookupd's shape (``documents.Producer``); an address that does not parse (from
    an old state file) is left out, not fatal."""
    out = []
    for b in brokers:
        try:
            host, tcp = parse_address(b.tcp_address, "tcp_address")
            _, http = b.http_endpoint()
        except ControlError:
            continue
        out.append({"remote_address": b.tcp_address, "hostname": host,
                    "broadcast_address": host, "tcp_port": tcp, "http_port": http,
                    "version": NSQD_VERSION})  # fmt: skip
    return out


def _read_model(choice: str) -> BrokerModel:
    """Loads the model ``fit.model`` named (``FitSettings`` resolved it; blocking: run it
    on a thread). Only a regular file of at most MAX_MODEL_BYTES is read; opening does
    not wait on a FIFO."""
    from srtm.sim.model import BUILTIN, BrokerModel, load

    if choice in BUILTIN:
        return load(choice)
    try:
        fd = os.open(choice, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise ControlError(400, f"fit.model: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ControlError(400, "fit.model: not a regular file")
        data = f.read(MAX_MODEL_BYTES + 1)
    if len(data) > MAX_MODEL_BYTES:
        raise ControlError(400, f"fit.model: larger than {MAX_MODEL_BYTES} bytes")
    try:
        doc = parse_json(data, "fit.model")
    except ValueError as exc:
        raise ControlError(400, str(exc)) from None
    try:
        return BrokerModel.from_json(doc)
    except (ValueError, TypeError, KeyError) as exc:
        raise ControlError(400, f"fit.model: {exc}") from None
