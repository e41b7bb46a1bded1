"""Deterministic clocks for the pure core's tests."""

from __future__ import annotations

import threading


class FakeClock:
    """A nanosecond clock that moves only when told to (or when slept on)."""

    def __init__(self, start: int = 0, step: int = 0) -> None:
        self.now = start
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            t = self.now
            self.now += self.step
            return t

    def advance(self, ns: int) -> None:
        with self._lock:
            self.now += ns

    def sleep(self, seconds: float) -> None:
        self.advance(max(1, round(seconds * 1e9)))
