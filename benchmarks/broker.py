"""The broker under load: publish throughput, drain, end-to-end latency, shaped release lateness.

Run with ``.venv/bin/python benchmarks/broker.py`` (``--help`` for options). Starts ``srtm
broker`` as a subprocess on 127.0.0.1 (ephemeral ports, a temporary ``--data-dir``, stopped
by SIGTERM), drives it from a load generator in its own process, and prints one table: each
figure the median of ``--runs`` runs with min–max beside it. Rows 1–3 are also measured, in
the same run, against an anchor: a minimal uvloop server in a third process that answers
every PUB/MPUB with OK and keeps nothing, the ceiling for a Python server on this machine.
``--json PATH`` also writes the raw numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse
import urllib.request
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.launch import BrokerProcess, start_broker
from srtm.protocol import MAGIC_V2, FrameReader, FrameType, Mpub, Pub, encode_command, response
from srtm.protocol.frames import ATTEMPTS_AT, BODY_AT, HEARTBEAT, ID_AT
from srtm.quantiles import quantiles

NS_PER_S = 1_000_000_000
BODY_SIZE = 100
MPUB_BATCH = 200
#: MPUBs in flight on the one connection: bench_writer keeps one per connection and opens
#: one connection per core (GOMAXPROCS), so two on this 2-core machine.
MPUB_OUTSTANDING = 2
PUB_WINDOW = 100
LATENCY_RATES = (2_000, 10_000, 20_000)
SHAPED_RATE = 10_000
SHAPED_BURST = 10
#: Offered to the shaped topic: 2 % above its rate, so the bucket never idles.
SHAPED_OFFER = 10_200
#: nsqd's (and the broker's) max_rdy_count.
RDY = 2_500
CHANNEL = "bench"
#: Like nsq's bench.sh (--mem-queue-size=1000000): what is published stays in memory.
MEM_QUEUE_SIZE = 1_000_000
#: No recv or send of the generator waits longer than this for the broker.
IO_TIMEOUT_S = 10.0
DRAIN_MIN, DRAIN_MAX = 20_000, 1_000_000
#: A full run's measurements are bounded by these many seconds each, whatever happens.
TASK_SLACK_S = 60.0

#: Issue figures for nsqd 1.3.0 on this kind of machine: (low, high) msg/s.
NSQD: dict[str, tuple[float, float]] = {
    "mpub": (300_000, 560_000),
    "drain": (180_000, 260_000),
    "pub_pipelined": (57_000, 57_000),
    "pub_sync": (14_500, 14_500),
}
GOAL_VS_NSQD = 0.5
TARGET_LATENESS_P99_US = 100.0

_I32 = struct.Struct(">I")
_Q = struct.Struct(">q")
_STAMP = struct.Struct(">qq")  # send time (ns, CLOCK_REALTIME), sequence number
OK_FRAME = response()


class BrokerError(RuntimeError):
    """The broker answered with an error frame, closed the connection, lost messages or
    did not answer in time."""


# == the load generator (runs in its own process) =========================================


def connect(addr: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(addr, timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    return sock


def recv(sock: socket.socket) -> bytes:
    try:
        data = sock.recv(1 << 20)
    except TimeoutError:
        raise BrokerError(f"no answer from the broker in {IO_TIMEOUT_S:g} s") from None
    if not data:
        raise BrokerError("the broker closed the connection")
    return data


def take_responses(frames: FrameReader, data: bytes, sock: socket.socket) -> int:
    """Read the response frames ``data`` completes; return how many were OK."""
    buf = frames.buffer
    if not buf:
        # Fast path: k OK frames in exactly k frames' bytes, nothing else to read.
        k = len(data) // len(OK_FRAME)
        if len(data) == k * len(OK_FRAME) and data.count(OK_FRAME) == k:
            return k
    oks = 0
    for kind, start, end in frames.spans(data):
        if kind == FrameType.ERROR:
            raise BrokerError(f"error frame: {bytes(buf[start:end]).decode(errors='replace')}")
        if kind != FrameType.RESPONSE:
            raise BrokerError(f"unexpected frame type {kind} on a publishing connection")
        response = bytes(buf[start:end])
        if response == b"OK":
            oks += 1
        elif response == HEARTBEAT:
            sock.sendall(b"NOP\n")
        else:
            raise BrokerError(f"unexpected response {response[:60]!r}")
    return oks


def consume(
    frames: FrameReader,
    data: bytes,
    sock: socket.socket,
    recv_ns: int,
    lat: array[int] | None,
    seen: bytearray,
) -> tuple[int, int]:
    """Read the frames ``data`` completes on a subscribed connection: FIN every message
    (one send for the lot). With ``lat``, the body's send stamp gives recv − send and its
    sequence number marks ``seen``. Returns (messages, redeliveries)."""
    buf = frames.buffer
    got = again = 0
    fins = []
    for kind, start, end in frames.spans(data):
        if kind == FrameType.MESSAGE:
            got += 1
            if buf[start + ATTEMPTS_AT] or buf[start + ATTEMPTS_AT + 1] != 1:  # attempts != 1
                again += 1
            fins.append(b"FIN " + buf[start + ID_AT : start + BODY_AT] + b"\n")
            if lat is not None:
                sent_ns, seq = _STAMP.unpack_from(buf, start + BODY_AT)
                lat.append(recv_ns - sent_ns)
                if seen[seq]:
                    again += 1
                seen[seq] = 1
        elif kind == FrameType.RESPONSE:
            if buf[start:end] == HEARTBEAT:
                fins.append(b"NOP\n")
        else:
            raise BrokerError(f"error frame: {bytes(buf[start:end]).decode(errors='replace')}")
    if fins:
        sock.sendall(b"".join(fins))
    return got, again


def subscribe(addr: tuple[str, int], topic: str, channel: str) -> socket.socket:
    sock = connect(addr)
    sock.sendall(f"SUB {topic} {channel}\n".encode())
    frames = FrameReader()
    deadline = time.monotonic() + IO_TIMEOUT_S
    while not take_responses(frames, recv(sock), sock):
        if time.monotonic() > deadline:
            raise BrokerError("no OK to SUB")
    sock.sendall(f"RDY {RDY}\n".encode())
    return sock


def publish_loop(
    addr: tuple[str, int], cmd: bytes, per_cmd: int, window: int, duration_s: float, max_msgs: int
) -> dict[str, float]:
    """Keep ``window`` copies of ``cmd`` unanswered until ``duration_s`` or ``max_msgs``;
    rate = messages acknowledged / (first send .. last OK)."""
    sock = connect(addr)
    try:
        frames = FrameReader()
        clock = time.perf_counter
        start = clock()
        deadline = start + duration_s
        budget = max_msgs // per_cmd
        first = min(window, budget)
        sock.sendall(cmd * first)
        sent, done = first, 0
        while done < sent:
            k = take_responses(frames, recv(sock), sock)
            done += k
            if done > sent:
                raise BrokerError(f"{done} OKs for {sent} commands")
            if k and clock() < deadline and sent < budget:
                k = min(k, budget - sent)
                sock.sendall(cmd * k)
                sent += k
        elapsed = clock() - start
    finally:
        sock.close()
    msgs = done * per_cmd
    return {"msgs": msgs, "seconds": elapsed, "rate": msgs / elapsed}


def task_publish(
    addr: tuple[str, int], topic: str, mode: str, duration_s: float, max_msgs: int = 10**9
) -> dict[str, float]:
    body = b"x" * BODY_SIZE
    if mode == "mpub":
        cmd = encode_command(Mpub(topic, [body] * MPUB_BATCH))
        return publish_loop(addr, cmd, MPUB_BATCH, MPUB_OUTSTANDING, duration_s, max_msgs)
    cmd = encode_command(Pub(topic, body))
    window = PUB_WINDOW if mode == "pub_pipelined" else 1
    return publish_loop(addr, cmd, 1, window, duration_s, max_msgs)


def task_drain(
    addr: tuple[str, int], topic: str, n: int, max_s: float, linger_s: float = 0.3
) -> dict[str, float]:
    """Publish ``n`` with MPUB-200 (channel already there), then SUB, RDY and FIN them all;
    rate = n / (RDY sent .. last message read)."""
    pub = task_publish(addr, topic, "mpub", max_s, n)
    if pub["msgs"] != n:
        raise BrokerError(f"drain: published only {pub['msgs']:,.0f} of {n:,} in {max_s:g} s")
    sock = subscribe(addr, topic, CHANNEL)
    try:
        frames = FrameReader()
        clock = time.perf_counter
        start = clock()
        deadline = start + max_s
        got = again = 0
        seen = bytearray()
        while got < n:
            if clock() > deadline:
                raise BrokerError(f"drain: {got:,} of {n:,} messages in {max_s:g} s")
            g, a = consume(frames, recv(sock), sock, 0, None, seen)
            got += g
            again += a
        elapsed = clock() - start
        # Anything more would be a duplicate; the FINs above also get time to land.
        sock.settimeout(linger_s)
        with contextlib.suppress(TimeoutError):
            end = clock() + linger_s
            while clock() < end:
                data = sock.recv(1 << 20)
                if not data:
                    break
                g, a = consume(frames, data, sock, 0, None, seen)
                got += g
                again += a
    finally:
        sock.close()
    return {
        "msgs": n,
        "received": got,
        "redelivered": again,
        "seconds": elapsed,
        "rate": n / elapsed,
        "publish_rate": pub["rate"],
    }


def task_paced(
    addr: tuple[str, int], topic: str, rate: int, duration_s: float, settle_s: float
) -> dict[str, float]:
    """Publish at ``rate`` on an absolute schedule (PUB, pipelined, send stamp in the body)
    while one consumer in this loop FINs every message and records recv − send."""
    cons = subscribe(addr, topic, CHANNEL)
    pub = connect(addr)
    try:
        return _paced(cons, pub, topic, rate, duration_s, settle_s)
    finally:
        cons.close()
        pub.close()


def _paced(
    cons: socket.socket,
    pub: socket.socket,
    topic: str,
    rate: int,
    duration_s: float,
    settle_s: float,
) -> dict[str, float]:
    clock = time.time_ns
    head = f"PUB {topic}\n".encode() + _I32.pack(BODY_SIZE)
    pad = b"p" * (BODY_SIZE - _STAMP.size)
    total = int(rate * duration_s)
    seen = bytearray(total)
    lat: array[int] = array("q")
    cframes, pframes = FrameReader(), FrameReader()
    sent = acked = got = again = 0
    first_recv = last_recv = 0
    t0 = clock() + 20_000_000
    end_ns = t0 + int(duration_s * NS_PER_S) + int(settle_s * NS_PER_S)
    last_send = t0
    socks = [cons, pub]
    while got < total or acked < total:
        now = clock()
        if sent < total:
            due = min(total, (now - t0) * rate // NS_PER_S + 1)
            if due > sent:
                stamp = clock()
                parts = []
                for seq in range(sent, due):
                    parts += (head, _STAMP.pack(stamp, seq), pad)
                pub.sendall(b"".join(parts))
                sent = due
                last_send = stamp
            timeout = max(0, t0 + sent * NS_PER_S // rate - clock()) / NS_PER_S
        else:
            if now > end_ns:
                break
            timeout = 0.05
        readable, _, _ = select.select(socks, [], [], timeout)
        if cons in readable:
            data = recv(cons)
            recv_ns = clock()
            g, a = consume(cframes, data, cons, recv_ns, lat, seen)
            if g:
                got += g
                again += a
                first_recv = first_recv or recv_ns
                last_recv = recv_ns
        if pub in readable:
            acked += take_responses(pframes, recv(pub), pub)
    lost = total - sum(seen)
    us = np.asarray(lat, dtype=np.float64) / 1e3
    span = (last_recv - first_recv) / NS_PER_S
    return {
        "sent": sent,
        "acked": acked,
        "received": got,
        "lost": lost,
        "redelivered": again,
        "offered_rate": sent / max((last_send - t0) / NS_PER_S, 1e-9),
        "rate": (got - 1) / span if span > 0 else float("nan"),
        **quantiles(us, (0.5, 0.99, 0.999), suffix="_us"),
        "max_us": float(us.max()) if us.size else float("nan"),
    }


TASKS: dict[str, Callable[..., dict[str, float]]] = {
    "publish": task_publish,
    "drain": task_drain,
    "paced": task_paced,
}


def pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def worker_main(conn: Connection, cpu: int | None) -> None:
    """The generator process: run tasks sent by the parent until it hangs up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    pin(cpu)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        name, kwargs = msg
        try:
            reply: tuple[str, Any] = ("ok", TASKS[name](**kwargs))
        except BrokerError as exc:
            reply = ("error", str(exc))
        except Exception:
            reply = ("error", traceback.format_exc(limit=4))
        conn.send(reply)


