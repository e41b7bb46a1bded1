"""The machine's side of a run's validity: CPU figures read from /proc at the start and
the end of the measured window (Linux; elsewhere every figure is None).

``take`` reads (small files, microseconds); ``between`` is the pure arithmetic.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

_PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class ProcSample:
    #: user + system CPU time, seconds
    cpu_s: float
    #: time the main thread spent runnable, waiting for a CPU (schedstat), seconds
    wait_s: float


@dataclass(frozen=True)
class Sample:
    t_s: float
    #: the machine's CPU time, seconds: all, busy (not idle/iowait), stolen
    total_s: float | None = None
    busy_s: float | None = None
    steal_s: float | None = None
    load1: float | None = None
    procs: dict[int, ProcSample] = field(default_factory=dict)


@dataclass(frozen=True)
class HostFigures:
    run_queue_wait: float | None
    #: the process that waited longest (its pid)
    waited_most: int | None
    steal: float | None
    foreign_cpu: float | None
    cpus: int
    #: CPUs the run's own processes used on average (CPU seconds per second)
    run_cpus: float | None = None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _proc(pid: int) -> ProcSample | None:
    stat, sched = _read(_PROC / str(pid) / "stat"), _read(_PROC / str(pid) / "schedstat")
    if stat is None or sched is None:
        return None
    # Fields after the command name (which may hold spaces): utime is the 14th field.
    rest = stat.rsplit(")", 1)[1].split()
    cpu = (int(rest[11]) + int(rest[12])) * _TICK_S
    return ProcSample(cpu, int(sched.split()[1]) / 1e9)


def take(pids: list[int]) -> Sample:
    """The machine's CPU counters and each of ``pids``' CPU and run-queue time now."""
    now = time.monotonic()
    total = busy = steal = load1 = None
    stat = _read(_PROC / "stat")
    if stat is not None:
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        ticks = [int(x) for x in stat.splitlines()[0].split()[1:9]]
        total = sum(ticks) * _TICK_S
        busy = (sum(ticks) - ticks[3] - ticks[4]) * _TICK_S
        steal = ticks[7] * _TICK_S
    loadavg = _read(_PROC / "loadavg")
    if loadavg is not None:
        load1 = float(loadavg.split()[0])
    procs = {pid: p for pid in pids if (p := _proc(pid)) is not None}
    return Sample(now, total, busy, steal, load1, procs)


def between(a: Sample, b: Sample, cpus: int) -> HostFigures:
    """Figures for the interval from ``a`` to ``b``: the worst process's share of it spent
    waiting for a CPU, the stolen share and the share of the machine's CPU time used by
    processes other than ``a``'s (CPU time of processes that exited meanwhile counts as
    foreign: an overestimate, on the safe side)."""
    wall = b.t_s - a.t_s
    common = [pid for pid in a.procs if pid in b.procs]
    wait = worst = None
    if wall > 0 and common:
        worst = max(common, key=lambda p: b.procs[p].wait_s - a.procs[p].wait_s)
        wait = (b.procs[worst].wait_s - a.procs[worst].wait_s) / wall
    steal = foreign = run_cpus = None
    if wall > 0 and common:
        run_cpus = sum(b.procs[p].cpu_s - a.procs[p].cpu_s for p in common) / wall
    if None not in (a.total_s, b.total_s, a.busy_s, b.busy_s, a.steal_s, b.steal_s):
        assert a.total_s is not None and b.total_s is not None
        assert a.busy_s is not None and b.busy_s is not None
        assert a.steal_s is not None and b.steal_s is not None
        total = b.total_s - a.total_s
        if total > 0:
            steal = (b.steal_s - a.steal_s) / total
            ours = sum(b.procs[p].cpu_s - a.procs[p].cpu_s for p in common)
            foreign = max(0.0, (b.busy_s - a.busy_s - ours) / total)
    return HostFigures(wait, worst, steal, foreign, cpus, run_cpus)
