"""Rate control on measured congestion, live: ``srtm experiment run measured-congestion``.

A controller and one broker on 127.0.0.1; one managed topic (``quotes``) whose utility
spec declares no cost, so the cost model plans it and the broker's measured CPU judges
it (``srtm.control.utility.UtilityControl.measured_use``); four gold subscribers and a
producer that follows the topic's rate. The broker's CPU budget is ``--cpu-capacity``
(``CPU_CAPACITY`` of one core: a threshold on what the broker reports, not a cgroup
quota). After ``QUIET_S`` a load generator (``srtm.experiments.calibrate_cost.drive``, a
process of its own) publishes a topic outside the optimizer at ``LOAD_RATE`` to one
consumer for ``LOAD_S``, which puts the broker's real CPU over its budget; then it stops.

Measured every half second: the topic's rate (the controller's), the broker process's
CPU (``/proc``), and the subscribers' end-to-end latency per phase. Verdicts
(``verdicts``, pure): the broker's CPU really went over its budget; the rate fell
within ``FALL_S`` of the first sample over it (by half, or as far as brought the CPU
back within the budget); the topic's p99 stayed within its SLO in
every phase; the rate came back within ``RECOVER_S`` of the load leaving. Not sized to
the machine: the load is what it is meant to be, a broker pushed over its budget
(``NOT_SIZED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from hdrh.histogram import HdrHistogram

from srtm.client import Publisher, Subscriber
from srtm.experiments import host, validity
from srtm.experiments.calibrate_cost import _generator, process_cpu_s
from srtm.experiments.figures.common import claim
from srtm.experiments.scenarios.live import OnProgress, _run_async
from srtm.launch import start_cluster
from srtm.utility.ratecontrol import FULL_BAND

TOPIC, LOAD_TOPIC = "quotes", "load"
R_MIN, R_MAX = 20.0, 400.0
GOLD = 4
SLO_MS = 50.0
#: The topic's bound on the wait behind its bucket (``block``: the producer's connection
#: is not read beyond it), and the producer's credit cap: a cut of the rate then leaves
#: no backlog that would wait seconds at the lower rate.
MAX_WAIT_MS = SLO_MS / 2
CREDIT_S = 0.05
IN_FLIGHT_S = MAX_WAIT_MS / 1e3
CPU_CAPACITY = 0.2
#: Enough for the load alone to hold the broker over its budget: at 5,000 msg/s the
#: broker reached only 0.21 cores in some runs on the 2-core VM (its cost per message fell
#: since the experiment was sized), and rate control rightly cut the topic a little; at
#: 7,500 it reached 0.40-0.49 cores alone, on one core and beside a spinning process.
LOAD_RATE = 7500.0
QUIET_S, LOAD_S, AFTER_S = 15.0, 25.0, 20.0
QUICK = (8.0, 15.0, 12.0)
UTILITY_INTERVAL_S, RATE_CONTROL_INTERVAL_S = 3.0, 1.0
SAMPLE_S = 0.5
#: The rate has fallen when it is under this share of its level before the load, or
#: under ``CUT`` of it with the broker's CPU back within its budget (the load alone
#: under the budget: a partial cut is the right answer); recovered when back over
#: ``RECOVERED`` of it.
FALLEN, CUT, RECOVERED = 0.5, 0.9, 0.9
FALL_S, RECOVER_S = 5.0, 15.0
SPEC: dict[str, Any] = {
    "kind": "one-to-many", "r_min": R_MIN, "r_max": R_MAX,
    "classes": [{"name": "gold", "available": GOLD, "utility": {"slope": 1}}],
}  # fmt: skip
NOT_SIZED = (
    "the broker is meant to be pushed over its CPU budget by a fixed load; slowing the "
    "run would change what it tests"
)


@dataclass(frozen=True)
class Point:
    """One sample: seconds since the start, the topic's rate, the broker's CPU (cores)."""

    t_s: float
    rate: float
    broker_cpu: float
    #: Messages of the topic waiting behind its bucket at the broker.
    waiting: int = 0
    #: Messages a second the producer sent, and the slowest subscriber received.
    sent: float = 0.0
    delivered: float = 0.0
    #: The p99 of the end-to-end latency of what the subscribers received since the
    #: sample before (ms; 0 when nothing came).
    p99_ms: float = 0.0


@dataclass(frozen=True)
class Phases:
    """When the load came and went (s since the start) and the run's end."""

    load_start_s: float
    load_end_s: float
    end_s: float


def first_at(points: Sequence[Point], start: float, test: Any) -> float | None:
    """Seconds from ``start`` to the first sample at or after it that passes ``test``."""
    return next((p.t_s - start for p in points if p.t_s >= start and test(p)), None)


