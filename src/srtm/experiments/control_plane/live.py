"""control-plane-faults live on 127.0.0.1: the control plane's faults under load.

The cluster: ``etcd_members`` etcd members (``srtm.etcd_cluster``), ``controllers``
controllers on them electing a leader (``--etcd-endpoints``, ``--leader-lease-s``), and
``brokers`` brokers given every controller (``--controller URL,URL,URL``) and keeping their
shares on etcd leases (``--etcd-lease-s``). Each broker reaches etcd and the controllers
through cuttable links (``link``), so that one can be partitioned: the one with the
largest live shares when the fault comes. The load:
the tenants' topics, created through the leader, each published by an emulator following
the plan (from any controller) and read by a subscriber process writing traces.

A poller asks, every ``poll_s``: each controller's ``GET /info`` (who leads, its epoch),
each broker's ``/stats`` (its live share of every topic: Σ shares / r), and every second
a controller's ``GET /topics/NAME`` (plan versions). After each fault a probe sends a write
(``PATCH`` of the probe topic) to every controller, each on its own, until one leading takes it:
takeover time. Then the faults, one after the other, each settled before the next; at the
end sending stops, the subscribers drain, everything stops and the traces are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pandas as pd

from srtm.etcd_cluster import EtcdCluster, free_ports
from srtm.experiments import analysis, host, validity
from srtm.experiments.control_plane import report
from srtm.experiments.control_plane.link import CutLinks
from srtm.experiments.control_plane.measure import (
    FaultRecord,
    LeaderSample,
    Observed,
    Probe,
    ShareSample,
    TopicMessages,
    busiest,
    fault_row,
    share_samples,
    window_rows,
)
from srtm.experiments.control_plane.scenario import CpScenario, CpTenant, Fault, FaultKind
from srtm.experiments.scenarios.live import Sink, _favoured, _run_async
from srtm.launch import BrokerProcess, ServerProcess, die_with_parent, new_token
from srtm.launch import start_broker as launch_broker
from srtm.launch import start_controller as launch_controller
from srtm.workload import PublisherSpec, build
from srtm.workload.emulator import AckLedger, follow_plan

OnProgress = Callable[[str, float, float], None]
RUN = "control-plane-faults"
#: The topic the write probes change (its SLO, set to what it is): a write every
#: controller leading takes, with no share moved.
PROBE_TOPIC = "cp-probe"
PROBE_SLO_MS = 1_000.0
PROBE_EVERY_S = 0.1
#: One poll's (or probe's) wait for an answer: a stopped controller must not hold a round.
ASK_TIMEOUT_S = 0.5
MAX_LATE_S = 0.01
START_TIMEOUT_S = 60.0
LEAD_S = 1.0


@dataclass
class Plane:
    """The run's processes: etcd, the controllers (None while stopped) on fixed ports, the
    brokers (each behind its ``links`` to etcd and the controllers), all children of this
    process."""

    directory: Path
    s: CpScenario
    token: str
    etcd: EtcdCluster
    links: CutLinks
    ports: list[int]
    controllers: list[ServerProcess | None] = field(default_factory=list)
    brokers: list[BrokerProcess] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start_controller(self, i: int) -> None:
        """Controller ``i`` (from 0) on its port, on etcd; from the thread that stops it."""
        args = [
            "--http-address", f"127.0.0.1:{self.ports[i]}",
            "--etcd-endpoints", self.etcd.endpoints, "--etcd-prefix", self.s.etcd_prefix,
            "--leader-lease-s", str(self.s.leader_lease_s),
        ]  # fmt: skip
        self.controllers[i] = launch_controller(
            self.directory / f"controller-{i + 1}.db", args, preexec_fn=die_with_parent,
            token=self.token, timeout=START_TIMEOUT_S,
        )  # fmt: skip

    def stop_controller(self, i: int) -> None:
        c, self.controllers[i] = self.controllers[i], None
        if c is not None:
            with contextlib.suppress(Exception):
                c.stop()

    def pids(self) -> dict[int, str]:
        names = {os.getpid(): "the emulators and the poller"}
        for i, c in enumerate(self.controllers):
            if c is not None:
                names[c.proc.pid] = f"controller {i + 1}"
        for i, b in enumerate(self.brokers):
            names[b.proc.pid] = f"broker {i + 1}"
        return names

    def stop(self) -> None:
        for i in range(len(self.controllers)):
            proc = self.controllers[i]
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.proc.send_signal(signal.SIGCONT)  # a stopped one must hear SIGTERM
            self.stop_controller(i)
        for b in self.brokers:
            with contextlib.suppress(Exception):
                b.stop()
        self.links.close()
        self.etcd.stop_all()


def start_plane(directory: Path, s: CpScenario) -> Plane:
    """etcd, the controllers and the brokers; nothing is left running on failure."""
    etcd = EtcdCluster(directory / "etcd", s.etcd_members)
    etcd.start_all()
    plane = Plane(directory, s, new_token(), etcd, CutLinks(), free_ports(s.controllers))
    plane.controllers = [None] * s.controllers
    if plane.links.native_id is not None:
        favour(plane.links.native_id)  # the brokers' links are the network: not starved
    try:
        for i in range(s.controllers):
            plane.start_controller(i)
        for i in range(s.brokers):
            # Every broker behind links of its own: the one partitioned is chosen by load
            # when the fault comes.
            group = str(i + 1)
            via = [plane.links.add_http(group, u.split("//")[1]).address for u in plane.urls]
            ends = [
                plane.links.add(group, *_host_port(e)).address for e in etcd.endpoints.split(",")
            ]
            args = [
                "--broker-id", group,
                "--controller", ",".join(f"http://{a}" for a in via),
                "--etcd-endpoints", ",".join(ends),
                "--etcd-prefix", s.etcd_prefix, "--etcd-lease-s", str(s.broker_lease_s),
                "--mcap", repr(s.mcap),
                # Releases are ms apart: no spinning (nor polling), or the brokers would
                # need a core each.
                "--release-spin-us", "0", "--busy-poll-us", "0",
            ]  # fmt: skip
            broker = launch_broker(
                directory / f"broker-{group}", args, preexec_fn=die_with_parent,
                token=plane.token, timeout=START_TIMEOUT_S,
            )  # fmt: skip
            favour(broker.proc.pid)
            plane.brokers.append(broker)
    except BaseException:
        plane.stop()
        raise
    return plane


#: The data plane's nice value where allowed (root): brokers, subscribers and this process
#: (the emulators) ahead of the controllers and etcd, as if the control plane had machines
#: of its own; a controller restarted mid-run then does not starve the brokers on a
#: shared machine. Without the privilege everything runs at one priority.
FAVOURED_NICE = -5


def favour(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, FAVOURED_NICE)


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("//")[-1].rpartition(":")
    return host, int(port)


@dataclass
class _Seen:
    """What the driver saw while running."""

    t0_ns: int = 0
    leaders: list[LeaderSample] = field(default_factory=list)
    shares: list[ShareSample] = field(default_factory=list)
    versions: list[tuple[float, str, int]] = field(default_factory=list)
    #: Each topic's plan whenever its version changed: (t_s, version, broker -> rate).
    plans: list[dict[str, Any]] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    rates: dict[str, float] = field(default_factory=dict)
    emulators: dict[str, AckLedger] = field(default_factory=dict)
    sinks: dict[str, Sink] = field(default_factory=dict)
    end_s: float = 0.0
    host: host.HostFigures | None = None
    notes: list[str] = field(default_factory=list)

    def now_s(self) -> float:
        return (time.time_ns() - self.t0_ns) / 1e9


def run(out: Path, s: CpScenario, on_progress: OnProgress | None = None) -> dict[str, Any]:
    """One run: the cluster started, loaded, faulted, stopped; returns the document (also
    written to ``out/control-plane-faults.json``)."""
    traces = out / "traces"
    shutil.rmtree(traces / "subscriber" / f"run={RUN}", ignore_errors=True)
    directory = out / "cluster" / RUN
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    progress = on_progress or (lambda *_: None)
    progress("starting etcd, controllers, brokers", 0, s.send_s)
    plane = start_plane(directory, s)
    seen = _Seen()
    # Processes restarted mid-run are started from this one thread, which outlives them
    # (die_with_parent ties a child to the thread that started it).
    spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cp-spawner")
    spawner.submit(lambda: None).result()  # its thread exists before this one is favoured
    try:
        with _favoured():
            _run_async(_drive(plane, s, traces, seen, progress, spawner))
    finally:
        for sink in seen.sinks.values():
            sink.stop()
        spawner.submit(plane.stop).result()
        spawner.shutdown()
    data = summarize(s, seen, traces)
    out.mkdir(parents=True, exist_ok=True)
    document_path(out).write_text(json.dumps(data, indent=1, default=report.plain))
    return data


def document_path(out: Path) -> Path:
    return out / f"{RUN}.json"


async def _drive(
    plane: Plane, s: CpScenario, traces: Path, seen: _Seen, progress: OnProgress,
    spawner: ThreadPoolExecutor,
) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()

    def in_spawner(fn: Callable[[], Any]) -> Awaitable[Any]:
        return loop.run_in_executor(spawner, fn)

    tasks: list[asyncio.Task[Any]] = []
    timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await _until_leader(http, plane)
        await _create_topics(http, plane, s, seen)
        urls = ",".join(plane.urls)
        for k, tenant in enumerate(s.tenants):
            sink = seen.sinks[tenant.name] = Sink(urls, tenant.name, traces, RUN)
            favour(sink.proc.pid)
            await sink.wait_brokers(1)
            sched = build(_specs(tenant), s.send_s, seed=s.seed * 100 + k)
            em = AckLedger(sched, tenant.name, {}, name=f"cp-{tenant.name}", max_late_s=MAX_LATE_S)
            seen.emulators[tenant.name] = em
        seen.t0_ns = time.time_ns() + int(LEAD_S * 1e9)
        watch = host.take(list(plane.pids()))
        for t, em in seen.emulators.items():
            tasks.append(asyncio.create_task(follow_plan(em, urls, t, 0.2), name="follow"))
            tasks.append(asyncio.create_task(em.run(start_ns=seen.t0_ns), name="send"))
        tasks.append(asyncio.create_task(_poll(http, plane, seen, s.poll_s), name="poll"))
        try:
            await _sleep_until(seen, s.warmup_s)
            for fault in s.faults:
                progress(f"fault: {fault.kind}", seen.now_s(), s.send_s)
                rec = await _do(fault, http, plane, seen, in_spawner)
                await _sleep_until(seen, rec.heal_s + s.settle_s)
                rec.settled_s = seen.now_s()
                seen.faults.append(rec)
            await _sleep_until(seen, seen.now_s() + s.settle_s)
            seen.end_s = seen.now_s()
            seen.host = host.between(watch, host.take(list(plane.pids())), os.cpu_count() or 1)
            for em in seen.emulators.values():
                em.stop_at(time.time_ns())
            await asyncio.gather(*(x for x in tasks if x.get_name() == "send"),
                                 return_exceptions=True)  # fmt: skip
            progress("draining", seen.end_s, s.send_s)
            deadline = time.monotonic() + s.drain_s
            for t, em in seen.emulators.items():
                left = max(0.0, deadline - time.monotonic())
                await seen.sinks[t].until(len(em.acked), left)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for em in seen.emulators.values():
                await em.close()


def _specs(t: CpTenant) -> list[PublisherSpec]:
    return [PublisherSpec(f"{t.name}-p{i}", t.rate, "poisson", 1, f"g{i // 4}")
            for i in range(t.publishers)]  # fmt: skip


async def _sleep_until(seen: _Seen, t_s: float) -> None:
    while (left := t_s - seen.now_s()) > 0:
        await asyncio.sleep(min(left, 0.5))  # the schedule's clock


async def _ask(
    http: aiohttp.ClientSession, method: str, url: str, doc: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:  # fmt: skip
    """(status, JSON answer or None); (0, None) when nothing answered in time."""
    try:
        async with http.request(method, url, json=doc, headers=headers,
                                allow_redirects=False) as r:  # fmt: skip
            try:
                return r.status, await r.json(content_type=None)
            except ValueError:
                return r.status, None
    except (aiohttp.ClientError, TimeoutError, OSError):
        return 0, None


async def _infos(http: aiohttp.ClientSession, plane: Plane) -> list[dict[str, Any] | None]:
    answers = await asyncio.gather(*(_ask(http, "GET", f"{u}/info") for u in plane.urls))
    return [doc if status == 200 and isinstance(doc, dict) else None for status, doc in answers]


async def _leader(http: aiohttp.ClientSession, plane: Plane) -> int | None:
    """The index of the controller that says it leads now, if one does."""
    for i, doc in enumerate(await _infos(http, plane)):
        if doc is not None and doc.get("leader") is True:
            return i
    return None


async def _until_leader(http: aiohttp.ClientSession, plane: Plane) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while (i := await _leader(http, plane)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("no controller became leader (GET /info never said leader: true)")
        await asyncio.sleep(0.2)  # elections take a lease or two
    return i


async def _write(
    http: aiohttp.ClientSession, plane: Plane, method: str, path: str, doc: Any,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:  # fmt: skip
    """A write to whichever controller leads (a standby's 307 and a 503 are passed over,
    the request sent to the next one until one takes it or ``timeout_s`` passes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for u in plane.urls:
            status, answer = await _ask(http, method, f"{u}{path}", doc, plane.headers)
            if status and status not in (307, 308, 503):
                return status, answer
        if time.monotonic() > deadline:
            raise RuntimeError(f"{method} {path}: no controller took the write")
        await asyncio.sleep(0.2)  # a leader is being elected


async def _create_topics(
    http: aiohttp.ClientSession, plane: Plane, s: CpScenario, seen: _Seen
) -> None:
    probe: dict[str, Any] = {
        "name": PROBE_TOPIC, "slo_p99_ms": PROBE_SLO_MS, "rate": 1.0, "burst": 1, "open": True,
    }  # fmt: skip
    docs: list[dict[str, Any]] = [probe] + [
        {"name": t.name, "slo_p99_ms": t.slo_p99_ms, "rate": s.rate_of(t), "burst": s.burst,
         "publishers": [{"id": p.id, "rate": p.rate, "group": p.group} for p in _specs(t)]}
        for t in s.tenants
    ]  # fmt: skip
    for doc in docs:
        status, answer = await _write(http, plane, "POST", "/topics", doc)
        if status != 201:
            raise RuntimeError(f"the leader refused topic {doc['name']}: {status} {answer}")
        if doc["name"] != PROBE_TOPIC:
            seen.rates[str(doc["name"])] = float(answer["rate"])


async def _poll(http: aiohttp.ClientSession, plane: Plane, seen: _Seen, every_s: float) -> None:
    """Every ``every_s``: the controllers' /info and the brokers' /stats; every second a
    controller's topic documents (plan versions)."""
    last_versions = -1.0
    while True:
        t = seen.now_s()
        asks = [_ask(http, "GET", b.url("/stats?format=json")) for b in plane.brokers]
        infos, stats = await asyncio.gather(_infos(http, plane), asyncio.gather(*asks))
        for i, doc in enumerate(infos):
            seen.leaders.append(LeaderSample(
                t, str(i + 1), None if doc is None else bool(doc.get("leader")),
                None if doc is None else doc.get("epoch"),
            ))  # fmt: skip
        answered = {str(i + 1): d for i, (st, d) in enumerate(stats) if st == 200 and d}
        seen.shares.extend(share_samples(t, answered, seen.rates))
        if t - last_versions >= 1.0:
            last_versions = t
            await _versions(http, plane, seen, t)
        await asyncio.sleep(max(0.0, every_s - (seen.now_s() - t)))


async def _versions(http: aiohttp.ClientSession, plane: Plane, seen: _Seen, t: float) -> None:
    for topic in seen.rates:
        for u in plane.urls:
            status, doc = await _ask(http, "GET", f"{u}/topics/{topic}")
            if status == 200 and isinstance(doc, dict):
                version = int(doc["version"])
                known = [v for _, name, v in seen.versions if name == topic]
                if not known or known[-1] != version:  # a new plan: where its shares are
                    seen.plans.append(_plan_row(t, doc))
                seen.versions.append((t, topic, version))
                break


def _plan_row(t_s: float, doc: dict[str, Any]) -> dict[str, Any]:
    """A topic's plan as the report keeps it: its brokers' sub-bucket rates."""
    shares = {b["id"]: (b.get("bucket") or {}).get("rate") for b in doc.get("brokers", [])}
    return {"t_s": t_s, "topic": doc.get("topic"), "version": doc.get("version"),
            "shares": shares, "unassigned": doc.get("unassigned")}  # fmt: skip


async def _probe(http: aiohttp.ClientSession, plane: Plane, seen: _Seen, rec: FaultRecord,
                 until_s: float) -> None:  # fmt: skip
    """Writes to each controller on its own every ``PROBE_EVERY_S`` until one leading takes
    one (or ``until_s``): a stopped controller's time-outs do not delay the others'."""
    body = {"slo_p99_ms": PROBE_SLO_MS}
    took = asyncio.Event()

    async def probe(k: int, url: str) -> None:
        while not took.is_set() and seen.now_s() < until_s:
            sent = seen.now_s()
            status, _ = await _ask(http, "PATCH", f"{url}/topics/{PROBE_TOPIC}", body,
                                   plane.headers)  # fmt: skip
            ok = 200 <= status < 300
            rec.probes.append(Probe(sent, seen.now_s(), ok, str(k + 1)))
            if ok:
                took.set()
            else:
                await asyncio.sleep(PROBE_EVERY_S)

    probes = [asyncio.create_task(probe(k, u)) for k, u in enumerate(plane.urls)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(took.wait(), max(0.0, until_s - seen.now_s()))
    for task in probes:
        task.cancel()
    await asyncio.gather(*probes, return_exceptions=True)


async def _do(
    fault: Fault, http: aiohttp.ClientSession, plane: Plane, seen: _Seen,
    in_spawner: Callable[[Callable[[], Any]], Awaitable[Any]],
) -> FaultRecord:  # fmt: skip
    """Do ``fault``, hold it, heal it; the record (its settling is the caller's)."""
    s, kind = plane.s, fault.kind
    budget = s.takeover_budget_s + fault.hold_s

    def probe(rec: FaultRecord) -> asyncio.Task[None]:
        return asyncio.create_task(_probe(http, plane, seen, rec, seen.now_s() + budget))

    if kind in (FaultKind.kill_leader, FaultKind.stop_leader):
        i = await _until_leader(http, plane)
        proc = plane.controllers[i]
        assert proc is not None
        sig = signal.SIGKILL if kind is FaultKind.kill_leader else signal.SIGSTOP
        rec = FaultRecord(kind, f"controller {i + 1} (leader)", seen.now_s())
        proc.proc.send_signal(sig)
        prober = probe(rec)
        if kind is FaultKind.kill_leader:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(prober), fault.hold_s)
            rec.heal_s = seen.now_s()
            await in_spawner(functools.partial(_restart, plane, i))
        else:
            await _sleep_until(seen, rec.start_s + fault.hold_s)
            rec.heal_s = seen.now_s()
            proc.proc.send_signal(signal.SIGCONT)
        await prober
    elif kind is FaultKind.kill_etcd:
        m = await _etcd_leader(http, plane)
        rec = FaultRecord(kind, f"etcd member {m + 1} (its raft leader)", seen.now_s())
        plane.etcd.kill(m)
        prober = probe(rec)
        await _sleep_until(seen, rec.start_s + fault.hold_s)
        rec.heal_s = seen.now_s()
        await in_spawner(functools.partial(plane.etcd.start, m))
        await prober
    elif kind is FaultKind.controllers_down:
        rec = FaultRecord(kind, f"all {len(plane.ports)} controllers", seen.now_s())
        await asyncio.gather(*(in_spawner(functools.partial(plane.stop_controller, i))
                               for i in range(len(plane.ports))))  # fmt: skip
        await _sleep_until(seen, rec.start_s + fault.hold_s)
        rec.heal_s = seen.now_s()
        prober = probe(rec)
        for i in range(len(plane.ports)):
            await in_spawner(functools.partial(plane.start_controller, i))
        await prober
    else:
        victim = busiest(seen.shares)
        rec = FaultRecord(kind, f"broker {victim} (the most shares)", seen.now_s())
        plane.links.cut(victim)
        prober = probe(rec)
        await _sleep_until(seen, rec.start_s + fault.hold_s)
        rec.heal_s = seen.now_s()
        plane.links.heal(victim)
        await prober
    return rec


def _restart(plane: Plane, i: int) -> None:
    """A killed controller reaped and started again on its port (as a standby)."""
    old = plane.controllers[i]
    if old is not None:
        old.proc.wait()
        with contextlib.suppress(OSError, ValueError):
            if old.proc.stdout is not None:
                old.proc.stdout.close()
    plane.start_controller(i)


async def _etcd_leader(http: aiohttp.ClientSession, plane: Plane) -> int:
    """The etcd member that is its raft leader (member 0 if none says)."""
    for i, u in enumerate(plane.etcd.client_urls):
        status, doc = await _ask(http, "POST", f"{u}/v3/maintenance/status", {})
        if status == 200 and doc and doc.get("leader") == doc.get("header", {}).get("member_id"):
            return i
    return 0


# -- the document ----------------------------------------------------------------------------
def messages(seen: _Seen, traces: Path) -> dict[str, TopicMessages]:
    """Each topic's acknowledged messages and, of those, the delivered ones."""
    _, sub = analysis.load(traces, RUN)
    sub = sub.drop_duplicates(["publisher", "seq"])
    out = {}
    for topic, em in seen.emulators.items():
        acked = pd.DataFrame(
            [(p, q, ns) for (p, q), ns in em.acked.items()], columns=["publisher", "seq", "send"]
        )
        mine = sub[sub["topic"] == topic][["publisher", "seq", "t_send_ns", "t_recv_ns"]]
        mine = mine.astype({"seq": np.int64})
        got = acked.astype({"seq": np.int64}).merge(mine, on=["publisher", "seq"])
        t0 = seen.t0_ns
        out[topic] = TopicMessages(
            acked_s=(acked["send"].to_numpy(np.int64) - t0) / 1e9,
            sent_s=(got["t_send_ns"].to_numpy(np.int64) - t0) / 1e9,
            latency_ms=(got["t_recv_ns"] - got["t_send_ns"]).to_numpy(np.int64) / 1e6,
            recv_s=(got["t_recv_ns"].to_numpy(np.int64) - t0) / 1e9,
        )
    return out


def summarize(s: CpScenario, seen: _Seen, traces: Path) -> dict[str, Any]:
    """The fault rows, the accounting, the checks and whether the run was disturbed."""
    msgs = messages(seen, traces)
    windows = int(np.ceil(seen.end_s / s.window_s))
    slo = {t.name: t.slo_p99_ms for t in s.tenants}
    rows = window_rows(msgs, slo, s.window_s, windows)
    observed = Observed(seen.shares, seen.leaders, seen.versions, msgs, rows, s.window_s)
    faults = [fault_row(rec, observed) for rec in seen.faults]
    reports = [em.report for em in seen.emulators.values()]
    skipped, sent = sum(r.skipped_late for r in reports), sum(r.sent for r in reports)
    published = sum(len(em.acked) for em in seen.emulators.values())
    delivered = sum(len(m.sent_s) for m in msgs.values())
    data: dict[str, Any] = {
        "scenario": {**asdict(s), "faults": [asdict(f) for f in s.faults]},
        "rates": seen.rates,
        "faults": [asdict(f) for f in faults],
        "published": published, "delivered": delivered,
        "failed": sum(r.failed for r in reports), "unrouted": sum(r.unrouted for r in reports),
        "sent": sent, "skipped_late": skipped,
        "max_share_ratio": max((x.ratio for x in seen.shares), default=0.0),
        "polls": len({x.t_s for x in seen.shares}),
        "plans": seen.plans,
        # Σ live shares / r per poll and topic, and who answered: [t_s, topic, ratio, n].
        "share_ratios": [[x.t_s, x.topic, x.ratio, len(x.live)] for x in seen.shares],
        "leaders": [[x.t_s, x.controller, x.leader, x.epoch] for x in seen.leaders],
        "windows": [asdict(w) | {"met": w.met} for w in rows],
        "probes": {r.kind.value: [asdict(p) for p in r.probes] for r in seen.faults},
        "disturbed": disturbed(skipped, sent, seen.host),
        "partition": report.PARTITION,
    }  # fmt: skip
    if seen.host is not None:
        data["host"] = asdict(seen.host)
    data["checks"] = report.checks(faults, published, delivered, data["max_share_ratio"])
    return data


def disturbed(skipped: int, sent: int, figures: host.HostFigures | None) -> str | None:
    """Why the run measured the machine rather than the cluster, if it did (thresholds of
    ``srtm.experiments.validity``)."""
    why = []
    if skipped > validity.SKIPPED_SHARE * max(sent + skipped, 1):
        why.append(f"{skipped:,} sends skipped as over {MAX_LATE_S * 1e3:g} ms late")
    validity.machine_reasons(figures, why)
    return "; ".join(why) or None