# == the anchor: a minimal NSQ-speaking server that keeps nothing =========================


class AnchorProtocol(asyncio.Protocol):
    """Reads the magic, then answers each PUB/MPUB/IDENTIFY with OK, skipping its body."""

    _WITH_BODY = (b"PUB ", b"MPUB ", b"DPUB ", b"IDENTIFY")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.magic = False
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both have write().
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        if not self.magic:
            if len(buf) < 4:
                return
            self.magic, pos = True, 4
        n = len(buf)
        oks = 0
        while (nl := buf.find(b"\n", pos)) >= 0:
            if buf.startswith(self._WITH_BODY, pos):
                if n < nl + 5:
                    break
                end = nl + 5 + _I32.unpack_from(buf, nl + 1)[0]
                if n < end:
                    break
                oks += 1
                pos = end
            else:
                pos = nl + 1  # NOP and the like: no answer
        del buf[:pos]
        if oks and self.transport is not None:
            self.transport.write(OK_FRAME * oks)


def anchor_main(conn: Connection, cpu: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pin(cpu)
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        kind = f"uvloop {uvloop.__version__}"
    except ImportError:
        loop = asyncio.new_event_loop()
        kind = "asyncio"

    async def serve() -> None:
        server = await loop.create_server(AnchorProtocol, "127.0.0.1", 0)
        conn.send((server.sockets[0].getsockname()[1], kind))
        await server.serve_forever()

    loop.run_until_complete(serve())


# == the parent: broker, anchor and generator processes ===================================


class Generator:
    """The load-generator process; tasks run one at a time, each bounded in time."""

    def __init__(self, cpu: int | None) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._cpu = cpu
        self._start()

    def _start(self) -> None:
        self.conn, child = self._ctx.Pipe()
        self.proc = self._ctx.Process(target=worker_main, args=(child, self._cpu), daemon=True)
        self.proc.start()
        child.close()

    def run(self, name: str, timeout_s: float, **kwargs: Any) -> dict[str, float]:
        self.conn.send((name, kwargs))
        if not self.conn.poll(timeout_s):
            self.restart()
            raise BrokerError(f"{name}: no result in {timeout_s:g} s (generator restarted)")
        status, value = self.conn.recv()
        if status != "ok":
            raise BrokerError(value)
        result: dict[str, float] = value
        return result

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(2)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


@contextlib.contextmanager
def anchor_server(cpu: int | None) -> Iterator[tuple[tuple[str, int], str]]:
    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=anchor_main, args=(child, cpu), daemon=True)
    proc.start()
    child.close()
    try:
        if not conn.poll(30):
            raise RuntimeError("anchor server did not start")
        port, kind = conn.recv()
        yield ("127.0.0.1", port), kind
    finally:
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        conn.close()


