"""The multi-tenant scenario live on 127.0.0.1: a controller and capacity-limited brokers
as child processes, the tenants driven through the controller's HTTP API as the scenario's
events come (``POST /topics``, ``POST /topics/NAME/publishers`` for each sensor joining,
``DELETE /topics/NAME``), each topic's sensors emulated (following its plan) and read by
its own subscriber process. ``GET /brokers`` is sampled every second for the ledger.

Every message is accounted for per topic: the (publisher, sequence) pairs the brokers
acknowledged against those the subscriber received, the deleted topic's included (its
subscriber reads on until the brokers have handed over what they held).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from srtm.analysis import profile_bucket
from srtm.experiments import analysis, host, validity
from srtm.experiments.figures.common import BURST_MARGIN
from srtm.experiments.scenarios.live import OnProgress, Sink, _run_async
from srtm.experiments.sizing import Sizing
from srtm.experiments.tenancy.scenario import TenancyScenario, Tenant, events, live_scale
from srtm.launch import LocalCluster, start_cluster
from srtm.placement import Policy
from srtm.workload import Schedule, build
from srtm.workload.emulator import Emulator, EmulatorReport, follow_plan

#: Seconds after a topic arrives (or a sensor joins) before its traffic counts for p99.
SETTLE_S = 2.0
#: Seconds the scenario runs after its last event.
TAIL_S = 5.0
#: A joining sensor starts sending this long after its join (its route reaches the
#: emulator with the next plan poll).
JOIN_LEAD_S = 0.5
DRAIN_S = 30.0
#: The emulator skips (and counts) sends it could only make this late; a scenario slowed
#: in time (``tenancy.scaled``) divides it by its scale, as its SLOs (``max_late_s``).
MAX_LATE_S = 0.01
#: Seconds of a topic's schedule its (r, b) is profiled on, at full scale.
PROFILE_S = 20.0


def max_late_s(sc: TenancyScenario) -> float:
    return MAX_LATE_S / sc.time_scale


@dataclass
class TopicRun:
    tenant: Tenant
    rate: float
    burst: float
    seed: int
    emulator: Emulator | None = None
    report: EmulatorReport | None = None
    sink: Sink | None = None
    received: int = 0


@dataclass
class LiveTenancy:
    run: str
    policy: str
    topics: dict[str, TopicRun] = field(default_factory=dict)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    #: The machine over the scenario (the run's own processes: driver, controller, brokers).
    host: host.HostFigures | None = None
    t0_ns: int = 0
    end_s: float = 0.0


def profile(t: Tenant, seed: int, seconds: float = PROFILE_S) -> tuple[float, float]:
    """The topic's (r, b) profiled as the paper does on its own workload: the schedule its
    sensors will send (all of them; periodic sensors keep their phases), with
    ``BURST_MARGIN`` on the burst as the simulated figures have. A scenario slowed in
    time profiles ``PROFILE_S / time_scale`` seconds: the same sends, slowed, so the same
    burst in tokens."""
    sample = build(t.specs(), seconds, seed=seed)
    b = profile_bucket(sample.arrivals_ns())
    return b.rate, max(1.0, float(math.ceil(b.burst * BURST_MARGIN)))


def schedule_of(t: Tenant, end_s: float, seed: int) -> Schedule:
    """Sends from the topic's arrival (time 0) to ``end_s`` (scenario time); a joining
    sensor's only from shortly after its join."""
    length = end_s - t.arrive_s
    sched = build(t.specs(), length, seed=seed)
    if t.join_every_s is None:
        return sched
    starts = np.array([(i * t.join_every_s + JOIN_LEAD_S) * 1e9 for i in range(t.publishers)])
    keep = sched.t_ns >= starts[sched.publisher]
    return Schedule(
        sched.t_ns[keep], sched.publisher[keep], sched.batch[keep], sched.publishers,
        sched.duration_s, sched.seed,
    )  # fmt: skip


