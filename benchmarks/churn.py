"""What connection churn costs the broker's loop: collector pauses, and the loop held
while connections come and go.

Rounds of SENSORS connections (``benchmarks/sensors.py``: one connection per sensor, one
PUB a second each, waiting for its OK) connect, publish for SECONDS and disconnect, into
a fresh in-process broker (uvloop, the collector frozen after start-up as ``srtm broker``
does). Every pass of CPython's cyclic collector is timed (``gc.callbacks``) with the
objects it freed and the connections open when it came (a full pass walks each one's
objects: its length follows how many are open then), and a probe on the loop sleeps
1 ms over and over and records how late it wakes (loop lag), also apart while the
number of connections grew (the sensors connecting) and while it fell (their
connections closing). After the last round, one ``gc.collect()`` shows what was still
left for the collector.

The anchors, in the same run: the same rounds on a broker whose closed connections keep
their cycles (``Client._detach`` made a no-op, as before 3d02cee): each one's parts
waited for a full collection; and on one that closes every connection whose peer went
in one loop turn (``srtm.broker.closer``'s slice unbounded) and listens with Python's
backlog of 128, as before ``srtm.broker.closer`` and ``LISTEN_BACKLOG``: the handshakes
the kernel dropped meanwhile on a full backlog (``ListenOverflows``, counted for the
whole machine) each cost a sensor a second.

    .venv/bin/python benchmarks/churn.py [--runs 3] [--sensors 2000] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import typer
import uvloop
from rich.console import Console
from rich.table import Table

from srtm.broker import Broker, BrokerOptions
from srtm.broker.accept import LISTEN_BACKLOG
from srtm.broker.closer import SLICE_NS
from srtm.broker.tcp import Client

SENSORS_PY = Path(__file__).parent / "sensors.py"
#: The probe's sleep on the broker's loop (its lag is how much later it woke).
PROBE_S = 0.001
#: A closing slice's budget that closes every connection whose peer went in one loop
#: turn, as before ``srtm.broker.closer`` (the second anchor).
AT_ONCE_NS = 10**15
#: Python's listen backlog by default (``socket.listen()``), the broker's before
#: ``srtm.broker.accept.LISTEN_BACKLOG`` (the second anchor).
PYTHON_BACKLOG = 128


class Passes:
    """The collector's passes: (generation, ms, objects freed, connections open then),
    from ``gc.callbacks``: a full pass walks every live connection's objects, so how
    long it takes depends on how many are open when it comes."""

    def __init__(self, broker: Broker) -> None:
        self.done: list[tuple[int, float, int, int]] = []
        self._start = 0.0
        self._broker = broker

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            ms = (time.perf_counter() - self._start) * 1e3
            self.done.append((info["generation"], ms, info["collected"], len(self._broker.clients)))


async def _probe(broker: Broker, lags: dict[int, list[float]], stop: asyncio.Event) -> None:
    """The loop lag, each sample filed by how the number of connections moved meanwhile:
    1 more (connecting), -1 fewer (closing), 0 the same."""
    while not stop.is_set():
        t, n = time.perf_counter(), len(broker.clients)
        await asyncio.sleep(PROBE_S)
        lag = time.perf_counter() - t - PROBE_S
        lags[(len(broker.clients) > n) - (len(broker.clients) < n)].append(lag)


def listen_overflows() -> int:
    """The kernel's count of handshakes dropped on a full listen backlog (all sockets:
    on a quiet machine, the broker's)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    return 0


