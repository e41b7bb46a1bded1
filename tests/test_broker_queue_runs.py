"""MessageQueue's runs (messages published together kept without a record each): the
same FIFO as records, whatever mix of operations, and what a queued message costs."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker.disk import DiskQueue
from srtm.broker.message import Message, MessageIds
from srtm.broker.queue import Fresh, Kept, MessageQueue, Record, fresh_records, to_record
from srtm.broker.state import Topic, memory_queues

_ids = MessageIds(7)

# One operation on the queue and on a plain list of records that models it.
_op = st.one_of(
    st.tuples(st.just("fresh"), st.integers(0, 6)),
    st.tuples(st.just("records"), st.integers(1, 4)),
    st.tuples(st.just("single"), st.integers(0, 2)),
    st.tuples(st.just("put_single"), st.integers(0, 2)),
    st.tuples(st.just("append"), st.just(1)),
    st.tuples(st.just("appendleft"), st.just(1)),
    st.tuples(st.just("take"), st.integers(0, 9)),
    st.tuples(st.just("release"), st.integers(0, 1000)),
)


def fresh(n: int, at: int) -> Fresh:
    return Fresh(_ids.take(n), [b"b%d" % at + b"x" * i for i in range(n)], at, at + 1, "pub")


def single(at: int, publisher: int) -> Fresh:
    """A PUB's one message: what a queue keeps among singles (times and publisher apart)."""
    return Fresh(_ids.take(1), [b"s%d" % at], 10**18 + at, 10**18 + 2 * at, f"p{publisher}")


def one(at: int) -> Message:
    (r,) = fresh(1, at).records()
    return Message(*r[:5], attempts=at % 3, publisher="other")


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40), st.integers(0, 12))
def test_runs_keep_the_order_and_fields_of_records(ops: list[tuple[str, int]], mem: int) -> None:
    q = MessageQueue(mem)
    model: list[Record] = []
    dropped = 0
    for at, (op, k) in enumerate(ops):
        if op == "fresh" or op == "records":
            batch = fresh(k, at)
            records = batch.records()
            room = max(0, min(k, mem - len(model)))
            model += records[:room]
            dropped += k - room
            q.extend(batch if op == "fresh" else records)
        elif op == "single":
            batch = single(at, k)
            if len(model) < mem:
                model += batch.records()
            else:
                dropped += 1
            q.extend(batch)
        elif op == "put_single":  # as "single" where it stays in memory, else nothing
            batch = single(at, k)
            (id_,), (body,) = batch.ids, batch.bodies
            kept = q.put_single(id_, body, batch.now, batch.arrival, batch.publisher)
            assert kept is (Kept.MEMORY if len(model) < mem else Kept.NOT)  # no backend
            if kept is Kept.MEMORY:
                model += batch.records()
        elif op == "append":
            m = one(at)
            if len(model) < mem:
                model.append(to_record(m))
            else:
                dropped += 1
            q.append(m)
        elif op == "appendleft":
            m = one(at)
            model.insert(0, to_record(m))
            q.appendleft(m)
        elif op == "take":
            assert q.take(k) == model[:k]
            del model[:k]
        elif model:
            assert q.peek_release_ns() == model[0][4]
            assert q.peek_arrival_ns() == q.head_arrival_ns() == model[0][3]
            q.set_head_release(k)
            model[0] = (*model[0][:4], k, *model[0][5:])
        assert len(q) == q.memory_depth == len(model)
        assert q.dropped == dropped
    assert q.memory() == [Message(*r) for r in model]
    assert [to_record(m) for m in q.drain()] == model
    assert not q and len(q) == 0


def test_a_run_past_the_bound_overflows_to_disk_in_order(tmp_path: Path) -> None:
    q = MessageQueue(5, DiskQueue(tmp_path / "q"))
    first, second = fresh(4, 1), fresh(4, 2)
    q.extend(first)
    q.extend(second)  # one fits, three go to disk; then everything follows them
    third = fresh(2, 3)
    q.extend(third)
    assert (q.memory_depth, q.backend_depth) == (5, 5)
    got = q.take(100)
    want = first.records() + second.records() + third.records()
    assert [r[:7] for r in got] == [r[:7] for r in want]
    assert q.clear() == 0


def test_clear_counts_and_empties_runs_and_records() -> None:
    q = MessageQueue(100)
    q.extend(fresh(3, 1))
    q.append(one(2))
    assert q.clear() == 4
    assert not q and q.take(5) == []


#: Messages queued for the memory measurement, and their body size (bench_writer's).
_MEASURED = 100_000
_BODY = 100
#: A queued message published in an MPUB of 200, one channel, as pymalloc holds it: its
#: body (33 bytes of header + 100 → 144), its id (33 + 16 → 64), two deque slots (16)
#: and a 200th of its run (96): 225 bytes. nsqd's figure in the same benchmark is 263 B
#: of RSS; ours there is these bytes plus what the allocator holds beyond them.
_BOUND = 232


def rounded(size: int) -> int:
    """What pymalloc takes for a request of ``size`` bytes (16-byte size classes)."""
    return (size + 15) // 16 * 16


def held_per_message(fill: Callable[[], None]) -> float:
    """The bytes ``fill`` leaves allocated (tracemalloc, each block rounded as the
    allocator does), per one of the ``_MEASURED`` messages it queues."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        fill()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(rounded(t.size) for t in after.traces) - sum(rounded(t.size) for t in before.traces)
    return held / _MEASURED


def test_a_queued_message_costs_no_more_than_the_bound() -> None:
    ids = MessageIds(1)
    topic = Topic("t", memory_queues())
    topic.channel("c")
    batch = 200

    def fill() -> None:
        for k in range(_MEASURED // batch):
            # Each body its own bytes object, as the parser makes them.
            bodies = [(k * batch + i).to_bytes(_BODY, "big") for i in range(batch)]
            topic.put_many(ids.take(batch), bodies, 10**18 + k, 10**18 + k, "")

    per_message = held_per_message(fill)
    assert topic.channels["c"].depth == _MEASURED
    assert per_message <= _BOUND, f"{per_message:.1f} bytes per queued message"


#: A message PUB'd alone, one channel: its body (144) and id (64) as above, two list
#: slots (16), its two times in arrays (16), its publisher's list slot (8) and its deque
#: slot's share: 248 bytes.
_SINGLE_BOUND = 256


def test_a_message_published_alone_costs_no_more_than_its_bound() -> None:
    ids = MessageIds(1)
    topic = Topic("t", memory_queues())
    topic.channel("c")
    publishers = [f"sensor-{i}" for i in range(50)]

    def fill() -> None:
        for k in range(_MEASURED):
            body = k.to_bytes(_BODY, "big")
            topic.put_many(ids.take(1), [body], 10**18 + k, 10**18 + k + 1, publishers[k % 50])

    per_message = held_per_message(fill)
    assert topic.channels["c"].depth == _MEASURED
    assert per_message <= _SINGLE_BOUND, f"{per_message:.1f} bytes per message PUB'd alone"
    (first,) = topic.channels["c"].queue.take(1)
    assert first[2:7] == (10**18, 10**18 + 1, 10**18 + 1, 0, "sensor-0")


def test_fresh_records_still_make_what_a_run_gives() -> None:
    batch = fresh(3, 5)
    q = MessageQueue(10)
    q.extend(batch)
    assert q.take(3) == fresh_records(batch.ids, batch.bodies, 5, 6, "pub")