def verdicts(
    points: Sequence[Point], ph: Phases, p99_ms: dict[str, float], capacity: float = CPU_CAPACITY,
    slo_ms: float = SLO_MS,
) -> list[dict[str, Any]]:  # fmt: skip
    """The run's claims, from what it measured."""
    before = [p.rate for p in points if ph.load_start_s - 4 <= p.t_s < ph.load_start_s]
    level = statistics.median(before) if before else R_MAX
    loaded = [p for p in points if ph.load_start_s <= p.t_s < ph.load_end_s]
    peak = max((p.broker_cpu for p in loaded), default=0.0)
    # The reaction is timed from the first sample over the budget: the load generator
    # (a process of its own) may take a moment to load the broker.
    over = (1 + FULL_BAND) * capacity
    onset = next((p.t_s for p in loaded if p.broker_cpu > over), None)
    fell = None if onset is None else first_at(points, onset, lambda p: p.rate < FALLEN * level)
    # A load that alone stays under the budget needs only part of the rate cut: the
    # rate has fallen far enough once it is cut and the CPU is back within the budget.
    eased = (
        None
        if onset is None
        else first_at(points, onset, lambda p: p.rate < CUT * level and p.broker_cpu <= over)
    )
    reacted = min((x for x in (fell, eased) if x is not None), default=None)
    back = first_at(points, ph.load_end_s, lambda p: p.rate >= RECOVERED * level)
    worst = max(p99_ms.values(), default=float("nan"))
    queued = max((p.waiting for p in points), default=0)

    def secs(x: float | None) -> str:
        return "never" if x is None else f"after {x:.1f} s"

    return [
        claim("the load pushes the broker's real CPU over its budget",
              f"broker CPU up to {peak:.2f} cores under the load (budget {capacity:g}), "
              f"first over it {secs(None if onset is None else onset - ph.load_start_s)} "
              "of the load's start", onset is not None),
        claim(f"rates fall within seconds (within {FALL_S:g} s of the CPU going over: "
              f"under {FALLEN:.0%} of their level, or cut under {CUT:.0%} of it with the "
              "CPU back within its budget)",
              f"{level:.0f} msg/s before; under {FALLEN * level:.0f} {secs(fell)}; cut "
              f"with the CPU back within its budget {secs(eased)}",
              reacted is not None and reacted <= FALL_S),
        claim(f"the SLO (p99 {slo_ms:g} ms) is held",
              "p99 " + ", ".join(f"{k} {v:.1f} ms" for k, v in p99_ms.items())
              + f"; at most {queued} messages waiting behind the bucket",
              bool(p99_ms) and worst <= slo_ms),
        claim(f"rates recover when the load leaves (back over {RECOVERED:.0%} within "
              f"{RECOVER_S:g} s)",
              f"over {RECOVERED * level:.0f} msg/s {secs(back)} of the load leaving",
              back is not None and back <= RECOVER_S),
    ]  # fmt: skip


def _new_histogram() -> HdrHistogram:
    return HdrHistogram(1, 3_600_000_000_000, 3)


@dataclass
class _CongestionRun:
    phases: Phases
    points: list[Point] = dataclasses.field(default_factory=list)
    p99_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    allowed: float = R_MAX
    sent: int = 0
    due: float = 0.0
    host: host.HostFigures | None = None
    phase_latency: HdrHistogram = dataclasses.field(default_factory=_new_histogram)


