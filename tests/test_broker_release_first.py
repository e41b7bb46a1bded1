"""A publish its bucket lets through at once is released before the publisher's OK is
sent: the OK's send, after a broker slept, runs cold for longer than the release may be
late, and the subscriber's message waited for it."""

from __future__ import annotations

import asyncio
import socket
import struct

from srtm.broker.state import Channel
from srtm.broker.tcp import SO_TIMESTAMPNS, Client
from srtm.protocol import MAGIC_V2, FrameReader, FrameType, Pub, Rdy, Sub, encode_command
from support import MakeBroker, eventually, loopback_pair

_TIMESPEC = struct.Struct("@qq")


def stamped(sock: socket.socket) -> socket.socket:
    """``sock`` with the kernel's arrival stamp on what it reads (set before anything
    arrives: a stamp missing from what came before is taken when it is read)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return sock


def first_frame(sock: socket.socket) -> tuple[FrameType, int]:
    """The next frame ``sock`` reads and when its bytes arrived (ns, the kernel's stamp)."""
    sock.settimeout(5)
    data, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(_TIMESPEC.size))
    ((_, _, stamp),) = anc
    sec, nsec = _TIMESPEC.unpack(stamp)
    return FrameReader().feed(data)[0].kind, sec * 1_000_000_000 + nsec


def _ready(channel: Channel | None) -> bool:
    return channel is not None and any(c.rdy for c in channel.consumers)


async def test_a_release_due_on_arrival_goes_before_the_publishers_ok(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    broker.shares.set_bucket("t", 1.0, 1.0)  # full: the first message is due on arrival
    sub_peer, sub_server = loopback_pair()
    pub_peer, pub_server = loopback_pair()
    with stamped(sub_peer), sub_server, stamped(pub_peer), pub_server:
        broker.clients.add(Client(broker, sub_server, True))
        sub_peer.sendall(MAGIC_V2 + encode_command(Sub("t", "c")) + encode_command(Rdy(1)))
        await eventually(lambda: _ready(broker.topics["t"].channels.get("c")), what="RDY 1 taken")
        assert first_frame(sub_peer)[0] is FrameType.RESPONSE  # SUB's OK
        publisher = Client(broker, pub_server, True)
        broker.clients.add(publisher)
        asyncio.get_running_loop().remove_reader(pub_server.fileno())  # read here, by hand
        pub_peer.sendall(MAGIC_V2 + encode_command(Pub("t", b"reading")))
        publisher.intake.on_readable()
        kind, released_at = first_frame(sub_peer)
        assert kind is FrameType.MESSAGE
        kind, answered_at = first_frame(pub_peer)
        assert kind is FrameType.RESPONSE
        assert released_at < answered_at
        publisher.close()
