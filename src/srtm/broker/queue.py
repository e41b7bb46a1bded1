"""A FIFO of messages bounded in memory: past ``mem_size`` it overflows to a backend.

Queued messages are kept as plain tuples of their fields (records), or as runs of
messages published together (their ids and bodies apart, see ``MessageQueue``), not
``Message`` objects: CPython's collector stops tracking a tuple of atomic values after
one young collection, so a queue a million deep costs full collections nothing (as
objects they made the broker spend a third of its time in collections, with pauses of
250 ms). A record is immutable, so every channel of a topic can share the same one. A message
read from disk also carries its ``origin`` (settled when it is FIN'd or written again),
which only the records of messages read back from disk hold. ``DeferredQueue`` keeps
deferred messages by due time under the same bound, over the same kind of backend.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, TypeVar

from srtm.broker.message import Message, Origin

#: (id, body, timestamp_ns, arrival_ns, release_ns, attempts, publisher, origin): Message's
#: fields
Record = tuple[bytes, bytes, int, int, int, int, str, Origin | None]

T = TypeVar("T")

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


def untrack_py(container: list[Any] | deque[Any]) -> None:
    """What ``untrack`` does where C was not built: nothing (the container stays tracked,
    and every full collection visits each of its entries)."""


_c_untrack: Callable[[list[Any] | deque[Any]], None] | None
try:
    from srtm.broker._records import untrack as _c_untrack
except ImportError:  # not built, or built before it had untrack
    _c_untrack = None


def untrack(container: list[Any] | deque[Any]) -> None:
    """Stop the collector tracking a queue's bulk storage (C's ``untrack``): it holds only
    what cannot refer back to it (bytes, strs, records, the ints and strs of runs), so it
    is in no cycle and refcounting frees what it drops, and a full collection no longer
    visits a million entries to free none of them (tens of ms with the loop held)."""
    if _c_untrack is not None:
        _c_untrack(container)


def popleft_many(dq: deque[T], k: int) -> list[T]:
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


class Kept(Enum):
    """Where a sensor's PUB went by the short way (``MessageQueue.put_single``)."""

    NOT = "not"  # nowhere: the general way (``extend``) takes it
    MEMORY = "memory"
    DISK = "disk"  # written to the backend's file at once (it is acknowledged as kept)


#: ``Kept``'s members for the hot path: looking one up on the class costs ~60 ns on
#: CPython 3.11, and a sensor's PUB compares a few.
NOT_KEPT, IN_MEMORY, ON_DISK = Kept.NOT, Kept.MEMORY, Kept.DISK


class Overflow(Protocol):
    """Where messages beyond the memory bound go (a disk queue), FIFO."""

    def push(self, msg: Message) -> None: ...

    def put_inline(self, r: Record) -> bool:
        """``push`` of one fresh record, written at once, where that is cheap (False, with
        nothing done, elsewhere: ``push_many`` takes it)."""
        ...

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


@dataclass(slots=True)  # not frozen: a frozen one's __init__ costs a setattr per field
class Fresh:
    """Messages published together (``fresh_records``' arguments), not yet made records:
    a queue keeps them as a run (see ``MessageQueue``)."""

    ids: list[bytes]
    bodies: list[bytes]
    now: int
    arrival: int
    publisher: str

    def __len__(self) -> int:
        return len(self.bodies)

    def records(self) -> list[Record]:
        return fresh_records(self.ids, self.bodies, self.now, self.arrival, self.publisher)


#: Messages published one at a time (PUBs) back to back, kept in a ``MessageQueue`` as
#: ``[count]``: their ids and bodies are in the queue's ``_ids`` and ``_bodies`` as a
#: run's are, and what differs from one to the next (timestamp, arrival, publisher) in
#: its ``_stamps``, ``_arrivals`` and ``_publishers``; released on arrival, on no attempt
#: yet, read from no disk. A list, not a tuple: the next PUB adds one to its count.
Singles = list[int]


