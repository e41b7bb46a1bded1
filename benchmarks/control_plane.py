"""The control plane's own scale (issue 31, item 7): how fast a plan change reaches the
brokers, how many reads one controller serves, how many broker reports it takes, and
what 1,000 brokers and 1,000,000 publishers would cost it.

    .venv/bin/python benchmarks/control_plane.py [--runs 3] [--json PATH] [--quick]

Everything runs on 127.0.0.1 with ephemeral ports, started fresh by this script and
stopped at the end (on Ctrl-C and errors too): a single-member etcd (``etcd`` on PATH,
Debian's etcd-server), ``srtm controller`` processes and real ``srtm broker`` processes.
Four parts, each measured in every run (medians of ``--runs`` runs, with their range):

1. Plan change: ``POST /topics`` of a new managed topic (``lb``, one publisher per
   broker, so each of the 3 brokers gets a sub-bucket) until the controller says every
   share is pushed (``GET /plan``'s ``in_place``: true once each broker of the plan has
   answered its push, after the plan was written to the store), polled every
   ``POLL_S``; a controller on SQLite (``--db``) against one on etcd
   (``--etcd-endpoints``), each with its own 3 brokers. Afterwards each broker's
   ``/stats`` is checked for the sub-bucket the plan gives it.
2. Reads: ``GET /lookup`` and ``GET /assign`` (a known publisher of a managed topic of
   ``ASSIGN_PUBLISHERS``) per second, from one asyncio aiohttp client pool in this
   process, against 1 controller and against 3 on one etcd prefix (leader and standbys;
   only when the controller has them: its ``/info`` tells ``leader``). The anchor, in
   the same run: the same client against a trivial aiohttp endpoint in a process of its
   own (the client's ceiling on this machine).
3. Reports: simulated brokers (``POST /brokers``, then ``POST /brokers/{id}/report``
   with a report as ``srtm.broker.reporter.report_document`` writes one) sent as fast as
   one controller takes them; reports/s and the controller's CPU per report (/proc).
4. Scale: ``--brokers`` simulated brokers each reporting once a second for a few seconds
   (does the controller keep up; its ticks and its loop's lag seen by polling ``/info``),
   and the
   projection from the measured CPU per request to 1,000 brokers and 1,000,000
   publishers asking ``/assign``.

The run is marked disturbed when, in any measured window, processes other than the
run's used more than ``FOREIGN_CPU_SHARE`` of the machine or the hypervisor stole more
than ``validity.STEAL_SHARE`` (``srtm.experiments.host``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer
from aiohttp import web
from rich.console import Console
from rich.table import Table

from srtm.experiments import host, validity
from srtm.launch import (
    BrokerProcess,
    ServerProcess,
    die_with_parent,
    new_token,
    start_broker,
    start_controller,
)

REPO = Path(__file__).resolve().parent.parent
#: Real brokers per controller in part 1 (``lb`` gives each one publisher, so a share).
BROKERS = 3
#: How often part 1 asks the controller whether the shares are pushed (s): the latency's
#: resolution.
POLL_S = 0.002
#: Part 1 waits this long between two topics (s): twice the controller's write interval
#: (``store_writer.WRITE_INTERVAL_S``), so each plan change comes after a quiet spell and
#: is written at once; back to back, each would also wait out the previous write's 50 ms.
GAP_S = 0.1
#: Publishers of the topic ``/assign`` is asked about (part 2).
ASSIGN_PUBLISHERS = 1_000
#: Requests the client keeps in flight (part 2 and 3).
CONCURRENCY = 32
#: Simulated brokers whose reports are sent as fast as they are taken (part 3).
REPORTERS = 200
#: Topics in each simulated report (unmanaged: the controller files their channels for
#: /lookup; a managed topic's report must carry the share the controller pushed, which a
#: simulated broker does not get).
REPORT_TOPICS = 4
#: Part 4's target: brokers reporting once a second, and publishers asking ``/assign``.
TARGET_BROKERS = 1_000
TARGET_PUBLISHERS = 1_000_000
#: Part 4's projection assumes each publisher asks ``/assign`` once in this many seconds
#: (a publisher asks at start and when its plan changes; a restart of every publisher
#: of a cluster spread over a minute).
ASSIGN_PERIOD_S = 60.0
#: Processes outside the run using more than this share of the machine's CPU time in a
#: measured window mark the run disturbed: on two CPUs a quarter of the machine is half a
#: core taken from the controller or the client, and the rates below would show it.
FOREIGN_CPU_SHARE = 0.25
#: Part 4 keeps up when this share of the reports due is answered and the p99 answer
#: comes within this many seconds (a report's interval: a later one overlaps the next).
KEEP_UP_SHARE = 0.99
KEEP_UP_P99_S = 1.0
#: Part 4's brokers report for this long before the counted window (s): they come back
#: up from the silence since the last run, as brokers do after a controller restart.
STEADY_WARM_S = 1.0
#: Part 4 polls ``/info`` this often for the tick count (s).
INFO_POLL_S = 0.02
ETCD_START_S = 20.0
DASH = "—"


# == processes ============================================================================


@dataclass
class Etcd:
    """A single-member etcd on ephemeral ports (as ``tests/etcd_member.py`` starts one)."""

    url: str
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return self.url.removeprefix("http://")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_etcd(workdir: Path) -> Etcd:
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("etcd is not on PATH (Debian: apt-get install etcd-server)")
    client, peer = free_ports(2)
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = (workdir / "etcd.log").open("wb")
    process = subprocess.Popen(
        [binary, "--name", "cp", "--data-dir", str(workdir / "etcd-data"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
         "--initial-cluster", f"cp={peer_url}"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
    )  # fmt: skip
    log.close()
    etcd = Etcd(url, process)
    deadline = time.monotonic() + ETCD_START_S
    while True:
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(f"{url}/health", timeout=1) as resp,
        ):
            if json.loads(resp.read()).get("health") == "true":
                return etcd
        if process.poll() is not None or time.monotonic() > deadline:
            etcd.stop()
            tail = (workdir / "etcd.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"etcd at {url} did not become healthy:\n{tail}")
        time.sleep(0.05)


def _serve_sink(conn: Connection) -> None:
    """A trivial aiohttp server: every request answers 200 ``{"ok": true}``, keeping
    nothing. The client's anchor in part 2, and the simulated brokers' HTTP address
    (the controller's pushes and probes to them land here)."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    async def main() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(runner.addresses[0][1])
        await asyncio.Event().wait()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(main())


@dataclass
class Sink:
    process: multiprocessing.process.BaseProcess
    address: str

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def start_sink() -> Sink:
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=_serve_sink, args=(theirs,), daemon=True)
    process.start()
    if not ours.poll(30):
        process.kill()
        raise RuntimeError("the trivial endpoint did not start")
    return Sink(process, f"127.0.0.1:{ours.recv()}")


