"""A nanosecond-precise wake-up for the event loop: Linux's timerfd on CLOCK_REALTIME.

asyncio's timers wait in ``epoll_wait``, whose timeout is whole milliseconds, so a
release is up to ~1 ms late. A timerfd armed for an absolute time becomes readable
when the kernel's high-resolution timer fires; the loop sees it as ordinary I/O.
With the thread's timer slack set to 1 ns, the wake-up is late only by scheduling, and
``WakeMargin`` learns how late that is, so that the release loop stops sleeping early
enough; ``set_nice`` (``--nice``) makes scheduling delay it less where other programs
keep the cores busy.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("srtm.broker")

_CLOCK_REALTIME = 0
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
_PR_SET_TIMERSLACK = 29
#: Where Linux sets the nice value of this process's session group (autogroup).
_AUTOGROUP = Path("/proc/self/autogroup")


#: The longest a wait ends early to spin instead, by default (``--release-spin-max-us``):
#: past it, spinning costs more CPU than a late release is worth (a timer this late is a
#: loaded machine, not a wake-up).
MAX_SPIN_NS = 1_000_000


@dataclass
class WakeMargin:
    """How long before a release its wait should end, so that the timer's wake-up
    latency is spent spinning, not late: at least ``floor_ns`` (``--release-spin-us``), and
    a quarter more than the latest wake-ups seen, a high-water mark that decays by
    ``decay`` a wake-up (half-life about 140: the one wake-up in a hundred that is late
    past the rest still sets the spin when the next such one comes), at most ``cap_ns``
    (``--release-spin-max-us``; a cap below the floor: the floor); a floor of 0 never
    spins.

    On the development VM a timer wakes 52-82 µs late at the median and 157-662 µs at
    p99; where it wakes on time the spin stays at its floor. The same build then spins
    only as long as its machine needs."""

    floor_ns: int
    cap_ns: int = MAX_SPIN_NS
    decay: float = 0.995
    high_ns: float = 0.0

    def woke(self, late_ns: int) -> None:
        """A timer armed for a time fired ``late_ns`` after it."""
        self.high_ns = max(float(late_ns), self.high_ns * self.decay)

    @property
    def spin_ns(self) -> int:
        if not self.floor_ns:  # never spin: brokers sharing cores (live experiments)
            return 0
        return max(self.floor_ns, min(self.cap_ns, int(self.high_ns * 1.25)))


def tighten_timer_slack() -> None:
    """Let this thread's timers fire 1 ns late at most: the default slack lets the
    kernel fire them up to 50 µs late to batch wake-ups."""
    ctypes.CDLL(ctypes.util.find_library("c")).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)


def set_nice(nice: int, autogroup: Path = _AUTOGROUP) -> None:
    """This thread's nice value (threads it starts later inherit it), and its session's
    where the kernel shares the CPUs between sessions first (``autogroup``, Linux's
    autogroup: a nice value weighs only against the tasks of its own session). An
    OSError that names the setting and what it needs where the system refuses the
    thread's; a warning where only the session's cannot be set (a read-only /proc)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        need = f" (below 0 needs CAP_SYS_NICE or an RLIMIT_NICE of at least {20 - nice})"
        raise type(exc)(f"--nice {nice}: {exc.strerror}{need if nice < 0 else ''}") from None
    try:
        autogroup.write_text(f"{nice}\n")
    except FileNotFoundError:
        pass  # no autogroup: the kernel shares the CPUs between tasks, the thread's counts
    except OSError as exc:
        log.warning(
            "--nice %d: the session's nice value is not set (%s: %s): programs of other "
            "sessions still get an even share of the CPUs beside it",
            nice, autogroup, exc.strerror,
        )  # fmt: skip


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerFd:
    """A one-shot timer on CLOCK_REALTIME (the clock of arrival stamps and releases)."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError("timerfd needs Linux")
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = self._libc.timerfd_create(_CLOCK_REALTIME, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd: int = fd
        self.armed_ns: int | None = None
        self._spec = _Itimerspec()
        tighten_timer_slack()

    def arm(self, at_ns: int) -> None:
        """Fire at ``at_ns`` (CLOCK_REALTIME ns); a time in the past fires at once."""
        at_ns = max(at_ns, 1)  # an all-zero value would disarm
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(at_ns, 1_000_000_000)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.armed_ns = at_ns

    def disarm(self) -> None:
        if self.armed_ns is None:
            return
        self._spec.it_value.tv_sec = self._spec.it_value.tv_nsec = 0
        self._libc.timerfd_settime(self.fd, 0, ctypes.byref(self._spec), None)
        self.armed_ns = None

    def consume(self) -> None:
        """Acknowledge an expiry (the fd stays readable until read)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)
        self.armed_ns = None

    def close(self) -> None:
        os.close(self.fd)
