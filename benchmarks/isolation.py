"""One tenant's flood against a well-behaved neighbour on the same broker (issue 29, item 3).

Each run starts ``srtm broker`` fresh (127.0.0.1, ephemeral ports, a temporary data
directory) and shapes two topics on it with ``POST /srtm/bucket``, as the controller does:

- **V**, well-behaved: a child process publishes ``--v-rate`` PUBs per second, paced,
  each carrying its send time, and a consumer on the same process FINs them; its
  latency is publish → delivery (``time.time_ns`` on one host). Its bucket has room to
  spare (twice its rate), so what V sees is the broker, not its own bucket.
- **F**, declared small (``--f-rate`` msg/s, burst 10) with ``--max-wait-ms`` and
  ``--overflow`` (the controller's defaults unless told; ``--overflow none`` leaves F
  unbounded, as before the bound): another child process sends PUBs as fast as it can.

Rows, in the same run, on the same broker: **quiet** (V alone for ``--seconds``), then
**flooded** (F flooding, after ``--warmup`` seconds of it, V for ``--seconds`` again).
The table gives V's p50 and p99 per row, the flooded/quiet ratio of the p99 (the target:
at most 1.20), and F's accepted and released rates against its envelope, as medians of
``--runs`` runs with their range. Every process started here is stopped at the end, on
Ctrl-C and on errors too.

    .venv/bin/python benchmarks/isolation.py [--runs 5] [--seconds 10]
"""

from __future__ import annotations

import multiprocessing
import selectors
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from srtm.launch import BrokerProcess, die_with_parent, start_broker
from srtm.protocol import MAGIC_V2, Fin, FrameReader, FrameType, Pub, Rdy, Sub, decode_message
from srtm.protocol.commands import encode_command
from srtm.ratelimit.overflow import DEFAULT_MAX_WAIT_MS, DEFAULT_OVERFLOW

STAMP = struct.Struct(">q")
V, F = "v", "f"


def _send(sock: socket.socket, data: bytes) -> None:
    sock.setblocking(True)
    sock.sendall(data)
    sock.setblocking(False)


def _v_load(port: int, rate: float, seconds: float, out: Connection) -> None:
    """Child: publish to V at ``rate`` for ``seconds``, consume and FIN every message;
    send back each message's publish → delivery latency (ns)."""
    pub = socket.create_connection(("127.0.0.1", port))
    sub = socket.create_connection(("127.0.0.1", port))
    for s in (pub, sub):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(MAGIC_V2)
    sub.sendall(encode_command(Sub(V, "c")) + encode_command(Rdy(1000)))
    for s in (pub, sub):
        s.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(pub, selectors.EVENT_READ)
    sel.register(sub, selectors.EVENT_READ)
    frames = FrameReader()
    latencies: list[int] = []
    interval = 1.0 / rate
    start = time.monotonic()
    end = start + seconds
    sent = 0
    padding = b"v" * 92  # 100-byte bodies
    while True:
        now = time.monotonic()
        if now < end:
            due = start + sent * interval
            if now >= due:
                _send(pub, encode_command(Pub(V, STAMP.pack(time.time_ns()) + padding)))
                sent += 1
                continue
            timeout = due - now
        elif len(latencies) >= sent or now > end + 5:
            break
        else:
            timeout = 0.05
        for key, _ in sel.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            if sock is pub:
                continue  # OKs
            fins = []
            got = time.time_ns()
            for frame in frames.feed(data):
                if frame.kind is FrameType.MESSAGE:
                    msg = decode_message(frame.data)
                    latencies.append(got - STAMP.unpack_from(msg.body)[0])
                    fins.append(encode_command(Fin(msg.id)))
            if fins:
                _send(sub, b"".join(fins))
    out.send(latencies)
    pub.close()
    sub.close()


def _flood(port: int, stop: Any) -> None:
    """Child: PUBs to F as fast as the broker takes them, until ``stop``; the answers are
    read (and dropped) by a thread, so the broker's writes never hold it back."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    chunk = encode_command(Pub(F, b"f" * 16)) * 1000

    def drain() -> None:
        while True:
            try:
                if not sock.recv(1 << 20):
                    return
            except TimeoutError:
                continue  # the socket's timeout is for the sender's sake
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            sock.sendall(chunk)
        except TimeoutError:
            continue  # the broker does not read it (block): look at ``stop`` again
        except OSError:
            break  # refused (E_PUB_FAILED closes the connection): ``_flood_forever`` reconnects
    sock.close()


def _flood_forever(port: int, stop: Any) -> None:
    while not stop.is_set():
        try:
            _flood(port, stop)
        except OSError:
            time.sleep(0.01)


def _v_row(port: int, rate: float, seconds: float) -> list[int]:
    recv, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=_v_load, args=(port, rate, seconds, send), daemon=True)
    child.start()
    try:
        if not recv.poll(seconds + 30):
            raise RuntimeError("V's load process sent nothing back")
        latencies: list[int] = recv.recv()
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
    return latencies


def _counts(broker: BrokerProcess) -> tuple[int, int]:
    """F's messages accepted, and released to its channel, so far."""
    doc = broker.stats(F)
    (topic,) = doc["topics"]
    released = sum(c["message_count"] for c in topic["channels"])
    return topic["message_count"], released


