"""A FIFO of messages bounded in memory: past ``mem_size`` it overflows to a backend.

Queued messages are kept as plain tuples of their fields, not ``Message`` objects:
CPython's collector stops tracking a tuple of atomic values after one young
collection, so a queue a million deep costs full collections nothing (as objects they
made the broker spend a third of its time in collections, with pauses of 250 ms).
A record is immutable, so every channel of a topic can share the same one. A message
read from disk also carries its ``origin`` (settled when it is FIN'd or written again),
which only the records of messages read back from disk hold.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from srtm.broker.message import Message, Origin

#: (id, body, timestamp_ns, arrival_ns, release_ns, attempts, publisher, origin): Message's
#: fields
Record = tuple[bytes, bytes, int, int, int, int, str, Origin | None]


def to_record(m: Message) -> Record:
    return (
        m.id, m.body, m.timestamp_ns, m.arrival_ns, m.release_ns, m.attempts, m.publisher,
        m.origin,
    )  # fmt: skip


def fresh_records_py(
    ids: list[bytes], bodies: list[bytes], now: int, arrival: int, publisher: str
) -> list[Record]:
    """The records of messages published together at ``arrival`` (each released on
    arrival, on no attempt yet)."""
    return [
        (i, b, now, arrival, arrival, 0, publisher, None) for i, b in zip(ids, bodies, strict=True)
    ]


_c_fresh_records: Callable[[list[bytes], list[bytes], int, int, str], list[Record]] | None
try:
    from srtm.broker._records import fresh_records as _c_fresh_records
except ImportError:  # not built (no compiler at install): made in Python
    _c_fresh_records = None


def fresh_records(
    ids: list[bytes], bodies: list[bytes], now: int, arrival: int, publisher: str
) -> list[Record]:
    """``fresh_records_py``, in C where ``srtm.broker._records`` was built (at install)."""
    if _c_fresh_records is not None and type(ids) is list and type(bodies) is list:
        return _c_fresh_records(ids, bodies, now, arrival, publisher)
    return fresh_records_py(ids, bodies, now, arrival, publisher)


def popleft_many(dq: deque[Record], k: int) -> list[Record]:
    """Up to ``k`` records from the front of ``dq``, in order: the whole deque in one
    copy where it holds no more."""
    if len(dq) <= k:
        out = list(dq)
        dq.clear()
        return out
    popleft = dq.popleft
    return [popleft() for _ in range(k)]


def attempted(r: Record) -> Record:
    """``r`` after one more delivery attempt (a dispatched record keeps the attempts it had
    before; its frame and anything put back carry one more)."""
    return (r[0], r[1], r[2], r[3], r[4], r[5] + 1, r[6], r[7])


def settle(origin: Origin | None) -> None:
    """A message read from disk is gone for good (dropped, emptied): let its segment go."""
    if origin is not None:
        origin.settle()


class Overflow(Protocol):
    """Where messages beyond the memory bound go (a disk queue), FIFO."""

    def push(self, msg: Message) -> None: ...

    def push_many(self, records: list[Record]) -> None:
        """``push`` of each, in order (fresh records: an MPUB's overflow)."""
        ...

    def pop_records(self, n: int) -> list[Record]:
        """Up to ``n`` messages from the front, in order, as records (fewer: that is all
        it can give now)."""
        ...

    def __len__(self) -> int: ...

    def clear(self) -> None: ...

    def read_ahead(self) -> list[Message]: ...


class MessageQueue:
    """FIFO order across memory and overflow: once anything overflowed, later messages
    follow it there until memory has caught up.

    Without an overflow backend (ephemeral topics and channels, as in nsqd) messages past
    the bound are dropped and counted in ``dropped``.
    """

    __slots__ = ("_mem", "dropped", "mem_size", "overflow")

    def __init__(self, mem_size: int, overflow: Overflow | None = None) -> None:
        if mem_size < 0:
            raise ValueError(f"mem_size must be >= 0, got {mem_size}")
        self._mem: deque[Record] = deque()
        self.mem_size = mem_size
        self.overflow = overflow
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._mem) + (len(self.overflow) if self.overflow is not None else 0)

    def __bool__(self) -> bool:
        """Whether ``popleft`` has a message to give now (what the backend holds but
        cannot read at the moment does not count)."""
        if self._mem:
            return True
        if self.overflow is None or not len(self.overflow):
            return False
        self._refill()
        return bool(self._mem)

    @property
    def memory_depth(self) -> int:
        return len(self._mem)

    @property
    def backend_depth(self) -> int:
        return len(self.overflow) if self.overflow is not None else 0

    def memory(self) -> list[Message]:
        """The messages held in memory, in order (copies), with what the backend read
        ahead of its disk and holds in memory too (what a graceful stop saves)."""
        out = [Message(*r) for r in self._mem]
        if self.overflow is not None:
            out += self.overflow.read_ahead()
        return out

    def append(self, msg: Message) -> bool:
        """Queue ``msg`` at the back; False if it had to be dropped (no backend, full)."""
        ov = self.overflow
        if ov is not None and (len(ov) or len(self._mem) >= self.mem_size):
            ov.push(msg)
            return True
        if len(self._mem) >= self.mem_size and ov is None:
            self.dropped += 1
            settle(msg.origin)
            return False
        self._mem.append(
            (msg.id, msg.body, msg.timestamp_ns, msg.arrival_ns, msg.release_ns, msg.attempts,
             msg.publisher, msg.origin)
        )  # fmt: skip
        return True

    def extend(self, records: list[Record]) -> None:
        """Queue fresh records (no ``origin``) at the back, as ``append`` would each: what
        fits in memory (while nothing waits in the backend) in one C-level extend, the rest
        handed to the backend in one call (or dropped, without one)."""
        mem = self._mem
        ov = self.overflow
        if ov is None or not len(ov):
            room = self.mem_size - len(mem)
            if len(records) <= room:
                mem.extend(records)
                return
            if room > 0:
                mem.extend(records[:room])
                records = records[room:]
        if ov is not None:
            ov.push_many(records)
            return
        self.dropped += len(records)
        for r in records:
            settle(r[7])

    def take(self, n: int) -> list[Record]:
        """Up to ``n`` records from the front, in order (memory first, refilled from the
        backend as ``popleft`` would)."""
        mem = self._mem
        out: list[Record] = []
        while len(out) < n:
            if not mem:
                self._refill()
                if not mem:
                    break
            out += popleft_many(mem, n - len(out))
        return out

    def appendleft(self, msg: Message) -> None:
        """Put a message back at the front (a requeue on disconnect); never dropped."""
        self._mem.appendleft(to_record(msg))

    def extendleft(self, msgs: Iterable[Message]) -> None:
        """Put ``msgs`` in front, keeping their order (restoring what a stop saved)."""
        self._mem.extendleft(reversed([to_record(m) for m in msgs]))

    def _refill(self) -> None:
        """Take what the backend can give now into memory, up to the bound (in one call:
        a disk queue hands its read-ahead over in one slice)."""
        ov = self.overflow
        if ov is None or not len(ov):
            return  # nothing there: no call down (a drained channel's every take asks)
        room = max(1, self.mem_size) - len(self._mem)
        if room > 0:
            self._mem.extend(ov.pop_records(room))

    def peek_release_ns(self) -> int | None:
        """The head's release time, without taking it."""
        if not self._mem:
            self._refill()
        return self._mem[0][4] if self._mem else None

    def peek_arrival_ns(self) -> int | None:
        if not self._mem:
            self._refill()
        return self._mem[0][3] if self._mem else None

    def head_arrival_ns(self) -> int | None:
        """The head's arrival if the head is in memory (None: empty, or the head is in the
        backend, which is not asked: a reader of the stats must not move messages)."""
        return self._mem[0][3] if self._mem else None

    def set_head_release(self, release_ns: int) -> None:
        """Book the head's release time (the queue must not be empty)."""
        r = self._mem[0]
        self._mem[0] = (r[0], r[1], r[2], r[3], release_ns, r[5], r[6], r[7])

    def popleft(self) -> Message:
        if not self._mem:
            self._refill()
        return Message(*self._mem.popleft())

    def drain(self) -> Iterator[Message]:
        """Take every message, in order (memory first, then the backend)."""
        while self:
            yield self.popleft()

    def clear(self) -> int:
        n = len(self)
        for r in self._mem:
            settle(r[7])
        self._mem.clear()
        if self.overflow is not None:
            self.overflow.clear()
        return n