@dataclass
class Cluster:
    """A controller and the brokers registered with it."""

    name: str
    controller: ServerProcess
    brokers: list[BrokerProcess] = field(default_factory=list)
    #: Further controllers on the same etcd prefix (part 2's three).
    standbys: list[ServerProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.controller.http_address}"

    def pids(self) -> list[int]:
        return [p.proc.pid for p in (self.controller, *self.standbys, *self.brokers)]

    def stop(self) -> None:
        for p in (self.controller, *self.standbys, *self.brokers):
            with contextlib.suppress(Exception):
                p.stop()


def start_cluster(
    name: str, workdir: Path, token: str, store: list[str], brokers: int, first_id: int
) -> Cluster:
    d = workdir / name
    d.mkdir()
    ctrl = start_controller(d / "controller.db", store, preexec_fn=die_with_parent, token=token)
    cluster = Cluster(name, ctrl)
    try:
        for i in range(1, brokers + 1):
            args = ["--broker-id", str(first_id + i), "--controller", cluster.url]
            cluster.brokers.append(
                start_broker(d / f"broker-{i}", args, preexec_fn=die_with_parent, token=token)
            )
        deadline = time.monotonic() + 30
        while len(ctrl.json("/nodes")["producers"]) < brokers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: only some of {brokers} brokers registered")
            time.sleep(0.05)
    except BaseException:
        cluster.stop()
        raise
    return cluster


# == what the run measured about its machine ==============================================


@dataclass
class Window:
    """One measured window: what it was, and the machine's figures over it."""

    what: str
    figures: host.HostFigures

    def reasons(self) -> list[str]:
        f, out = self.figures, []
        if f.foreign_cpu is not None and f.foreign_cpu > FOREIGN_CPU_SHARE:
            out.append(f"{self.what}: other processes used {f.foreign_cpu:.0%} of the machine")
        if f.steal is not None and f.steal > validity.STEAL_SHARE:
            out.append(f"{self.what}: the hypervisor stole {f.steal:.0%}")
        return out


@dataclass
class Watch:
    """The processes of the run, and each measured window's machine figures."""

    pids: list[int]
    windows: list[Window] = field(default_factory=list)

    def start(self, extra: Sequence[int] = ()) -> host.Sample:
        return host.take([*self.pids, *extra])

    def end(self, what: str, start: host.Sample, extra: Sequence[int] = ()) -> host.Sample:
        now = host.take([*self.pids, *extra])
        self.windows.append(Window(what, host.between(start, now, os.cpu_count() or 1)))
        return now

    def reasons(self) -> list[str]:
        return [r for w in self.windows for r in w.reasons()]


def cpu_of(a: host.Sample, b: host.Sample, pids: Sequence[int]) -> float:
    """CPU seconds ``pids`` used from ``a`` to ``b``."""
    return sum(b.procs[p].cpu_s - a.procs[p].cpu_s for p in pids if p in a.procs and p in b.procs)


# == part 1: plan changes =================================================================


@dataclass
class PlanChange:
    answered_ms: float
    pushed_ms: float


