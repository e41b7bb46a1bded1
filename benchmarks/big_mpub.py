"""/ping while a broker takes one 5 MiB MPUB of one-byte messages (issue 29, item 5).

Taken in one loop turn, such an MPUB (a million messages) stalled the broker for seconds;
now it is taken in slices, and the target is that the broker answers ``/ping`` within
50 ms while it takes it, shaped or not. Each row starts its broker fresh (127.0.0.1,
ephemeral ports, a temporary data directory, default settings) and a child process
pings it (``GET /ping`` on one keep-alive connection, ``--ping-interval-ms`` between an
answer and the next request) while this process sends the MPUB and waits for its OK.

Rows, each measured in every run:

- srtm, **idle**: /ping for 1 s with no MPUB (the anchor: what /ping costs here);
- srtm, TCP ``MPUB`` and HTTP ``/mpub?binary=true``, each **unshaped** (a topic with one
  channel) and **shaped** (a sub-bucket of 100 msg/s, burst 10, by ``POST /srtm/bucket``
  as the controller does: every message is booked on the topic's meter as it is taken);
- nsqd 1.3.0 (``../shared/anchors/nsq-1.3.0/nsqd`` beside this checkout or the main
  checkout, or ``--nsqd PATH``) at its defaults: idle, TCP and HTTP, a topic with one
  channel (the anchor a user compares to).

The MPUB has ``--messages`` one-byte messages: by default as many as fit in nsqd's
default ``--max-body-size`` (5 MiB, 5,242,880 bytes; the srtm broker has the same
limit): 1,048,575, a body of 5,242,879 bytes. Per row: how long the MPUB took from its
first byte sent to its OK; /ping p50, p99 and max over the pings that overlap that
window; how many were answered inside it; and in how many runs every one of them was
within 50 ms. Medians of ``--runs`` runs, with their range. The machine's CPUs and load
average before and after are printed; a run that started with a load average above the
number of CPUs is reported as disturbed. Every process started here is stopped at the
end, on Ctrl-C, SIGTERM and errors too.

    .venv/bin/python benchmarks/big_mpub.py [--runs 3] [--messages N] [--ping-interval-ms 2]
"""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

# benchmarks/broker.py: where NSQ 1.3.0 is found beside this checkout (or a worktree's)
from broker import nsq_dirs, start_nsqd
from srtm.launch import BrokerProcess, die_with_parent, start_broker
from srtm.protocol import MAGIC_V2

REPO = Path(__file__).resolve().parent.parent
#: nsqd 1.3.0's default --mem-queue-size.
NSQD_MEM_QUEUE_SIZE = 10_000
#: nsqd's default --max-body-size (and the srtm broker's limit).
MAX_BODY = 5 * 1024 * 1024
#: One-byte messages in a body of at most MAX_BODY: a 4-byte count, then 4 + 1 each.
MAX_MESSAGES = (MAX_BODY - 4) // 5
TARGET_MS = 50.0
IDLE_S = 1.0
SHAPED_RATE, SHAPED_BURST = 100, 10
TOPIC, CHANNEL = "big", "c"
#: No MPUB waits longer than this for its answer (shaped, before slicing: 10 s).
MPUB_TIMEOUT_S = 120.0
#: One /ping slower than this is a failure (and the pinger reconnects).
PING_TIMEOUT_S = 30.0

_SIZE = struct.Struct(">l")
_HEADER = struct.Struct(">ll")
FRAME_RESPONSE, FRAME_ERROR = 0, 1


class BenchError(RuntimeError):
    """A broker refused the MPUB, took fewer messages, or did not answer in time."""


# == the pinger (a child process) ==========================================================


def pinger_main(conn: Connection) -> None:
    """Child: for each (host, port, interval_s) sent, GET /ping until told to stop, then
    send back each one's (start, latency, ok); ``start`` is ``time.monotonic()``, which
    every process on the host shares. ``None`` ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        conn.send(_ping_until_told(conn, *job))


def _ping_until_told(
    conn: Connection, host: str, port: int, interval_s: float
) -> list[tuple[float, float, bool]]:
    pings: list[tuple[float, float, bool]] = []
    client = http.client.HTTPConnection(host, port, timeout=PING_TIMEOUT_S)
    try:
        while not conn.poll():
            start = time.monotonic()
            try:
                client.request("GET", "/ping")
                resp = client.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                client.close()  # the next request reconnects
            pings.append((start, time.monotonic() - start, ok))
            if len(pings) == 1:
                conn.send("first")
            time.sleep(interval_s)
        conn.recv()  # the stop
    finally:
        client.close()
    return pings


class Pinger:
    """The pinger process, started once; ``pinging`` runs one row's pings."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=pinger_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    @contextlib.contextmanager
    def pinging(
        self, addr: tuple[str, int], interval_s: float
    ) -> Iterator[list[tuple[float, float, bool]]]:
        """Pings ``addr`` from the first answer on; the list yielded is filled at exit."""
        out: list[tuple[float, float, bool]] = []
        self.conn.send((*addr, interval_s))
        try:
            if not self.conn.poll(PING_TIMEOUT_S + 5):
                raise BenchError("the pinger got no first answer")
            self.conn.recv()  # "first"
            yield out
        finally:
            self.conn.send("stop")
            while True:  # its pings (after "first", if that had not come yet)
                if not self.conn.poll(PING_TIMEOUT_S + 5):
                    raise BenchError("the pinger did not stop")
                if isinstance(got := self.conn.recv(), list):
                    out += got
                    break

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