# == measurements =========================================================================


@dataclass(frozen=True, slots=True)
class Config:
    duration_s: float
    runs: int
    mem_queue_size: int
    settle_s: float
    #: (broker and anchor, generator) CPUs, or None: the scheduler's choice.
    cpus: tuple[int, int] | None


@dataclass(slots=True)
class Row:
    key: str
    label: str
    unit: str
    samples: list[float] = field(default_factory=list)
    anchor: list[float] = field(default_factory=list)
    raw: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    nsqd: tuple[float, float] | None = None
    section_end: bool = False

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def anchor_median(self) -> float | None:
        return statistics.median(self.anchor) if self.anchor else None


THROUGHPUT = {
    "mpub": f"MPUB-{MPUB_BATCH}, {MPUB_OUTSTANDING} in flight ¹",
    "pub_pipelined": f"PUB, {PUB_WINDOW} in flight",
    "pub_sync": "PUB, synchronous",
}


def make_rows() -> dict[str, Row]:
    rows = [Row(k, label, "msg/s", nsqd=NSQD[k]) for k, label in THROUGHPUT.items()]
    rows.append(Row("drain", "drain after MPUB-200 publish ²", "msg/s", nsqd=NSQD["drain"]))
    rows[-1].section_end = True
    for rate in LATENCY_RATES:
        k = f"{rate // 1000}k"
        rows += [
            Row(f"e2e_{k}_p50", f"e2e latency at {rate:,}/s ³: p50", "µs"),
            Row(f"e2e_{k}_p99", "    p99", "µs"),
            Row(f"e2e_{k}_rate", "    achieved (consumer)", "msg/s", section_end=True),
        ]
    rows += [
        Row("late_p50", f"shaped {SHAPED_RATE:,}/s b={SHAPED_BURST} ⁴: release lateness p50", "µs"),
        Row("late_p99", "    release lateness p99", "µs"),
        Row("wait_p50", "    token wait p50", "ms"),
        Row("wait_p99", "    token wait p99", "ms"),
        Row("shaped_rate", "    achieved (consumer)", "msg/s"),
    ]
    return {r.key: r for r in rows}