def _one(args: dict[str, Any]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp), new_session=True, preexec_fn=die_with_parent)
        stop = multiprocessing.Event()
        flood: multiprocessing.Process | None = None
        try:
            port = broker.tcp[1]
            v_rate, f_rate = args["v_rate"], args["f_rate"]
            broker.post(f"/srtm/bucket?topic={V}&rate={2 * v_rate}&burst=100")
            query = {"topic": F, "rate": f_rate, "burst": 10}
            if args["overflow"] != "none":
                query |= {"max_wait_ms": args["max_wait_ms"], "overflow": args["overflow"]}
            broker.post("/srtm/bucket?" + urllib.parse.urlencode(query))
            broker.post(f"/channel/create?topic={F}&channel=c")
            quiet = np.array(_v_row(port, v_rate, args["seconds"])) / 1e6
            flood = multiprocessing.Process(target=_flood_forever, args=(port, stop), daemon=True)
            flood.start()
            time.sleep(args["warmup"])
            a0, r0, t0 = *_counts(broker), time.monotonic()
            flooded = np.array(_v_row(port, v_rate, args["seconds"])) / 1e6
            a1, r1, t1 = *_counts(broker), time.monotonic()
        finally:
            stop.set()
            if flood is not None:
                flood.join(5)
                if flood.is_alive():
                    flood.kill()
            broker.stop()
    return {
        "quiet_p50": float(np.percentile(quiet, 50)),
        "quiet_p99": float(np.percentile(quiet, 99)),
        "flooded_p50": float(np.percentile(flooded, 50)),
        "flooded_p99": float(np.percentile(flooded, 99)),
        "ratio": float(np.percentile(flooded, 99) / np.percentile(quiet, 99)),
        "f_accepted": (a1 - a0) / (t1 - t0),
        "f_released": (r1 - r0) / (t1 - t0),
        "v_count": float(len(flooded)),
    }


def _cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def main(
    runs: Annotated[int, typer.Option(help="Runs, each on a fresh broker; medians and ranges")] = 5,
    seconds: Annotated[float, typer.Option(help="Length of each row (s)")] = 10.0,
    warmup: Annotated[float, typer.Option(help="Flooding before the flooded row (s)")] = 2.0,
    v_rate: Annotated[float, typer.Option(help="V's publish rate (msg/s)")] = 500.0,
    f_rate: Annotated[float, typer.Option(help="F's declared rate, its envelope (msg/s)")] = 300.0,
    max_wait_ms: Annotated[float, typer.Option(help="F's bound")] = DEFAULT_MAX_WAIT_MS,
    overflow: Annotated[
        str, typer.Option(help="F's overflow policy: block, refuse, drop-oldest, or none")
    ] = DEFAULT_OVERFLOW.value,
) -> None:
    """V's latency quiet and while F floods, on one broker."""
    if overflow not in ("block", "refuse", "drop-oldest", "none"):
        raise typer.BadParameter(f"overflow: {overflow!r}")
    args = dict(seconds=seconds, warmup=warmup, v_rate=v_rate, f_rate=f_rate,
                max_wait_ms=max_wait_ms, overflow=overflow)  # fmt: skip
    results = []
    for i in range(runs):
        r = _one(args)
        results.append(r)
        print(f"run {i + 1}/{runs}: V p99 quiet {r['quiet_p99']:.2f} ms, flooded "
              f"{r['flooded_p99']:.2f} ms (×{r['ratio']:.2f}); F accepted "
              f"{r['f_accepted']:,.0f}/s", file=sys.stderr)  # fmt: skip
    col = {k: [r[k] for r in results] for k in results[0]}
    bound = "unbounded" if overflow == "none" else f"{overflow}, max_wait_ms {max_wait_ms:g}"
    table = Table(
        title=f"V ({v_rate:g} msg/s) beside F flooding (declared {f_rate:g} msg/s, {bound}); "
        f"{seconds:g} s rows, medians of {runs} runs (range)"
    )
    for c in ("row", "V p50 ms", "V p99 ms", "F accepted msg/s", "F released msg/s"):
        table.add_column(c, justify="left" if c == "row" else "right")
    table.add_row("quiet", _cell(col["quiet_p50"], ".2f"), _cell(col["quiet_p99"], ".2f"), "", "")
    table.add_row(
        "flooded", _cell(col["flooded_p50"], ".2f"), _cell(col["flooded_p99"], ".2f"),
        _cell(col["f_accepted"], ",.0f"), _cell(col["f_released"], ",.0f"),
    )  # fmt: skip
    table.add_row("flooded / quiet (p99)", "", _cell(col["ratio"], ".2f"), "", "")
    table.add_row("F's envelope", "", "", f"{f_rate:,.0f}", f"{f_rate:,.0f}")
    Console(width=160).print(table)
    print(f"target: V's p99 flooded / quiet <= 1.20; python {sys.version.split()[0]}; load "
          f"average at the end: {Path('/proc/loadavg').read_text().split()[:3]}")  # fmt: skip


if __name__ == "__main__":
    typer.run(main)
