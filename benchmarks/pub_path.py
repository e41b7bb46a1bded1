"""What one single PUB costs the broker's thread beyond its two socket calls.

``bench_writer --batch-size=1`` keeps one PUB in flight per connection, so its rate is
set by the round trip, and every µs the broker spends on a PUB is on it. This drives
the real read path in process (``Intake.on_readable`` of a client of a broker with uvloop, as
``srtm broker`` runs it) over a loopback TCP pair, one PUB and its OK at a time, and
measures in the same run the anchor: the same four socket calls with no broker between.
The difference is the broker's own cost per PUB (parse, session, queue, frame, write).
``--profile`` adds cProfile's split of one run by stage (cProfile inflates Python calls,
so read its shares, not its times). ``--cold`` adds the same two paths with this
process's caches evicted before each PUB (a buffer larger than the last-level cache
written through), the median PUB of ``--cold-count``: a sensor's read, which finds
its broker after a sleep, runs cold, and what a PUB costs there is not what it costs in a
warm loop.

    .venv/bin/python benchmarks/pub_path.py [--count 30000] [--runs 5] [--profile]
        [--cold] [--cold-count 300] [--evict-mib 64]
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from srtm.broker import Broker, BrokerOptions
from srtm.broker.tcp import Client

BODY = b"x" * 100
PUB = b"PUB t\n" + struct.pack(">I", len(BODY)) + BODY
OK = struct.pack(">ii", 6, 0) + b"OK"
#: PUBs through the broker before any is timed (all of them kept in memory, as the
#: timed ones are: one overflowed to disk would have its OK wait for the disk thread).
WARM_UP = 2_000
#: Where each stage's cumulative time is read in a profile: the file its function is in
#: (``~``: a builtin, named as cProfile names it) and the function, as the read callback
#: reaches them for a sensor's PUB (``Intake._took_one``); the peer's own socket calls
#: in this process are not the broker's and are left out.
STAGES: dict[str, tuple[str, str]] = {
    "read (recvmsg)": ("~", "<built-in method srtm.broker._sockio.recv_stamped>"),
    "parse": ("parser.py", "one"),
    "publish": ("session.py", "publish_one"),
    "  queue": ("state.py", "put_one"),
    "  ids": ("message.py", "next"),
    "write (OK and send)": ("output.py", "answer"),
    "accounting (after the OK)": ("broker.py", "account_one"),
    "busy polling's rule": ("busypoll.py", "read"),
}


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        peer = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer.settimeout(5)
    return peer, server


def _timed(step: Callable[[], None], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        step()
    return (time.perf_counter() - start) / count


class Evictor:
    """Writes one byte of each cache line of a buffer of ``mib`` MiB: what this process
    had cached is gone (the buffer is larger than the last-level cache)."""

    def __init__(self, mib: int) -> None:
        self._buf = bytearray(mib << 20)
        self._ones = b"\x01" * (len(self._buf) // 64)

    def __call__(self) -> None:
        self._buf[::64] = self._ones


def _timed_cold(
    steps: tuple[Callable[[], None], Callable[[], None]], count: int, evict: Evictor
) -> tuple[float, float]:
    """The median of ``count`` runs of each step, each timed alone after ``evict``, the
    two taking turns (so that both see the same stretch of a noisy machine)."""
    times: tuple[list[int], list[int]] = ([], [])
    for _ in range(count):
        for step, out in zip(steps, times, strict=True):
            evict()
            start = time.perf_counter_ns()
            step()
            out.append(time.perf_counter_ns() - start)
    first, second = (statistics.median(t) / 1e9 for t in times)
    return first, second


async def measure(
    count: int, profile: bool, evict: Evictor | None = None
) -> tuple[float, float, pstats.Stats | None]:
    """Seconds per PUB: sockets alone, and through the broker (with cProfile's stats);
    with ``evict``, each PUB cold (``_timed_cold``)."""
    with tempfile.TemporaryDirectory() as d:
        broker = Broker(
            BrokerOptions(
                tcp_port=0, http_port=0, data_dir=Path(d), mem_queue_size=10 * count + WARM_UP
            )
        )
        await broker.start()
        try:
            peer, server = _pair()
            with peer, server:
                client = Client(broker, server, True)
                broker.clients.add(client)
                asyncio.get_running_loop().remove_reader(server.fileno())  # driven here
                peer.sendall(b"  V2")
                client.intake.on_readable()

                def through_broker() -> None:
                    peer.send(PUB)
                    client.intake.on_readable()
                    if peer.recv(64) != OK:
                        raise RuntimeError("the broker did not answer OK")

                def sockets_only() -> None:
                    peer.send(PUB)
                    server.recvmsg(32768, 64)
                    server.send(OK)
                    peer.recv(64)

                _timed(through_broker, WARM_UP)
                if evict is not None:
                    anchor, full = _timed_cold((sockets_only, through_broker), count, evict)
                    client.close()
                    return anchor, full, None
                anchor = _timed(sockets_only, count)
                prof = cProfile.Profile() if profile else None
                if prof is not None:
                    prof.enable()
                full = _timed(through_broker, count)
                if prof is not None:
                    prof.disable()
                client.close()
                return anchor, full, pstats.Stats(prof) if prof is not None else None
        finally:
            await broker.stop()


def stage_shares(stats: pstats.Stats) -> dict[str, float | None]:
    """Each stage's share of the read callback's cumulative time (None: not called, the
    path has changed and ``STAGES`` with it)."""
    cum: dict[tuple[str, str], float] = {}
    total = 0.0
    for (path, _, name), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        key = (Path(path).name, name)
        cum[key] = max(cum.get(key, 0.0), ct)  # the outermost of a name wins
        if key == ("intake.py", "on_readable"):
            total = ct
    return {
        stage: cum[key] / total if key in cum and total else None for stage, key in STAGES.items()
    }


def main(
    count: Annotated[int, typer.Option(min=100, help="PUBs per measurement.")] = 30_000,
    runs: Annotated[int, typer.Option(min=1, help="Measurements; medians and ranges.")] = 5,
    profile: Annotated[
        bool, typer.Option(help="Also one profiled run: each stage's share of a PUB.")
    ] = False,
    cold: Annotated[
        bool, typer.Option(help="Also each PUB with the caches evicted before it.")
    ] = False,
    cold_count: Annotated[int, typer.Option(min=10, help="PUBs per cold measurement.")] = 300,
    evict_mib: Annotated[
        int, typer.Option(min=1, help="MiB written through before each cold PUB.")
    ] = 64,
) -> None:
    """Per-PUB cost of the broker's read path beside the bare sockets, in one run."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    console = Console()
    results = [asyncio.run(measure(count, False)) for _ in range(runs)]
    title = f"one PUB and its OK, {count:,} per run, median of {runs} (min–max)"
    console.print(_table(title, results))
    if cold:
        evict = Evictor(evict_mib)
        results = [asyncio.run(measure(cold_count, False, evict)) for _ in range(runs)]
        title = (
            f"the same, {evict_mib} MiB written through before each PUB (cold): the median "
            f"of {cold_count:,} PUBs a run, median of {runs} runs (min–max)"
        )
        console.print(_table(title, results))
    if profile:
        _, _, stats = asyncio.run(measure(count, True))
        assert stats is not None
        shares = Table(title="cProfile: share of the read callback (shares, not times)")
        shares.add_column("stage")
        shares.add_column("share", justify="right")
        for stage, share in stage_shares(stats).items():
            shares.add_row(stage, "not called" if share is None else f"{share:.0%}")
        console.print(shares)


def _table(title: str, results: list[tuple[float, float, pstats.Stats | None]]) -> Table:
    anchors = [a * 1e6 for a, _, _ in results]
    fulls = [f * 1e6 for _, f, _ in results]
    own = [f - a for a, f in zip(anchors, fulls, strict=True)]
    table = Table(title=title)
    table.add_column("path")
    table.add_column("µs per PUB", justify="right")
    for name, values in (
        ("sockets only (anchor)", anchors),
        ("through the broker", fulls),
        ("the broker's own cost", own),
    ):
        table.add_row(
            name, f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"
        )
    return table


if __name__ == "__main__":
    typer.run(main)
