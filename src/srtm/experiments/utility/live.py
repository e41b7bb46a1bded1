"""The utility-aware allocation paper's experiments live on 127.0.0.1, at the small scale of
``srtm.experiments.utility.scenario``: a controller and a broker as child processes, one
``srtm.client.Publisher`` per flow, one ``srtm.client.Subscriber`` per consumer (its own
ephemeral channel, its class in IDENTIFY ``srtm_class``, proven by the cluster token), the
stages one after another, consumers of each class joining and leaving as the stage's
population says.

Who decides (``mode``):

- ``controller``: each topic is created with its ``utility`` document; the controller
  (``--utility-interval-s``, ``--cpu-capacity``) chooses the rates and admitted counts and
  sets the broker's buckets and admission. A stage's new population or producer rate is
  sent as ``PATCH /topics/NAME {"utility": …}``. ``GET /utility`` is sampled as the plan.
- ``driver``: "driver-optimized": this process runs ``srtm.utility.optimize`` on the
  stage and applies it itself (``PATCH /topics/NAME {"rate"}``, the broker's
  ``POST /srtm/admission``). For when the controller side is not there.

What is reported is measured, not the plan: per stage, over the last ``WINDOW_SHARE`` of
it, the consumers connected per class at the broker (``GET /srtm/admission``, the median
of 1 s samples) and each flow's delivered rate (messages per second received by its
median connected consumer; the broker's accepted rate where none is connected). The
producers follow the flow's allowed rate as a flow-controlled producer does (never above
their own rate), so no backlog builds that would blur a rate change.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from srtm.client import Publisher, Subscriber
from srtm.experiments import host, validity
from srtm.experiments.scenarios.live import OnProgress, _run_async
from srtm.experiments.sizing import Sizing
from srtm.experiments.utility.scenario import BROKER, CPU, LiveExperiment, Stage, plan, problem
from srtm.launch import LocalCluster, start_cluster
from srtm.utility import usage

Mode = Literal["controller", "driver"]
MODES: tuple[Mode, ...] = ("controller", "driver")
#: Seconds per stage (full run, and --quick).
STAGE_S = {"trading-day": 16.0, "excess-capacity": 25.0, "latency-effects": 18.0}
QUICK_STAGE_S = 7.0
#: The share of a stage measured: its end, once admission and rates have settled.
WINDOW_SHARE = 0.4
#: The controller's optimizer and rate-control periods in these runs.
UTILITY_INTERVAL_S = 2.0
RATE_CONTROL_INTERVAL_S = 1.0
SAMPLE_S = 1.0
#: A producer that sent less than this share of what it was due was starved of CPU.
PRODUCER_SHORT_SHARE = 0.05
ORDER = ["gold", "silver", "bronze"]
#: Why these runs are not sized to the machine (``srtm.experiments.sizing``), as the demo
#: and multi-tenant are: they are not CPU-bound. Their verdicts are on rates and admitted
#: counts, decided from the costs and capacity each topic declares (the model, not this
#: machine's CPU); the machine enters only through the broker's own congestion flag
#: (``--cpu-congested``, 0.85 core), and the broker measured 0.08-0.19 core in these runs:
#: 0.4 core on a machine half as fast. The flows' r_max and the declared capacity cap
#: their traffic at about 250 msg/s published and 1,700 deliveries a second (capacity ÷
#: B), a third of the demo's message work (3,000 msg/s in and out, about one of the
#: development machine's two CPUs). All 11 verdicts held on the 2-core machine with
#: other processes using 26-91 % of its CPUs (docs/results/utility.md, the u19 rerun): a
#: busy machine is a slower one. A producer starved of CPU marks the run DISTURBED;
#: ``host.run_cpus`` records what the run's processes used.
NOT_SIZED = (
    "at most about 250 msg/s published and 1,700 deliveries a second, rates and admission "
    "decided by declared costs, the broker far below its 0.85-core congestion flag: not "
    "CPU-bound"
)


@dataclass
class ClassedConsumer:
    flow: str
    klass: str
    index: int
    sub: Subscriber


@dataclass
class FlowRun:
    name: str
    produce: float
    #: The rate the producer may send at now (the topic's rate, or the plan's).
    allowed: float
    publisher: Publisher | None = None
    due: float = 0.0
    sent: int = 0


@dataclass
class Run:
    exp: LiveExperiment
    mode: Mode
    stage_s: float
    cluster: LocalCluster | None = None
    flows: dict[str, FlowRun] = field(default_factory=dict)
    consumers: list[ClassedConsumer] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    host: host.HostFigures | None = None
    t0: float = 0.0


def run(
    exp: LiveExperiment, out: Path, mode: Mode = "controller", *, quick: bool = False,
    on_progress: OnProgress | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the experiment's stages live; the summary is returned and written to
    ``summary_path``."""
    stage_s = QUICK_STAGE_S if quick else STAGE_S[exp.name]
    progress = on_progress or (lambda *_: None)
    cluster_dir = out / "cluster" / f"{exp.name}-live"
    shutil.rmtree(cluster_dir, ignore_errors=True)
    controller_args: list[str] = []
    if mode == "controller":
        controller_args = [
            "--utility-interval-s", str(UTILITY_INTERVAL_S),
            "--rate-control-interval-s", str(RATE_CONTROL_INTERVAL_S),
            "--cpu-capacity", repr(exp.cpu_capacity),
        ]  # fmt: skip
    progress("starting the controller and the broker", 0, 1)
    info = Run(exp, mode, stage_s)
    info.cluster = start_cluster(cluster_dir, 1, controller_args=controller_args,
                                 tie_to_parent=True)  # fmt: skip
    client_log = logging.getLogger("srtm.client")
    level = client_log.level
    client_log.setLevel(logging.ERROR)  # refused SUBs are the experiment, not news
    try:
        _run_async(_drive(info, progress))
    finally:
        client_log.setLevel(level)
        progress("stopping", 0, 1)
        info.cluster.stop()
    summary = summarize(info)
    out.mkdir(parents=True, exist_ok=True)
    summary_path(out, exp.name).write_text(json.dumps(summary, indent=2))
    return summary


