"""A pipelining publisher's PUBs to one topic, read together, are taken as one publish
(``Pubs``): each is answered OK, in order, and queued in order, as one by one; other
commands between them end a run, and a topic with a bound is published PUB by PUB (its
bound is judged at each). The session takes a run wherever it takes PUB."""

from __future__ import annotations

import asyncio

import pytest

from srtm.broker import Broker
from srtm.broker.tcp import Client
from srtm.protocol import (
    MAGIC_V2,
    Command,
    FrameReader,
    FrameType,
    Mpub,
    Nop,
    ProtocolError,
    Pub,
    Pubs,
    Session,
    SessionSettings,
    encode_command,
)
from srtm.protocol.limits import Limits
from srtm.ratelimit.overflow import Bound, OverflowPolicy
from support import MakeBroker, answered, count_publishes, loopback_pair


def _queued(broker: Broker, topic: str) -> list[bytes]:
    queue = broker.topics[topic].channels["c"].queue
    return [r[1] for r in queue.take(len(queue))]


async def test_a_run_of_pubs_in_one_read_is_one_publish_answered_ok_each(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = await make_broker()
    for topic in ("t", "u"):
        broker.channel(topic, "c")
    calls = count_publishes(broker, monkeypatch)
    peer, server = loopback_pair()
    with peer, server:
        client = Client(broker, server, True)
        broker.clients.add(client)
        asyncio.get_running_loop().remove_reader(server.fileno())  # read here, at once
        commands: list[Command] = [
            *(Pub("t", b"t%d" % i) for i in range(3)),
            Pub("u", b"u0"),
            *(Pub("t", b"t%d" % i) for i in range(3, 5)),
            Nop(),
            Pub("t", b"t5"),
            Mpub("t", [b"t6", b"t7"]),
            Pub("t", b"t8"),
        ]
        peer.sendall(MAGIC_V2 + b"".join(encode_command(c) for c in commands))
        client.intake.on_readable()
        answers = answered(peer)
        client.close()
    assert answers == [b"OK"] * 9  # a PUB each, the MPUB one
    assert calls == [("t", 3), ("u", 1), ("t", 2), ("t", 1), ("t", 2), ("t", 1)]
    assert _queued(broker, "t") == [b"t%d" % i for i in range(9)]
    assert _queued(broker, "u") == [b"u0"]


async def test_a_bounded_topic_judges_its_bound_pub_by_pub(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = await make_broker()
    broker.shares.set_bucket("t", 1_000_000.0, 1_000.0)
    broker.policing.set_bound("t", Bound(60_000, OverflowPolicy.REFUSE))
    calls = count_publishes(broker, monkeypatch)
    peer, server = loopback_pair()
    with peer, server:
        client = Client(broker, server, True)
        broker.clients.add(client)
        asyncio.get_running_loop().remove_reader(server.fileno())
        stream = b"".join(encode_command(Pub("t", b"m%d" % i)) for i in range(4))
        peer.sendall(MAGIC_V2 + stream)
        client.intake.on_readable()
        answers = answered(peer)
        client.close()
    assert answers == [b"OK"] * 4
    assert calls == [("t", 1)] * 4  # the bound, and so the run, judged at each PUB


async def test_a_run_to_a_bad_topic_is_refused_once_and_ends_the_session(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    peer, server = loopback_pair()
    with peer, server:
        client = Client(broker, server, True)
        broker.clients.add(client)
        asyncio.get_running_loop().remove_reader(server.fileno())
        raw = b"".join(b"PUB bad!\n" + len(b"x").to_bytes(4, "big") + b"x" for _ in range(3))
        peer.sendall(MAGIC_V2 + raw + encode_command(Pub("t", b"after")))
        client.intake.on_readable()
        answers = answered(peer)
        client.close()
    # As one by one: the first PUB's error, fatal; nothing after it runs.
    assert len(answers) == 1 and answers[0].startswith(b"ERR E_BAD_TOPIC"), answers
    assert "t" not in broker.topics


class Host:
    """A session's connection that records what the session asks of it."""

    def __init__(self) -> None:
        self.published: list[tuple[str, list[bytes]]] = []
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def publish(self, topic: str, bodies: list[bytes], arrival_ns: int) -> None:
        self.published.append((topic, bodies))


def test_a_session_takes_a_run_as_one_publish_and_answers_each() -> None:
    host = Host()
    session = Session(host, SessionSettings(limits=Limits()))  # type: ignore[arg-type]
    session.receive(Pubs("t", [b"a", b"b", b"c"]), 0)
    assert host.published == [("t", [b"a", b"b", b"c"])]
    (written,) = host.written
    frames = FrameReader().feed(written)
    assert [(f.kind, f.data) for f in frames] == [(FrameType.RESPONSE, b"OK")] * 3
    assert session.accepts(Pubs) and session.accepts(Pub)


def test_a_fake_relay_session_refuses_a_run_as_it_refuses_pub() -> None:
    for cmd in (Pub("t", b"a"), Pubs("t", [b"a", b"b"])):
        host = Host()
        session = Session(host, SessionSettings(limits=Limits()))  # type: ignore[arg-type]
        session.fake_relay = True
        with pytest.raises(ProtocolError) as err:
            session.receive(cmd, 0)
        assert host.published == [] and err.value.fatal