async def _rounds(
    sensors: int, seconds: float, rounds: int, detach: bool, slice_ns: int, backlog: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=Path(tmp)))
        await broker.start()
        assert broker.tcp_address is not None
        host, port = broker.tcp_address
        broker.channel("s", "c")  # held on the broker: a backlog, as a sensor topic's
        broker.closer.budget_ns = slice_ns
        assert broker.acceptor.listener is not None
        broker.acceptor.listener.listen(backlog)  # listen again: the backlog changes
        overflows = listen_overflows()
        original = Client._detach
        if not detach:
            Client._detach = lambda self: None  # type: ignore[method-assign]
        gc.collect()
        gc.freeze()
        passes, stop = Passes(broker), asyncio.Event()
        lags: dict[int, list[float]] = {1: [], 0: [], -1: []}
        gc.callbacks.append(passes)
        probe = asyncio.create_task(_probe(broker, lags, stop))
        try:
            for _ in range(rounds):
                gen = await asyncio.create_subprocess_exec(
                    sys.executable, str(SENSORS_PY), f"{host}:{port}", "s",
                    "--sensors", str(sensors), "--rate", "1", "--duration", str(seconds),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                if await gen.wait():
                    raise RuntimeError(f"sensors.py failed ({gen.returncode})")
                while broker.clients:  # every connection closed (the generator has exited)
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)  # their parts let go a loop turn later
            stop.set()
            await probe
            overflows = listen_overflows() - overflows
            t = time.perf_counter()
            left = gc.collect()
            left_ms = (time.perf_counter() - t) * 1e3
        finally:
            gc.callbacks.remove(passes)
            Client._detach = original  # type: ignore[method-assign]
            gc.unfreeze()
            await broker.stop()
    full = [(ms, n, live) for g, ms, n, live in passes.done if g == 2]
    young = [(ms, n) for g, ms, n, _ in passes.done if g < 2]
    lag = np.array([x for v in lags.values() for x in v]) * 1e6
    return {
        "full": float(len(full)),
        "full_max_ms": max((ms for ms, _, _ in full), default=0.0),
        "full_max_live": float(max(full, default=(0.0, 0, 0))[2]),
        "full_freed": float(sum(n for _, n, _ in full)),
        "young_ms": sum(ms for ms, _ in young),
        "young_freed": float(sum(n for _, n in young)),
        "lag_p99_us": float(np.percentile(lag, 99)),
        "lag_max_us": float(lag.max()),
        "lag_connecting_us": max(lags[1], default=0.0) * 1e6,
        "lag_closing_us": max(lags[-1], default=0.0) * 1e6,
        "overflows": float(overflows),
        "left": float(left),
        "left_ms": left_ms,
    }


def _median(values: list[float], digits: int = 0) -> str:
    f = f"{{:,.{digits}f}}"
    mid = f.format(statistics.median(values))
    return f"{mid} ({f.format(min(values))}–{f.format(max(values))})"


COLUMNS: list[tuple[str, str, int]] = [
    ("full", "full passes", 0),
    ("full_max_ms", "longest full ms", 1),
    ("full_max_live", "open then", 0),
    ("full_freed", "freed by full", 0),
    ("young_ms", "young passes ms", 1),
    ("young_freed", "freed by young", 0),
    ("lag_p99_us", "loop lag p99 µs", 0),
    ("lag_max_us", "loop lag max µs", 0),
    ("lag_connecting_us", "max connecting µs", 0),
    ("lag_closing_us", "max closing µs", 0),
    ("overflows", "handshakes dropped", 0),
    ("left", "left at the end", 0),
    ("left_ms", "its collect ms", 1),
]


def main(
    runs: int = typer.Option(3, help="Runs of each broker, alternating; medians and ranges."),
    sensors: int = typer.Option(2_000, help="Connections per round, one PUB a second each."),
    seconds: float = typer.Option(2.0, help="How long each round publishes."),
    rounds: int = typer.Option(3, help="Rounds per run: connect, publish, disconnect."),
) -> None:
    """Collector pauses and loop lag under connection churn: srtm's broker against the
    same broker with its closed connections left as cyclic garbage, and with every
    connection whose peer went closed in one loop turn (the anchors)."""
    modes = {
        "srtm": (True, SLICE_NS, LISTEN_BACKLOG),
        "left to the collector (anchor)": (False, SLICE_NS, LISTEN_BACKLOG),
        "closed all in one turn, backlog 128 (anchor)": (True, AT_ONCE_NS, PYTHON_BACKLOG),
    }
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(runs):
        for mode, (detach, slice_ns, backlog) in modes.items():
            run = uvloop.run if sys.version_info >= (3, 12) else _run_uvloop
            results[mode].append(run(_rounds(sensors, seconds, rounds, detach, slice_ns, backlog)))
    title = (
        f"collector under churn: {rounds} rounds of {sensors:,} sensors for {seconds:g} s, "
        f"medians of {runs} (range)"
    )
    table = Table(title=title)
    table.add_column("broker")
    for _, name, _ in COLUMNS:
        table.add_column(name, justify="right")
    for mode, rows in results.items():
        cells = (_median([r[k] for r in rows], d) for k, _, d in COLUMNS)
        table.add_row(mode, *cells)
    Console(width=260).print(table)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"python {sys.version.split()[0]}; load average at the end: {load}")


def _run_uvloop(coro: Any) -> Any:
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        return asyncio.run(coro)
    finally:
        asyncio.set_event_loop_policy(None)


if __name__ == "__main__":
    typer.run(main)