async def plan_change(
    session: aiohttp.ClientSession, cluster: Cluster, token: str, name: str
) -> PlanChange:
    pubs = [{"id": f"{name}-p{i}", "rate": 10.0} for i in range(len(cluster.brokers))]
    doc = {"name": name, "slo_p99_ms": 50.0, "burst": 20, "policy": "lb", "publishers": pubs}
    headers = {"Authorization": f"Bearer {token}"}
    start = time.perf_counter()
    async with session.post(f"{cluster.url}/topics", json=doc, headers=headers) as resp:
        if resp.status != 201:
            raise RuntimeError(f"POST /topics {name}: {resp.status} {await resp.text()}")
        await resp.read()
    answered = time.perf_counter()
    while True:
        async with session.get(f"{cluster.url}/plan", params={"topic": name}) as resp:
            plan = await resp.json()
        if plan["in_place"]:
            pushed = time.perf_counter()
            break
        if time.perf_counter() - start > 30:
            raise RuntimeError(f"{cluster.name}: {name}'s shares not pushed in 30 s")
        await asyncio.sleep(POLL_S)
    check_shares(cluster, plan)
    return PlanChange((answered - start) * 1e3, (pushed - start) * 1e3)


def check_shares(cluster: Cluster, plan: dict[str, Any]) -> None:
    """Each broker of ``plan`` shapes its topic with the sub-bucket the plan gives it."""
    by_id = {b.http_address: b for b in cluster.brokers}
    if len(plan["brokers"]) != len(cluster.brokers):
        raise RuntimeError(f"{plan['topic']}: placed on {len(plan['brokers'])} brokers")
    for entry in plan["brokers"]:
        stats = by_id[entry["http_address"]].stats(plan["topic"])
        topics = {t["topic"]: t for t in stats["srtm"]["topics"]}
        got = (topics.get(plan["topic"]) or {}).get("bucket")
        want = entry["bucket"]
        if not got or abs(float(got["rate"]) - float(want["rate"])) > 1e-6 * want["rate"]:
            raise RuntimeError(f"{plan['topic']}: broker {entry['id']} has {got}, plan {want}")


# == part 2 and 3: a client pool ==========================================================


@dataclass
class Load:
    """One window of a client pool: requests answered 2xx, others, their rate, and the
    CPU the servers measured used meanwhile (s)."""

    done: int
    failed: int
    seconds: float
    server_cpu_s: float
    #: Each server's share of it, in the order given (three controllers: leader first).
    cpu_split: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.done / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.server_cpu_s / self.done * 1e3 if self.done else float("nan")


async def pool(
    session: aiohttp.ClientSession,
    send: Callable[[aiohttp.ClientSession, int], Any],
    *,
    warm_s: float,
    duration_s: float,
    watch: Watch,
    what: str,
    servers: Sequence[int],
) -> Load:
    """``CONCURRENCY`` workers calling ``send(session, i)`` (i counts up) back to back;
    counted over ``duration_s`` after ``warm_s``."""
    counts = [0, 0]
    running = True
    seq = iter(range(1 << 62))

    async def worker() -> None:
        while running:
            try:
                ok = await send(session, next(seq))
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            counts[0 if ok else 1] += 1

    tasks = [asyncio.create_task(worker()) for _ in range(CONCURRENCY)]
    try:
        await asyncio.sleep(warm_s)
        a, (d0, f0), t0 = watch.start(servers), tuple(counts), time.perf_counter()
        await asyncio.sleep(duration_s)
        b, (d1, f1), t1 = watch.end(what, a, servers), tuple(counts), time.perf_counter()
    finally:
        running = False
        await asyncio.gather(*tasks, return_exceptions=True)
    split = [cpu_of(a, b, [pid]) for pid in servers]
    return Load(d1 - d0, f1 - f0, t1 - t0, sum(split), split)


def getter(urls: Sequence[str]) -> Callable[[aiohttp.ClientSession, int], Any]:
    async def send(session: aiohttp.ClientSession, i: int) -> bool:
        async with session.get(urls[i % len(urls)]) as resp:
            await resp.read()
            return resp.status == 200

    return send


