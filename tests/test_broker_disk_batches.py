"""An MPUB's overflow handed to the disk queue as one batch: encoded once, in one pass
(ahead, while the write before it runs), written byte for byte as record by record, and
as crash-safe (a torn write is taken back to its last whole record, nothing reordered)."""

from __future__ import annotations

import errno
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker.disk import DiskQueue, codec
from srtm.broker.disk import queue as diskqueue
from srtm.broker.disk.buffer import MAX_WRITE_RECORDS
from srtm.broker.disk.codec import encode, encode_batch, encode_batch_py, record_bytes
from srtm.broker.message import Message
from srtm.broker.queue import MessageQueue, Record
from support import ListOverflow, queue_records

c_encode_batch = codec._c_encode_batch


records = queue_records(min_body=1)


def rec(i: int, body: bytes = b"", publisher: str = "") -> Record:
    return (b"%016x" % i, body or b"m%d" % i, 10 * i, 10 * i + 1, 10 * i + 2, 0, publisher, None)


def changed(i: int, value: object) -> Record:
    fields = list(rec(1))
    fields[i] = value
    return tuple(fields)  # type: ignore[return-value]


def as_messages(recs: list[Record]) -> list[Message]:
    return [Message(*r[:7]) for r in recs]


#: The encoders: Python's always, C's where it was built at install.
ENCODERS = [encode_batch_py] + ([c_encode_batch] if c_encode_batch is not None else [])


def test_the_c_encoder_was_built() -> None:
    """Optional at install (no compiler: Python's is used); said here when missing."""
    if c_encode_batch is None:
        pytest.skip("srtm.broker._diskcodec not built: the pure-Python encoder is used")


@pytest.mark.parametrize("encoder", ENCODERS)
@given(batch=st.lists(records, max_size=30))
def test_a_batch_encodes_as_its_records_one_by_one(
    encoder: Callable[[list[Record]], bytes], batch: list[Record]
) -> None:
    assert encoder(batch) == b"".join(encode(m) for m in as_messages(batch))


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize(
    "bad",
    [
        changed(2, 2**63),  # timestamp past int64
        changed(5, 2**16),  # attempts past 16 bits
        changed(6, "p" * 2**16),  # publisher past 16 bits
        changed(6, "\ud800"),  # not UTF-8
    ],
)
def test_a_field_out_of_range_fails_the_batch(
    encoder: Callable[[list[Record]], bytes], bad: Record
) -> None:
    with pytest.raises((struct.error, OverflowError, ValueError)):
        encoder([rec(0), bad])


def test_what_the_c_encoder_does_not_take_is_encoded_in_python() -> None:
    odd = (b"%016x" % 1, bytearray(b"body"), 1, 2, 3, 0, "p", None)
    want = encode(Message(b"%016x" % 1, b"body", 1, 2, 3, 0, "p"))
    assert encode_batch([odd]) == encode_batch_py([odd]) == want  # type: ignore[list-item]


class ShortWriter:
    """os.write that fails with ENOSPC once ``room`` bytes are used (None: never)."""

    def __init__(self) -> None:
        self.room: int | None = None

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if self.room is None:
            return os.write(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, data[: self.room])
        self.room -= n
        return n


# What a test pushes: a batch (push_many), one message (push), or a write (written).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("many"), st.integers(1, 40)),
        st.tuples(st.just("one"), st.integers(1, 1)),
        st.tuples(st.just("write"), st.integers(0, 0)),
        st.tuples(st.just("fail"), st.integers(0, 3_000)),
    ),
    max_size=25,
)


