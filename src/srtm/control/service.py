"""``srtm controller``: the controller's state behind an HTTP API (aiohttp), a 1 s tick
(down brokers, TB Adaptor), sub-buckets pushed to brokers, everything kept in SQLite."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import os
import ssl
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from yarl import URL

from srtm.analysis import profile_bucket
from srtm.control.fitting_run import as_result, fit_topic
from srtm.control.openapi import OPENAPI
from srtm.control.state import (
    MAX_PUBLISHERS,
    Action,
    BrokerInfo,
    ControlError,
    Controller,
    Migrate,
    PlanChanged,
    SetBucket,
)
from srtm.control.store import Store
from srtm.control.validate import parse_address, parse_report, topic_name
from srtm.placement import (
    POLICIES,
    AdaptorSettings,
    Broker,
    RoundResult,
    Topic,
    parse_topic,
    place,
)
from srtm.security import (
    bearer_header,
    bearer_matches,
    check_token,
    require_loopback_without_token,
)
from srtm.version import NSQD_VERSION, __version__

if TYPE_CHECKING:
    from srtm.sim.model import BrokerModel

log = logging.getLogger("srtm.controller")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    http_host: str = "127.0.0.1"
    http_port: int = 4161
    db: Path = Path("srtm-controller.db")
    #: A broker silent for this long is down; its publishers are placed again.
    broker_timeout_s: float = 5.0
    tick_s: float = 1.0
    adaptor: AdaptorSettings = field(default_factory=AdaptorSettings)
    #: The cluster token: registration, reports and every mutating endpoint need
    #: ``Authorization: Bearer <token>``; sent to brokers too. None: open, loopback only.
    token: str | None = None
    #: HTTPS for the API: PEM certificate chain and private key (both or neither).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: ``fit.model`` may name a built-in model or a file under this directory (None:
    #: built-in models only).
    models_dir: Path | None = None
    #: Publishers one topic may have (413 beyond).
    max_publishers: int = MAX_PUBLISHERS


#: The biggest model file ``fit.model`` may name (bytes).
MAX_MODEL_BYTES = 1 << 20
#: Request bodies above this are decoded on a thread, not on the event loop.
_THREADED_JSON_BYTES = 256 << 10


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ControlError as err:
        return web.json_response({"message": str(err)}, status=err.status)
    except ValueError as err:  # a malformed document: its message names the field
        return web.json_response({"message": str(err)}, status=400)


def _auth(token: str | None) -> Any:
    """Refuses every request but GET/HEAD without the cluster token (401)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            token is not None
            and request.method not in ("GET", "HEAD")
            and not bearer_matches(request.headers.get("Authorization"), token)
        ):
            return web.json_response({"message": "E_UNAUTHORIZED"}, status=401)
        return await handler(request)

    return auth


