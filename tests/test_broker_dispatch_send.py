"""A dispatch sends what it took when it runs, at the end of the loop turn (or on time),
not a loop callback later: the next turn would first read, and answer, whatever came
meanwhile, and the message would wait behind that. For the same reason a read releases
what it made due before it returns."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

from srtm.broker import Broker
from srtm.broker.tcp import Client
from srtm.protocol import MAGIC_V2, FrameType, Pub, Rdy, Sub, encode_command
from support import MakeBroker, loopback_pair, sent_frames


def _frames(peer: socket.socket) -> list[FrameType]:
    return [f.kind for f in sent_frames(peer)]


def _client(broker: Broker, server: socket.socket) -> Client:
    client = Client(broker, server, True)
    broker.clients.add(client)
    asyncio.get_running_loop().remove_reader(server.fileno())  # read here, at once
    return client


@dataclass
class Pair:
    """A consumer subscribed to ``t``/``c`` and a publisher, each driven by hand, with the
    client ends of their connections."""

    broker: Broker
    consumer: Client
    cons_peer: socket.socket
    publisher: Client
    pub_peer: socket.socket


@contextlib.asynccontextmanager
async def subscribed(make_broker: MakeBroker, rdy: int) -> AsyncIterator[Pair]:
    broker = await make_broker()
    (cons_peer, cons_server), (pub_peer, pub_server) = loopback_pair(), loopback_pair()
    with cons_peer, cons_server, pub_peer, pub_server:
        consumer, publisher = _client(broker, cons_server), _client(broker, pub_server)
        cons_peer.sendall(MAGIC_V2 + encode_command(Sub("t", "c")) + encode_command(Rdy(rdy)))
        consumer.intake.on_readable()
        assert _frames(cons_peer) == [FrameType.RESPONSE]  # SUB's OK
        yield Pair(broker, consumer, cons_peer, publisher, pub_peer)
        consumer.close()
        publisher.close()


async def test_the_end_of_turn_dispatch_sends_what_it_took(make_broker: MakeBroker) -> None:
    async with subscribed(make_broker, 1) as p:
        p.pub_peer.sendall(MAGIC_V2 + encode_command(Pub("t", b"reading")))
        p.publisher.intake.on_readable()  # its OK is sent; the dispatch waits for the turn's end
        assert _frames(p.pub_peer) == [FrameType.RESPONSE]
        assert _frames(p.cons_peer) == []
        # One loop turn: the dispatch scheduled by the PUB runs, then this task again.
        await asyncio.sleep(0)
        assert not p.consumer.output.buf
        assert _frames(p.cons_peer) == [FrameType.MESSAGE]


async def test_a_publish_its_bucket_lets_through_is_released_within_its_read(
    make_broker: MakeBroker,
) -> None:
    """A shaped topic within its envelope: the message is due when it arrives, and goes to
    the consumer from the read that took it (after the OK), not after a loop turn and a
    wake of the release loop."""
    async with subscribed(make_broker, 2) as p:
        p.broker.shares.set_bucket("t", 10.0, 1)  # one token now, the next in 100 ms
        p.pub_peer.sendall(MAGIC_V2 + encode_command(Pub("t", b"due")))
        p.publisher.intake.on_readable()
        assert _frames(p.pub_peer) == [FrameType.RESPONSE]
        assert _frames(p.cons_peer) == [FrameType.MESSAGE]
        p.pub_peer.sendall(encode_command(Pub("t", b"held")))
        p.publisher.intake.on_readable()  # no token: it waits for the release loop
        assert _frames(p.pub_peer) == [FrameType.RESPONSE]
        assert _frames(p.cons_peer) == []


async def test_a_subscribed_topic_s_first_release_finds_its_stats_made(
    make_broker: MakeBroker,
) -> None:
    """The first message of a shaped topic is due on arrival (its bucket starts full), and
    as late as the read that takes it: the stats a first dispatch would otherwise make
    (the topic's and the channel's) are made by the consumer's SUB. (The SUB also makes
    the first PUB's name one the quick parse knows: tests/test_protocol_one_publish.py.)"""
    async with subscribed(make_broker, 2) as p:
        ts = p.broker.stats.topics.get("t")
        assert ts is not None and "c" in ts.channels
        p.broker.shares.set_bucket("t", 10.0, 1)
        p.pub_peer.sendall(MAGIC_V2 + encode_command(Pub("t", b"due")))
        p.publisher.intake.on_readable()
        assert _frames(p.cons_peer) == [FrameType.MESSAGE]
        assert p.broker.stats.topics["t"] is ts
        assert ts.lateness.count + len(ts.lateness.pending) == 1
