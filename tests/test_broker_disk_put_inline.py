"""A sensor's PUB past memory, the short way: ``DiskQueue.put_inline`` writes one fresh
record on the event loop at once where ``push`` then ``written`` would have done the same,
and leaves the queue as they leave it; elsewhere it declines with nothing done. Above it,
``MessageQueue.put_single`` and ``Topic.put_one`` say where the message went (``Kept``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nsq_raw import RawClient
from srtm.broker.disk import DiskQueue
from srtm.broker.disk.io import DiskIO
from srtm.broker.message import Message
from srtm.broker.queue import Kept, MessageQueue, Record
from srtm.broker.state import Topic
from srtm.protocol import Fin, Pub, Rdy, Sub
from support import FullableDisk, ListOverflow, MakeBroker, eventually

NOW, ARRIVAL = 10**18 + 7, 10**18 + 5


def record(n: int) -> Record:
    """A fresh PUB's record, as ``MessageQueue.put_single`` hands it down."""
    return (b"%016x" % n, b"reading %d" % n, NOW + n, ARRIVAL + n, ARRIVAL + n, 0, "s-1", None)


async def push_written(q: DiskQueue, r: Record) -> bool:
    """The general way: push, then have it written; whether that was inline."""
    q.push(Message(*r))
    fut = q.written()
    if fut is not None:
        await fut
    return fut is None


def files(q: DiskQueue) -> list[bytes]:
    return [p.read_bytes() for p in sorted(q.directory.glob("*.dat"))]


def pops(q: DiskQueue) -> list[Message]:
    return list(iter(q.pop, None))


async def test_it_writes_what_push_and_written_write_and_leaves_the_same_queue(
    tmp_path: Path,
) -> None:
    """Two queues given the same PUBs, the general way and the short way: the same bytes
    on disk, the same length and nothing pending after each, and the same messages popped
    (read ahead, as records read back keep their origins), interleaved with reads."""
    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16)
    slow, fast = DiskQueue(tmp_path / "slow", io=io), DiskQueue(tmp_path / "fast", io=io)
    try:
        # The first write opens the segment (on the disk thread): no short way yet.
        assert not fast.put_inline(record(0))
        assert len(fast) == 0 and fast.pending == 0 and files(fast) == []
        for q in (slow, fast):
            await push_written(q, record(0))
        for n in range(1, 40):
            assert await push_written(slow, record(n))  # inline, as the short way is
            assert fast.put_inline(record(n))
            assert (len(fast), fast.pending) == (len(slow), slow.pending)
            assert files(fast) == files(slow)
            if n % 7 == 0:
                await asyncio.sleep(0)  # the "readable" callbacks, then a read
                assert [m.body for m in pops(fast)] == [m.body for m in pops(slow)]
        await io.quiesce()
        assert pops(fast) == pops(slow) != []
        assert files(fast) == files(slow)
    finally:
        await io.quiesce()
        slow.close()
        fast.close()


async def test_it_declines_with_nothing_done_where_the_general_way_differs(
    tmp_path: Path,
) -> None:
    """Each reason to decline, with the queue unchanged: no disk thread, inline writes
    off, something buffered before it, a write running on the thread, a segment full."""
    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16)
    off = DiskIO(asyncio.get_running_loop(), inline_bytes=0)
    queues: list[DiskQueue] = []

    async def opened(name: str, disk_io: DiskIO | None, **kw: Any) -> DiskQueue:
        q = DiskQueue(tmp_path / name, io=disk_io, **kw)
        queues.append(q)
        await push_written(q, record(0))
        return q

    def declines(q: DiskQueue) -> None:
        before = (len(q), q.pending)
        assert not q.put_inline(record(99))
        assert (len(q), q.pending) == before

    try:
        declines(await opened("inline", None))
        declines(await opened("off", off))
        buffered = await opened("buffered", io)
        buffered.push(Message(*record(1)))
        declines(buffered)
        declines(await opened("full", io, segment_bytes=64))
        writing = await opened("writing", io)
        writing.push(Message(*record(1)))
        writing.flush()  # on the thread: until it is back, a write runs
        assert writing.pending == 1
        declines(writing)
        await io.quiesce()
        for q in queues:  # nothing of the declined PUB anywhere
            assert b"reading 99" not in b"".join(files(q))
        assert [m.body for m in pops(writing)] == [b"reading 0", b"reading 1"]
    finally:
        for disk_io in (io, off):
            await disk_io.quiesce()
        for q in queues:
            q.close()


async def test_a_failed_write_keeps_the_message_waiting_as_the_general_way_does(
    tmp_path: Path,
) -> None:
    """Taken even so (acknowledged, as ``written`` acknowledges it): it waits in memory,
    the queue is failing, and it is written once writing works again."""
    disk = FullableDisk()
    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16)
    q = DiskQueue(tmp_path / "q", io=io, writer=disk.write)
    try:
        await push_written(q, record(0))
        disk.full = True
        assert q.put_inline(record(1))
        assert q.failing and q.pending == 1 and len(q) == 2
        assert not q.put_inline(record(2))  # a failing queue: the general way
        disk.full = False
        q.flush()
        await io.quiesce()
        assert not q.failing and q.pending == 0
        assert [m.body for m in pops(q)] == [b"reading 0", b"reading 1"]
    finally:
        await io.quiesce()
        q.close()


