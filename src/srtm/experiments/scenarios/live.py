"""A scenario run live on 127.0.0.1: a controller and capacity-limited brokers as child
processes, the topic created with its SLO and placed (and fitted) by the controller, the
workload emulated, every message traced on both sides, then everything stopped and the
traces analysed.

Timeline of a run: warm-up traffic (fitting runs in it, the TB Adaptor settles), then the
measured window of ``duration_s``; sending stops at its end, and the run waits until the
subscriber has everything the brokers acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from srtm.analysis import profile_bucket
from srtm.experiments import analysis, host
from srtm.experiments.scenarios.scenario import (
    ProfileTrace,
    PublisherOrder,
    Scenario,
    groups_per_broker,
)
from srtm.experiments.sizing import Sizing
from srtm.experiments.validity import RunFigures, Validity, check
from srtm.launch import LocalCluster, die_with_parent, start_cluster
from srtm.placement import Policy, parse_policy
from srtm.quantiles import quantiles
from srtm.workload import PublisherSpec, build
from srtm.workload.emulator import Emulator, EmulatorReport, follow_plan, routes_of

#: (phase, done, total): what a run is doing, for progress bars.
OnProgress = Callable[[str, float, float], None]
#: Longest the warm-up waits for fitting before measuring anyway.
FIT_BUDGET_S = 60.0
#: Traffic after fitting before the measured window starts (moves settle, adaptor acts).
SETTLE_S = 2.0


def max_late_s(sc: Scenario) -> float:
    """How late the emulator may send an event before it skips it instead
    (``Scenario.max_send_late_ms``): a scenario slowed in time (``Scenario.time_scale``)
    divides it by its scale, as its other queueing durations."""
    return sc.max_send_late_ms / 1e3 / sc.time_scale


#: The emulator's schedule starts this long after the driver starts it.
START_LEAD_S = 0.05

#: Preloaded brokers count as loaded once the controller sees this share of their rate.
PRELOAD_SEEN = 0.8
PRELOAD_TIMEOUT_S = 30.0
PRELOAD_POLL_S = 0.1

#: How long a run waits after sending for the subscriber to receive what was acknowledged.
DRAIN_S = 30.0


@dataclass
class LiveRun:
    """What the driver learned while running (the rest comes from the traces)."""

    run: str
    policy: str
    rate: float = 0.0
    burst: float = 0.0
    window: analysis.MeasuredWindow = field(default_factory=lambda: analysis.MeasuredWindow(0, 0))
    fitting: dict[str, Any] | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    emulator: EmulatorReport | None = None
    subscriber_received: int = 0
    #: Whether the subscriber had everything acknowledged when the drain ended (else what
    #: it lacks may only be late, on a starved machine, not lost).
    drained: bool = True
    #: The run's own conditions in the measured window (``validity.check``).
    validity: Validity | None = None
    #: Seconds from the topic's creation until fitting ended (the driver's clock; None:
    #: no fitting, or it had not ended within the budget).
    fit_s: float | None = None


def run_name(sc: Scenario, policy: str) -> str:
    """``<scenario>-<policy>``, and ``-shuffled`` after it when the publishers were handed
    over shuffled (so both orders' runs can share an output directory)."""
    suffix = "" if sc.publisher_order is PublisherOrder.block else f"-{sc.publisher_order}"
    return f"{sc.name}-{policy}{suffix}"


def run(
    sc: Scenario,
    policy: Policy,
    out: Path,
    *,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    on_progress: OnProgress | None = None,
    sizing: Sizing | None = None,
    fit_budget_s: float = FIT_BUDGET_S,
) -> dict[str, Any]:
    """Run ``sc`` under ``policy``; write traces under ``out/traces`` and the summary to
    ``out/<run>.json``; return the summary. Nothing is left running, even on Ctrl-C.
    ``sizing``: how ``sc`` was sized to this machine (``srtm.experiments.sizing``), kept
    in the summary. ``fit_budget_s``: the longest the warm-up waits for fitting."""
    policy = parse_policy(policy)  # callers from untyped input
    duration = sc.duration_s if duration_s is None else duration_s
    warmup = sc.warmup_s if warmup_s is None else warmup_s
    if duration <= 0 or warmup < 0:
        raise ValueError("duration must be > 0 and warm-up >= 0")
    name = run_name(sc, policy)
    traces = out / "traces"
    _clear_run(traces, name)
    cluster_dir = out / "cluster" / name.removeprefix(f"{sc.name}-")
    shutil.rmtree(cluster_dir, ignore_errors=True)
    progress = on_progress or (lambda *_: None)
    progress("starting brokers", 0, 1)
    broker_args = [
        "--capacity", repr(sc.capacity), "--mcap", repr(sc.mcap),
        "--trace-dir", str(traces), "--run", name,
        # Releases are ms apart here: no spinning (nor polling), or 4 brokers would
        # need 4 cores.
        "--release-spin-us", "0", "--busy-poll-us", "0",
    ]  # fmt: skip
    cluster = start_cluster(
        cluster_dir, sc.brokers, broker_args=broker_args, controller_args=controller_args(sc),
        tie_to_parent=True,
    )  # fmt: skip
    info = LiveRun(name, policy)
    try:
        progress("starting brokers", 1, 1)
        drive = _drive(
            sc, policy, cluster, traces, info, (warmup, duration, fit_budget_s), progress
        )
        _run_async(drive)
    finally:
        progress("stopping", 0, 1)
        cluster.stop()  # brokers flush their traces on the way out
    progress("analysing", 0, 1)
    summary = _summarize(sc, info, traces, duration)
    summary["sizing"] = (sizing or Sizing(sc.time_scale)).to_json()
    (traces / "runs").mkdir(parents=True, exist_ok=True)
    (traces / "runs" / f"{name}.json").write_text(json.dumps(_metadata(sc, info), indent=2))
    save_summary(out, summary)
    progress("analysing", 1, 1)
    return summary


def save_summary(out: Path, summary: dict[str, Any]) -> Path:
    """Write the run's summary to ``summary_path``."""
    path = summary_path(out, summary["run"])
    path.write_text(json.dumps(summary, indent=2))
    return path


def summary_path(out: Path, run_name: str) -> Path:
    """``out/<run>.json``: where the summary of the run ``run_name`` is saved."""
    return out / f"{run_name}.json"


def _clear_run(traces: Path, name: str) -> None:
    """Re-running a scenario replaces its earlier traces."""
    for side in ("broker", "subscriber"):
        shutil.rmtree(traces / side / f"run={name}", ignore_errors=True)
    (traces / "runs" / f"{name}.json").unlink(missing_ok=True)


def _run_async(coro: Any) -> None:
    """Run a live run's driver on uvloop (asyncio without it). The garbage of the runs
    before it is collected first: a full collection in the middle of a run (54 ms for
    the 7,000 objects one move run left) made the next run's load generator send late
    (dynamoth-move's second run skipped 35-47 sends as over 10 ms late, and none once
    collected before). Not frozen, unlike the broker's start: a process running many
    runs (the test suite) would keep every frozen object's cycles for good."""
    gc.collect()
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


def profile(sc: Scenario) -> tuple[float, float]:
    """The topic's (r, b), profiled as the paper does from 10 s of a trace of its own
    workload: drawn with a different seed from the one the run sends, or (``profile_trace
    = run``) the run's own schedule, whose periodic publishers keep their phases."""
    seed = sc.seed if sc.profile_trace is ProfileTrace.run else sc.seed + 10_000
    sample = build(sc.specs(), 10.0, spread_s=sc.spread_ms / 1e3, seed=seed)
    params = profile_bucket(sample.arrivals_ns(), sc.rate_factor)
    return params.rate, max(1.0, float(round(params.burst)))


def controller_args(sc: Scenario) -> list[str]:
    """A model-assisted scenario's controller may read model files from the folder of
    ``fit.model`` (and only there: ``--models-dir``)."""
    if sc.fit is None or sc.fit.model is None:
        return []
    return ["--models-dir", str(Path(sc.fit.model).resolve().parent)]


def topic_document(sc: Scenario, policy: str, specs: list[PublisherSpec]) -> dict[str, Any]:
    rate, burst = profile(sc)
    doc: dict[str, Any] = {
        "name": sc.topic, "slo_p99_ms": sc.slo_p99_ms, "rate": rate, "burst": burst,
        "policy": policy,
        "publishers": [{"id": p.id, "rate": p.rate, "group": p.group} for p in specs],
    }  # fmt: skip
    if sc.fit is not None and policy != "lb":  # LB is the baseline: it places, no more
        fit = {k: v for k, v in asdict(sc.fit).items() if v is not None}
        if sc.fit.model is not None:  # named under --models-dir (``controller_args``)
            fit["model"] = Path(sc.fit.model).name
        doc["fit"] = fit
    return doc


async def _drive(
    sc: Scenario,
    policy: str,
    cluster: LocalCluster,
    traces: Path,
    info: LiveRun,
    spans: tuple[float, float, float],
    progress: OnProgress,
) -> None:
    """``spans``: the warm-up, the measured window and the fitting budget, seconds."""
    warmup, duration, budget = spans
    url = cluster.url
    specs = sc.specs()  # the workload: the same schedule in either publisher order
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        preload = await _start_preload(sc, cluster, http)
        sink = Sink(url, sc.topic, traces, info.run)
        try:
            doc = topic_document(sc, policy, sc.placement_specs())
            info.rate, info.burst = doc["rate"], doc["burst"]
            created = time.monotonic()
            async with http.post(f"{url}/topics", json=doc, headers=cluster.headers) as r:
                body = await r.json()
                if r.status != 201:
                    raise RuntimeError(f"the controller refused the topic: {body.get('message')}")
            plan = await _get(http, f"{url}/plan?topic={sc.topic}")
            await sink.wait_brokers(len(plan["brokers"]))
            total_s = warmup + duration + (budget if "fit" in doc else 0.0)
            schedule = build(specs, total_s, spread_s=sc.spread_ms / 1e3, seed=sc.seed)
            emulator = Emulator(
                schedule, sc.topic, {}, message_size=sc.message_size, max_late_s=max_late_s(sc)
            )
            emulator.route(routes_of(plan))  # the first routes; later plans are followed
            following = asyncio.create_task(follow_plan(emulator, url, sc.topic, 0.1))
            # The schedule's time 0 is the driver's (the measured window is placed from it),
            # a little ahead so that the first events are not late before the task runs.
            t0 = time.time_ns() + int(START_LEAD_S * 1e9)
            sending = asyncio.create_task(emulator.run(start_ns=t0))
            with _favoured():
                try:
                    fit = (created, budget) if "fit" in doc else None
                    start = await _warm_up(http, url, sc, fit, warmup, t0, progress, info)
                    end = start + int(duration * 1e9)
                    info.window = analysis.MeasuredWindow(start, end)
                    emulator.stop_at(end)
                    watch = _Watch(_run_pids(cluster, sink), emulator.report.skipped_late)
                    await _measure(end, duration, progress, watch)
                    watched = watch.end()
                    late = await _broker_lateness(http, cluster, sc.topic)
                    info.emulator = await sending
                    info.validity = _validity(sc, emulator, info.window, watch, watched, late)
                finally:
                    following.cancel()
                    sending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await following
                    with contextlib.suppress(asyncio.CancelledError):
                        await sending
                    await emulator.close()
            info.plan = await _get(http, f"{url}/plan?topic={sc.topic}")
            progress("draining", 0, 1)
            info.subscriber_received = await sink.until(info.emulator.acknowledged, DRAIN_S)
            info.drained = info.subscriber_received >= info.emulator.acknowledged
            progress("draining", 1, 1)
        finally:
            info.subscriber_received = max(info.subscriber_received, sink.stop())
            if preload is not None:
                preload.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await preload


@contextlib.contextmanager
def _favoured() -> Iterator[None]:
    """Run the emulator ahead of the brokers where allowed (root): its lateness shapes the
    workload, while the brokers' own delays are what is measured. Children started
    earlier keep their priority; it is restored before the next run starts any."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, before - 5)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, before)


async def _get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as r:
        doc: dict[str, Any] = await r.json()
        if r.status != 200:
            raise RuntimeError(f"GET {url}: {doc.get('message')}")
        return doc


async def _warm_up(
    http: aiohttp.ClientSession,
    url: str,
    sc: Scenario,
    fitting: tuple[float, float] | None,
    warmup: float,
    t0: int,
    progress: OnProgress,
    info: LiveRun,
) -> int:
    """Wait out the warm-up (and fitting: ``(when the topic was created, budget s)``);
    returns when the measured window starts."""
    ready_at = t0 + int(warmup * 1e9)
    if fitting is not None:
        created, budget = fitting
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            doc = await _get(http, f"{url}/topics/{sc.topic}")
            info.fitting = doc.get("fitting")
            state = (info.fitting or {}).get("state")
            rounds = sum((info.fitting or {}).get("rounds", []))
            progress(f"fitting (round {rounds + 1})", 0, 1)
            if state in ("done", "failed"):
                info.fit_s = time.monotonic() - created
                break
            await asyncio.sleep(0.25)  # polls the fitting's state (progress shown meanwhile)
        progress("fitting", 1, 1)
        ready_at = max(ready_at, time.time_ns() + int(SETTLE_S * 1e9))
    while (left := ready_at - time.time_ns()) > 0:
        progress("warming up", warmup - left / 1e9, max(warmup, 1e-9))
        await asyncio.sleep(min(0.25, left / 1e9))  # the warm-up is a span of time
    return ready_at


async def _measure(end: int, duration: float, progress: OnProgress, watch: _Watch) -> None:
    while (left := end - time.time_ns()) > 0:
        progress("measuring", duration - left / 1e9, duration)
        watch.tick()
        await asyncio.sleep(min(0.25, left / 1e9))  # the window is a span of time
    progress("measuring", duration, duration)


class _Watch:
    """The machine and the run's processes over the measured window (``host``)."""

    def __init__(self, names: dict[int, str], skipped: int) -> None:
        self.names, self.skipped_at_start = names, skipped
        self.start = host.take(list(names))
        self.max_load1 = self.start.load1

    def tick(self) -> None:
        load = host.take([]).load1
        if load is not None and (self.max_load1 is None or load > self.max_load1):
            self.max_load1 = load

    def end(self) -> host.HostFigures:
        self.tick()
        return host.between(self.start, host.take(list(self.names)), os.cpu_count() or 1)


def _run_pids(cluster: LocalCluster, sink: Sink) -> dict[int, str]:
    """This process (the emulator's), the controller's, the brokers' and the sink's."""
    names = {os.getpid(): "the emulator", cluster.controller.proc.pid: "the controller",
             sink.proc.pid: "the subscriber"}  # fmt: skip
    for i, b in enumerate(cluster.brokers, 1):
        names[b.proc.pid] = f"broker {i}"
    return names


async def _broker_lateness(
    http: aiohttp.ClientSession, cluster: LocalCluster, topic: str
) -> float | None:
    """The worst broker's release lateness p99 (ms) for ``topic`` (since it started: the
    brokers' histograms are cumulative), None if no broker could say."""
    worst = None
    for b in cluster.brokers:
        try:
            doc = await _get(http, f"http://{b.http_address}/stats?format=json&topic={topic}")
        except (aiohttp.ClientError, TimeoutError, RuntimeError):
            continue
        for t in doc.get("srtm", {}).get("topics", []):
            late = t.get("release_lateness_ns", {})
            if t.get("topic") == topic and late.get("count"):
                p99 = late["p99"] / 1e6
                worst = p99 if worst is None else max(worst, p99)
    return worst


def _validity(
    sc: Scenario,
    emulator: Emulator,
    window: analysis.MeasuredWindow,
    watch: _Watch,
    watched: host.HostFigures,
    broker_late_ms: float | None,
) -> Validity:
    """The run's figures over its measured window, checked."""
    rep, sched = emulator.report, emulator.schedule
    due = np.repeat(sched.t_ns, sched.batch) + rep.started_ns
    in_window = (due >= window.start_ns) & (due < window.end_ns)
    late = rep.lateness_ns[in_window]
    late = late[late >= 0]
    q = quantiles(late, (0.99, 0.999), scale=1e6, empty=0.0)
    figures = RunFigures(
        slo_p99_ms=sc.slo_p99_ms,
        max_late_ms=max_late_s(sc) * 1e3,
        send_late_p99_ms=q["p99"],
        send_late_p999_ms=q["p999"],
        due=int(in_window.sum()),
        skipped_late=rep.skipped_late - watch.skipped_at_start,
        broker_late_p99_ms=broker_late_ms,
        run_queue_wait=watched.run_queue_wait,
        waited_most=watch.names.get(watched.waited_most or -1),
        steal=watched.steal,
        foreign_cpu=watched.foreign_cpu,
        load_per_cpu=None if watch.max_load1 is None else watch.max_load1 / watched.cpus,
        cpus=watched.cpus,
        run_cpus=watched.run_cpus,
    )
    return check(figures)


async def _start_preload(
    sc: Scenario, cluster: LocalCluster, http: aiohttp.ClientSession
) -> asyncio.Task[Any] | None:
    """Background topics on the preloaded brokers, running until cancelled; returns once
    the brokers have reported the load (so the controller places around it)."""
    if not sc.preload:
        return None
    specs, routes = [], {}
    for p in sc.preload:
        address = cluster.brokers[p.broker - 1].tcp_address
        for i in range(10):
            pid = f"preload-{p.broker}-{i}"
            specs.append(PublisherSpec(pid, p.rate / 10, "poisson"))
            routes[pid] = address
    schedule = build(specs, 3_600.0, seed=sc.seed + 20_000)
    emulator = Emulator(schedule, "preload", routes, message_size=sc.message_size, name="preload")

    async def send() -> None:
        try:
            await emulator.run()
        finally:
            await emulator.close()

    task = asyncio.create_task(send())
    await _until_loaded(http, cluster, {str(p.broker): p.rate for p in sc.preload})
    return task


async def _until_loaded(
    http: aiohttp.ClientSession, cluster: LocalCluster, rates: dict[str, float]
) -> None:
    """Waits until the controller's ``/brokers`` shows each broker carrying most of its
    preload (so that placement sees it); Poisson traffic is never exactly on its rate."""
    deadline = time.monotonic() + PRELOAD_TIMEOUT_S
    while True:
        doc = await _get(http, f"{cluster.url}/brokers")
        measured = {b["id"]: b["measured"] for b in doc["brokers"]}
        short = {b: r for b, r in rates.items() if measured.get(b, 0.0) < PRELOAD_SEEN * r}
        if not short:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"preloaded brokers never reported their load: {short}")
        await asyncio.sleep(PRELOAD_POLL_S)


