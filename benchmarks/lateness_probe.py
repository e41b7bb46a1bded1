"""Where a shaped release's lateness comes from: each late release, and what held it.

The broker runs in a child process (uvloop, collector frozen as ``srtm broker`` does)
with a topic shaped at RATE/s, b = BURST; the parent offers 2 % above the rate (PUB,
paced, one consumer FINs everything: ``benchmarks/broker.py``'s shaped row). With
``--topics N --rate R``: N topics shaped at R/s, b = 1, offered 2 % above by one
publisher round them, a consumer each (``benchmarks/broker.py``'s low-rate rows); with
``--offer 0.5`` half the rate, so that nearly every message finds its token and is
released on arrival, in the read that brings it. In the
child, the broker's callbacks that can run long are timed (reads, dispatch flushes,
sends, histogram flushes, the scans), the collector's passes are timed (gc.callbacks),
and every release records its wall-clock lateness and how much CPU time the broker's
thread got meanwhile. A release later than ``--late-us`` is charged to the longest
timed thing that overlapped its wait, else to the collector, else to the release
timer's wake-up (it woke after the due time: the spin was too short), else to the
scheduler (from that wake-up on the thread got far less CPU than the wall time that
passed: it was not running), else to the loop itself (untimed work). Releases due on
arrival (a token was there: the lateness is the read's, from the kernel's stamp) are
counted apart from those held for a token, with the time from the arrival to the read
that took them and from its start to their dispatch.

    .venv/bin/python benchmarks/lateness_probe.py [--duration 5] [--late-us 100]
        [--topics 40 --rate 10]
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
import gc
import multiprocessing
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

sys.path.insert(0, str(Path(__file__).parent))
from broker import SHAPED_BURST, SHAPED_OFFER, SHAPED_RATE, task_paced, task_paced_topics
from srtm.broker import (
    Broker,
    BrokerOptions,
    dispatch,
    intake,
    output,
    release,
    scan,
    shares,
    stats,
    tcp,
)

#: start, end (wall ns), CPU ns the thread got meanwhile, what ran.
Span = tuple[int, int, int, str]
#: A timer's wake-up at most this long before a release is the one that woke it for it.
_WAKE_AHEAD_NS = 20_000_000


class Spans:
    """(start, end, what) of timed calls, in flat int64 arrays: a list of tuples would
    itself make the collector's passes long (it tracks each tuple)."""

    def __init__(self) -> None:
        self.t: array[int] = array("q")
        self.names: list[str] = []

    def add(self, start: int, end: int, cpu: int, name: str) -> None:
        if name not in self.names:
            self.names.append(name)
        self.t.extend((start, end, cpu, self.names.index(name)))

    def items(self) -> list[Span]:
        t, n = self.t, self.names
        return [(t[i], t[i + 1], t[i + 2], n[t[i + 3]]) for i in range(0, len(t), 4)]