def run(
    out: Path, policy: Policy = "srtm", *, sc: TenancyScenario | None = None,
    seed: int = 0, on_progress: OnProgress | None = None, sizing: Sizing | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the live scenario under ``policy``; traces under ``out/traces``; the summary
    is returned and written to ``summary_path`` (``out/multi-tenant-<policy>.json``,
    ``multi-tenant`` being the scenario's name). ``sizing``: how ``sc``
    was sized to this machine (``srtm.experiments.sizing``), kept in the summary."""
    sc = sc or live_scale()
    name = f"{sc.name}-{policy}"
    traces = out / "traces"
    for side in ("broker", "subscriber"):
        shutil.rmtree(traces / side / f"run={name}", ignore_errors=True)
    cluster_dir = out / "cluster" / name
    shutil.rmtree(cluster_dir, ignore_errors=True)
    progress = on_progress or (lambda *_: None)
    progress("starting brokers", 0, 1)
    args = ["--capacity", repr(sc.capacity), "--mcap", repr(sc.mcap), "--trace-dir",
            str(traces), "--run", name,
            "--release-spin-us", "0", "--busy-poll-us", "0"]  # fmt: skip
    cluster = start_cluster(cluster_dir, sc.brokers, broker_args=args, tie_to_parent=True)
    info = LiveTenancy(name, policy)
    try:
        _run_async(_drive(sc, policy, cluster, traces, info, seed, progress))
    finally:
        progress("stopping", 0, 1)
        for t in info.topics.values():
            if t.sink is not None:
                t.received = max(t.received, t.sink.stop())
        cluster.stop()
    progress("analysing", 0, 1)
    summary = summarize(sc, info, traces)
    summary["sizing"] = (sizing or Sizing(sc.time_scale)).to_json()
    out.mkdir(parents=True, exist_ok=True)
    summary_path(out, name).write_text(json.dumps(summary, indent=2))
    progress("analysing", 1, 1)
    return summary


def summary_path(out: Path, run_name: str) -> Path:
    """``out/<run>.json``: where ``run`` writes the summary of the run ``run_name``."""
    return out / f"{run_name}.json"


async def _drive(
    sc: TenancyScenario, policy: str, cluster: LocalCluster, traces: Path, info: LiveTenancy,
    seed: int, progress: OnProgress,
) -> None:  # fmt: skip
    url, headers = cluster.url, cluster.headers
    evs = events(sc)
    info.end_s = evs[-1].t_s + TAIL_S
    for i, tenant in enumerate(sc.tenants):
        rate, burst = profile(tenant, seed + i, PROFILE_S / sc.time_scale)
        info.topics[tenant.name] = TopicRun(tenant, rate, burst, seed + i)
    tasks: list[asyncio.Task[Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        info.t0_ns = time.time_ns() + int(0.5e9)
        pids = [os.getpid(), cluster.controller.proc.pid, *(b.proc.pid for b in cluster.brokers)]
        watch = host.take(pids)
        sampler = asyncio.create_task(_sample(http, url, info))
        try:
            for ev in evs:
                await _until(info.t0_ns + int(ev.t_s * 1e9))
                progress(f"{ev.what} {ev.topic}", ev.t_s, info.end_s)
                topic = info.topics[ev.topic]
                if ev.what == "create":
                    await _create(http, url, headers, policy, topic, ev, info)
                    tasks += await _start_topic(url, traces, info, topic, max_late_s(sc))
                elif ev.what == "join":
                    doc = {"publishers": [{"id": p.id, "rate": p.rate, "group": p.group}
                                          for p in ev.publishers]}  # fmt: skip
                    await _call(http, "POST", f"{url}/topics/{ev.topic}/publishers", doc,
                                headers, info)  # fmt: skip
                else:
                    await _call(http, "DELETE", f"{url}/topics/{ev.topic}", None, headers, info)
            end_ns = info.t0_ns + int(info.end_s * 1e9)
            while (left := end_ns - time.time_ns()) > 0:
                progress("running", info.end_s - left / 1e9, info.end_s)
                await asyncio.sleep(min(0.5, left / 1e9))  # the scenario's tail is a span
            info.host = host.between(watch, host.take(pids), os.cpu_count() or 1)
            for topic_run in info.topics.values():
                if topic_run.emulator is not None:
                    topic_run.report = topic_run.emulator.report
            await asyncio.gather(*(task for task in tasks if task.get_name() == "send"),
                                 return_exceptions=True)  # fmt: skip
            progress("draining", 0, 1)
            await _drain(info)
            progress("draining", 1, 1)
        finally:
            sampler.cancel()
            for task in tasks:
                task.cancel()
            for task in [sampler, *tasks]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for topic_run in info.topics.values():
                if topic_run.emulator is not None:
                    await topic_run.emulator.close()


async def _create(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], policy: str,
    topic: TopicRun, ev: Any, info: LiveTenancy,
) -> None:  # fmt: skip
    t = topic.tenant
    doc: dict[str, Any] = {
        "name": t.name, "slo_p99_ms": t.slo_p99_ms, "burst": topic.burst, "policy": policy,
        "publishers": [{"id": p.id, "rate": p.rate, "group": p.group} for p in ev.publishers],
    }  # fmt: skip
    if t.join_every_s is None:
        doc["rate"] = topic.rate
    else:
        doc["open"] = True  # the rate follows the sensors as they join (1.1 × their rate)
    await _call(http, "POST", f"{url}/topics", doc, headers, info)


async def _start_topic(
    url: str, traces: Path, info: LiveTenancy, topic: TopicRun, max_late: float
) -> list[asyncio.Task[Any]]:
    t = topic.tenant
    until = t.delete_s if t.delete_s is not None else info.end_s
    sink = topic.sink = Sink(url, t.name, traces, info.run)
    await sink.wait_brokers(1)
    schedule = schedule_of(t, until, topic.seed)
    emulator = topic.emulator = Emulator(
        schedule, t.name, {}, name=f"tenant-{t.name}", max_late_s=max_late
    )
    start = info.t0_ns + int(t.arrive_s * 1e9)
    emulator.stop_at(info.t0_ns + int(until * 1e9))
    following = asyncio.create_task(follow_plan(emulator, url, t.name, 0.1), name="follow")
    sending = asyncio.create_task(emulator.run(start_ns=max(start, time.time_ns())), name="send")
    return [following, sending]


async def _call(
    http: aiohttp.ClientSession, method: str, url: str, doc: Any, headers: dict[str, str],
    info: LiveTenancy,
) -> None:  # fmt: skip
    async with http.request(method, url, json=doc, headers=headers) as r:
        if r.status >= 300:
            body = await r.text()
            info.refused.append(f"{method} {url}: {r.status} {body[:200]}")


async def _sample(http: aiohttp.ClientSession, url: str, info: LiveTenancy) -> None:
    """``GET /brokers`` every second: the ledger over time."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.get(f"{url}/brokers") as r:
                doc = await r.json()
            t_s = (time.time_ns() - info.t0_ns) / 1e9
            info.ledger.append({"t_s": t_s, "brokers": doc["brokers"]})
        await asyncio.sleep(1.0)  # the sampling period


async def _until(t_ns: int) -> None:
    while (left := t_ns - time.time_ns()) > 0:
        await asyncio.sleep(left / 1e9)  # the scenario's clock


async def _drain(info: LiveTenancy) -> None:
    """Until every subscriber has what its topic's brokers acknowledged (or DRAIN_S)."""
    for t in info.topics.values():
        if t.sink is not None and t.report is not None:
            t.received = await t.sink.until(t.report.acknowledged, DRAIN_S)


def summarize(sc: TenancyScenario, info: LiveTenancy, traces: Path) -> dict[str, Any]:
    """Per topic p99 against its SLO and the accounting; the ledger samples; the checks."""
    broker_rows, sub_rows = analysis.load(traces, info.run)
    topics = []
    for name, t in info.topics.items():
        ten = t.tenant
        end = ten.delete_s if ten.delete_s is not None else info.end_s
        start_ns = info.t0_ns + int((ten.arrive_s + SETTLE_S) * 1e9)
        window = analysis.MeasuredWindow(start_ns, info.t0_ns + int(end * 1e9))
        sub = sub_rows[sub_rows["topic"] == name]
        brk = broker_rows[broker_rows["topic"] == name]
        figures = analysis.summarize(brk, sub, window, ten.slo_p99_ms) if len(sub) else {}
        published = t.report.per_publisher if t.report is not None else {}
        acc = analysis.accounting(sub, published)
        p99 = figures.get("e2e_ms", {}).get("p99", float("nan"))
        topics.append({
            "topic": name, "kind": ten.kind, "sensors": ten.publishers, "load": ten.load,
            "slo_p99_ms": ten.slo_p99_ms, "rate": t.rate, "burst": t.burst,
            "p99_ms": p99, "p50_ms": figures.get("e2e_ms", {}).get("p50", float("nan")),
            "token_p99_ms": figures.get("token_wait_ms", {}).get("p99", float("nan")),
            "brokers": figures.get("brokers_used", 0), "messages": figures.get("messages", 0),
            "met": bool(p99 <= ten.slo_p99_ms), "accounting": acc,
            "deleted": ten.delete_s is not None, "joining": ten.join_every_s is not None,
            "skipped_late": t.report.skipped_late if t.report is not None else 0,
        })  # fmt: skip
    over = [
        (s["t_s"], b["id"], b["allocated"], b["mcap"])
        for s in info.ledger
        for b in s["brokers"]
        if b["allocated"] > b["mcap"] * (1 + 1e-9)
    ]
    summary = {
        "run": info.run, "policy": info.policy, "scenario": sc.name, "brokers": sc.brokers,
        "mcap": sc.mcap, "capacity": sc.capacity, "end_s": info.end_s, "topics": topics,
        "ledger": info.ledger, "refused": info.refused,
    }  # fmt: skip
    summary["disturbed"] = disturbed(topics, info.host, max_late_s(sc))
    if info.host is not None:
        summary["host"] = dataclasses.asdict(info.host)
    summary["checks"] = checks(topics, over, info.refused)
    return summary


def disturbed(
    topics: list[dict[str, Any]], figures: host.HostFigures | None, max_late: float = MAX_LATE_S
) -> str | None:
    """Why the run measured the machine rather than the brokers, if it did, by the
    thresholds of ``srtm.experiments.validity``: send events skipped as too late, a run
    process (driver, controller, broker) waiting for a CPU, stolen CPU time."""
    skipped = sum(t["skipped_late"] for t in topics)
    sent = sum(t["accounting"]["published"] for t in topics) or 1
    why = []
    if skipped > validity.SKIPPED_SHARE * sent:
        why.append(f"{skipped:,} send events skipped as over {max_late * 1e3:g} ms late "
                   f"({skipped / sent:.1%} of the messages sent)")  # fmt: skip
    validity.machine_reasons(figures, why, "a run process")
    return "; ".join(why) or None


def checks(
    topics: list[dict[str, Any]], over: list[tuple[float, str, float, float]], refused: list[str]
) -> list[dict[str, Any]]:
    met = sum(t["met"] for t in topics)
    same = [t for t in topics if t["accounting"]["published"] == t["accounting"]["delivered"]
            and t["accounting"]["lost"] == 0]  # fmt: skip
    published = sum(t["accounting"]["published"] for t in topics)
    delivered = sum(t["accounting"]["delivered"] for t in topics)
    first = (
        f"; first: {over[0][1]} at {over[0][0]:.0f} s, {over[0][2]:.0f} > {over[0][3]:.0f}"
        if over
        else ""
    )
    return [
        {"check": "every topic meets its SLO", "ok": met == len(topics),
         "detail": f"{met} of {len(topics)} topics"},
        {"check": "no broker's allocated exceeds its mcap at any sample", "ok": not over,
         "detail": f"{len(over)} samples over" + first},
        {"check": "published = delivered, per topic", "ok": len(same) == len(topics),
         "detail": f"{published:,} published, {delivered:,} delivered; "
                   f"{len(same)} of {len(topics)} topics exact"},
        {"check": "the controller accepted every request", "ok": not refused,
         "detail": "; ".join(refused[:3]) or "all accepted"},
    ]  # fmt: skip
