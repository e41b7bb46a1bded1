"""GCRA token bucket: exact, thread-safe, with blocking and asyncio waits.

A request of ``n`` tokens arriving at ``t`` is released at
``max(t, TAT + (n − 1)·T − τ)``, then ``TAT = max(TAT, t) + n·T``. Releases are
anchored to that ideal schedule, so a late wake-up never shifts later ones.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from srtm.ratelimit.params import BucketParams, check_bucket, grid

Clock = Callable[[], int]
Sleep = Callable[[float], None]

#: Blocking waits sleep until this long before the release time and spin the rest.
#: On a shared VM, Linux wakes a sleeping thread ~100 µs late at the median and up to
#: 1.4 ms late at the 99th percentile (benchmarks/ratelimit.py, "machine" line).
DEFAULT_SPIN_NS = 1_500_000
#: asyncio timers fire up to ~1 ms late (epoll has millisecond timeouts), so the
#: last stretch is spent yielding to the loop rather than in a timer.
DEFAULT_ASYNC_SPIN_NS = 1_500_000


@dataclass(frozen=True, slots=True)
class Reservation:
    """Tokens granted at ``release_ns``; ``wait_ns`` after the request's arrival."""

    tokens: int
    release_ns: int
    wait_ns: int
    _end_tat: int

    @property
    def backlog_ns(self) -> int:
        """The bucket's unfinished work right after this booking (its virtual backlog)."""
        return self._end_tat - (self.release_ns - self.wait_ns)