def _timed(spans: Spans, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    clock, cpu = time.time_ns, time.thread_time_ns
    t = spans.t
    spans.add(0, 0, 0, name)
    code = spans.names.index(name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = clock(), cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            t.extend((t0, clock(), cpu() - c0, code))

    return wrapper


def _instrument(spans: Spans, releases: array[int], wakes: array[int], timed: bool) -> None:
    for cls, names in (
        ()
        if not timed
        else (
            (intake.Intake, ("on_readable",)),
            (output.Output, ("_on_writable", "send")),
            (tcp.Client, ("_beat",)),
            (dispatch.Dispatcher, ("_flush",)),
            (scan.Scan, ("scan",)),
            (stats.Recorder, ("flush",)),
            (release.Releaser, ("_on_timer",)),
            (stats.BrokerStats, ("pending_recorders",)),
            (shares.Shares, ("lease_ok",)),
        )
    ):
        for n in names:
            setattr(cls, n, _timed(spans, f"{cls.__name__}.{n}", getattr(cls, n)))
    original = stats.TopicStats.dispatched
    cpu = time.thread_time_ns

    def dispatched(self: Any, channel: str, records: Any, now: int, *a: Any) -> None:
        if a[0]:  # shaped
            t = cpu()
            for r in records:
                if not r[5]:
                    releases.extend((r[4], now, t, r[4] == r[3]))  # due on arrival?
        original(self, channel, records, now, *a)

    stats.TopicStats.dispatched = dispatched  # type: ignore[method-assign, assignment]
    on_timer = release.Releaser._on_timer

    def woke(self: Any) -> None:
        # when the timer was armed for, when the loop saw it, and the thread's CPU then
        if (timer := self._timer) is not None and timer.armed_ns is not None:
            wakes.extend((timer.armed_ns, time.time_ns(), cpu()))
        on_timer(self)

    release.Releaser._on_timer = woke  # type: ignore[method-assign]
    gc_start: list[int] = [0, 0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[:] = time.time_ns(), cpu()
        else:
            spans.add(
                gc_start[0], time.time_ns(), cpu() - gc_start[1], f"gc gen{info['generation']}"
            )

    gc.callbacks.append(on_gc)


def _broker_main(conn: Any, timed: bool, topics: list[str], rate: float) -> None:
    import uvloop

    spans = Spans()
    releases: array[int] = array("q")
    wakes: array[int] = array("q")
    _instrument(spans, releases, wakes, timed)

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            opts = BrokerOptions(tcp_port=0, http_port=0, data_dir=Path(tmp))
            b = Broker(opts)
            await b.start()
            assert b.tcp_address is not None
            for topic in topics:
                b.shares.set_bucket(topic, rate, 1)
            if not topics:
                b.shares.set_bucket("probe", SHAPED_RATE, SHAPED_BURST)
            gc.collect()
            gc.freeze()
            conn.send(b.tcp_address)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, conn.recv)
            await b.stop()

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(main())
    r = releases
    w = wakes
    conn.send(
        (
            spans.items(),
            list(zip(r[::4], r[1::4], r[2::4], r[3::4], strict=True)),
            list(zip(w[::3], w[1::3], w[2::3], strict=True)),
        )
    )


def _percentiles(lates: list[int]) -> str:
    lates = sorted(lates)
    n = len(lates)
    if not n:
        return "none"
    return (
        f"{n}; lateness p50 {lates[n // 2] / 1e3:.1f} µs, "
        f"p99 {lates[int(n * 0.99)] / 1e3:.1f} µs, max {lates[-1] / 1e3:.1f} µs"
    )


def _analyse(
    spans: list[Span],
    releases: list[tuple[int, int, int, int]],
    wakes: list[tuple[int, int, int]],
    late_ns: int,
) -> None:
    spans.sort()
    woke_at = [w[1] for w in wakes]
    starts = [s[0] for s in spans]
    longest = max((e - s for s, e, _, _ in spans), default=0)
    causes: collections.Counter[str] = collections.Counter()
    excess: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    lates = [now - due for due, now, _, _ in releases]
    untimed: list[tuple[int, int, int, int]] = []
    for due, now, cpu, _ in releases:
        late = now - due
        if late > late_ns:
            lo = bisect.bisect_left(starts, due - longest)
            hi = bisect.bisect_right(starts, now)
            # What overlapped the wait, by the CPU time it took (its wall time counts
            # the time the thread was not running too).
            over = [(c, n) for s, e, c, n in spans[lo:hi] if e > due and s < now]
            cause = None
            if over:
                c, what = max(over)
                if c > late // 3:
                    cause = what.split()[0] if what.startswith("gc") else what
            # The timer's wake-up for it: after the due time (the spin was too short),
            # else whether the thread ran from then on (it spins: CPU time = wall time).
            i = bisect.bisect_right(woke_at, now) - 1
            wake = wakes[i] if i >= 0 and due - wakes[i][1] < _WAKE_AHEAD_NS else None
            if cause is None and wake is not None:
                armed, woke, woke_cpu = wake
                if woke > due:
                    cause = "the timer woke after the due time"
                elif (now - woke) - (cpu - woke_cpu) > late // 2:
                    cause = "descheduled (CPU time < wall time)"
                else:
                    untimed.append((woke - armed, due - woke, now - woke, cpu - woke_cpu))
            cause = cause or "untimed (loop, wake-up)"
            causes[cause] += 1
            excess[cause].append(late)
    n = len(lates)
    print(f"releases: {_percentiles(lates)}")
    # A message that found a token waited for nothing: its lateness is the read's, from
    # the kernel's stamp (the wake-up, the read, the answer), not the release loop's.
    on_arrival = [now - due for due, now, _, arrived in releases if arrived]
    held = [now - due for due, now, _, arrived in releases if not arrived]
    print(f"  due on arrival: {_percentiles(on_arrival)}")
    # Of those: from the kernel's arrival stamp to the read that took it, and in it.
    read_starts = [s for s, _, _, n in spans if n == "Intake.on_readable"]
    before, within = [], []
    for due, now, _, arrived in releases:
        if arrived and (i := bisect.bisect_right(read_starts, now) - 1) >= 0:
            before.append(read_starts[i] - due)
            within.append(now - read_starts[i])
    if before:
        print(f"    arrival to its read: {_percentiles(before)}")
        print(f"    in the read, to the dispatch: {_percentiles(within)}")
    print(f"  held for a token: {_percentiles(held)}")
    k = sum(causes.values())
    print(f"later than {late_ns / 1e3:.0f} µs: {k} ({100 * k / n:.2f} %), charged to:")
    for cause, k in causes.most_common():
        v = sorted(excess[cause])
        print(
            f"  {cause:36s} {k:6d}  median {v[len(v) // 2] / 1e3:7.1f}  max {v[-1] / 1e3:7.1f} µs"
        )
    for late_wake, ahead, after, got in untimed:
        print(
            f"    untimed: the timer woke {late_wake / 1e3:.1f} µs late, "
            f"{ahead / 1e3:.1f} µs before the due time; released {after / 1e3:.1f} µs "
            f"after it woke, with {got / 1e3:.1f} µs of CPU"
        )
    by_name: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    first, last = releases[0][1], releases[-1][1]
    cpus: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
    for s, e, c, name in spans:
        if first <= s <= last:  # during the load, not at start or stop
            by_name[name].append(e - s)
            cpus[name].append(c)
    print("timed: count; wall p99, max; CPU p50, p99, max (µs)")
    for name, ds in sorted(by_name.items()):
        ds.sort()
        cs = sorted(cpus[name])
        k = int(len(ds) * 0.99)
        print(
            f"  {name:28s} {len(ds):7d} {ds[k] / 1e3:8.1f} {ds[-1] / 1e3:8.1f}"
            f" {cs[len(cs) // 2] / 1e3:8.1f} {cs[k] / 1e3:8.1f} {cs[-1] / 1e3:8.1f}"
        )


def main(
    duration: float = typer.Option(5.0, help="Seconds of paced load."),
    late_us: float = typer.Option(100.0, help="A release later than this is explained."),
    timed: bool = typer.Option(True, help="Time the callbacks (else only gc and releases)."),
    topics: int = typer.Option(0, min=0, help="N topics at --rate each, b = 1 (0: the one)."),
    rate: float = typer.Option(10.0, min=0.1, help="Each topic's rate (msg/s) with --topics."),
    offer: float = typer.Option(
        1.02,
        min=0.01,
        help="With --topics: what is offered, as a multiple of --rate (below "
        "1: a token waits for most messages, released on arrival).",
    ),
) -> None:
    """Run the shaped load against an instrumented broker and explain each late release."""
    names = [f"low{i}" for i in range(topics)]
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.get_context("spawn").Process(
        target=_broker_main, args=(child, timed, names, rate)
    )
    proc.start()
    addr = parent.recv()
    if names:
        # By default as the low-rate rows: 2 % over, settled for the backlog that makes.
        res = task_paced_topics(addr, names, rate * offer, duration, 2.0 + 3 / rate)
        print(f"consumers: {res['received']:,.0f} received")
    else:
        res = task_paced(addr, "probe", SHAPED_OFFER, duration, 1.0)
        print(f"consumer: {res['received']:,.0f} received at {res['rate']:,.0f}/s")
    parent.send("stop")
    spans, releases, wakes = parent.recv()
    proc.join()
    late = sorted(w - a for a, w, _ in wakes)
    if late:
        print(
            f"timer wake-ups: {len(late)}; late p50 {late[len(late) // 2] / 1e3:.1f} µs, "
            f"p99 {late[int(len(late) * 0.99)] / 1e3:.1f} µs"
        )
    _analyse(spans, releases, wakes, int(late_us * 1000))


if __name__ == "__main__":
    typer.run(main)