#: Messages that share every field but their id and body, kept in a ``MessageQueue`` as
#: (count, timestamp_ns, arrival_ns, release_ns, attempts, publisher, origin): a
#: record's fields 2–7 are a run's 1–6. Its ids and bodies are in the queue's ``_ids``
#: and ``_bodies``.
Run = tuple[int, int, int, int, int, str, Origin | None]


def run_records_py(ids: list[bytes], bodies: list[bytes], run: Run) -> list[Record]:
    """The records of a run's messages ``ids`` and ``bodies``."""
    _, ts, arrival, release, attempts, publisher, origin = run
    return [
        (i, b, ts, arrival, release, attempts, publisher, origin)
        for i, b in zip(ids, bodies, strict=True)
    ]


_c_run_records: Callable[[list[bytes], list[bytes], Run], list[Record]] | None
try:
    from srtm.broker._records import run_records as _c_run_records
except ImportError:  # not built, or built before it had run_records: made in Python
    _c_run_records = None


def run_records(ids: list[bytes], bodies: list[bytes], run: Run) -> list[Record]:
    """``run_records_py``, in C where ``srtm.broker._records`` was built (at install)."""
    if _c_run_records is not None:
        return _c_run_records(ids, bodies, run)
    return run_records_py(ids, bodies, run)


def singles_records(
    ids: list[bytes],
    bodies: list[bytes],
    stamps: array[int],
    arrivals: array[int],
    publishers: list[str],
) -> list[Record]:
    """The records of singles' messages (released on arrival, no attempt yet, no origin),
    made in C by ``zip``."""
    k = len(ids)
    zeros, nones = itertools.repeat(0, k), itertools.repeat(None, k)
    return list(zip(ids, bodies, stamps, arrivals, arrivals, zeros, publishers, nones, strict=True))