async def _json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; a big one is decoded off the event loop."""
    body = await request.read()
    try:
        if len(body) > _THREADED_JSON_BYTES:
            doc = await asyncio.to_thread(json.loads, body)
        else:
            doc = json.loads(body)
    except (ValueError, RecursionError):
        raise ControlError(400, "body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise ControlError(400, "body must be a JSON object")
    return doc


class ControllerService:
    def __init__(self, options: ControllerOptions | None = None) -> None:
        self.options = opts = options or ControllerOptions()
        check_token(opts.token)
        require_loopback_without_token(opts.token, [opts.http_host])
        if (opts.tls_cert is None) != (opts.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        self.ctrl = Controller(
            opts.broker_timeout_s,
            opts.adaptor,
            stall_after_s=2 * opts.tick_s,
            max_publishers=opts.max_publishers,
        )
        self.store = Store(opts.db)
        #: SQLite writes leave the event loop, in order, in this one thread.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="srtm-store")
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
        site = web.TCPSite(
            self._runner, self.options.http_host, self.options.http_port,
            ssl_context=self._ssl_context(),
        )  # fmt: skip
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
        await asyncio.to_thread(self._writer.shutdown, wait=True)  # every write done
        self.store.close()

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.options.tls_cert is None or self.options.tls_key is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.options.tls_cert, self.options.tls_key)
        return ctx

    async def _tick_loop(self) -> None:
        """Ticks forever: an exception in one tick is logged and the next one runs."""
        while True:
            await asyncio.sleep(self.options.tick_s)
            self.tick()

    def tick(self) -> None:
        stalls = self.ctrl.stalls
        try:
            self._execute(self.ctrl.tick(time.monotonic()))
        except Exception:
            log.exception("a controller tick failed; the next one runs")
        if self.ctrl.stalls != stalls:
            log.warning(
                "the controller itself stalled (ticks over %.1f s apart); %.1f s in all, "
                "not counted as any broker's silence",
                self.ctrl.stall_after_s,
                self.ctrl.stalled_s,
            )

    def _headers(self) -> dict[str, str]:
        """What the controller sends to brokers: the cluster token, if any."""
        return bearer_header(self.options.token)

    # -- actions -------------------------------------------------------------------------
    def _save(self, key: str, doc: Any) -> asyncio.Future[None]:
        """Write ``doc`` under ``key`` in the writer thread; writes land in call order.
        The document is encoded here, on the loop: a snapshot of state the loop owns."""
        text = json.dumps(doc)
        loop = asyncio.get_running_loop()
        written = loop.run_in_executor(self._writer, self.store.put_text, key, text)
        written.add_done_callback(partial(_log_failed_write, key))
        return written

    def _save_state(self) -> asyncio.Future[None]:
        return self._save("controller", self.ctrl.to_json())

    def _persist(self, actions: list[Action]) -> asyncio.Future[None] | None:
        """Have what ``actions`` changed written; the last write's future (None: none)."""
        last = None
        if any(isinstance(a, PlanChanged) for a in actions):
            last = self._save_state()
        for name in {a.topic for a in actions if isinstance(a, SetBucket)}:
            topic = self.ctrl.topics[name]
            buckets = {b: {"rate": p.rate, "burst": p.burst} for b, p in topic.buckets.items()}
            last = self._save(f"buckets:{name}", buckets)
        return last

    def _execute(self, actions: list[Action]) -> None:
        """Persist, then carry the actions out in order in the background (sub-buckets
        before migration orders, so a destination shapes from the first message)."""
        written = self._persist(actions)
        if any(not isinstance(a, PlanChanged) for a in actions):
            self._spawn(self._carry_out(actions, written))

    async def _execute_now(self, actions: list[Action]) -> None:
        """``_execute``, awaited: the fitting driver must know the plan is in place."""
        await self._carry_out(actions, self._persist(actions))

    async def _measure(
        self, topic: str, broker: str, publishers: Sequence[str], window_s: float
    ) -> RoundResult:
        info = self.ctrl.brokers.get(broker)
        if info is None or self._session is None:
            return RoundResult(float("nan"), 0)
        params = {"topic": topic, "window_ms": repr(window_s * 1000)}
        timeout = aiohttp.ClientTimeout(total=window_s + 10)
        try:
            url = _broker_url(info, "/srtm/measure")
            async with self._session.post(
                url,
                params=params,
                json={"publishers": list(publishers)},
                timeout=timeout,
                headers=self._headers(),
            ) as resp:
                return as_result(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("measurement on %s failed: %s", broker, exc)
            return RoundResult(float("nan"), 0)

    async def _carry_out(
        self, actions: list[Action], written: asyncio.Future[None] | None = None
    ) -> None:
        if written is not None:
            # Brokers hear of a plan once it would survive a restart; if it cannot be
            # written (logged), the controller still runs on the plan it holds.
            with contextlib.suppress(Exception):
                await written
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
        model: BrokerModel | None = None,
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
        await self._save_state()

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
            url = _broker_url(info, path)
            async with self._session.post(url, params=params, headers=self._headers()) as r:
                if r.status != 200:
                    log.warning("broker %s refused %s: %s", broker, params, await r.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
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
                doc["id"], doc["tcp_address"], doc["http_address"], mcap, time.monotonic()
            )
            self._save_state()
            self._execute(actions)
            return web.json_response({"id": doc["id"], "registered": True})

        async def report(request: web.Request) -> web.Response:
            parsed = parse_report(await _json(request))  # refused whole, never half stored
            ctrl.report(
                request.match_info["id"], parsed.load, parsed.windows, time.monotonic(),
                parsed.depths,
            )  # fmt: skip
            return web.json_response({"ok": True})

        async def create_topic(request: web.Request) -> web.Response:
            doc = await _json(request)
            policy = doc.get("policy", "srtm")
            if policy not in POLICIES:
                raise ControlError(400, f"policy must be one of {', '.join(POLICIES)}")
            topic_name(doc.get("name"))
            pubs = doc.get("publishers")
            if isinstance(pubs, list) and len(pubs) > ctrl.max_publishers:
                raise ControlError(
                    413, f"publishers: {len(pubs)} > {ctrl.max_publishers} per topic"
                )
            fit = _fit_settings(doc.get("fit"), self.options.models_dir)
            if fit is not None and "model" in fit:
                fit["model"] = await asyncio.to_thread(_read_model, fit["model"])
            # Parsing and placing are linear to quadratic in the publishers: on a thread,
            # so a big topic never stalls the loop (reports, ticks, lookups go on).
            spec = await asyncio.to_thread(_parse_topic, doc)
            fleet = ctrl.check_new_topic(spec)
            placement = await asyncio.to_thread(place, policy, fleet, spec, ctrl.seed)
            actions = ctrl.create_topic(spec, policy, time.monotonic(), placement)
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

        async def lookup(request: web.Request) -> web.Response:
            name = need(request, "topic")
            if name not in ctrl.topics:
                return web.json_response({"message": "TOPIC_NOT_FOUND"}, status=404)
            producers = _producers(ctrl.producers(name))
            return web.json_response({"channels": [], "producers": producers})

        async def topics(request: web.Request) -> web.Response:
            return web.json_response({"topics": sorted(ctrl.topics)})

        async def nodes(request: web.Request) -> web.Response:
            return web.json_response({"producers": _producers(ctrl.up())})

        async def ping(request: web.Request) -> web.Response:
            return web.Response(text="OK")

        async def info(request: web.Request) -> web.Response:
            return web.json_response(
                {"version": __version__, "ticks": ctrl.ticks, "stalls": ctrl.stalls,
                 "stalled_s": ctrl.stalled_s, "tls": self.options.tls_cert is not None,
                 "auth": self.options.token is not None}
            )  # fmt: skip

        async def openapi(request: web.Request) -> web.Response:
            return web.json_response(OPENAPI)

        app = web.Application(
            middlewares=[_errors, _auth(self.options.token)], client_max_size=64 << 20
        )
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


def _broker_url(info: BrokerInfo, path: str) -> URL:
    """A URL on a broker's HTTP API built from its parsed host and port (never pasted
    from the registered text, which could carry a path, user info or another host)."""
    host, port = info.http_endpoint()
    return URL.build(scheme="http", host=host, port=port, path=path)


def _producers(brokers: Sequence[BrokerInfo]) -> list[dict[str, Any]]:
    """nsqlookupd's shape, so NSQ readers given the controller find every broker; an
    address that does not parse (from an old state file) is left out, not fatal."""
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


def _parse_topic(doc: dict[str, Any]) -> Topic:
    """``parse_topic`` after the cheap checks that keep it linear (duplicate ids are
    counted here once, not searched per id), with ``burst: "profile"`` derived first."""
    if doc.get("burst") == "profile":
        doc = _profiled(doc)
    pubs = doc.get("publishers")
    if isinstance(pubs, list):
        ids = collections.Counter(
            p["id"] for p in pubs if isinstance(p, dict) and isinstance(p.get("id"), str)
        )
        dup = sorted(i for i, n in ids.items() if n > 1)[:5]
        if dup:
            raise ControlError(400, f"topic.publishers: duplicate ids {dup}")
    return parse_topic(doc)


def _model_choice(value: Any, models_dir: Path | None) -> str:
    """``fit.model``: a built-in model's name, or a file under ``models_dir`` (no other
    path: the request must not make the controller read /dev/zero or a FIFO)."""
    from srtm.sim.model import BUILTIN

    if not isinstance(value, str) or not value:
        raise ControlError(400, "fit.model must be a model name or file")
    if value in BUILTIN:
        return value
    if models_dir is None:
        raise ControlError(
            400, f"fit.model: {value!r} is not a built-in model ({', '.join(BUILTIN)}); "
            "model files need the controller's --models-dir",
        )  # fmt: skip
    base = models_dir.resolve()
    path = (base / value).resolve()
    if not path.is_relative_to(base) or path == base:
        raise ControlError(400, f"fit.model: {value!r} is not a file under --models-dir")
    return str(path)


def _read_model(choice: str) -> BrokerModel:
    """Loads the model ``_model_choice`` named (blocking: run it on a thread). Only a
    regular file of at most MAX_MODEL_BYTES is read; opening does not wait on a FIFO."""
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
        return BrokerModel.from_json(json.loads(data))
    except (ValueError, TypeError, KeyError) as exc:
        raise ControlError(400, f"fit.model: {exc}") from None


def _log_failed_write(key: str, written: asyncio.Future[None]) -> None:
    if not written.cancelled() and (exc := written.exception()) is not None:
        log.error("could not save %s to the controller's database: %s", key, exc)


def _fit_settings(doc: Any, models_dir: Path | None = None) -> dict[str, Any] | None:
    """``"fit": {"window_s", "min_samples", "settle_s", "model"}`` (all optional), or
    ``true``; ``model`` (a broker model: ``"paper"`` or a model file from ``srtm
    calibrate`` under ``models_dir``) makes the fitting model-assisted. Reads no file:
    the model is loaded by ``_read_model`` on a thread."""
    if doc is None or doc is False:
        return None
    if doc is True:
        doc = {}
    if not isinstance(doc, dict):
        raise ControlError(400, "fit must be true or an object")
    out: dict[str, Any] = {"window_s": 60.0, "min_samples": 100, "settle_s": 1.0}
    for key, value in doc.items():
        if key == "model":
            out[key] = _model_choice(value, models_dir)
            continue
        if key not in out:
            keys = ", ".join([*out, "model"])
            raise ControlError(400, f"fit.{key} is not a fitting setting ({keys})")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ControlError(400, f"fit.{key} must be a number >= 0, got {value!r}")
        if not (math.isfinite(value) and value >= 0):
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