class DeferredQueue:
    """Messages due later (DPUB), soonest first, bounded in memory as a ``MessageQueue``.

    Up to ``spill.mem_size`` wait in memory, in a heap by due time; beyond that they go to
    ``spill``'s backend (a disk queue: ``topic@deferred``) in the order they came, and
    once anything is there later ones follow it until memory has caught up. They come
    back, in that order, as memory has room. So each is given out no earlier than it is
    due, and in due order among those in memory; one on disk waits for its turn to come
    back, which may be after it is due. A record's ``release_ns`` holds its due time
    (the disk format keeps it). Without a backend (ephemeral) the excess is dropped and
    counted in ``spill.dropped``.
    """

    __slots__ = ("_heap", "_seq", "spill")

    def __init__(self, spill: MessageQueue) -> None:
        #: (due, sequence, record): the sequence keeps equal due times in arrival order.
        self._heap: list[tuple[int, int, Record]] = []
        self._seq = itertools.count()
        #: Only its bound, its backend and its drop count are used (its deque stays empty).
        self.spill = spill

    def __len__(self) -> int:
        return len(self._heap) + self.spill.backend_depth

    @property
    def memory_depth(self) -> int:
        return len(self._heap)

    @property
    def backend_depth(self) -> int:
        return self.spill.backend_depth

    def push(self, msg: Message, due_ns: int) -> bool:
        """Keep ``msg`` until ``due_ns``; False if it had to be dropped (no backend, full)."""
        msg.release_ns = due_ns
        ov = self.spill.overflow
        if len(self._heap) < self.spill.mem_size and (ov is None or not len(ov)):
            heapq.heappush(self._heap, (due_ns, next(self._seq), to_record(msg)))
            return True
        if ov is not None:
            ov.push(msg)
            return True
        self.spill.dropped += 1
        settle(msg.origin)
        return False

    def restore(self, msgs: Iterable[Message]) -> None:
        """Put back what a graceful stop saved (``release_ns``: due), whatever the bound."""
        for m in msgs:
            heapq.heappush(self._heap, (m.release_ns, next(self._seq), to_record(m)))

    def _refill(self) -> None:
        ov = self.spill.overflow
        if ov is None or not len(ov):
            return
        room = max(1, self.spill.mem_size) - len(self._heap)
        if room > 0:
            for r in ov.pop_records(room):
                heapq.heappush(self._heap, (r[4], next(self._seq), r))

    def next_due_ns(self) -> int | None:
        """When the soonest one in memory is due (None: none there now)."""
        self._refill()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int) -> list[Message]:
        """Those due by ``now``, soonest first (their ``release_ns`` still the due time)."""
        heap = self._heap
        out: list[Message] = []
        while True:
            self._refill()  # each one taken makes room for the oldest on disk
            if not heap or heap[0][0] > now:
                return out
            out.append(Message(*heapq.heappop(heap)[2]))

    def memory(self) -> list[tuple[Message, int | None]]:
        """What is held in memory (read ahead of the disk too), with due times."""
        out: list[tuple[Message, int | None]] = [
            (Message(*r), due) for due, _, r in sorted(self._heap)
        ]
        if self.spill.overflow is not None:
            out += [(m, m.release_ns) for m in self.spill.overflow.read_ahead()]
        return out

    def clear(self) -> int:
        n = len(self)
        for _, _, r in self._heap:
            settle(r[7])
        self._heap.clear()
        self.spill.clear()
        return n
