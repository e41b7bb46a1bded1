"""The publisher against a broker that refuses some of its messages: a refused message
fails its own publish and is never resent; only a lost connection causes a resend. A real
broker on 127.0.0.1 (``srtm broker`` as a child process)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from srtm.client import Publisher, PublishRefused
from srtm.launch import BrokerProcess, start_broker

TOO_BIG = b"x" * ((1 << 20) + 1)  # the broker's default limit is 1 MiB


def published(broker: BrokerProcess, topic: str) -> int:
    topics = broker.stats(topic)["topics"]
    return int(topics[0]["message_count"]) if topics else 0


async def started(broker: BrokerProcess, topic: str = "t") -> Publisher:
    pub = Publisher(topic, "p1", address=broker.tcp_address, max_pending=10)
    await pub.start()
    return pub


async def test_an_over_size_body_refused_by_the_broker_is_not_resent(
    broker_proc: BrokerProcess,
) -> None:
    """Finding 10: a body over the limit was resent after every reconnect, forever (3,711
    reconnects in 10 s), and the messages after it never got through."""
    pub = await started(broker_proc)
    pub.max_msg_size = None  # as with a broker that does not say its limit (nsqd)
    try:
        first = await pub.publish(b"before")
        big = await pub.publish(TOO_BIG)
        after = [await pub.publish(f"after {i}".encode()) for i in range(20)]  # > max_pending
        with pytest.raises(PublishRefused, match="E_BAD_MESSAGE") as refused:
            await big
        assert refused.value.code == "E_BAD_MESSAGE"
        await asyncio.gather(first, *after)  # acknowledged, none stuck behind the refusal
        with pytest.raises(PublishRefused, match="too big"):
            await pub.flush()  # the refusal is reported once to a caller of flush too
        await pub.flush()
        # The broker closes the connection on E_BAD_MESSAGE: one reconnect, not a loop.
        assert pub.reconnects == 1 and pub.refused == 1
        assert published(broker_proc, "t") == 21
    finally:
        await pub.close()


async def test_the_advertised_limit_refuses_before_sending(broker_proc: BrokerProcess) -> None:
    pub = await started(broker_proc)
    try:
        assert pub.max_msg_size == 1 << 20  # told by the broker's IDENTIFY answer
        with pytest.raises(PublishRefused, match="over the broker's limit"):
            await pub.publish(TOO_BIG)
        with pytest.raises(PublishRefused, match="empty"):
            await pub.publish(b"")
        await (await pub.publish(b"x" * (1 << 20)))  # exactly the limit is fine
        await pub.flush()
        assert pub.reconnects == 0 and published(broker_proc, "t") == 1
    finally:
        await pub.close()


async def test_a_refused_topic_fails_each_publish_once(broker_proc: BrokerProcess) -> None:
    """E_BAD_TOPIC (fatal: the broker hangs up): each message fails, none loops."""
    pub = await started(broker_proc, topic="bad*topic")
    try:
        for _ in range(3):
            with pytest.raises(PublishRefused, match="E_BAD_TOPIC"):
                await (await pub.publish(b"x"))
        assert pub.refused == 3 and pub.reconnects <= 3
    finally:
        await pub.close()


async def test_a_lost_connection_still_resends(tmp_path: Path) -> None:
    """The other side of the rule: messages unanswered when the broker vanishes are resent
    to it once it is back (here: stopped with SIGSTOP, then killed and restarted)."""
    data = tmp_path / "data"
    broker = start_broker(data)
    pub = Publisher("t", "p1", address=broker.tcp_address, max_pending=100)
    await pub.start()
    restarted: BrokerProcess | None = None
    try:
        await (await pub.publish(b"acked"))
        os.kill(broker.proc.pid, signal.SIGSTOP)
        pending = [await pub.publish(f"m{i}".encode()) for i in range(5)]
        broker.proc.kill()
        broker.proc.wait()
        broker.stop()
        port = broker.tcp[1]
        restarted = start_broker(data, ["--tcp-address", f"127.0.0.1:{port}"])
        await asyncio.wait_for(asyncio.gather(*pending), 30)  # against hanging only
        assert pub.reconnects >= 1 and pub.refused == 0
        assert published(restarted, "t") >= 5
    finally:
        await pub.close()
        if restarted is not None:
            restarted.stop()
        if broker.alive():
            broker.proc.kill()


async def test_garbled_orders_do_not_break_the_connection() -> None:
    """A broker (or whoever answers at a migration target) that sends malformed SRTM
    order frames: deeply nested JSON, a list, a bad target. The publisher ignores them
    and keeps publishing on the same connection."""
    import struct

    from srtm.protocol import FrameType
    from srtm.protocol.frames import frame

    pubs: list[bytes] = []

    async def fake_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)  # magic
        await reader.readline()  # IDENTIFY
        (size,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(size)
        writer.write(frame(FrameType.RESPONSE, b'{"max_rdy_count": 2500}'))
        for order in (b"[" * 100_000 + b"]" * 100_000, b"[1, 2]", b'{"migrate": 5}',
                      b'{"migrate": {"topic": "t", "to": "no port"}}'):  # fmt: skip
            writer.write(frame(FrameType.SRTM, order))
        while await reader.readline():  # PUB t\n [size][body]
            (size,) = struct.unpack(">I", await reader.readexactly(4))
            pubs.append(await reader.readexactly(size))
            writer.write(frame(FrameType.RESPONSE, b"OK"))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(fake_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pub = Publisher("t", "p1", address=f"127.0.0.1:{port}")
    try:
        await pub.start()
        for i in range(3):  # the deadline only against hanging
            await asyncio.wait_for(await pub.publish(f"m{i}".encode()), 10)
        assert pubs == [b"m0", b"m1", b"m2"]
        assert pub.reconnects == 0 and pub.migrations == 0
    finally:
        await pub.close()
        server.close()
        await server.wait_closed()


async def test_an_answer_to_a_command_given_up_on_keeps_the_reader_alive() -> None:
    """A caller cancels its command's future (a timeout) before the broker answers: the
    late answer and an error frame after it are taken in order, the next command gets
    its own answer, and the connection keeps reading."""
    import struct

    from srtm.nsq_connection import BrokerError, Connection
    from srtm.protocol import FrameType
    from srtm.protocol.commands import Pub
    from srtm.protocol.frames import frame

    ok, error = FrameType.RESPONSE, FrameType.ERROR
    answers = [frame(ok, b"OK"), frame(error, b"E_BAD_MESSAGE late"),
               frame(error, b"E_BAD_TOPIC x"), frame(ok, b"OK")]  # fmt: skip

    async def fake_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)  # magic
        for answer in answers:  # one per PUB t\n [size][body], in order
            await reader.readline()
            (size,) = struct.unpack(">I", await reader.readexactly(4))
            await reader.readexactly(size)
            writer.write(answer)
        await reader.read()
        writer.close()

    server = await asyncio.start_server(fake_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = await Connection.open(f"127.0.0.1:{port}")
    try:
        first, second = conn.request(Pub("t", b"a")), conn.request(Pub("t", b"b"))
        first.cancel()
        second.cancel()
        third = conn.request(Pub("t", b"c"))
        with pytest.raises(BrokerError, match="E_BAD_TOPIC"):
            await asyncio.wait_for(third, 10)  # the deadline only against hanging
        assert await asyncio.wait_for(conn.request(Pub("t", b"d")), 10) == b"OK"
        assert not conn.closed.is_set()
    finally:
        conn.writer.close()
        server.close()
        await server.wait_closed()


def test_a_command_on_a_reset_connection_fails_its_future_not_its_caller() -> None:
    """A broker killed under a connection: before our reader sees the reset, uvloop
    raises on a write. The command fails with ConnectionError (the publisher resends it
    after reconnecting) instead of raising into the caller, which killed the live
    experiment's load generator at the broker kill."""
    import uvloop

    from srtm.nsq_connection import Connection
    from srtm.protocol.commands import Nop, Pub

    async def main() -> None:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await Connection.open(f"127.0.0.1:{port}")
        try:
            conn.writer.transport.abort()  # the reset: uvloop closes the handle next turn
            await asyncio.sleep(0)
            assert not conn.closed.is_set()  # our reader has not run since
            conn.send(Nop())
            fut = conn.request(Pub("t", b"a"))
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(fut, 10)  # the deadline only against hanging
        finally:
            await conn.close()
            server.close()
            await server.wait_closed()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
