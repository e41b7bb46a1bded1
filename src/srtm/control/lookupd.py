"""nsqlookupd's endpoints on the controller (/lookup, /topics, /channels, /nodes, the
registry's writes, /topic/tombstone, /debug), answered as nsqlookupd does, so NSQ readers
and nsqadmin given the controller find every broker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from srtm.control.validate import ControlError, parse_address
from srtm.httpkit import arg, empty, join_host_port
from srtm.protocol import is_valid_name
from srtm.version import NSQD_VERSION

if TYPE_CHECKING:
    from srtm.control.model import BrokerInfo
    from srtm.control.state import Controller

#: nsqlookupd's (and nsqd's) mark on a v1 answer.
NSQ_CONTENT_TYPE = "nsq; version=1.0"


class Lookupd:
    """nsqlookupd's handlers, over the controller's registry of brokers and topics."""

    def __init__(self, ctrl: Controller) -> None:
        self.ctrl = ctrl

    async def lookup(self, request: web.Request) -> web.Response:
        """nsqlookupd's /lookup: the topic's channels and where to read it: a managed
        topic's live brokers, then any live broker still holding its messages, then every
        broker carrying it (tombstoned ones left out)."""
        found = self.ctrl.lookup(arg(request.query, "topic"), time.monotonic())
        if found is None:
            raise ControlError(404, "TOPIC_NOT_FOUND")
        channels, brokers = found
        return web.json_response({"channels": channels, "producers": _producers(brokers)})

    async def topics(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topics: every topic, managed or carried by a broker."""
        return web.json_response({"topics": self.ctrl.topic_names()})

    async def channels(self, request: web.Request) -> web.Response:
        """nsqlookupd's /channels: a topic's channels (none: ``[]``)."""
        return web.json_response(
            {"channels": self.ctrl.registry.channels(arg(request.query, "topic"))}
        )

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
        return empty()

    async def lookupd_delete_topic(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topic/delete: the topic and its channels leave the registry
        (brokers keep theirs; a managed topic stays managed: ``DELETE /topics/{name}``)."""
        self.ctrl.registry.delete_topic(arg(request.query, "topic"))
        return empty()

    async def lookupd_create_channel(self, request: web.Request) -> web.Response:
        """nsqlookupd's /channel/create: the channel (and its topic) in the registry."""
        topic, channel = _valid(request, "topic"), _valid(request, "channel")
        self.ctrl.registry.create_channel(topic, channel)
        return empty()

    async def lookupd_delete_channel(self, request: web.Request) -> web.Response:
        """nsqlookupd's /channel/delete: the channel leaves the registry."""
        topic, channel = _valid(request, "topic"), _valid(request, "channel")
        if not self.ctrl.registry.delete_channel(topic, channel):
            raise ControlError(404, "CHANNEL_NOT_FOUND")
        return empty()

    async def tombstone(self, request: web.Request) -> web.Response:
        """nsqlookupd's /topic/tombstone: /lookup leaves out broker ``node``
        (``HOST:HTTP_PORT``, as /nodes gives it) for ``topic`` for the tombstone lifetime."""
        topic, node = arg(request.query, "topic"), arg(request.query, "node")
        now = time.monotonic()
        for b in self.ctrl.up():
            for peer in _producers([b]):
                if join_host_port(peer["broadcast_address"], peer["http_port"]) == node:
                    self.ctrl.registry.tombstone(topic, b.id, now)
        return empty()

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


async def nsq_content_type(request: web.Request, response: web.StreamResponse) -> None:
    """nsqlookupd marks every answer but /ping's; go-nsq reads a /lookup without the
    mark as the pre-1.0 format and finds no producer in it, silently."""
    if request.path != "/ping":
        response.headers["X-NSQ-Content-Type"] = NSQ_CONTENT_TYPE


def _valid(request: web.Request, key: str) -> str:
    """A topic or channel name, by NSQ's rule: else ``INVALID_ARG_<KEY>``."""
    value = arg(request.query, key)
    if not is_valid_name(value):
        raise ControlError(400, f"INVALID_ARG_{key.upper()}")
    return value


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
        out.append({"remote_address": b.tcp_address, "hostname": b.host,
                    "broadcast_address": host, "tcp_port": tcp, "http_port": http,
                    "version": NSQD_VERSION})  # fmt: skip
    return out