@pytest.mark.parametrize("encoder", ENCODERS)
@settings(max_examples=60, deadline=None)
@given(plan=steps, segment_bytes=st.sampled_from([600, 4_000, 1 << 20]))
def test_batches_round_trip_exactly_in_order_through_torn_writes_and_a_crash(
    encoder: Callable[[list[Record]], bytes], plan: list[tuple[str, int]], segment_bytes: int
) -> None:
    """Batches and single pushes, writes that the disk cuts short (ENOSPC part-way), small
    segments (a batch split across files): every message comes back once, in order, with
    every field; and what was written is read back after a crash (no close)."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(codec, "_c_encode_batch", encoder if encoder is not encode_batch_py else None)
        writer = ShortWriter()
        q = DiskQueue(Path(tmp) / "q", segment_bytes, flush_bytes=1 << 30, writer=writer)
        pushed: list[Record] = []
        for what, n in plan:
            if what == "many":
                batch = [rec(len(pushed) + i, b"b" * (i % 7 + 1), "p") for i in range(n)]
                q.push_many(batch)
                pushed += batch
            elif what == "one":
                r = rec(len(pushed), publisher="é")
                q.push(Message(*r[:7]))
                pushed.append(r)
            elif what == "write":
                writer.room = None
                q.written()
            else:
                writer.room = n
                q.flush()
            # what the buffer counts is what its records take on disk
            assert q._buffer.nbytes == sum(map(record_bytes, q._buffer.records))
        writer.room = None
        assert q.flush() and not q.failing and q.pending == 0
        # kill -9 here: a fresh queue on the same files has everything, in order
        again = DiskQueue(Path(tmp) / "q", segment_bytes)
        assert list(iter(again.pop, None)) == as_messages(pushed)
        assert list(iter(q.pop, None)) == as_messages(pushed)


def test_a_write_takes_the_batches_encoded_when_pushed(tmp_path: Path) -> None:
    """The chunks encoded at push time are what is written (and are let go once written);
    a message taken from the buffer while writing fails leaves them unused, not wrong."""
    writer = ShortWriter()
    q = DiskQueue(tmp_path / "q", flush_bytes=1 << 30, writer=writer)
    first = [rec(i) for i in range(5)]
    q.push_many(first)
    assert q._buffer.encoded == 5
    q.flush()
    assert q._buffer.encoded == 0 and not q._buffer.chunks
    writer.room = 0  # the disk is full
    later = [rec(i) for i in range(5, 9)]
    q.push_many(later)
    assert not q.flush() and q.failing
    q.push_many([rec(9)])  # while failing: not encoded ahead
    assert list(iter(q.pop, None)) == as_messages(first + later + [rec(9)])
    writer.room = None
    q.push_many([rec(10)])
    assert q.flush() and not q.failing
    # after a crash: what was on disk (the first five were read, never settled), not what
    # was handed out from memory while writing failed
    again = DiskQueue(tmp_path / "q")
    assert [m.id for m in iter(again.pop, None)] == [b"%016x" % i for i in [*range(5), 10]]


def test_a_publisher_that_cannot_be_encoded_fails_the_write_not_the_push(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q", flush_bytes=1 << 30)
    q.push_many([rec(0, publisher="\ud800")])  # a lone surrogate (from JSON, say)
    q.push(Message(*rec(1, publisher="\ud800")[:7]))
    assert not q.flush() and q.error is not None and q.error.errno == errno.EINVAL
    assert q.pending == 2


class CountingOverflow(ListOverflow):
    """``ListOverflow`` counting the calls that hand it messages."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def push(self, msg: Message) -> None:
        self.calls += 1
        super().push(msg)

    def push_many(self, records: list[Record]) -> None:
        self.calls += 1
        super().push_many(records)


def test_what_does_not_fit_in_memory_goes_to_the_backend_in_one_call() -> None:
    backend = CountingOverflow()
    q = MessageQueue(5, backend)
    recs = [rec(i) for i in range(12)]
    q.extend(recs[:3])
    q.extend(recs[3:9])  # two fit, four do not: one call
    assert q.memory_depth == 5 and backend.calls == 1 and len(backend) == 4
    q.extend(recs[9:])  # the backend holds some: all after them, one call
    assert backend.calls == 2
    assert [r[0] for r in q.take(12)] == [r[0] for r in recs]


def test_without_a_backend_what_does_not_fit_is_dropped_and_counted() -> None:
    q = MessageQueue(4)
    q.extend([rec(i) for i in range(3)])
    q.extend([rec(i) for i in range(3, 7)])
    assert q.memory_depth == 4 and q.dropped == 3
    assert [r[0] for r in q.take(10)] == [b"%016x" % i for i in range(4)]


def test_a_big_backlog_is_written_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write's completion settles its records on the event loop one by one: a write
    takes at most MAX_WRITE_RECORDS (in whole pushes), and all of them still land, in
    order."""
    counts: list[int] = []
    write_batch = diskqueue.write_batch

    def counting(*args: object) -> object:
        counts.append(args[-1])  # type: ignore[arg-type]
        return write_batch(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(diskqueue, "write_batch", counting)
    q = DiskQueue(tmp_path / "q", flush_bytes=1 << 30)
    push = 10_000
    for k in range(4):
        q.push_many([rec(i) for i in range(k * push, (k + 1) * push)])
    while q.flush() and q._buffer.records:
        pass
    assert sum(counts) == 4 * push
    assert len(counts) >= 2 and max(counts) <= MAX_WRITE_RECORDS + push, counts
    again = DiskQueue(tmp_path / "q")
    assert [m.id for m in iter(again.pop, None)] == [b"%016x" % i for i in range(4 * push)]
