"""``srtm controller``: the controller's state behind its HTTP API (``srtm.control.api``),
a 1 s tick (down brokers, TB Adaptor), sub-buckets and migration orders pushed to
brokers (``srtm.control.push``), online fitting driven, the elastic and utility loops,
everything kept in SQLite or etcd (``srtm.control.store_writer``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from srtm.control.actions import Action, Hold, PlanChanged, SetBucket
from srtm.control.api import make_app
from srtm.control.elastic import Elastic, ElasticStep
from srtm.control.election import Election
from srtm.control.etcd_store import EtcdStore, open_store
from srtm.control.fitting_run import fit_topic
from srtm.control.follow import Follower
from srtm.control.leadership import LeaderInfo, Leadership, Role
from srtm.control.liveness import LivenessWatch
from srtm.control.model import FitState, FittingProgress
from srtm.control.nodes import node_urls, provisioner_for
from srtm.control.options import ControllerOptions
from srtm.control.provision import (
    Provisioner,
    ProvisionError,
)
from srtm.control.push import Pusher
from srtm.control.state import Controller
from srtm.control.store import StateStore, load_state
from srtm.control.store_writer import StoreWriter
from srtm.control.utility import UtilityControl, UtilitySettings
from srtm.etcd import Etcd, endpoint_urls
from srtm.jsondoc import parse as parse_json
from srtm.placement import RoundResult
from srtm.security import check_token, require_loopback_without_token
from srtm.utility.cost import model_from_doc
from srtm.utility.optimizer import optimize
from srtm.version import __version__

if TYPE_CHECKING:
    from srtm.control.documents import FitSettings
    from srtm.sim.model import BrokerModel

log = logging.getLogger("srtm.controller")


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
        self.store: StateStore = open_store(opts)
        self.writer = StoreWriter(self.ctrl, self.store, on_unsaved=self._unsaved)
        #: With etcd, one leader among the controllers on its prefix (the others are
        #: standbys following its state); with SQLite, this one alone.
        scheme = "https" if opts.tls_cert is not None else "http"
        me = LeaderInfo(uuid.uuid4().hex, f"{opts.http_host}:{opts.http_port}", scheme)
        self.election: Election | None = None
        if isinstance(self.store, EtcdStore):
            self.leadership = Leadership(opts.leader_lease_s, me)
            urls = endpoint_urls(opts.etcd_endpoints or "")
            etcd = Etcd(urls, timeout_s=opts.leader_lease_s / 2)
            self.election = Election(
                etcd, opts.etcd_prefix, self.leadership, on_won=self._won,
                on_lost=self._lost, on_change=lambda: self.follower.changed(),
            )  # fmt: skip
            self.store.fence = self.election.fence()  # a standby writes nothing
        else:
            self.leadership = Leadership.alone(me)
        self.follower = Follower(self.ctrl, self.writer, self._following)
        self.liveness = LivenessWatch.of(opts.etcd_endpoints, opts.etcd_prefix, self.ctrl)
        self.ctrl.registry.tombstone_s = opts.tombstone_s
        saved = load_state(self.store)
        if saved:
            self.ctrl.restore(saved, time.monotonic())
        self.http_address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None
        #: What goes to brokers: actions carried out, probes, measurements, admissions.
        self.pusher = Pusher(self.ctrl, opts.token, retry_s=min(0.5, opts.tick_s))
        self.pusher.acting = self.acting
        self.pusher.subscriber_wait_s = opts.subscriber_wait_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._tick: asyncio.Task[None] | None = None
        #: Silent brokers being asked whether their address still answers.
        self._probing: set[str] = set()
        #: Per topic: share changes issued and not yet carried out (a repair waits for 0).
        self._busy: dict[str, int] = {}
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
        if opts.rebalance and opts.nodes:
            node_urls(opts.nodes)  # a bad --nodes stops the start, named
        if opts.rebalance:
            self.elastic = Elastic(
                opts.rebalance_settings,
                spawn_timeout_s=opts.provision_timeout_s + 5 * opts.broker_timeout_s,
                grace_s=opts.broker_timeout_s,
            )

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.pusher.open()
        await self.liveness.start()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.options.http_host, self.options.http_port,
            ssl_context=self._ssl_context(),
        )  # fmt: skip
        await site.start()
        self.http_address = (self.options.http_host, int(self._runner.addresses[0][1]))
        me = self.leadership.me
        host, port = self.http_address
        self.leadership.set_me(LeaderInfo(me.id, f"{host}:{port}", me.scheme))
        if self.election is not None:
            assert isinstance(self.store, EtcdStore)
            await self.election.start(self.store.revision + 1)
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
        assert self.http_address is not None
        scheme = "https" if self.options.tls_cert is not None else "http"
        return provisioner_for(self.options, "{}://{}:{}".format(scheme, *self.http_address))

    async def stop(self) -> None:
        await self.follower.close()
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
        await self.pusher.close()
        await self.liveness.stop()
        await self.writer.close()
        if self.election is not None:  # after the last write: a standby takes over now
            await self.election.stop()
        self.store.close()

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.options.tls_cert is None or self.options.tls_key is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.options.tls_cert, self.options.tls_key)
        return ctx

    # -- leadership ----------------------------------------------------------------------
    def acting(self) -> bool:
        """Does this controller change plans and tell brokers now (the only one, or the
        leader whose lease surely holds)?"""
        return self.leadership.acting(time.monotonic())

    async def _won(self, epoch: int) -> None:
        """Elected: writes fenced on this epoch, the last leader's state read, pushes
        carry the epoch; then it acts (``Leadership.won``)."""
        assert self.election is not None and isinstance(self.store, EtcdStore)
        self.store.fence = self.election.fence()
        await self.follower.reload()
        self.pusher.epoch = epoch

    async def _lost(self) -> None:
        """No longer leading: nothing written or pushed, and the state is what was
        written (the leader's from now on), not what this one held."""
        assert self.election is not None and isinstance(self.store, EtcdStore)
        self.store.fence = self.election.fence()
        self.pusher.epoch = None
        self.follower.changed()

    def _following(self) -> bool:
        return self.leadership.role is Role.STANDBY

    def _unsaved(self, exc: Exception) -> None:
        """A write failed (the writer's callback): a leader steps down, pushes nothing of
        it and reloads; a plan brokers heard of but etcd did not keep, the next leader
        would undo."""
        if self.election is not None:
            self.election.step_down(f"a write failed: {exc}")

    async def _tick_loop(self) -> None:
        """Ticks forever: an exception in one tick is logged and the next one runs."""
        while True:
            await asyncio.sleep(self.options.tick_s)
            if not self.acting():
                continue
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
        if after <= 0 or self.pusher.session is None:
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
            if info is None or info.down or self.pusher.session is None:
                return
            address = info.http_address
            if not await self.pusher.refuses(info):
                return
            if not await self.liveness.revoke(broker_id, address):
                return  # etcd did not answer: its lease decides
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
            if not self.acting():
                continue
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
            if not self.acting():
                continue
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
            self._spawn(self.pusher.post_admission(broker, topic, body))

    async def _rate_control_loop(self) -> None:
        """Every ``rate_control_interval_s``: one rate control step (none while the
        optimizer runs: its answer replaces the rates anyway)."""
        while True:
            await asyncio.sleep(self.options.rate_control_interval_s)
            if self._optimizing or not self.acting():
                continue
            try:
                self.utility.observe(self.ctrl)
                self.execute(self.utility.control(self.ctrl))
            except Exception:
                log.exception("a rate control step failed; the next one runs")

    def utility_doc(self) -> dict[str, Any]:
        """``GET /utility``: the optimizer's last run."""
        return self.utility.doc()

    # -- actions -------------------------------------------------------------------------
    def save_state(self) -> asyncio.Future[None]:
        """Have everything written: brokers and every topic (a broker registering)."""
        return self.writer.mark(self.ctrl.topics, brokers=True)

    def save_topic(self, name: str) -> asyncio.Future[None]:
        """Have one topic's row written."""
        return self.writer.mark([name])

    def execute(self, actions: list[Action]) -> asyncio.Future[None] | None:
        """Persist, then carry the actions out in order in the background (sub-buckets
        before migration orders, so a destination shapes from the first message); the
        future of the write (None: nothing to write)."""
        written = self.writer.persist(actions)
        if any(not isinstance(a, PlanChanged) for a in actions):
            self._spawn(self._carry_out(actions, written, self._take(actions)))
        return written

    async def _execute_now(self, actions: list[Action]) -> None:
        """``execute``, awaited: the fitting driver must know the plan is in place."""
        await self._carry_out(actions, self.writer.persist(actions), self._take(actions))

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

    def next_order(self) -> tuple[int, int]:
        """A registration answer's place among the orders to brokers (``Pusher``)."""
        return self.pusher.next_order()

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

    async def _carry_out(
        self,
        actions: list[Action],
        written: asyncio.Future[None] | None = None,
        busy: Sequence[str] = (),
    ) -> None:
        try:
            await self.pusher.carry_out(actions, written)
        finally:
            for t in busy:
                self._busy[t] -= 1
                if not self._busy[t]:
                    del self._busy[t]

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
            return await self.pusher.measure(topic, broker, publishers, window)

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
                **self.leadership.doc(time.monotonic()),
                **({"elastic": self.elastic.to_json()} if self.elastic else {})}  # fmt: skip


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
