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
warm loop. ``--split`` times each layer of that path (``LAYERS``) on its own, warm and
cold: the median of each, inclusive of the layers it calls (the timers add their own
cost, a few µs cold).

    .venv/bin/python benchmarks/pub_path.py [--count 30000] [--runs 5] [--profile]
        [--cold] [--split] [--cold-count 300] [--evict-mib 64]
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import pstats
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from srtm.broker import Broker, BrokerOptions, busypoll, intake, output, queue, state
from srtm.broker import broker as broker_module
from srtm.broker.tcp import Client
from srtm.protocol import parser, session

BODY = b"x" * 100
PUB = b"PUB t\n" + struct.pack(">I", len(BODY)) + BODY
OK = struct.pack(">ii", 6, 0) + b"OK"
#: PUBs through the broker before any is timed (all of them kept in memory, as the
#: timed ones are: one overflowed to disk would have its OK wait for the disk thread).
WARM_UP = 2_000
#: The layers ``--split`` times, in the order a sensor's PUB goes through them: a label
#: (indented under the layer that calls it), and the class or module and the name of the
#: function.
LAYERS: tuple[tuple[str, Any, str], ...] = (
    ("the read callback (Intake.on_readable)", intake.Intake, "on_readable"),
    ("  the read (recv_stamped)", intake, "recv_stamped"),
    ("  the parse (Parser.one)", parser.Parser, "one"),
    ("  the sensor's path (Intake._took_one)", intake.Intake, "_took_one"),
    ("    publish: Session.publish_one", session.Session, "publish_one"),
    ("      Client.publish_one", Client, "publish_one"),
    ("        Broker.publish_one", broker_module.Broker, "publish_one"),
    ("          Broker._put_one", broker_module.Broker, "_put_one"),
    ("            Topic.put_one", state.Topic, "put_one"),
    ("              MessageQueue.put_single", queue.MessageQueue, "put_single"),
    ("    the OK's write (Output.answer)", output.Output, "answer"),
    ("  busy polling's rule (BusyPoll.read)", busypoll.BusyPoll, "read"),
)
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


@contextlib.contextmanager
def timed_layers() -> Iterator[dict[str, list[int]]]:
    """Each of ``LAYERS`` wrapped in a timer while in the block: its label's list gets
    each call's ns (cleared by the caller where the warm-up should not count)."""
    times: dict[str, list[int]] = {label: [] for label, _, _ in LAYERS}
    saved = [(owner, name, getattr(owner, name)) for _, owner, name in LAYERS]
    clock = time.perf_counter_ns
    for (label, owner, name), (_, _, fn) in zip(LAYERS, saved, strict=True):
        out = times[label]

        def timed(*args: Any, _fn: Any = fn, _out: list[int] = out, **kwargs: Any) -> Any:
            start = clock()
            try:
                return _fn(*args, **kwargs)
            finally:
                _out.append(clock() - start)

        setattr(owner, name, timed)
    try:
        yield times
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


async def measure(
    count: int,
    profile: bool,
    evict: Evictor | None = None,
    timing: Callable[[], None] | None = None,
) -> tuple[float, float, pstats.Stats | None]:
    """Seconds per PUB: sockets alone, and through the broker (with cProfile's stats);
    with ``evict``, each PUB cold (``_timed_cold``). ``timing`` is called once the
    warm-up is done, before anything is timed."""
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
                if timing is not None:
                    timing()
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
    split: Annotated[
        bool, typer.Option(help="Also each layer of the path timed on its own, warm and cold.")
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
    if split:
        warm, cold_times = split_layers(count, cold_count, Evictor(evict_mib))
        layers = Table(
            title=f"each layer, inclusive: the median of {count:,} PUBs warm and {cold_count:,} "
            f"cold ({evict_mib} MiB written through before each), its timer's cost included"
        )
        layers.add_column("layer")
        layers.add_column("warm µs", justify="right")
        layers.add_column("cold µs", justify="right")
        for label, _, _ in LAYERS:
            layers.add_row(label, f"{warm[label]:.2f}", f"{cold_times[label]:.2f}")
        console.print(layers)
    if profile:
        _, _, stats = asyncio.run(measure(count, True))
        assert stats is not None
        shares = Table(title="cProfile: share of the read callback (shares, not times)")
        shares.add_column("stage")
        shares.add_column("share", justify="right")
        for stage, share in stage_shares(stats).items():
            shares.add_row(stage, "not called" if share is None else f"{share:.0%}")
        console.print(shares)


def split_layers(
    count: int, cold_count: int, evict: Evictor
) -> tuple[dict[str, float], dict[str, float]]:
    """The median µs of each of ``LAYERS``, warm (``count`` PUBs) and cold."""
    medians: list[dict[str, float]] = []
    for n, ev in ((count, None), (cold_count, evict)):
        with timed_layers() as times:

            def clear(times: dict[str, list[int]] = times) -> None:
                for t in times.values():
                    t.clear()

            asyncio.run(measure(n, False, ev, timing=clear))
        medians.append(
            {label: statistics.median(t) / 1e3 if t else float("nan") for label, t in times.items()}
        )
    return medians[0], medians[1]


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
