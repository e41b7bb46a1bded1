"""``srtm controller``: the controller's state behind its HTTP API (``srtm.control.api``),
a 1 s tick (down brokers, TB Adaptor), sub-buckets and migration orders pushed to
brokers, online fitting driven, everything kept in SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from yarl import URL

from srtm.control.actions import (
    Action,
    DropRoute,
    Handoff,
    Hold,
    Migrate,
    PlanChanged,
    SetBucket,
    SetRoute,
    Unmanage,
    forwarding_first,
    handoff,
    phases,
)
from srtm.control.api import make_app
from srtm.control.elastic import Elastic, ElasticStep
from srtm.control.fitting_run import as_result, fit_topic
from srtm.control.model import BrokerInfo, FitState, FittingProgress
from srtm.control.options import ControllerOptions
from srtm.control.provision import (
    CommandProvisioner,
    LocalProvisioner,
    Provisioner,
    ProvisionError,
)
from srtm.control.state import Controller
from srtm.control.store import (
    BROKERS_KEY,
    BUCKETS_PREFIX,
    LEGACY_KEY,
    TOPIC_PREFIX,
    SqliteStore,
    StateStore,
    load_state,
)
from srtm.control.utility import UtilityControl, UtilitySettings
from srtm.jsondoc import parse as parse_json
from srtm.placement import RoundResult
from srtm.security import bearer_header, check_token, require_loopback_without_token
from srtm.utility.cost import model_from_doc
from srtm.utility.optimizer import optimize
from srtm.version import __version__

if TYPE_CHECKING:
    from srtm.control.documents import FitSettings
    from srtm.sim.model import BrokerModel

log = logging.getLogger("srtm.controller")

#: Batches of rows go to the writer thread at most this often (s): the most a change
#: waits to be saved (and its plan to reach brokers) while changes come faster than this.
WRITE_INTERVAL_S = 0.05


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
            forward_grace_s=opts.forward_grace_s,
        )
        self.store: StateStore = SqliteStore(opts.db)
        #: SQLite writes leave the event loop, in order, in this one thread: the batch
        #: being written, and the one that gathers rows marked meanwhile (``_mark``).
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="srtm-store")
        self._writing: asyncio.Future[None] | None = None
        self._next_write: asyncio.Future[None] | None = None
        self._dirty_topics: set[str] = set()
        self._dirty_buckets: set[str] = set()
        self._dirty_brokers = False
        #: When the last batch began (the loop's clock).
        self._last_flush = -math.inf
        #: Documents encoded for the store, and their bytes (what a change costs).
        self.encodes = 0
        self.encoded_bytes = 0
        self.ctrl.registry.tombstone_s = opts.tombstone_s
        saved = load_state(self.store)
        #: The file holds the old single ``controller`` row: the first write replaces it.
        self._legacy = self.store.get(LEGACY_KEY) is not None
        if saved:
            self.ctrl.restore(saved, time.monotonic())
        self.http_address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tick: asyncio.Task[None] | None = None
        #: Silent brokers being asked whether their address still answers.
        self._probing: set[str] = set()
        #: Per topic: held while its share changes are carried out, so that changes of
        #: two plans never interleave (one plan's increase after the next one's decrease).
        self._shares: dict[str, asyncio.Lock] = {}
        #: Per topic: share changes issued and not yet carried out (a repair waits for 0).
        self._busy: dict[str, int] = {}
        #: How soon a decrease a broker did not take is tried again (s).
        self.retry_s = min(0.5, opts.tick_s)
        #: Off only to show what the order prevents (tests/test_no_holes.py): every share
        #: change pushed at once, as before.
        self.ordered = True
        #: Elasticity (``--rebalance``): the pure glue and how brokers are started.
        self.elastic: Elastic | None = None
        self.provisioner: Provisioner | None = None
        self._rebalancer: asyncio.Task[None] | None = None
        #: The utility optimizer's last run and rate control (docs/utility.md).
        self.utility = UtilityControl(UtilitySettings(opts.cpu_capacity, opts.egress_max))
        if opts.cost_model is not None:
            doc = parse_json(opts.cost_model.read_bytes(), f"--cost-model {opts.cost_model}")
            self.utility.model = model_from_doc(doc)
        self._utility_tasks: list[asyncio.Task[None]] = []
        self._optimizing = False
        if opts.rebalance:
            self.elastic = Elastic(
                opts.rebalance_settings,
                spawn_timeout_s=opts.provision_timeout_s + 5 * opts.broker_timeout_s,
                grace_s=opts.broker_timeout_s,
            )

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
        if self.elastic is not None:
            self.provisioner = self._provisioner()
            self._rebalancer = asyncio.create_task(self._rebalance_loop())
        opts = self.options
        if opts.utility_interval_s > 0:
            self._utility_tasks.append(asyncio.create_task(self._utility_loop()))
            if opts.rate_control_interval_s > 0:
                self._utility_tasks.append(asyncio.create_task(self._rate_control_loop()))

    def _provisioner(self) -> Provisioner:
        opts = self.options
        if opts.provision_cmd:
            return CommandProvisioner(opts.provision_cmd, timeout_s=opts.provision_timeout_s)
        assert self.http_address is not None
        scheme = "https" if opts.tls_cert is not None else "http"
        return LocalProvisioner(
            "{}://{}:{}".format(scheme, *self.http_address),
            opts.spawn_dir or opts.db.with_name(opts.db.name + "-brokers"),
            token=opts.token,
            mcap=opts.spawn_mcap,
            timeout_s=opts.provision_timeout_s,
        )

    async def stop(self) -> None:
        for loop_task in (self._rebalancer, self._tick, *self._utility_tasks):
            if loop_task is not None:
                loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop_task
        for task in list(self._tasks):
            task.cancel()
        if self.provisioner is not None:
            await self.provisioner.close()  # every local child stopped
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        while (pending := self._next_write or self._writing) is not None:
            with contextlib.suppress(Exception):  # a failed write is logged
                await pending  # every marked row written
        await asyncio.to_thread(self._writer.shutdown, wait=True)
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
            self._probe_silent()

    def tick(self) -> None:
        stalls = self.ctrl.stalls
        try:
            self.execute(self.ctrl.tick(time.monotonic()))
        except Exception:
            log.exception("a controller tick failed; the next one runs")
        if self.ctrl.stalls != stalls:
            log.warning(
                "the controller itself stalled (ticks over %.1f s apart); %.1f s in all, "
                "not counted as any broker's silence",
                self.ctrl.stall_after_s,
                self.ctrl.stalled_s,
            )

    def _probe_silent(self) -> None:
        """Ask every broker silent for ``--probe-after-s`` (one request each at a time)."""
        after = self.options.probe_after_s
        if after <= 0 or self._session is None:
            return
        for b in self.ctrl.silent(time.monotonic(), after):
            if b not in self._probing:
                self._probing.add(b)
                self._spawn(self._probe(b, after))

    async def _probe(self, broker_id: str, after_s: float) -> None:
        """Refused: nothing listens at its address, it is gone (SIGKILL, a crash) and is
        down now, not after ``--broker-timeout-s`` (a live diurnal day's kill spilled
        its failed sends into the next 5-s window). An answer, a timeout or any other
        error: it may be alive and cut off, so the timeout decides as before."""
        try:
            info = self.ctrl.brokers.get(broker_id)
            if info is None or info.down or self._session is None:
                return
            address = info.http_address
            try:
                timeout = aiohttp.ClientTimeout(total=1.0)
                async with self._session.get(_broker_url(info, "/ping"), timeout=timeout) as r:
                    await r.read()
                return
            except aiohttp.ClientConnectorError as exc:
                if getattr(exc.os_error, "errno", None) != errno.ECONNREFUSED:
                    return
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return
            actions = self.ctrl.gone(broker_id, address, time.monotonic(), after_s)
            if actions is not None:
                log.warning("broker %s silent and its address refuses connections: down",
                            broker_id)  # fmt: skip
                self.execute(actions)
        finally:
            self._probing.discard(broker_id)

    # -- elasticity ----------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        """Every ``rebalance_interval_s``: sample loads, run the rebalancer, carry out."""
        while True:
            await asyncio.sleep(self.options.rebalance_interval_s)
            try:
                self.rebalance_step(time.monotonic())
            except Exception:
                log.exception("a rebalancing step failed; the next one runs")

    def rebalance_step(self, now: float) -> ElasticStep:
        """One step of ``Elastic``: moves executed as any plan change, brokers started and
        stopped in the background."""
        assert self.elastic is not None and self.provisioner is not None
        el, prov = self.elastic, self.provisioner
        el.observe(self.ctrl, now)
        step = el.step(self.ctrl, now, prov.can_stop)
        for d in step.decisions:
            log.info("rebalance: %s", d.to_json())
        if step.actions:
            self.execute(step.actions)
        for bid in step.start:
            self._spawn(self._provision(prov.start, bid, el.start_failed))
        for bid in step.stop:
            self._spawn(self._provision(prov.stop, bid, el.stop_failed))
        return step

    async def _provision(
        self,
        run: Callable[[str], Awaitable[None]],
        broker: str,
        failed: Callable[[str, float, str], None],
    ) -> None:
        try:
            await run(broker)
        except ProvisionError as exc:
            log.error("provisioning: %s", exc)
            failed(broker, time.monotonic(), str(exc))

    # -- utility-aware allocation ----------------------------------------------------------
    async def _utility_loop(self) -> None:
        """Every ``utility_interval_s``: one optimizer run (a failed one is logged)."""
        while True:
            await asyncio.sleep(self.options.utility_interval_s)
            try:
                await self.utility_run()
            except Exception:
                log.exception("a utility optimizer run failed; the next one runs")

    async def utility_run(self) -> None:
        """Build the problem from the topics with a utility spec, optimize on a thread,
        then set their rates (shrink before grow, as any share change) and post each
        broker of a one-to-many topic its admitted counts."""
        u = self.utility
        u.observe(self.ctrl)
        problem = u.build(self.ctrl)
        self._optimizing = True
        try:
            alloc = await asyncio.to_thread(optimize, problem)
        finally:
            self._optimizing = False
        actions, orders = u.apply(self.ctrl, problem, alloc, time.monotonic())
        self.execute(actions)
        if problem.flows:
            self.save_state()  # the topics' rates
        for broker, topic, body in orders:
            self._spawn(self._post_admission(broker, topic, body))

    async def _rate_control_loop(self) -> None:
        """Every ``rate_control_interval_s``: one rate control step (none while the
        optimizer runs: its answer replaces the rates anyway)."""
        while True:
            await asyncio.sleep(self.options.rate_control_interval_s)
            if self._optimizing:
                continue
            try:
                self.utility.observe(self.ctrl)
                self.execute(self.utility.control(self.ctrl))
            except Exception:
                log.exception("a rate control step failed; the next one runs")

    async def _post_admission(self, broker: str, topic: str, body: dict[str, Any]) -> None:
        info = self.ctrl.brokers.get(broker)
        if info is None or self._session is None or info.down:
            return
        try:
            url = _broker_url(info, "/srtm/admission")
            request = self._session.post(
                url, params={"topic": topic}, json=body, headers=self._headers()
            )
            async with request as r:
                if r.status != 200:
                    log.warning("broker %s refused admission of %s: %s", broker, topic,
                                await r.text())  # fmt: skip
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("broker %s unreachable for admission of %s: %s", broker, topic, exc)

    def utility_doc(self) -> dict[str, Any]:
        """``GET /utility``: the optimizer's last run."""
        return self.utility.doc()

    def _headers(self) -> dict[str, str]:
        """What the controller sends to brokers: the cluster token, if any."""
        return bearer_header(self.options.token)

    # -- actions -------------------------------------------------------------------------
    def _mark(
        self, topics: Iterable[str] = (), buckets: Iterable[str] = (), brokers: bool = False
    ) -> asyncio.Future[None]:
        """Have these rows written (``srtm.control.store``): the future of the write that
        will carry them (a failed write is logged; its future completes all the same).
        Rows marked while a write is on its way, or within ``WRITE_INTERVAL_S`` of the
        last one, go in the next batch, encoded once however many changes touched them
        meanwhile: a burst of joins costs one encoding of its topic, and at most one
        batch waits for the writer thread (memory stays bounded however fast changes
        come)."""
        self._dirty_topics.update(topics)
        self._dirty_buckets.update(buckets)
        self._dirty_brokers = self._dirty_brokers or brokers
        if self._next_write is None:
            loop = asyncio.get_running_loop()
            self._next_write = loop.create_future()
            if self._writing is None:
                self._schedule_flush()
        # Shielded: a caller cancelled while it waits (a task ended at stop) must not
        # cancel the write every other caller of this batch waits for.
        return asyncio.shield(self._next_write)

    def _schedule_flush(self) -> None:
        """The next batch goes now, or ``WRITE_INTERVAL_S`` after the last one began:
        under a flood of changes a topic's row is encoded at most that often, however
        many joins come meanwhile; a change after a quiet spell is written at once."""
        loop = asyncio.get_running_loop()
        wait = self._last_flush + WRITE_INTERVAL_S - loop.time()
        if wait > 0:
            loop.call_later(wait, self._flush)
        else:
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Encode the marked rows, on the loop (a snapshot of state it owns), and hand
        them to the writer thread as one batch."""
        done, self._next_write = self._next_write, None
        if done is None:
            return
        self._last_flush = asyncio.get_running_loop().time()
        rows = self._rows()
        loop = asyncio.get_running_loop()
        self._writing = loop.run_in_executor(self._writer, self.store.write, rows)
        self._writing.add_done_callback(partial(self._written, done, len(rows)))

    def _rows(self) -> list[tuple[str, str | None]]:
        topics, buckets = self._dirty_topics, self._dirty_buckets
        self._dirty_topics, self._dirty_buckets = set(), set()
        rows: list[tuple[str, str | None]] = []
        if self._legacy:  # an old file's single row: replaced by rows, all of them
            self._legacy = False
            topics |= set(self.ctrl.topics)
            self._dirty_brokers = True
            rows.append((LEGACY_KEY, None))
        if self._dirty_brokers:
            self._dirty_brokers = False
            rows.append((BROKERS_KEY, self._encode(self.ctrl.brokers_json())))
        for name in sorted(topics):
            if name in self.ctrl.topics:
                rows.append((TOPIC_PREFIX + name, self._encode(self.ctrl.topic_json(name))))
                rows.append((BUCKETS_PREFIX + name, None))  # the row above has them
            else:  # deleted
                rows += [(TOPIC_PREFIX + name, None), (BUCKETS_PREFIX + name, None)]
        for name in sorted(buckets - topics):
            topic = self.ctrl.topics.get(name)
            if topic is not None:
                doc = {b: {"rate": p.rate, "burst": p.burst} for b, p in topic.buckets.items()}
                rows.append((BUCKETS_PREFIX + name, self._encode(doc)))
        return rows

    def _encode(self, doc: Any) -> str:
        text = json.dumps(doc)
        self.encodes += 1
        self.encoded_bytes += len(text)
        return text

    def _written(
        self, done: asyncio.Future[None], rows: int, written: asyncio.Future[None]
    ) -> None:
        self._writing = None
        if written.cancelled():
            done.cancel()
        else:
            if (exc := written.exception()) is not None:  # the plan held still goes out
                log.error("could not save %d rows to the controller's database: %s", rows, exc)
            done.set_result(None)
        if self._next_write is not None:  # marked meanwhile: the next batch
            self._schedule_flush()

    def save_state(self) -> asyncio.Future[None]:
        """Have everything written: brokers and every topic (a broker registering)."""
        return self._mark(self.ctrl.topics, brokers=True)

    def save_topic(self, name: str) -> asyncio.Future[None]:
        """Have one topic's row written."""
        return self._mark([name])

    def _persist(self, actions: list[Action]) -> asyncio.Future[None] | None:
        """Have what ``actions`` changed written: the rows of the topics whose plan or
        routes changed, the buckets of those whose shares did; the future of that write
        (None: nothing to write)."""
        topics = {
            a.topic for a in actions if isinstance(a, PlanChanged | Unmanage | SetRoute | DropRoute)
        }
        buckets = {a.topic for a in actions if isinstance(a, SetBucket | Hold)}
        if not topics and not buckets:
            return None
        return self._mark(topics, buckets)

    def execute(self, actions: list[Action]) -> None:
        """Persist, then carry the actions out in order in the background (sub-buckets
        before migration orders, so a destination shapes from the first message)."""
        written = self._persist(actions)
        if any(not isinstance(a, PlanChanged) for a in actions):
            self._spawn(self._carry_out(actions, written, self._take(actions)))

    async def _execute_now(self, actions: list[Action]) -> None:
        """``execute``, awaited: the fitting driver must know the plan is in place."""
        await self._carry_out(actions, self._persist(actions), self._take(actions))

    def repair(self, actions: list[Action]) -> None:
        """Put back shares a broker lost (``Controller.repairs``), but only of topics
        with no share change on its way: mid-change a broker rightly shows a decrease
        not yet followed by its increase, and pushing the plan's value then would
        break the shrink-before-grow order."""
        todo = [a for a in actions if not self._busy.get(a.topic, 0)]
        for a in todo:
            log.warning("topic %s: broker %s lost its share; putting it back",
                        a.topic, getattr(a, "broker", "?"))  # fmt: skip
        if todo:
            self.execute(todo)

    def in_place(self, topic: str) -> bool:
        """Are the topic's share changes all carried out (its plan's brokers shape with
        their new shares)?"""
        return not self._busy.get(topic, 0)

    def _take(self, actions: list[Action]) -> list[str]:
        """Mark the topics whose shares ``actions`` change as busy (``_carry_out`` frees)."""
        topics = sorted({a.topic for a in actions if isinstance(a, SetBucket | Hold)})
        for t in topics:
            self._busy[t] = self._busy.get(t, 0) + 1
        return topics

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
        self,
        actions: list[Action],
        written: asyncio.Future[None] | None = None,
        busy: Sequence[str] = (),
    ) -> None:
        try:
            await self._carry_out_now(actions, written)
        finally:
            for t in busy:
                self._busy[t] -= 1
                if not self._busy[t]:
                    del self._busy[t]

    async def _carry_out_now(
        self, actions: list[Action], written: asyncio.Future[None] | None
    ) -> None:
        if written is not None:
            # Brokers hear of a plan once it would survive a restart; if it cannot be
            # written (logged), the controller still runs on the plan it holds.
            with contextlib.suppress(Exception):
                await written
        by_topic: dict[str, list[Action]] = {}
        for a in actions:
            if isinstance(a, SetBucket | Hold | SetRoute | DropRoute):
                by_topic.setdefault(a.topic, []).append(a)
        await asyncio.gather(*(self._change_shares(t, acts) for t, acts in by_topic.items()))
        await asyncio.gather(*(self._unmanage(a) for a in actions if isinstance(a, Unmanage)))
        for a in actions:
            if isinstance(a, Migrate):
                await self._order_migration(a)
            elif isinstance(a, PlanChanged):
                log.info("plan of %s is now version %d", a.topic, a.version)

    async def _change_shares(self, topic: str, actions: list[Action]) -> None:
        """Carry out one topic's share changes without a hole in its ``(r, b)``: every
        decrease first, each retried until its broker took it or is down (its lease then
        lapsed: it holds everything); only then the increases still in the plan."""
        routed = [a for a in actions if isinstance(a, SetRoute | DropRoute)]
        if not self.ordered:
            shares = [a for a in actions if isinstance(a, SetBucket | Hold)]
            await asyncio.gather(*(self._push_share(a) for a in shares))
            for r in routed:
                await self._route(r)
            return
        lock = self._shares.setdefault(topic, asyncio.Lock())
        async with lock:
            down, up = phases(actions)
            # A broker losing publishers forwards before its share shrinks: what they
            # still send it meanwhile is shaped by their new broker, not its drain share.
            first, routed = forwarding_first(routed, down)
            # One source, one destination: the destination is armed first, then the
            # source's decrease (with its forwarding route, one step) hands the share
            # over on their relay link, so what it forwards is shaped at once, not held
            # there until our own increase push (docs/controller.md, "Push order").
            plan, rest = handoff(down, up, first)
            push = None if plan is None else await self._arm(plan)
            if push is not None:
                first = rest
            for r in first:
                await self._route(r)
            await asyncio.gather(
                *(self._decrease(a, push if push and a is push.plan.source else None) for a in down)
            )
            # Every increase still in the plan, the handed-over one too (the same bucket:
            # a handoff lost with its link or its source costs only today's wait).
            await asyncio.gather(*(self._push_share(a) for a in up if self._current(a)))
            # Other routes once the shares are in place (a broker relays only to brokers
            # shaping with their new share), one by one in the order given (a broker
            # gaining a channel's home hears before the one losing it).
            for r in routed:
                await self._route(r)
        if topic not in self.ctrl.topics and not lock.locked():
            self._shares.pop(topic, None)  # no lock kept per topic ever deleted

    def _current(self, action: SetBucket) -> bool:
        """Is this increase still what the topic's plan gives the broker? (A later plan
        or adaptation replaced it: that one's own changes carry it out.)"""
        topic = self.ctrl.topics.get(action.topic)
        return topic is not None and topic.buckets.get(action.broker) == action.bucket

    async def _arm(self, plan: Handoff) -> _HandoffPush | None:
        """Arm the destination of ``plan`` with its new share under a fresh token; None
        if it did not take it (the change then goes as without a handoff)."""
        dest = plan.dest
        info = self.ctrl.brokers.get(dest.broker)
        if info is None or info.down:
            return None
        token = secrets.token_hex(16)
        params = {"topic": dest.topic, "rate": repr(dest.bucket.rate),
                  "burst": repr(dest.bucket.burst), "token": token}  # fmt: skip
        if not await self._post_to_broker(dest.broker, "/srtm/bucket/arm", params, dest.topic):
            return None
        return _HandoffPush(plan, info.tcp_address, token)

    async def _decrease(self, action: SetBucket | Hold, push: _HandoffPush | None = None) -> None:
        while not await self._push_share(action, push):
            info = self.ctrl.brokers.get(action.broker)
            if info is None or info.down or action.topic not in self.ctrl.topics:
                return  # down: its lease lapsed, it holds every topic
            await asyncio.sleep(self.retry_s)

    async def _push_share(self, action: SetBucket | Hold, push: _HandoffPush | None = None) -> bool:
        """Push one share change; True once the broker has it (or holds the topic). With
        ``push``: the source's decrease, which sets its forwarding route and hands its
        share over to the armed destination in the same step."""
        extra: dict[str, str] = {}
        body = None
        if push is not None:
            extra = {"handoff": push.to, "token": push.token}
            body = None if push.plan.route is None else push.plan.route.doc
        if isinstance(action, Hold):
            params = {"topic": action.topic, **extra}
            # A refused route (400) would be refused again: taken, logged.
            return await self._post_to_broker(
                action.broker, "/srtm/bucket/hold", params, action.topic,
                taken=(200, 400), body=body,
            )  # fmt: skip
        return await self._push_bucket(action, extra, body)

    def start_fitting(self, topic: str, fit: FitSettings, model: BrokerModel | None) -> None:
        """Online fitting of ``topic`` in the background; its progress is the topic's
        ``fitting`` (running from now on)."""
        self.ctrl.topics[topic].fitting = FittingProgress()
        self._spawn(self._fit(topic, fit.window_s, fit.min_samples, fit.settle_s, model))

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

                fleet = self.ctrl.fleet(exclude=topic)
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
                state.state = FitState.FAILED
        await self.save_topic(topic)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _order_migration(self, action: Migrate) -> None:
        params = {"topic": action.topic, "publisher": action.publisher, "to": action.to,
                  "version": str(action.version)}  # fmt: skip
        await self._post_to_broker(action.broker, "/srtm/migrate", params, "a migration")

    async def _push_bucket(
        self,
        action: SetBucket,
        extra: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> bool:
        params = {
            k: repr(v) if isinstance(v, float) else str(v)
            for k, v in self.ctrl.bucket_doc(action.topic, action.bucket).items()
        }
        params = {"topic": action.topic, **params, **(extra or {})}  # fmt: skip
        return await self._post_to_broker(
            action.broker, "/srtm/bucket", params, action.topic, taken=(200, 400, 409),
            body=body,
        )  # fmt: skip

    async def _route(self, action: SetRoute | DropRoute) -> None:
        """Push one route (``POST /srtm/route``) or drop it (``DELETE``; 404: none there).
        A broker that does not take it is logged; it gets its routes again when it
        registers."""
        info = self.ctrl.brokers.get(action.broker)
        if info is None or self._session is None or info.down:
            return
        try:
            url = _broker_url(info, "/srtm/route")
            if isinstance(action, SetRoute):
                request = self._session.post(url, json=action.doc, headers=self._headers())
            else:
                params = {"topic": action.topic}
                request = self._session.delete(url, params=params, headers=self._headers())
            async with request as r:
                if r.status not in (200, 404) or (r.status == 404 and isinstance(action, SetRoute)):
                    log.warning("broker %s refused the route of %s: %s", action.broker,
                                action.topic, await r.text())  # fmt: skip
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("broker %s unreachable for the route of %s: %s",
                        action.broker, action.topic, exc)  # fmt: skip

    async def _unmanage(self, action: Unmanage) -> None:
        """The broker drops the topic's sub-bucket and releases what it holds of it (404:
        it never had the topic, nothing to drop)."""
        params = {"topic": action.topic}
        await self._post_to_broker(
            action.broker, "/srtm/bucket", params, action.topic, "DELETE", fine=(200, 404)
        )

    async def _post_to_broker(
        self,
        broker: str,
        path: str,
        params: dict[str, str],
        what: str,
        method: str = "POST",
        fine: tuple[int, ...] = (200,),
        taken: tuple[int, ...] = (200,),
        body: dict[str, Any] | None = None,
    ) -> bool:
        """Send an order to a broker (``fine``: statuses not worth a warning); a refusal
        or an unreachable broker is logged, not raised (a re-registering broker gets its
        sub-buckets again). True when the answer's status is in ``taken``: nothing to try
        again (a bucket refused as invalid (400) never will be; a broker whose lease
        lapsed (409) holds the topic)."""
        info = self.ctrl.brokers.get(broker)
        if info is None or self._session is None:
            return True
        try:
            url = _broker_url(info, path)
            request = self._session.request(
                method, url, params=params, json=body, headers=self._headers()
            )
            async with request as r:
                if r.status not in fine:
                    log.warning("broker %s refused %s: %s", broker, params, await r.text())
                return r.status in taken
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("broker %s unreachable for %s: %s", broker, what, exc)
            return False

    # -- HTTP ----------------------------------------------------------------------------
    def app(self) -> web.Application:
        """The HTTP API (``srtm.control.api``) serving this controller."""
        opts = self.options
        return make_app(self, opts.token, opts.models_dir, opts.joins_need_auth)

    def info(self) -> dict[str, Any]:
        """What /info answers (``documents.Info``)."""
        return {"version": __version__, "ticks": self.ctrl.ticks, "stalls": self.ctrl.stalls,
                "stalled_s": self.ctrl.stalled_s, "tls": self.options.tls_cert is not None,
                "auth": self.options.token is not None,
                **({"elastic": self.elastic.to_json()} if self.elastic else {})}  # fmt: skip


@dataclass(frozen=True, slots=True)
class _HandoffPush:
    """A handoff with its destination armed: where the source sends HANDOFF, and the
    token it carries."""

    plan: Handoff
    to: str
    token: str


def _broker_url(info: BrokerInfo, path: str) -> URL:
    """A URL on a broker's HTTP API built from its parsed host and port (never pasted
    from the registered text, which could carry a path, user info or another host)."""
    host, port = info.http_endpoint()
    return URL.build(scheme="http", host=host, port=port, path=path)


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
