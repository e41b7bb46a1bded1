"""Acknowledged means kept, on disk (issue 14, findings 7 and 8).

Disk full: reading never waits for a write, publishes are refused with E_PUB_FAILED while
writes fail and taken again when space returns, and a SIGTERM on a full disk keeps what
was acknowledged (the reserve). Data at rest: a segment goes only once what was read
from it is settled (kill -9 while draining loses nothing that was on disk), records are
checksummed (a zero-filled or torn tail is skipped, never delivered).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_raw import RawClient
from srtm.broker.disk import DiskQueue, Reserve
from srtm.broker.disk.codec import FILE_HEADER, encode, encode_v1, scan
from srtm.broker.disk.queue import CATCH_UP_ROTATE_BYTES
from srtm.broker.message import Message
from srtm.broker.queue import MessageQueue
from srtm.broker.state import Topic
from srtm.launch import BrokerProcess, start_broker
from srtm.protocol import Dpub, Fin, FrameType, Mpub, Pub, Rdy, Sub
from support import eventually


def msg(i: int, body: bytes | None = None) -> Message:
    return Message(b"%016x" % i, body if body is not None else b"m%d" % i, i, i + 1, i + 2)


def ids(msgs: list[Message | None]) -> list[bytes]:
    return [m.id for m in msgs if m is not None]


def want(r: range) -> list[bytes]:
    return [b"%016x" % i for i in r]


def settle_all(msgs: list[Message | None]) -> None:
    for m in msgs:
        assert m is not None and m.origin is not None
        m.origin.settle()


class FailingWriter:
    """os.write that fails with ``errno`` once ``room`` bytes are used (None: never)."""

    def __init__(self) -> None:
        self.room: int | None = None
        self.err = errno.ENOSPC

    def __call__(self, fd: int, data: memoryview) -> int:
        if self.room is None:
            return os.write(fd, data)
        if self.room <= 0:
            raise OSError(self.err, os.strerror(self.err))
        n = os.write(fd, data[: self.room])  # a short write, then the error
        self.room -= n
        return n


# -- finding 7: the disk queue against a failing writer ---------------------------------------


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EFBIG, errno.EIO])
def test_reading_never_waits_for_a_write_that_fails(tmp_path: Path, err: int) -> None:
    writer = FailingWriter()
    failing: set[DiskQueue] = set()
    q = DiskQueue(tmp_path / "q", 2_000, flush_bytes=500, writer=writer, failing=failing)
    for i in range(40):
        q.push(msg(i, b"x" * 60))
    assert q.flush() and not q.failing
    writer.room, writer.err = 700, err  # the disk fills in the middle of a batch
    for i in range(40, 100):
        q.push(msg(i, b"x" * 60))
    assert not q.flush()
    assert q.failing and failing == {q} and q.error is not None and q.error.errno == err
    assert len(q) == 100 and q.pending > 0
    # Every message, in order: what is on disk, then what still waits to be written.
    out = [q.pop() for _ in range(100)]
    assert ids(out) == want(range(100))
    assert q.pop() is None and len(q) == 0
    # Nothing pending any more: the next flush has nothing to write and succeeds.
    assert q.flush() and not q.failing and failing == set()


_EFBIG_CHILD = """
import resource, sys
from pathlib import Path
from srtm.broker.disk import DiskQueue
from srtm.broker.message import Message
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # files cannot grow past 4 KiB
q = DiskQueue(Path(sys.argv[1]), flush_bytes=10**9)
for i in range(100):
    q.push(Message(b"%016x" % i, b"x" * 20, i, i))