class Bench:
    def __init__(
        self,
        cfg: Config,
        workdir: Path,
        gen: Generator,
        anchor: tuple[str, int],
        log: Console,
    ) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.gen = gen
        self.anchor = anchor
        self.log = log
        self.rows = make_rows()
        self.problems: list[str] = []
        self.broker_starts = 0
        #: How long /ping took right after each topic deletion (s).
        self.settle_s: list[float] = []
        self.broker = self._start_broker()

    def _start_broker(self) -> BrokerProcess:
        self.broker_starts += 1
        data = self.workdir / f"data-{self.broker_starts}"
        self.broker_log = self.workdir / f"broker-{self.broker_starts}.log"
        cpu = self.cfg.cpus[0] if self.cfg.cpus else None
        with self.broker_log.open("a") as log:
            broker = start_broker(
                data,
                ["--mem-queue-size", str(self.cfg.mem_queue_size)],
                stderr=log,
                # Its own session: a Ctrl-C on the terminal reaches only us; we stop it.
                new_session=True,
                preexec_fn=None if cpu is None else partial(pin, cpu),
            )
        return broker

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.broker_log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return "\n".join([*self.broker.stdout_tail, *text])

    def stop(self) -> None:
        if not self.broker.alive():
            problem: str | None = f"broker had already exited with {self.broker.proc.returncode}"
        else:
            try:
                code = self.broker.stop(30)
                problem = None if code == 0 else f"broker exited with {code} after SIGTERM"
            except subprocess.TimeoutExpired:
                problem = "broker still running 30 s after SIGTERM: killed"
        if problem:
            self.problems.append(problem + "\n" + self.log_tail())

    def task(self, name: str, budget_s: float, **kwargs: Any) -> dict[str, float]:
        return self.gen.run(name, budget_s + TASK_SLACK_S, **kwargs)

    def guarded(self, keys: list[str], what: str, fn: Callable[[], None]) -> None:
        """Run one measurement; a failure is recorded on its rows, and a dead broker is
        restarted so the other measurements still run."""
        try:
            fn()
        except (BrokerError, OSError, KeyError, ValueError) as exc:
            msg = f"{what}: {exc}".strip()
            for k in keys:
                self.rows[k].errors.append(msg)
            self.problems.append(msg)
            self.log.log(f"[red]{msg}[/]")
        if not self.broker.alive():
            self.problems.append(
                f"broker exited ({self.broker.proc.returncode}) during {what}:\n" + self.log_tail()
            )
            self.log.log(f"[red]broker died during {what}; restarting it[/]")
            self.broker = self._start_broker()

    def delete_topic(self, topic: str) -> None:
        """Delete and wait until the broker answers again, so that freeing the topic's
        messages belongs to no measurement (the wait is reported under the table)."""
        with contextlib.suppress(OSError):
            self.broker.post(f"/topic/delete?topic={topic}")
            time.sleep(0.05)  # a scan-loop tick (10 ms) or more
            t0 = time.perf_counter()
            self.broker.get("/ping")
            self.settle_s.append(time.perf_counter() - t0)

    def topic_doc(self, topic: str) -> tuple[dict[str, Any], dict[str, Any]]:
        doc = self.broker.stats(topic)
        nsq = next((t for t in doc["topics"] if t["topic_name"] == topic), None)
        srtm = next((t for t in doc["srtm"]["topics"] if t["topic"] == topic), None)
        if nsq is None or srtm is None:
            raise BrokerError(f"topic {topic} missing from /stats")
        return nsq, srtm

    # -- the measurements ----------------------------------------------------------------
    def warm_up(self) -> None:
        topic = "bench_warmup"

        def warm() -> None:
            for addr in (self.broker.tcp, self.anchor):
                self.task("publish", 1, addr=addr, topic=topic, mode="mpub", duration_s=0.3)
                self.task(
                    "publish", 1, addr=addr, topic=topic, mode="pub_pipelined", duration_s=0.2
                )
            self.delete_topic(topic)

        self.guarded([], "warm-up", warm)

    def throughput(self, run: int, mode: str) -> None:
        row = self.rows[mode]
        d = self.cfg.duration_s
        topic = f"bench_{mode}_{run}"

        def on_broker() -> None:
            res = self.task(
                "publish", d, addr=self.broker.tcp, topic=topic, mode=mode, duration_s=d
            )
            try:
                count = self.topic_doc(topic)[0]["message_count"]
            finally:
                self.delete_topic(topic)
            res["broker_message_count"] = count
            row.raw.append(res)
            if count != res["msgs"]:
                raise BrokerError(
                    f"{res['msgs']:,.0f} messages acknowledged, topic message_count {count:,}"
                )
            row.samples.append(res["rate"])

        def on_anchor() -> None:
            res = self.task("publish", d, addr=self.anchor, topic=topic, mode=mode, duration_s=d)
            row.anchor.append(res["rate"])

        self.guarded([mode], f"{mode} run {run + 1}", on_broker)
        self.guarded([mode], f"{mode} on the anchor, run {run + 1}", on_anchor)

    def drain(self, run: int) -> None:
        row = self.rows["drain"]
        topic = f"bench_drain_{run}"
        mpub = self.rows["mpub"].samples
        guess = (mpub[-1] if mpub else 100_000) * self.cfg.duration_s
        n = int(min(max(guess, DRAIN_MIN), DRAIN_MAX)) // MPUB_BATCH * MPUB_BATCH
        budget = max(30.0, 20 * self.cfg.duration_s)

        def measure() -> None:
            self.broker.post(f"/channel/create?topic={topic}&channel={CHANNEL}")
            try:
                res = self.task(
                    "drain", 2 * budget, addr=self.broker.tcp, topic=topic, n=n, max_s=budget
                )
                nsq, _ = self.topic_doc(topic)
            finally:
                self.delete_topic(topic)
            ch = next((c for c in nsq["channels"] if c["channel_name"] == CHANNEL), None)
            if ch is None:
                raise BrokerError(f"channel {CHANNEL} missing from /stats")
            res.update(
                depth=ch["depth"],
                in_flight=ch["in_flight_count"],
                channel_message_count=ch["message_count"],
                requeue_count=ch["requeue_count"],
            )
            row.raw.append(res)
            extra = res["received"] - n
            if extra or res["redelivered"] or ch["depth"] or ch["in_flight_count"]:
                raise BrokerError(
                    f"{n:,} published: {res['received']:,.0f} delivered "
                    f"({res['redelivered']:,.0f} redelivered), then depth {ch['depth']}, "
                    f"in flight {ch['in_flight_count']}"
                )
            row.samples.append(res["rate"])

        self.guarded(["drain"], f"drain of {n:,} run {run + 1}", measure)

    def latency(self, run: int, rate: int) -> None:
        k = f"{rate // 1000}k"
        keys = [f"e2e_{k}_p50", f"e2e_{k}_p99", f"e2e_{k}_rate"]
        topic = f"bench_e2e_{k}_{run}"
        d = self.cfg.duration_s

        def measure() -> None:
            try:
                res = self.task(
                    "paced",
                    d + self.cfg.settle_s,
                    addr=self.broker.tcp,
                    topic=topic,
                    rate=rate,
                    duration_s=d,
                    settle_s=self.cfg.settle_s,
                )
            finally:
                self.delete_topic(topic)
            self.rows[keys[0]].raw.append(res)
            check_paced(res)
            for key, value in zip(keys, ("p50_us", "p99_us", "rate"), strict=True):
                self.rows[key].samples.append(res[value])

        self.guarded(keys, f"latency at {rate:,}/s run {run + 1}", measure)

    def shaped(self, run: int) -> None:
        keys = ["late_p50", "late_p99", "wait_p50", "wait_p99", "shaped_rate"]
        topic = f"bench_shaped_{run}"
        d = self.cfg.duration_s
        # The backlog grows by (offer − rate)·d; give it time to drain, then some.
        settle = self.cfg.settle_s + (SHAPED_OFFER - SHAPED_RATE) * d / SHAPED_RATE

        def measure() -> None:
            q = urllib.parse.urlencode({"topic": topic, "rate": SHAPED_RATE, "burst": SHAPED_BURST})
            self.broker.post(f"/srtm/bucket?{q}")
            try:
                res = self.task(
                    "paced",
                    d + settle,
                    addr=self.broker.tcp,
                    topic=topic,
                    rate=SHAPED_OFFER,
                    duration_s=d,
                    settle_s=settle,
                )
                _, srtm = self.topic_doc(topic)
            finally:
                self.delete_topic(topic)
            late, wait = srtm["release_lateness_ns"], srtm["token_wait_ns"]
            res.update(release_lateness_ns=late, token_wait_ns=wait, latency_ns=srtm["latency_ns"])
            self.rows["late_p50"].raw.append(res)
            check_paced(res)
            if late["count"] != res["received"]:
                raise BrokerError(
                    f"release_lateness count {late['count']:,} for {res['received']:,.0f} "
                    "messages delivered"
                )
            values = (late["p50"] / 1e3, late["p99"] / 1e3, wait["p50"] / 1e6, wait["p99"] / 1e6)
            for key, value in zip(keys, (*values, res["rate"]), strict=True):
                self.rows[key].samples.append(value)

        self.guarded(keys, f"shaped topic run {run + 1}", measure)

    def steps(self, run: int) -> Iterator[tuple[str, Callable[[], None]]]:
        for mode in THROUGHPUT:
            yield mode, partial(self.throughput, run, mode)
        yield "drain", partial(self.drain, run)
        for rate in LATENCY_RATES:
            yield f"e2e {rate:,}/s", partial(self.latency, run, rate)
        yield "shaped", partial(self.shaped, run)


