"""MessageQueue (memory bound, overflow) and DiskQueue (segments, graceful and crash restarts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.broker.disk import DiskQueue
from srtm.broker.message import Message, MessageIds
from srtm.broker.queue import MessageQueue


def msg(i: int, body: bytes | None = None) -> Message:
    return Message(
        b"%016x" % i,
        body if body is not None else b"m%d" % i,
        10 * i,
        10 * i + 1,
        10 * i + 2,
        i % 7,
        publisher=f"p{i % 3}",
    )


def test_disk_queue_round_trips_every_field(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q")
    originals = [msg(i) for i in range(50)]
    for m in originals:
        q.push(m)
    assert len(q) == 50
    assert [q.pop() for _ in range(50)] == originals
    assert q.pop() is None
    assert len(q) == 0


def test_disk_queue_rolls_segments_and_deletes_read_ones(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q", segment_bytes=1_000)
    for i in range(200):
        q.push(msg(i, b"x" * 50))
    q.flush()
    segments = sorted((tmp_path / "q").glob("*.dat"))
    assert len(segments) > 5
    popped = [q.pop() for _ in range(150)]
    assert [m.id for m in popped if m is not None] == [b"%016x" % i for i in range(150)]
    # Read is not enough: a segment goes once every message read from it is settled.
    assert len(sorted((tmp_path / "q").glob("*.dat"))) == len(segments)
    for m in popped:
        assert m is not None and m.origin is not None
        m.origin.settle()
    assert len(sorted((tmp_path / "q").glob("*.dat"))) < len(segments)
    assert [m.id for m in iter(q.pop, None)] == [b"%016x" % i for i in range(150, 200)]


def test_disk_queue_resumes_where_it_stopped_after_a_graceful_close(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q", segment_bytes=500)
    for i in range(30):
        q.push(msg(i))
    for _ in range(12):
        q.pop()
    q.close()
    again = DiskQueue(tmp_path / "q", segment_bytes=500)
    assert len(again) == 18
    assert [m.id for m in iter(again.pop, None)] == [b"%016x" % i for i in range(12, 30)]


def test_disk_queue_after_a_crash_redelivers_but_never_loses(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q")
    for i in range(10):
        q.push(msg(i))
    q.flush()  # on disk (the broker flushes every second)
    q.pop()  # read but never settled; then a crash: no close(), no saved read position
    again = DiskQueue(tmp_path / "q")
    assert [m.id for m in iter(again.pop, None)] == [b"%016x" % i for i in range(10)]


def test_disk_queue_ignores_a_record_cut_short(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q")
    for i in range(3):
        q.push(msg(i))
    q.close()
    seg = next((tmp_path / "q").glob("*.dat"))
    seg.write_bytes(seg.read_bytes()[:-3])
    again = DiskQueue(tmp_path / "q")
    assert len(again) == 2
    assert [m.id for m in iter(again.pop, None)] == [b"%016x" % i for i in range(2)]


def test_head_is_saved_and_taken_once(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q")
    head = [(msg(1), None), (msg(2), 12345)]
    q.save_head(head)
    q.close()
    again = DiskQueue(tmp_path / "q")
    assert again.take_head() == head
    assert again.take_head() == []


@given(st.lists(st.sampled_from(["push", "pop"]), max_size=300), st.integers(0, 8))
def test_memory_queue_with_overflow_is_fifo(
    tmp_path_factory: pytest.TempPathFactory, ops: list[str], mem: int
) -> None:
    disk = DiskQueue(tmp_path_factory.mktemp("q"), segment_bytes=400)
    q = MessageQueue(mem, disk)
    model: list[int] = []
    n = 0
    for op in ops:
        if op == "push":
            assert q.append(msg(n))
            model.append(n)
            n += 1
            assert q.memory_depth <= max(mem, 1)
        elif model:
            assert q.popleft().id == b"%016x" % model.pop(0)
        assert len(q) == len(model)
    assert [m.id for m in q.drain()] == [b"%016x" % i for i in model]


def test_memory_bound_holds_and_the_rest_is_on_disk(tmp_path: Path) -> None:
    q = MessageQueue(100, DiskQueue(tmp_path / "q"))
    for i in range(1_000):
        q.append(msg(i))
    assert q.memory_depth == 100
    assert q.backend_depth == 900
    assert len(q) == 1_000


def test_without_a_backend_overflow_is_dropped_and_counted() -> None:
    q = MessageQueue(3)
    assert [q.append(msg(i)) for i in range(5)] == [True, True, True, False, False]
    assert q.dropped == 2
    assert len(q) == 3


def test_requeue_at_the_front_is_never_dropped() -> None:
    q = MessageQueue(1)
    q.append(msg(1))
    q.appendleft(msg(0))
    assert [m.id for m in q.drain()] == [b"%016x" % 0, b"%016x" % 1]


def test_message_ids_are_16_hex_chars_with_the_broker_id() -> None:
    ids = MessageIds(0xABC, start=5)
    first = ids.next()
    assert len(first) == 16 and first.startswith(b"abc")
    assert int(first, 16) & ((1 << 52) - 1) == 5
    assert ids.next() != first
    with pytest.raises(ValueError, match="broker_id"):
        MessageIds(4096)