def test_put_single_goes_to_memory_then_to_a_backend_that_takes_it() -> None:
    """Memory while there is room; past it, and while anything waits in the backend
    (which a fresh message must follow), the backend's short way or nothing."""
    backend = ListOverflow(inline=True)
    q = MessageQueue(2, backend)
    r = [record(n) for n in range(4)]
    assert [q.put_single(*x[:4], x[6]) for x in r[:3]] == [Kept.MEMORY, Kept.MEMORY, Kept.DISK]
    assert backend.records == [r[2]]
    assert q.take(1) == r[:1]
    # Room in memory again, but one waits in the backend: the next goes behind it.
    assert q.put_single(*r[3][:4], r[3][6]) is Kept.DISK
    assert q.take(5) == r[1:]
    for nowhere in (MessageQueue(0, ListOverflow()), MessageQueue(0)):
        assert nowhere.put_single(*r[0][:4], r[0][6]) is Kept.NOT
        assert len(nowhere) == 0 and nowhere.dropped == 0


async def test_put_one_writes_a_channel_s_pub_past_memory(tmp_path: Path) -> None:
    """One channel: its disk takes the PUB the short way and counts it, as ``put_many``
    does. Two channels, one full: the general way takes it (the topic declines)."""
    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16)
    disks: list[DiskQueue] = []

    def queue(key: str) -> MessageQueue:
        disk = DiskQueue(tmp_path / key.replace(":", "-"), io=io)
        disks.append(disk)
        return MessageQueue(0 if key == "t:c" else 5, disk)

    topic = Topic("t", queue)
    ch = topic.channel("c")
    try:
        ch.queue.extend([record(0)])  # the general way opens the segment
        fut = disks[-1].written()
        if fut is not None:
            await fut
        assert topic.put_one(*record(1)[:4], "s-1", True) is Kept.DISK
        assert (ch.message_count, topic.message_count, topic.message_bytes) == (1, 1, 9)
        assert disks[-1].pending == 0 and len(ch.queue) == 2
        topic.channel("d")
        assert topic.put_one(*record(2)[:4], "s-1", True) is Kept.NOT
        assert topic.message_count == 1
    finally:
        await io.quiesce()
        for d in disks:
            d.close()


async def test_a_broker_acknowledges_pubs_past_memory_once_written_and_delivers_them(
    make_broker: MakeBroker,
) -> None:
    """Live: PUBs past a channel's memory, each OK'd after its write (the file holds
    each one as its OK comes back), timed by the storage-latency meter as any write the
    OK waits for, and delivered in order with those kept in memory."""
    broker = await make_broker(mem_queue_size=3)
    assert broker.tcp_address is not None
    broker.channel("t", "c")
    pub = await RawClient.connect(*broker.tcp_address)
    sub = await RawClient.connect(*broker.tcp_address)
    directory = broker.options.data_dir / "queues" / "q-t:c"
    sent = [b"reading %03d" % n for n in range(40)]
    try:
        for n, body in enumerate(sent):
            await pub.send(Pub("t", body))
            assert await pub.response() == b"OK"
            if n >= 4:  # past memory, and past the first write (which opens the file)
                assert body in b"".join(p.read_bytes() for p in directory.glob("*.dat"))
        assert broker.storage_latency["t"].count == len(sent) - 3
        await sub.send(Sub("t", "c"))
        assert await sub.response() == b"OK"
        await sub.send(Rdy(100))
        got = []
        for _ in sent:
            m = await sub.message()
            got.append(m.body)
            await sub.send(Fin(m.id))
        assert got == sent
    finally:
        await pub.close()
        await sub.close()


async def test_a_waiting_consumer_gets_each_pub_written_the_short_way(
    make_broker: MakeBroker,
) -> None:
    """Nothing in memory (--mem-queue-size 0): each PUB after the first is written the
    short way, which leaves telling the channel to the publish (no "readable" callback);
    a consumer waiting with RDY gets each one before the next is sent."""
    broker = await make_broker(mem_queue_size=0)
    assert broker.tcp_address is not None
    pub = await RawClient.connect(*broker.tcp_address)
    sub = await RawClient.connect(*broker.tcp_address)
    try:
        await sub.send(Sub("t", "c"))
        assert await sub.response() == b"OK"
        await sub.send(Rdy(10))
        channel = broker.topics["t"].channels["c"]
        for n in range(30):
            await pub.send(Pub("t", b"reading %d" % n))
            assert await pub.response() == b"OK"
            m = await asyncio.wait_for(sub.message(), 10)
            assert m.body == b"reading %d" % n
            await sub.send(Fin(m.id))
            # The FIN's own dispatch over (it found nothing): the next PUB must ask for one.
            await eventually(lambda: not channel.in_flight, what="the FIN taken")
        assert broker.storage_latency["t"].count == 30
    finally:
        await pub.close()
        await sub.close()