tries = [q.flush() for _ in range(10)]
assert tries[0] is False and q.error is None and tries[-1], (tries, q.error)
print(len(list(Path(sys.argv[1]).glob("*.dat"))))
assert [int(q.pop().id, 16) for _ in range(100)] == list(range(100))
"""


def test_a_file_size_limit_moves_writes_to_new_segments(tmp_path: Path) -> None:
    """A real EFBIG (RLIMIT_FSIZE in a child process): the full segment is left and the
    next flush writes to a new one; nothing is lost or reordered."""
    out = subprocess.run(
        [sys.executable, "-c", _EFBIG_CHILD, str(tmp_path / "q")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 2


def test_a_segment_that_cannot_be_opened_now_is_read_later_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = DiskQueue(tmp_path / "q", 300)
    for i in range(20):
        q.push(msg(i))
    q.close(forget_read=False)
    again = DiskQueue(tmp_path / "q", 300)
    queue = MessageQueue(2, again)

    def emfile(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    with monkeypatch.context() as m:
        m.setattr(Path, "open", emfile)
        assert again.pop() is None and len(again) == 20
        assert not queue  # nothing to give now, nothing given out of order
    assert ids([queue.popleft() for _ in range(20)]) == want(range(20))


def test_writing_resumes_when_space_returns(tmp_path: Path) -> None:
    writer = FailingWriter()
    q = DiskQueue(tmp_path / "q", 2_000, flush_bytes=10**9, writer=writer)
    writer.room = 0
    for i in range(30):
        q.push(msg(i))
    assert not q.flush() and q.failing
    assert not list((tmp_path / "q").glob("*.dat")) or all(
        not recs for recs, _ in (scan(p) for p in (tmp_path / "q").glob("*.dat"))
    )
    writer.room = None  # space is back
    assert q.flush() and not q.failing
    q.close(forget_read=False)
    again = DiskQueue(tmp_path / "q")
    assert ids([again.pop() for _ in range(30)]) == want(range(30))


def test_a_torn_batch_is_taken_back_to_whole_records(tmp_path: Path) -> None:
    writer = FailingWriter()
    q = DiskQueue(tmp_path / "q", 10**6, flush_bytes=10**9, writer=writer)
    for i in range(20):
        q.push(msg(i, b"y" * 100))
    writer.room = len(FILE_HEADER) + 5 * len(encode(msg(0, b"y" * 100))) + 17
    assert not q.flush()
    (seg,) = (tmp_path / "q").glob("*.dat")
    records, problem = scan(seg)
    assert problem is None and len(records) == 5  # no torn record left at the end
    writer.room = None
    assert q.flush()
    assert ids([q.pop() for _ in range(20)]) == want(range(20))


# -- finding 8: settled before deleted, checksums, format --------------------------------------


def test_a_segment_goes_only_when_everything_read_from_it_is_settled(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q", 1_000)
    for i in range(60):
        q.push(msg(i, b"z" * 50))
    q.flush()
    segments = sorted((tmp_path / "q").glob("*.dat"))
    assert len(segments) >= 4
    first = [q.pop() for _ in range(30)]  # read into memory (or in flight), not settled
    assert sorted((tmp_path / "q").glob("*.dat")) == segments
    settle_all(first[:10])
    remaining = sorted((tmp_path / "q").glob("*.dat"))
    assert remaining[0] != segments[0] and remaining[-1] == segments[-1]
    crashed = DiskQueue(tmp_path / "q", 1_000)  # what kill -9 would leave
    got = ids([crashed.pop() for _ in range(len(crashed))])
    assert set(want(range(10, 60))) <= set(got) and set(got) <= set(want(range(60)))


@settings(max_examples=150)
@given(
    st.lists(
        st.sampled_from(["push", "push", "push", "flush", "pop", "pop", "settle", "fail", "heal"]),
        max_size=120,
    ),
    st.randoms(use_true_random=False),
)
def test_a_crash_at_any_point_keeps_what_reached_disk_and_is_unsettled(
    tmp_path_factory: pytest.TempPathFactory, ops: list[str], rnd: Any
) -> None:
    """Against a model: after a crash (no close) the queue holds every message that was
    written and is not settled, and nothing that was never pushed."""
    d = tmp_path_factory.mktemp("q")
    writer = FailingWriter()
    q = DiskQueue(d, 300, flush_bytes=10**9, writer=writer)
    queue: list[int] = []  # FIFO of what the queue owes, oldest first
    written: set[int] = set()
    held: list[Message] = []
    settled: set[int] = set()
    n = 0
    for op in ops:
        if op == "push":
            q.push(msg(n))
            queue.append(n)
            n += 1
        elif op == "flush" and q.flush():
            written |= set(queue)
        elif op == "pop" and queue:
            m = q.pop()
            assert m is not None and m.id == b"%016x" % queue.pop(0)
            held.append(m)
        elif op == "settle" and held:
            m = held.pop(rnd.randrange(len(held)))
            if m.origin is not None:
                m.origin.settle()
            settled.add(int(m.id, 16))
        elif op == "fail":
            writer.room = 0
        elif op == "heal":
            writer.room = None
    again = DiskQueue(d, 300)  # what kill -9 leaves
    got = {int(m.id, 16) for m in iter(again.pop, None)}
    assert (written - settled) <= got
    assert got <= set(range(n))


def test_a_fanout_settles_once_per_channel(tmp_path: Path) -> None:
    disk = DiskQueue(tmp_path / "shaping", 500)
    queues = {"t@shaping": MessageQueue(1, disk)}

    def factory(key: str) -> MessageQueue:
        return queues[key] if key in queues else MessageQueue(1 << 30)

    topic = Topic("t", factory)
    a, b = topic.channel("a"), topic.channel("b")
    for i in range(40):
        topic.shaping.append(msg(i, b"w" * 40))
    disk.flush()
    files = sorted((tmp_path / "shaping").glob("*.dat"))
    assert len(files) >= 3
    topic.release(time.time_ns())
    assert a.depth == b.depth == 40

    class C:
        rdy, in_flight, msg_timeout_ns = 100, 0, 10**12

    ca, cb = C(), C()
    a.add_consumer(ca, 0)
    b.add_consumer(cb, 0)
    for m in [m for _, m in a.dispatch(0)]:
        a.fin(m.id, ca)
    # Channel a is done, b has not even started: the segments stay for b.
    assert sorted((tmp_path / "shaping").glob("*.dat"))[0] == files[0]
    for m in [m for _, m in b.dispatch(0)]:
        b.fin(m.id, cb)
    assert files[0] not in sorted((tmp_path / "shaping").glob("*.dat"))


def test_a_message_taken_from_the_write_buffer_was_written_first(tmp_path: Path) -> None:
    """With nothing left to read on disk a pop takes from the write buffer; a message
    buffered there has no other copy, so it is written first and carries an origin: a
    topic's release to a channel that is not flushed before a crash loses nothing."""
    shaping, late = DiskQueue(tmp_path / "shaping", 100), DiskQueue(tmp_path / "late")
    queues = {"t@shaping": MessageQueue(0, shaping), "t:late": MessageQueue(0, late),
              "t": MessageQueue(0), "t@deferred": MessageQueue(0)}  # fmt: skip
    topic = Topic("t", queues.__getitem__)
    topic.channel("late")
    topic.put(msg(0, b"w" * 100))
    assert [r.message.id for r in topic.release(time.time_ns())] == want(range(1))
    assert late.pending == 1  # released, not written yet: then the process is killed
    found = [DiskQueue(tmp_path / d).pop() for d in ("shaping", "late")]
    assert ids(found) == want(range(1))
    late.flush()  # written to the channel's queue: the topic's segment may go
    assert not list((tmp_path / "shaping").glob("*.dat"))


