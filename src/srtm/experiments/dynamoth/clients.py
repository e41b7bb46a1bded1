"""Dynamoth's scalability, live: response time against the number of clients as the load
grows, on one broker and on several (the controller's placement spreading the clients).

Clients are publishers on ``tiles`` topics (client i on tile i mod ``tiles``, as players
publish to the tile they are in), each sending ``each`` msg/s; every tile is read by one
subscriber (in their own process). Brokers emulate a small instance (``--capacity``
msg/s each), so that one fills at a load this machine carries. Every client is declared
at the start (placed by the ``lb`` policy over the run's brokers); in steps, more of them
start sending (round robin over the brokers their plans name), up to each count of
``clients``. Per step, after ``settle_s``, ``measure_s``: the response time (publish →
receipt) mean, p50 and p99 of the messages sent in the window, the messages delivered
per second, and each broker's share of them.
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


@dataclass(frozen=True)
class ClientsSettings:
    clients: tuple[int, ...] = (10, 20, 40, 80, 120)
    #: One run per count of brokers.
    brokers: tuple[int, ...] = (1, 3)
    tiles: int = 8
    #: msg/s each client sends.
    each: float = 10.0
    #: Each broker's emulated capacity (msg/s, ``--capacity``).
    capacity: float = 500.0
    burst: float = 50.0
    settle_s: float = 1.5
    measure_s: float = 4.0


@dataclass(frozen=True)
class ClientsStep:
    brokers: int
    clients: int
    offered_msg_s: float
    #: Sent in the window (the offer less sends skipped as late), msg/s.
    sent_msg_s: float
    delivered_msg_s: float
    per_broker: dict[str, float]
    #: Latency of the messages sent in the window that were received by the run's end
    #: (None: none was: over capacity, the queue only grows).
    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    #: Sent in the window and not received by the end of the run.
    unreceived: int


async def _one(s: ClientsSettings, out: Path, brokers: int) -> dict[str, Any]:
    c = cluster(out / "cluster", brokers, ["--capacity", repr(s.capacity)])
    ids = {b.tcp_address: str(i + 1) for i, b in enumerate(c.brokers)}
    bench = Bench(c)
    fan = await Fanout.start(bench.url, out / "received.npz")
    assert fan.proc.pid is not None
    bench.more_pids.append(fan.proc.pid)
    most = max(s.clients)
    tile = [f"tile{i % s.tiles}" for i in range(most)]
    pubs: list[Publisher] = []
    acks: list[asyncio.Future[None]] = []
    stop = asyncio.Event()
    senders: list[asyncio.Task[None]] = []
    windows: list[tuple[int, int, int]] = []
    try:
        for t in sorted(set(tile)):
            mine = [f"{t}-c{i}" for i in range(most) if tile[i] == t]
            # The tile's bucket: its clients' rate with room (the paper's 1.1), a burst
            # that one clump of sends fits.
            await bench.topic(t, s.each * len(mine) * 1.1, s.burst, mine, s.each)
            await fan.sub(t, "view")
        order = await _spread(bench, sorted(set(tile)))
        for n in s.clients:
            new = []
            for i in range(len(pubs), n):
                t, who = order[i]
                pub = Publisher(t, who, controller=bench.url, max_pending=1_000)
                await pub.start()
                new.append(pub)
            pubs += new
            if new:
                senders.append(asyncio.create_task(bench.pace(new, s.each, 2**62, acks, stop)))
            await asyncio.sleep(s.settle_s)
            t0 = time.time_ns()
            await asyncio.sleep(s.measure_s)
            windows.append((n, t0, time.time_ns()))
        stop.set()
        await asyncio.gather(*senders)
        with_time = asyncio.gather(*acks, return_exceptions=True)
        await asyncio.wait_for(with_time, 60)
        await asyncio.sleep(1.0)
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
        rows = got.sent_in(t0, t1)
        came = got.received_in(t0, t1)
        span = (t1 - t0) / 1e9
        lat = rows[:, 4] - rows[:, 3]
        per = {
            ids.get(got.brokers[b], got.brokers[b]): float((came[:, 2] == b).sum() / span)
            for b in np.unique(came[:, 2])
        }
        mean = float(lat.mean() / 1e6) if len(lat) else None
        steps.append(
            ClientsStep(
                brokers,
                n,
                s.each * n,
                bench.pacing.sent_in(t0, t1) / span,
                len(came) / span,
                per,
                mean,
                quantile_ms(lat, 0.5) if len(lat) else None,
                quantile_ms(lat, 0.99) if len(lat) else None,
                max(0, bench.pacing.sent_in(t0, t1) - len(rows)),
            )
        )
    return {
        "brokers": brokers,
        "windows_ns": windows,
        "steps": [asdict(x) for x in steps],
        "sent": bench.pacing.sent,
        "disturbed": why,
    }


async def _spread(bench: Bench, tiles: list[str]) -> list[tuple[str, str]]:
    """Every client as (tile, id), in the order they start: round robin over the brokers
    their plans put them on, so that each step's clients are spread as the placement
    spreads all of them (``lb`` fills a broker with a topic's consecutive publishers)."""
    per: dict[str, list[tuple[int, str, str]]] = {}
    for t in tiles:
        doc = await bench.call("GET", f"/topics/{t}")
        for b in doc["brokers"]:
            mine = ((int(p.rsplit("c", 1)[1]), t, p) for p in b["publishers"])
            per.setdefault(b["id"], []).extend(mine)
    queues = [sorted(v) for _, v in sorted(per.items())]
    order: list[tuple[str, str]] = []
    while any(queues):
        for q in queues:
            if q:
                _, t, p = q.pop(0)
                order.append((t, p))
    return order


def run(out: Path, s: ClientsSettings | None = None) -> dict[str, Any]:
    """One run per broker count; the document ``--json`` prints."""
    from srtm.experiments.scenarios.live import _run_async

    s = s or ClientsSettings()
    runs: list[dict[str, Any]] = []
    for k in s.brokers:
        where = out / f"clients-{k}"
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)

        async def main(k: int = k, where: Path = where) -> None:
            runs.append(await _one(s, where, k))

        _run_async(main())
    return {"experiment": "dynamoth-clients", "settings": asdict(s), "runs": runs}
