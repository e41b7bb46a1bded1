"""``Topic.put_one``, a sensor's PUB in fewer steps: where it takes a message, the topic
is left as ``put_many`` leaves it (shaped: and ``release`` at once, its token there at its
arrival); where it does not, nothing changed."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker.message import Message, MessageIds
from srtm.broker.queue import Kept, MessageQueue
from srtm.broker.state import Topic

_ids = MessageIds(3)
NOW, ARRIVAL = 10**18 + 7, 10**18 + 5


@dataclass(frozen=True)
class Setup:
    """A topic's state before the PUB: each channel's memory bound and how much it holds."""

    channels: tuple[tuple[int, int], ...]
    held: tuple[int, int]
    paused: bool
    shaped: bool
    on_hold: bool
    waiting: bool  # a message waits in the shaping queue
    direct: bool
    drained: bool  # shaped: no token at the message's arrival


setups = st.builds(
    Setup,
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=3).map(tuple),
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


def build(s: Setup) -> Topic:
    sizes = {f"t:c{i}": mem for i, (mem, _) in enumerate(s.channels)} | {"t": s.held[0]}
    topic = Topic("t", lambda key: MessageQueue(sizes.get(key, 10)))
    for i, (_, filled) in enumerate(s.channels):
        ch = topic.channel(f"c{i}")
        for k in range(filled):
            ch.queue.append(Message(b"%016x" % k, b"old", 1, 1, 1))
    if not s.channels:
        for k in range(s.held[1]):
            topic.held.append(Message(b"%016x" % k, b"old", 1, 1, 1))
    if s.waiting:
        topic.shaping.append(Message(b"w" * 16, b"waits", 2, 2, 2))
    if s.shaped:
        topic.shape(1_000, 10, clock=lambda: 0)
        if s.drained:  # the burst spent just before: the next token 1 ms after
            for bucket in (topic.bucket, topic.meter):
                assert bucket is not None
                for _ in range(10):
                    bucket.reserve(at=ARRIVAL - 1)
    if s.on_hold:
        topic.hold()
    topic.paused = s.paused
    return topic


def state(topic: Topic) -> tuple[object, ...]:
    """Everything ``put_many`` changes, read without changing it."""

    def records(q: MessageQueue) -> tuple[list[Message], int]:
        return q.memory(), q.dropped

    chans = tuple((n, ch.message_count, records(ch.queue)) for n, ch in topic.channels.items())
    buckets = [(b.backlog_ns(ARRIVAL), b.counters) for b in (topic.bucket, topic.meter) if b]
    return (
        chans, records(topic.held), records(topic.shaping), topic.message_count,
        topic.message_bytes, buckets,
    )  # fmt: skip


def fits(s: Setup) -> bool:
    """Whether the PUB goes straight to memory: unshaped or a token there at its
    arrival, nothing holds it back, and every queue it goes to has room."""
    queues = s.channels or (s.held,)
    return (
        not (s.paused or s.on_hold or s.waiting)
        and not (s.shaped and s.drained)
        and s.direct
        and all(filled < mem for mem, filled in queues)
    )


@settings(max_examples=400, deadline=None)
@given(setups, st.sampled_from([None, "sensor-1"]))
def test_put_one_leaves_the_topic_as_put_many_does(s: Setup, publisher: str | None) -> None:
    check(s, publisher)


def check(s: Setup, publisher: str | None) -> None:
    """``put_one`` on a topic set up as ``s`` takes the message exactly where it fits,
    then leaves the topic as ``put_many`` does; elsewhere it changes nothing."""
    fast, slow, untouched = build(s), build(s), build(s)
    (id_,) = _ids.take(1)
    kept = fast.put_one(id_, b"reading", NOW, ARRIVAL, publisher, s.direct)
    assert kept is (Kept.MEMORY if fits(s) else Kept.NOT)  # no backend: nothing to disk
    took = kept is not Kept.NOT
    if took:
        backlog = slow.put_many([id_], [b"reading"], NOW, ARRIVAL, publisher, s.direct)
        if slow.bucket is not None:
            (released,) = slow.release(NOW)
            assert released.due_ns == ARRIVAL  # released on arrival, as ``put_one`` does
        assert fast.backlog_at(ARRIVAL) == pytest.approx(backlog)
        assert state(fast) == state(slow)
    else:
        assert state(fast) == state(untouched)


_FREE = Setup(((3, 0),), (3, 0), False, False, False, False, True, False)


@pytest.mark.parametrize(
    "s",
    [
        _FREE,
        replace(_FREE, channels=()),  # held for the first channel
        replace(_FREE, channels=((3, 1), (2, 0))),
        replace(_FREE, paused=True),
        replace(_FREE, shaped=True),  # a token at its arrival: released on arrival
        replace(_FREE, shaped=True, drained=True),  # it waits for a token
        replace(_FREE, shaped=True, channels=((3, 1), (2, 0))),
        replace(_FREE, shaped=True, channels=()),  # held for the first channel
        replace(_FREE, on_hold=True),
        replace(_FREE, waiting=True),
        replace(_FREE, direct=False),
        replace(_FREE, channels=((1, 1),)),  # its one queue full
        replace(_FREE, channels=((3, 0), (2, 2))),  # one of two full: neither takes it
        replace(_FREE, channels=(), held=(2, 2)),
    ],
)
def test_each_way_to_take_or_decline_once_for_certain(s: Setup) -> None:
    """What the property test draws, each reason to decline and each way to take the
    message, once each, whatever the draw."""
    check(s, "sensor-2")


def test_a_sensor_s_message_is_kept_as_a_single_with_its_fields() -> None:
    topic = Topic("t", lambda key: MessageQueue(10))
    topic.channel("c")
    assert topic.put_one(b"a" * 16, b"reading", NOW, ARRIVAL, "sensor-9", True) is Kept.MEMORY
    (record,) = topic.channels["c"].queue.take(5)
    assert record == (b"a" * 16, b"reading", NOW, ARRIVAL, ARRIVAL, 0, "sensor-9", None)
    assert (topic.message_count, topic.message_bytes) == (1, 7)
