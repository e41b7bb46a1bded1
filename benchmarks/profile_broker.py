"""Where the srtm broker's time goes per message, under NSQ's bench_writer and bench_reader.

Run with ``.venv/bin/python benchmarks/profile_broker.py`` (``--help`` for options; needs
py-spy, from the ``bench`` extra). Starts ``srtm broker`` on 127.0.0.1 (as
``benchmarks/broker.py`` does), a topic with one channel, then bench_writer (MPUB-200) and
bench_reader on it at once for ``--duration`` seconds while py-spy samples the broker's
main thread (``--nonblocking``: the broker is never paused). Each sample is charged to the
innermost frame of srtm's own code on its stack and that frame to a stage of the hot path;
a sample with no srtm frame is the event loop itself (uvloop's C code: epoll, handles,
callbacks). py-spy counts only samples where the thread is running, so what is left of
the wall time is waiting. The table gives each stage's share and its CPU time per message
(published and consumed once).
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker import CHANNEL, MPUB_BATCH, RDY, child_setup, find_nsqd, run_tools, start_srtm, tool_cmd

#: (file, function prefix) -> stage; the first that matches, innermost srtm frame first.
STAGES: list[tuple[str, str, str]] = [
    ("srtm/protocol/parser.py", "", "parse"),
    ("srtm/protocol/session.py", "", "parse"),
    ("srtm/protocol/frames.py", "", "frame"),
    ("srtm/broker/intake.py", "", "read (recvmsg, loop over commands)"),
    ("srtm/broker/tcp.py", "Client.send_records", "frame"),
    ("srtm/broker/tcp.py", "Client.finish", "FIN"),
    ("srtm/broker/tcp.py", "Client.publish", "publish (Message, id, put)"),
    ("srtm/broker/tcp.py", "Client.", "write (buffer, send)"),
    ("srtm/broker/output.py", "", "write (buffer, send)"),
    ("srtm/broker/queue.py", "", "queue"),
    ("srtm/broker/message.py", "", "publish (Message, id, put)"),
    ("srtm/broker/state.py", "Topic.put", "queue"),  # put and put_many
    ("srtm/broker/state.py", "Channel.put", "queue"),
    ("srtm/broker/state.py", "Channel.fin", "FIN"),
    ("srtm/broker/state.py", "Channel._compact", "FIN"),
    ("srtm/broker/state.py", "Channel.", "dispatch (RDY, in flight)"),
    ("srtm/broker/state.py", "Topic.", "release (topic to channels, bucket)"),
    ("srtm/broker/release.py", "", "release (topic to channels, bucket)"),
    ("srtm/ratelimit/", "", "release (topic to channels, bucket)"),
    ("srtm/broker/broker.py", "Broker.publish", "publish (Message, id, put)"),
    ("srtm/broker/broker.py", "Broker._publish", "publish (Message, id, put)"),
    ("srtm/broker/broker.py", "Broker.", "dispatch (RDY, in flight)"),
    ("srtm/broker/policing.py", "", "publish (Message, id, put)"),
    ("srtm/broker/takes.py", "", "publish (Message, id, put)"),
    ("srtm/broker/dispatch.py", "Dispatcher._account", "stats"),
    ("srtm/broker/dispatch.py", "Dispatcher.", "dispatch (RDY, in flight)"),
    ("srtm/broker/scan.py", "", "dispatch (RDY, in flight)"),
    ("srtm/broker/stats.py", "", "stats"),
    ("srtm/broker/disk/", "", "disk hand-off (push, encode, submit)"),
    ("srtm/broker/persistence.py", "", "disk hand-off (push, encode, submit)"),
]
LOOP = "event loop (uvloop C code)"
OTHER = "other srtm code"


def frame_of(text: str) -> tuple[str, str]:
    """``Func (path/file.py:LINE)`` -> (path, Func)."""
    func, _, where = text.rpartition(" (")
    return where.rsplit(":", 1)[0], func


def stage_of(stack: list[str]) -> str:
    for text in reversed(stack):
        path, func = frame_of(text)
        if "srtm/" not in path or "srtm/cli/" in path or path.endswith("srtm/__main__.py"):
            continue
        if path.endswith("srtm/broker/server.py"):
            return LOOP
        for file, prefix, stage in STAGES:
            if file in path and func.startswith(prefix):
                return stage
        return OTHER
    return LOOP


def main(
    duration: Annotated[float, typer.Option(help="Seconds of load.")] = 10.0,
    rate: Annotated[int, typer.Option(help="py-spy samples per second.")] = 250,
    nsqd: Annotated[Path | None, typer.Option(help="nsqd binary; the tools beside it.")] = None,
    raw: Annotated[Path | None, typer.Option(help="Also keep py-spy's raw stacks here.")] = None,
    reader: Annotated[
        bool, typer.Option(help="Also consume (--no-reader: MPUB alone, overflowing to disk).")
    ] = True,
    py_spy: Annotated[Path | None, typer.Option(help="py-spy binary (default: on PATH).")] = None,
) -> None:
    """Profile the srtm broker under bench_writer + bench_reader at once."""
    pyspy = (
        str(py_spy)
        if py_spy
        else (shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"))
    )
    if not Path(pyspy).is_file():
        raise typer.BadParameter("py-spy not found: pip install -e '.[bench]'")
    tools = find_nsqd(nsqd).parent
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="srtm-profile-"))
    stacks = workdir / "stacks.txt"
    broker = start_srtm(workdir, 1_000_000)
    spy: subprocess.Popen[bytes] | None = None
    try:
        topic = "profile"
        broker.create_channel(topic)
        cmds = [
            tool_cmd(tools / "bench_writer", broker.tcp, topic, duration, batch_size=MPUB_BATCH),
        ]
        if reader:
            cmds.append(
                tool_cmd(
                    tools / "bench_reader", broker.tcp, topic, duration, channel=CHANNEL, rdy=RDY
                )
            )
        sampled_s = max(1.0, duration - 1.0)
        spy = subprocess.Popen(
            [
                pyspy,
                "record",
                "--pid",
                str(broker.proc.pid),
                "--rate",
                str(rate),
                "--nonblocking",
                "--format",
                "raw",
                "--duration",
                f"{sampled_s:g}",
                "-o",
                str(stacks),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_setup,
        )
        started = time.perf_counter()
        results = run_tools(cmds, duration + 60)
        spy.wait(60)
        wall_s = min(sampled_s, time.perf_counter() - started)
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait()
        broker.stop(30)
    try:
        lines = stacks.read_text().splitlines()
        if raw is not None:
            raw.write_text("\n".join(lines) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    by_stage: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any("srtm/__main__.py" in f for f in frames):
            continue  # not the main thread (the disk writer's pool, ...)
        by_stage[stage_of(frames)] += int(count)
    busy = sum(by_stage.values())
    expected = rate * wall_s
    # Messages carried in and out during the sampled time, at the tools' average rates.
    per_s = min(r["rate"] for r in results)
    msgs = per_s * wall_s
    table = Table(
        title=f"srtm broker main thread under bench_writer MPUB-{MPUB_BATCH}"
        + (
            f" + bench_reader, {per_s:,.0f} msg/s in and out, "
            if reader
            else f" alone, {per_s:,.0f} msg/s in, "
        )
        + f"{busy:,} samples of {expected:,.0f} "
        f"({busy / expected:.0%} busy)"
    )
    table.add_column("stage")
    table.add_column("share of busy", justify="right")
    table.add_column("µs per message", justify="right")
    for stage, n in by_stage.most_common():
        us = n / rate / msgs * 1e6
        table.add_row(stage, f"{n / busy:.1%}", f"{us:.2f}")
    table.add_row("busy, all", "100%", f"{busy / rate / msgs * 1e6:.2f}", end_section=True)
    table.add_row(
        "waiting (not sampled)", "", f"{max(0.0, expected - busy) / rate / msgs * 1e6:.2f}"
    )
    console.print(table)
    console.print(
        f"bench_writer {results[0]['rate']:,.0f} msg/s"
        + (f", bench_reader {results[1]['rate']:,.0f} msg/s" if reader else ", no reader")
        + f" for {duration:g} s; py-spy --rate {rate} --nonblocking for {sampled_s:g} s",
        highlight=False,
    )


if __name__ == "__main__":
    typer.run(main)
