"""Chaos: a controller, three brokers, publishers with per-publisher sequence numbers and
subscribers on one topic placed over the brokers, all real processes on 127.0.0.1. While
traffic runs, one broker is SIGKILLed and restarted on its data dir, another SIGTERMed and
restarted, the controller SIGSTOPped past its broker timeout and continued, and the third
broker's disk (a small tmpfs) fills up and is freed again.

What must hold: every message acknowledged to a publisher (an OK to its PUB) reaches both
channels at least once: ``live``, read all along by a subscriber that follows the
controller's ``/lookup``, and ``late``, which only accumulates (overflowing to disk) and is
drained from every broker at the end. Duplicates are counted and printed, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.launch import BrokerProcess, LocalCluster, die_with_parent, start_broker, start_cluster
from srtm.protocol import header
from support import eventually

pytestmark = pytest.mark.slow

T = TypeVar("T")
TOPIC = "chaos"
PUBLISHERS = [f"p{i}" for i in range(6)]
RATE = 40  # messages/s each, 240/s in all
BROKER_TIMEOUT_S = 2.0
#: Every queue's messages go to its disk queue (none kept in memory only), so what a
#: broker acknowledged has been handed to its disk and must survive even kill -9
#: (with a memory queue, nsqd's default too, kill -9 loses what was only in memory).
MEM_QUEUE = 0
#: The third broker's disk.
TMPFS_SIZE = "2m"
#: How long the end waits for what should arrive (the machine may be busy).
PATIENCE_S = 10.0


# -- processes -----------------------------------------------------------------------------
def restart(b: BrokerProcess) -> BrokerProcess:
    """The same command line again (data dir, id, controller, ...), on the same ports (the
    last --tcp-address/--http-address given wins), with the cluster's token."""
    argv = [str(a) for a in b.proc.args]  # type: ignore[union-attr]
    args = argv[argv.index("broker") + 1 :]
    fixed = ["--tcp-address", b.tcp_address, "--http-address", b.http_address]
    return start_broker(b.data_dir, [*args, *fixed], preexec_fn=die_with_parent, token=b.token)


def kill9(b: BrokerProcess) -> None:
    b.proc.kill()
    b.proc.wait()
    if b.proc.stdout is not None:
        b.proc.stdout.close()


def mount_tmpfs(path: Path) -> bool:
    """A small tmpfs at ``path`` (root only); False where it cannot be had."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Write a ballast file until the file system is full."""
    ballast = directory / ".ballast"
    chunk = b"\0" * 65536
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return ballast


def stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """Everything started here ends: continued if stopped, SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
                p.terminate()
    deadline = time.monotonic() + 20
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- traffic, on its own event loop in a thread --------------------------------------------
class CountingPublisher(Publisher):
    """A Publisher that records the sequence numbers the broker acknowledged (an OK)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: seq -> (broker address, monotonic time) of its first acknowledgement
        self.acked: dict[int, tuple[str, float]] = {}

    def _send(self, sent: Any) -> None:
        super()._send(sent)
        # Each send's own answer: an OK from the broker it went to is an acknowledgement
        # even if the connection is lost right after (the message is then resent).
        reply, address = sent.reply, sent.conn.address
        h = header.decode(sent.body)
        assert reply is not None and h is not None
        reply.add_done_callback(lambda f: self._acked(f, h.seq, address))

    def _acked(self, fut: asyncio.Future[bytes], seq: int, address: str) -> None:
        if not fut.cancelled() and fut.exception() is None and seq not in self.acked:
            self.acked[seq] = (address, time.monotonic())


@dataclass
class Delivered:
    """(publisher, seq) -> times received, per channel."""

    live: Counter[tuple[str, int]] = field(default_factory=Counter)
    late: Counter[tuple[str, int]] = field(default_factory=Counter)


