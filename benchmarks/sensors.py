"""Open-loop sensors: N connections, each publishing one PUB and waiting for its OK, at a
fixed offered rate; the PUB→OK round trip of every PUB.

A sensor publishes one reading and waits for the OK, so the round trip *is* the workload.
The schedule is fixed in advance and does not wait for the broker (open loop): sensor ``i``
of ``n`` at ``r`` msg/s sends at ``t0 + i/(n·r) + k/r``, so the ``n·r`` PUBs a second are
spread evenly over the sensors and over time. A sensor whose previous PUB is still
unanswered when its next one is due sends it as the OK comes (a real sensor would) and the
PUB counts as *held*: the broker's doing, shown apart from the round trips.

One process, one uvloop loop, every connection a ``Protocol`` (no task per sensor, no
copies on the fast path: a read that is exactly one OK frame). The generator measures its
own *lateness*, when it sent a PUB against when it was due: a run where it is high was
disturbed, by the machine or by the generator itself, and its round trips say less.

Between sends it sleeps, as a fleet of sensors does between readings, on a timerfd armed
for the next due time (``Alarm``): uvloop's timers are whole milliseconds, so its sleeps
would round the sub-millisecond waits of these loads to a zero timeout, and the generator
would poll, a whole core of the broker's machine taken by the load (the sensors' rows
before 2026-12-03; docs/results/broker.md). Its wake-up for each OK is then in every round
trip, as a sensor's is, for either broker alike; its wake-up for a send is in its lateness.
Used by ``benchmarks/broker.py``'s sensor rows (``--only sensors``); runs alone too:
``python benchmarks/sensors.py HOST:PORT TOPIC --sensors 200 --rate 100``.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from array import array
from typing import Any

import numpy as np

from srtm.broker.timer import TimerFd
from srtm.protocol import MAGIC_V2, FrameReader, FrameType, Pub, encode_command, response
from srtm.protocol.frames import HEARTBEAT
from srtm.quantiles import quantiles

NS_PER_S = 1_000_000_000
OK_FRAME = response()
#: Connections opened at once while the sensors connect.
CONNECT_AT_ONCE = 200
#: How long the last OKs may take after the last PUB was due (s).
DRAIN_S = 10.0


class SensorError(RuntimeError):
    """The broker refused a PUB, closed a sensor's connection or kept OKs back."""


class Sensor(asyncio.Protocol):
    """One sensor's connection: at most one PUB unanswered, the next due one held."""

    __slots__ = ("cmd", "frames", "run", "sched_ns", "sent_ns", "transport", "waiting")

    def __init__(self, run: Run, cmd: bytes) -> None:
        self.run, self.cmd = run, cmd
        self.frames = FrameReader()
        self.transport: Any = None
        self.sent_ns = self.sched_ns = 0  # sent_ns 0: nothing unanswered
        #: Due times of PUBs held behind the unanswered one.
        self.waiting: list[int] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(MAGIC_V2)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.run.closing:
            self.run.fail(f"the broker closed a sensor's connection ({exc or 'EOF'})")

    def due(self, sched_ns: int) -> None:
        """A PUB is due now (at ``sched_ns``): sent, or held behind the unanswered one."""
        if self.sent_ns:
            self.waiting.append(sched_ns)
            self.run.held += 1
            return
        self._send(sched_ns, held=False)

    def _send(self, sched_ns: int, held: bool) -> None:
        self.transport.write(self.cmd)
        now = time.perf_counter_ns()
        self.sent_ns, self.sched_ns = now, sched_ns
        if not held:  # a held PUB is late by the broker, not by the generator
            self.run.lateness.append(now - sched_ns)
        self.run.sent += 1

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if data == OK_FRAME and not self.frames.buffer:
            self._ok(now)
            return
        buf = self.frames.buffer
        for kind, start, end in self.frames.spans(data):
            body = bytes(buf[start:end])
            if kind == FrameType.RESPONSE and body == b"OK":
                self._ok(now)
            elif kind == FrameType.RESPONSE and body == HEARTBEAT:
                self.transport.write(b"NOP\n")
            else:
                self.run.fail(f"unexpected frame {kind}: {body[:80]!r}")

    def _ok(self, now: int) -> None:
        if not self.sent_ns:
            self.run.fail("an OK for no PUB")
            return
        run = self.run
        run.rtt.append(now - self.sent_ns)
        run.from_due.append(now - self.sched_ns)
        run.acked += 1
        self.sent_ns = 0
        if self.waiting:
            self._send(self.waiting.pop(0), held=True)
        elif run.sent == run.total and run.acked == run.total:
            run.done.set()