@dataclass(frozen=True, slots=True)
class BucketCounters:
    """Requests admitted (now or later), denied by ``try_acquire``/timeouts, and delayed."""

    admitted: int
    denied: int
    waited: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class TokenBucket:
    """A token bucket ``(rate, burst)`` on an injectable monotonic nanosecond clock."""

    __slots__ = (
        "_admitted",
        "_async_spin_ns",
        "_clock",
        "_denied",
        "_lock",
        "_params",
        "_sleep",
        "_spin_ns",
        "_t",
        "_tat",
        "_tau",
        "_waited",
    )

    def __init__(
        self,
        rate: float,
        burst: float,
        clock: Clock = time.monotonic_ns,
        *,
        sleep: Sleep = time.sleep,
        spin_ns: int = DEFAULT_SPIN_NS,
        async_spin_ns: int = DEFAULT_ASYNC_SPIN_NS,
    ) -> None:
        self._params = check_bucket(rate, burst)
        # GCRA constants in ns (see params.grid), kept flat: the hot path reads them.
        g = grid(rate, burst)
        self._t, self._tau = g.t, g.tau
        self._clock = clock
        self._sleep = sleep
        self._spin_ns = spin_ns
        self._async_spin_ns = async_spin_ns
        self._lock = threading.Lock()
        self._tat = 0  # ns; ≤ any clock reading means "full"
        self._admitted = 0
        self._denied = 0
        self._waited = 0

    # -- parameters ---------------------------------------------------------
    @property
    def rate(self) -> float:
        return self._params.rate

    @property
    def burst(self) -> float:
        return self._params.burst

    @property
    def params(self) -> BucketParams:
        return self._params

    def _check_n(self, n: int) -> None:
        if not isinstance(n, int) or n < 1 or n > self._params.burst:
            raise ValueError(
                f"n must be an integer between 1 and the burst ({self._params.burst!r}), got {n!r}"
            )

    def set_rate(self, rate: float) -> None:
        """Change the rate now, keeping the tokens currently in the bucket (or owed)."""
        rate = check_bucket(rate, self._params.burst).rate
        with self._lock:
            now = self._clock()
            new = grid(rate, self._params.burst)
            backlog = max(0, self._tat - now)
            self._tat = now + _ceil_div(backlog * new.t, self._t)
            self._t, self._tau = new.t, new.tau
            self._params = BucketParams(rate, self._params.burst)

    def set_burst(self, burst: float) -> None:
        """Change the depth now, keeping the token count (capped at the new depth)."""
        burst = check_bucket(self._params.rate, burst).burst
        with self._lock:
            now = self._clock()
            new = grid(self._params.rate, burst)
            backlog = max(0, self._tat - now)
            self._tat = now + max(0, backlog + new.tau - self._tau)
            self._t, self._tau = new.t, new.tau
            self._params = BucketParams(self._params.rate, burst)

    # -- non-blocking -------------------------------------------------------
    def try_acquire(self, n: int = 1) -> bool:
        """Take ``n`` tokens if they are there now; never waits."""
        if n != 1:
            self._check_n(n)
        # The hot path: explicit acquire/release is measurably cheaper than ``with``.
        lock = self._lock
        lock.acquire()
        try:
            now = self._clock()
            t = self._t
            tat = self._tat
            if tat < now:
                tat = now
            if tat + (n - 1) * t - self._tau > now:
                self._denied += 1
                return False
            self._tat = tat + n * t
            self._admitted += 1
            return True
        finally:
            lock.release()

    def reserve(self, n: int = 1, at: int | None = None) -> Reservation:
        """Book ``n`` tokens for a request arriving at ``at`` (default: now); never refuses."""
        self._check_n(n)
        res = self._reserve(n, at, None)
        assert res is not None
        return res

    def _reserve(self, n: int, at: int | None, max_wait_ns: int | None) -> Reservation | None:
        with self._lock:
            now = self._clock() if at is None else at
            t = self._t
            tat = self._tat if self._tat > now else now
            release = tat + (n - 1) * t - self._tau
            if release > now:
                wait = release - now
            else:
                release, wait = now, 0
            if max_wait_ns is not None and wait > max_wait_ns:
                self._denied += 1
                return None
            self._tat = tat + n * t
            self._admitted += 1
            if wait:
                self._waited += 1
            return Reservation(n, release, wait, self._tat)

    def cancel(self, reservation: Reservation) -> int:
        """Give back a reservation's tokens; returns how many came back.

        Only the most recent reservation, not yet released, can be undone exactly;
        tokens of an older one are already counted in later releases and stay spent.
        """
        with self._lock:
            if reservation._end_tat != self._tat or self._clock() >= reservation.release_ns:
                return 0
            self._tat -= reservation.tokens * self._t
            self._admitted -= 1
            if reservation.wait_ns:
                self._waited -= 1
            return reservation.tokens

    # -- blocking -----------------------------------------------------------
    def acquire(self, n: int = 1, timeout: float | None = None) -> bool:
        """Wait for ``n`` tokens; False at once if they would come after ``timeout`` s."""
        self._check_n(n)
        res = self._reserve(n, None, _timeout_ns(timeout))
        if res is None:
            return False
        if res.wait_ns:
            self._sleep_until(res.release_ns)
        return True

    def _sleep_until(self, deadline_ns: int) -> None:
        clock = self._clock
        while True:
            remaining = deadline_ns - clock()
            if remaining <= 0:
                return
            if remaining > self._spin_ns:
                self._sleep((remaining - self._spin_ns) / 1e9)
            # else: spin; the clock read is the whole loop body.

    async def acquire_async(self, n: int = 1, timeout: float | None = None) -> bool:
        """asyncio wait for ``n`` tokens, FIFO: the booking is made on the call.

        A cancelled waiter gives its tokens back where it can (see ``cancel``).
        """
        self._check_n(n)
        res = self._reserve(n, None, _timeout_ns(timeout))
        if res is None:
            return False
        if res.wait_ns:
            try:
                await self._async_sleep_until(res.release_ns)
            except asyncio.CancelledError:
                self.cancel(res)
                raise
        return True

    async def _async_sleep_until(self, deadline_ns: int) -> None:
        clock = self._clock
        remaining = deadline_ns - clock()
        if remaining > self._async_spin_ns:
            await asyncio.sleep((remaining - self._async_spin_ns) / 1e9)
        while clock() < deadline_ns:
            await asyncio.sleep(0)

    # -- read-outs ----------------------------------------------------------
    def tokens(self, at: int | None = None) -> float:
        """Tokens in the bucket at ``at`` (default now); negative while tokens are owed."""
        with self._lock:
            now = self._clock() if at is None else at
            backlog = max(0, self._tat - now)
            return (self._tau + self._t - backlog) / self._t

    def backlog_ns(self, at: int) -> int:
        """The bucket's unfinished work at ``at`` (its virtual backlog): right after a
        booking at ``at``, that booking's ``Reservation.backlog_ns``."""
        with self._lock:
            return max(0, self._tat - at)

    def next_release_ns(self) -> int:
        """When a one-token request made now would be released."""
        with self._lock:
            return max(self._clock(), self._tat - self._tau)

    def may_release_by(self, at: int) -> bool:
        """Whether a one-token request booked now could be released by ``at``: False
        means no request arriving by then can be (the tokens are owed past it)."""
        with self._lock:
            return self._tat - self._tau <= at

    @property
    def counters(self) -> BucketCounters:
        with self._lock:
            return BucketCounters(self._admitted, self._denied, self._waited)


def _timeout_ns(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return int(timeout * 1e9)