# == the brokers ===========================================================================


@dataclass
class Broker:
    """nsqd or srtm broker as a child process; the same HTTP calls reach both."""

    name: str
    tcp: tuple[str, int]
    http: tuple[str, int]
    stop: Callable[[], None]
    headers: dict[str, str]

    def request(self, path: str, method: str = "GET") -> bytes:
        url = f"http://{self.http[0]}:{self.http[1]}{path}"
        body = b"" if method == "POST" else None
        req = urllib.request.Request(url, data=body, method=method, headers=self.headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            data: bytes = resp.read()
            return data

    def message_count(self) -> int:
        doc = json.loads(self.request(f"/stats?format=json&topic={TOPIC}"))
        found = [t for t in doc["topics"] if t["topic_name"] == TOPIC]
        return int(found[0]["message_count"]) if found else 0


def find_nsqd(path: Path | None) -> Path:
    candidates = [path] if path is not None else [d / "nsqd" for d in nsq_dirs()]
    for nsqd in candidates:
        if nsqd.is_file() and os.access(nsqd, os.X_OK):
            return nsqd.resolve()
    raise typer.BadParameter(f"no nsqd: {', '.join(str(c) for c in candidates)}")


@contextlib.contextmanager
def nsqd_started(binary: Path, workdir: Path) -> Iterator[Broker]:
    """nsqd at its defaults, bar the addresses and the data path (benchmarks/broker.py
    starts it; its default memory queue, 10,000, given as it is)."""
    try:
        nsqd = start_nsqd(binary, workdir, NSQD_MEM_QUEUE_SIZE)
    except RuntimeError as exc:  # it did not start: this row fails, as before
        raise BenchError(str(exc)) from exc

    def stop() -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            nsqd.stop()

    try:
        yield Broker("nsqd", nsqd.tcp, nsqd.http, stop, {})
    finally:
        stop()


@contextlib.contextmanager
def srtm_started(workdir: Path) -> Iterator[Broker]:
    """``srtm broker`` at its defaults, with a cluster token for ``/srtm/bucket``."""
    bp: BrokerProcess = start_broker(
        workdir / "srtm-data",
        stderr=subprocess.DEVNULL,
        new_session=True,
        preexec_fn=die_with_parent,
    )

    def stop() -> None:
        # Killed if it takes longer to save (a shaped topic holds the whole MPUB).
        with contextlib.suppress(subprocess.TimeoutExpired):
            bp.stop(60)

    try:
        yield Broker("srtm", bp.tcp, bp.http, stop, bp.headers)
    finally:
        stop()


# == the MPUB ===============================================================================


def mpub_body(n: int) -> bytes:
    """nsqd's binary MPUB body: a count, then ``n`` one-byte messages (size, byte)."""
    return _SIZE.pack(n) + b"\x00\x00\x00\x01x" * n


def mpub_tcp(broker: Broker, body: bytes) -> tuple[float, float]:
    """One MPUB over TCP: when its first byte was sent and when its OK came (monotonic)."""
    frame = MAGIC_V2 + f"MPUB {TOPIC}\n".encode() + _SIZE.pack(len(body)) + body
    with socket.create_connection(broker.tcp, timeout=MPUB_TIMEOUT_S) as sock:
        sent = time.monotonic()
        sock.sendall(frame)
        while True:
            size, kind = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
            data = _recv_exactly(sock, size - 4)
            if kind == FRAME_RESPONSE and data == b"_heartbeat_":
                sock.sendall(b"NOP\n")
                continue
            if kind != FRAME_RESPONSE or data != b"OK":
                raise BenchError(f"{broker.name} answered the MPUB with {data[:200]!r}")
            return sent, time.monotonic()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise BenchError(f"no answer to the MPUB in {MPUB_TIMEOUT_S:g} s") from None
        if not chunk:
            raise BenchError("the broker closed the connection")
        buf += chunk
    return bytes(buf)


def mpub_http(broker: Broker, body: bytes) -> tuple[float, float]:
    """One ``POST /mpub?binary=true``: when the request began and when its answer came."""
    client = http.client.HTTPConnection(*broker.http, timeout=MPUB_TIMEOUT_S)
    try:
        sent = time.monotonic()
        client.request(
            "POST",
            f"/mpub?topic={TOPIC}&binary=true",
            body=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        resp = client.getresponse()
        answer = resp.read()
        acked = time.monotonic()
    except TimeoutError:
        raise BenchError(f"no answer to /mpub in {MPUB_TIMEOUT_S:g} s") from None
    finally:
        client.close()
    if resp.status != 200:
        raise BenchError(f"{broker.name} answered /mpub with {resp.status} {answer[:200]!r}")
    return sent, acked


# == one row ===============================================================================


@dataclass(frozen=True)
class Row:
    label: str
    broker: str  # "srtm" or "nsqd"
    how: str  # "idle", "tcp" or "http"
    shaped: bool = False


ROWS = [
    Row("srtm, idle (anchor)", "srtm", "idle"),
    Row("srtm, TCP MPUB, unshaped", "srtm", "tcp"),
    Row(f"srtm, TCP MPUB, shaped ({SHAPED_RATE}/s, burst {SHAPED_BURST})", "srtm", "tcp", True),
    Row("srtm, HTTP /mpub, unshaped", "srtm", "http"),
    Row("srtm, HTTP /mpub, shaped", "srtm", "http", True),
    Row("nsqd 1.3.0, idle", "nsqd", "idle"),
    Row("nsqd 1.3.0, TCP MPUB", "nsqd", "tcp"),
    Row("nsqd 1.3.0, HTTP /mpub", "nsqd", "http"),
]


@dataclass
class Result:
    took_s: float | None  # None: the idle row
    p50_ms: float
    p99_ms: float
    max_ms: float
    answered: int  # pings answered inside the window
    within: bool  # every ping overlapping the window answered, within TARGET_MS


def measure(row: Row, broker: Broker, pinger: Pinger, body: bytes, interval_s: float) -> Result:
    n = _SIZE.unpack_from(body)[0]
    if row.how != "idle":
        if row.shaped:
            broker.request(
                f"/srtm/bucket?topic={TOPIC}&rate={SHAPED_RATE}&burst={SHAPED_BURST}", "POST"
            )
        else:
            broker.request(f"/topic/create?topic={TOPIC}", "POST")
            broker.request(f"/channel/create?topic={TOPIC}&channel={CHANNEL}", "POST")
    with pinger.pinging(broker.http, interval_s) as pings:
        time.sleep(0.05)  # a few pings before it, so the window starts with the pinger going
        if row.how == "idle":
            sent = time.monotonic()
            time.sleep(IDLE_S)
            acked = time.monotonic()
        elif row.how == "tcp":
            sent, acked = mpub_tcp(broker, body)
        else:
            sent, acked = mpub_http(broker, body)
    if row.how != "idle" and (taken := broker.message_count()) != n:
        raise BenchError(f"{broker.name} acknowledged the MPUB and took {taken:,} of {n:,}")
    # The pings that overlap the window: one stuck across all of it counts.
    overlap = [(lat, ok) for start, lat, ok in pings if start < acked and start + lat > sent]
    inside = sum(1 for start, lat, ok in pings if ok and start >= sent and start + lat <= acked)
    if not overlap:
        raise BenchError("no /ping overlapped the MPUB")
    ms = np.array([lat for lat, _ in overlap]) * 1e3
    return Result(
        took_s=None if row.how == "idle" else acked - sent,
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
        max_ms=float(ms.max()),
        answered=inside,
        within=all(ok for _, ok in overlap) and float(ms.max()) <= TARGET_MS,
    )


def run_row(row: Row, nsqd: Path, pinger: Pinger, body: bytes, interval_s: float) -> Result:
    with tempfile.TemporaryDirectory(prefix="srtm-big-mpub-") as tmp:
        started = srtm_started(Path(tmp)) if row.broker == "srtm" else nsqd_started(nsqd, Path(tmp))
        with started as broker:
            return measure(row, broker, pinger, body, interval_s)


# == report ================================================================================


def _cell(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    med = f"{statistics.median(values):{fmt}}"
    return med if len(values) == 1 else f"{med} ({min(values):{fmt}}–{max(values):{fmt}})"


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def report(results: dict[Row, list[Result]], args: dict[str, Any]) -> Table:
    n, runs = args["messages"], args["runs"]
    table = Table(
        title=f"/ping every {args['interval_ms']:g} ms while one broker takes one MPUB of "
        f"{n:,} one-byte messages (body {4 + 5 * n:,} bytes; nsqd's default --max-body-size "
        f"{MAX_BODY:,}); fresh broker per row, default settings; medians of {runs} "
        f"run{'s' * (runs > 1)} (range)"
    )
    for c in ("row", "MPUB acked in s", "/ping p50 ms", "p99 ms", "max ms",
              "pings during it", f"every /ping ≤ {TARGET_MS:g} ms"):  # fmt: skip
        table.add_column(c, justify="left" if c == "row" else "right")
    for row, after in zip(ROWS, [*ROWS[1:], None], strict=True):
        rs = results[row]
        ok = sum(r.within for r in rs)
        verdict = f"[{'green' if rs and ok == len(rs) else 'red'}]{ok}/{len(rs)} runs[/]"
        table.add_row(
            row.label,
            _cell([r.took_s for r in rs if r.took_s is not None], ".2f"),
            _cell([r.p50_ms for r in rs], ".1f"),
            _cell([r.p99_ms for r in rs], ".1f"),
            _cell([r.max_ms for r in rs], ".1f"),
            _cell([float(r.answered) for r in rs], ",.0f"),
            verdict if rs else "—",
            end_section=after is not None and after.broker != row.broker,
        )
    return table


# == main ==================================================================================


def main(
    runs: Annotated[int, typer.Option(min=1, help="Runs of every row; medians and ranges")] = 3,
    messages: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_MESSAGES,
            help="One-byte messages in the MPUB (default: what fits in 5 MiB, nsqd's "
            "default --max-body-size)",
        ),
    ] = MAX_MESSAGES,
    ping_interval_ms: Annotated[
        float, typer.Option(min=0, help="Pause between a /ping's answer and the next (ms)")
    ] = 2.0,
    nsqd: Annotated[
        Path | None, typer.Option(help="nsqd binary (default: ../shared/anchors/nsq-1.3.0/nsqd)")
    ] = None,
) -> None:
    """/ping's latency on srtm and nsqd while each takes one big MPUB (TCP and HTTP,
    shaped and not), with an idle anchor, in every run."""
    nsqd_binary = find_nsqd(nsqd)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cpus = os.cpu_count() or 1
    load_before = _load()
    body = mpub_body(messages)
    interval_s = ping_interval_ms / 1e3
    results: dict[Row, list[Result]] = {row: [] for row in ROWS}
    problems: list[str] = []
    disturbed: list[str] = []
    pinger = Pinger()
    try:
        for i in range(runs):
            load1 = os.getloadavg()[0]
            if load1 > cpus:
                disturbed.append(f"run {i + 1} started at load average {load1:.2f}")
            for row in ROWS:
                try:
                    r = run_row(row, nsqd_binary, pinger, body, interval_s)
                except (BenchError, OSError) as exc:
                    problems.append(f"run {i + 1}, {row.label}: {exc}")
                    print(f"run {i + 1}/{runs}: {row.label}: {exc}", file=sys.stderr)
                    continue
                results[row].append(r)
                took = "" if r.took_s is None else f"acked in {r.took_s:.2f} s, "
                line = f"/ping p99 {r.p99_ms:.1f} ms, max {r.max_ms:.1f} ms, {r.answered} during"
                print(f"run {i + 1}/{runs}: {row.label}: {took}{line}", file=sys.stderr)
    finally:
        pinger.close()
    console = Console(width=max(Console().width, 160))
    console.print(report(results, dict(messages=messages, runs=runs, interval_ms=ping_interval_ms)))
    notes = [
        f"machine: {cpus} CPUs, {platform.platform()}, python {platform.python_version()}; "
        f"load average before {load_before}, after {_load()}",
        "disturbed: " + "; ".join(disturbed) + f" (above {cpus} CPUs)"
        if disturbed
        else f"not disturbed: every run started at a load average at or below {cpus} CPUs",
        f"/ping p50, p99, max: the pings that overlap the MPUB's window (first byte sent → "
        f"OK; idle rows: {IDLE_S:g} s); 'pings during it': answered inside it. Shaped: "
        f"POST /srtm/bucket rate={SHAPED_RATE} burst={SHAPED_BURST}; unshaped and nsqd: a "
        f"topic with one channel. nsqd: {nsqd_binary}.",
        f"target (issue 29): srtm answers every /ping within {TARGET_MS:g} ms while it takes "
        "the MPUB, shaped or not",
    ]
    for note in notes:
        console.print(note, highlight=False)
    for problem in problems:
        console.print(f"[red]problem:[/] {problem}", highlight=False)
    if problems:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
