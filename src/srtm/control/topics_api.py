"""The controller's topic handlers (``srtm.control.api``'s table routes to them): a topic
created, placed, changed, moved, replicated and deleted; publishers joining and leaving;
its plan, and the broker a publisher should use (an open topic's joiner placed first)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from srtm.control.documents import (
    AssignQuery,
    Move,
    NewPublishers,
    NewTopic,
    ReplicaCount,
    TopicChange,
    TopicParam,
    parse,
)
from srtm.control.handlers import Service, read_json, read_query, saved, to_leader
from srtm.control.validate import ControlError
from srtm.httpkit import has_token
from srtm.jsondoc import parse as parse_json
from srtm.placement import TopicSpec, place
from srtm.security import same_secret

if TYPE_CHECKING:
    from srtm.control.actions import Action
    from srtm.sim.model import BrokerModel

log = logging.getLogger("srtm.control")

#: The header a publisher joining an open topic shows its join secret in.
JOIN_SECRET_HEADER = "X-SRTM-Join-Secret"
#: The biggest model file ``fit.model`` may name (bytes).
MAX_MODEL_BYTES = 1 << 20


class TopicsApi:
    """The handlers of the topics' routes; placements one at a time."""

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

    async def create_topic(self, request: web.Request) -> web.Response:
        """Create a topic (its SLO, publishers and policy) and place it; with ``fit``,
        online fitting follows."""
        doc = await read_json(request)
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
        written = self.service.execute(actions)
        if new.fit is not None:
            self.service.start_fitting(spec.name, new.fit, model)
        await saved(written)
        return web.json_response(self._topic(spec.name), status=201)

    async def delete_topic(self, request: web.Request) -> web.Response:
        """Stop managing a topic: brokers drop its sub-buckets, the ledger frees its
        share; messages already accepted are still delivered (/lookup lists the brokers
        holding them until they are empty)."""
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.delete_topic(name)
        log.info("topic %s deleted", name)
        await saved(self.service.execute(actions))
        return web.json_response({"topic": name, "deleted": True})

    async def change_topic(self, request: web.Request) -> web.Response:
        """Change a topic's SLO, rate, burst, policy or utility spec: a rate or burst
        re-splits its bucket, a policy places it again."""
        doc = parse(TopicChange, await read_json(request))
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
        return await self._changed(name, actions)

    async def utility(self, request: web.Request) -> web.Response:
        """The utility optimizer's last run: each flow's rate, admitted consumers per
        class and utility (``t_s`` null: none yet)."""
        return web.json_response(self.service.utility_doc())

    async def add_publishers(self, request: web.Request) -> web.Response:
        """Publishers join: placed by the policy's incremental rule, nobody already placed
        moves; the bucket is re-split."""
        doc = parse(NewPublishers, await read_json(request))
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.add_publishers(name, doc.loads())
        return await self._changed(name, actions)

    async def remove_publisher(self, request: web.Request) -> web.Response:
        """A publisher leaves; the bucket is re-split over those left."""
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.remove_publisher(name, request.match_info["id"])
        return await self._changed(name, actions)

    async def _changed(self, name: str, actions: list[Action]) -> web.Response:
        """Carry a lifecycle change out (or only save it), warn of brokers over mcap."""
        for note in self.ctrl.note_over(name):
            log.warning("topic %s: %s", name, note)
        written = self.service.execute(actions) if actions else None
        # Its own row too: a change without a new plan (a bound, a join secret) lives there.
        await saved(written, self.service.save_topic(name))
        return web.json_response(self._topic(name))

    def _new_topic(self, doc: dict[str, Any]) -> tuple[NewTopic, TopicSpec]:
        new = parse(NewTopic, doc, models_dir=self.models_dir)
        return new, new.to_topic()

    async def move(self, request: web.Request) -> web.Response:
        """Move publishers to a broker: a new plan, and migration orders."""
        doc = parse(Move, await read_json(request))
        name = request.match_info["name"]
        async with self.placing:  # like every plan change: never between a read and a commit
            written = self.service.execute(self.ctrl.move(name, doc.publishers, doc.to))
        await saved(written)
        return self._plan(name)

    async def replicas(self, request: web.Request) -> web.Response:
        """ALL_PUBLISHERS replication: the topic on ``count`` brokers (1: one), each
        receiving every message and shaping with the whole ``(r, b)``, each channel
        delivered by one of them."""
        doc = parse(ReplicaCount, await read_json(request))
        name = request.match_info["name"]
        async with self.placing:
            actions = self.ctrl.set_replicas(name, doc.count)
        return await self._changed(name, actions)

    async def get_topic(self, request: web.Request) -> web.Response:
        """A topic: its plan, SLO, events and fitting status."""
        return web.json_response(self._topic(request.match_info["name"]))

    async def plan(self, request: web.Request) -> web.Response:
        """The whole plan of a topic, with its version, and whether it is in place."""
        return self._plan(read_query(request, TopicParam).topic)

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
        q = read_query(request, AssignQuery)
        topic = self.ctrl.topics.get(q.topic)
        if topic is not None and topic.open and not self.ctrl.is_publisher(q.topic, q.publisher):
            self._may_join(request, topic.join_secret, q)
            if not self.service.acting():  # a join changes the plan: the leader's to do
                return to_leader(self.service, request.path_qs)
            async with self.placing:
                actions = self.ctrl.join_open(q.topic, q.publisher, q.rate, q.group)
            if actions:
                for note in self.ctrl.note_over(q.topic):
                    log.warning("topic %s: %s", q.topic, note)
                await saved(self.service.execute(actions))
        return web.json_response(self.ctrl.assign(q.topic, q.publisher))

    def _may_join(self, request: web.Request, secret: str | None, q: AssignQuery) -> None:
        """401 unless the joiner shows the topic's secret or the cluster token (a topic
        with no secret: anyone, unless ``--joins-need-auth``)."""
        if secret is None and not self.joins_need_auth:
            return
        if self.token is not None and has_token(request, self.token):
            return
        given = request.headers.get(JOIN_SECRET_HEADER) or q.join_secret
        if secret is not None and given is not None and same_secret(given, secret):
            return
        raise ControlError(
            401, f"join_secret: joining topic {q.topic!r} needs its join secret "
            f"({JOIN_SECRET_HEADER} or join_secret) or the cluster token",
        )  # fmt: skip


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
