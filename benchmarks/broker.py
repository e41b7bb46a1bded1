"""The srtm broker beside nsqd 1.3.0: one run, the same load tools, one table of ratios.

Run with ``.venv/bin/python benchmarks/broker.py`` (``--help`` for options). Each run starts
nsqd (from ``../shared/anchors/nsq-1.3.0/``, or ``--nsqd PATH``) and ``srtm broker`` fresh,
both on 127.0.0.1 with ephemeral ports, temporary data directories and the same
``--mem-queue-size``, and measures them alternately (which goes first swaps every run) with
the same load: NSQ's own ``bench_writer`` / ``bench_reader`` (100-byte messages) for
throughput, and our generator (a process of its own) for end-to-end latency, memory per
queued message and the shaped topic's release lateness (srtm only), also at a sensor
topic's low rates (where what is released on arrival is also timed end to end, beside
the same load through nsqd); ``benchmarks/sensors.py`` for open-loop sensors (one connection each,
one PUB, wait for the OK, at a fixed offered rate). The table gives, per
row, each broker's median of ``--runs`` runs with min–max, and srtm / nsqd as the median
of the per-run ratios with their range. A minimal uvloop server that answers every
PUB/MPUB with OK and keeps nothing is measured with bench_writer too: the ceiling for a
Python server on this machine. ``--json PATH`` also writes the raw numbers. Every process
started here is stopped at the end, on Ctrl-C and on errors too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import re
import resource
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
from collections.abc import Callable, Iterator, Sequence
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

from sensors import DRAIN_S, task_sensors
from srtm.broker.timer import tighten_timer_slack
from srtm.experiments import host
from srtm.launch import BrokerProcess, die_with_parent, start_broker, start_node
from srtm.protocol import MAGIC_V2, FrameReader, FrameType, Mpub, Pub, encode_command, response
from srtm.protocol.frames import ATTEMPTS_AT, BODY_AT, HEARTBEAT, ID_AT
from srtm.quantiles import quantiles

REPO = Path(__file__).resolve().parent.parent
NS_PER_S = 1_000_000_000
BODY_SIZE = 100
MPUB_BATCH = 200
#: MPUBs in flight on our generator's one connection (the memory fill).
MPUB_OUTSTANDING = 2
PUB_WINDOW = 100
#: End-to-end latency is measured at half the srtm broker's publish-and-consume capacity
#: of the same run, on both brokers, but never above this: our Python generator stamps
#: and reads every message itself, and past this its own delays would be measured.
E2E_MAX_RATE = 40_000
E2E_FALLBACK_RATE = 10_000
SHAPED_RATE = 10_000
SHAPED_BURST = 10
#: Offered to the shaped topic: 2 % above its rate, so the bucket never idles.
SHAPED_OFFER = 10_200
#: nsqd's (and the broker's) max_rdy_count.
RDY = 2_500
CHANNEL = "bench"
#: As nsq's bench.sh (--mem-queue-size=1000000), on both brokers.
MEM_QUEUE_SIZE = 1_000_000
#: Both brokers' default --mem-queue-size (the single-PUB row ¹² past which PUBs go to disk).
DEFAULT_MEM_QUEUE_SIZE = 10_000
#: The processes of the node in the rows ¹³: srtm node's default, one a core.
NODE_PROCESSES = os.cpu_count() or 1
#: The rows ¹³ (a node's shared address): their keys and bench_writer's batch size.
NODE_ROWS = (("mpub_node", MPUB_BATCH), ("pub_node", 1))
#: Messages queued (MPUB, one channel) for the memory row.
MEM_MSGS = 200_000
#: No recv or send of the generator waits longer than this for the broker.
IO_TIMEOUT_S = 10.0
#: A measurement is bounded by its duration and these many seconds, whatever happens.
TASK_SLACK_S = 60.0
TARGET_LATENESS_P99_US = 100.0
#: The machine's timer anchor (¹¹): this many sleeps of this long.
TIMER_SLEEPS = 400
TIMER_SLEEP_S = 0.0025
#: A run is disturbed where that timer woke later than this at p99: twice the lateness
#: goal (this kind of machine gave 99-198 µs in its quiet sittings, 387-1,278 in a busy
#: hour of its host). A quiet run can come close to it: the line is not a margin.
DISTURBED_TIMER_P99_US = 2 * TARGET_LATENESS_P99_US
#: Longest a topic's deletion waits for the broker to see its consumers go.
CONSUMERS_GONE_S = 5.0
#: The open-loop sensor rows: (sensors, PUBs a second each), one connection per sensor.
SENSOR_LOADS = ((2_000, 1.0), (200, 100.0))
#: Each sensor load runs the measurement's duration or as long as this many PUBs take,
#: whichever is longer: 2,000 sensors at 1/s in 5 s give a p99.9 from its 10 highest.
SENSOR_MIN_PUBS = 30_000
#: The shaped rows at a sensor topic's rates (msg/s): each row runs as many topics at
#: that rate as make ``LOW_TOTAL_RATE`` together, so that even 10/s gives its p99 enough
#: releases in a few seconds (40 topics of 10/s: 2,000 in 5 s).
LOW_RATES = (10, 100, 400)
LOW_TOTAL_RATE = 400
#: What the low-rate rows' second run offers, as a multiple of the rate: a topic inside
#: its envelope, whose messages find their tokens and go in the read that brings them.
LOW_UNDER = 0.5
#: The shaped rows measured again on an srtm broker at this --nice (¹⁴).
NICE = -20
TARGET_E2E_P99_US = 1_000.0

#: How long an idle measurement (¹⁶) waits after its consumer subscribed.
IDLE_SETTLE_S = 1.0
#: What ``--only`` may name: the measurements of a run (``Bench.steps``).
STEP_NAMES = (
    "memory", "memory-pub", "batched", "single", "single-disk", "node", "node-disk",
    "at-once", "latency", "shaped", "sensors", "idle", "low-rate", "nice",
)  # fmt: skip
#: The measurements of srtm alone (nsqd has no shaping).
SRTM_ONLY = ("shaped", "low-rate", "nice")

_I32 = struct.Struct(">I")
_Q = struct.Struct(">q")
_STAMP = struct.Struct(">qq")  # send time (ns, CLOCK_REALTIME), sequence number
OK_FRAME = response()
#: What our consumers IDENTIFY with: no output buffer, so nsqd writes each message as it
#: goes (by default it holds them until 16 KiB or 250 ms have gathered, which would be its
#: latency at these rates); srtm ignores it and sends at the end of each loop turn.
IDENTIFY = json.dumps({"output_buffer_size": -1}).encode()


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
    sock.sendall(b"IDENTIFY\n" + _I32.pack(len(IDENTIFY)) + IDENTIFY)
    sock.sendall(f"SUB {topic} {channel}\n".encode())
    frames = FrameReader()
    deadline = time.monotonic() + IO_TIMEOUT_S
    oks = 0
    while oks < 2:
        oks += take_responses(frames, recv(sock), sock)
        if time.monotonic() > deadline:
            raise BrokerError("no OK to IDENTIFY and SUB")
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


def task_paced_topics(
    addr: tuple[str, int], topics: list[str], rate: float, duration_s: float, settle_s: float
) -> dict[str, float]:
    """Publish ``rate`` msg/s to each of ``topics`` (one connection, PUBs pipelined,
    round the topics on one absolute schedule) while one consumer per topic FINs every
    message; counts, and each message's end-to-end latency (its consumer's read − the
    send stamp in its body): the broker's /stats has the release lateness."""
    cons = [subscribe(addr, t, CHANNEL) for t in topics]
    pub = connect(addr)
    try:
        return _paced_topics(cons, pub, topics, rate, duration_s, settle_s)
    finally:
        for c in cons:
            c.close()
        pub.close()


def _paced_topics(
    cons: list[socket.socket],
    pub: socket.socket,
    topics: list[str],
    rate: float,
    duration_s: float,
    settle_s: float,
) -> dict[str, float]:
    clock = time.time_ns
    heads = [f"PUB {t}\n".encode() + _I32.pack(BODY_SIZE) for t in topics]
    pad = b"p" * (BODY_SIZE - _STAMP.size)
    total_rate = rate * len(topics)
    step = NS_PER_S / total_rate
    total = int(total_rate * duration_s)
    frames = {c: FrameReader() for c in cons}
    pframes = FrameReader()
    seen = bytearray(total)
    lat: array[int] = array("q")
    sent = acked = got = again = 0
    t0 = clock() + 20_000_000
    end_ns = t0 + int((duration_s + settle_s) * NS_PER_S)
    late_ns = 0  # the generator's own: how far behind its schedule a send went out
    socks = [*cons, pub]
    while got < total or acked < total:
        now = clock()
        if sent < total:
            due = min(total, int((now - t0) / step) + 1)
            if due > sent:
                late_ns = max(late_ns, now - (t0 + int(sent * step)))
                stamp = clock()
                parts = []
                for seq in range(sent, due):
                    parts += (heads[seq % len(heads)], _STAMP.pack(stamp, seq), pad)
                pub.sendall(b"".join(parts))
                sent = due
            timeout = max(0.0, (t0 + sent * step - clock()) / NS_PER_S)
        else:
            if now > end_ns:
                break
            timeout = 0.05
        readable, _, _ = select.select(socks, [], [], timeout)
        for sock in readable:
            if sock is pub:
                acked += take_responses(pframes, recv(pub), pub)
            else:
                data = recv(sock)
                g, a = consume(frames[sock], data, sock, clock(), lat, seen)
                got, again = got + g, again + a
    us = np.asarray(lat, dtype=np.float64) / 1e3
    return {"sent": sent, "acked": acked, "received": got, "lost": total - sum(seen),
            "redelivered": again, "generator_late_max_us": late_ns / 1e3,
            **{f"e2e_{k}": v for k, v in quantiles(us, (0.5, 0.99), suffix="_us").items()},
            }  # fmt: skip


