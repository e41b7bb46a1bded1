"""A channel's in-flight bookkeeping (one deadline per dispatch, compacted) against a
model of nsqd's per-message semantics: each message in flight to one consumer with its
own deadline and attempts; FIN/REQ/TOUCH only by that consumer; a timeout requeues it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker.message import Message
from srtm.broker.state import STALE_DEADLINES, DeliveryError, Topic, memory_queues
from srtm.broker.stats import _MAX_NS, record_many

MS = 1_000_000
TIMEOUT = 1_000 * MS


@dataclass(eq=False)
class FakeConsumer:
    rdy: int = 0
    in_flight: int = 0
    msg_timeout_ns: int = TIMEOUT


class Model:
    """Per message: where it is, its attempts, and (in flight) whose and until when."""

    def __init__(self) -> None:
        self.queue: dict[bytes, int] = {}  # id -> attempts so far
        self.deferred: dict[bytes, tuple[int, int]] = {}  # id -> (attempts, due)
        self.flying: dict[bytes, tuple[int, int, int]] = {}  # id -> (consumer, deadline, attempts)
        self.timeouts = self.requeues = 0

    def settle(self, mid: bytes, who: int) -> tuple[int, int, int] | None:
        f = self.flying.get(mid)
        if f is None or f[0] != who:
            return None
        return self.flying.pop(mid)

    def tick(self, now: int) -> None:
        for mid, (attempts, due) in list(self.deferred.items()):
            if due <= now:
                del self.deferred[mid]
                self.queue[mid] = attempts
        for mid, (_, deadline, attempts) in list(self.flying.items()):
            if deadline <= now:
                del self.flying[mid]
                self.queue[mid] = attempts
                self.timeouts += 1


ops = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.integers(1, 6)),
        st.tuples(st.just("rdy"), st.integers(0, 1), st.integers(0, 4)),
        st.tuples(st.just("dispatch")),
        st.tuples(st.just("fin"), st.integers(0, 1), st.lists(st.integers(0, 40), max_size=5)),
        st.tuples(st.just("req"), st.integers(0, 1), st.integers(0, 40), st.sampled_from([0, 300])),
        st.tuples(st.just("touch"), st.integers(0, 1), st.integers(0, 40)),
        st.tuples(st.just("advance"), st.sampled_from([0, 100, 400, 700, 1_000, 1_500])),
        st.tuples(st.just("leave"), st.integers(0, 1)),
        st.tuples(st.just("join"), st.integers(0, 1)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_in_flight_keeps_per_message_semantics(script: list[tuple[object, ...]]) -> None:
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    cs = [FakeConsumer(), FakeConsumer()]
    for c in cs:
        ch.add_consumer(c, 0)
    model = Model()
    known: list[bytes] = []
    now = 0
    for op in script:
        kind = op[0]
        if kind == "pub":
            for _ in range(int(op[1])):  # type: ignore[call-overload]
                mid = b"%016x" % len(known)
                known.append(mid)
                topic.put(Message(mid, b"b", now, now))
                model.queue[mid] = 0
            topic.release(now)
        elif kind == "rdy":
            cs[op[1]].rdy = int(op[2])  # type: ignore[index, call-overload]
        elif kind == "dispatch":
            rooms = {id(c): c.rdy - c.in_flight for c in cs}
            for c, m in ch.dispatch(now):
                assert m.id in model.queue and m.attempts == model.queue.pop(m.id) + 1
                model.flying[m.id] = (cs.index(c), now + TIMEOUT, m.attempts)  # type: ignore[arg-type]
                rooms[id(c)] -= 1
                assert c in ch.consumers and rooms[id(c)] >= 0
        elif kind in ("fin", "req", "touch") and known:
            who = int(op[1])  # type: ignore[call-overload]
            picks = op[2] if kind == "fin" else [op[2]]
            mids = [known[int(k) % len(known)] for k in picks]  # type: ignore[union-attr, call-overload]
            if kind == "fin":
                expect = []
                for mid in mids:
                    if model.settle(mid, who) is None:
                        expect.append(mid)
                failed = ch.fin_many(mids, cs[who])
                assert [mid for mid, _ in failed] == expect
            elif kind == "req":
                mid, delay = mids[0], int(op[3]) * MS  # type: ignore[call-overload]
                f = model.settle(mid, who)
                try:
                    ch.req(mid, cs[who], delay, now)
                except DeliveryError:
                    assert f is None
                else:
                    assert f is not None
                    model.requeues += 1
                    if delay:
                        model.deferred[mid] = (f[2], now + delay)
                    else:
                        model.queue[mid] = f[2]
            else:
                mid = mids[0]
                f = model.flying.get(mid)
                try:
                    ch.touch(mid, cs[who], now)
                except DeliveryError:
                    assert f is None or f[0] != who
                else:
                    assert f is not None and f[0] == who
                    model.flying[mid] = (who, now + TIMEOUT, f[2])
        elif kind == "advance":
            now += int(op[1]) * MS  # type: ignore[call-overload]
            ch.tick(now)
            model.tick(now)
        elif kind == "leave":
            ch.remove_consumer(cs[op[1]])  # type: ignore[index]
        elif kind == "join" and cs[op[1]] not in ch.consumers:  # type: ignore[index]
            ch.add_consumer(cs[op[1]], 0)  # type: ignore[index]
        # After every step: the same messages in the same places, the same counts.
        assert set(ch.in_flight) == set(model.flying) and len(ch.in_flight) == len(model.flying)
        for i, c in enumerate(cs):
            assert c.in_flight == sum(1 for f in model.flying.values() if f[0] == i)
        queued = sorted((m.id, m.attempts) for m in ch.queue.memory())
        assert queued == sorted(model.queue.items())
        assert ch.deferred_count == len(model.deferred)
        assert (ch.timeout_count, ch.requeue_count) == (model.timeouts, model.requeues)
        owed = sorted(m.id for m, _ in ch.head())
        assert owed == sorted([*model.flying, *model.queue, *model.deferred])


def test_settled_deadlines_are_compacted_and_a_touch_survives_it() -> None:
    """Many dispatches FIN'd at once leave few deadlines behind; a TOUCHed message still
    times out at its own deadline after a compaction, not at its dispatch's."""
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    c = FakeConsumer(rdy=10)
    ch.add_consumer(c, 0)
    for i in range(3_000):
        topic.put(Message(b"%016x" % i, b"b", 0, 0))
    topic.release(0)
    (_, kept), *_ = ch.dispatch(0)
    ch.touch(kept.id, c, 500 * MS)  # due at 1,500 ms now
    c.rdy = 11
    while sent := ch.dispatch(0):
        ch.fin_many([m.id for _, m in sent], c)
    assert len(ch.in_flight) == 10 and ch._timeout_ids <= 4 * 10 + STALE_DEADLINES
    assert ch.tick(TIMEOUT) and ch.timeout_count == 9
    assert [m.id for m in ch.queue.memory()] != [] and kept.id in ch.in_flight
    assert ch.tick(1_500 * MS) and ch.timeout_count == 10 and not ch.in_flight


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(1, _MAX_NS), min_size=1, max_size=300),
)
def test_record_many_counts_as_record_value(values: list[int]) -> None:
    a, b = HdrHistogram(1, _MAX_NS, 3), HdrHistogram(1, _MAX_NS, 3)
    record_many(a, np.array(values, dtype=np.int64))
    for v in values:
        b.record_value(v)
    assert list(a.counts) == list(b.counts)
    assert (a.total_count, a.min_value, a.max_value) == (b.total_count, b.min_value, b.max_value)


def test_a_redelivered_message_keeps_only_its_new_deadline() -> None:
    """REQ'd and dispatched again (same id, same consumer): the first dispatch's
    deadline, still in the heap, must not time the second delivery out."""
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    c = FakeConsumer(rdy=1)
    ch.add_consumer(c, 0)
    topic.put(Message(b"%016x" % 1, b"b", 0, 0))
    topic.release(0)
    ((_, m),) = ch.dispatch(0)
    ch.req(m.id, c, 0, 400 * MS)
    ((_, again),) = ch.dispatch(400 * MS)
    assert again.id == m.id and again.attempts == 2
    assert not ch.tick(TIMEOUT) and ch.timeout_count == 0 and c.in_flight == 1
    assert ch.tick(1_400 * MS) and ch.timeout_count == 1 and c.in_flight == 0
