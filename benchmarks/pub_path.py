"""What one single PUB costs the broker's thread beyond its two socket calls.

``bench_writer --batch-size=1`` keeps one PUB in flight per connection, so its rate is
set by the round trip, and every µs the broker spends on a PUB is on it. This drives
the real read path in process (``Intake.on_readable`` of a client of a broker with uvloop, as
``srtm broker`` runs it) over a loopback TCP pair, one PUB and its OK at a time, and
measures in the same run the anchor: the same four socket calls with no broker between.
The difference is the broker's own cost per PUB (parse, session, queue, frame, write).
``--profile`` adds cProfile's split of one run by stage (cProfile inflates Python calls,
so read its shares, not its times).

    .venv/bin/python benchmarks/pub_path.py [--count 30000] [--runs 5] [--profile]
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


async def measure(count: int, profile: bool) -> tuple[float, float, pstats.Stats | None]:
    """Seconds per PUB: sockets alone, and through the broker (with cProfile's stats)."""
    with tempfile.TemporaryDirectory() as d:
        broker = Broker(
            BrokerOptions(tcp_port=0, http_port=0, data_dir=Path(d), mem_queue_size=10 * count)
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

                _timed(through_broker, 2_000)  # warm up
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
) -> None:
    """Per-PUB cost of the broker's read path beside the bare sockets, in one run."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results = [asyncio.run(measure(count, False)) for _ in range(runs)]
    anchors = [a * 1e6 for a, _, _ in results]
    fulls = [f * 1e6 for _, f, _ in results]
    own = [f - a for a, f in zip(anchors, fulls, strict=True)]
    table = Table(title=f"one PUB and its OK, {count:,} per run, median of {runs} (min–max)")
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
    console = Console()
    console.print(table)
    if profile:
        _, _, stats = asyncio.run(measure(count, True))
        assert stats is not None
        shares = Table(title="cProfile: share of the read callback (shares, not times)")
        shares.add_column("stage")
        shares.add_column("share", justify="right")
        for stage, share in stage_shares(stats).items():
            shares.add_row(stage, "not called" if share is None else f"{share:.0%}")
        console.print(shares)


if __name__ == "__main__":
    typer.run(main)
