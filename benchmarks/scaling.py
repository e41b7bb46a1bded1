"""The scaling curve (issue 32, item 4): publish and consume at once on ``srtm node`` of 1
and 2 processes beside nsqd held to the same cores, the servers' CPU per message, and
what a host of 16 or 64 cores would carry, extrapolated from that CPU per message.

Run with ``.venv/bin/python benchmarks/scaling.py`` (``--quick`` for a smoke run,
``--runs``, ``--duration``, ``--json PATH``). For each size P (``--sizes``, default 1 and
2, at most the machine's cores) and each run, nsqd and a node of P processes are started
fresh and held to the machine's first P cores (every thread's affinity set), and each
carries P pairs of NSQ's ``bench_writer`` (MPUB-200) and ``bench_reader`` at once, one
topic per pair: on the node, one topic per process (a topic lives in one process), on
nsqd all P topics in its one process. The load tools are not pinned: they share the
machine's cores with the servers, as in ``benchmarks/broker.py``. CPU is the server's
processes' CPU-time clocks (all of a node's, ended threads included) over the load's window.

The extrapolation is stated as such: a host of C cores carries at most C cores' worth of
the measured CPU per message (processes of a node share nothing but the NIC and memory
bandwidth, so srtm's is linear until those; nsqd's is taken as linear too, which favours
it: Go's scheduler and nsqd's shared topics scale less than linearly), capped by the NIC
(``--nic-gbps``, each message ``WIRE_BYTES`` on the wire in and again out) and with the
controller's cost per broker report (``--report-ms``, benchmarks/control_plane.py's
figure) for C brokers reporting every second.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from broker import (
    CHANNEL,
    MEM_QUEUE_SIZE,
    MPUB_BATCH,
    RDY,
    TASK_SLACK_S,
    cpu_s,
    find_nsqd,
    node_children,
    run_tools,
    start_nsqd,
    tool_cmd,
)
from srtm.launch import NodeProcess, start_node

#: Bytes a 100-byte message takes on the wire each way, roughly: its body, NSQ's framing
#: (MPUB's 4-byte size; a message frame's 4 + 4 + 8 + 2 + 16) and its share of TCP/IP
#: headers in full segments.
WIRE_BYTES = 150
HOST_CORES = (16, 64)


@dataclass
class Sample:
    """One size, one server, one run."""

    server: str
    size: int
    run: int
    written: float
    read: float
    cpu_s: float

    @property
    def cpu_per_million(self) -> float:
        """CPU seconds per million messages published (each also consumed)."""
        return self.cpu_s / max(self.written, 1.0) * 1e6


@dataclass
class Scaling:
    duration_s: float
    samples: list[Sample] = field(default_factory=list)

    def median(self, server: str, size: int, what: str) -> float | None:
        values = [getattr(s, what) for s in self.samples if (s.server, s.size) == (server, size)]
        return statistics.median(values) if values else None


# -- pure: the extrapolation ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostEstimate:
    cores: int
    #: Messages a second the host's cores carry in and out, at the measured CPU per message.
    by_cpu: float
    #: What the NIC lets through each way (msg/s).
    by_nic: float
    #: The controller's CPU (cores) for ``cores`` brokers reporting every second.
    controller_cores: float

    @property
    def carried(self) -> float:
        return min(self.by_cpu, self.by_nic)

    @property
    def ceiling(self) -> str:
        return "NIC" if self.by_nic < self.by_cpu else "CPU"


def extrapolate(
    cpu_per_million: float, cores: int, nic_gbps: float, report_ms: float, brokers: int
) -> HostEstimate:
    """A host of ``cores`` at ``cpu_per_million`` CPU seconds per million messages (linear
    in cores: an upper bound), ``brokers`` brokers reporting once a second."""
    by_cpu = cores / cpu_per_million * 1e6
    by_nic = nic_gbps * 1e9 / 8 / WIRE_BYTES
    return HostEstimate(cores, by_cpu, by_nic, brokers * report_ms / 1e3)


# -- the measurement --------------------------------------------------------------------------


def pin(pids: Sequence[int], cores: set[int]) -> None:
    """Every thread of ``pids`` to ``cores`` (threads made later inherit it)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                os.sched_setaffinity(int(task.name), cores)


