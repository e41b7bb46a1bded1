"""A sensor's read, one PUB or an MPUB of one message, is taken in place
(``Intake._took_one``: ``Session.publish_one``, ``Broker.publish_one``) and answered
straight from its frame (``Output.answer``); what it leaves the broker and the client is
what ``publish`` leaves (the general path, the reference), and whatever it declines goes
through ``publish`` as before, answered as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from srtm.broker import Broker
from srtm.broker.tcp import Client
from srtm.protocol import MAGIC_V2, Mpub, ProtocolError, Pub, encode_command, errors
from srtm.ratelimit.overflow import Bound, OverflowPolicy
from support import MakeBroker, answered, count_publishes, loopback_pair


def _records(broker: Broker, topic: str) -> list[tuple[object, ...]]:
    """What the topic's channel holds, each message without its id and clock stamps."""
    queue = broker.topics[topic].channels["c"].queue
    return [(m.body, m.attempts, m.publisher) for m in queue.memory()]


def _reads(broker: Broker, reads: list[bytes]) -> tuple[list[bytes], Client]:
    """Each of ``reads`` read on its own by a client driven here; what it answered."""
    peer, server = loopback_pair()
    with peer, server:
        client = Client(broker, server, True)
        broker.clients.add(client)
        asyncio.get_running_loop().remove_reader(server.fileno())  # read here, at once
        peer.sendall(MAGIC_V2)
        client.intake.on_readable()
        for data in reads:
            peer.sendall(data)
            client.intake.on_readable()
        answers = answered(peer)
        client.close()
    return answers, client


