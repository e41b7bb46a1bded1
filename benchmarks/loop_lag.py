"""How long the broker's event loop is held while its queues go through disk.

The broker writes overflowing messages to its disk queues with plain ``write(2)`` calls
(batched, page cache) and reads them back; that file work runs on its disk thread, but a
publish's small write to an open segment, which runs on the loop
(``--disk-inline-write-bytes``; the third mode turns it off). This measures what it costs
the loop (before the disk thread it was all on the loop): a probe on the broker's
loop sleeps 1 ms over and over and records how late it wakes (loop lag), and every call
into a disk queue is timed. The anchor, in the same run, is the same load with queues in
memory (nothing touches the disk): the difference is the disk's share of the lag.

Load: a child process publishes MESSAGES 100-byte messages at 10,000/s (each millisecond
an MPUB of 5 and 5 single PUBs) to one topic while a consumer drains it with FIN.

    .venv/bin/python benchmarks/loop_lag.py [--runs 3] [--messages 100000]
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from srtm.broker import Broker, BrokerOptions
from srtm.broker.disk import DiskQueue
from srtm.protocol import MAGIC_V2, Fin, FrameReader, FrameType, Mpub, Pub, Rdy, Sub, decode_message
from srtm.protocol.commands import encode_command

BODY = b"x" * 100


def _load(port: int, messages: int, done: Any) -> None:
    """Child process: publish ``messages`` at 10,000/s and consume them all (FIN each)."""
    pub = socket.create_connection(("127.0.0.1", port))
    sub = socket.create_connection(("127.0.0.1", port))
    for s in (pub, sub):
        s.sendall(MAGIC_V2)
    sub.sendall(encode_command(Sub("t", "c")) + encode_command(Rdy(1000)))
    sub.settimeout(0.0005)
    # Every millisecond one MPUB of 5 and 5 single PUBs: paced, so the lag shows stalls
    # rather than a loop saturated by a flood.
    tick = encode_command(Mpub("t", [BODY] * 5)) + encode_command(Pub("t", BODY)) * 5
    start, sent, got, frames = time.perf_counter(), 0, 0, FrameReader()
    while got < messages:
        due = int((time.perf_counter() - start) * 1000) + 1
        while sent < messages and sent < due * 10:
            pub.sendall(tick)
            sent += 10
        try:
            data = sub.recv(1 << 20)
        except TimeoutError:
            continue
        fins = []
        for frame in frames.feed(data):
            if frame.kind is FrameType.MESSAGE:
                fins.append(encode_command(Fin(decode_message(frame.data).id)))
                got += 1
        if fins:
            sub.sendall(b"".join(fins))
    done.set()
    pub.close()
    sub.close()


def _timed(durations: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - t)

    return wrapper


async def _one(mem_queue_size: int, inline_bytes: int, messages: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        opts = BrokerOptions(
            tcp_port=0, http_port=0, data_dir=Path(tmp), mem_queue_size=mem_queue_size,
            disk_inline_write_bytes=inline_bytes,
        )  # fmt: skip
        broker = Broker(opts)
        await broker.start()
        assert broker.tcp_address is not None
        lags: list[float] = []
        disk_calls: list[float] = []
        originals = {name: getattr(DiskQueue, name) for name in ("flush", "pop", "push", "written")}
        for name, fn in originals.items():
            setattr(DiskQueue, name, _timed(disk_calls, fn))
        done = multiprocessing.Event()
        child = multiprocessing.Process(
            target=_load, args=(broker.tcp_address[1], messages, done), daemon=True
        )
        try:
            t0 = time.perf_counter()
            child.start()
            while not done.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - t - 0.001)
            elapsed = time.perf_counter() - t0
        finally:
            for name, fn in originals.items():
                setattr(DiskQueue, name, fn)
            child.join(10)
            if child.is_alive():
                child.kill()
            await broker.stop()
    lag = np.array(lags) * 1e6
    calls = np.array(disk_calls or [0.0]) * 1e6
    return {
        "rate": messages / elapsed,
        "lag_p50": float(np.percentile(lag, 50)),
        "lag_p99": float(np.percentile(lag, 99)),
        "lag_max": float(lag.max()),
        "disk_calls": float(len(disk_calls)),
        "disk_p99": float(np.percentile(calls, 99)),
        "disk_max": float(calls.max()),
        "disk_total_ms": float(calls.sum() / 1e3),
    }


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def main(
    runs: int = typer.Option(3, help="Runs of each mode, alternating; medians and ranges."),
    messages: int = typer.Option(100_000, help="Messages published and consumed per run."),
) -> None:
    """Loop lag of the broker with queues through disk against queues in memory."""
    inline = BrokerOptions().disk_inline_write_bytes
    modes = {
        "memory (anchor)": (1 << 30, inline),
        "disk (mem-queue-size 0)": (0, inline),
        "disk, no inline writes": (0, 0),
    }
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(runs):
        for mode, (size, inline_bytes) in modes.items():
            results[mode].append(asyncio.run(_one(size, inline_bytes, messages)))
    table = Table(title=f"broker loop lag, {messages:,} messages, medians of {runs} (range)")
    for col in ("queues", "msg/s", "lag p50 µs", "lag p99 µs", "lag max µs",
                "disk calls", "disk call p99 µs", "disk call max µs", "in disk ms"):  # fmt: skip
        table.add_column(col, justify="right" if col != "queues" else "left")
    for mode, rows in results.items():
        table.add_row(
            mode,
            *(_median([r[k] for r in rows]) for k in
              ("rate", "lag_p50", "lag_p99", "lag_max", "disk_calls", "disk_p99", "disk_max",
               "disk_total_ms")),
        )  # fmt: skip
    Console(width=160).print(table)
    print(f"python {sys.version.split()[0]}; load average at the end: "
          f"{Path('/proc/loadavg').read_text().split()[:3]}")  # fmt: skip


if __name__ == "__main__":
    typer.run(main)
