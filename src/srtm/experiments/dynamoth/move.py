"""A move traced hop by hop: topics moved whole from broker 1 to broker 2, a broker their
subscribers do not read yet (a spawn's case, and a despawn's to a broker new to the
topic), with per-message timing at every hop.

Each topic (4 publishers, ``each`` msg/s apiece) is placed on broker 1 and read there by
its own subscriber (lookup refreshed every 0.2 s, as the live runs' sink); then, one topic
at a time, ``POST /topics/NAME/move`` sends all its publishers to broker 2. Per message
that arrived at broker 2 within ``window_s`` of the first to arrive there: the
publisher's send stamp, its arrival at broker 2 (relayed by broker 1 or sent there
directly), its release by broker 2's sub-bucket, its first dispatch to a subscriber
(broker 2's trace rows) and its receipt. A message is *held* at the destination when it
waited there more than ``HOLD_MS`` (arrival to dispatch); the wait is split into arrival
→ release (no share yet, or tokens) and release → dispatch (no subscriber to dispatch
to). The same count over the next ``window_s`` (the moved topic settled on broker 2) is
the machine's own noise.

Two runs: *before*, the controller with ``--subscriber-wait-s 0`` (a move's traffic goes
to broker 2 at once, as before the fix), and *after*, with its default: broker 2 gets the
traffic once the topic's subscriber reads it there.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from srtm.client import Publisher
from srtm.experiments.dynamoth.bench import Bench, cluster, drain, quantile_ms

#: A message that waited longer than this at the destination (arrival → dispatch) was
#: held: a few ms is the broker's own path (loop turn, the relay's batching).
HOLD_MS = 5.0
RUN = "move"


@dataclass(frozen=True)
class MoveSettings:
    moves: int = 4
    publishers: int = 4
    #: msg/s each publisher sends (400 msg/s in all: the run's own load stays small).
    each: float = 25.0
    rate: float = 1_000.0
    burst: float = 100.0
    #: Traffic before the first move, between moves and after the last (s).
    gap_s: float = 3.0
    #: Messages arriving at the destination this long after its first are the move's (s).
    window_s: float = 1.0
    seed: int = 0


#: The two runs: the controller's ``--subscriber-wait-s`` (None: its default).
VARIANTS: dict[str, float | None] = {"before": 0.0, "after": None}


@dataclass(frozen=True)
class MoveTrace:
    """One move, hop by hop (times in ms after the move was asked, waits in ms)."""

    topic: str
    messages: int
    held: int
    hold_max_ms: float
    #: Of the longest hold: arrival → release (share, tokens) and release → dispatch
    #: (no subscriber).
    wait_release_ms: float
    wait_subscriber_ms: float
    first_arrival_ms: float
    subscriber_joined_ms: float
    #: Hop medians over the move's messages: send → arrival at the destination (through
    #: the source when relayed), arrival → release, release → dispatch, dispatch → receipt.
    hop_ms: tuple[float, float, float, float]
    e2e_p99_ms: float
    e2e_max_ms: float
    #: Held messages among those broker 2 delivered of the topic in the next window.
    steady_held: int
    steady_messages: int


async def _run(s: MoveSettings, out: Path, wait_s: float | None) -> dict[str, Any]:
    traces = out / "traces"
    waits = [] if wait_s is None else ["--subscriber-wait-s", repr(wait_s)]
    c = cluster(out / "cluster", 2, ["--trace-dir", str(traces), "--run", RUN], waits)
    bench = Bench(c)
    topics = [f"mv{i}" for i in range(s.moves)]
    names = {t: [f"{t}-p{j}" for j in range(s.publishers)] for t in topics}
    pubs: list[Publisher] = []
    acks: list[asyncio.Future[None]] = []
    moved_ns: dict[str, int] = {}
    stop = asyncio.Event()
    try:
        dest = c.brokers[1].tcp_address
        for t in topics:
            await bench.topic(t, s.rate, s.burst, names[t], s.each)
            await bench.move(t, names[t], "1")
            while dest in await bench.lookup(t):
                await asyncio.sleep(0.05)
            await bench.subscribe(t, "c")
        for t in topics:
            for p in names[t]:
                pub = Publisher(t, p, controller=bench.url, max_pending=1_000)
                await pub.start()
                pubs.append(pub)
        watcher = asyncio.create_task(bench.watch_joins(stop))
        end_ns = time.time_ns() + int(s.gap_s * (s.moves + 1) * 1e9)
        senders = [
            asyncio.create_task(bench.pace([p for p in pubs if p.topic == t], s.each, end_ns, acks))
            for t in topics
        ]
        for t in topics:
            await asyncio.sleep(s.gap_s)
            moved_ns[t] = time.time_ns()
            await bench.move(t, names[t], "2")
        await asyncio.gather(*senders)
        await asyncio.gather(*acks, return_exceptions=True)
        await drain(bench, bench.pacing.sent)
        stop.set()
        await watcher
        why = bench.disturbed()
        for pub in pubs:
            await pub.close()
        await bench.close()
    finally:
        c.stop()
    return _analyse(s, bench, moved_ns, traces, dest, why)


def _analyse(
    s: MoveSettings,
    bench: Bench,
    moved_ns: dict[str, int],
    traces: Path,
    dest: str,
    why: str | None,
) -> dict[str, Any]:
    table = pq.read_table(traces / "broker" / f"run={RUN}").to_pydict()
    at = {
        m: (a, r, d)
        for m, a, r, d in zip(
            table["msg_id"],
            table["t_arrive_ns"],
            table["t_release_ns"],
            table["t_dispatch_ns"],
            strict=True,
        )
    }
    moves = []
    for topic, t0 in moved_ns.items():
        w = int(s.window_s * 1e9)
        mine = [
            g
            for g in bench.recorder.got
            if g.topic == topic and g.broker == dest and g.msg_id in at
        ]
        # The move's window starts at its first arrival on broker 2 (after the wait for
        # the subscriber, when there is one).
        first = min((at[g.msg_id][0] for g in mine if at[g.msg_id][0] >= t0), default=None)
        if first is None:
            continue
        got = [g for g in mine if first <= at[g.msg_id][0] < first + w]
        later = [at[g.msg_id] for g in mine if first + w <= at[g.msg_id][0] < first + 2 * w]
        if not got:
            continue
        rows = np.array([(g.send_ns, *at[g.msg_id], g.recv_ns) for g in got], dtype=np.int64)
        send, arrive, release, dispatch, recv = rows.T
        waited = dispatch - arrive
        worst = int(np.argmax(waited))
        joined = bench.recorder.joined_ns.get((topic, "c", dest))
        moves.append(
            MoveTrace(
                topic=topic,
                messages=len(got),
                held=int((waited > HOLD_MS * 1e6).sum()),
                hold_max_ms=float(waited[worst] / 1e6),
                wait_release_ms=float((release[worst] - arrive[worst]) / 1e6),
                wait_subscriber_ms=float((dispatch[worst] - release[worst]) / 1e6),
                first_arrival_ms=float((arrive.min() - t0) / 1e6),
                subscriber_joined_ms=float("nan") if joined is None else (joined - t0) / 1e6,
                hop_ms=(
                    quantile_ms(arrive - send, 0.5),
                    quantile_ms(release - arrive, 0.5),
                    quantile_ms(dispatch - release, 0.5),
                    quantile_ms(recv - dispatch, 0.5),
                ),
                e2e_p99_ms=quantile_ms(recv - send, 0.99),
                e2e_max_ms=quantile_ms(recv - send, 1.0),
                steady_held=sum(1 for a, _, d in later if d - a > HOLD_MS * 1e6),
                steady_messages=len(later),
            )
        )
    sent = bench.pacing.sent
    delivered = len({(g.publisher, g.seq) for g in bench.recorder.got})
    return {
        "moves": [asdict(m) for m in moves],
        "sent": sent,
        "delivered": delivered,
        "held": sum(m.held for m in moves),
        "hold_max_ms": max((m.hold_max_ms for m in moves), default=0.0),
        "disturbed": why,
    }


def run(
    out: Path, s: MoveSettings | None = None, variants: tuple[str, ...] = tuple(VARIANTS)
) -> dict[str, Any]:
    """Each variant's run (``VARIANTS``), in order; their documents by name."""
    from srtm.experiments.scenarios.live import _run_async

    s = s or MoveSettings()
    runs: dict[str, Any] = {}
    for name in variants:
        where = out / f"move-{name}"
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)

        async def main(name: str = name, where: Path = where) -> None:
            runs[name] = await _run(s, where, VARIANTS[name])

        _run_async(main())
    return {"experiment": "dynamoth-move", "settings": asdict(s), "hold_ms": HOLD_MS, "runs": runs}