def post(http: tuple[str, int], path: str) -> None:
    req = urllib.request.Request(f"http://{http[0]}:{http[1]}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def at_once(
    tool_dir: Path, pairs: list[tuple[tuple[str, int], tuple[str, int]]], d: float, pids: list[int]
) -> tuple[float, float, float]:
    """P writer/reader pairs at once, pair ``i`` on topic ``scale_i`` at ``pairs[i]`` (its
    TCP and HTTP addresses): the writers' and readers' total rates and the servers' CPU."""
    cmds = []
    for i, (tcp, http) in enumerate(pairs):
        topic = f"scale_{i}"
        post(http, f"/topic/create?topic={topic}")
        post(http, f"/channel/create?topic={topic}&channel={CHANNEL}")
        cmds.append(tool_cmd(tool_dir / "bench_writer", tcp, topic, d, batch_size=MPUB_BATCH))
        cmds.append(tool_cmd(tool_dir / "bench_reader", tcp, topic, d, channel=CHANNEL, rdy=RDY))
    cpu0 = cpu_s(pids)
    res = run_tools(cmds, d + TASK_SLACK_S)
    cpu = cpu_s(pids) - cpu0
    return sum(r["rate"] for r in res[::2]), sum(r["rate"] for r in res[1::2]), cpu


@contextlib.contextmanager
def nsqd_on(binary: Path, where: Path, cores: set[int]) -> Iterator[tuple[Any, list[int]]]:
    broker = start_nsqd(binary, where, MEM_QUEUE_SIZE)
    try:
        pin([broker.proc.pid], cores)
        yield broker, [broker.proc.pid]
    finally:
        broker.stop(30)


@contextlib.contextmanager
def node_on(where: Path, size: int, cores: set[int]) -> Iterator[tuple[NodeProcess, list[int]]]:
    node = start_node(where, size, ["--mem-queue-size", str(MEM_QUEUE_SIZE)])
    try:
        pids = node_children(node.proc.pid)
        pin([node.proc.pid, *pids], cores)
        yield node, pids
    finally:
        node.stop(60)


def measure(binary: Path, size: int, run: int, d: float, work: Path) -> list[Sample]:
    cores = set(sorted(os.sched_getaffinity(0))[:size])
    out = []
    order = ("nsqd", "srtm") if run % 2 == 0 else ("srtm", "nsqd")
    for server in order:
        where = work / f"{server}-{size}-{run}"
        where.mkdir()
        if server == "nsqd":
            with nsqd_on(binary, where, cores) as (broker, pids):
                pairs = [(broker.tcp, broker.http)] * size
                w, r, cpu = at_once(binary.parent, pairs, d, pids)
        else:
            with node_on(where, size, cores) as (node, pids):
                pairs = [(tcp, http) for _, tcp, http in node.brokers]
                w, r, cpu = at_once(binary.parent, pairs, d, pids)
        out.append(Sample(server, size, run, w, r, cpu))
    return out


# -- the report -------------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def curve_table(res: Scaling, sizes: Sequence[int]) -> Table:
    t = Table(title="publish and consume at once: P writer/reader pairs, servers on P cores")
    for col in ("P", "nsqd written", "nsqd read", "srtm written", "srtm read",
                "srtm / nsqd written", "read", "CPU s/M nsqd", "srtm", "srtm / nsqd"):  # fmt: skip
        t.add_column(col, justify="right")
    for p in sizes:
        cells = [str(p)]
        got = {(sv, w): res.median(sv, p, w) for sv in ("nsqd", "srtm")
               for w in ("written", "read", "cpu_per_million")}  # fmt: skip
        cells += [fmt(got["nsqd", "written"]), fmt(got["nsqd", "read"]),
                  fmt(got["srtm", "written"]), fmt(got["srtm", "read"])]  # fmt: skip
        for w in ("written", "read"):
            n, s = got["nsqd", w], got["srtm", w]
            cells.append(f"{s / n:.2f}×" if n and s else "—")
        n, s = got["nsqd", "cpu_per_million"], got["srtm", "cpu_per_million"]
        cells += [fmt(n, 2), fmt(s, 2), f"{s / n:.2f}×" if n and s else "—"]
        t.add_row(*cells)
    return t


