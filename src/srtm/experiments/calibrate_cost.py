"""``srtm calibrate --cost``: fit the cost model's A (CPU per message) and B (CPU per
delivery) for the broker on this machine.

A broker is started as a child process (``srtm.launch.start_broker``) and driven from a
load generator in a second process: per step, one publishing connection sends PUBs at a
paced rate (in bursts every ``TICK_S``) and ``consumers`` subscribers each read their
own channel, so every message is delivered once per consumer. After a warm-up, the
broker process's CPU (utime + stime of every thread, from ``/proc/PID/stat``) is taken
over the step's window with the messages published and delivered in it. The grid spans
several rates *and* consumer counts: the paper found that fitting at high rates only
made B six times too large and at low rates only made A negative; at a single consumer
count A and B cannot be told apart. An idle step gives the broker's CPU at rest.

The fit (``srtm.utility.fit_cost``) uses what was measured, not what was asked: the
published rate, and the deliveries per message (below the consumer count where the
broker or the generator fell behind).
"""

from __future__ import annotations

import contextlib
import os
import select
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from srtm.experiments.calibrate import RDY, OnProgress, _connect, _Frames, serve_steps, step_process
from srtm.launch import start_broker
from srtm.protocol import Pub, encode_command
from srtm.utility.cost import CostFit, CostSample, cost_doc, fit_cost

TOPIC = "srtm_cost"
#: Publishing bursts this often (a paced rate as a real publisher's event loop sends it).
TICK_S = 0.002
IO_TIMEOUT_S = 10.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Steps whose deliveries fell below this share of rate × consumers are flagged "behind".
BEHIND = 0.95


@dataclass(frozen=True)
class CostPlan:
    """The grid and its timing (the defaults take about 40 s)."""

    rates: tuple[float, ...] = (2_000.0, 5_000.0, 10_000.0)
    consumers: tuple[int, ...] = (1, 4, 16)
    step_s: float = 2.5
    warmup_s: float = 0.5
    idle_s: float = 1.5
    body: int = 100
    # Channels keep every message in memory: a generator falling behind must not make the
    # broker write to disk, which would be measured as the cost of a delivery.
    broker_args: tuple[str, ...] = ("--mem-queue-size", "10000000")

    def __post_init__(self) -> None:
        if len(set(self.rates)) < 2 or len(set(self.consumers)) < 2:
            raise ValueError("the grid needs at least two rates and two consumer counts")
        if min(self.rates) <= 0 or min(self.consumers) < 1:
            raise ValueError("rates must be > 0 and consumer counts >= 1")

    def steps(self) -> int:
        return 2 + len(self.rates) * len(self.consumers) + 1  # start, idle, grid, fit


#: ``--quick``: two rates by two consumer counts, short steps (about 12 s in all).
QUICK = CostPlan(rates=(1_000.0, 3_000.0), consumers=(1, 4), step_s=1.2, warmup_s=0.3, idle_s=1.0)


@dataclass(frozen=True)
class CostStep:
    """One measured step: the rate asked for, the consumers, and what the window saw."""

    offered: float
    consumers: int
    published: int
    delivered: int
    cpu_s: float
    wall_s: float

    @property
    def rate(self) -> float:
        return self.published / self.wall_s

    @property
    def cpu(self) -> float:
        """Cores the broker used (CPU-seconds per second)."""
        return self.cpu_s / self.wall_s

    @property
    def fan_out(self) -> float:
        """Deliveries per published message in the window."""
        return self.delivered / self.published if self.published else 0.0

    @property
    def behind(self) -> bool:
        return self.consumers > 0 and (
            self.fan_out < BEHIND * self.consumers or self.rate < BEHIND * self.offered
        )

    def sample(self) -> CostSample:
        return CostSample(self.rate, self.fan_out, self.cpu)


#: Whether the kernel keeps each thread's run time in ns (``/proc/PID/task/TID/schedstat``).
_SCHEDSTAT = Path("/proc/self/schedstat").exists()


