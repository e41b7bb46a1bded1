"""The broker's batched data path: publishes accepted as records, dispatches in shares,
deadlines per batch, FIN runs; each gives what the per-message path gave."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from nsq_raw import RawClient
from srtm.broker.message import MessageIds
from srtm.broker.queue import MessageQueue
from srtm.broker.state import UNBOOKED, Topic, memory_queues
from srtm.protocol import MAGIC_V2, Fin, Mpub, Parser, ProtocolError, Pub, Rdy, Sub
from support import ListOverflow, MakeBroker, eventually

MS = 1_000_000


@dataclass(eq=False)
class FakeConsumer:
    rdy: int = 0
    in_flight: int = 0
    msg_timeout_ns: int = 1_000 * MS


def put(topic: Topic, n: int, arrival: int = 5, direct: bool = True) -> float:
    ids = [b"%016x" % i for i in range(n)]
    return topic.put_many(ids, [b"m%d" % i for i in range(n)], 7, arrival, "p", direct)


@pytest.mark.parametrize("start", [0, 1 << 40, (1 << 52) - 40])
def test_ids_taken_at_once_are_the_ids_taken_one_by_one(start: int) -> None:
    a, b = MessageIds(4095, start), MessageIds(4095, start)
    for n in (300, 1, 0, 31, 32, 33):  # one, few and many take different ways
        assert a.take(n) == [b.next() for _ in range(n)]
        assert a.next() == b.next() and a.last == b.last


def test_an_unshaped_topic_hands_a_publish_to_every_channel_at_once() -> None:
    topic = Topic("t", memory_queues())
    a, b = topic.channel("a"), topic.channel("b")
    assert put(topic, 3) == 0.0
    assert len(topic.shaping) == 0 and topic.message_count == 3 and a.message_count == 3
    for ch in (a, b):
        msgs = ch.queue.memory()
        assert [m.body for m in msgs] == [b"m0", b"m1", b"m2"]
        assert {(m.timestamp_ns, m.arrival_ns, m.release_ns, m.attempts, m.publisher)
                for m in msgs} == {(7, 5, 5, 0, "p")}  # fmt: skip


def test_without_a_channel_a_publish_is_held_for_the_first_one() -> None:
    topic = Topic("t", memory_queues())
    put(topic, 2)
    assert topic.depth == 2 and len(topic.shaping) == 0
    assert topic.channel("first").depth == 2 and topic.channel("second").depth == 0


def test_what_cannot_go_straight_waits_in_the_shaping_queue_in_order() -> None:
    for setup in ("paused", "not direct", "something waits"):
        topic = Topic("t", memory_queues())
        ch = topic.channel("c")
        topic.paused = setup == "paused"
        if setup == "something waits":
            topic.paused = True
            put(topic, 1)
            topic.paused = False
        put(topic, 2, direct=setup != "not direct")
        assert ch.depth == 0, setup
        topic.paused = False
        topic.release(10)
        assert [m.body for m in ch.queue.memory()][-2:] == [b"m0", b"m1"], setup


def test_a_shaped_topic_books_each_message_of_a_publish() -> None:
    topic = Topic("t", memory_queues())
    topic.channel("c")
    topic.shape(1_000.0, 1.0, lambda: 0)
    assert put(topic, 3, arrival=0) > 0  # the meter owes tokens after the burst of one
    assert len(topic.shaping) == 3
    assert topic.shaping.peek_release_ns() == UNBOOKED
    released = topic.release(10 * MS)
    assert [r.due_ns for r in released] == [0, MS, 2 * MS]


def test_consumers_share_what_is_queued_within_their_rdy() -> None:
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    c1, c2, c3 = FakeConsumer(rdy=100), FakeConsumer(rdy=3), FakeConsumer(rdy=0)
    for c in (c1, c2, c3):
        ch.add_consumer(c, 0)
    put(topic, 40)
    out = ch.take(0)
    got = {id(c): recs for c, recs in out}
    assert len(got[id(c2)]) == 3 and id(c3) not in got
    assert len(got[id(c1)]) == 37 and (c1.in_flight, c2.in_flight) == (37, 3)
    ids = [r[0] for _, recs in out for r in recs]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 40 and set(ch.in_flight) == set(ids)
    assert ch.take(0) == [] and ch.depth == 0


def test_a_batch_in_flight_times_out_together_except_what_was_touched_or_finished() -> None:
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    c = FakeConsumer(rdy=10)
    ch.add_consumer(c, 0)
    put(topic, 4)
    ((_, recs),) = ch.take(0)
    ids = [r[0] for r in recs]
    ch.fin(ids[0], c)
    ch.touch(ids[1], c, 500 * MS)
    assert ch.tick(1_000 * MS) and ch.timeout_count == 2 and c.in_flight == 1
    again = [m for _, m in ch.dispatch(1_000 * MS)]
    assert [m.id for m in again] == ids[2:] and {m.attempts for m in again} == {2}
    assert ch.tick(1_500 * MS) and ch.timeout_count == 3  # the touched one, later


def test_records_overflow_and_come_back_in_order() -> None:
    q = MessageQueue(3, ListOverflow())
    recs = [(b"%016x" % i, b"b", 0, 0, 0, 0, "", None) for i in range(8)]
    q.extend(recs[:2])
    q.extend(recs[2:5])  # does not fit: one by one, the rest to the backend
    q.extend(recs[5:])  # the backend holds some: after them
    assert len(q) == 8 and q.memory_depth == 3
    assert [r[0] for r in q.take(5)] + [r[0] for r in q.take(10)] == [r[0] for r in recs]
    assert q.take(1) == []


async def test_a_run_of_fins_with_one_unknown_id_fails_only_that_one(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    assert broker.tcp_address is not None
    pub = await RawClient.connect(*broker.tcp_address)
    await pub.send(Mpub("t", [b"%d" % i for i in range(5)]))
    assert await pub.response() == b"OK"
    sub = await RawClient.connect(*broker.tcp_address)
    await sub.send(Sub("t", "c"), Rdy(5))
    assert await sub.response() == b"OK"
    ids = [(await sub.message()).id for _ in range(5)]
    fins = [Fin(i) for i in ids[:2]] + [Fin(b"f" * 16)] + [Fin(i) for i in ids[2:]]
    await sub.send(*fins)  # one write: one run
    assert (await sub.error()).startswith("E_FIN_FAILED FIN ffffffffffffffff failed")
    ch = broker.topics["t"].channels["c"]
    await eventually(lambda: not ch.in_flight, "every known id finished")
    assert ch.consumers[0].in_flight == 0
    await pub.send(Mpub("t", [b"more"]))
    assert await pub.response() == b"OK"
    # its RDY room came back, and no other error frame came before the message
    assert (await sub.message()).body == b"more"
    await pub.close()
    await sub.close()


@pytest.mark.parametrize("release_waits", [False, True])
async def test_a_long_run_of_fins_has_the_same_answers_whole_or_in_pieces(
    make_broker: MakeBroker, release_waits: bool
) -> None:
    """A run of FINs (one ``Fins`` from the parser) is run whole, or 32 FINs at a time
    while a shaped release waits (``release_due`` between pieces): either way an unknown
    id past the first piece fails alone, and every other message is finished."""
    broker = await make_broker()
    assert broker.tcp_address is not None
    pub = await RawClient.connect(*broker.tcp_address)
    if release_waits:  # one message waits 1,000 s for its token
        broker.shares.set_bucket("shaped", 0.001, 1.0)
        await pub.send(Mpub("shaped", [b"now", b"in an hour"]))
        assert await pub.response() == b"OK"
    assert broker.release_due() is release_waits
    await pub.send(Mpub("t", [b"%d" % i for i in range(100)]))
    assert await pub.response() == b"OK"
    sub = await RawClient.connect(*broker.tcp_address)
    await sub.send(Sub("t", "c"), Rdy(100))
    assert await sub.response() == b"OK"
    ids = [(await sub.message()).id for _ in range(100)]
    await sub.send(*(Fin(i) for i in [*ids[:70], b"f" * 16, *ids[70:]]))  # one write
    assert (await sub.error()).startswith("E_FIN_FAILED FIN ffffffffffffffff failed")
    ch = broker.topics["t"].channels["c"]
    await eventually(lambda: not ch.in_flight, "every known id finished")
    assert ch.consumers[0].in_flight == 0
    await pub.send(Pub("t", b"more"))
    assert await pub.response() == b"OK"
    assert (await sub.message()).body == b"more"  # no other error frame came first
    await pub.close()
    await sub.close()


async def test_due_releases_are_looked_at_before_every_command_of_a_read(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of several commands releases what is due before each of them, so a shaped
    release waits for at most one command, not for the whole read, and after the last."""
    broker = await make_broker()
    assert broker.tcp_address is not None
    seen: list[str] = []
    looked = broker.release_due
    published = broker.publish

    def release_due() -> bool:
        seen.append("look")
        return looked()

    def publish(topic: str, *args: object, **kwargs: object) -> object:
        seen.append(topic)
        return published(topic, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(broker, "release_due", release_due)
    monkeypatch.setattr(broker, "publish", publish)
    pub = await RawClient.connect(*broker.tcp_address)
    await pub.send(Pub("a", b"1"), Pub("b", b"2"), Pub("c", b"3"))  # one write
    for _ in range(3):
        assert await pub.response() == b"OK"
    pubs = [i for i, what in enumerate(seen) if what != "look"]
    assert [seen[i] for i in pubs] == ["a", "b", "c"]
    assert all(seen[i - 1] == "look" for i in pubs), seen
    assert seen[-1] == "look", seen  # and after the last: what the read made due goes too
    await pub.close()


def mpub_events(bodies: list[bytes], count: int | None = None) -> list[object]:
    payload = struct.pack(">I", len(bodies) if count is None else count)
    payload += b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    return Parser().feed(MAGIC_V2 + b"MPUB t\n" + struct.pack(">I", len(payload)) + payload)


def test_an_mpub_of_equal_sizes_is_cut_as_any_other() -> None:
    same = [b"%05d" % i for i in range(7)]
    assert mpub_events(same) == [Mpub("t", same)]
    # sizes that differ but add up as if equal (5, 6, 4: as long as three of 5)
    mixed = [b"a" * 5, b"b" * 6, b"c" * 4]
    assert mpub_events(mixed) == [Mpub("t", mixed)]
    (err,) = mpub_events(same, count=8)  # one more announced than sent
    assert isinstance(err, ProtocolError) and "read message(7) body size" in err.message