def summary_path(out: Path, name: str) -> Path:
    """``out/<name>-live.json``: where ``run`` writes the experiment ``name``'s summary."""
    return out / f"{name}-live.json"


async def _drive(info: Run, progress: OnProgress) -> None:
    assert info.cluster is not None
    cluster = info.cluster
    url, headers = cluster.url, cluster.headers
    broker_url = f"http://{cluster.brokers[0].http_address}"
    pids = [os.getpid(), cluster.controller.proc.pid, *(b.proc.pid for b in cluster.brokers)]
    total = info.stage_s * len(info.exp.stages)
    tasks: list[asyncio.Task[Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        first = info.exp.stages[0]
        for f in first.flows:
            await _create(http, url, headers, info, f.name, f.utility, f.produce)
            run_ = info.flows[f.name] = FlowRun(f.name, f.produce, f.produce)
            run_.publisher = Publisher(f.name, f"{f.name}-producer", controller=url)
        info.t0 = time.monotonic()
        watch = host.take(pids)
        for flow in info.flows.values():
            tasks.append(asyncio.create_task(_produce(flow)))
        tasks.append(asyncio.create_task(_sample(http, url, broker_url, info)))
        tasks.append(asyncio.create_task(_follow(http, url, info)))
        try:
            for k, stage in enumerate(info.exp.stages):
                start = info.t0 + k * info.stage_s
                progress(stage.name, k * info.stage_s, total)
                await _enter(http, url, broker_url, headers, info, stage, k > 0)
                end = start + info.stage_s
                w0 = end - WINDOW_SHARE * info.stage_s
                await _until(w0)
                before = _snapshot(info, pids)
                await _until(end)
                info.stages.append(_measure(info, stage, before, _snapshot(info, pids), w0))
            progress("done", total, total)
            info.host = host.between(watch, host.take(pids), os.cpu_count() or 1)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await asyncio.gather(*(c.sub.close() for c in info.consumers),
                                 return_exceptions=True)  # fmt: skip
            for flow in info.flows.values():
                if flow.publisher is not None:
                    with contextlib.suppress(Exception):
                        await flow.publisher.close()


async def _create(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], info: Run, name: str,
    utility: dict[str, Any], produce: float,
) -> None:  # fmt: skip
    doc: dict[str, Any] = {
        "name": name, "slo_p99_ms": 1000.0, "burst": max(1.0, round(produce / 10)),
        "rate": produce, "publishers": [{"id": f"{name}-producer", "rate": produce}],
    }  # fmt: skip
    if info.mode == "controller":
        doc["utility"] = utility
    await _call(http, "POST", f"{url}/topics", doc, headers, info)


async def _enter(
    http: aiohttp.ClientSession, url: str, broker_url: str, headers: dict[str, str],
    info: Run, stage: Stage, declare: bool,
) -> None:  # fmt: skip
    """The stage begins: producers at its rates, its population of consumers, and the
    decision (the controller told, or the driver's own plan applied)."""
    for f in stage.flows:
        info.flows[f.name].produce = f.produce
    if info.mode == "controller":
        if declare:
            for f in stage.flows:
                await _call(http, "PATCH", f"{url}/topics/{f.name}", {"utility": f.utility},
                            headers, info)  # fmt: skip
    else:
        alloc = plan(info.exp, stage)
        for f in stage.flows:
            rate = alloc.rates[f.name]
            info.flows[f.name].allowed = rate
            await _call(http, "PATCH", f"{url}/topics/{f.name}", {"rate": rate}, headers, info)
            classes = {c: n for (flow, c), n in alloc.admitted.items() if flow == f.name}
            if classes:
                await _call(http, "POST", f"{broker_url}/srtm/admission?topic={f.name}",
                            {"classes": classes, "order": ORDER}, headers, info)  # fmt: skip
    await _populate(url, info, stage)


async def _populate(url: str, info: Run, stage: Stage) -> None:
    """Start the consumers the stage adds (each class's first n stay), close those it
    removes (the newest leave first)."""
    wanted = {(f.name, c, i) for f in stage.flows for c, n in f.consumers.items()
              for i in range(n)}  # fmt: skip
    # The driver is the cluster's operator: its token proves every class (the brokers
    # refuse a class above default without proof).
    token = info.cluster.token if info.cluster is not None else None
    keep: list[ClassedConsumer] = []
    leaving: list[ClassedConsumer] = []
    for c in info.consumers:
        (keep if (c.flow, c.klass, c.index) in wanted else leaving).append(c)
    info.consumers = keep
    await asyncio.gather(*(c.sub.close() for c in leaving), return_exceptions=True)
    have = {(c.flow, c.klass, c.index) for c in keep}
    new = []
    for flow, klass, i in sorted(wanted - have):
        sub = Subscriber(
            flow, f"{klass}-{i}#ephemeral", controller=url, consumer_class=klass,
            class_secret=token, max_in_flight=100, retry_s=0.25, max_retry_s=1.0,
        )  # fmt: skip
        new.append(ClassedConsumer(flow, klass, i, sub))
    await asyncio.gather(*(c.sub.start() for c in new), return_exceptions=True)
    info.consumers += new


async def _produce(flow: FlowRun) -> None:
    """Send at min(own rate, allowed rate): a flow-controlled producer."""
    assert flow.publisher is not None
    await flow.publisher.start()
    last = time.monotonic()
    credit = 0.0
    while True:
        await asyncio.sleep(0.01)  # the producer's tick
        now = time.monotonic()
        rate = min(flow.produce, flow.allowed)
        credit += rate * (now - last)
        flow.due += rate * (now - last)
        last = now
        while credit >= 1.0:
            credit -= 1.0
            ack = await flow.publisher.publish()
            ack.add_done_callback(_ignore)
            flow.sent += 1


def _ignore(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a refused message is counted by the publisher


async def _follow(http: aiohttp.ClientSession, url: str, info: Run) -> None:
    """The producers' allowed rates: the topic's rate (controller mode: the plan's)."""
    if info.mode != "controller":
        return
    while True:
        for flow in info.flows.values():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError, ValueError):
                async with http.get(f"{url}/topics/{flow.name}") as r:
                    if r.status == 200:
                        flow.allowed = float((await r.json())["rate"])
        await asyncio.sleep(0.5)  # the producers' poll period


async def _sample(http: aiohttp.ClientSession, url: str, broker_url: str, info: Run) -> None:
    """Every second: the broker's connected consumers per class and accepted messages
    per topic, and (controller mode) the controller's plan."""
    while True:
        t = time.monotonic()
        sample: dict[str, Any] = {"t": t, "topics": {}, "plan": None}
        for name in info.flows:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, KeyError, ValueError):
                async with http.get(f"{broker_url}/srtm/admission",
                                    params={"topic": name}) as r:  # fmt: skip
                    adm = await r.json()
                async with http.get(f"{broker_url}/stats",
                                    params={"format": "json", "topic": name}) as r:  # fmt: skip
                    stats = await r.json()
                topics = stats.get("topics", [])
                srtm = (stats.get("srtm", {}).get("topics") or [{}])[0]
                sample["topics"][name] = {
                    "bucket_rate": (srtm.get("bucket") or {}).get("rate"),
                    "held": bool(srtm.get("held")),
                    "waiting": srtm.get("shaping_depth", 0),
                    "connected": {c["name"]: c["connected"] for c in adm.get("classes", [])},
                    "admitted": {c["name"]: c["admitted"] for c in adm.get("classes", [])},
                    "messages": topics[0]["message_count"] if topics else 0,
                }
        if info.mode == "controller":
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with http.get(f"{url}/utility") as r:
                    if r.status == 200:
                        sample["plan"] = await r.json()
        info.samples.append(sample)
        await asyncio.sleep(max(0.0, SAMPLE_S - (time.monotonic() - t)))


