"""A FIFO of messages bounded in memory: past ``mem_size`` it overflows to a backend.

Queued messages are kept as plain tuples of their fields, not ``Message`` objects:
CPython's collector stops tracking a tuple of atomic values after one young
collection, so a queue a million deep costs full collections nothing (as objects they
made the broker spend a third of its time in collections, with pauses of 250 ms).
A record is immutable, so every channel of a topic can share the same one. A message
read from disk also carries its ``origin`` (settled when it is FIN'd or written again),
which only the records of messages read back from disk hold. ``DeferredQueue`` keeps
deferred messages by due time under the same bound, over the same kind of backend.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from srtm.broker.message import Message, Origin

#: (id, body, timestamp_ns, arrival_ns, release_ns, attempts, publisher, origin): Message's
#: fields
Record = tuple[bytes, bytes, int, int, int, int, str, Origin | None]

#: A publish of more messages than this is taken this many at a time, one slice per loop
#: turn (``Broker.publish``), and its connection runs nothing else until it is done: a
#: slice costs milliseconds, even shaped (a booking per message), and an ordinary MPUB
#: is one slice.
PUBLISH_SLICE = 4096


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


#: Later than any due time (ns).
_FOREVER = 2**63 - 1


class DeferredQueue:
    """Messages due later (DPUB), soonest first, bounded in memory as a ``MessageQueue``.

    Memory keeps the soonest due, up to ``spill.mem_size`` (a sorted list); one due later
    than all of them, or pushed out by one due sooner, goes to ``spill``'s backend (a disk
    queue, ``topic@deferred``: a FIFO, the due time in each record's ``release_ns``).
    Records come back from the backend as memory has room, and all of them pass through
    memory again (a *pass*: the soonest stay, the others are written back) once the
    earliest due time the backend may hold has come: so none is given out before it is
    due, nor later than the pass that finds it. With ``mem_size`` 0 every push goes to the
    backend (acknowledged means written) and up to ``read_back`` records read back are
    held in memory (they stay on disk until settled). Without a backend (ephemeral) what
    does not fit is dropped and counted in ``spill.dropped``.
    """

    __slots__ = ("_disk_min", "_mem", "_pass_left", "_pass_min", "_seq", "read_back", "spill")

    def __init__(self, spill: MessageQueue, read_back: int = 256) -> None:
        #: (-due, -sequence, record), ascending: the soonest due last (``pop`` gives it),
        #: the latest first; the sequence keeps equal due times in arrival order.
        self._mem: list[tuple[int, int, Record]] = []
        self._seq = itertools.count()
        #: Only its bound, its backend and its drop count are used (its deque stays empty).
        self.spill = spill
        self.read_back = read_back
        #: No record in the backend is due before this (0: not known, after a restart).
        self._disk_min = 0 if spill.backend_depth else _FOREVER
        #: Records a pass still has to take from the backend (0: no pass), and the
        #: earliest due time of those written to the backend since the pass began.
        self._pass_left = 0
        self._pass_min = _FOREVER

    def __len__(self) -> int:
        return len(self._mem) + self.spill.backend_depth

    @property
    def memory_depth(self) -> int:
        return len(self._mem)

    @property
    def backend_depth(self) -> int:
        return self.spill.backend_depth

    def _hold(self) -> int:
        """How many records read back memory may hold."""
        return self.spill.mem_size or self.read_back

    def push(self, msg: Message, due_ns: int) -> bool:
        """Keep ``msg`` until ``due_ns``; False if it had to be dropped (no backend, full)."""
        msg.release_ns = due_ns
        mem, ov = self._mem, self.spill.overflow
        entry = (-due_ns, -next(self._seq), to_record(msg))
        if len(mem) < self.spill.mem_size:
            bisect.insort(mem, entry)
            return True
        if ov is None:
            self.spill.dropped += 1
            settle(msg.origin)
            return False
        if self.spill.mem_size and mem and entry > mem[0]:
            entry, mem[0] = mem[0], entry  # due sooner than the latest kept: that one goes
            mem.sort()  # one element out of place: timsort's linear case
        self._write(entry)
        return True

    def _write(self, entry: tuple[int, int, Record]) -> None:
        ov = self.spill.overflow
        assert ov is not None
        ov.push(Message(*entry[2]))
        due = -entry[0]
        self._disk_min = min(self._disk_min, due)
        self._pass_min = min(self._pass_min, due)

    def restore(self, msgs: Iterable[Message]) -> None:
        """Put back what a graceful stop saved (``release_ns``: due), whatever the bound."""
        for m in msgs:
            bisect.insort(self._mem, (-m.release_ns, -next(self._seq), to_record(m)))

    def _refill(self, now: int | None) -> None:
        """Take records back from the backend: as many as memory has room for, or, once
        one there may be due by ``now``, all of them (a pass, as they can be read)."""
        ov = self.spill.overflow
        if ov is None or not len(ov):
            self._disk_min, self._pass_left = _FOREVER, 0
            return
        mem, hold = self._mem, self._hold()
        if not self._pass_left and now is not None and self._disk_min <= now:
            self._pass_left, self._pass_min = len(ov), _FOREVER
        want = max(self._pass_left, hold - len(mem))
        if want <= 0:
            return
        records = ov.pop_records(want)
        if self._pass_left:
            self._pass_left = max(0, self._pass_left - len(records))
            passed = not self._pass_left
        else:
            passed = False
        for r in records:
            entry = (-r[4], -next(self._seq), r)
            if len(mem) < hold:
                bisect.insort(mem, entry)
            elif entry > mem[0]:
                entry, mem[0] = mem[0], entry
                mem.sort()
                self._write(entry)
            else:
                self._write(entry)
        if passed:
            self._disk_min = self._pass_min  # what the backend holds now was written since

    def next_due_ns(self) -> int | None:
        """When the soonest one is due, or one in the backend may be (None: none known)."""
        self._refill(None)
        due = -self._mem[-1][0] if self._mem else None
        if len(self.spill.overflow or ()):
            due = self._disk_min if due is None else min(due, self._disk_min)
        return due

    def pop_due(self, now: int) -> list[Message]:
        """Those due by ``now``, soonest first (their ``release_ns`` still the due time)."""
        mem = self._mem
        out: list[Message] = []
        while True:
            self._refill(now)  # each one taken makes room for one from the backend
            if not mem or -mem[-1][0] > now:
                return out
            out.append(Message(*mem.pop()[2]))

    def memory(self) -> list[tuple[Message, int | None]]:
        """What is held in memory (read ahead of the disk too), with due times."""
        out: list[tuple[Message, int | None]] = [
            (Message(*r), -d) for d, _, r in reversed(self._mem)
        ]
        if self.spill.overflow is not None:
            out += [(m, m.release_ns) for m in self.spill.overflow.read_ahead()]
        return out

    def clear(self) -> int:
        n = len(self)
        for _, _, r in self._mem:
            settle(r[7])
        self._mem.clear()
        self.spill.clear()
        self._disk_min, self._pass_left = _FOREVER, 0
        return n