def extrapolation_table(res: Scaling, size: int, nic_gbps: float, report_ms: float) -> Table | None:
    n, s = res.median("nsqd", size, "cpu_per_million"), res.median("srtm", size, "cpu_per_million")
    if not n or not s:
        return None
    t = Table(title=f"EXTRAPOLATED from the CPU per message measured at P = {size} (not measured)")
    for col in ("host cores", "nsqd msg/s by CPU", "srtm msg/s by CPU", "NIC msg/s each way",
                "srtm / nsqd carried", "ceiling", "controller cores for the reports"):  # fmt: skip
        t.add_column(col, justify="right")
    for cores in HOST_CORES:
        en = extrapolate(n, cores, nic_gbps, report_ms, 1)
        es = extrapolate(s, cores, nic_gbps, report_ms, cores)
        t.add_row(str(cores), fmt(en.by_cpu), fmt(es.by_cpu), fmt(es.by_nic),
                  f"{es.carried / en.carried:.2f}×", f"srtm {es.ceiling}, nsqd {en.ceiling}",
                  f"{es.controller_cores:.3f}")  # fmt: skip
    return t


app = typer.Typer(add_completion=False)


@app.command()
def main(
    quick: Annotated[bool, typer.Option("--quick", help="1 s windows, one run.")] = False,
    duration: Annotated[float | None, typer.Option(help="Seconds per window (5).")] = None,
    runs: Annotated[int | None, typer.Option(min=1, help="Runs (3; 1 with --quick).")] = None,
    sizes: Annotated[str, typer.Option(help="Node sizes P, comma-separated.")] = "1,2",
    nsqd: Annotated[Path | None, typer.Option(help="nsqd binary, the bench tools beside.")] = None,
    nic_gbps: Annotated[float, typer.Option(help="The NIC assumed (Gbit/s each way).")] = 10.0,
    report_ms: Annotated[
        float, typer.Option(help="Controller CPU per broker report (ms).")
    ] = 0.140,
    json_path: Annotated[Path | None, typer.Option("--json", help="Raw numbers here.")] = None,
) -> None:
    """srtm node of P processes beside nsqd on P cores, publishing and consuming at once."""
    d = duration if duration is not None else (1.0 if quick else 5.0)
    n_runs = runs if runs is not None else (1 if quick else 3)
    ps = [int(x) for x in sizes.split(",")]
    if any(p < 1 or p > len(os.sched_getaffinity(0)) for p in ps):
        most = len(os.sched_getaffinity(0))
        raise typer.BadParameter(f"sizes must be 1..{most}", param_hint="--sizes")
    binary = find_nsqd(nsqd)
    res = Scaling(d)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="srtm-scaling-") as tmp:
        for run in range(n_runs):
            for p in ps:
                res.samples += measure(binary, p, run, d, Path(tmp))
    console = Console(width=max(Console().width, 160))
    console.print(curve_table(res, ps))
    ext = extrapolation_table(res, max(ps), nic_gbps, report_ms)
    if ext is not None:
        console.print(ext)
    console.print(
        f"{n_runs} run(s) of {d:g} s, medians; load average {load0[0]:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after on {os.cpu_count()} cores (the tools and both "
        f"servers share them: a load above the cores means others ran too). Extrapolation: "
        f"cores / CPU per message, linear (nsqd's too, in its favour), NIC {nic_gbps:g} "
        f"Gbit/s at {WIRE_BYTES} B a message each way, {report_ms:g} ms of controller CPU "
        "per report, each srtm process a broker reporting once a second.",
        highlight=False,
    )
    if json_path is not None:
        json_path.write_text(json.dumps({"duration_s": d, "samples": [
            {**asdict(s), "cpu_per_million": s.cpu_per_million} for s in res.samples
        ], "load_before": load0, "load_after": os.getloadavg(),
            "time": time.time()}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    app()