def _snapshot(info: Run, pids: list[int]) -> dict[str, Any]:
    return {
        "t": time.monotonic(),
        "received": {id(c): c.sub.received for c in info.consumers},
        "sent": {f.name: (f.sent, f.due) for f in info.flows.values()},
        "host": host.take(pids),
        "broker_pid": pids[-1],
    }


def _accepted(topic: list[dict[str, Any]], window: list[dict[str, Any]]) -> float:
    """Messages a second the broker accepted on the topic over the window's samples."""
    if len(topic) < 2:
        return 0.0
    span = max(1e-9, float(window[-1]["t"] - window[0]["t"]))
    return float(topic[-1]["messages"] - topic[0]["messages"]) / span


def _measure(
    info: Run, stage: Stage, before: dict[str, Any], after: dict[str, Any], w0: float
) -> dict[str, Any]:
    """The stage's measured figures over its window."""
    span = after["t"] - before["t"]
    window = [s for s in info.samples if s["t"] >= w0]
    classes = info.exp.classes
    flows = []
    for f in stage.flows:
        mine = [c for c in info.consumers if c.flow == f.name and id(c) in before["received"]]
        each = [(after["received"][id(c)] - before["received"][id(c)]) / span for c in mine]
        got = [g for g in each if g > 0]
        by_class = {k: sum(g for c, g in zip(mine, each, strict=True) if c.klass == k)
                    for k in f.consumers}  # fmt: skip
        topic = [s["topics"][f.name] for s in window if f.name in s["topics"]]
        accepted = _accepted(topic, window)
        connected = {c: int(statistics.median([t["connected"].get(c, 0) for t in topic] or [0]))
                     for c in f.consumers}  # fmt: skip
        buckets = [t["bucket_rate"] or 0.0 for t in topic]
        sent, due = (after["sent"][f.name][i] - before["sent"][f.name][i] for i in (0, 1))
        flows.append({
            "name": f.name, "available": dict(f.consumers), "admitted": connected,
            "rate": statistics.median(got) if got else accepted, "accepted_rate": accepted,
            "consumers_receiving": len(got),
            "delivered": by_class,
            # The broker's side: its sub-bucket's rate (median of the samples; 0 when it
            # had none), samples held, the most messages waiting to be released.
            "bucket_rate": statistics.median(buckets) if buckets else None,
            "held_samples": sum(t["held"] for t in topic),
            "max_waiting": max((t["waiting"] for t in topic), default=0), "produce": f.produce,
            "producer_sent": sent, "producer_due": due,
        })  # fmt: skip
    b0, b1 = before["host"].procs.get(before["broker_pid"]), after["host"].procs.get(
        after["broker_pid"])  # fmt: skip
    broker_cpu = (b1.cpu_s - b0.cpu_s) / span if b0 and b1 else None
    rates = {fl["name"]: fl["rate"] for fl in flows}
    admitted = {(fl["name"], c): n for fl in flows for c, n in fl["admitted"].items()}
    prob = problem(info.exp, stage)
    model_cpu = usage(prob, rates, admitted)[(BROKER, CPU)]
    plan_doc = next((s["plan"] for s in reversed(window) if s["plan"]), None)
    return {
        "name": stage.name,
        "available": {c: sum(f.consumers.get(c, 0) for f in stage.flows) for c in classes},
        "admitted": {c: sum(fl["admitted"].get(c, 0) for fl in flows) for c in classes},
        # What each class received: messages a second summed over its consumers.
        "delivered": {c: sum(fl["delivered"].get(c, 0.0) for fl in flows) for c in classes},
        "rates": [fl["rate"] for fl in flows],
        "flows": flows,
        "cpu_used": model_cpu,
        "cpu_capacity": info.exp.cpu_capacity,
        "broker_cpu": broker_cpu,
        "expected": _expected(info, stage, plan_doc),
        "controller_plan": plan_doc,
        "window_s": span,
    }