def test_a_reader_that_keeps_up_writes_each_message_once_in_few_files(tmp_path: Path) -> None:
    """A consumer that keeps up takes every message from the write buffer: each is written
    first (it carries an origin), and catching up moves writes to a new segment only once
    the current one holds CATCH_UP_ROTATE_BYTES (not a new file per message)."""
    q = DiskQueue(tmp_path / "q")
    for i in range(100):
        q.push(msg(i))
        m = q.pop()
        assert m is not None and m.id == want(range(i, i + 1))[0] and m.origin is not None
        m.origin.settle()
    assert 100 * len(encode(msg(99))) < CATCH_UP_ROTATE_BYTES
    assert [p.name for p in (tmp_path / "q").glob("*.dat")] == ["000000.dat"]
    assert len(scan(tmp_path / "q" / "000000.dat")[0]) == 100


def test_a_zero_filled_tail_is_skipped_never_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = DiskQueue(tmp_path / "q")
    for i in range(5):
        q.push(msg(i))
    q.close(forget_read=False)
    (seg,) = (tmp_path / "q").glob("*.dat")
    with seg.open("ab") as f:
        f.write(b"\0" * 4096)  # what a crash can leave after a file's size grew
    with caplog.at_level(logging.WARNING, "srtm.broker.disk"):
        again = DiskQueue(tmp_path / "q")
    assert len(again) == 5
    out = [again.pop() for _ in range(6)]
    assert ids(out) == want(range(5)) and out[5] is None
    assert b"\0" * 16 not in ids(out)
    assert "out of range" in caplog.text and seg.name in caplog.text