def read_urls(base: str, topic: str, path: str, n: int = 64) -> list[str]:
    if path == "/lookup":
        return [f"{base}/lookup?topic={topic}"]
    step = max(1, ASSIGN_PUBLISHERS // n)
    return [
        f"{base}/assign?topic={topic}&publisher={topic}-p{i}"
        for i in range(0, ASSIGN_PUBLISHERS, step)
    ]


# == part 3 and 4: simulated brokers ======================================================


def report_body(i: int) -> bytes:
    """A report as ``report_document`` writes one: load, each topic's window with its
    channels and no share (unmanaged), and the broker's resources."""
    topics = {
        f"sim-t{k}": {
            "rate": 120.0 + i % 7, "backlog": 3.0, "depth": 15, "waiting": 0,
            "arrived": 1_000_000 + i, "channels": ["archive", "live"], "bucket": None,
            "held": False, "arrived_bytes": 250_000_000,
        }
        for k in range(REPORT_TOPICS)
    }  # fmt: skip
    resources = {"cpu": 0.2, "egress_bps": 1.5e6, "congested": {"cpu": False, "network": False}}
    doc = {"version": 2, "load": 480.0, "topics": topics, "resources": resources}
    return json.dumps(doc).encode()


async def register_simulated(
    session: aiohttp.ClientSession, base: str, token: str, n: int, sink: Sink
) -> None:
    """Register ``n`` simulated brokers: their TCP ports are unused, their HTTP address is
    the sink (which answers every push and probe)."""
    headers = {"Authorization": f"Bearer {token}"}
    ports = free_ports(min(n, 1))[0]
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        doc = {"id": f"sim-{i}", "tcp_address": f"127.0.0.2:{(ports + i) % 60000 + 1024}",
               "http_address": sink.address, "mcap": 100_000.0}  # fmt: skip
        async with sem, session.post(f"{base}/brokers", json=doc, headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"registering sim-{i}: {resp.status} {await resp.text()}")
            await resp.read()

    await asyncio.gather(*(one(i) for i in range(n)))


def reporter(base: str, token: str, n: int) -> Callable[[aiohttp.ClientSession, int], Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    bodies = [report_body(i) for i in range(n)]

    async def send(session: aiohttp.ClientSession, i: int) -> bool:
        k = i % n
        url = f"{base}/brokers/sim-{k}/report"
        async with session.post(url, data=bodies[k], headers=headers) as resp:
            await resp.read()
            return resp.status == 200

    return send


@dataclass
class Steady:
    """Part 4's real run: ``brokers`` reporting once a second for ``seconds``."""

    brokers: int
    seconds: float
    due: int
    answered: int
    #: From sending a report to its answer.
    answer_p50_ms: float
    answer_p99_ms: float
    #: The client's own lateness sending (p99, ms): over tens of ms the client lagged.
    send_late_p99_ms: float
    controller_cpu: float
    #: Ticks run in the window (its 1 s tick: about ``seconds`` are due), and the
    #: stalls the controller counted (ticks over 2 s apart).
    ticks: int
    stalls: int
    #: ``/info``'s answer time, p99 and max: how long the loop kept a request waiting.
    info_p99_ms: float
    info_max_ms: float
    rss_mb: float

    @property
    def kept_up(self) -> bool:
        return self.answered >= KEEP_UP_SHARE * self.due and self.answer_p99_ms < (
            KEEP_UP_P99_S * 1e3
        )


def p(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Ticks:
    """``/info`` polled through the window: its tick and stall counts, and how long
    each answer took."""

    ticks: list[int] = field(default_factory=list)
    stalls: list[int] = field(default_factory=list)
    rtt_ms: list[float] = field(default_factory=list)

    @staticmethod
    def grown(counts: list[int]) -> int:
        return counts[-1] - counts[0] if counts else 0


async def steady(
    session: aiohttp.ClientSession,
    ctrl: ServerProcess,
    token: str,
    brokers: int,
    seconds: float,
    watch: Watch,
) -> Steady:
    """Each simulated broker reports once a second at its own phase, for a warm-up
    second (the brokers silent since the last run come back up) and then ``seconds``
    counted; ``/info`` is polled for its tick count meanwhile."""
    base = f"http://{ctrl.http_address}"
    send = reporter(base, token, brokers)
    begin = time.perf_counter() + 0.2
    start, end = begin + STEADY_WARM_S, begin + STEADY_WARM_S + seconds
    answers: list[float] = []
    late: list[float] = []
    ticks = Ticks()

    async def broker(i: int) -> None:
        due = begin + i / brokers
        while due < end:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            counted, sent = due >= start, time.perf_counter()
            if counted:
                late.append(sent - due)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if await send(session, i) and counted:
                    answers.append(time.perf_counter() - sent)
            due += 1.0

    async def info() -> None:
        await asyncio.sleep(start - time.perf_counter())
        while time.perf_counter() < end:
            t = time.perf_counter()
            async with session.get(f"{base}/info") as resp:
                doc = await resp.json()
            ticks.rtt_ms.append((time.perf_counter() - t) * 1e3)
            ticks.ticks.append(doc["ticks"])
            ticks.stalls.append(doc["stalls"])
            await asyncio.sleep(INFO_POLL_S)

    async def window() -> tuple[host.Sample, host.Sample]:
        await asyncio.sleep(start - time.perf_counter())
        a = watch.start([ctrl.proc.pid])
        await asyncio.sleep(end - time.perf_counter())
        return a, watch.end(f"{brokers} brokers reporting", a, [ctrl.proc.pid])

    (a, b), *_ = await asyncio.gather(window(), info(), *(broker(i) for i in range(brokers)))
    due = len(late)
    return Steady(
        brokers, seconds, due, len(answers), p(answers, 0.5) * 1e3, p(answers, 0.99) * 1e3,
        p(late, 0.99) * 1e3, cpu_of(a, b, [ctrl.proc.pid]) / (b.t_s - a.t_s),
        Ticks.grown(ticks.ticks), Ticks.grown(ticks.stalls), p(ticks.rtt_ms, 0.99),
        max(ticks.rtt_ms, default=float("nan")), rss_mb(ctrl.proc.pid),
    )  # fmt: skip


# == the run ==============================================================================


@dataclass
class Config:
    runs: int
    topics: int
    duration_s: float
    warm_s: float
    brokers: int
    steady_s: float
    controllers: int


@dataclass
class Results:
    #: backend -> per run: the plan changes of its topics
    plan: dict[str, list[list[PlanChange]]] = field(default_factory=dict)
    #: row -> per run: one window of the client pool
    reads: dict[str, list[Load]] = field(default_factory=dict)
    #: per run: reports sent as fast as taken
    reports: list[Load] = field(default_factory=list)
    steady: list[Steady] = field(default_factory=list)
    #: rows that could not be measured, with why
    missing: dict[str, str] = field(default_factory=dict)


READ_ROWS = ("anchor", "1 controller /lookup", "1 controller /assign",
             "3 controllers /lookup", "3 controllers /assign")  # fmt: skip
NEEDS_STANDBYS = "needs standbys (issue 31)"


def has_standbys(ctrl: ServerProcess) -> bool:
    """Does this controller elect a leader (``/info`` tells ``leader``)?"""
    return "leader" in ctrl.json("/info")


def start_standbys(cluster: Cluster, etcd: Etcd, token: str, n: int, workdir: Path) -> None:
    """``n`` more controllers on the cluster's etcd prefix, serving reads once they follow
    its state (the topic of part 2 answers ``/assign`` at each)."""
    for i in range(n):
        cluster.standbys.append(
            start_controller(
                workdir / f"standby-{i}.db",
                etcd_args(etcd),
                token=token,
                preexec_fn=die_with_parent,
            )
        )
    deadline = time.monotonic() + 30
    for s in cluster.standbys:
        while True:
            try:
                s.get("/assign?topic=cp-reads&publisher=cp-reads-p0")
                break
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise RuntimeError("a standby did not serve the topic in 30 s") from None
                time.sleep(0.1)
    leaders = [s for s in (cluster.controller, *cluster.standbys) if s.json("/info")["leader"]]
    if len(leaders) != 1:
        raise RuntimeError(f"{len(leaders)} leaders among {n + 1} controllers on one prefix")


def etcd_args(etcd: Etcd) -> list[str]:
    return ["--etcd-endpoints", etcd.endpoint, "--etcd-prefix", "/srtm-bench"]


@dataclass
class Setup:
    """What every run measures: the processes started once, and the client's session."""

    token: str
    sink: Sink
    etcd: Etcd
    #: store name -> its controller and 3 brokers (part 1); "etcd"'s serves part 2 too.
    clusters: dict[str, Cluster]
    #: The controller of parts 3 and 4, with its simulated brokers.
    reports: ServerProcess
    watch: Watch
    session: aiohttp.ClientSession
    #: Part 2 measures three controllers too.
    three: bool = False


def start_processes(workdir: Path, token: str, stack: contextlib.ExitStack) -> tuple[
    Sink, Etcd, dict[str, Cluster], ServerProcess
]:  # fmt: skip
    """The trivial endpoint, etcd, the SQLite and etcd clusters and the reports'
    controller; each stopped by ``stack``."""
    sink = start_sink()
    stack.callback(sink.stop)
    etcd = start_etcd(workdir)
    stack.callback(etcd.stop)
    clusters: dict[str, Cluster] = {}
    for i, (name, store) in enumerate((("SQLite", []), ("etcd", etcd_args(etcd)))):
        clusters[name] = start_cluster(name, workdir, token, store, BROKERS, i * BROKERS)
        stack.callback(clusters[name].stop)
    reports = start_controller(workdir / "reports.db", [], token=token, preexec_fn=die_with_parent)
    stack.callback(reports.stop)
    return sink, etcd, clusters, reports


async def prepare(setup: Setup, cfg: Config, res: Results, workdir: Path) -> None:
    """Part 2's topic (and standbys, where the controller has them), part 3's and 4's
    simulated brokers registered."""
    main = setup.clusters["etcd"]
    await plan_change(setup.session, main, setup.token, "cp-warm")
    await create_read_topic(setup.session, main, setup.token)
    if cfg.controllers == 1:
        for row in READ_ROWS[3:]:
            res.missing[row] = "not asked (--controllers 1)"
    elif not has_standbys(main.controller):
        for row in READ_ROWS[3:]:
            res.missing[row] = NEEDS_STANDBYS
    else:
        start_standbys(main, setup.etcd, setup.token, cfg.controllers - 1, workdir)
        setup.watch.pids += [s.proc.pid for s in main.standbys]
        setup.three = True
    base = f"http://{setup.reports.http_address}"
    await register_simulated(setup.session, base, setup.token, max(REPORTERS, cfg.brokers),
                             setup.sink)  # fmt: skip


async def one_run(setup: Setup, cfg: Config, res: Results, run: int, log: Console) -> None:
    log.log(f"run {run + 1}/{cfg.runs}: plan changes")
    # Which store goes first swaps every run.
    for name, cluster in list(setup.clusters.items())[:: 1 if run % 2 == 0 else -1]:
        changes = []
        for i in range(cfg.topics):
            await asyncio.sleep(GAP_S)
            changes.append(await plan_change(setup.session, cluster, setup.token,
                                             f"cp-r{run}-{i}"))  # fmt: skip
        res.plan.setdefault(name, []).append(changes)
    log.log(f"run {run + 1}/{cfg.runs}: reads")
    await reads(setup, cfg, res)
    log.log(f"run {run + 1}/{cfg.runs}: reports")
    base = f"http://{setup.reports.http_address}"
    load = await pool(setup.session, reporter(base, setup.token, REPORTERS), warm_s=cfg.warm_s,
                      duration_s=cfg.duration_s, watch=setup.watch, what="reports",
                      servers=[setup.reports.proc.pid])  # fmt: skip
    res.reports.append(load)
    log.log(f"run {run + 1}/{cfg.runs}: {cfg.brokers} brokers reporting every second")
    await asyncio.sleep(1.0)  # after the flood, a second for the controller's writes
    res.steady.append(await steady(setup.session, setup.reports, setup.token, cfg.brokers,
                                   cfg.steady_s, setup.watch))  # fmt: skip


async def measure(cfg: Config, workdir: Path, log: Console) -> tuple[Results, Watch]:
    token, res = new_token(), Results()
    with contextlib.ExitStack() as stack:
        log.log("starting etcd, controllers and brokers")
        sink, etcd, clusters, reports = start_processes(workdir, token, stack)
        pids = [os.getpid(), sink.pid, etcd.process.pid, reports.proc.pid]
        watch = Watch([*pids, *(p for c in clusters.values() for p in c.pids())])
        timeout = aiohttp.ClientTimeout(total=10)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY * 2)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            setup = Setup(token, sink, etcd, clusters, reports, watch, session)
            await prepare(setup, cfg, res, workdir)
            for run in range(cfg.runs):
                await one_run(setup, cfg, res, run, log)
    return res, watch


async def create_read_topic(session: aiohttp.ClientSession, cluster: Cluster, token: str) -> None:
    pubs = [{"id": f"cp-reads-p{i}", "rate": 1.0} for i in range(ASSIGN_PUBLISHERS)]
    doc = {"name": "cp-reads", "slo_p99_ms": 50.0, "burst": 100, "policy": "lb",
           "publishers": pubs}  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    async with session.post(f"{cluster.url}/topics", json=doc, headers=headers) as resp:
        if resp.status != 201:
            raise RuntimeError(f"POST /topics cp-reads: {resp.status} {await resp.text()}")
        await resp.read()


async def reads(setup: Setup, cfg: Config, res: Results) -> None:
    """The anchor and the controllers, each path in turn, under the same client pool."""
    main, sink = setup.clusters["etcd"], setup.sink
    ctrl_pid = main.controller.proc.pid
    rows: list[tuple[str, list[str], list[int]]] = [
        ("anchor", read_urls(f"http://{sink.address}", "cp-reads", "/assign"), [sink.pid]),
        ("1 controller /lookup", read_urls(main.url, "cp-reads", "/lookup"), [ctrl_pid]),
        ("1 controller /assign", read_urls(main.url, "cp-reads", "/assign"), [ctrl_pid]),
    ]
    if setup.three:
        every = [main.controller, *main.standbys]
        pids = [s.proc.pid for s in every]
        for path in ("/lookup", "/assign"):
            urls = [u for s in every for u in read_urls(f"http://{s.http_address}", "cp-reads",
                                                       path)]  # fmt: skip
            rows.append((f"3 controllers {path}", urls, pids))
    for what, urls, servers in rows:
        res.reads.setdefault(what, []).append(
            await pool(
                setup.session,
                getter(urls),
                warm_s=cfg.warm_s,
                duration_s=cfg.duration_s,
                watch=setup.watch,
                what=what,
                servers=servers,
            )
        )


# == report ===============================================================================


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cell(values: Sequence[float], digits: int = 1) -> str:
    """Median (min–max) of ``values``."""
    if not values:
        return DASH
    m = f"{med(values):,.{digits}f}"
    return m if len(values) < 2 else f"{m} ({min(values):,.{digits}f}–{max(values):,.{digits}f})"


def figures(res: Results, cfg: Config) -> dict[str, Any]:
    """Every figure the tables show, medians and per-run values (the JSON's body)."""
    plan = {}
    for name, runs in res.plan.items():
        answered = [med([c.answered_ms for c in r]) for r in runs]
        pushed = [med([c.pushed_ms for c in r]) for r in runs]
        every = [c.pushed_ms for r in runs for c in r]
        plan[name] = {"answered_ms": answered, "pushed_ms": pushed,
                      "pushed_ms_all": every, "topics_per_run": cfg.topics}  # fmt: skip
    reads = {
        row: {"per_s": [x.rate for x in loads], "cpu_ms": [x.cpu_ms for x in loads],
              "cpu_s_by_server": [x.cpu_split for x in loads],
              "failed": sum(x.failed for x in loads)}
        for row, loads in res.reads.items()
    }  # fmt: skip
    reports = {"per_s": [x.rate for x in res.reports], "cpu_ms": [x.cpu_ms for x in res.reports],
               "failed": sum(x.failed for x in res.reports), "brokers": REPORTERS}  # fmt: skip
    return {"plan_change": plan, "reads": reads, "reports": reports,
            "steady": [asdict(s) | {"kept_up": s.kept_up} for s in res.steady],
            "projection": projection(res), "missing": res.missing}  # fmt: skip


def projection(res: Results) -> dict[str, float]:
    """Cores for ``TARGET_BROKERS`` reporting once a second and ``TARGET_PUBLISHERS``
    asking ``/assign`` once per ``ASSIGN_PERIOD_S``, from the measured CPU per request;
    one controller serves on one event loop, so one core is its ceiling."""
    report_ms = med([x.cpu_ms for x in res.reports])
    assign_ms = med([x.cpu_ms for x in res.reads.get("1 controller /assign", [])])
    assign_rate = TARGET_PUBLISHERS / ASSIGN_PERIOD_S
    report_cores = TARGET_BROKERS * report_ms / 1e3
    assign_cores = assign_rate * assign_ms / 1e3
    return {
        "report_cpu_ms": report_ms,
        "assign_cpu_ms": assign_ms,
        "reports_cores": report_cores,
        "assign_per_s": assign_rate,
        "assign_cores": assign_cores,
        "total_cores": report_cores + assign_cores,
        "max_reports_per_s": 1e3 / report_ms,
        "max_assign_per_s": 1e3 / assign_ms,
        "burst_s": TARGET_PUBLISHERS * assign_ms / 1e3,
        "assign_left_per_s": max(0.0, 1 - report_cores) * 1e3 / assign_ms,
    }


def tables(res: Results, cfg: Config, doc: dict[str, Any]) -> list[Table]:
    n = f"medians of {cfg.runs} run{'s' * (cfg.runs > 1)} (min–max)"
    t1 = Table(title=f"1. Plan change: POST /topics until every share is pushed, "
               f"{BROKERS} brokers, {cfg.topics} topics a run; {n}")  # fmt: skip
    for col in ("store", "POST answered, ms", "all shares pushed, ms", "slowest topic, ms"):
        t1.add_column(col, justify="right")
    for name, d in doc["plan_change"].items():
        t1.add_row(name, cell(d["answered_ms"]), cell(d["pushed_ms"]),
                   f"{max(d['pushed_ms_all']):,.1f}")  # fmt: skip

    t2 = Table(title=f"2. Reads per second, one aiohttp client pool ({CONCURRENCY} in flight); {n}")
    for col in ("served by", "requests/s", "÷ anchor", "server CPU ms/request", "failed"):
        t2.add_column(col, justify="right")
    anchor = med(doc["reads"]["anchor"]["per_s"])
    for row in READ_ROWS:
        if row in res.missing:
            t2.add_row(row, res.missing[row], DASH, DASH, DASH)
            continue
        d = doc["reads"][row]
        label = "anchor: trivial aiohttp endpoint" if row == "anchor" else row
        t2.add_row(label, cell(d["per_s"], 0), f"{med(d['per_s']) / anchor:.2f}",
                   cell(d["cpu_ms"], 3), str(d["failed"]))  # fmt: skip

    t3 = Table(title=f"3. Broker reports taken, {REPORTERS} simulated brokers, {REPORT_TOPICS} "
               f"topics a report; {n}")  # fmt: skip
    for col in ("reports/s", "controller CPU ms/report", "failed"):
        t3.add_column(col, justify="right")
    r = doc["reports"]
    t3.add_row(cell(r["per_s"], 0), cell(r["cpu_ms"], 3), str(r["failed"]))

    t4 = Table(title=f"4a. {cfg.brokers:,} simulated brokers reporting once a second for "
               f"{cfg.steady_s:g} s; {n}")  # fmt: skip
    for col in (
        "answered / due",
        "answer p50, ms",
        "answer p99, ms",
        "controller CPU, cores",
        "ticks run",
        "stalls",
        "/info p99 (max), ms",
        "RSS, MB",
        "client sent late p99, ms",
        "kept up",
    ):
        t4.add_column(col, justify="right")
    st = res.steady
    t4.add_row(
        f"{sum(s.answered for s in st):,} / {sum(s.due for s in st):,}",
        cell([s.answer_p50_ms for s in st]), cell([s.answer_p99_ms for s in st]),
        cell([s.controller_cpu for s in st], 2),
        " ".join(str(s.ticks) for s in st) + f" (of ~{cfg.steady_s:g})",
        str(sum(s.stalls for s in st)),
        f"{cell([s.info_p99_ms for s in st])} ({max(s.info_max_ms for s in st):,.0f})",
        cell([s.rss_mb for s in st], 0),
        cell([s.send_late_p99_ms for s in st]),
        f"{sum(s.kept_up for s in st)} of {len(st)} runs",
    )  # fmt: skip

    pr = doc["projection"]
    t5 = Table(title="4b. Projection from the CPU per request (one controller: one event loop, "
               "at most one core)")  # fmt: skip
    for col in ("load", "rate", "CPU ms each", "cores", "one controller's ceiling"):
        t5.add_column(col, justify="right")
    t5.add_row(f"{TARGET_BROKERS:,} brokers reporting every second", f"{TARGET_BROKERS:,}/s",
               f"{pr['report_cpu_ms']:.3f}", f"{pr['reports_cores']:.2f}",
               f"{pr['max_reports_per_s']:,.0f} reports/s")  # fmt: skip
    t5.add_row(f"{TARGET_PUBLISHERS:,} publishers, /assign once per {ASSIGN_PERIOD_S:g} s",
               f"{pr['assign_per_s']:,.0f}/s", f"{pr['assign_cpu_ms']:.3f}",
               f"{pr['assign_cores']:.2f}", f"{pr['max_assign_per_s']:,.0f} /assign/s")  # fmt: skip
    t5.add_row("both", DASH, DASH, f"{pr['total_cores']:.2f}",
               f"{pr['assign_left_per_s']:,.0f} /assign/s beside the reports; "
               f"{TARGET_PUBLISHERS:,} at once: {pr['burst_s']:,.0f} s")  # fmt: skip
    return [t1, t2, t3, t4, t5]


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=5
    ).stdout.strip()


def git_revision() -> str:
    try:
        rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "src")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty src" if dirty else "")