STEPS_PER_RUN = len(THROUGHPUT) + 1 + len(LATENCY_RATES) + 1


def check_paced(res: dict[str, float]) -> None:
    if res["lost"] or res["redelivered"] or res["acked"] != res["sent"]:
        raise BrokerError(
            f"{res['sent']:,.0f} sent, {res['acked']:,.0f} acknowledged, "
            f"{res['received']:,.0f} delivered: {res['lost']:,.0f} never delivered, "
            f"{res['redelivered']:,.0f} redelivered"
        )


# == report ===============================================================================

DASH = "—"


def fmt(value: float | None, unit: str) -> str:
    if value is None or value != value:
        return DASH
    if unit == "msg/s":
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def build_table(rows: dict[str, Row], cfg: Config, anchor_kind: str) -> Table:
    table = Table(
        title=f"srtm broker, median of {cfg.runs} run{'s' * (cfg.runs > 1)} "
        f"({platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores{', pinned' if cfg.cpus else ''}, "
        f"{cfg.duration_s:g} s per measurement)"
    )
    table.add_column("measurement", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("broker", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("anchor ⁵", justify="right")
    table.add_column("broker / anchor", justify="right")
    table.add_column("nsqd 1.3.0 ⁶", justify="right")
    table.add_column("broker / nsqd", justify="right")
    table.add_column("goal", justify="right")
    for row in rows.values():
        med = row.median
        spread = (
            f"{fmt(min(row.samples), row.unit)}–{fmt(max(row.samples), row.unit)}"
            if len(row.samples) > 1
            else DASH
        )
        anchor = row.anchor_median
        vs_anchor = f"{med / anchor:.2f}×" if med is not None and anchor else DASH
        nsqd = vs_nsqd = goal = DASH
        if row.nsqd is not None:
            lo, hi = row.nsqd
            mid = (lo + hi) / 2
            nsqd = f"{lo:,.0f}" if lo == hi else f"{lo:,.0f}–{hi:,.0f}"
            if med is not None:
                vs_nsqd = f"{med / mid:.2f}×"
                goal = f"≥ {GOAL_VS_NSQD:g}× {verdict(med / mid >= GOAL_VS_NSQD)}"
        if row.key == "late_p99" and med is not None:
            goal = f"≤ {TARGET_LATENESS_P99_US:g} µs {verdict(med <= TARGET_LATENESS_P99_US)}"
        value = fmt(med, row.unit)
        if row.errors:
            value = (
                f"[red]{value} ({len(row.errors)} failed)[/]" if med is not None else "[red]failed"
            )
        table.add_row(
            row.label,
            row.unit,
            value,
            spread,
            fmt(anchor, row.unit),
            vs_anchor,
            nsqd,
            vs_nsqd,
            goal,
            end_section=row.section_end,
        )
    return table


def footnotes(cfg: Config, anchor_kind: str) -> list[str]:
    return [
        f"Messages of {BODY_SIZE} bytes; broker started with --mem-queue-size "
        f"{cfg.mem_queue_size:,} (as nsq's bench.sh) and otherwise defaults; the generator "
        "is a separate process (blocking sockets, one task at a time), the broker another: "
        "on 2 cores each has one. Rows 1–3 publish to a topic without channels for "
        f"{cfg.duration_s:g} s; rate = messages acknowledged / (first send .. last OK); the "
        "topic's message_count is checked against the OKs, then the topic deleted.",
        f"¹ one connection keeping {MPUB_OUTSTANDING} MPUBs of {MPUB_BATCH} unanswered: "
        "bench_writer waits for each OK but opens one connection per core (2 here).",
        f"² channel created first, N messages (≈ MPUB rate × {cfg.duration_s:g} s, "
        f"{DRAIN_MIN:,}–{DRAIN_MAX:,}) published with MPUB-{MPUB_BATCH}, then one consumer: "
        f"SUB, RDY {RDY}, a FIN for each message (one send per read); rate = N / (RDY .. "
        "last message). Then checked: nothing more arrives, depth and in-flight are 0.",
        "³ one generator process: a publisher sending PUBs on an absolute schedule (all due "
        "messages in one send, nothing awaits the OKs) with time.time_ns() at send in the "
        "body, and a consumer (RDY 2500, FIN each) on the same loop; latency = read time − "
        f"send stamp, every message of a {cfg.duration_s:g} s run. Achieved = what the "
        "consumer received per second. Includes the generator's own delays.",
        f"⁴ POST /srtm/bucket rate={SHAPED_RATE} burst={SHAPED_BURST}; paced as ³ at "
        f"{SHAPED_OFFER:,}/s (2 % over the rate, so the bucket stays busy); lateness "
        "(dispatch − GCRA release time) and token wait (release − arrival) are the broker's "
        "/stats for that topic after the backlog drained.",
        f"⁵ a minimal {anchor_kind} server in its own process: reads the magic, then each "
        "command line and its 4-byte size, skips the body, answers OK; keeps nothing: the "
        "ceiling for a Python server on this machine, measured in the same run with the same "
        "generator (for MPUB the generator, not the anchor, is then the bound).",
        "⁶ the issue's figures for nsqd 1.3.0 on this kind of machine; broker / nsqd uses the "
        "midpoint of a range (MPUB 430,000, drain 220,000).",
    ]


def git_revision() -> str:
    here = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "src"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty src" if dirty else "")


def write_json(path: Path, bench: Bench, cfg: Config, anchor_kind: str) -> None:
    doc = {
        "python": sys.version,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "revision": git_revision(),
        "config": asdict(cfg),
        "anchor": anchor_kind,
        "nsqd_reference": NSQD,
        "rows": {
            k: {
                "label": r.label.strip(),
                "unit": r.unit,
                "median": r.median,
                "samples": r.samples,
                "anchor_samples": r.anchor,
                "raw": r.raw,
                "errors": r.errors,
            }
            for k, r in bench.rows.items()
        },
        "problems": bench.problems,
        "ping_after_delete_s": bench.settle_s,
    }
    path.write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")


# == main =================================================================================

app = typer.Typer(add_completion=False)


@app.command()
def main(
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds per measurement (default 3; 0.5 with --quick)."),
    ] = None,
    runs: Annotated[
        int | None, typer.Option(min=1, help="Runs; medians over them (default 3; 1 --quick).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run of a few seconds.")] = False,
    pin_cpus: Annotated[
        bool,
        typer.Option(
            "--pin", help="Broker and anchor on CPU 0, generator on CPU 1 (default: unpinned)."
        ),
    ] = False,
    mem_queue_size: Annotated[
        int, typer.Option(min=0, help="The broker's --mem-queue-size.")
    ] = MEM_QUEUE_SIZE,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw numbers to this file.")
    ] = None,
) -> None:
    """Load the srtm broker over NSQ's TCP protocol: MPUB, pipelined and synchronous PUB,
    drain, end-to-end latency under paced load, release lateness of a shaped topic."""
    cfg = Config(
        duration_s=duration if duration is not None else (0.5 if quick else 3.0),
        runs=runs if runs is not None else (1 if quick else 3),
        mem_queue_size=mem_queue_size,
        settle_s=1.0 if quick else 2.0,
        cpus=(0, 1) if pin_cpus else None,
    )
    console = Console(width=max(Console().width, 170))
    log = Console(stderr=True, log_path=False)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="srtm-bench-"))
    bench: Bench | None = None
    gen: Generator | None = None
    try:
        gen = Generator(cfg.cpus[1] if cfg.cpus else None)
        with anchor_server(cfg.cpus[0] if cfg.cpus else None) as (anchor, anchor_kind):
            bench = Bench(cfg, workdir, gen, anchor, log)
            try:
                columns = (
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(),
                )
                with Progress(*columns, console=log, transient=True) as progress:
                    task = progress.add_task("warm-up", total=cfg.runs * STEPS_PER_RUN)
                    bench.warm_up()
                    for run in range(cfg.runs):
                        for name, step in bench.steps(run):
                            progress.update(task, description=f"run {run + 1}: {name}")
                            step()
                            progress.advance(task)
            finally:
                bench.stop()
    finally:
        if gen is not None:
            gen.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if json_path is not None:  # first: a closed stdout must not cost the numbers
        write_json(json_path, bench, cfg, anchor_kind)
    console.print(build_table(bench.rows, cfg, anchor_kind))
    lines = []
    for key in THROUGHPUT:
        row = bench.rows[key]
        if row.median is not None and row.anchor_median:
            lines.append(f"{key} {row.median / row.anchor_median:.2f}×")
    console.print(f"broker / anchor: {', '.join(lines)}", highlight=False)
    if bench.settle_s:
        worst, typical = max(bench.settle_s) * 1e3, statistics.median(bench.settle_s) * 1e3
        console.print(
            f"after each topic deletion (+50 ms), /ping answered in at most {worst:,.1f} ms "
            f"(median {typical:,.1f} ms): the broker freeing what the topic held, kept out of "
            "the measurements",
            highlight=False,
        )
    console.print(f"revision {git_revision()}", highlight=False)
    for note in footnotes(cfg, anchor_kind):
        console.print(note, highlight=False)
    for problem in bench.problems:
        console.print(f"[red]problem:[/] {problem}", highlight=False)
    if bench.problems:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