def process_cpu_s(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far (Linux ``/proc``), seconds: the sum of
    each thread's run time in ns (``schedstat``) where the kernel keeps it, else utime +
    stime in clock ticks. A quick step holds a few ms of the publishes' own cost, a tick
    or two: in ticks alone the fit of ``A`` could fall to zero."""
    if _SCHEDSTAT:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # the thread ended since the listing
                total += int((task / "schedstat").read_text().split(maxsplit=1)[0])
        return total / 1e9
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the command name (which may hold spaces): utime is the 14th field.
    rest = stat.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / _TICKS_PER_S


# == the load generator (its own process) ===============================================
def _subscribe(addr: tuple[str, int], topic: str, channel: str) -> _Frames:
    frames = _Frames(_connect(addr))
    frames.sock.sendall(f"SUB {topic} {channel}\n".encode())
    while not frames.oks:
        frames.feed(0, stamps=False)
    frames.sock.sendall(f"RDY {RDY}\n".encode())
    return frames


def idle(pid: int, seconds: float) -> CostStep:
    """The broker's CPU with no connections."""
    cpu0, t0 = process_cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return CostStep(0.0, 0, 0, 0, process_cpu_s(pid) - cpu0, time.monotonic() - t0)


def drive(
    addr: tuple[str, int],
    pid: int,
    topic: str,
    rate: float,
    consumers: int,
    warmup_s: float,
    seconds: float,
    body: int,
) -> CostStep:
    """Publish at ``rate`` to ``topic`` with ``consumers`` channels of one subscriber;
    measure the broker's CPU and the messages published and delivered after a warm-up."""
    subs = [_subscribe(addr, topic, f"c{i}") for i in range(consumers)]
    pub = _Frames(_connect(addr))
    cmd = encode_command(Pub(topic, b"x" * body))
    socks = {f.sock: f for f in [*subs, pub]}
    published = 0
    start = time.monotonic()
    window: tuple[float, float, int, int] | None = None  # t, cpu, published, delivered
    end = start + warmup_s + seconds
    try:
        while True:
            now = time.monotonic()
            if window is None and now >= start + warmup_s:
                delivered = sum(s.messages for s in subs)
                window = (now, process_cpu_s(pid), published, delivered)
            if now >= end:
                break
            due = int(rate * (now - start)) - published
            if due > 0:
                pub.sock.sendall(cmd * due)
                published += due
            ready, _, _ = select.select(list(socks), [], [], TICK_S)
            for s in ready:
                socks[s].feed(0, stamps=False)
        assert window is not None
        cpu = process_cpu_s(pid)
        t = time.monotonic()
        delivered = sum(s.messages for s in subs)
        return CostStep(
            rate, consumers, published - window[2], delivered - window[3], cpu - window[1],
            t - window[0],
        )  # fmt: skip
    finally:
        for f in [pub, *subs]:
            f.sock.close()


def _generator_main(conn: Connection, addr: tuple[str, int], pid: int) -> None:
    serve_steps(conn, {"idle": partial(idle, pid), "drive": partial(drive, addr, pid)})


@contextlib.contextmanager
def _generator(addr: tuple[str, int], pid: int) -> Iterator[Callable[..., CostStep]]:
    with step_process(_generator_main, (addr, pid), "cost") as step:

        def call(name: str, timeout_s: float, **kwargs: Any) -> CostStep:
            value = step(name, timeout_s, **kwargs)
            assert isinstance(value, CostStep)
            return value

        yield call


# == measuring and fitting ================================================================
def measure(plan: CostPlan, on_progress: OnProgress | None = None) -> list[CostStep]:
    """The idle step, then every (rate, consumers) of the grid, each on a topic of its
    own (what one step left queued never reaches the next)."""
    if not Path("/proc/self/stat").exists():
        raise RuntimeError("srtm calibrate --cost reads the broker's CPU from /proc (Linux)")
    total, done = plan.steps(), 0

    def tick(what: str) -> None:
        nonlocal done
        if on_progress is not None:
            on_progress(what, done, total)
        done += 1

    out = []
    with tempfile.TemporaryDirectory(prefix="srtm-calibrate-cost-") as tmp:
        tick("starting a broker")
        broker = start_broker(Path(tmp) / "data", list(plan.broker_args))
        try:
            with _generator(broker.tcp, broker.proc.pid) as call:
                tick("idle broker")
                out.append(call("idle", plan.idle_s + 30, seconds=plan.idle_s))
                grid = [(r, n) for n in plan.consumers for r in plan.rates]
                for i, (rate, n) in enumerate(grid):
                    tick(f"{rate:,.0f} msg/s × {n} consumer{'s' if n > 1 else ''}")
                    step = call(
                        "drive", plan.warmup_s + plan.step_s + 30, topic=f"{TOPIC}_{i}",
                        rate=rate, consumers=n, warmup_s=plan.warmup_s, seconds=plan.step_s,
                        body=plan.body,
                    )  # fmt: skip
                    out.append(step)
        finally:
            broker.stop()
    tick("fitting A and B")
    return out


def fitted(steps: list[CostStep]) -> list[CostStep]:
    """The steps the fit uses: every step that published, less those that fell behind
    (there the generator, not the broker, set the pace: its deliveries come in larger
    batches than a broker keeping up makes), unless that leaves too few to fit."""
    ran = [s for s in steps if s.consumers == 0 or s.published > 0]
    kept = [s for s in ran if not s.behind]
    loaded = [s for s in kept if s.consumers > 0]
    enough = len({s.offered for s in loaded}) > 1 and len({s.consumers for s in loaded}) > 1
    return kept if enough else ran


def fit(steps: list[CostStep]) -> CostFit:
    """A and B (and the CPU at no load) from the ``fitted`` steps; ValueError if they
    cannot be told apart (no step delivered anything, one consumer count)."""
    return fit_cost(s.sample() for s in fitted(steps))


def document(fit_: CostFit, steps: list[CostStep]) -> dict[str, Any]:
    """``srtm calibrate --cost --json``: the fit, then per step ``rate`` (published, msg/s),
    ``consumers``, ``cpu`` (cores), and ``offered``, ``deliveries_per_message``,
    ``behind``, ``fitted``."""
    used = {id(s) for s in fitted(steps)}
    samples = [
        {"rate": s.rate, "consumers": s.consumers, "cpu": s.cpu, "offered": s.offered,
         "deliveries_per_message": s.fan_out, "behind": s.behind, "fitted": id(s) in used}
        for s in steps
    ]  # fmt: skip
    return cost_doc(fit_) | {
        "samples": samples,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