def test_a_corrupt_record_is_detected_by_its_checksum(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = DiskQueue(tmp_path / "q")
    for i in range(5):
        q.push(msg(i, b"body%d" % i))
    q.close(forget_read=False)
    (seg,) = (tmp_path / "q").glob("*.dat")
    data = bytearray(seg.read_bytes())
    data[data.index(b"body3")] ^= 0xFF  # a flipped bit, lengths intact
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "srtm.broker.disk"):
        again = DiskQueue(tmp_path / "q")
    assert ids([again.pop() for _ in range(len(again))]) == want(range(3))
    assert "checksum mismatch" in caplog.text


def test_new_segments_start_with_a_versioned_header_and_old_ones_are_read(
    tmp_path: Path,
) -> None:
    q = DiskQueue(tmp_path / "new")
    q.push(msg(1))
    q.close(forget_read=False)
    (seg,) = (tmp_path / "new").glob("*.dat")
    assert seg.read_bytes().startswith(FILE_HEADER)
    # Version 1 (before checksums): bare records, no header.
    old = tmp_path / "old"
    old.mkdir()
    (old / "000000.dat").write_bytes(b"".join(encode_v1(msg(i)) for i in range(4)))
    again = DiskQueue(old)
    assert ids([again.pop() for _ in range(4)]) == want(range(4))
    again.push(msg(9))  # appended in the new format, to a new segment
    again.flush()
    assert (old / "000001.dat").read_bytes().startswith(FILE_HEADER)