class Sink:
    """The subscriber process (``srtm.experiments.sink``) and what it last printed."""

    def __init__(self, controller: str, topic: str, traces: Path, run: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "srtm.experiments.sink", controller, topic, str(traces), run],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        self.received = 0
        self.brokers = 0
        self.done: int | None = None
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            parts = line.split()
            if parts[:1] == ["received"] and len(parts) == 4:
                self.received, self.brokers = int(parts[1]), int(parts[3])
            elif parts[:1] == ["done"]:
                self.done = int(parts[1])

    async def wait_brokers(self, n: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while self.brokers < n:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the subscriber exited early (code {self.proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the subscriber reached {self.brokers} of {n} brokers")
            await asyncio.sleep(0.05)

    async def until(self, count: int, timeout: float) -> int:
        """Wait until it has received ``count`` messages (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout
        while self.received < count and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        return self.received

    def stop(self) -> int:
        """SIGTERM (it flushes its traces); returns how many messages it received."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.done if self.done is not None else self.received


def _metadata(sc: Scenario, info: LiveRun) -> dict[str, Any]:
    """``runs/<run>.json`` of the trace dataset (DESIGN.md, Data)."""
    return {
        "run": info.run,
        "policy": info.policy,
        "scenario": sc.name,
        "publisher_order": str(sc.publisher_order),
        "slo_p99_ms": sc.slo_p99_ms,
        "time_scale": sc.time_scale,
        "topic": sc.topic,
        "rate": info.rate,
        "burst": info.burst,
        "window_start_ns": info.window.start_ns,
        "window_end_ns": info.window.end_ns,
        "assignment": {b["id"]: b["publishers"] for b in info.plan.get("brokers", [])},
        "buckets": {b["id"]: b["bucket"] for b in info.plan.get("brokers", [])},
        "brokers": sc.brokers,
        "capacity": sc.capacity,
        "mcap": sc.mcap,
        "fitting": info.fitting,
    }


def _summarize(sc: Scenario, info: LiveRun, traces: Path, duration: float) -> dict[str, Any]:
    broker_rows, sub_rows = analysis.load(traces, info.run)
    rep = info.emulator
    published = rep.per_publisher if rep is not None else {}
    summary: dict[str, Any] = {
        "run": info.run,
        "scenario": sc.name,
        "policy": info.policy,
        "publisher_order": str(sc.publisher_order),
        "slo_p99_ms": sc.slo_p99_ms,
        "duration_s": duration,
        "window_start_ns": info.window.start_ns,
        "window_end_ns": info.window.end_ns,
        "rate": info.rate,
        "burst": info.burst,
        "brokers_assigned": len(info.plan.get("brokers", [])),
        # How the final plan cut the correlation groups (the point of publisher_order).
        "groups_per_broker": groups_per_broker(
            {b["id"]: b["publishers"] for b in info.plan.get("brokers", [])}, sc.specs()
        ),
        "brokers_available": sc.brokers,
        # Who the final plan left without a broker (``validity.findings``).
        "publishers": len(sc.specs()),
        "unplaced_publishers": (
            len(info.plan["unassigned"]) if "unassigned" in info.plan else None
        ),
        "fitting_rounds": (info.fitting or {}).get("rounds", []),
        "fitting_state": (info.fitting or {}).get("state"),
        "fitting_outcome": (info.fitting or {}).get("outcome"),
        "fitting_note": (info.fitting or {}).get("note"),
        "fitting_s": info.fit_s,
        "analysis": dict(analysis.ENGINE),
    }
    summary |= analysis.summarize(broker_rows, sub_rows, info.window, sc.slo_p99_ms)
    summary["accounting"] = analysis.accounting(sub_rows, published)
    summary["group_bursts"] = analysis.group_bursts(sub_rows, info.window)
    summary["drained"] = info.drained
    if rep is not None:
        summary["emulator"] = {
            "scheduled_sent": rep.sent, "acknowledged": rep.acknowledged, "failed": rep.failed,
            "unrouted": rep.unrouted, "skipped_late": rep.skipped_late,
            "max_late_ms": max_late_s(sc) * 1e3, "rate": rep.rate,
            "send_lateness": rep.lateness_summary(),
        }  # fmt: skip
    if info.validity is not None:
        summary["validity"] = info.validity.to_json()
    return summary