class Traffic:
    """Publishers at a steady rate and a ``live`` subscriber, in a thread's event loop, so
    the main thread can stop, kill and start processes (and be their parent, which
    ``die_with_parent`` needs)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.pubs = [
            CountingPublisher(TOPIC, p, controller=url, max_pending=200) for p in PUBLISHERS
        ]
        self.delivered = Delivered()
        self.live: Subscriber | None = None
        self._publishing: list[asyncio.Task[None]] = []
        self._stop: asyncio.Event | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, addresses: list[str]) -> None:
        self._thread.start()
        self.run(self._start(addresses))

    async def _start(self, addresses: list[str]) -> None:
        self._stop = asyncio.Event()
        # ``late`` exists on every broker before the first message: subscribe, then leave.
        late = Subscriber(TOPIC, "late", addresses=addresses)
        await late.start()
        await late.close()
        self.live = Subscriber(
            TOPIC, "live", controller=self.url, refresh_s=0.5,
            on_message=self._record(self.delivered.live),
        )  # fmt: skip
        await self.live.start()
        for p in self.pubs:
            await p.start()
        self._publishing = [asyncio.create_task(self._publish(p)) for p in self.pubs]

    @staticmethod
    def _record(into: Counter[tuple[str, int]]) -> Callable[[Received], None]:
        def record(r: Received) -> None:
            if r.header is not None:
                into[(r.header.publisher, r.header.seq)] += 1

        return record

    async def _publish(self, p: Publisher) -> None:
        """RATE/s on an absolute schedule until stopped (a stalled publisher catches up)."""
        assert self._stop is not None
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            delay = start + k / RATE - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                continue
            await p.publish()
            k += 1

    def acked(self) -> dict[str, set[int]]:
        return {p.id: set(p.acked) for p in self.pubs}

    def where(self, publisher: str, seq: int) -> tuple[str, float]:
        """Which broker acknowledged it, and when (monotonic)."""
        return next(p.acked[seq] for p in self.pubs if p.id == publisher)

    def finish(self, addresses: list[str]) -> None:
        """Stop publishing, let what was sent be acknowledged, wait for the ``live``
        channel, then drain ``late`` from every broker."""
        self.run(self._finish(addresses), timeout=6 * PATIENCE_S)

    async def _finish(self, addresses: list[str]) -> None:
        assert self._stop is not None
        self._stop.set()
        for t in self._publishing:
            t.cancel()  # one waiting for a slot or a broker gives up
        await asyncio.gather(*self._publishing, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PATIENCE_S):
                await asyncio.gather(*(p.flush() for p in self.pubs), return_exceptions=True)
        await self._until_delivered(self.delivered.live)
        late = Subscriber(
            TOPIC, "late", addresses=addresses, max_in_flight=2500,
            on_message=self._record(self.delivered.late),
        )  # fmt: skip
        await late.start()
        try:
            await self._until_delivered(self.delivered.late)
        finally:
            await late.close()

    async def _until_delivered(self, got: Counter[tuple[str, int]]) -> None:
        """Until every acknowledged message came, or nothing new for PATIENCE_S (the
        caller's assertions then name what is missing)."""
        last, quiet_since = -1, time.monotonic()

        def delivered_or_quiet() -> bool:
            nonlocal last, quiet_since
            want = {(p, s) for p, seqs in self.acked().items() for s in seqs}
            if want <= got.keys():
                return True
            if len(got) != last:
                last, quiet_since = len(got), time.monotonic()
            return time.monotonic() - quiet_since > PATIENCE_S

        await eventually(
            delivered_or_quiet,
            "every acknowledged message, or a quiet spell",
            timeout=300,  # pytest's own limit: progress may go on that long
            interval=0.1,
        )

    def stop(self) -> None:
        """Close every client and end the thread (also after a failure)."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.run(self._close(), timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        self.loop.close()

    async def _close(self) -> None:
        for t in self._publishing:
            t.cancel()
        for p in self.pubs:
            p._closed = True  # no more reconnecting
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await p.close()
            if p._session is not None and not p._session.closed:
                await p._session.close()  # its close gave up flushing
        if self.live is not None:
            with contextlib.suppress(Exception):
                await self.live.close()


# -- the test ------------------------------------------------------------------------------
@pytest.fixture
def chaos_dir(tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """The cluster's directory; the third broker's data dir is a small tmpfs if possible."""
    disk3 = tmp_path / "broker-3"
    mounted = mount_tmpfs(disk3)
    try:
        yield tmp_path, mounted
    finally:
        if mounted:
            unmount(disk3)


def missing(acked: dict[str, set[int]], got: Counter[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted((p, s) for p, seqs in acked.items() for s in seqs if (p, s) not in got)


def describe(lost: list[tuple[str, int]], traffic: Traffic, t0: float, ids: dict[str, int]) -> str:
    """How many, per publisher, and by which broker and when the first few were
    acknowledged (seconds since the faults began)."""
    if not lost:
        return "none"
    per = Counter(p for p, _ in lost)
    first = []
    for p, s in lost[:5]:
        address, at = traffic.where(p, s)
        first.append(f"{p}#{s} by broker {ids.get(address, address)} at {at - t0:.1f} s")
    return f"{len(lost)} {dict(per)}, first {', '.join(first)}"


def holding(cluster: LocalCluster) -> dict[str, Any]:
    """What each broker still holds of the topic (channel depth, in flight, deferred) and
    which brokers the controller lists for it: where undelivered messages sit."""
    out: dict[str, Any] = {}
    for i, b in enumerate(cluster.brokers, 1):
        try:
            topics = b.stats(TOPIC)["topics"]
        except OSError as exc:
            out[f"broker {i}"] = repr(exc)
            continue
        out[f"broker {i}"] = {
            ch["channel_name"]: (ch["depth"], ch["in_flight_count"], ch["deferred_count"])
            for t in topics
            for ch in t["channels"]
        }
    try:
        listed = cluster.controller.json(f"/lookup?topic={TOPIC}")["producers"]
        out["lookup"] = sorted(p["tcp_port"] for p in listed)
    except (OSError, ValueError) as exc:
        out["lookup"] = repr(exc)
    out["ports"] = [b.tcp[1] for b in cluster.brokers]
    return out


def test_acknowledged_messages_survive_kills_stalls_and_a_full_disk(
    chaos_dir: tuple[Path, bool],
) -> None:
    directory, tmpfs = chaos_dir
    cluster = start_cluster(
        directory, 3, tie_to_parent=True,
        broker_args=["--mcap", "250", "--mem-queue-size", str(MEM_QUEUE)],
        controller_args=["--broker-timeout-s", str(BROKER_TIMEOUT_S)],
    )  # fmt: skip
    procs = [cluster.controller.proc, *(b.proc for b in cluster.brokers)]
    traffic = Traffic(cluster.url)
    log: list[str] = []
    exits: dict[str, int] = {}
    t0 = time.monotonic()
    try:
        doc = {
            "name": TOPIC, "slo_p99_ms": 50.0, "burst": 50, "policy": "maxmin",
            "publishers": [{"id": p, "rate": 100, "group": f"g{i % 2}"}
                           for i, p in enumerate(PUBLISHERS)],
        }  # fmt: skip
        plan = json.loads(cluster.controller.post("/topics", json.dumps(doc).encode()))
        assert len(plan["brokers"]) == 3, plan  # 600 msg/s declared, 250 per broker
        traffic.start([b.tcp_address for b in cluster.brokers])
        t0 = time.monotonic()
        faults(cluster, procs, tmpfs, log, exits, t0)
        traffic.finish([b.tcp_address for b in cluster.brokers])
        held = holding(cluster)
        ids = {b.tcp_address: i for i, b in enumerate(cluster.brokers, 1)}
    finally:
        traffic.stop()
        stop_all(procs)

    acked = traffic.acked()
    live, late = traffic.delivered.live, traffic.delivered.late
    total = sum(len(s) for s in acked.values())
    print(f"\nchaos: {' | '.join(log)}")
    print(
        f"chaos: {total} acknowledged; live: {len(live)} distinct, "
        f"{sum(live.values()) - len(live)} duplicates; late: {len(late)} distinct, "
        f"{sum(late.values()) - len(late)} duplicates"
    )
    assert all(acked.values()), f"a publisher had nothing acknowledged: {acked.keys()}"
    lost_live, lost_late = missing(acked, live), missing(acked, late)
    assert not (lost_live or lost_late), (
        "acknowledged, never delivered: "
        f"'live' {describe(lost_live, traffic, t0, ids)} | "
        f"'late' {describe(lost_late, traffic, t0, ids)} | "
        f"still held by the brokers: {held} | faults: {log}"
    )
    assert exits == {"SIGTERM": 0}, f"a graceful stop failed: {exits}"


def faults(
    cluster: LocalCluster,
    procs: list[subprocess.Popen[str]],
    tmpfs: bool,
    log: list[str],
    exits: dict[str, int],
    t0: float,
) -> None:
    """The faults, one after another, with traffic running (about 40 s)."""
    brokers, ctrl = cluster.brokers, cluster.controller

    def step(what: str, seconds: float) -> None:
        log.append(f"{time.monotonic() - t0:.1f} s: {what}")
        time.sleep(seconds)  # the fault's span, with traffic running: the schedule itself

    step("traffic", 4)
    kill9(brokers[0])  # kill -9, restarted on the same data dir and ports
    brokers[0] = restart(brokers[0])
    procs.append(brokers[0].proc)
    step("broker 1 killed (SIGKILL) and restarted", 6)
    exits["SIGTERM"] = brokers[1].stop()  # a graceful stop (0 expected), then restarted
    brokers[1] = restart(brokers[1])
    procs.append(brokers[1].proc)
    step("broker 2 stopped (SIGTERM) and restarted", 6)
    ctrl.proc.send_signal(signal.SIGSTOP)  # longer than its broker timeout
    try:
        step("controller stopped (SIGSTOP)", BROKER_TIMEOUT_S + 4)
    finally:
        ctrl.proc.send_signal(signal.SIGCONT)
    step("controller continued (SIGCONT)", 6)
    if tmpfs:
        ballast = fill(brokers[2].data_dir)
        try:
            step(f"broker 3's disk ({TMPFS_SIZE} tmpfs) full", 6)
        finally:
            ballast.unlink()
        step("broker 3's disk freed", 4)
    else:
        step("no tmpfs (not root?): the disk-full step was skipped", 0)