def test_the_head_file_stays_until_its_messages_are_settled(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q")
    q.save_head([(msg(1), None), (msg(2), 99)])
    q.close()
    again = DiskQueue(tmp_path / "q")
    head = again.take_head()
    assert [m.id for m, _ in head] == want(range(1, 3))
    # A crash before they are settled: they are read again.
    assert [m.id for m, _ in DiskQueue(tmp_path / "q").take_head()] == want(range(1, 3))
    settle_all([m for m, _ in head])
    assert not (tmp_path / "q" / "head.dat").exists()


def test_the_read_position_is_saved_crash_safely(tmp_path: Path) -> None:
    q = DiskQueue(tmp_path / "q", 10**6)
    for i in range(10):
        q.push(msg(i))
    q.flush()
    q.pop()
    q.close()
    meta = json.loads((tmp_path / "q" / "meta.json").read_text())
    assert meta["version"] == 2 and meta["read_pos"] > len(FILE_HEADER)
    assert not list((tmp_path / "q").glob("*.tmp"))


def test_the_reserve_is_claimed_and_given_back(tmp_path: Path) -> None:
    r = Reserve(tmp_path, 1 << 20)
    r.claim()
    assert r.held == 1 << 20 and (tmp_path / Reserve.NAME).stat().st_blocks * 512 >= 1 << 20
    r.release()
    assert r.held == 0 and not (tmp_path / Reserve.NAME).exists()


# -- end to end: a real broker, kill -9 and a full tmpfs -------------------------------------


def _seq(body: bytes) -> int:
    return int(body[:8])


def _body(seq: int, size: int) -> bytes:
    return b"%08d" % seq + b"." * (size - 8)


def _on_disk(directory: Path) -> int:
    return sum(len(scan(p)[0]) for p in directory.glob("[0-9]*.dat"))


async def _drain(b: BrokerProcess, topic: str, channel: str, expect: set[int]) -> set[int]:
    """FIN everything the channel delivers until ``expect`` is covered or it stays quiet
    for 5 s (then the caller's assertion names what is missing)."""
    c = await RawClient.connect(*b.tcp)
    got: set[int] = set()
    try:
        await c.send(Sub(topic, channel), Rdy(500))
        assert await c.response() == b"OK"
        while not expect <= got:
            try:
                m = await c.message(timeout=5.0)
            except TimeoutError:
                break
            got.add(_seq(m.body))
            await c.send(Fin(m.id))
    finally:
        await c.close()
    return got


@pytest.mark.slow
async def test_kill_9_while_draining_from_disk_loses_nothing_that_was_on_disk(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    args = ["--mem-queue-size", "50", "--max-bytes-per-file", "65536"]
    n = 3_000
    first = start_broker(data, args)
    finished: set[int] = set()
    try:
        first.post("/topic/create?topic=t")
        first.post("/channel/create?topic=t&channel=c")
        pub = await RawClient.connect(*first.tcp)
        for lo in range(0, n, 100):
            await pub.send(Mpub("t", [_body(i, 200) for i in range(lo, lo + 100)]))
            assert await pub.response() == b"OK"
        await pub.close()
        # All but the 50 held in memory reach the disk (within the broker's 1 s flush).
        await eventually(
            lambda: _on_disk(data / "queues" / "q-t:c"),
            "overflow on disk",
            until=lambda on_disk: on_disk >= n - 50,
            timeout=30,
        )
        # A consumer finishes 100, then takes 900 more and finishes none: the reader is
        # then several 64 KiB segments (about 280 messages each) past what was settled.
        c = await RawClient.connect(*first.tcp)
        await c.send(Sub("t", "c"), Rdy(100))
        assert await c.response() == b"OK"
        first_100 = [await c.message() for _ in range(100)]
        await c.send(Rdy(0), *(Fin(m.id) for m in first_100))
        finished |= {_seq(m.body) for m in first_100}
        channel = lambda: first.stats("t")["topics"][0]["channels"][0]  # noqa: E731
        await eventually(lambda: channel()["in_flight_count"] == 0, "100 FINs taken", timeout=30)
        await c.send(Rdy(900))
        for _ in range(900):
            await c.message()
        assert channel()["in_flight_count"] == 900
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.stop()
    assert finished == set(range(100))  # the first 50 never reached the disk: delivered

    second = start_broker(data, args)
    try:
        depth = second.stats("t")["topics"][0]["channels"][0]["depth"]
        assert depth >= n - 100  # the restored backlog shows in /stats
        got = await _drain(second, "t", "c", set(range(100, n)))
    finally:
        assert second.stop() == 0
    missing = set(range(n)) - finished - got
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _http_pub(b: BrokerProcess, body: bytes) -> tuple[int, dict[str, Any]]:
    try:
        b.post("/pub?topic=t", body)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    return 200, {}


async def _fill(b: BrokerProcess, start: int, acked: set[int]) -> tuple[int, str]:
    """PUB one by one until the broker refuses one; returns the next sequence number and
    the error."""
    seq = start
    while True:
        p = await RawClient.connect(*b.tcp)
        try:
            while True:
                await p.send(Pub("t", _body(seq, 2048)))
                f = await p.frame()
                if f.kind is FrameType.ERROR:
                    return seq + 1, f.data.decode()
                acked.add(seq)
                seq += 1
        finally:
            await p.close()


@pytest.mark.slow
async def test_a_full_disk_refuses_publishes_drains_and_stops_cleanly(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "mnt", "2m") as mnt:
        data = mnt / "data"
        args = ["--mem-queue-size", "20", "--max-bytes-per-file", "65536",
                "--disk-reserve-bytes", str(512 << 10)]  # fmt: skip
        acked: set[int] = set()
        finished: set[int] = set()
        b = start_broker(data, args)
        try:
            b.post("/topic/create?topic=t")
            b.post("/channel/create?topic=t&channel=c")
            seq, err = await _fill(b, 0, acked)
            assert err.startswith("E_PUB_FAILED") and "disk" in err, err
            assert len(acked) > 300  # about 1.5 MiB of 2 KiB bodies were taken
            # The HTTP API and MPUB refuse too, nsqd's way.
            code, doc = _http_pub(b, _body(seq, 100))
            assert code == 503 and doc["message"] == "E_PUB_FAILED", doc
            p = await RawClient.connect(*b.tcp)
            await p.send(Mpub("t", [_body(seq + 1, 100)]))
            assert (await p.error()).startswith("E_MPUB_FAILED")
            await p.close()
            p = await RawClient.connect(*b.tcp)
            await p.send(Dpub("t", 10, _body(seq + 2, 100)))
            assert (await p.error()).startswith("E_DPUB_FAILED")
            await p.close()
            seq += 3
            # Consumers drain the backlog (reading does not wait for the failed writes),
            # which frees segments, after which publishing works again.
            c = await RawClient.connect(*b.tcp)
            await c.send(Sub("t", "c"), Rdy(50))
            assert await c.response() == b"OK"
            for _ in range(400):
                m = await c.message()
                finished.add(_seq(m.body))
                await c.send(Fin(m.id))
            await c.close()
            await eventually(
                lambda: _http_pub(b, _body(seq, 100))[0] == 200,
                "PUB taken again",
                timeout=30,
                interval=0.05,
            )
            acked.add(seq)
            seq, err = await _fill(b, seq + 1, acked)
            assert err.startswith("E_PUB_FAILED"), err
        finally:
            code = b.stop()
        assert code == 0  # the reserve made room for what memory held
        second = start_broker(data, args)
        try:
            got = await _drain(second, "t", "c", acked - finished)
        finally:
            assert second.stop() == 0
        missing = acked - finished - got
        assert not missing, f"{len(missing)} acknowledged lost, e.g. {sorted(missing)[:5]}"


async def test_kill_9_right_after_an_ok_keeps_what_overflowed_to_disk(tmp_path: Path) -> None:
    """With --mem-queue-size 0 every acknowledged message overflowed to disk; its OK
    leaves only once the write reached the OS, so kill -9 straight after loses none
    (a buffer flushed each second lost up to a second of acknowledged messages)."""
    data = tmp_path / "data"
    args = ["--mem-queue-size", "0"]
    n = 400
    first = start_broker(data, args)
    try:
        first.post("/topic/create?topic=t")
        first.post("/channel/create?topic=t&channel=c")
        pub = await RawClient.connect(*first.tcp)
        for i in range(n):
            await pub.send(Pub("t", _body(i, 100)))
            assert await pub.response() == b"OK"
        await pub.send(Mpub("t", [_body(i, 100) for i in range(n, 2 * n)]))
        assert await pub.response() == b"OK"
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.stop()
    second = start_broker(data, args)
    try:
        got = await _drain(second, "t", "c", set(range(2 * n)))
    finally:
        assert second.stop() == 0
    missing = set(range(2 * n)) - got
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"


async def test_kill_9_right_after_a_dpub_ok_keeps_it_and_delivers_it_when_due(
    tmp_path: Path,
) -> None:
    """Deferred messages count against --mem-queue-size like any queue: with 0, every
    acknowledged DPUB is on disk (``t@deferred``, its due time in the record) before its
    OK, so kill -9 straight after loses none and the next start delivers each when due,
    not before (issue 29: 0 of 500 survived while they lived in memory only)."""
    data = tmp_path / "data"
    args = ["--mem-queue-size", "0"]
    n, defer_s = 300, 8.0  # long enough for a restart on a loaded machine
    first = start_broker(data, args)
    try:
        first.post("/topic/create?topic=t")
        first.post("/channel/create?topic=t&channel=c")
        pub = await RawClient.connect(*first.tcp)
        due = time.monotonic() + defer_s
        await pub.send(*(Dpub("t", int(defer_s * 1000), _body(i, 100)) for i in range(n)))
        for _ in range(n):
            assert await pub.response() == b"OK"
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.stop()
    second = start_broker(data, args)
    try:
        c = await RawClient.connect(*second.tcp)
        await c.send(Sub("t", "c"), Rdy(1))
        assert await c.response() == b"OK"
        early = due - 0.3 - time.monotonic()
        assert early > 0.5, "the restart took too long to tell early from on time"
        with pytest.raises(TimeoutError):
            await c.message(timeout=early)  # not due yet: nothing comes
        await c.close()
        got = await _drain(second, "t", "c", set(range(n)))
    finally:
        assert second.stop() == 0
    missing = set(range(n)) - got
    assert not missing, f"{len(missing)} acknowledged DPUBs lost, e.g. {sorted(missing)[:5]}"


async def test_kill_9_keeps_acknowledged_messages_of_a_shaped_topic(tmp_path: Path) -> None:
    """A shaped topic with --mem-queue-size 0: a message published while the topic's
    ``@shaping`` queue was empty is taken out of that queue's write buffer at once (the
    publish books the head on the bucket), so its write-through found nothing to write;
    it then waited for its token in memory only, and its copy released to a channel that
    no one consumes sat in that channel's buffer until the next 1 s flush. kill -9 in
    between lost acknowledged messages of that channel."""
    data = tmp_path / "data"
    args = ["--mem-queue-size", "0"]
    n = 6
    first = start_broker(data, args)
    live = None
    fin: set[int] = set()
    try:
        first.post("/topic/create?topic=t")
        first.post("/channel/create?topic=t&channel=live")
        first.post("/channel/create?topic=t&channel=late")
        # One message at once, then one every 5 s: the head waits for its token.
        first.post("/srtm/bucket?topic=t&rate=0.2&burst=1")
        live = await RawClient.connect(*first.tcp)
        await live.send(Sub("t", "live"), Rdy(10))
        assert await live.response() == b"OK"
        pub = await RawClient.connect(*first.tcp)
        for i in range(n):
            await pub.send(Pub("t", _body(i, 100)))
            assert await pub.response() == b"OK"
        # The first is released at once and FIN'd on `live`; the rest wait for tokens.
        m = await live.message()
        fin.add(_seq(m.body))
        await live.send(Fin(m.id))
        channel = lambda: first.stats("t")["topics"][0]["channels"]  # noqa: E731
        await eventually(
            lambda: all(c["in_flight_count"] == 0 for c in channel()), "FIN taken", timeout=30
        )
        await pub.close()
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.stop()
        if live is not None:
            await live.close()
    assert fin == {0}
    second = start_broker(data, args)
    try:
        second.request("/srtm/bucket?topic=t", "DELETE")  # release what waits, at once
        got = await _drain(second, "t", "late", set(range(n)))
    finally:
        assert second.stop() == 0
    missing = set(range(n)) - got
    assert not missing, f"acknowledged, never delivered on 'late': {sorted(missing)}"
