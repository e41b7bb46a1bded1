"""Passes over every connection (deadline checks, RTT reads) take a loop turn per slice,
so thousands of connections never hold the loop for milliseconds; deadlines are checked
only where one bounds something; and RTTs, a syscall per connection, are read only while
a measurement round needs them."""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field

import pytest

from nsq_raw import RawClient
from srtm.broker import tcp
from srtm.broker.measurement import RTTS_PER_TURN, Measurements
from srtm.broker.tcp import DEADLINES_PER_TURN, check_deadlines
from srtm.protocol import MAGIC_V2, Mpub, Pub, Rdy, Sub, encode_command
from support import MakeBroker, eventually


@dataclass(eq=False)
class Conn:
    """A connection as the passes see it; each call is logged in ``log``."""

    name: int
    log: list[object]
    publisher: str = ""
    pub_counts: dict[str, int] = field(default_factory=dict)
    rtt_cache_ns: int = 0
    #: What ``check_deadlines`` answers: whether a deadline still bounds it.
    bounded: bool = True

    def check_deadlines(self, now: int) -> bool:
        self.log.append(self.name)
        return self.bounded

    def rtt_ns(self) -> int:
        self.log.append(self.name)
        return 1_000 * (self.name + 1)


def _other_work_ran_between_slices(log: list[object], n: int, per_turn: int) -> None:
    """Each connection once, in order, with the loop's other work after the first slice."""
    assert [x for x in log if x != "other"] == list(range(n))
    assert log.index("other") == per_turn


async def test_deadline_checks_leave_the_loop_between_slices() -> None:
    log: list[object] = []
    conns = [Conn(i, log, bounded=i % 3 != 0) for i in range(3 * DEADLINES_PER_TURN + 5)]
    watched = dict.fromkeys(conns)
    asyncio.get_running_loop().call_soon(log.append, "other")
    await check_deadlines(watched)  # type: ignore[arg-type]
    _other_work_ran_between_slices(log, len(conns), DEADLINES_PER_TURN)
    # those no deadline bounds any more leave the watch; the rest stay, in order
    assert list(watched) == [c for c in conns if c.bounded]


async def test_the_deadline_pass_looks_only_at_connections_a_deadline_bounds(
    make_broker: MakeBroker,
) -> None:
    """Idle connections are never watched; a command partly read is, until it is whole;
    output a send left behind is, until the write timeout closes its connection."""
    broker = await make_broker(read_timeout_ms=1000, write_timeout_ms=1000)
    assert broker.tcp_address is not None
    address = broker.tcp_address
    idle = [await RawClient.connect(*address) for _ in range(10)]
    part = await RawClient.connect(*address)
    sink = socket.socket()
    try:
        await eventually(lambda: len(broker.clients) == 11, "the connections accepted")
        await part.send(b"PUB t\n" + struct.pack(">I", 5) + b"ab")
        await eventually(lambda: len(broker.deadline_watch) == 1, "the partial PUB watched")
        await asyncio.sleep(0.3)  # a pass (every 250 ms here) keeps it: it is still partial
        assert len(broker.deadline_watch) == 1
        await part.send(b"cde")
        assert await part.response() == b"OK"
        await eventually(lambda: not broker.deadline_watch, "unwatched once whole")

        # A consumer that does not read, tiny buffers both sides: the broker's send leaves
        # bytes behind.
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sink.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sink, address)
        sink.send(MAGIC_V2 + encode_command(Sub("t", "c")) + encode_command(Rdy(200)))
        channels = broker.topics["t"].channels
        await eventually(lambda: "c" in channels and channels["c"].consumers, "subscribed")
        (consumer,) = broker.clients - {c for c in broker.clients if c.channel is None}
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        await part.send(Mpub("t", [b"m" * 1024] * 200))
        assert await part.response() == b"OK"
        await eventually(lambda: consumer in broker.deadline_watch, "unsent output watched")
        await eventually(lambda: consumer not in broker.clients, "closed by the write timeout")
        assert consumer not in broker.deadline_watch
        assert len(broker.clients) == 11  # the idle ones and the publisher, never watched
    finally:
        sink.close()
        for c in [*idle, part]:
            await c.close()


async def test_rtt_reads_leave_the_loop_between_slices() -> None:
    log: list[object] = []
    conns = [Conn(i, log, publisher=f"p{i}") for i in range(2 * RTTS_PER_TURN + 1)]
    conns[-1].pub_counts["t"] = 1  # the one publisher
    m = Measurements()
    asyncio.get_running_loop().call_soon(log.append, "other")
    await m.refresh_rtts(conns)
    _other_work_ran_between_slices(log, len(conns), RTTS_PER_TURN)
    assert [c.rtt_cache_ns for c in conns] == [1_000 * (i + 1) for i in range(len(conns))]
    assert m.publisher_rtt_ns == {conns[-1].publisher: conns[-1].rtt_cache_ns}


async def test_rtts_are_read_only_while_a_round_runs(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = tcp.Client.rtt_ns

    def counted(self: tcp.Client) -> int:
        reads.append(1)
        return real(self)

    monkeypatch.setattr(tcp.Client, "rtt_ns", counted)
    broker = await make_broker()
    housekept: list[int] = []
    real_housekeep = broker.persistence.housekeep

    async def housekeep() -> None:  # the per-second step, where RTTs were read
        housekept.append(1)
        await real_housekeep()

    monkeypatch.setattr(broker.persistence, "housekeep", housekeep)
    assert broker.tcp_address is not None
    client = await RawClient.connect(*broker.tcp_address)
    try:
        await client.send(Pub("t", b"x"))
        await client.frame()
        await eventually(lambda: housekept, "a per-second step")
        assert reads == []  # no round: no TCP_INFO call
        round_ = asyncio.create_task(broker.measure("t", None, 3_000_000_000))
        # One read as the round starts, one at the next per-second step.
        await eventually(lambda: len(reads), "RTTs read in a round", until=lambda n: n >= 2)
        round_.cancel()
    finally:
        await client.close()
