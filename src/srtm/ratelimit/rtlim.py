"""A pacer with the semantics of the rtlim C API (``rtlim_create`` / ``rtlim_take``)."""

from __future__ import annotations

import enum
import threading
import time

from srtm.ratelimit.bucket import Clock, Sleep

OK = 0
INSUFFICIENT = -1
OVER_REFILL = -2


class RtlimMode(enum.IntEnum):
    """How ``take`` behaves when the tokens are not there."""

    NON_BLOCK = 0
    BLOCK_SPIN = 1
    BLOCK_SLEEP = 2


class Rtlim:
    """``refill_token_amount`` tokens every ``refill_interval_ns``, as rtlim does it.

    How this differs from the GCRA ``TokenBucket``:

    * refill is all at once and not cumulative: when an interval has passed since
      the last refill, the count is *reset* to the full amount, however long ago
      that was; GCRA earns tokens continuously at ``r``;
    * the refill instant is re-anchored to the moment a ``take`` notices it, so
      time between the interval's end and the next call is lost, and up to two
      amounts can leave back to back around a refill; GCRA stays on its ideal
      schedule and never releases more than ``b + r·Δ`` in any interval ``Δ``;
    * a blocking take larger than the amount drains the bucket interval by
      interval; non-blocking takes answer −1 (not enough now) or −2 (never enough).

    Unlike the C original, a lock makes it safe to share between threads.
    """

    def __init__(
        self,
        refill_interval_ns: int,
        refill_token_amount: int,
        clock: Clock = time.monotonic_ns,
        sleep: Sleep = time.sleep,
    ) -> None:
        if not isinstance(refill_interval_ns, int) or refill_interval_ns <= 0:
            raise ValueError(
                f"refill_interval_ns must be an integer > 0, got {refill_interval_ns!r}"
            )
        if not isinstance(refill_token_amount, int) or refill_token_amount <= 0:
            raise ValueError(
                f"refill_token_amount must be an integer > 0, got {refill_token_amount!r}"
            )
        self.refill_interval_ns = refill_interval_ns
        self.refill_token_amount = refill_token_amount
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = refill_token_amount
        self._last_refill_ns = clock()

    @property
    def tokens(self) -> int:
        """Tokens left in the current interval (as of the last ``take``)."""
        return self._tokens

    def take(self, n: int = 1, mode: RtlimMode | int = RtlimMode.BLOCK_SPIN) -> int:
        """Take ``n`` tokens: 0 on success, −1 / −2 only in ``NON_BLOCK`` mode."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        if not isinstance(mode, RtlimMode):  # the enum constructor costs ~0.4 µs
            mode = RtlimMode(mode)
        if mode is RtlimMode.NON_BLOCK and n > self.refill_token_amount:
            return OVER_REFILL
        with self._lock:
            needed = n
            while True:
                now = self._clock()
                if now >= self._last_refill_ns + self.refill_interval_ns:
                    self._tokens = self.refill_token_amount
                    self._last_refill_ns = now
                if needed <= self._tokens:
                    self._tokens -= needed
                    return OK
                if mode is RtlimMode.NON_BLOCK:
                    return INSUFFICIENT
                needed -= self._tokens
                self._tokens = 0
                if mode is RtlimMode.BLOCK_SLEEP:
                    self._sleep((self._last_refill_ns + self.refill_interval_ns - now) / 1e9)
