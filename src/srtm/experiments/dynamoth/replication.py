"""Dynamoth's channel-level scalability, live: one hot topic read by more and more
subscribers, with and without ALL_PUBLISHERS replication (docs/controller.md,
"Replication").

A controller and three brokers on 127.0.0.1. The topic's publishers (``publishers`` ×
``each`` msg/s) are placed on broker 1; with replication the topic gets ``replicas``
replicas (``POST /topics/hot/replicas``), each shaping the whole stream and delivering the
channels homed on it. Subscribers (one channel each, in their own process) are added in
steps up to each count of ``subscribers``; per step, after ``settle_s``, ``measure_s`` of
traffic: the messages delivered per second over all channels (egress, counted when
received), each broker's share of them, and the publish → receipt latency (p50, p99) of
the messages sent in the window. Expected egress is the topic's rate × subscribers.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from srtm.client import Publisher
from srtm.experiments.dynamoth.bench import Bench, Fanout, cluster, quantile_ms

TOPIC = "hot"


@dataclass(frozen=True)
class ReplicationSettings:
    subscribers: tuple[int, ...] = (1, 5, 10, 20, 40)
    #: One run per count: 1 is no replication.
    replicas: tuple[int, ...] = (1, 3)
    brokers: int = 3
    publishers: int = 4
    #: msg/s each publisher sends.
    each: float = 50.0
    burst: float = 100.0
    settle_s: float = 1.5
    measure_s: float = 4.0


@dataclass(frozen=True)
class ReplicationStep:
    """One subscriber count of one run."""

    replicas: int
    subscribers: int
    expected_msg_s: float
    #: Published in the window (less sends skipped as late), msg/s.
    sent_msg_s: float
    egress_msg_s: float
    #: Egress per broker id that delivered, msg/s.
    per_broker: dict[str, float]
    p50_ms: float
    p99_ms: float
    #: Deliveries beyond the first of a message to a channel (while a home changes).
    duplicates: int


async def _one(s: ReplicationSettings, out: Path, replicas: int) -> dict[str, Any]:
    c = cluster(out / "cluster", s.brokers)
    ids = {b.tcp_address: str(i + 1) for i, b in enumerate(c.brokers)}
    bench = Bench(c)
    fan = await Fanout.start(bench.url, out / "received.npz")
    assert fan.proc.pid is not None
    bench.more_pids.append(fan.proc.pid)
    names = [f"p{j}" for j in range(s.publishers)]
    pubs: list[Publisher] = []
    acks: list[asyncio.Future[None]] = []
    stop = asyncio.Event()
    windows: list[tuple[int, int, int]] = []
    try:
        rate = s.each * s.publishers * 1.5
        await bench.topic(TOPIC, rate, s.burst, names, s.each)
        await bench.move(TOPIC, names, "1")
        if replicas > 1:
            await bench.call("POST", f"/topics/{TOPIC}/replicas", {"count": replicas})
        for p in names:
            pub = Publisher(TOPIC, p, controller=bench.url, max_pending=1_000)
            await pub.start()
            pubs.append(pub)
        sender = asyncio.create_task(bench.pace(pubs, s.each, 2**62, acks, stop))
        have = 0
        for n in s.subscribers:
            while have < n:
                await fan.sub(TOPIC, f"c{have}")
                have += 1
            await asyncio.sleep(s.settle_s)
            t0 = time.time_ns()
            await asyncio.sleep(s.measure_s)
            windows.append((n, t0, time.time_ns()))
        stop.set()
        await sender
        await asyncio.gather(*acks, return_exceptions=True)
        await asyncio.sleep(1.0)  # the last window's messages reach the subscribers
        got = await fan.stop()
        why = bench.disturbed()
        for pub in pubs:
            await pub.close()
        await bench.close()
    finally:
        fan.kill()
        c.stop()
    steps = []
    for n, t0, t1 in windows:
        # Latency of what was sent in the window; rates of what arrived in it (a
        # backlog delivered later counts where it was delivered).
        # Only the step's own n channels: a channel added later was once given, at its
        # start, messages published before it existed (docs/results/dynamoth.md); they
        # are not this step's deliveries.
        mine = [i for i, c in enumerate(got.channels) if int(c[1:]) < n]
        rows = got.sent_in(t0, t1)
        rows = rows[np.isin(rows[:, 1], mine)]
        came = got.received_in(t0, t1)
        span = (t1 - t0) / 1e9
        lat = rows[:, 4] - rows[:, 3]
        per = {
            ids.get(got.brokers[b], got.brokers[b]): float((came[:, 2] == b).sum() / span)
            for b in np.unique(came[:, 2])
        }
        once = len(np.unique(rows[:, [1, 3]], axis=0))
        steps.append(
            ReplicationStep(
                replicas,
                n,
                s.each * s.publishers * n,
                bench.pacing.sent_in(t0, t1) / span,
                len(came) / span,
                per,
                quantile_ms(lat, 0.5),
                quantile_ms(lat, 0.99),
                len(rows) - once,
            )
        )
    return {
        "replicas": replicas,
        "windows_ns": windows,
        "steps": [asdict(x) for x in steps],
        "sent": bench.pacing.sent,
        "disturbed": why,
    }


def run(out: Path, s: ReplicationSettings | None = None) -> dict[str, Any]:
    """One run per replica count; the document ``--json`` prints."""
    from srtm.experiments.scenarios.live import _run_async

    s = s or ReplicationSettings()
    runs: list[dict[str, Any]] = []
    for k in s.replicas:
        where = out / f"replication-{k}"
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)

        async def main(k: int = k, where: Path = where) -> None:
            runs.append(await _one(s, where, k))

        _run_async(main())
    return {"experiment": "dynamoth-replication", "settings": asdict(s), "runs": runs}
