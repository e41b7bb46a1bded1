"""The disk queues' file I/O runs on the broker's disk thread, and a publish that
overflowed to disk is acknowledged only once written. The one exception: a publish's small
overflow to an open, idle segment is written on the event loop (``--disk-inline-write-bytes``),
until one such write is slow; the tests of the thread turn it off."""

from __future__ import annotations

import asyncio
import builtins
import io
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import srtm.broker.disk.io
import srtm.broker.disk.queue
from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.broker.disk import DiskQueue
from srtm.broker.disk.io import (
    INLINE_PAUSE_NS,
    MAX_INLINE_PAUSE_NS,
    SLOW_INLINE_NS,
    STRIKES_KEPT_NS,
    DiskIO,
    thread_sleeps,
)
from srtm.broker.message import Message
from srtm.broker.metrics import BrokerCollector
from srtm.protocol import MAGIC_V2, Fin, Mpub, Pub, Rdy, Sub
from srtm.protocol.commands import encode_command
from support import FullableDisk, MakeBroker, eventually

PAD = b"." * 200  # enough that the backlog is written out (past 256 KiB) and read back
OK_FRAME = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def _set_writer(monkeypatch: pytest.MonkeyPatch, writer: Callable[[int, Any], int]) -> None:
    """Every DiskQueue the broker makes writes through ``writer``."""
    defaults = dict(DiskQueue.__init__.__kwdefaults__ or {})
    defaults["writer"] = writer
    monkeypatch.setattr(DiskQueue.__init__, "__kwdefaults__", defaults)


