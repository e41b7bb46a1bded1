"""A message as the broker holds it, and the ids it gives messages."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

_c_hex_ids: Callable[[int, int], list[bytes]] | None
try:
    from srtm.broker._records import hex_ids as _c_hex_ids
except ImportError:  # not built (optional at install): Python's below
    _c_hex_ids = None


@lru_cache(maxsize=64)
def _words(n: int) -> struct.Struct:
    return struct.Struct(f">{n}Q")


@lru_cache(maxsize=64)
def _sixteens(n: int) -> struct.Struct:
    """Cuts ``16 * n`` bytes into ``n`` of 16 in one call (half the time of a regex)."""
    return struct.Struct("16s" * n)


def hex_ids_py(first: int, n: int) -> list[bytes]:
    """The ``n`` ids ``first``, ``first + 1``, ..., each its 16 lowercase hex digits
    (``_records.c``'s ``hex_ids``, and its errors: ValueError for a negative ``n``,
    OverflowError for an id below 0 or past 64 bits)."""
    if n < 0:
        raise ValueError("hex_ids: n must be >= 0")
    if first < 0 or first + max(n, 1) - 1 >= 1 << 64:
        raise OverflowError("hex_ids: an id below 0 or past 64 bits")
    return [b"%016x" % i for i in range(first, first + n)]


class Origin(Protocol):
    """Where a message read from disk came from: its segment stays until it is settled."""

    def settle(self, k: int = 1) -> None:
        """This copy (``k`` copies) is FIN'd or written to another durable queue."""

    def share(self, n: int) -> None:
        """``n`` more copies exist (a topic handing it to several channels)."""


@dataclass(slots=True)
class Message:
    """One message; each channel holds its own copy (own attempts, own deadlines).

    Times are CLOCK_REALTIME ns: ``timestamp_ns`` is what NSQ clients see, ``arrival_ns``
    the kernel's receive stamp, ``release_ns`` when the topic's sub-bucket let it go.
    """

    id: bytes
    body: bytes
    timestamp_ns: int
    arrival_ns: int
    release_ns: int = 0
    attempts: int = 0
    publisher: str = ""
    #: Set on messages read from a disk queue (not compared: the same message either way).
    origin: Origin | None = field(default=None, compare=False, repr=False)

    def copy(self) -> Message:
        return Message(
            self.id,
            self.body,
            self.timestamp_ns,
            self.arrival_ns,
            self.release_ns,
            self.attempts,
            self.publisher,
        )


class MessageIds:
    """16 hex characters, unique per broker: ``broker_id`` (12 bits), then a counter.

    ``start`` lets a restarted broker continue after the ids it persisted.
    """

    def __init__(self, broker_id: int, start: int = 0) -> None:
        if not 0 <= broker_id < 4096:
            raise ValueError(f"broker_id must be in 0..4095, got {broker_id}")
        self._prefix = broker_id << 52
        self.last = start - 1

    def next(self) -> bytes:
        self.last += 1
        return b"%016x" % (self._prefix | self.last)

    def give_back(self) -> None:
        """The last id taken was not used after all (its message was not kept): the next
        ``take`` gives it again."""
        self.last -= 1

    def take(self, n: int) -> list[bytes]:
        """``n`` ids at once, in order (as ``n`` calls of ``next``): in C where
        ``srtm.broker._records`` was built (``hex_ids_py`` is its reference)."""
        first = self.last + 1
        self.last += n
        prefix = self._prefix
        if _c_hex_ids is not None and not self.last >> 52:
            return _c_hex_ids(prefix | first, n)
        if n == 1:  # a PUB: no comprehension (a frame of its own)
            return [b"%016x" % (prefix | first)]
        if n < 32 or self.last >> 52:
            # Few (a format each is as fast), or past the counter's 52 bits (never, really).
            return [b"%016x" % (prefix | i) for i in range(first, first + n)]
        # Many (an MPUB): in C, not a format per id: big-endian words, in hex, cut in 16s.
        start = prefix | first
        return list(_sixteens(n).unpack(_words(n).pack(*range(start, start + n)).hex().encode()))