async def _follow(http: aiohttp.ClientSession, url: str, run: _CongestionRun) -> None:
    """The producer's allowed rate: the topic's, polled four times a second."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            async with http.get(f"{url}/topics/{TOPIC}") as r:
                if r.status == 200:
                    run.allowed = float((await r.json())["rate"])
        await asyncio.sleep(0.25)


async def _produce(pub: Publisher, run: _CongestionRun) -> None:
    """Send at the allowed rate. A flow-controlled producer: what it could not send while
    the broker held its connection (the topic's bound, ``MAX_WAIT_MS``) it does not send
    in a burst afterwards (its credit is capped at ``CREDIT_S`` of the rate), and it
    keeps at most ``IN_FLIGHT_S`` of the rate unanswered (at least one): a message
    stamped and sent while the broker holds the connection waits in it, so a window of
    20 at 20 msg/s was a second of wait at the bottom of a cut."""
    await pub.start()
    last, credit = time.monotonic(), 0.0
    unanswered = 0

    def answered(fut: asyncio.Future[None]) -> None:
        nonlocal unanswered
        unanswered -= 1
        _ignore(fut)

    while True:
        await asyncio.sleep(0.005)
        now = time.monotonic()
        grant = min(run.allowed * (now - last), max(1.0, run.allowed * CREDIT_S) - credit)
        credit += max(0.0, grant)
        run.due += run.allowed * (now - last)
        last = now
        window = max(1, int(run.allowed * IN_FLIGHT_S))
        while credit >= 1.0 and unanswered < window:
            credit -= 1.0
            unanswered += 1
            (await pub.publish()).add_done_callback(answered)
            run.sent += 1


def _ignore(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


async def _waiting(http: aiohttp.ClientSession, broker_url: str) -> int:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError, ValueError):
        params = {"format": "json", "topic": TOPIC}
        async with http.get(f"{broker_url}/stats", params=params) as r:
            stats = await r.json()
        return int((stats.get("srtm", {}).get("topics") or [{}])[0].get("shaping_depth", 0))
    return 0


async def _sample(
    http: aiohttp.ClientSession, broker_url: str, run: _CongestionRun, pid: int, t0: float,
    subs: list[Subscriber],
) -> None:  # fmt: skip
    last_t, last_cpu = time.monotonic(), process_cpu_s(pid)
    last_sent, last_got = run.sent, [s.received for s in subs]
    while True:
        await asyncio.sleep(SAMPLE_S)
        now, cpu = time.monotonic(), process_cpu_s(pid)
        span = max(now - last_t, 1e-6)
        got = [s.received for s in subs]
        slowest = min((g - h for g, h in zip(got, last_got, strict=True)), default=0)
        waiting = await _waiting(http, broker_url)
        p99 = _take_p99_ms(subs, run.phase_latency)
        run.points.append(Point(
            now - t0, run.allowed, (cpu - last_cpu) / span, waiting,
            (run.sent - last_sent) / span, slowest / span, p99,
        ))  # fmt: skip
        last_t, last_cpu, last_sent, last_got = now, cpu, run.sent, got


def _p99(hist: HdrHistogram) -> float:
    return hist.get_value_at_percentile(99.0) / 1e6 if hist.get_total_count() else 0.0


def _take_p99_ms(subs: list[Subscriber], phase: HdrHistogram) -> float:
    """The p99 (ms) of what the subscribers received since the last call; what they
    received goes into ``phase`` too."""
    merged = _new_histogram()
    for s in subs:
        merged.add(s.latency)
        s.latency.reset()
    phase.add(merged)
    return _p99(merged)


def _p99_ms(subs: list[Subscriber], run: _CongestionRun) -> float:
    """The phase's p99 (ms) so far, and a new phase."""
    _take_p99_ms(subs, run.phase_latency)
    value = _p99(run.phase_latency)
    run.phase_latency = _new_histogram()
    return value


async def _drive(cluster: Any, run: _CongestionRun, quick: bool, progress: OnProgress) -> None:
    url, headers = cluster.url, cluster.headers
    broker = cluster.brokers[0]
    doc = {"name": TOPIC, "slo_p99_ms": SLO_MS, "burst": R_MAX / 10, "rate": R_MAX,
           "max_wait_ms": MAX_WAIT_MS, "overflow": "block",
           "publishers": [{"id": "quotes-producer", "rate": R_MAX}], "utility": SPEC}  # fmt: skip
    pids = [os.getpid(), cluster.controller.proc.pid, broker.proc.pid]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.post(f"{url}/topics", json=doc, headers=headers) as r:
            if r.status >= 300:
                raise RuntimeError(f"POST /topics: {r.status} {await r.text()}")
        subs = [
            Subscriber(TOPIC, f"gold-{i}#ephemeral", controller=url, consumer_class="gold",
                       class_secret=cluster.token, max_in_flight=100)
            for i in range(GOLD)
        ]  # fmt: skip
        await asyncio.gather(*(s.start() for s in subs))
        pub = Publisher(TOPIC, "quotes-producer", controller=url, max_pending=20)
        # The generator's process is spawned before the clock starts (it takes seconds
        # to import), so that the load comes when the phase says.
        with _generator(broker.tcp, broker.proc.pid) as call:
            call("idle", 120, seconds=0.1)  # returns once the process is up
            broker_url = f"http://{broker.http_address}"
            await _phases(run, subs, pub, call, pids, http, (url, broker_url), broker.proc.pid,
                          progress)  # fmt: skip


async def _phases(
    run: _CongestionRun, subs: list[Subscriber], pub: Publisher, call: Any, pids: list[int],
    http: aiohttp.ClientSession, urls: tuple[str, str], broker_pid: int, progress: OnProgress,
) -> None:  # fmt: skip
    url, broker_url = urls
    t0 = time.monotonic()
    watch = host.take(pids)
    loops = (
        _follow(http, url, run), _produce(pub, run),
        _sample(http, broker_url, run, broker_pid, t0, subs),
    )  # fmt: skip
    tasks = [asyncio.create_task(c) for c in loops]
    ph = run.phases
    try:
        progress("quiet", 0, ph.end_s)
        await asyncio.sleep(ph.load_start_s)
        run.p99_ms["quiet"] = _p99_ms(subs, run)
        progress("load", ph.load_start_s, ph.end_s)
        await asyncio.to_thread(
            call, "drive", ph.load_end_s - ph.load_start_s + 30, topic=LOAD_TOPIC,
            rate=LOAD_RATE, consumers=1, warmup_s=0.0,
            seconds=ph.load_end_s - ph.load_start_s, body=100,
        )  # fmt: skip
        run.p99_ms["load"] = _p99_ms(subs, run)
        progress("after", ph.load_end_s, ph.end_s)
        await asyncio.sleep(max(0.0, t0 + ph.end_s - time.monotonic()))
        run.p99_ms["after"] = _p99_ms(subs, run)
        run.host = host.between(watch, host.take(pids), os.cpu_count() or 1)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await asyncio.gather(*(s.close() for s in subs), return_exceptions=True)
        with contextlib.suppress(Exception):
            await pub.close()


def run(out: Path, *, quick: bool = False, on_progress: OnProgress | None = None) -> dict[str, Any]:
    """The run; its summary is returned and written to ``out/measured-congestion-live.json``."""
    quiet, load, after = QUICK if quick else (QUIET_S, LOAD_S, AFTER_S)
    phases = Phases(quiet, quiet + load, quiet + load + after)
    progress = on_progress or (lambda *_: None)
    cluster_dir = out / "cluster" / "measured-congestion-live"
    shutil.rmtree(cluster_dir, ignore_errors=True)
    args = ["--utility-interval-s", str(UTILITY_INTERVAL_S),
            "--rate-control-interval-s", str(RATE_CONTROL_INTERVAL_S),
            "--cpu-capacity", repr(CPU_CAPACITY)]  # fmt: skip
    cluster = start_cluster(cluster_dir, 1, controller_args=args, tie_to_parent=True)
    state = _CongestionRun(phases)
    client_log = logging.getLogger("srtm.client")
    level = client_log.level
    client_log.setLevel(logging.ERROR)
    try:
        _run_async(_drive(cluster, state, quick, progress))
    finally:
        client_log.setLevel(level)
        cluster.stop()
    summary = summarize(state)
    out.mkdir(parents=True, exist_ok=True)
    (out / "measured-congestion-live.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(run: _CongestionRun) -> dict[str, Any]:
    why: list[str] = []
    # The producer is held back by the topic's bound by design (block), so what it sent
    # short of the allowed rate is not a sign of a starved run: it is reported, and the
    # machine's own figures (a run process waiting for a CPU, stolen time) decide.
    validity.machine_reasons(run.host, why, "a run process")
    out: dict[str, Any] = {
        "experiment": "measured-congestion", "live": True, "cpu_capacity": CPU_CAPACITY,
        "slo_p99_ms": SLO_MS, "load_rate": LOAD_RATE, "phases": dataclasses.asdict(run.phases),
        "points": [dataclasses.asdict(p) for p in run.points], "p99_ms": run.p99_ms,
        "claims": verdicts(run.points, run.phases, run.p99_ms),
        "producer_sent_share": run.sent / run.due if run.due > 0 else None,
        "disturbed": "; ".join(why) or None,
    }  # fmt: skip
    if run.host is not None:
        out["host"] = dataclasses.asdict(run.host)
    return out


def plot(summary: dict[str, Any], out: Path) -> Path:
    """The rate and the broker's CPU over time, the load's span shaded."""
    from srtm.experiments.figures.common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    pts = summary["points"]
    ts = [p["t_s"] for p in pts]
    ax.plot(ts, [p["rate"] for p in pts], label=f"{TOPIC} rate (msg/s)")
    ax.set_ylabel("msg/s")
    ax.set_xlabel("time (s)")
    ph = summary["phases"]
    ax.axvspan(ph["load_start_s"], ph["load_end_s"], color="#ccc", alpha=0.4, label="load")
    twin = ax.twinx()
    twin.plot(ts, [p["broker_cpu"] for p in pts], color="#c33", lw=0.8, label="broker CPU")
    twin.axhline(summary["cpu_capacity"], color="#c33", ls="--", lw=0.8, label="CPU budget")
    twin.set_ylabel("cores")
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=7, loc="upper right")
    ax.set_title("Rate control on the broker's measured CPU", fontsize=10)
    png = out / "measured-congestion-live.png"
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