async def test_a_sensor_s_reads_are_kept_as_publish_keeps_them(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = await make_broker()
    for topic in ("t", "ref"):
        broker.channel(topic, "c")
    # The parser takes a read as one publish once the topic's name has been read whole.
    assert _reads(broker, [encode_command(Pub("t", b"first"))])[0] == [b"OK"]
    assert broker.publish("ref", [b"first"], 1, "") is None
    calls = count_publishes(broker, monkeypatch)
    gaps = broker.stats.stamp_gaps
    gaps_before = gaps.count + len(gaps.pending)
    bodies = [b"m0", b"m1", b"m2"]
    reads = [encode_command(Pub("t", bodies[0])), encode_command(Mpub("t", [bodies[1]]))]
    reads.append(encode_command(Pub("t", bodies[2])))
    answers, client = _reads(broker, reads)
    assert answers == [b"OK"] * 3
    assert calls == []  # none went through ``publish``
    assert gaps.count + len(gaps.pending) == gaps_before + 4  # each read's stamp (and MAGIC's)
    for body in bodies:  # the reference: the general path, as a publisher's would
        assert broker.publish("ref", [body], 1, "") is None
    assert _records(broker, "t") == _records(broker, "ref")
    t, ref = broker.topics["t"], broker.topics["ref"]
    counts = (t.message_count, t.message_bytes)
    assert counts == (ref.message_count, ref.message_bytes) == (4, 11)
    assert t.channels["c"].message_count == ref.channels["c"].message_count == 4
    window = broker.stats.topic("t").window
    assert window._count == broker.stats.topic("ref").window._count == 4
    assert client.pub_counts == {"t": 3}


def _bound(broker: Broker) -> None:
    broker.shares.set_bucket("t", 1_000_000.0, 1_000.0)
    broker.policing.set_bound("t", Bound(60_000, OverflowPolicy.REFUSE))


def _no_token(broker: Broker) -> None:
    """Shaped, its one token spent: the next waits a second for its token."""
    broker.shares.set_bucket("t", 1.0, 1.0)
    bucket = broker.topics["t"].bucket
    assert bucket is not None
    bucket.reserve(at=time.time_ns())


def _paused(broker: Broker) -> None:
    broker.topics["t"].paused = True


DECLINED: dict[str, Callable[[Broker], None]] = {
    "a topic with a bound": _bound,
    "a shaped topic with no token": _no_token,
    "a paused topic": _paused,
}


@pytest.mark.parametrize("setup", list(DECLINED), ids=list(DECLINED))
async def test_what_it_declines_goes_through_publish(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    broker = await make_broker()
    broker.channel("t", "c")
    DECLINED[setup](broker)
    last_id = broker.ids.last
    calls = count_publishes(broker, monkeypatch)
    answers, client = _reads(broker, [encode_command(Pub("t", b"m"))])
    assert answers == [b"OK"]
    assert calls == [("t", 1)]
    assert broker.topics["t"].message_count == 1
    assert broker.ids.last == last_id + 1  # the general path's id: none taken before it
    assert client.pub_counts == {"t": 1}


async def test_a_shaped_topic_s_pub_with_a_token_is_released_in_place(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shaped topic's PUB that finds its token (its bucket full, nothing waiting) is
    taken in place and released on arrival, its token taken; the next, with none left,
    goes through ``publish`` and waits in the shaping queue."""
    broker = await make_broker()
    broker.channel("t", "c")
    broker.shares.set_bucket("t", 1.0, 1.0)
    topic = broker.topics["t"]
    assert topic.bucket is not None and topic.meter is not None
    calls = count_publishes(broker, monkeypatch)
    answers, client = _reads(broker, [encode_command(Pub("t", b"first"))])
    assert answers == [b"OK"] and calls == []
    assert [m.body for m in topic.channels["c"].queue.memory()] == [b"first"]
    (first,) = topic.channels["c"].queue.memory()
    assert first.release_ns == first.arrival_ns  # released on arrival
    stats = broker.stats.topic("t")
    wait = stats.token_wait.summary()
    assert wait["count"] == 1 and wait["p99"] <= 1  # no wait (the histogram's floor: 1 ns)
    assert stats.window._count == 1 and stats.window._backlog == pytest.approx(1.0)
    now = time.time_ns()
    assert not topic.bucket.may_release_by(now) and topic.meter.backlog_ns(now) > 0
    answers, _ = _reads(broker, [encode_command(Pub("t", b"second"))])
    assert answers == [b"OK"] and calls == [("t", 1)]
    assert [m.body for m in topic.shaping.memory()] == [b"second"]
    assert client.pub_counts == {"t": 1}


async def test_a_sensor_s_pub_is_counted_in_its_window_after_its_ok(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TB Adaptor's window counts a PUB taken in place once its OK has been sent
    (``Broker.account_one``), once; one a read left uncounted is counted by the next."""
    broker = await make_broker()
    broker.channel("t", "c")
    window = broker.stats.topic("t").window
    sent_then: list[int] = []
    account = broker.account_one

    def spy() -> None:
        sent_then.append(sum(c.output.sent_bytes for c in broker.clients))
        account()

    monkeypatch.setattr(broker, "account_one", spy)
    answers, _ = _reads(broker, [encode_command(Pub("t", b"reading"))])
    assert answers == [b"OK"] and window._count == 1
    assert sent_then[-1] == 10  # the OK's frame: size, type, "OK"
    monkeypatch.setattr(broker, "account_one", account)
    assert broker.publish_one("t", b"m", time.time_ns(), "")
    assert window._count == 1  # not yet: its read sends the OK first
    broker.account_one()
    broker.account_one()
    assert window._count == 2
    assert broker.publish_one("t", b"m", time.time_ns(), "")  # left uncounted...
    assert broker.publish_one("t", b"n", time.time_ns(), "")  # ...counted by the next
    broker.account_one()
    assert window._count == 4


async def test_a_shaped_pub_is_not_released_in_place_past_the_lease(
    make_broker: MakeBroker,
) -> None:
    """A lease that lapsed unnoticed holds the topic first, as a release would find: the
    PUB is declined and kept held, not released."""
    broker = await make_broker(controller="http://127.0.0.1:9")
    broker.shares.renew_lease(time.monotonic(), 60.0)
    broker.channel("t", "c")
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.shares.lease_until = time.monotonic() - 1.0  # lapsed; nothing has looked yet
    assert not broker.publish_one("t", b"m", time.time_ns(), "")
    topic = broker.topics["t"]
    assert topic.on_hold and topic.bucket is None
    assert broker.publish("t", [b"m"], time.time_ns(), "") is None
    assert not topic.channels["c"].queue.memory() and len(topic.shaping) == 1


async def test_a_new_topic_and_a_failing_disk_go_through_publish(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first PUB to a topic makes it (``publish``); while a disk queue fails, a PUB
    is refused with E_PUB_FAILED, as ``publish`` refuses it."""
    broker = await make_broker()
    calls = count_publishes(broker, monkeypatch)
    answers, _ = _reads(broker, [encode_command(Pub("new", b"m"))] * 2)
    assert answers == [b"OK", b"OK"]
    assert calls == [("new", 1)]  # the second, to a topic that is there, in place
    broker.persistence.failing.add(object())  # type: ignore[arg-type]

    def refuse(topic: object, what: str) -> None:  # the topic's own queue fails
        raise ProtocolError(errors.E_PUB_FAILED, f"{what} failed: disk")

    monkeypatch.setattr(broker.persistence, "refuse_if_failing", refuse)
    answers, _ = _reads(broker, [encode_command(Pub("new", b"m"))])
    assert calls[1:] == [("new", 1)]
    assert len(answers) == 1 and answers[0].startswith(b"ERR E_PUB_FAILED")


async def test_publish_one_declines_a_relayed_topic_with_nothing_done(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    broker.channel("t", "c")
    broker.relay.routes["t"] = object()  # type: ignore[assignment]
    last_id = broker.ids.last
    assert not broker.publish_one("t", b"m", 1, "")
    assert broker.ids.last == last_id and broker.topics["t"].message_count == 0
    del broker.relay.routes["t"]
    assert broker.publish_one("t", b"m", 1, "")
    assert broker.topics["t"].message_count == 1


async def test_an_mpub_of_two_and_a_read_of_two_pubs_take_the_general_path(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = await make_broker()
    broker.channel("t", "c")
    calls = count_publishes(broker, monkeypatch)
    two_pubs = encode_command(Pub("t", b"a")) + encode_command(Pub("t", b"b"))
    answers, _ = _reads(broker, [encode_command(Mpub("t", [b"x", b"y"])), two_pubs])
    assert answers == [b"OK"] * 3
    assert calls == [("t", 2), ("t", 2)]  # the MPUB; the two PUBs as one run
    assert [r[0] for r in _records(broker, "t")] == [b"x", b"y", b"a", b"b"]


async def test_the_answer_follows_what_was_queued_before_it(make_broker: MakeBroker) -> None:
    """``Output.answer``: straight from the frame where nothing waits, else behind what
    does (order kept), and held behind a publish whose disk write is pending."""
    broker = await make_broker()
    broker.channel("t", "c")
    peer, server = loopback_pair()
    with peer, server:
        client = Client(broker, server, True)
        out = client.output
        out.answer(b"one")
        assert not out.buf and peer.recv(16) == b"one"
        out.buf += b"queued,"
        out.answer(b"two")
        assert not out.buf and peer.recv(16) == b"queued,two"
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        out.hold_until(written)
        out.answer(b"three")
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(16)
        written.set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)
        peer.setblocking(True)
        peer.settimeout(5)
        assert peer.recv(16) == b"three"
        client.close()