def machine() -> str:
    return (f"{platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} cores, {platform.machine()}")  # fmt: skip


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="srtm-cp-bench-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


app = typer.Typer(add_completion=False)


@app.command()
def main(
    runs: Annotated[
        int | None, typer.Option(min=1, help="Runs; medians over them (default 3; 1 --quick).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run of about a minute.")] = False,
    topics: Annotated[
        int | None, typer.Option(min=1, help="Topics created per store and run (default 10).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Seconds per read and report window (default 2).")
    ] = None,
    brokers: Annotated[
        int | None,
        typer.Option(min=1, help=f"Simulated brokers of part 4 (default {TARGET_BROKERS:,})."),
    ] = None,
    controllers: Annotated[
        int,
        typer.Option(help="3: part 2 on three controllers on one prefix too (standbys); or 1."),
    ] = 3,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures to this file.")
    ] = None,
) -> None:
    """The control plane's scale: plan-change latency on SQLite and etcd, reads per second
    of one controller and of three, reports taken per second, and 1,000 brokers."""
    if controllers not in (1, 3):
        raise typer.BadParameter(f"1 or 3, not {controllers}", param_hint="--controllers")
    cfg = Config(
        runs=runs if runs is not None else (1 if quick else 3),
        topics=topics if topics is not None else (3 if quick else 10),
        duration_s=duration if duration is not None else (0.5 if quick else 2.0),
        warm_s=0.2 if quick else 0.5,
        brokers=brokers if brokers is not None else (100 if quick else TARGET_BROKERS),
        steady_s=2.0 if quick else 4.0,
        controllers=controllers,
    )
    console = Console(width=max(Console().width, 160))
    log = Console(stderr=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with workspace() as workdir:
        res, watch = asyncio.run(measure(cfg, workdir, log))
    doc = figures(res, cfg)
    reasons = watch.reasons()
    out = {"revision": git_revision(), "machine": machine(), "loadavg": os.getloadavg(),
           "config": asdict(cfg), "disturbed": bool(reasons), "reasons": reasons,
           "windows": [{"what": w.what, **asdict(w.figures)} for w in watch.windows],
           **doc}  # fmt: skip
    if json_path is not None:  # first: a closed stdout must not cost the figures
        json_path.write_text(json.dumps(out, indent=2, allow_nan=True) + "\n")
    for table in tables(res, cfg, doc):
        console.print(table)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    console.print(f"revision {out['revision']}; {out['machine']}; load average at the end {load}",
                  highlight=False)  # fmt: skip
    if reasons:
        console.print("[red]disturbed:[/] " + "; ".join(reasons), highlight=False)
    else:
        console.print(f"not disturbed (other processes under {FOREIGN_CPU_SHARE:.0%} of the "
                      "machine in every window)", highlight=False)  # fmt: skip


if __name__ == "__main__":
    app()