class MessageQueue:
    """FIFO order across memory and overflow: once anything overflowed, later messages
    follow it there until memory has caught up.

    In memory a message is a record, or one of a *run*: messages published together (an
    MPUB) share every field but their id and body, so they are kept as one ``Run`` and
    their ids and bodies in two lists of their own, without a record each (a record is
    a tuple of 8, 112 bytes: a third of what a queued message of 100 bytes cost). Records
    are made as messages are taken. PUBs back to back are kept the same way (``Singles``),
    with their times in arrays and their publishers in a list: 16 bytes of arrays and a
    list slot where a record cost 120 and two ints 64. Runs, singles and records are in
    ``_runs``, in order.

    Without an overflow backend (ephemeral topics and channels, as in nsqd) messages past
    the bound are dropped and counted in ``dropped``.
    """

    __slots__ = (
        "_arrivals", "_at", "_bodies", "_ids", "_n", "_publishers", "_runs", "_sat", "_stamps",
        "dropped", "mem_size", "overflow",
    )  # fmt: skip

    def __init__(self, mem_size: int, overflow: Overflow | None = None) -> None:
        if mem_size < 0:
            raise ValueError(f"mem_size must be >= 0, got {mem_size}")
        self._runs: deque[Record | Run | Singles] = deque()
        #: The runs' ids and bodies from ``_at`` on (lists, not deques: a take slices
        #: them in C; what was taken is cut off once it is half of them).
        self._ids: list[bytes] = []
        self._bodies: list[bytes] = []
        self._at = 0
        #: The singles' times and publishers from ``_sat`` on (cut off as ``_ids`` is).
        self._stamps = array("q")
        self._arrivals = array("q")
        self._publishers: list[str] = []
        self._sat = 0
        for storage in (self._runs, self._ids, self._bodies, self._publishers):
            untrack(storage)
        #: Messages in memory (records, and the runs' messages).
        self._n = 0
        self.mem_size = mem_size
        self.overflow = overflow
        self.dropped = 0

    def __len__(self) -> int:
        return self._n + (len(self.overflow) if self.overflow is not None else 0)

    def __bool__(self) -> bool:
        """Whether ``popleft`` has a message to give now (what the backend holds but
        cannot read at the moment does not count)."""
        if self._n:
            return True
        if self.overflow is None or not len(self.overflow):
            return False
        self._refill()
        return bool(self._n)

    @property
    def memory_depth(self) -> int:
        return self._n

    @property
    def backend_depth(self) -> int:
        return len(self.overflow) if self.overflow is not None else 0

    def _records(self) -> Iterator[Record]:
        """What memory holds, in order, as records (without taking it)."""
        at, sat = self._at, self._sat
        ids, bodies = iter(self._ids[at:]), iter(self._bodies[at:])
        stamps, arrivals = iter(self._stamps[sat:]), iter(self._arrivals[sat:])
        publishers = iter(self._publishers[sat:])
        for e in self._runs:
            if not isinstance(e, list) and len(e) == 8:
                yield e
                continue
            k = e[0]
            some_ids, some_bodies = itertools.islice(ids, k), itertools.islice(bodies, k)
            if isinstance(e, list):
                yield from singles_records(
                    list(some_ids),
                    list(some_bodies),
                    array("q", itertools.islice(stamps, k)),
                    array("q", itertools.islice(arrivals, k)),
                    list(itertools.islice(publishers, k)),
                )
            else:
                yield from run_records_py(list(some_ids), list(some_bodies), e)

    def memory(self) -> list[Message]:
        """The messages held in memory, in order (copies), with what the backend read
        ahead of its disk and holds in memory too (what a graceful stop saves)."""
        out = [Message(*r) for r in self._records()]
        if self.overflow is not None:
            out += self.overflow.read_ahead()
        return out

    def append(self, msg: Message) -> bool:
        """Queue ``msg`` at the back; False if it had to be dropped (no backend, full)."""
        ov = self.overflow
        if ov is not None and (len(ov) or self._n >= self.mem_size):
            ov.push(msg)
            return True
        if self._n >= self.mem_size and ov is None:
            self.dropped += 1
            settle(msg.origin)
            return False
        self._runs.append(
            (msg.id, msg.body, msg.timestamp_ns, msg.arrival_ns, msg.release_ns, msg.attempts,
             msg.publisher, msg.origin)
        )  # fmt: skip
        self._n += 1
        return True

    def extend(self, batch: list[Record] | Fresh) -> None:
        """Queue fresh messages (no ``origin``) at the back, as ``append`` would each: what
        fits in memory (while nothing waits in the backend) in one C-level extend (a
        ``Fresh`` batch of more than one as a run), the rest handed to the backend in one
        call (or dropped, without one)."""
        room = self.mem_size - self._n
        if room <= 0:
            room = 0  # full: the backend is not asked what it holds (a call or two down)
        elif (ov := self.overflow) is not None and len(ov):
            room = 0
        if type(batch) is list:
            if len(batch) <= room:
                self._runs.extend(batch)
                self._n += len(batch)
                return
            if room:
                self._runs.extend(batch[:room])
                self._n += room
            self._spill(batch[room:])
            return
        assert isinstance(batch, Fresh)
        if not room:  # all of it to the backend, as records
            if batch.bodies:
                self._spill(batch.records())
            return
        n = len(batch.bodies)  # not ``len(batch)``: a Python call
        if n == 1:  # room, and nothing in the backend: kept in memory
            self.put_single(
                batch.ids[0], batch.bodies[0], batch.now, batch.arrival, batch.publisher
            )
            return
        if room < 2 or n < 2:  # one in memory, the rest to the backend (or none at all)
            self.extend(batch.records())
            return
        ids, bodies = batch.ids, batch.bodies
        if room < n:
            ids, bodies = ids[:room], bodies[:room]
        self._ids.extend(ids)
        self._bodies.extend(bodies)
        k = len(ids)
        self._runs.append((k, batch.now, batch.arrival, batch.arrival, 0, batch.publisher, None))
        self._n += k
        if k < n:
            self._spill(batch.records()[k:])

    def put_single(self, id_: bytes, body: bytes, now: int, arrival: int, publisher: str) -> Kept:
        """A PUB's message, as ``extend`` of its ``Fresh`` batch would queue it: in memory
        where there is room and nothing waits in the backend, else to the backend where it
        writes it at once (``Overflow.put_inline``). ``Kept.NOT``, with nothing done,
        elsewhere."""
        ov = self.overflow
        if self._n < self.mem_size and (ov is None or not len(ov)):  # ``has_room``, inline
            # One more of the singles at the back, or the first of them.
            self._ids.append(id_)
            self._bodies.append(body)
            self._stamps.append(now)
            self._arrivals.append(arrival)
            self._publishers.append(publisher)
            runs = self._runs
            if runs and isinstance(tail := runs[-1], list):
                tail[0] += 1
            else:
                runs.append([1])
            self._n += 1
            return IN_MEMORY
        if ov is not None and ov.put_inline((id_, body, now, arrival, arrival, 0, publisher, None)):
            return ON_DISK
        return NOT_KEPT

    def has_room(self) -> bool:
        """Whether a fresh message stays in memory: there is room, and nothing waits in
        the backend (which it would have to follow)."""
        return self._n < self.mem_size and ((ov := self.overflow) is None or not len(ov))

    def _spill(self, records: list[Record]) -> None:
        """What memory has no room for: to the backend, or dropped without one."""
        if self.overflow is not None:
            self.overflow.push_many(records)
            return
        self.dropped += len(records)
        for r in records:
            settle(r[7])

    def take(self, n: int) -> list[Record]:
        """Up to ``n`` records from the front, in order (memory first, refilled from the
        backend as ``popleft`` would)."""
        runs = self._runs
        if n > 0 and len(runs) == 1 and type(head := runs[0]) is list and head[0] == 1:
            ov = self.overflow
            if ov is None or not len(ov):  # else the backend's follow it in this take
                return [self._take_lone_single()]
        out: list[Record] = []
        while len(out) < n:
            if not runs:
                self._refill()
                if not runs:
                    break
            if self._at == len(self._ids):  # records only (no run): as many as wanted at once
                got = popleft_many(runs, n - len(out))
                self._n -= len(got)
                out += got  # type: ignore[arg-type]  # records only, as said
                continue
            head = runs[0]
            if isinstance(head, list):  # singles
                k = min(head[0], n - len(out))
                at, sat = self._at, self._sat
                out += singles_records(
                    self._ids[at : at + k],
                    self._bodies[at : at + k],
                    self._stamps[sat : sat + k],
                    self._arrivals[sat : sat + k],
                    self._publishers[sat : sat + k],
                )
                self._skip(k)
                self._skip_singles(k)
                if k == head[0]:
                    runs.popleft()
                else:
                    head[0] -= k
                self._n -= k
                continue
            if len(head) == 8:
                runs.popleft()
                out.append(head)
                self._n -= 1
                continue
            k = min(head[0], n - len(out))
            at = self._at
            out += run_records(self._ids[at : at + k], self._bodies[at : at + k], head)
            self._skip(k)
            if k == head[0]:
                runs.popleft()
            else:
                runs[0] = (head[0] - k, *head[1:])
            self._n -= k
        return out

    def _take_lone_single(self) -> Record:
        """The one message queued, a single (a sensor's PUB at a low rate, taken as it
        arrives): its record as ``singles_records`` makes it, without the general way's
        slices, on a path that runs cold; the skips then empty every list."""
        at, sat = self._at, self._sat
        arrival = self._arrivals[sat]
        record = (
            self._ids[at],
            self._bodies[at],
            self._stamps[sat],
            arrival,
            arrival,
            0,
            self._publishers[sat],
            None,
        )
        self._runs.clear()
        self._skip(1)
        self._skip_singles(1)
        self._n -= 1
        return record

    def _skip(self, k: int) -> None:
        """The first ``k`` of the runs' messages are taken: forget them (cut off in one
        move once they are half the lists, so each is moved at most once on average)."""
        at = self._at + k
        ids = self._ids
        if at == len(ids):
            ids.clear()
            self._bodies.clear()
            at = 0
        elif at >= 1024 and 2 * at >= len(ids):
            del ids[:at]
            del self._bodies[:at]
            at = 0
        self._at = at

    def _skip_singles(self, k: int) -> None:
        """As ``_skip``, for the singles' times and publishers."""
        at = self._sat + k
        if at == len(self._publishers):
            del self._stamps[:], self._arrivals[:]
            self._publishers.clear()
            at = 0
        elif at >= 1024 and 2 * at >= len(self._publishers):
            del self._stamps[:at], self._arrivals[:at], self._publishers[:at]
            at = 0
        self._sat = at

    def appendleft(self, msg: Message) -> None:
        """Put a message back at the front (a requeue on disconnect); never dropped."""
        self._runs.appendleft(to_record(msg))
        self._n += 1

    def extendleft(self, msgs: Iterable[Message]) -> None:
        """Put ``msgs`` in front, keeping their order (restoring what a stop saved)."""
        records = [to_record(m) for m in msgs]
        self._runs.extendleft(reversed(records))
        self._n += len(records)

    def _refill(self) -> None:
        """Take what the backend can give now into memory, up to the bound (in one call:
        a disk queue hands its read-ahead over in one slice)."""
        ov = self.overflow
        if ov is None or not len(ov):
            return  # nothing there: no call down (a drained channel's every take asks)
        room = max(1, self.mem_size) - self._n
        if room > 0:
            records = ov.pop_records(room)
            self._runs.extend(records)
            self._n += len(records)

    def _head(self) -> Record | Run | Singles | None:
        """The first record or run in memory (refilled from the backend if none)."""
        if not self._runs:
            self._refill()
        return self._runs[0] if self._runs else None

    def peek_release_ns(self) -> int | None:
        """The head's release time, without taking it."""
        h = self._head()
        if isinstance(h, list):
            return self._arrivals[self._sat]  # singles are released on arrival
        return None if h is None else h[4] if len(h) == 8 else h[3]

    def peek_arrival_ns(self) -> int | None:
        h = self._head()
        if isinstance(h, list):
            return self._arrivals[self._sat]
        return None if h is None else h[3] if len(h) == 8 else h[2]

    def head_arrival_ns(self) -> int | None:
        """The head's arrival if the head is in memory (None: empty, or the head is in the
        backend, which is not asked: a reader of the stats must not move messages)."""
        if not self._runs:
            return None
        h = self._runs[0]
        if isinstance(h, list):
            return self._arrivals[self._sat]
        return h[3] if len(h) == 8 else h[2]

    def set_head_release(self, release_ns: int) -> None:
        """Book the head's release time (the queue must not be empty)."""
        runs = self._runs
        h = runs[0]
        if isinstance(h, list):  # the first of singles leaves them as a record of its own
            (r,) = self.take(1)
            runs.appendleft((r[0], r[1], r[2], r[3], release_ns, r[5], r[6], r[7]))
            self._n += 1
            return
        if len(h) == 8:
            runs[0] = (h[0], h[1], h[2], h[3], release_ns, h[5], h[6], h[7])
            return
        # The head of a run: it leaves the run as a record of its own.
        if h[0] == 1:
            runs.popleft()
        else:
            runs[0] = (h[0] - 1, *h[1:])
        mid, body = self._ids[self._at], self._bodies[self._at]
        self._skip(1)
        runs.appendleft((mid, body, h[1], h[2], release_ns, h[4], h[5], h[6]))

    def popleft(self) -> Message:
        records = self.take(1)
        if not records:
            raise IndexError("pop from an empty queue")
        return Message(*records[0])

    def drain(self) -> Iterator[Message]:
        """Take every message, in order (memory first, then the backend)."""
        while self:
            yield self.popleft()

    def clear(self) -> int:
        n = len(self)
        for e in self._runs:
            if isinstance(e, list):
                continue  # singles: read from no disk
            origin = e[7] if len(e) == 8 else e[6]
            if origin is not None:
                origin.settle(1 if len(e) == 8 else e[0])
        self._runs.clear()
        self._ids.clear()
        self._bodies.clear()
        self._at = 0
        del self._stamps[:], self._arrivals[:]
        self._publishers.clear()
        self._sat = 0
        self._n = 0
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
        untrack(self._mem)
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
