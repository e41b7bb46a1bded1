"""Busy polling: while a connection's reads come close together, keep the loop polling its
sockets for a short window after each of its reads instead of sleeping in ``epoll_wait``.

A thread that sleeps between a synchronous publisher's PUBs is woken for each: on a
virtual machine an idle vCPU halts, and waking it (an interrupt between vCPUs, a context
switch) costs both sides more than the broker's own work on the PUB, and the round trip
waits for it. Go's scheduler spins a while before it parks, so nsqd pays it less; Linux's
``net.core.busy_poll`` is the kernel's form of the same idea. Polling costs CPU, so it is
only done where it pays: for at most the window after a read, while most of that
connection's reads lately came within the window of its read before (the next then
likely does too: a client that sends again as soon as it has its answer). The rule is
each connection's own, so reads of many connections that fall close together only
because there are many (200 sensors at 100/s each: a read every 50 µs, but each sensor's
10 ms apart) never start it, nor do reads further apart (a sensor a second, a quiet
topic); and a process allowed less than two CPUs (its affinity, or its cgroup's quota)
never polls: it would take that CPU from the clients that share it, or spend its quota.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")


#: Each read moves its connection's share of reads that came close by this much of the
#: difference (an average over its last eight or so reads).
GAIN = 1 / 8
#: Polling is done only while at least this share of a connection's reads came within the
#: window of its read before: then a poll likely finds its next read. A connection whose
#: reads seldom come that close would mostly have a poll spend its window for nothing.
CLOSE_SHARE = 0.5


@dataclass
class PollWindow:
    """One connection's rule, without I/O: ``read`` at each of its reads' time says
    whether to poll until ``until_ns``: while most of its reads lately came within the
    window of the one before them (``close_share``, smoothed); ``window_ns`` 0 never
    polls."""

    window_ns: int
    last_read_ns: int = 0
    until_ns: int = 0
    close_share: float = 0.0

    def read(self, now_ns: int) -> bool:
        """A read at ``now_ns``: whether to poll from now until ``until_ns``."""
        window = self.window_ns
        close = 0 <= now_ns - self.last_read_ns <= window
        self.last_read_ns = now_ns
        self.close_share += ((1.0 if close else 0.0) - self.close_share) * GAIN
        if window and self.close_share >= CLOSE_SHARE:
            self.until_ns = now_ns + window
            return True
        return False


def usable_cpus() -> float:
    """The CPUs this process may use: those it may run on, or its cgroup's CPU quota
    where that is less (a container's limit: polling there would spend the quota and be
    throttled for the rest of the period)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    cpus = float(len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return cpus if quota is None else min(cpus, quota)


def cgroup_cpu_quota(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = _CGROUP
) -> float | None:
    """This process's cgroup CPU quota in CPUs (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``); None: no quota, or none readable."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if controllers == "":
                quota, period = (root / rel / "cpu.max").read_text().split()
                return None if quota == "max" else int(quota) / int(period)
            if "cpu" in controllers.split(","):
                d = root / controllers / rel
                quota_us = int((d / "cpu.cfs_quota_us").read_text())
                period_us = int((d / "cpu.cfs_period_us").read_text())
                return None if quota_us < 0 else quota_us / period_us
        except (OSError, ValueError):
            continue
    return None


class BusyPoll:
    """The loop's polling, for the ``PollWindow`` of each connection (``window``): while
    one of them says to poll, a callback scheduled again every loop turn keeps the loop's
    wait at zero (``epoll_wait`` with no timeout), so a read that comes meanwhile is seen
    without a wake-up."""

    def __init__(self, window_ns: int, cpus: float | None = None) -> None:
        cpus = usable_cpus() if cpus is None else cpus
        self.window_ns = window_ns if cpus >= 2 else 0
        #: Polling until then (the latest a connection's window asked for).
        self.until_ns = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polling = False

    @property
    def enabled(self) -> bool:
        return self.window_ns > 0

    def window(self) -> PollWindow:
        """A new connection's own rule."""
        return PollWindow(self.window_ns)

    def read(self, window: PollWindow, now_ns: int) -> None:
        """The connection of ``window`` was read at ``now_ns`` (``time.time_ns``)."""
        if not window.read(now_ns):
            return
        if window.until_ns > self.until_ns:
            self.until_ns = window.until_ns
        if not self._polling:
            self._polling = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        if time.time_ns() < self.until_ns:
            assert self._loop is not None
            self._loop.call_soon(self._turn)
        else:
            self._polling = False