def task_timer_wake(sleeps: int, sleep_s: float) -> dict[str, float]:
    """How late this machine wakes a thread that sleeps ``sleep_s`` with 1 ns of timer
    slack (as the broker's release timer does), ``sleeps`` times: the floor under a
    shaped release at low rates, where the broker sleeps between releases."""
    tighten_timer_slack()
    want = int(sleep_s * NS_PER_S)
    late = []
    for _ in range(sleeps):
        t0 = time.perf_counter_ns()
        time.sleep(sleep_s)
        late.append(time.perf_counter_ns() - t0 - want)
    late.sort()
    return {
        "p50_us": late[len(late) // 2] / 1e3,
        "p99_us": late[int(len(late) * 0.99)] / 1e3,
        "max_us": late[-1] / 1e3,
    }


TASKS: dict[str, Callable[..., dict[str, float]]] = {
    "timer_wake": task_timer_wake,
    "publish": task_publish,
    "paced": task_paced,
    "paced_topics": task_paced_topics,
    "sensors": task_sensors,
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


# == the brokers: nsqd and srtm, and NSQ's load tools =====================================


def child_setup() -> None:
    """For ``preexec_fn``: the child dies with this process (Linux), so nothing is left
    behind even if we are killed."""
    die_with_parent()


def nsq_dirs() -> list[Path]:
    """``../shared/anchors/nsq-1.3.0`` beside this checkout, and beside the main checkout
    when this is a git worktree."""
    dirs = [REPO.parent / "shared" / "anchors" / "nsq-1.3.0"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        common = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        if common:
            dirs.append(Path(common).parent.parent / "shared" / "anchors" / "nsq-1.3.0")
    return dirs


def find_nsqd(path: Path | None) -> Path:
    """The nsqd binary, with ``bench_writer`` and ``bench_reader`` beside it."""
    candidates = [path] if path is not None else [d / "nsqd" for d in nsq_dirs()]
    for nsqd in candidates:
        tools = [nsqd.parent / t for t in ("bench_writer", "bench_reader")]
        if all(p.is_file() and os.access(p, os.X_OK) for p in (nsqd, *tools)):
            return nsqd.resolve()
    where = ", ".join(str(c) for c in candidates)
    raise typer.BadParameter(f"no nsqd with bench_writer and bench_reader beside it: {where}")


@dataclass
class Broker:
    """nsqd or srtm broker, as a child process on 127.0.0.1; the same HTTP calls reach both."""

    name: str
    proc: subprocess.Popen[Any]
    tcp: tuple[str, int]
    http: tuple[str, int]
    log: Path
    headers: dict[str, str] = field(default_factory=dict)
    srtm: BrokerProcess | None = None

    def request(self, path: str, method: str = "GET") -> bytes:
        url = f"http://{self.http[0]}:{self.http[1]}{path}"
        body = b"" if method == "POST" else None
        req = urllib.request.Request(url, data=body, method=method, headers=self.headers)
        with urllib.request.urlopen(req, timeout=IO_TIMEOUT_S) as resp:
            data: bytes = resp.read()
            return data

    def post(self, path: str) -> bytes:
        return self.request(path, "POST")

    def create_channel(self, topic: str) -> None:
        """The topic, then the channel ``CHANNEL`` on it (nsqd wants the topic first)."""
        self.post(f"/topic/create?topic={topic}")
        self.post(f"/channel/create?topic={topic}&channel={CHANNEL}")

    def stats(self, topic: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.request(f"/stats?format=json&topic={topic}"))
        return doc

    def topic(self, topic: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            t for t in self.stats(topic)["topics"] if t["topic_name"] == topic
        ]
        if not found:
            raise BrokerError(f"{self.name}: topic {topic} missing from /stats")
        return found[0]

    def channel_depth(self, topic: str) -> int:
        chans = [c for c in self.topic(topic)["channels"] if c["channel_name"] == CHANNEL]
        if not chans:
            raise BrokerError(f"{self.name}: channel {CHANNEL} missing from /stats")
        return int(chans[0]["depth"])

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far, user and system, all its
        threads (``process_cpu_ns``)."""
        return process_cpu_ns(self.proc.pid) / 1e9

    def cpu_ns(self) -> int:
        """``cpu_s`` in nanoseconds."""
        return process_cpu_ns(self.proc.pid)

    def rss(self) -> int:
        """Resident set size in bytes (Linux)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise BrokerError(f"{self.name}: no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit code; killed (and TimeoutExpired) if it hangs."""
        if self.srtm is not None:
            return self.srtm.stop(timeout)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        extra = list(self.srtm.stdout_tail) if self.srtm is not None else []
        return "\n".join([*extra, *text])


def start_nsqd(binary: Path, workdir: Path, mem_queue_size: int) -> Broker:
    data = workdir / "nsqd-data"
    data.mkdir(parents=True)
    log = workdir / "nsqd.log"
    cmd = [
        str(binary), "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
        "--https-address=", "--broadcast-address=127.0.0.1", f"--data-path={data}",
        f"--mem-queue-size={mem_queue_size}",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C on the terminal reaches only us; we stop it
            preexec_fn=child_setup,
        )
    deadline = time.monotonic() + 30
    try:
        while True:
            text = log.read_text(errors="replace")
            tcp = re.search(r"TCP: listening on ([\d.]+):(\d+)", text)
            http = re.search(r"HTTP: listening on ([\d.]+):(\d+)", text)
            if tcp and http:
                return Broker("nsqd", proc, (tcp[1], int(tcp[2])), (http[1], int(http[2])), log)
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nsqd did not start (exit code {proc.poll()}):\n{text[-800:]}")
            time.sleep(0.02)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


@contextlib.contextmanager
def busy_loop() -> Iterator[None]:
    """A process spinning on the CPU (a busy program sharing the machine, at nice 0) while
    the block runs; gone after it, and with this process if it dies."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=child_setup)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def start_srtm(workdir: Path, mem_queue_size: int, args: Sequence[str] = ()) -> Broker:
    log = workdir / "srtm.log"
    with log.open("w") as out:
        bp = start_broker(
            workdir / "srtm-data",
            ["--mem-queue-size", str(mem_queue_size), *args],
            stderr=out,
            new_session=True,
            preexec_fn=child_setup,
        )
    return Broker("srtm", bp.proc, bp.tcp, bp.http, log, bp.headers, bp)


def process_cpu_ns(pid: int) -> int:
    """The CPU time process ``pid`` has used so far (ns), user and system, every thread it
    ran, those already ended included: its CPU-time clock (Linux's clock id for a pid,
    ``CPUCLOCK_SCHED``). /proc/PID/stat's utime and stime come in 10 ms ticks, 10 µs a
    message over a low-rate row's 1,000; the threads' schedstat leaves out ended threads.
    Raises OSError once the process is gone."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)


def cpu_s(pids: Sequence[int]) -> float:
    """``process_cpu_ns`` of ``pids`` together (s); a process gone counts 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += process_cpu_ns(pid)
    return total / 1e9


def children_cpu_s() -> float:
    """utime + stime of this process's children waited for so far (s)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tools_at_once_text(rows: dict[str, Row]) -> str | None:
    """The load tools' CPU at once (³) per message published, each broker's median and
    range, and how many messages the reader took per message published: on a machine
    with fewer cores than busy processes, what the tools spend the writer does not get."""
    parts = []
    for who in BROKERS:
        runs = [x for x in rows["both_pub"].raw if x["broker"] == who and "tools_cpu_s" in x]
        read = {x["run"]: x["msgs"] for x in rows["both_sub"].raw if x["broker"] == who}
        per_msg = [x["tools_cpu_s"] / x["msgs"] * 1e6 for x in runs if x["msgs"]]
        taken = [read[x["run"]] / x["msgs"] for x in runs if x["msgs"] and x["run"] in read]
        if per_msg and taken:
            parts.append(
                f"{who} {statistics.median(per_msg):.2f} µs ({spread(per_msg, 'µs')}), "
                f"{statistics.median(taken):.2f} read per published"
            )
    if not parts:
        return None
    return (
        "at once ³, the load tools' CPU (bench_writer and bench_reader, utime + stime) "
        "per message published: " + "; ".join(parts)
    )


def node_children(pid: int) -> list[int]:
    """The node's broker processes."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):  # the thread ended after the listing
            continue
    return out


_TOOL_RESULT = re.compile(r"duration: (\S+) - [\d.]+mb/s - ([\d.]+)ops/s")
_GO_DURATION_PART = re.compile(r"([\d.]+)(h|ms|µs|us|ns|m|s)")
_GO_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}


def go_duration_s(text: str) -> float:
    """Seconds in a Go duration as the tools print it: ``5.0004s``, ``500.2ms``, ``1m0.5s``."""
    return sum(float(n) * _GO_UNIT_S[unit] for n, unit in _GO_DURATION_PART.findall(text))


def tool_cmd(
    binary: Path, tcp: tuple[str, int], topic: str, duration_s: float, **flags: object
) -> list[str]:
    """A bench_writer or bench_reader command line (100-byte messages)."""
    cmd = [
        str(binary), f"--nsqd-tcp-address={tcp[0]}:{tcp[1]}", f"--topic={topic}",
        f"--size={BODY_SIZE}", f"--runfor={duration_s:g}s",
    ]  # fmt: skip
    return cmd + [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]


def run_tools(cmds: list[list[str]], timeout_s: float) -> list[dict[str, float]]:
    """Run NSQ load tools at once; each one's ops/s, seconds and messages. Whatever
    happens, none is left running."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for cmd in cmds:
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                    preexec_fn=child_setup,
                )
            )
        deadline = time.monotonic() + timeout_s
        results = []
        for proc, cmd in zip(procs, cmds, strict=True):
            name = Path(cmd[0]).name
            try:
                text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BrokerError(f"{name}: no result in {timeout_s:g} s") from None
            m = _TOOL_RESULT.search(text)
            if proc.returncode != 0 or m is None:
                raise BrokerError(f"{name} exited with {proc.returncode}:\n{text[-600:]}")
            seconds, rate = go_duration_s(m[1]), float(m[2])
            results.append({"rate": rate, "seconds": seconds, "msgs": round(rate * seconds)})
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


# == measurements =========================================================================

BROKERS = ("nsqd", "srtm")


@dataclass(frozen=True, slots=True)
class Config:
    duration_s: float
    runs: int
    mem_queue_size: int
    settle_s: float
    e2e_max_rate: int
    nsqd: str
    #: The measurements to run (``STEP_NAMES``), in their usual order.
    only: tuple[str, ...] = STEP_NAMES


@dataclass(slots=True)
class Row:
    key: str
    label: str
    unit: str
    #: srtm / nsqd at least this (throughput rows).
    ratio_goal: float | None = None
    #: srtm's median at most this (latency rows).
    srtm_max: float | None = None
    #: srtm / nsqd at most this (latency rows side by side).
    ratio_max: float | None = None
    goal_note: str = ""
    #: The label in the CPU table (the measurement, where ``label`` names one figure of it).
    cpu_label: str = ""
    #: broker (or "anchor") -> run -> value.
    values: dict[str, dict[int, float]] = field(default_factory=dict)
    #: The server's CPU seconds per million messages over this row's window: broker ->
    #: run -> value (only the first row of a measurement has them).
    cpu: dict[str, dict[int, float]] = field(default_factory=dict)
    raw: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    section_end: bool = False

    def add(self, who: str, run: int, value: float) -> None:
        self.values.setdefault(who, {})[run] = value

    def add_cpu(self, who: str, run: int, cpu_s: float, msgs: float) -> None:
        """``cpu_s`` of the server's CPU spent on ``msgs`` messages."""
        if msgs > 0:
            self.cpu.setdefault(who, {})[run] = cpu_s / msgs * 1e6

    def samples(self, who: str, of: str = "values") -> list[float]:
        return list(getattr(self, of).get(who, {}).values())

    def median(self, who: str, of: str = "values") -> float | None:
        s = self.samples(who, of)
        return statistics.median(s) if s else None

    def ratios(self, of: str = "values") -> list[float]:
        """srtm / nsqd per run, for the runs that have both (``of``: "values" or "cpu")."""
        by: dict[str, dict[int, float]] = getattr(self, of)
        nsqd, srtm = by.get("nsqd", {}), by.get("srtm", {})
        return [srtm[r] / nsqd[r] for r in sorted(srtm.keys() & nsqd.keys()) if nsqd[r]]


def wait_consumers_gone(broker: Broker, topic: str, timeout_s: float) -> None:
    """Until none of ``topic``'s channels has a consumer (at most ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = broker.stats(topic)
        clients = sum(ch["client_count"] for t in doc["topics"] for ch in t["channels"])
        if not clients:
            return
        time.sleep(0.02)


def sensor_duration(duration_s: float, sensors: int, rate: float) -> float:
    """How long a sensor load runs (s): ``duration_s``, or ``SENSOR_MIN_PUBS`` at its rate."""
    return max(duration_s, SENSOR_MIN_PUBS / (sensors * rate))


def sensor_key(sensors: int, rate: float) -> str:
    return f"sensors{sensors}x{rate:g}"


def low_topics(rate: int) -> int:
    """How many topics at ``rate`` make ``LOW_TOTAL_RATE`` together (at least one)."""
    return max(1, LOW_TOTAL_RATE // rate)


def make_rows() -> dict[str, Row]:
    rows = [
        Row("mpub", f"batched publish: bench_writer, MPUB-{MPUB_BATCH} ¹", "msg/s", 1.0),
        Row("pub", "single PUB: bench_writer --batch-size=1 ¹", "msg/s", 1.0),  # issue 32
        Row("pub_disk", "    at default queue sizes, overflowing to disk ¹²", "msg/s", 1.0),
        Row("pub_node", f"    into srtm node, {NODE_PROCESSES} processes, one address ¹³", "msg/s",
            1.0),
        Row("pub_node_disk", "    into srtm node, default queue sizes, overflowing to disk ¹³",
            "msg/s", 1.0),
        Row("mpub_node", f"MPUB-{MPUB_BATCH} into srtm node, as above ¹³", "msg/s", 1.0),
        Row("consume", "consume: bench_reader on the batched backlog ²", "msg/s", 1.0),
        Row("both_pub", "publish and consume at once ³: bench_writer", "msg/s", 1.0),
        Row("both_sub", "    bench_reader", "msg/s", 1.0, section_end=True),
        Row("e2e_p50", "end-to-end latency at half srtm's capacity ⁴: p50", "µs"),
        Row("e2e_p99", "    p99", "µs", srtm_max=TARGET_E2E_P99_US),
        Row("e2e_rate", "    achieved (consumer)", "msg/s", section_end=True),
        Row("late_p50", f"shaped {SHAPED_RATE:,}/s b={SHAPED_BURST} ⁵: release lateness p50", "µs"),
        Row("late_p99", "    release lateness p99", "µs", srtm_max=TARGET_LATENESS_P99_US),
        Row("wait_p50", "    token wait p50", "ms"),
        Row("wait_p99", "    token wait p99", "ms"),
        Row("shaped_rate", "    achieved (consumer)", "msg/s"),
        Row("late_nice_p50", f"    at --nice {NICE} ¹⁴: release lateness p50", "µs",
            cpu_label=f"shaped {SHAPED_RATE:,}/s at --nice {NICE} ¹⁴"),
        Row("late_nice_p99", "        p99", "µs", srtm_max=TARGET_LATENESS_P99_US,
            section_end=True),
        Row("mem", f"memory per queued message ⁶ ({MEM_MSGS:,} queued)", "bytes"),
        Row("mem_pub", f"    {MEM_MSGS:,} PUB'd alone ⁶ (a sensor's readings)", "bytes",
            ratio_max=1.0, section_end=True),
        Row("idle_cpu", "idle ¹⁶: CPU time a second", "ms", ratio_max=1.0, section_end=True),
    ]  # fmt: skip
    rows[-2].goal_note = "no worse than before"
    for n, rate in SENSOR_LOADS:
        k = sensor_key(n, rate)
        rows += [
            Row(f"{k}_p50", f"open-loop sensors ⁹: {n:,} at {rate:g} msg/s, PUB→OK p50", "µs",
                ratio_max=1.0, cpu_label=f"open-loop sensors ⁹: {n:,} at {rate:g} msg/s"),
            Row(f"{k}_p99", "    p99", "µs", ratio_max=1.0),
            Row(f"{k}_p999", "    p99.9", "µs", ratio_max=1.0),
            Row(f"{k}_held", "    PUBs held behind an unanswered one", "msgs"),
            Row(f"{k}_late", "    the generator's lateness p99", "µs", section_end=True),
        ]  # fmt: skip
    rows += [
        Row("timer_p50", "this machine's timer ¹¹: a 2.5 ms sleep's lateness, p50", "µs"),
        Row("timer_p99", "    p99", "µs"),
    ]
    for rate in LOW_RATES:
        k = f"low{rate}"
        n = low_topics(rate)
        rows += [
            Row(f"{k}_p50", f"shaped {n} × {rate}/s b=1 ¹⁰: release lateness p50", "µs",
                cpu_label=f"shaped {n} topic{'s' * (n > 1)} × {rate}/s ¹⁰"),
            Row(f"{k}_p99", "    release lateness p99", "µs", srtm_max=TARGET_LATENESS_P99_US),
            Row(f"{k}_held_p99", "    of them held for a token, p99", "µs"),
            Row(f"{k}_under_p50", f"    offered {LOW_UNDER:g} × the rate: lateness p50", "µs",
                cpu_label=f"shaped {n} topic{'s' * (n > 1)} × {rate}/s, offered "
                f"{LOW_UNDER:g} × ¹⁰"),
            Row(f"{k}_under_p99", "        p99 (released on arrival)", "µs",
                srtm_max=TARGET_LATENESS_P99_US),
            Row(f"{k}_under_e2e_p50", "        end to end (send → consumer's read) ¹⁵: p50",
                "µs", cpu_label=f"{n} topic{'s' * (n > 1)} × {rate}/s offered "
                f"{LOW_UNDER:g} ×, end to end ¹⁵"),
            Row(f"{k}_under_e2e_p99", "            p99", "µs", ratio_max=1.0),
            Row(f"{k}_nice_p50", f"    at --nice {NICE} ¹⁴: lateness p50", "µs",
                cpu_label=f"shaped {n} topic{'s' * (n > 1)} × {rate}/s at --nice {NICE} ¹⁴"),
            Row(f"{k}_nice_p99", "        p99", "µs", srtm_max=TARGET_LATENESS_P99_US),
            Row(f"{k}_nice_held_p99", "        of them held for a token, p99", "µs"),
            Row(f"{k}_nice_under_p99", f"        offered {LOW_UNDER:g} ×: p99", "µs",
                srtm_max=TARGET_LATENESS_P99_US, section_end=rate == LOW_RATES[-1],
                cpu_label=f"shaped {n} topic{'s' * (n > 1)} × {rate}/s at --nice {NICE}, "
                f"offered {LOW_UNDER:g} × ¹⁴"),
        ]  # fmt: skip
    rows += [
        Row("busy_late_p99", f"beside a busy loop ¹⁴: shaped {SHAPED_RATE:,}/s, lateness p99 "
            "at nice 0", "µs", cpu_label=f"shaped {SHAPED_RATE:,}/s beside a busy loop, nice 0 ¹⁴"),
        Row("busy_late_nice_p99", f"    at --nice {NICE}", "µs",
            srtm_max=TARGET_LATENESS_P99_US,
            cpu_label=f"shaped {SHAPED_RATE:,}/s beside a busy loop, --nice {NICE} ¹⁴"),
    ]  # fmt: skip
    for rate in LOW_RATES:
        n = low_topics(rate)
        rows += [
            Row(f"busy_low{rate}_p99", f"    {n} × {rate}/s, p99 at nice 0", "µs",
                cpu_label=f"shaped {n} × {rate}/s beside a busy loop, nice 0 ¹⁴"),
            Row(f"busy_low{rate}_nice_p99", f"        at --nice {NICE}", "µs",
                srtm_max=TARGET_LATENESS_P99_US,
                cpu_label=f"shaped {n} × {rate}/s beside a busy loop, --nice {NICE} ¹⁴",
                section_end=rate == LOW_RATES[-1]),
        ]  # fmt: skip
    by_key = {r.key: r for r in rows}
    by_key["pub_disk"].cpu_label = "single PUB at default queue sizes, to disk ¹²"
    by_key["pub_node"].cpu_label = f"single PUB into srtm node ({NODE_PROCESSES} processes) ¹³"
    by_key[
        "mpub_node"
    ].cpu_label = f"MPUB-{MPUB_BATCH} into srtm node ({NODE_PROCESSES} processes) ¹³"
    by_key["pub_node_disk"].cpu_label = "single PUB into srtm node, to disk ¹³"
    by_key["both_pub"].cpu_label = "publish and consume at once ³, per message published"
    by_key["e2e_p50"].cpu_label = "end-to-end latency at half srtm's capacity ⁴"
    by_key["late_p50"].cpu_label = f"shaped {SHAPED_RATE:,}/s b={SHAPED_BURST} ⁵"
    by_key["mem"].cpu_label = f"the memory row's fill ⁶: {MEM_MSGS:,} messages MPUB'd"
    by_key["mem_pub"].cpu_label = f"the memory row's fill ⁶: {MEM_MSGS:,} messages PUB'd"
    return {r.key: r for r in rows}


class Bench:
    def __init__(
        self,
        cfg: Config,
        nsqd: Path,
        workdir: Path,
        gen: Generator,
        anchor: tuple[str, int],
        log: Console,
    ) -> None:
        self.cfg = cfg
        self.nsqd_binary = nsqd
        self.writer = nsqd.parent / "bench_writer"
        self.reader = nsqd.parent / "bench_reader"
        self.workdir = workdir
        self.gen = gen
        self.anchor = anchor
        self.log = log
        self.rows = make_rows()
        self.problems: list[str] = []
        self.brokers: dict[str, Broker] = {}
        #: How long /ping took right after each topic deletion (s), per broker.
        self.settle_s: dict[str, list[float]] = {b: [] for b in BROKERS}

    @contextlib.contextmanager
    def started(self, run: int) -> Iterator[None]:
        """nsqd and srtm broker, fresh for this run; both stopped on the way out."""
        try:
            for name in BROKERS:
                where = self.workdir / f"run-{run + 1}-{name}"
                where.mkdir()
                if name == "nsqd":
                    broker = start_nsqd(self.nsqd_binary, where, self.cfg.mem_queue_size)
                else:
                    broker = start_srtm(where, self.cfg.mem_queue_size)
                self.brokers[name] = broker
            yield
        finally:
            self.stop()

    def stop(self) -> None:
        for name, broker in list(self.brokers.items()):
            if not broker.alive():
                problem = f"{name} had already exited with {broker.proc.returncode}"
            else:
                try:
                    code = broker.stop(30)
                    problem = f"{name} exited with {code} after SIGTERM" if code else ""
                except subprocess.TimeoutExpired:
                    problem = f"{name} still running 30 s after SIGTERM: killed"
            if problem:
                self.problems.append(problem + "\n" + broker.log_tail())
            del self.brokers[name]

    def task(self, name: str, budget_s: float, **kwargs: Any) -> dict[str, float]:
        return self.gen.run(name, budget_s + TASK_SLACK_S, **kwargs)

    def guarded(self, keys: list[str], what: str, fn: Callable[[], None]) -> None:
        """Run one measurement; a failure is recorded on its rows and the others still run."""
        try:
            fn()
        except (BrokerError, OSError, KeyError, ValueError, RuntimeError) as exc:
            msg = f"{what}: {exc}".strip()
            for k in keys:
                self.rows[k].errors.append(msg)
            self.problems.append(msg)
            self.log.log(f"[red]{msg}[/]")

    def delete_topic(self, broker: Broker, topic: str) -> None:
        """Delete once the broker has seen the topic's consumers go (nsqd 1.3.0 can panic
        on a departing consumer's FIN that it reads while the channel is being deleted),
        and wait until the broker answers again, so that freeing the topic's messages
        belongs to no measurement."""
        with contextlib.suppress(OSError):
            wait_consumers_gone(broker, topic, CONSUMERS_GONE_S)
            broker.post(f"/topic/delete?topic={topic}")
            time.sleep(0.05)  # a scan-loop tick (10 ms) or more
            t0 = time.perf_counter()
            broker.request("/ping")
            self.settle_s[broker.name].append(time.perf_counter() - t0)

    def order(self, run: int) -> tuple[str, ...]:
        """Which broker goes first swaps every run."""
        return BROKERS if run % 2 == 0 else BROKERS[::-1]

    def timeout(self) -> float:
        return self.cfg.duration_s + TASK_SLACK_S

    # -- the measurements ----------------------------------------------------------------
    def memory(self, run: int, name: str) -> None:
        self._memory(run, name, self.brokers[name], "mem", "mpub")

    @contextlib.contextmanager
    def fresh(self, run: int, name: str, what: str, mem_queue_size: int) -> Iterator[Broker]:
        """A broker of its own for one measurement (``what``), stopped after it."""
        where = self.workdir / f"run-{run + 1}-{name}-{what}"
        where.mkdir()
        if name == "nsqd":
            broker = start_nsqd(self.nsqd_binary, where, mem_queue_size)
        else:
            broker = start_srtm(where, mem_queue_size)
        try:
            yield broker
        finally:
            try:
                broker.stop(30)
            except subprocess.TimeoutExpired:
                self.problems.append(f"{name} ({what}) still running 30 s after SIGTERM")

    def memory_pub(self, run: int, name: str) -> None:
        """As ``memory``, with PUBs (pipelined), on a broker of its own started for it:
        the run's brokers have held messages, and neither gives memory back at once."""
        with self.fresh(run, name, "pub", self.cfg.mem_queue_size) as broker:
            self._memory(run, name, broker, "mem_pub", "pub_pipelined")

    def _memory(self, run: int, name: str, broker: Broker, key: str, mode: str) -> None:
        topic = f"bench_mem_{run}"

        def measure() -> None:
            broker.create_channel(topic)
            try:
                before, cpu0 = broker.rss(), broker.cpu_s()
                res = self.task(
                    "publish", 30, addr=broker.tcp, topic=topic, mode=mode,
                    duration_s=30, max_msgs=MEM_MSGS,
                )  # fmt: skip
                if res["msgs"] != MEM_MSGS:
                    raise BrokerError(f"published only {res['msgs']:,.0f} of {MEM_MSGS:,}")
                deadline = time.monotonic() + 30
                while (depth := broker.channel_depth(topic)) < MEM_MSGS:
                    if time.monotonic() > deadline:
                        raise BrokerError(f"channel depth {depth:,} of {MEM_MSGS:,} after 30 s")
                    time.sleep(0.05)
                after, cpu = broker.rss(), broker.cpu_s() - cpu0
            finally:
                self.delete_topic(broker, topic)
            row = self.rows[key]
            row.add_cpu(name, run, cpu, MEM_MSGS)
            row.raw.append({"broker": name, "run": run, "rss_before": before, "rss_after": after})
            row.add(name, run, (after - before) / MEM_MSGS)

        self.guarded([key], f"{name}: memory ({mode}), run {run + 1}", measure)

    def batched(self, run: int, name: str) -> None:
        """bench_writer MPUB-200 into a topic with one channel, then bench_reader on that
        backlog."""
        broker = self.brokers[name]
        topic = f"bench_mpub_{run}"
        d = self.cfg.duration_s

        def measure() -> None:
            broker.create_channel(topic)
            try:
                cmd = tool_cmd(self.writer, broker.tcp, topic, d, batch_size=MPUB_BATCH)
                cpu0 = broker.cpu_s()
                (w,) = run_tools([cmd], self.timeout())
                self.rows["mpub"].add_cpu(name, run, broker.cpu_s() - cpu0, w["msgs"])
                count = broker.topic(topic)["message_count"]
                w["broker_message_count"] = count
                self.rows["mpub"].raw.append({"broker": name, "run": run, **w})
                if count < w["msgs"]:
                    raise BrokerError(f"bench_writer counted {w['msgs']:,.0f}, topic {count:,}")
                self.rows["mpub"].add(name, run, w["rate"])
                cmd = tool_cmd(self.reader, broker.tcp, topic, d, channel=CHANNEL, rdy=RDY)
                cpu0 = broker.cpu_s()
                (r,) = run_tools([cmd], self.timeout())
                self.rows["consume"].add_cpu(name, run, broker.cpu_s() - cpu0, r["msgs"])
                self.rows["consume"].raw.append({"broker": name, "run": run, **r})
                if r["msgs"] >= 0.99 * count:
                    self.rows["consume"].notes.append(
                        f"{name} run {run + 1}: the backlog ({count:,}) ran out; a lower bound"
                    )
                self.rows["consume"].add(name, run, r["rate"])
            finally:
                self.delete_topic(broker, topic)

        self.guarded(["mpub", "consume"], f"{name}: batched publish, run {run + 1}", measure)

    def single(self, run: int, name: str) -> None:
        self._publish(run, name, self.brokers[name], "pub")

    def single_disk(self, run: int, name: str) -> None:
        """Single PUB on a fresh broker at the default --mem-queue-size (¹²): all but the
        first 10,000 messages go to disk, each acknowledged once written."""
        with self.fresh(run, name, "disk", DEFAULT_MEM_QUEUE_SIZE) as broker:
            self._publish(run, name, broker, "pub_disk")

    def into_node(self, run: int, name: str) -> None:
        """MPUB and single PUB into a whole host (¹³): nsqd, which uses every core, against
        a fresh ``srtm node`` of one process a core, through its shared address."""
        if name == "nsqd":
            for key, batch in NODE_ROWS:
                self._publish(run, name, self.brokers[name], key, batch)
            return
        self._node(run, "node", self.cfg.mem_queue_size, NODE_ROWS)

    def into_node_disk(self, run: int, name: str) -> None:
        """Single PUB into a whole host at default queue sizes (¹³, ¹²): a fresh nsqd, and
        a fresh node, each past its memory queue from the 10,001st message."""
        if name == "nsqd":
            with self.fresh(run, name, "node-disk", DEFAULT_MEM_QUEUE_SIZE) as broker:
                self._publish(run, name, broker, "pub_node_disk")
            return
        self._node(run, "node-disk", DEFAULT_MEM_QUEUE_SIZE, (("pub_node_disk", 1),))

    def _node(
        self, run: int, what: str, mem_queue_size: int, rows: Sequence[tuple[str, int]]
    ) -> None:
        """``rows`` (key, bench_writer's batch) into a fresh ``srtm node`` (¹³)."""
        name = "srtm"
        where = self.workdir / f"run-{run + 1}-{what}"
        args = ["--shared-address", "127.0.0.1:0", "--mem-queue-size", str(mem_queue_size)]
        with (self.workdir / f"run-{run + 1}-{what}.log").open("w") as log:
            node = start_node(where, NODE_PROCESSES, args, stderr=log)  # not amid the table
        assert node.shared is not None
        pids = [node.proc.pid, *node_children(node.proc.pid)]
        https = [http for _, _, http in node.brokers]
        cpu = partial(cpu_s, pids)

        def delete(topic: str) -> None:  # from every process, as from the run's brokers
            for http in https:
                with contextlib.suppress(OSError):
                    url = f"http://{http[0]}:{http[1]}/topic/delete?topic={topic}"
                    req = urllib.request.Request(url, b"", method="POST", headers=node.headers)
                    urllib.request.urlopen(req, timeout=IO_TIMEOUT_S).close()

        try:
            for key, batch in rows:
                self._publish(run, name, node.shared, key, batch, cpu, delete)
        finally:
            if node.stop(60):
                self.problems.append("srtm node exited with an error after SIGTERM")

    def _publish(
        self,
        run: int,
        name: str,
        to: Broker | tuple[str, int],
        key: str,
        batch: int = 1,
        cpu: Callable[[], float] | None = None,
        delete: Callable[[str], None] | None = None,
    ) -> None:
        """bench_writer at ``batch`` into ``to`` (a broker, or an address whose server's
        CPU is ``cpu`` and whose topics ``delete`` removes) for row ``key``."""
        topic = f"bench_{key}_{run}"
        if isinstance(to, Broker):
            address, cpu, broker = to.tcp, to.cpu_s, to
            delete = partial(self.delete_topic, broker)
        else:
            address = to
        assert cpu is not None and delete is not None
        row = self.rows[key]

        def measure() -> None:
            try:
                cmd = tool_cmd(self.writer, address, topic, self.cfg.duration_s, batch_size=batch)
                cpu0 = cpu()
                (w,) = run_tools([cmd], self.timeout())
                row.add_cpu(name, run, cpu() - cpu0, w["msgs"])
                row.raw.append({"broker": name, "run": run, **w})
                row.add(name, run, w["rate"])
            finally:
                delete(topic)

        self.guarded([key], f"{name}: {row.cpu_label or row.label.strip()}, run {run + 1}", measure)

    def on_anchor(self, run: int) -> None:
        """bench_writer against the minimal uvloop server, batched and single."""
        d = self.cfg.duration_s
        for key, batch in (("mpub", MPUB_BATCH), ("pub", 1)):

            def measure(key: str = key, batch: int = batch) -> None:
                cmd = tool_cmd(self.writer, self.anchor, "anchor", d, batch_size=batch)
                (w,) = run_tools([cmd], self.timeout())
                self.rows[key].add("anchor", run, w["rate"])

            self.guarded([], f"anchor: {key}, run {run + 1}", measure)

    def at_once(self, run: int, name: str) -> None:
        broker = self.brokers[name]
        topic = f"bench_both_{run}"
        d = self.cfg.duration_s

        def measure() -> None:
            broker.create_channel(topic)
            try:
                cmds = [
                    tool_cmd(self.writer, broker.tcp, topic, d, batch_size=MPUB_BATCH),
                    tool_cmd(self.reader, broker.tcp, topic, d, channel=CHANNEL, rdy=RDY),
                ]
                cpu0, tools0 = broker.cpu_s(), children_cpu_s()
                w, r = run_tools(cmds, self.timeout())
                cpu = broker.cpu_s() - cpu0
                w["tools_cpu_s"] = children_cpu_s() - tools0  # both tools, reaped by now
            finally:
                self.delete_topic(broker, topic)
            # Per message published: each of them is also consumed (or nearly all).
            self.rows["both_pub"].add_cpu(name, run, cpu, w["msgs"])
            for key, res in (("both_pub", w), ("both_sub", r)):
                self.rows[key].raw.append({"broker": name, "run": run, **res})
                self.rows[key].add(name, run, res["rate"])

        self.guarded(["both_pub", "both_sub"], f"{name}: at once, run {run + 1}", measure)

    def e2e_rate(self, run: int) -> int:
        """Half what srtm carried in and out at once in this run, within what our
        generator can pace."""
        w = self.rows["both_pub"].values.get("srtm", {}).get(run)
        r = self.rows["both_sub"].values.get("srtm", {}).get(run)
        if w is None or r is None:
            return E2E_FALLBACK_RATE
        return int(min(min(w, r) / 2, self.cfg.e2e_max_rate))

    def latency(self, run: int, name: str) -> None:
        broker = self.brokers[name]
        keys = ["e2e_p50", "e2e_p99", "e2e_rate"]
        topic = f"bench_e2e_{run}"
        d = self.cfg.duration_s
        rate = self.e2e_rate(run)

        def measure() -> None:
            try:
                cpu0 = broker.cpu_s()
                res = self.task(
                    "paced", d + self.cfg.settle_s, addr=broker.tcp, topic=topic, rate=rate,
                    duration_s=d, settle_s=self.cfg.settle_s,
                )  # fmt: skip
                self.rows["e2e_p50"].add_cpu(name, run, broker.cpu_s() - cpu0, res["received"])
            finally:
                self.delete_topic(broker, topic)
            self.rows["e2e_p50"].raw.append({"broker": name, "run": run, "rate": rate, **res})
            check_paced(res)
            for key, value in zip(keys, ("p50_us", "p99_us", "rate"), strict=True):
                self.rows[key].add(name, run, res[value])

        self.guarded(keys, f"{name}: latency at {rate:,}/s, run {run + 1}", measure)

    def shaped(self, run: int) -> None:
        keys = {"p50": "late_p50", "p99": "late_p99", "wait_p50": "wait_p50",
                "wait_p99": "wait_p99", "rate": "shaped_rate"}  # fmt: skip
        self.guarded(list(keys.values()), f"srtm: shaped topic, run {run + 1}",
                     partial(self._shaped, run, self.brokers["srtm"], keys))  # fmt: skip

    def nice(self, run: int) -> None:
        """The 2 % over rows of ⁵ and ¹⁰, and the rows offered ``LOW_UNDER`` × the rate,
        on a fresh srtm broker at ``--nice NICE``; then the 2 % over ones beside a busy
        loop, on the run's broker (nice 0) and on that one (¹⁴)."""
        shaped = {"p50": "late_nice_p50", "p99": "late_nice_p99"}
        low = {"p50": "low{rate}_nice_p50", "p99": "low{rate}_nice_p99",
               "held_p99": "low{rate}_nice_held_p99"}  # fmt: skip
        keys = [*shaped.values(), *(k.format(rate=r) for r in LOW_RATES for k in low.values())]
        keys += [f"low{r}_nice_under_p99" for r in LOW_RATES]
        keys += ["busy_late_nice_p99", *(f"busy_low{r}_nice_p99" for r in LOW_RATES)]
        with self.nice_srtm(run, keys) as nice_broker:
            if nice_broker is not None:
                self._shaped_rows(run, nice_broker, shaped, low, f"at --nice {NICE}")
                for rate in LOW_RATES:
                    under = {"p99": f"low{rate}_nice_under_p99"}
                    what = f"srtm at --nice {NICE}: {low_topics(rate)} topics at {rate}/s"
                    measure = partial(self._low_rate, run, nice_broker, rate, under, LOW_UNDER)
                    what += f" offered {LOW_UNDER:g} ×, run {run + 1}"
                    self.guarded([*under.values()], what, measure)
            with busy_loop():
                for kind, broker in (("", self.brokers["srtm"]), ("nice_", nice_broker)):
                    if broker is None:
                        continue
                    at = "nice 0" if not kind else f"--nice {NICE}"
                    self._shaped_rows(run, broker, {"p99": f"busy_late_{kind}p99"},
                                      {"p99": f"busy_low{{rate}}_{kind}p99"},
                                      f"at {at} beside a busy loop")  # fmt: skip

    def _shaped_rows(
        self, run: int, broker: Broker, shaped: dict[str, str], low: dict[str, str], how: str
    ) -> None:
        """The shaped topic (``_shaped``), then ``LOW_RATES`` offered 2 % over
        (``_low_rate``; ``{rate}`` in ``low``'s keys), on ``broker``."""
        what = f"srtm {how}: shaped topic, run {run + 1}"
        self.guarded(list(shaped.values()), what, partial(self._shaped, run, broker, shaped))
        for rate in LOW_RATES:
            keys = {k: v.format(rate=rate) for k, v in low.items()}
            what = f"srtm {how}: {low_topics(rate)} topics at {rate}/s, run {run + 1}"
            measure = partial(self._low_rate, run, broker, rate, keys, 1.02)
            self.guarded(list(keys.values()), what, measure)

    @contextlib.contextmanager
    def nice_srtm(self, run: int, keys: list[str]) -> Iterator[Broker | None]:
        """A fresh srtm broker at ``--nice NICE`` (None, the failure on ``keys``, where it
        does not start), stopped on the way out."""
        where = self.workdir / f"run-{run + 1}-srtm-nice"
        where.mkdir()
        started: list[Broker] = []
        self.guarded(keys, f"srtm at --nice {NICE}, run {run + 1}", lambda: started.append(
            start_srtm(where, self.cfg.mem_queue_size, ["--nice", str(NICE)])))  # fmt: skip
        broker = started[0] if started else None
        try:
            yield broker
        finally:
            if broker is not None and broker.stop(30):
                self.problems.append(f"srtm at --nice {NICE} exited with an error\n"
                                     + broker.log_tail())  # fmt: skip

    def _shaped(self, run: int, broker: Broker, keys: dict[str, str]) -> None:
        """The shaped topic on ``broker``: of its figures (lateness ``p50`` and ``p99``,
        token wait ``wait_p50`` and ``wait_p99``, the ``rate`` achieved) those ``keys``
        name, each into its row; the first row also gets the CPU and the raw result."""
        first = next(iter(keys.values()))
        topic = f"bench_shaped_{run}_{first}"
        d = self.cfg.duration_s
        # The backlog grows by (offer − rate)·d; give it time to drain, then some.
        settle = self.cfg.settle_s + (SHAPED_OFFER - SHAPED_RATE) * d / SHAPED_RATE
        q = urllib.parse.urlencode({"topic": topic, "rate": SHAPED_RATE, "burst": SHAPED_BURST})
        broker.post(f"/srtm/bucket?{q}")
        try:
            cpu0 = broker.cpu_s()
            res = self.task(
                "paced", d + settle, addr=broker.tcp, topic=topic, rate=SHAPED_OFFER,
                duration_s=d, settle_s=settle,
            )  # fmt: skip
            self.rows[first].add_cpu("srtm", run, broker.cpu_s() - cpu0, res["received"])
            doc = broker.stats(topic)
        finally:
            self.delete_topic(broker, topic)
        srtm = next((t for t in doc["srtm"]["topics"] if t["topic"] == topic), None)
        if srtm is None:
            raise BrokerError(f"topic {topic} missing from /stats' srtm section")
        late, wait = srtm["release_lateness_ns"], srtm["token_wait_ns"]
        res.update(release_lateness_ns=late, token_wait_ns=wait, latency_ns=srtm["latency_ns"])
        self.rows[first].raw.append({"broker": "srtm", "run": run, **res})
        check_paced(res)
        if late["count"] != res["received"]:
            raise BrokerError(
                f"release_lateness count {late['count']:,} for {res['received']:,.0f} "
                "messages delivered"
            )
        figures = {"p50": late["p50"] / 1e3, "p99": late["p99"] / 1e3,
                   "wait_p50": wait["p50"] / 1e6, "wait_p99": wait["p99"] / 1e6,
                   "rate": res["rate"]}  # fmt: skip
        for figure, key in keys.items():
            self.rows[key].add("srtm", run, figures[figure])

    def idle(self, run: int, name: str) -> None:
        """The broker's CPU while idle (¹⁶): a topic with its channel and a consumer
        connected, nothing published, for the run's duration."""
        self.guarded(["idle_cpu"], f"{name}: idle, run {run + 1}", partial(self._idle, run, name))

    def _idle(self, run: int, name: str) -> None:
        broker = self.brokers[name]
        topic = f"bench_idle_{run}"
        cons = subscribe(broker.tcp, topic, CHANNEL)
        try:
            time.sleep(IDLE_SETTLE_S)  # what the SUB set going is not the idle broker's
            cpu0, t0 = broker.cpu_ns(), time.monotonic()
            time.sleep(self.cfg.duration_s)
            cpu, wall = broker.cpu_ns() - cpu0, time.monotonic() - t0
        finally:
            cons.close()
            self.delete_topic(broker, topic)
        self.rows["idle_cpu"].raw.append({"broker": name, "run": run, "cpu_ns": cpu, "s": wall})
        self.rows["idle_cpu"].add(name, run, cpu / wall / 1e6)

    def sensors(self, run: int, name: str) -> None:
        """Each of ``SENSOR_LOADS``: open-loop sensors (``benchmarks/sensors.py``) on a
        topic with one channel, no consumer."""
        for n, rate in SENSOR_LOADS:
            keys = [f"{sensor_key(n, rate)}_{q}" for q in ("p50", "p99", "p999", "held", "late")]
            what = f"{name}: {n:,} sensors at {rate:g}/s, run {run + 1}"
            self.guarded(keys, what, partial(self._sensor_load, run, name, n, rate, keys))

    def _sensor_load(self, run: int, name: str, n: int, rate: float, keys: list[str]) -> None:
        broker = self.brokers[name]
        d = sensor_duration(self.cfg.duration_s, n, rate)
        topic = f"bench_sensors{n}_{run}"
        broker.create_channel(topic)
        try:
            cpu0 = broker.cpu_s()
            res = self.task(
                "sensors", d + DRAIN_S, addr=broker.tcp, topic=topic, sensors=n, rate=rate,
                duration_s=d, size=BODY_SIZE,
            )  # fmt: skip
            self.rows[keys[0]].add_cpu(name, run, broker.cpu_s() - cpu0, res["acked"])
        finally:
            self.delete_topic(broker, topic)
        self.rows[keys[0]].raw.append({"broker": name, "run": run, **res})
        values = ("p50_us", "p99_us", "p999_us", "held", "late_p99_us")
        for key, value in zip(keys, values, strict=True):
            self.rows[key].add(name, run, res[value])

    def low_rate(self, run: int) -> None:
        """Release lateness at a sensor topic's rates: ``low_topics(rate)`` shaped topics
        at ``rate`` each (bucket ``rate``, burst 1), offered 2 % over, then ``LOW_UNDER`` ×
        (released on arrival), srtm only; first, how late the machine wakes a sleeping
        thread (the anchor of these rows). The load offered ``LOW_UNDER`` × also into
        plain topics on nsqd: its end-to-end latency, the anchor of srtm's."""
        keys = ["timer_p50", "timer_p99"]
        self.guarded(keys, f"the machine's timer, run {run + 1}", partial(self._timer, run, keys))
        broker = self.brokers["srtm"]
        for rate in LOW_RATES:
            k = f"low{rate}_"
            keys = {f: k + f for f in ("p50", "p99", "held_p99")}
            what = f"srtm: {low_topics(rate)} topics at {rate}/s offered 1.02 ×, run {run + 1}"
            self.guarded(list(keys.values()), what,
                         partial(self._low_rate, run, broker, rate, keys, 1.02))  # fmt: skip
            keys = {f: f"{k}under_{f}" for f in ("p50", "p99", "e2e_p50", "e2e_p99")}
            e2e = {f: keys[f] for f in ("e2e_p50", "e2e_p99")}
            for name in self.order(run):
                what = f"{name}: {low_topics(rate)} topics at {rate}/s offered {LOW_UNDER:g} ×"
                measure = (
                    partial(self._low_rate, run, broker, rate, keys, LOW_UNDER)
                    if name == "srtm"
                    else partial(self._plain_low_rate, run, self.brokers[name], rate, e2e)
                )
                self.guarded(list(keys.values()), f"{what}, run {run + 1}", measure)

    def _plain_low_rate(self, run: int, broker: Broker, rate: int, keys: dict[str, str]) -> None:
        """The load of ``_low_rate`` offered ``LOW_UNDER`` ×, into plain topics on
        ``broker`` (nsqd): its end-to-end ``e2e_p50`` and ``e2e_p99``."""
        d = self.cfg.duration_s
        topics = [f"bench_{keys['e2e_p99']}_{i}_{run}" for i in range(low_topics(rate))]
        try:
            cpu0 = broker.cpu_s()
            res = self.task(
                "paced_topics", d + self.cfg.settle_s, addr=broker.tcp, topics=topics,
                rate=rate * LOW_UNDER, duration_s=d, settle_s=self.cfg.settle_s,
            )  # fmt: skip
            cpu = broker.cpu_s() - cpu0
        finally:
            for t in topics:
                self.delete_topic(broker, t)
        first = keys["e2e_p50"]
        self.rows[first].raw.append({"broker": broker.name, "run": run, **res})
        self.rows[first].add_cpu(broker.name, run, cpu, res["received"])
        check_paced(res)
        for figure, key in keys.items():
            self.rows[key].add(broker.name, run, res[f"{figure}_us"])

    def _timer(self, run: int, keys: list[str]) -> None:
        res = self.task("timer_wake", TIMER_SLEEPS * TIMER_SLEEP_S * 2, sleeps=TIMER_SLEEPS,
                        sleep_s=TIMER_SLEEP_S)  # fmt: skip
        self.rows[keys[0]].raw.append({"broker": "machine", "run": run, **res})
        self.rows[keys[0]].add("srtm", run, res["p50_us"])
        self.rows[keys[1]].add("srtm", run, res["p99_us"])

    def _low_rate(
        self, run: int, broker: Broker, rate: int, keys: dict[str, str], offer: float
    ) -> None:
        """``low_topics(rate)`` topics at ``rate`` offered ``offer`` × on ``broker``: of
        the pooled lateness ``p50`` and ``p99`` and the ``held_p99`` of those held for a
        token, those ``keys`` name, each into its row (the first also gets the CPU)."""
        d = self.cfg.duration_s
        first = next(iter(keys.values()))
        topics = [f"bench_{first}_{i}_{run}" for i in range(low_topics(rate))]
        # The backlog grows by 2 % of what was offered: drained within a few periods.
        settle = self.cfg.settle_s + 0.02 * d + 3 / rate
        for t in topics:
            q = urllib.parse.urlencode({"topic": t, "rate": rate, "burst": 1})
            broker.post(f"/srtm/bucket?{q}")
        try:
            cpu0 = broker.cpu_s()
            res = self.task(
                "paced_topics", d + settle, addr=broker.tcp, topics=topics, rate=rate * offer,
                duration_s=d, settle_s=settle,
            )  # fmt: skip
            cpu = broker.cpu_s() - cpu0
            # every topic the broker holds: its section pools their releases
            doc = json.loads(broker.request("/stats?format=json&include_clients=false"))
        finally:
            for t in topics:
                self.delete_topic(broker, t)
        srtm = doc["srtm"]
        late = {x["topic"]: x["release_lateness_ns"] for x in srtm["topics"]}
        if missing := [t for t in topics if t not in late]:
            raise BrokerError(f"topics {missing} missing from /stats' srtm section")
        pooled, held = srtm["release_lateness_ns"], srtm["release_lateness_held_ns"]
        raw = {
            "lateness_ns": [late[t] for t in topics],
            "pooled_lateness_ns": pooled,
            "pooled_held_lateness_ns": held,
        }
        self.rows[first].raw.append({"broker": "srtm", "run": run, **res, **raw})
        self.rows[first].add_cpu("srtm", run, cpu, res["received"])
        if res["lost"] or res["redelivered"] or res["acked"] != res["sent"]:
            raise BrokerError(
                f"{res['sent']:,.0f} sent, {res['acked']:,.0f} acknowledged, "
                f"{res['received']:,.0f} delivered, {res['redelivered']:,.0f} redelivered"
            )
        counted = sum(late[t]["count"] for t in topics)
        if counted != res["received"] or pooled["count"] != counted:
            raise BrokerError(
                f"release lateness counted {counted:,} in the row's topics and "
                f"{pooled['count']:,} in all the broker's, of {res['received']:,.0f} delivered"
            )
        # Pooled: 40 topics of 50 releases each have no p99 of their own (the highest
        # topic's is the highest of 2,000 releases); every release of the row counts once.
        figures = {"p50": pooled["p50"], "p99": pooled["p99"], "held_p99": held["p99"]}
        figures |= {f: res[f"{f}_us"] * 1e3 for f in ("e2e_p50", "e2e_p99")}
        if "e2e_p50" in keys:
            self.rows[keys["e2e_p50"]].add_cpu("srtm", run, cpu, res["received"])
        for figure, key in keys.items():
            self.rows[key].add("srtm", run, figures[figure] / 1e3)

    def steps(self, run: int) -> Iterator[tuple[str, Callable[[], None]]]:
        """One run: each measurement on both brokers back to back (memory first, on fresh
        processes); the anchor between; the shaped topic last (srtm only)."""
        both: list[tuple[str, str, Callable[[int, str], None]]] = [
            ("memory", "memory", self.memory),
            ("memory-pub", "memory, PUB'd alone", self.memory_pub),
            ("batched", "batched publish, consume", self.batched),
            ("single", "single PUB", self.single),
            ("single-disk", "single PUB to disk", self.single_disk),
            ("node", "MPUB and single PUB into a node", self.into_node),
            ("node-disk", "single PUB into a node, to disk", self.into_node_disk),
            ("at-once", "publish and consume at once", self.at_once),
            ("latency", "end-to-end latency", self.latency),
            ("sensors", "open-loop sensors", self.sensors),
            ("idle", "idle", self.idle),
        ]
        for step, what, fn in both:
            if step not in self.cfg.only:
                continue
            for name in self.order(run):
                yield f"{name}: {what}", partial(fn, run, name)
            if fn == self.batched:
                yield "anchor: bench_writer", partial(self.on_anchor, run)
        if "shaped" in self.cfg.only:
            yield "srtm: shaped topic", partial(self.shaped, run)
        if "low-rate" in self.cfg.only:
            yield "srtm: shaped topics at low rates", partial(self.low_rate, run)
        if "nice" in self.cfg.only:
            yield f"srtm: shaped at --nice {NICE}, beside a busy loop", partial(self.nice, run)


def steps_per_run(only: tuple[str, ...]) -> int:
    """What ``Bench.steps`` yields for one run: each measurement on both brokers, the
    anchor after the batched one, the shaped topic on srtm alone."""
    return sum(1 if s in SRTM_ONLY else len(BROKERS) + (s == "batched") for s in only)


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
    if unit in ("msg/s", "bytes", "msgs"):
        return f"{value:,.0f}"
    if unit == "s" and value < 10:
        return f"{value:.2f}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def spread(values: list[float], unit: str) -> str:
    if len(values) < 2:
        return DASH
    return f"{fmt(min(values), unit)}–{fmt(max(values), unit)}"


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def goal_cell(row: Row) -> str:
    ratios = row.ratios()
    if row.ratio_goal is not None:
        text = f"≥ {row.ratio_goal:g}×"
        return f"{text} {verdict(statistics.median(ratios) >= row.ratio_goal)}" if ratios else text
    if row.ratio_max is not None:
        text = f"≤ {row.ratio_max:g}×"
        return f"{text} {verdict(statistics.median(ratios) <= row.ratio_max)}" if ratios else text
    if row.srtm_max is not None:
        text = f"srtm ≤ {row.srtm_max:,.0f} {row.unit}"
        med = row.median("srtm")
        return f"{text} {verdict(med <= row.srtm_max)}" if med is not None else text
    return row.goal_note


def build_table(rows: dict[str, Row], cfg: Config) -> Table:
    table = Table(
        title=f"srtm broker beside nsqd 1.3.0, median of {cfg.runs} run{'s' * (cfg.runs > 1)} "
        f"({platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores, {cfg.duration_s:g} s per measurement, "
        f"--mem-queue-size {cfg.mem_queue_size:,} on both)"
    )
    table.add_column("measurement", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("nsqd", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("srtm", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("srtm / nsqd", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("uvloop anchor ⁷", justify="right")
    table.add_column("goal", justify="right")
    for row in rows.values():
        cells = []
        for who in BROKERS:
            value = fmt(row.median(who), row.unit)
            failed = sum(1 for e in row.errors if e.startswith(f"{who}:"))
            if failed:
                value = f"[red]{value} ({failed} failed)[/]"
            cells += [value, spread(row.samples(who), row.unit)]
        ratios = row.ratios()
        ratio = f"{statistics.median(ratios):.2f}×" if ratios else DASH
        ratio_spread = f"{min(ratios):.2f}–{max(ratios):.2f}" if len(ratios) > 1 else DASH
        table.add_row(
            row.label,
            row.unit,
            *cells,
            ratio,
            ratio_spread,
            fmt(row.median("anchor"), row.unit),
            goal_cell(row),
            end_section=row.section_end,
        )
    return table


def build_cpu_table(rows: dict[str, Row], cfg: Config) -> Table:
    """The server's CPU per million messages, for the measurements that have it."""
    table = Table(
        title="the server's CPU per million messages (s; the broker process's CPU time, "
        "user and system, all threads, over each measurement's window) ⁸"
    )
    table.add_column("measurement", no_wrap=True)
    for name in ("nsqd", "min–max", "srtm", "min–max", "srtm / nsqd", "min–max", "goal"):
        table.add_column(name, justify="right")
    for row in rows.values():
        if not row.cpu:
            continue
        cells = []
        for who in BROKERS:
            med = row.median(who, "cpu")
            cells += [fmt(med, "s"), spread(row.samples(who, "cpu"), "s")]
        ratios = row.ratios("cpu")
        ok = f" {verdict(statistics.median(ratios) <= 1.0)}" if ratios else ""
        table.add_row(
            row.cpu_label or row.label.strip(),
            *cells,
            f"{statistics.median(ratios):.2f}×" if ratios else DASH,
            f"{min(ratios):.2f}–{max(ratios):.2f}" if len(ratios) > 1 else DASH,
            f"≤ 1.0×{ok}" if ratios else "",
        )
    return table


def footnotes(cfg: Config) -> list[str]:
    d = f"{cfg.duration_s:g} s"
    sensor_loads = ", ".join(
        f"{n:,} at {r:g}/s: {sensor_duration(cfg.duration_s, n, r):g} s" for n, r in SENSOR_LOADS
    )
    return [
        f"Messages of {BODY_SIZE} bytes. Each run starts both brokers fresh on 127.0.0.1 with "
        f"--mem-queue-size {cfg.mem_queue_size:,} (as nsq's bench.sh) and otherwise defaults, "
        "and measures each row on both back to back (which goes first swaps every run); "
        "srtm / nsqd is the median of the per-run ratios. Load tools and brokers share the "
        f"machine's cores. nsqd: {cfg.nsqd}.",
        f"¹ NSQ's bench_writer --size={BODY_SIZE} --runfor={d} (one connection per core, each "
        f"waiting for its OK), --batch-size={MPUB_BATCH} (MPUB) or 1 (PUB); its ops/s.",
        f"² bench_writer's backlog (the topic has one channel, created first), then "
        f"bench_reader --rdy={RDY} --runfor={d} on that channel; its ops/s (if the backlog "
        "ran out, a lower bound: noted under the table).",
        f"³ bench_writer (MPUB-{MPUB_BATCH}) and bench_reader on a fresh topic at once for {d}. "
        "The tools share the cores with the broker: their CPU is given after the tables.",
        f"⁴ our generator, one process: a publisher sending PUBs on an absolute schedule with "
        "time.time_ns() in the body, and a consumer (RDY 2500, FIN each) on the same loop; "
        "latency = read time − send stamp, every message. The rate is half of what srtm "
        f"carried in and out at once (³, min of the two) in the same run, at most "
        f"{cfg.e2e_max_rate:,}/s (past that the generator's own delays dominate); nsqd gets "
        "the same rate.",
        f"⁵ srtm only (nsqd has no shaping): POST /srtm/bucket rate={SHAPED_RATE} "
        f"burst={SHAPED_BURST}; paced as ⁴ at {SHAPED_OFFER:,}/s (2 % over the rate, so the "
        "bucket stays busy); lateness (dispatch − GCRA release time) and token wait (release "
        "− arrival) from srtm's /stats after the backlog drained.",
        f"⁶ the first measurement on each fresh broker: growth of its resident set (VmRSS) "
        f"while {MEM_MSGS:,} messages are published (our generator, MPUB-{MPUB_BATCH}) into a "
        "topic with one channel until the channel's depth reaches them, divided by their "
        "number. Includes what the runtime holds beyond live data (Go's GC headroom, "
        "Python's allocator).",
        "⁷ a minimal uvloop server in its own process that reads each command and answers "
        "OK, keeping nothing, under the same bench_writer: the ceiling for a Python server "
        "on this machine.",
        "⁸ the process's CPU-time clock (ns, ended threads included) read just before and "
        "after each measurement's load, divided by the messages it carried: bench_writer's "
        "or bench_reader's count; at once, those published (each also consumed); the "
        "paced rows (⁴, ⁵), those delivered, their settling time included; the memory row, "
        "the messages queued.",
        "⁹ benchmarks/sensors.py, one process on uvloop: one connection per sensor, each "
        "sending one PUB and waiting for its OK, on a fixed schedule spread evenly over the "
        f"sensors and the second (open loop), for {d} or as long as {SENSOR_MIN_PUBS:,} PUBs "
        f"take ({sensor_loads}), into a topic with one channel and no "
        "consumer; PUB→OK from the send to the OK's read. A PUB due while its sensor's last "
        "one is unanswered goes out with that OK (held: the broker's doing). The "
        "generator's lateness (send − due, PUBs not held) shows a disturbed run. It sleeps "
        "between sends on a timerfd, as sensors do between readings (its CPU per PUB is in "
        "the JSON: generator_cpu_us_per_pub): its wake-up for each OK is in the round trip, "
        "for both brokers alike.",
        f"¹⁰ srtm only: {LOW_TOTAL_RATE} msg/s in all as N topics of the row's rate (10/s: 40 "
        "topics), each with a bucket of that rate and burst 1, offered 2 % over it by one "
        "publisher connection round the topics, a consumer per topic; release lateness from "
        "/stats after the backlogs drained, every release of the row's topics counted once "
        "(srtm.release_lateness_ns; each topic's own is in the JSON: at 10/s a topic has "
        "50 releases, too few for a p99 of its own); then those held for a token alone "
        "(srtm.release_lateness_held_ns): each topic's first release is due on arrival "
        "(its bucket starts full), as late as the read that takes it, 2 % of the 10/s row. "
        f"Then the same topics offered {LOW_UNDER:g} × their rate (a sensor topic inside "
        "its envelope): each message finds its token and is released in the read that "
        "brings it, after the broker slept (nothing due to spin for), so its lateness is "
        "the loop's wake-up and the read's work up to the dispatch.",
        f"¹¹ in the generator's process, with the brokers idle, before the rows ¹⁰: "
        f"{TIMER_SLEEPS:,} sleeps of {TIMER_SLEEP_S * 1e3:g} ms with 1 ns of timer slack (as "
        "srtm's release timer), each one's wake-up past its end. A broker that sleeps between "
        "releases wakes this late unless it spins (--release-spin-us, lengthened to how late "
        "its timer has been, up to 1 ms); shown in the srtm column. A run where its p99 is "
        f"over {DISTURBED_TIMER_P99_US:,.0f} µs is called disturbed (the line after the "
        "tables).",
        f"¹² as ¹ with --batch-size=1, on a fresh pair of brokers at their default "
        f"--mem-queue-size ({DEFAULT_MEM_QUEUE_SIZE:,}): past that, each PUB's OK waits for "
        "its write to the disk queue (the OS holds it: kill -9 keeps it, as with nsqd).",
        f"¹³ as ¹, into a fresh srtm node --brokers {NODE_PROCESSES} "
        "--shared-address (one process a core, each pinned to its CPU, the node dealing "
        "connections to them in turn) beside the run's nsqd, which uses every core itself; "
        "srtm's CPU is the node's and all its processes'. The row to disk: a fresh node and a "
        "fresh nsqd, each at its default --mem-queue-size, as ¹².",
        f"¹⁴ srtm only: the 2 % over rows of ⁵ and ¹⁰ on a fresh srtm broker started with "
        f"--nice {NICE} (the highest priority an ordinary program can take, for the broker "
        "and its session; below 0 needs CAP_SYS_NICE); then the same beside a process "
        "spinning on a CPU (Python's `while True: pass`, at nice 0: a busy program "
        "sharing the machine), on the run's broker (nice 0) and on that one. The rows "
        f"offered {LOW_UNDER:g} × are measured at --nice {NICE} too, without the busy loop. "
        "Only srtm is raised: nothing here compares it with nsqd.",
        f"¹⁵ the load of ¹⁰ offered {LOW_UNDER:g} ×, each body carrying its send stamp (as "
        "⁴): into srtm's shaped topics (each message released on arrival) and, on the run's "
        "nsqd, into the same topics unshaped; the consumer's read − the send stamp, every "
        "message, in the generator's one process (its own wake-ups count alike for both). "
        "The anchor of the rows released on arrival, which count from the kernel's arrival "
        "stamp to the dispatch: nsqd has no such figure.",
        f"¹⁶ each broker of the run with a topic, its channel and a consumer connected "
        f"(RDY 0), nothing published: the CPU time it used over {d} (its CPU-time clock, "
        f"⁸), a second after the SUB, divided by the seconds.",
    ]


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "src"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty src" if dirty else "")


#: A KVM guest's idle driver polls this long before it halts (the kernel's ``haltpoll``).
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def guest_halt_poll_ns() -> int | None:
    """How long an idle CPU of this (KVM) guest polls before halting, None where the
    guest has no ``haltpoll``. At 0 every idle CPU halts, and each wake-up of a process
    waiting on another core is an interrupt through the host: the round trip of a
    single PUB is made of such wake-ups (docs/results/broker.md, "The machine's
    wake-ups")."""
    try:
        return int(HALT_POLL.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Disturbance:
    """Whether a sitting's runs were disturbed: how late the machine woke a sleeping
    thread at p99 in each run (¹¹, measured before its shaped rows; none without
    ``low-rate``), and the share of the sitting's CPU time the hypervisor stole."""

    timer_p99_us: dict[int, float]
    steal_share: float | None

    @property
    def disturbed_runs(self) -> list[int]:
        return sorted(r for r, p99 in self.timer_p99_us.items() if p99 > DISTURBED_TIMER_P99_US)

    def text(self) -> str:
        limit = f"{DISTURBED_TIMER_P99_US:,.0f} µs"
        late = sorted(self.timer_p99_us.values())
        if not late:
            verdict = "not known if disturbed: the machine's timer was not probed (no low-rate)"
        elif runs := self.disturbed_runs:
            worst = ", ".join(f"{self.timer_p99_us[r]:,.0f}" for r in runs)
            verdict = (
                f"disturbed: run {', '.join(str(r + 1) for r in runs)} of {len(late)} (the "
                f"machine woke a sleeping thread {worst} µs late at p99, over {limit})"
            )
        else:
            verdict = (
                f"quiet: the machine woke a sleeping thread at most {limit} late at p99 in "
                f"every run ({late[0]:,.0f}–{late[-1]:,.0f} µs)"
            )
        if self.steal_share is not None:
            verdict += f"; {self.steal_share:.2%} of the CPU time stolen"
        return verdict

    def doc(self) -> dict[str, Any]:
        return {
            "timer_p99_limit_us": DISTURBED_TIMER_P99_US,
            "timer_p99_us": self.timer_p99_us,
            "disturbed_runs": self.disturbed_runs,
            "steal_share": self.steal_share,
        }


def disturbance(rows: dict[str, Row], start: host.Sample) -> Disturbance:
    timer = rows["timer_p99"].values.get("srtm", {}) if "timer_p99" in rows else {}
    steal = host.between(start, host.take([]), os.cpu_count() or 1).steal
    return Disturbance(dict(timer), steal)


def halt_poll_text() -> str:
    ns = guest_halt_poll_ns()
    return "no guest halt polling module" if ns is None else f"guest_halt_poll_ns {ns:,}"


def write_json(path: Path, bench: Bench, cfg: Config, disturbed: Disturbance) -> None:
    doc = {
        "python": sys.version,
        "platform": platform.platform(),
        "guest_halt_poll_ns": guest_halt_poll_ns(),
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "revision": git_revision(),
        "config": asdict(cfg),
        "rows": {
            k: {
                "label": r.label.strip(),
                "unit": r.unit,
                "median": {who: r.median(who) for who in (*BROKERS, "anchor")},
                "values": r.values,
                "ratios": r.ratios(),
                "cpu_s_per_million": {
                    "median": {who: r.median(who, "cpu") for who in BROKERS},
                    "values": r.cpu,
                    "ratios": r.ratios("cpu"),
                },
                "raw": r.raw,
                "errors": r.errors,
                "notes": r.notes,
            }
            for k, r in bench.rows.items()
        },
        "problems": bench.problems,
        "disturbance": disturbed.doc(),
        "ping_after_delete_s": bench.settle_s,
    }
    path.write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")


# == main =================================================================================

app = typer.Typer(add_completion=False)


@app.command()
def main(
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds per measurement (default 5; 1 with --quick)."),
    ] = None,
    runs: Annotated[
        int | None, typer.Option(min=1, help="Runs; medians over them (default 3; 1 --quick).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smoke run of a few seconds.")] = False,
    nsqd: Annotated[
        Path | None,
        typer.Option(
            help="nsqd binary, bench_writer and bench_reader beside it "
            "(default: ../shared/anchors/nsq-1.3.0/nsqd)."
        ),
    ] = None,
    mem_queue_size: Annotated[
        int, typer.Option(min=0, help="--mem-queue-size of both brokers.")
    ] = MEM_QUEUE_SIZE,
    e2e_max_rate: Annotated[
        int, typer.Option(min=100, help="Highest rate for the end-to-end latency row.")
    ] = E2E_MAX_RATE,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the raw numbers to this file.")
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Run only these measurements (repeat the option): {', '.join(STEP_NAMES)}."
        ),
    ] = None,
) -> None:
    """nsqd 1.3.0 and the srtm broker side by side: bench_writer (MPUB, PUB), bench_reader,
    both at once, end-to-end latency, memory per queued message, open-loop sensors' PUB→OK,
    and the shaped topic's release lateness at 10,000/s and at 10–400/s (srtm only)."""
    unknown = sorted(set(only or ()) - set(STEP_NAMES))
    if unknown:
        raise typer.BadParameter(
            f"{', '.join(unknown)}: not a measurement (one of {', '.join(STEP_NAMES)})",
            param_hint="--only",
        )
    nsqd_binary = find_nsqd(nsqd)
    cfg = Config(
        duration_s=duration if duration is not None else (1.0 if quick else 5.0),
        runs=runs if runs is not None else (1 if quick else 3),
        mem_queue_size=mem_queue_size,
        settle_s=1.0 if quick else 2.0,
        e2e_max_rate=e2e_max_rate,
        nsqd=str(nsqd_binary),
        only=tuple(s for s in STEP_NAMES if only is None or s in only),
    )
    console = Console(width=max(Console().width, 200))
    log = Console(stderr=True, log_path=False)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="srtm-bench-"))
    machine_at_start = host.take([])
    gen: Generator | None = None
    try:
        gen = Generator(None)
        with anchor_server(None) as (anchor, _kind):
            bench = Bench(cfg, nsqd_binary, workdir, gen, anchor, log)
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=log, transient=True) as progress:
                task = progress.add_task("starting", total=cfg.runs * steps_per_run(cfg.only))
                for run in range(cfg.runs):
                    progress.update(task, description=f"run {run + 1}: starting the brokers")
                    with bench.started(run):
                        for name, step in bench.steps(run):
                            progress.update(task, description=f"run {run + 1}: {name}")
                            step()
                            progress.advance(task)
    finally:
        if gen is not None:
            gen.close()
        shutil.rmtree(workdir, ignore_errors=True)
    disturbed = disturbance(bench.rows, machine_at_start)
    if json_path is not None:  # first: a closed stdout must not cost the numbers
        write_json(json_path, bench, cfg, disturbed)
    console.print(build_table(bench.rows, cfg))
    console.print(build_cpu_table(bench.rows, cfg))
    for row in bench.rows.values():
        for note in row.notes:
            console.print(f"{row.key}: {note}", highlight=False)
    for name, times in bench.settle_s.items():
        if times:
            console.print(
                f"{name}: after each topic deletion (+50 ms), /ping answered in at most "
                f"{max(times) * 1e3:,.1f} ms (median {statistics.median(times) * 1e3:,.1f} ms), "
                "kept out of the measurements",
                highlight=False,
            )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    console.print(
        f"revision {git_revision()}; load average at the end {load}; {halt_poll_text()}",
        highlight=False,
    )
    console.print(disturbed.text(), highlight=False)
    if (tools := tools_at_once_text(bench.rows)) is not None:
        console.print(tools, highlight=False)
    for note in footnotes(cfg):
        console.print(note, highlight=False)
    for problem in bench.problems:
        console.print(f"[red]problem:[/] {problem}", highlight=False)
    if bench.problems:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