async def test_no_disk_queue_file_work_runs_on_the_event_loop(
    make_broker: MakeBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every message through disk (mem-queue-size 0, small segments that rotate and
    are deleted; a backlog read back), opening, writing, reading and deleting segment files
    all happen off the loop's thread (the old code did them all on it)."""
    queues = tmp_path / "data" / "queues"
    calls: list[tuple[str, int]] = []  # (what, thread)

    def ours(path: object) -> bool:
        return isinstance(path, (str, os.PathLike)) and str(path).startswith(str(queues))

    def record(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
            if ours(path):
                calls.append((name, threading.get_ident()))
            return fn(path, *args, **kwargs)

        return wrapper

    def writer(fd: int, data: Any) -> int:
        calls.append(("write", threading.get_ident()))
        return os.write(fd, data)

    _set_writer(monkeypatch, writer)
    for name in ("open", "unlink", "ftruncate", "rmdir", "mkdir"):
        monkeypatch.setattr(os, name, record(name, getattr(os, name)))
    monkeypatch.setattr(io, "open", record("io.open", io.open))  # Path.open, Path.read_*
    monkeypatch.setattr(builtins, "open", record("open()", builtins.open))

    broker = await make_broker(mem_queue_size=0, max_bytes_per_file=4096, disk_inline_write_bytes=0)
    assert broker.tcp_address is not None
    loop_thread = threading.get_ident()
    pub = await RawClient.connect(*broker.tcp_address)
    sub = await RawClient.connect(*broker.tcp_address)
    await sub.send(Sub("t", "c"))
    assert await sub.response() == b"OK"
    sent = 600
    for i in range(0, sent, 20):
        await pub.send(Mpub("t", [b"m%04d" % n + b"x" * 1000 for n in range(i, i + 20)]))
        assert await pub.response() == b"OK"
    await sub.send(Rdy(50))  # a backlog: read back from the channel's segments
    got: set[bytes] = set()
    while len(got) < sent:
        m = await sub.message()
        got.add(m.body[:5])
        await sub.send(Fin(m.id))
    assert len(got) == sent
    # every segment settled and deleted (on the disk thread) but the one being written
    await eventually(
        lambda: (
            len(list((queues / "q-t").glob("*.dat"))) <= 1
            and len(list((queues / "q-t:c").glob("*.dat"))) <= 1
        ),
        what="settled segments deleted",
    )
    await pub.close()
    await sub.close()
    kinds = {name for name, _ in calls}
    assert {"write", "open", "io.open", "unlink"} <= kinds, kinds  # the disk was used
    on_loop = [name for name, thread in calls if thread == loop_thread]
    assert not on_loop, f"file work on the event loop: {sorted(set(on_loop))}"


async def test_a_read_back_wakes_the_channel_that_reads_not_the_topics_first(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages read back on the disk thread for a topic's second channel are dispatched
    to its consumer once read, though the topic's first channel (no consumer) is another."""
    read_batch = srtm.broker.disk.queue.read_batch

    def slow_read(*args: Any) -> Any:
        threading.Event().wait(0.05)  # the consumer drains what was read ahead meanwhile
        return read_batch(*args)

    monkeypatch.setattr(srtm.broker.disk.queue, "read_batch", slow_read)
    broker = await make_broker(mem_queue_size=0, disk_inline_write_bytes=0)
    assert broker.tcp_address is not None
    pub = await RawClient.connect(*broker.tcp_address)
    sub = await RawClient.connect(*broker.tcp_address)
    broker.channel("t", "a")
    await sub.send(Sub("t", "b"))
    assert await sub.response() == b"OK"
    sent = 1000  # past what is read ahead as written: the rest is read back
    for i in range(0, sent, 100):
        await pub.send(Mpub("t", [b"m%04d" % n for n in range(i, i + 100)]))
        assert await pub.response() == b"OK"
    # RDY 1: a read back finds the consumer with nothing in flight, waiting for it
    await sub.send(Rdy(1))
    got = []
    while len(got) < sent:
        m = await sub.message()
        got.append(m.body)
        await sub.send(Fin(m.id))
    assert got == [b"m%04d" % n for n in range(sent)]
    await pub.close()
    await sub.close()


async def test_an_ok_waits_for_its_write_and_holds_later_frames_of_its_connection_only(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PUB that overflowed to disk is answered once its write is done; the answer to a
    later command of the same connection waits behind it (order is kept); another
    connection is answered meanwhile (the old code blocked the whole loop in the write)."""
    entered, release = threading.Event(), threading.Event()

    def writer(fd: int, data: Any) -> int:
        entered.set()
        release.wait(10)  # bounded: the old code, blocking the loop here, fails, not hangs
        return os.write(fd, data)

    _set_writer(monkeypatch, writer)
    broker: Broker = await make_broker(mem_queue_size=0, disk_inline_write_bytes=0)
    assert broker.tcp_address is not None
    loop = asyncio.get_running_loop()
    a = socket.create_connection(broker.tcp_address)
    try:
        a.setblocking(False)
        await loop.sock_sendall(a, MAGIC_V2 + encode_command(Pub("t", b"durable")))
        await eventually(entered.is_set, what="the PUB's write started")
        # the same connection: an ephemeral topic needs no disk, its OK waits nonetheless
        await loop.sock_sendall(a, encode_command(Pub("e#ephemeral", b"a")))
        b = await RawClient.connect(*broker.tcp_address)
        await b.send(Pub("e#ephemeral", b"b"))
        assert await b.response() == b"OK"  # answered while the write is still blocked
        await eventually(
            lambda: (
                "e#ephemeral" in broker.topics and broker.topics["e#ephemeral"].message_count == 2
            ),
            what="the second PUB of the first connection ran",
        )
        await b.send(Pub("e#ephemeral", b"c"))  # a full loop turn later
        assert await b.response() == b"OK"
        with pytest.raises(BlockingIOError):
            a.recv(100)  # nothing answered yet: the first OK waits for its write
        assert not release.is_set()
        release.set()
        data = b""
        while len(data) < 2 * len(OK_FRAME):
            data += await loop.sock_recv(a, 100)
        assert data == OK_FRAME * 2
        await b.close()
    finally:
        release.set()
        a.close()


async def test_http_pub_answers_once_written(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/pub and /mpub await the write of what they overflowed to disk before their 200."""
    import aiohttp

    from srtm.broker.http import serve_http

    entered, release = threading.Event(), threading.Event()

    def writer(fd: int, data: Any) -> int:
        entered.set()
        release.wait(10)
        return os.write(fd, data)

    _set_writer(monkeypatch, writer)
    broker = await make_broker(mem_queue_size=0, disk_inline_write_bytes=0)
    runner, port = await serve_http(broker)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            for path in ("/pub?topic=h", "/mpub?topic=h"):
                entered.clear()
                release.clear()
                answer = asyncio.ensure_future(http.post(path, data=b"x"))
                await eventually(entered.is_set, what=f"{path}: the write started")
                # a request on another topic in memory is answered meanwhile
                other = await http.post("/pub?topic=m%23ephemeral", data=b"y")
                assert other.status == 200
                assert not answer.done()  # still waiting for its write
                release.set()
                resp = await answer
                assert resp.status == 200 and await resp.text() == "OK"
    finally:
        release.set()
        await runner.cleanup()


async def test_a_small_overflow_to_an_open_segment_is_written_before_its_ok_on_the_loop(
    make_broker: MakeBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first PUB opens the segment on the disk thread; later ones are written on the
    loop, each in the file before its OK (kill -9 keeps it), with no thread hand-off."""
    queue_dir = tmp_path / "data" / "queues" / "q-s"
    writes: list[int] = []
    opens: list[int] = []
    real_open = os.open

    def writer(fd: int, data: Any) -> int:
        writes.append(threading.get_ident())
        return os.write(fd, data)

    def recording_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(queue_dir)):
            opens.append(threading.get_ident())
        return real_open(path, *args, **kwargs)

    _set_writer(monkeypatch, writer)
    monkeypatch.setattr(os, "open", recording_open)
    # a write the machine slows (a busy CI runner) must not pause inline writes here: the
    # pause has its own test, on a clock of its own
    monkeypatch.setattr(srtm.broker.disk.io, "SLOW_INLINE_NS", 10**12)
    broker = await make_broker(mem_queue_size=0)
    assert broker.tcp_address is not None
    loop_thread = threading.get_ident()
    c = await RawClient.connect(*broker.tcp_address)
    sizes = []
    for i in range(20):
        await c.send(Pub("s", b"reading %02d" % i))
        assert await c.response() == b"OK"
        sizes.append(sum(f.stat().st_size for f in queue_dir.glob("*.dat")))
    await c.close()
    assert all(a < b for a, b in itertools.pairwise(sizes)), sizes  # each OK'd write
    assert opens and loop_thread not in opens  # the segment was opened off the loop
    assert writes[0] != loop_thread  # the first write opened it, on the thread
    assert writes[1:] == [loop_thread] * 19
    scraped = {m.name: m.samples[0].value for m in BrokerCollector(broker).collect() if m.samples}
    assert scraped["srtm_disk_inline_writes"] == 19
    assert scraped["srtm_disk_slow_inline_writes"] == 0
    assert scraped["srtm_disk_busy_inline_writes"] == 0


class _Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


async def _write_one(q: DiskQueue, n: int) -> bool:
    """Push one message and have it written: whether that was inline (no future)."""
    q.push(Message(b"%016x" % n, b"m%d" % n, 1, 2))
    fut = q.written()
    if fut is not None:
        await fut
    return fut is None


async def test_a_slow_inline_write_sends_writes_to_the_disk_thread_for_a_while(
    tmp_path: Path,
) -> None:
    """A slow inline write that waited in the kernel pauses inline writes; slow ones in a
    row pause them longer, and one long after the last pause starts again from the
    shortest."""
    clock = _Clock()
    sleeps = itertools.count(1)
    slept = 0
    threads: list[int] = []
    slow = False

    def writer(fd: int, data: Any) -> int:
        nonlocal slept
        threads.append(threading.get_ident())
        if slow:
            clock.ns += SLOW_INLINE_NS + 1  # as if the kernel held the write this long
            slept = next(sleeps)
        return os.write(fd, data)

    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16, clock=clock, sleeps=lambda: slept)
    q = DiskQueue(tmp_path / "q", io=io, writer=writer)
    loop_thread = threading.get_ident()
    n = 0

    async def inline(slowly: bool = False) -> bool:
        nonlocal n, slow
        slow = slowly
        n += 1
        written_inline = await _write_one(q, n)
        slow = False
        assert (threads[-1] == loop_thread) == written_inline
        return written_inline

    try:
        assert not await inline()  # opens the segment: the thread
        assert await inline()
        assert await inline(slowly=True)  # inline, and slow: paused for the shortest pause
        assert not await inline()
        clock.ns += INLINE_PAUSE_NS
        assert await inline(slowly=True)  # again, right after: twice as long
        clock.ns += INLINE_PAUSE_NS
        assert not await inline()
        clock.ns += INLINE_PAUSE_NS
        assert await inline()
        clock.ns += STRIKES_KEPT_NS + MAX_INLINE_PAUSE_NS
        assert await inline(slowly=True)  # long after: the shortest pause again
        clock.ns += INLINE_PAUSE_NS
        assert await inline()
        assert io.slow_inline_writes == 3
        got = [m.body for m in iter(q.pop, None)]
        assert got == [b"m%d" % i for i in range(1, n + 1)]
    finally:
        await io.quiesce()
        q.close()


async def test_inline_writes_of_one_loop_turn_make_the_queue_readable_once_after_it(
    tmp_path: Path,
) -> None:
    """A publish's inline write says "readable" only once the publish is done (the loop
    turn after it), and the writes of publishes read in one turn say it once."""
    calls: list[int] = []
    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16)
    q = DiskQueue(tmp_path / "q", io=io, on_readable=lambda: calls.append(q.pending))
    try:
        assert not await _write_one(q, 0)  # opens the segment: the thread, told at once
        assert calls == [0]
        assert await _write_one(q, 1) and await _write_one(q, 2)
        assert calls == [0]  # not in the middle of the publishes
        await asyncio.sleep(0)
        assert calls == [0, 0]
        await asyncio.sleep(0)
        assert calls == [0, 0]
        assert await _write_one(q, 3)
        await asyncio.sleep(0)
        assert calls == [0, 0, 0]  # a later turn's write says it again
        assert [m.body for m in iter(q.pop, None)] == [b"m0", b"m1", b"m2", b"m3"]
    finally:
        await io.quiesce()
        q.close()


async def test_once_soon_runs_each_callback_once_after_the_turn_even_past_a_failing_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    io = DiskIO(asyncio.get_running_loop())
    ran: list[str] = []

    def fails() -> None:
        ran.append("fails")
        raise RuntimeError("boom")

    def a() -> None:
        ran.append("a")

    try:
        for fn in (fails, a, fails, a):
            io.once_soon(fn)
        assert ran == []
        await asyncio.sleep(0)
        assert ran == ["fails", "a"]
        assert "failed" in caplog.text
        io.once_soon(a)
        await asyncio.sleep(0)
        assert ran == ["fails", "a", "a"]
    finally:
        await io.quiesce()


async def test_a_slow_inline_write_that_never_waited_in_the_kernel_pauses_nothing(
    tmp_path: Path,
) -> None:
    """A write that took long on the CPU, or lost its core, was not held by the disk: the
    writes that follow stay on the loop; one that waited pauses them."""
    clock = _Clock()
    slept = 0
    threads: list[int] = []
    how = ""

    def writer(fd: int, data: Any) -> int:
        nonlocal slept
        threads.append(threading.get_ident())
        if how:
            clock.ns += SLOW_INLINE_NS + 1
            slept += how == "waits"
        return os.write(fd, data)

    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16, clock=clock, sleeps=lambda: slept)
    q = DiskQueue(tmp_path / "q", io=io, writer=writer)
    loop_thread = threading.get_ident()
    try:
        assert not await _write_one(q, 0)  # opens the segment: the thread
        how = "busy"
        assert await _write_one(q, 1)
        how = ""
        assert await _write_one(q, 2) and threads[-1] == loop_thread
        assert (io.busy_inline_writes, io.slow_inline_writes) == (1, 0)
        how = "waits"
        assert await _write_one(q, 3)
        how = ""
        assert not await _write_one(q, 4) and threads[-1] != loop_thread  # paused
        assert (io.busy_inline_writes, io.slow_inline_writes) == (1, 1)
        assert [m.body for m in iter(q.pop, None)] == [b"m%d" % i for i in range(5)]
    finally:
        await io.quiesce()
        q.close()


def test_a_thread_s_waits_count_a_sleep_and_not_a_spin() -> None:
    """What tells the two apart (``thread_sleeps``): a wait in the kernel counts, time on
    the CPU does not (no disk here, whose writes may or may not wait)."""
    before = thread_sleeps()
    until = time.monotonic_ns() + 2 * SLOW_INLINE_NS
    while time.monotonic_ns() < until:
        pass
    spun = thread_sleeps()
    threading.Event().wait(2 * SLOW_INLINE_NS / 1e9)
    assert spun == before
    assert thread_sleeps() > spun


async def test_an_inline_write_that_fails_keeps_its_records_and_marks_the_queue_failing(
    tmp_path: Path,
) -> None:
    disk = FullableDisk()
    io = DiskIO(asyncio.get_running_loop(), inline_bytes=1 << 16)
    q = DiskQueue(tmp_path / "q", io=io, writer=disk.write)
    try:
        assert not await _write_one(q, 0)
        disk.full = True
        assert await _write_one(q, 1)  # tried inline: failed, not waited for
        assert q.failing and q.pending == 1
        assert await _write_one(q, 2) and q.pending == 2  # a failing queue is not written
        disk.full = False
        q.flush()  # the housekeeping's retry (on the thread)
        await eventually(lambda: not q.failing and q.pending == 0, what="written again")
        assert [m.body for m in iter(q.pop, None)] == [b"m0", b"m1", b"m2"]
    finally:
        await io.quiesce()
        q.close()


async def test_a_graceful_stop_keeps_what_was_read_ahead_exactly_once(tmp_path: Path) -> None:
    """Records read ahead from the segments (counted as read, not yet handed out) are
    saved with the queue's head at a graceful stop: after a restart every unfinished
    message is delivered once, none twice, none lost."""
    opts = BrokerOptions(
        tcp_port=0, http_port=0, data_dir=tmp_path / "data", mem_queue_size=0,
        max_bytes_per_file=64 << 10,
    )  # fmt: skip
    sent, taken = 3000, 700
    broker = Broker(opts)
    await broker.start()
    try:
        assert broker.tcp_address is not None
        c = await RawClient.connect(*broker.tcp_address)
        await c.send(Sub("t", "c"))  # the channel first: the backlog goes to its queue
        assert await c.response() == b"OK"
        for i in range(0, sent, 100):
            await c.send(Mpub("t", [b"%05d" % n + PAD for n in range(i, i + 100)]))
            assert await c.response() == b"OK"
        await c.send(Rdy(1))
        finished: list[bytes] = []
        while len(finished) < taken:
            m = await c.message()
            finished.append(m.body)
            await c.send(Fin(m.id), Rdy(1) if len(finished) < taken else Rdy(0))
        disk = broker.persistence.disks["t:c"]._disk
        assert disk is not None and disk.read_ahead()  # something is held read ahead
        await c.close()
    finally:
        await broker.stop()
    again = Broker(opts)
    await again.start()
    try:
        assert again.tcp_address is not None
        c = await RawClient.connect(*again.tcp_address)
        await c.send(Sub("t", "c"), Rdy(500))
        assert await c.response() == b"OK"
        rest: list[bytes] = []
        while len(rest) < sent - taken:
            m = await c.message()
            rest.append(m.body)
            await c.send(Fin(m.id))
        assert len(set(rest)) == len(rest)  # none twice
        assert set(rest) | set(finished) == {b"%05d" % n + PAD for n in range(sent)}
        assert not set(rest) & set(finished)  # none finished before comes again
        await c.send(Rdy(0))
        await eventually(lambda: again.topics["t"].channels["c"].depth == 0, what="drained")
        await c.close()
    finally:
        await again.stop()