class Run:
    """One measurement's counts and samples (ns), shared by its sensors."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = self.acked = self.held = 0
        self.rtt: array[int] = array("q")
        self.from_due: array[int] = array("q")
        self.lateness: array[int] = array("q")
        self.error: str | None = None
        self.closing = False
        self.done = asyncio.Event()

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        self.done.set()


async def _connect(
    addr: tuple[str, int], run: Run, cmd: bytes, n: int
) -> list[tuple[asyncio.BaseTransport, Sensor]]:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)

    async def one() -> tuple[asyncio.BaseTransport, Sensor]:
        async with gate:
            return await loop.create_connection(lambda: Sensor(run, cmd), *addr)

    return await asyncio.gather(*(one() for _ in range(n)))


class Alarm:
    """Sleeps until a ``time.perf_counter_ns`` time: on a timerfd (the broker's release
    timer, nanoseconds, 1 ns of slack), or asyncio's millisecond sleep where there is none
    (not Linux)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        try:
            self._timer: TimerFd | None = TimerFd()
        except OSError:
            self._timer = None
            return
        # The timerfd's clock is CLOCK_REALTIME; a run lasts seconds, over which the two
        # clocks keep their offset to well under a microsecond.
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._loop.add_reader(self._timer.fd, self._fired)

    def _fired(self) -> None:
        assert self._timer is not None
        self._timer.consume()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def until(self, at_ns: int) -> None:
        if self._timer is None:
            await asyncio.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / NS_PER_S))
            return
        self._waiter = self._loop.create_future()
        self._timer.arm(at_ns + self._offset_ns)
        await self._waiter

    def close(self) -> None:
        if self._timer is not None:
            self._loop.remove_reader(self._timer.fd)
            self._timer.disarm()
            self._timer.close()


async def _drive(sensors: list[Sensor], run: Run, total_rate: float) -> tuple[int, int]:
    """Send every PUB when due (open loop), asleep between; the first and the last due
    time (ns)."""
    clock = time.perf_counter_ns
    n = len(sensors)
    t0 = clock() + 20_000_000  # connected and idle; start on a clean schedule
    step = NS_PER_S / total_rate
    j = 0
    alarm = Alarm()
    try:
        while j < run.total and run.error is None:
            due = min(run.total, int((clock() - t0) / step) + 1)
            while j < due:
                sensors[j % n].due(t0 + int(j * step))
                j += 1
            if j < run.total:
                await alarm.until(t0 + int(j * step))
    finally:
        alarm.close()
    return t0, t0 + int((run.total - 1) * step)


async def sensors_run(
    addr: tuple[str, int], topic: str, sensors: int, rate: float, duration_s: float, size: int
) -> dict[str, float]:
    """``sensors`` connections at ``rate`` PUBs a second each for ``duration_s``."""
    run = Run(max(sensors, int(sensors * rate * duration_s)))
    cmd = encode_command(Pub(topic, b"s" * size))
    conns = await _connect(addr, run, cmd, sensors)
    try:
        cpu0 = time.process_time()
        first, last = await _drive([s for _, s in conns], run, sensors * rate)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.done.wait(), DRAIN_S)
        cpu = time.process_time() - cpu0
    finally:
        run.closing = True
        for transport, _ in conns:
            transport.close()
    if run.error is not None:
        raise SensorError(run.error)
    if run.acked != run.total:
        raise SensorError(f"{run.acked:,} OKs for {run.total:,} PUBs after {DRAIN_S:g} s")
    rtt = np.asarray(run.rtt, dtype=np.float64) / 1e3
    late = np.asarray(run.lateness, dtype=np.float64) / 1e3
    from_due = np.asarray(run.from_due, dtype=np.float64) / 1e3
    return {
        "sensors": sensors,
        "rate_per_sensor": rate,
        "sent": run.sent,
        "acked": run.acked,
        "held": run.held,
        "offered_rate": (run.total - 1) / max((last - first) / NS_PER_S, 1e-9),
        **quantiles(rtt, (0.5, 0.99, 0.999), suffix="_us"),
        "max_us": float(rtt.max()),
        **{f"due_{k}": v for k, v in quantiles(from_due, (0.99,), suffix="_us").items()},
        **{f"late_{k}": v for k, v in quantiles(late, (0.5, 0.99), suffix="_us").items()},
        "late_max_us": float(late.max()) if late.size else 0.0,
        # The generator's own CPU per PUB (µs): what one core of it could drive at most.
        "generator_cpu_us_per_pub": cpu / max(run.acked, 1) * 1e6,
    }


def task_sensors(
    addr: tuple[str, int], topic: str, sensors: int, rate: float, duration_s: float, size: int
) -> dict[str, float]:
    """``sensors_run`` on a uvloop loop of its own (asyncio's if uvloop is missing), with
    the file limit raised to fit one descriptor per sensor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < sensors + 100 <= hard or (hard == resource.RLIM_INFINITY and soft < sensors + 100):
        resource.setrlimit(resource.RLIMIT_NOFILE, (sensors + 100, hard))
    work = sensors_run(addr, topic, sensors, rate, duration_s, size)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(work)
    return uvloop.run(work)


if __name__ == "__main__":
    import typer

    def main(
        address: str, topic: str, sensors: int = 200, rate: float = 100.0,
        duration: float = 5.0, size: int = 100,
    ) -> None:  # fmt: skip
        """Run the sensors against HOST:PORT's TOPIC and print the figures."""
        host, _, port = address.rpartition(":")
        for key, value in task_sensors((host, int(port)), topic, sensors, rate, duration,
                                       size).items():  # fmt: skip
            print(f"{key:>18} {value:,.1f}")

    typer.run(main)
