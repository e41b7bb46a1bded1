"""``srtm controller``: the controller's state behind an HTTP API (aiohttp), a 1 s tick
(down brokers, TB Adaptor), sub-buckets pushed to brokers, everything kept in SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from srtm.analysis import profile_bucket
from srtm.control.fitting_run import as_result, fit_topic
from srtm.control.openapi import OPENAPI
from srtm.control.state import Action, ControlError, Controller, Migrate, PlanChanged, SetBucket
from srtm.control.store import Store
from srtm.placement import POLICIES, AdaptorSettings, Broker, RoundResult, parse_topic

log = logging.getLogger("srtm.controller")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VERSION = "0.1.0"


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    http_host: str = "127.0.0.1"
    http_port: int = 4161
    db: Path = Path("srtm-controller.db")
    #: A broker silent for this long is down; its publishers are placed again.
    broker_timeout_s: float = 5.0
    tick_s: float = 1.0
    adaptor: AdaptorSettings = field(default_factory=AdaptorSettings)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ControlError as err:
        return web.json_response({"message": str(err)}, status=err.status)
    except ValueError as err:  # a malformed document: its message names the field
        return web.json_response({"message": str(err)}, status=400)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        doc = await request.json()
    except ValueError:
        raise ControlError(400, "body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise ControlError(400, "body must be a JSON object")
    return doc


class ControllerService:
    def __init__(self, options: ControllerOptions | None = None) -> None:
        self.options = opts = options or ControllerOptions()
        self.ctrl = Controller(opts.broker_timeout_s, opts.adaptor)
        self.store = Store(opts.db)
        saved = self.store.load()
        if saved:
            self.ctrl.restore(saved, time.monotonic())
        self.http_address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tick: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.http_host, self.options.http_port)
        await site.start()
        self.http_address = (self.options.http_host, int(self._runner.addresses[0][1]))
        self._tick = asyncio.create_task(self._tick_loop())

    async def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self.store.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.tick_s)
            self._execute(self.ctrl.tick(time.monotonic()))

    # -- actions -------------------------------------------------------------------------
    def _persist(self, actions: list[Action]) -> None:
        if any(isinstance(a, PlanChanged) for a in actions):
            self.store.save(self.ctrl.to_json())
        for name in {a.topic for a in actions if isinstance(a, SetBucket)}:
            topic = self.ctrl.topics[name]
            self.store.save_buckets(
                name, {b: {"rate": p.rate, "burst": p.burst} for b, p in topic.buckets.items()}
            )

    def _execute(self, actions: list[Action]) -> None:
        """Persist, then carry the actions out in order in the background (sub-buckets
        before migration orders, so a destination shapes from the first message)."""
        self._persist(actions)
        if any(not isinstance(a, PlanChanged) for a in actions):
            self._spawn(self._carry_out(actions))

    async def _execute_now(self, actions: list[Action]) -> None:
        """``_execute``, awaited: the fitting driver must know the plan is in place."""
        self._persist(actions)
        await self._carry_out(actions)

    async def _measure(
        self, topic: str, broker: str, publishers: Sequence[str], window_s: float
    ) -> RoundResult:
        info = self.ctrl.brokers.get(broker)
        if info is None or self._session is None:
            return RoundResult(float("nan"), 0)
        url = f"http://{info.http_address}/srtm/measure"
        params = {"topic": topic, "window_ms": repr(window_s * 1000)}
        timeout = aiohttp.ClientTimeout(total=window_s + 10)
        try:
            async with self._session.post(
                url, params=params, json={"publishers": list(publishers)}, timeout=timeout
            ) as resp:
                return as_result(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("measurement on %s failed: %s", broker, exc)
            return RoundResult(float("nan"), 0)

    async def _carry_out(self, actions: list[Action]) -> None:
        pushes = [self._push_bucket(a) for a in actions if isinstance(a, SetBucket)]
        await asyncio.gather(*pushes)
        for a in actions:
            if isinstance(a, Migrate):
                await self._order_migration(a)
            elif isinstance(a, PlanChanged):
                log.info("plan of %s is now version %d", a.topic, a.version)

    async def _fit(
        self,
        topic: str,
        window_s: float,
        min_samples: float,
        settle_s: float,
        model: str | None = None,
    ) -> None:
        async def measure(broker: str, publishers: Sequence[str], window: float) -> RoundResult:
            return await self._measure(topic, broker, publishers, window)

        try:
            predict = None
            if model is not None:  # model-assisted: the simulator plans, rounds confirm
                from srtm.sim.predict import predictor_for_topic

                fleet = [Broker(b.id, b.mcap, b.load) for b in self.ctrl.up()]
                spec = self.ctrl.topics[topic].spec
                predict = await asyncio.to_thread(predictor_for_topic, spec, fleet, model)
            await fit_topic(
                self.ctrl, topic, self._execute_now, measure,
                window_s=window_s, min_samples=int(min_samples), settle_s=settle_s,
                predict=predict,
            )  # fmt: skip
        except Exception:
            log.exception("fitting %s failed", topic)
            state = self.ctrl.topics[topic].fitting
            if state is not None:
                state["state"] = "failed"
        self.store.save(self.ctrl.to_json())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _order_migration(self, action: Migrate) -> None:
        params = {"topic": action.topic, "publisher": action.publisher, "to": action.to,
                  "version": str(action.version)}  # fmt: skip
        await self._post_to_broker(action.broker, "/srtm/migrate", params, "a migration")

    async def _push_bucket(self, action: SetBucket) -> None:
        params = {"topic": action.topic, "rate": repr(action.bucket.rate),
                  "burst": repr(action.bucket.burst)}  # fmt: skip
        await self._post_to_broker(action.broker, "/srtm/bucket", params, action.topic)

    async def _post_to_broker(
        self, broker: str, path: str, params: dict[str, str], what: str
    ) -> None:
        """POST an order to a broker; a refusal or an unreachable broker is logged, not
        raised (a re-registering broker gets its sub-buckets again)."""
        info = self.ctrl.brokers.get(broker)
        if info is None or self._session is None:
            return
        try:
            async with self._session.post(f"http://{info.http_address}{path}", params=params) as r:
                if r.status != 200:
                    log.warning("broker %s refused %s: %s", broker, params, await r.text())
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("broker %s unreachable for %s: %s", broker, what, exc)

    # -- HTTP ----------------------------------------------------------------------------
    def app(self) -> web.Application:
        ctrl = self.ctrl

        async def register(request: web.Request) -> web.Response:
            doc = await _json(request)
            for key in ("id", "tcp_address", "http_address"):
                if not isinstance(doc.get(key), str) or not doc[key]:
                    raise ControlError(400, f"{key} must be a non-empty string")
            mcap = doc.get("mcap")
            if isinstance(mcap, bool) or not isinstance(mcap, int | float):
                raise ControlError(400, f"mcap must be a number > 0, got {mcap!r}")
            actions = ctrl.register(
                doc["id"], doc["tcp_address"], doc["http_address"], float(mcap), time.monotonic()
            )
            self.store.save(ctrl.to_json())
            self._execute(actions)
            return web.json_response({"id": doc["id"], "registered": True})

        async def report(request: web.Request) -> web.Response:
            doc = await _json(request)
            load = doc.get("load", 0.0)
            topics_doc = doc.get("topics", {})
            if not isinstance(load, int | float) or not isinstance(topics_doc, dict):
                raise ControlError(400, "load must be a number and topics an object")
            topics = {}
            for name, t in topics_doc.items():
                if not isinstance(t, dict):
                    raise ControlError(400, f"topics.{name} must be an object")
                topics[name] = (float(t.get("rate", 0.0)), float(t.get("backlog", 0.0)))
            ctrl.report(request.match_info["id"], float(load), topics, time.monotonic())
            return web.json_response({"ok": True})

        async def create_topic(request: web.Request) -> web.Response:
            doc = await _json(request)
            policy = doc.get("policy", "srtm")
            if policy not in POLICIES:
                raise ControlError(400, f"policy must be one of {', '.join(POLICIES)}")
            if doc.get("burst") == "profile":
                doc = _profiled(doc)
            fit = _fit_settings(doc.get("fit"))
            spec = parse_topic(doc)
            actions = ctrl.create_topic(spec, policy, time.monotonic())
            self._execute(actions)
            if fit is not None:
                ctrl.topics[spec.name].fitting = {"state": "running"}
                self._spawn(self._fit(spec.name, **fit))
            return web.json_response(ctrl.topic_doc(spec.name), status=201)

        async def move(request: web.Request) -> web.Response:
            doc = await _json(request)
            pubs, to = doc.get("publishers"), doc.get("to")
            if not isinstance(pubs, list) or not all(isinstance(p, str) for p in pubs):
                raise ControlError(400, "publishers must be a list of publisher ids")
            if not isinstance(to, str):
                raise ControlError(400, "to must be a broker id")
            name = request.match_info["name"]
            self._execute(ctrl.move(name, pubs, to))
            return web.json_response(ctrl.plan(name))

        async def get_topic(request: web.Request) -> web.Response:
            return web.json_response(ctrl.topic_doc(request.match_info["name"]))

        def need(request: web.Request, key: str) -> str:
            value = request.query.get(key)
            if not value:
                raise ControlError(400, f"missing query parameter {key!r}")
            return value

        async def plan(request: web.Request) -> web.Response:
            return web.json_response(ctrl.plan(need(request, "topic")))

        async def assign(request: web.Request) -> web.Response:
            return web.json_response(
                ctrl.assign(need(request, "topic"), need(request, "publisher"))
            )

        # nsqlookupd's shape, so NSQ readers given the controller find every broker.
        def producer(b: Any) -> dict[str, Any]:
            host, _, tcp = b.tcp_address.rpartition(":")
            return {
                "remote_address": b.tcp_address,
                "hostname": host,
                "broadcast_address": host,
                "tcp_port": int(tcp),
                "http_port": int(b.http_address.rpartition(":")[2]),
                "version": "1.3.0-srtm",
            }

        async def lookup(request: web.Request) -> web.Response:
            name = need(request, "topic")
            if name not in ctrl.topics:
                return web.json_response({"message": "TOPIC_NOT_FOUND"}, status=404)
            live = [b for b in ctrl.topic_brokers(name) if not b.down]
            return web.json_response({"channels": [], "producers": [producer(b) for b in live]})

        async def topics(request: web.Request) -> web.Response:
            return web.json_response({"topics": sorted(ctrl.topics)})

        async def nodes(request: web.Request) -> web.Response:
            return web.json_response({"producers": [producer(b) for b in ctrl.up()]})

        async def ping(request: web.Request) -> web.Response:
            return web.Response(text="OK")

        async def info(request: web.Request) -> web.Response:
            return web.json_response({"version": VERSION})

        async def openapi(request: web.Request) -> web.Response:
            return web.json_response(OPENAPI)

        app = web.Application(middlewares=[_errors], client_max_size=64 << 20)
        app.router.add_post("/brokers", register)
        app.router.add_post("/brokers/{id}/report", report)
        app.router.add_post("/topics", create_topic)
        app.router.add_get("/topics/{name}", get_topic)
        app.router.add_post("/topics/{name}/move", move)
        app.router.add_get("/plan", plan)
        app.router.add_get("/assign", assign)
        app.router.add_get("/lookup", lookup)
        app.router.add_get("/topics", topics)
        app.router.add_get("/nodes", nodes)
        app.router.add_get("/ping", ping)
        app.router.add_get("/info", info)
        app.router.add_get("/openapi.json", openapi)
        return app


def _fit_settings(doc: Any) -> dict[str, Any] | None:
    """``"fit": {"window_s", "min_samples", "settle_s", "model"}`` (all optional), or
    ``true``; ``model`` (a broker model: ``"paper"`` or a model file from ``srtm
    calibrate``) makes the fitting model-assisted."""
    if doc is None or doc is False:
        return None
    if doc is True:
        doc = {}
    if not isinstance(doc, dict):
        raise ControlError(400, "fit must be true or an object")
    out: dict[str, Any] = {"window_s": 60.0, "min_samples": 100, "settle_s": 1.0}
    for key, value in doc.items():
        if key == "model":
            if not isinstance(value, str) or not value:
                raise ControlError(400, "fit.model must be a model name or file")
            from srtm.sim.model import load

            try:
                load(value)
            except (OSError, ValueError) as exc:
                raise ControlError(400, f"fit.model: {exc}") from None
            out[key] = value
            continue
        if key not in out:
            keys = ", ".join([*out, "model"])
            raise ControlError(400, f"fit.{key} is not a fitting setting ({keys})")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ControlError(400, f"fit.{key} must be a number >= 0, got {value!r}")
        out[key] = value
    return out


def _profiled(doc: dict[str, Any]) -> dict[str, Any]:
    """``"burst": "profile"``: derive (r, b) from ``arrivals_ns`` as the paper does."""
    arrivals = doc.get("arrivals_ns")
    if not isinstance(arrivals, list) or len(arrivals) < 2:
        raise ControlError(400, 'burst "profile" needs arrivals_ns: a list of >= 2 timestamps')
    params = profile_bucket(arrivals)
    return doc | {"rate": params.rate, "burst": max(1.0, math.ceil(params.burst))}


async def serve(options: ControllerOptions, on_ready: Callable[[ControllerService], None]) -> None:
    """Serve until SIGTERM or SIGINT."""
    import signal

    service = ControllerService(options)
    await service.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_ready(service)
    try:
        await stop.wait()
    finally:
        await service.stop()