def _expected(info: Run, stage: Stage, plan_doc: dict[str, Any] | None) -> dict[str, Any]:
    """The plan beside the measurement: the controller's last run in the window
    (``GET /utility``), else (driver-optimized, or no run yet) the optimizer's here."""
    classes = info.exp.classes
    by_name = {f["name"]: f for f in (plan_doc or {}).get("flows", [])}
    if all(f.name in by_name for f in stage.flows):
        flows = [by_name[f.name] for f in stage.flows]
        return {
            "by": "controller",
            "rates": [float(f["rate"]) for f in flows],
            "admitted": {c: sum(int(f["admitted"].get(c, 0)) for f in flows) for c in classes},
        }
    alloc = plan(info.exp, stage)
    return {
        "by": "optimizer",
        "rates": [alloc.rates[f.name] for f in stage.flows],
        "admitted": {c: sum(n for (_, k), n in alloc.admitted.items() if k == c) for c in classes},
    }


async def _call(
    http: aiohttp.ClientSession, method: str, url: str, doc: Any, headers: dict[str, str],
    info: Run,
) -> None:  # fmt: skip
    try:
        async with http.request(method, url, json=doc, headers=headers) as r:
            if r.status >= 300:
                info.refused.append(f"{method} {url}: {r.status} {(await r.text())[:200]}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        info.refused.append(f"{method} {url}: {type(exc).__name__} {exc}")


async def _until(t: float) -> None:
    while (left := t - time.monotonic()) > 0:
        await asyncio.sleep(left)  # the stages' clock


def disturbed(info: Run) -> str | None:
    """Why the run measured the machine rather than the allocation, if it did, by the
    thresholds of ``srtm.experiments.validity``."""
    why = []
    short = [(fl["name"], s["name"]) for s in info.stages for fl in s["flows"]
             if fl["producer_due"] > 0
             and fl["producer_sent"] < (1 - PRODUCER_SHORT_SHARE) * fl["producer_due"]]  # fmt: skip
    if short:
        why.append(
            f"producers sent under {1 - PRODUCER_SHORT_SHARE:.0%} of their due messages in "
            f"{len(short)} flow-stages (first: {short[0][0]} in {short[0][1]})"
        )
    validity.machine_reasons(info.host, why, "a run process")
    return "; ".join(why) or None


def summarize(info: Run) -> dict[str, Any]:
    """The document ``--json`` prints: the sim's shape plus what was measured."""
    from srtm.experiments.utility import sim as utility_sim

    exp = info.exp
    claims = utility_sim.live_claims(exp.name, info.stages, exp.params)
    out: dict[str, Any] = {
        "experiment": exp.name, "live": True,
        "mode": "controller" if info.mode == "controller" else "driver-optimized",
        "title": exp.title, "cpu_capacity": exp.cpu_capacity, "stage_s": info.stage_s,
        "segments": info.stages, "claims": claims, "refused": info.refused,
        "sizing": Sizing(1.0).to_json(),  # run as written: NOT_SIZED
    }  # fmt: skip
    out["disturbed"] = disturbed(info)
    if info.host is not None:
        out["host"] = dataclasses.asdict(info.host)
    return out
