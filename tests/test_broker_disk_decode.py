"""Reading back from a disk queue: records decoded a batch at a time (in C where built, the
Python reference otherwise) into queue records carrying their origin, checked as record
by record; handed to a ``MessageQueue`` a batch at a time, in order; FINs settled per
origin, not per message."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker.disk import DiskQueue, codec
from srtm.broker.disk.codec import (
    FILE_HEADER,
    FORMAT_VERSION,
    CorruptRecord,
    decode_batch_py,
    encode_batch,
    encode_v1,
)
from srtm.broker.disk.io import READ_AHEAD_BYTES, read_batch
from srtm.broker.message import Message
from srtm.broker.queue import MessageQueue, Record
from srtm.broker.state import Channel
from support import queue_records

c_decode_batch = codec._c_decode_batch

#: The decoders: Python's always, C's where it was built at install.
Decoder = Callable[..., tuple[list[Record], int, str | None]]
DECODERS: list[Decoder] = [decode_batch_py] + ([c_decode_batch] if c_decode_batch else [])

records = queue_records()


class CountingOrigin:
    def __init__(self) -> None:
        self.settled = 0
        self.calls = 0

    def settle(self, k: int = 1) -> None:
        self.settled += k
        self.calls += 1

    def share(self, n: int) -> None:
        self.settled -= n


ORIGIN = CountingOrigin()
ALL = 1 << 40


def rec(i: int, body: bytes = b"", publisher: str = "") -> Record:
    return (b"%016x" % i, body or b"m%d" % i, 10 * i, 10 * i + 1, 10 * i + 2, i % 3, publisher,
            None)  # fmt: skip


def carrying(recs: list[Record], origin: CountingOrigin) -> list[Record]:
    return [(*r[:7], origin) for r in recs]


def test_the_c_decoder_was_built() -> None:
    """Optional at install (no compiler: Python's is used); said here when missing."""
    if c_decode_batch is None:
        pytest.skip("srtm.broker._diskcodec not built: the pure-Python decoder is used")


@pytest.mark.parametrize("decoder", DECODERS)
@given(batch=st.lists(records, max_size=30), lead=st.binary(max_size=9))
def test_a_batch_decodes_back_to_its_records(
    decoder: Decoder, batch: list[Record], lead: bytes
) -> None:
    data = lead + encode_batch(batch)
    assert decoder(data, len(lead), ALL, ALL, FORMAT_VERSION, ORIGIN) == (
        carrying(batch, ORIGIN), len(data), None
    )  # fmt: skip


@pytest.mark.parametrize("decoder", DECODERS)
def test_version_1_records_decode_without_a_checksum(decoder: Decoder) -> None:
    batch = [rec(i, publisher="é") for i in range(4)]
    data = b"".join(encode_v1(Message(*r[:7]), due_ns=5) for r in batch)  # a due is dropped
    assert decoder(data, 0, ALL, ALL, 1, None) == (batch, len(data), None)


@pytest.mark.parametrize("decoder", DECODERS)
def test_decoding_stops_at_want_and_past_max_bytes(decoder: Decoder) -> None:
    batch = [rec(i) for i in range(10)]
    data = encode_batch(batch)
    size = len(encode_batch(batch[:1]))
    assert decoder(data, 0, 3, ALL, FORMAT_VERSION, None) == (batch[:3], 3 * size, None)
    # the record that crosses max_bytes is the last one
    got, end, problem = decoder(data, 0, ALL, 2 * size + 1, FORMAT_VERSION, None)
    assert (got, end, problem) == (batch[:3], 3 * size, None)
    assert decoder(data, size, 2, ALL, FORMAT_VERSION, None) == (batch[1:3], 3 * size, None)
    assert decoder(data, 0, 0, ALL, FORMAT_VERSION, None) == ([], 0, None)


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_buffer_that_ends_within_a_record_stops_before_it(decoder: Decoder) -> None:
    batch = [rec(i, b"x" * 50) for i in range(3)]
    data = encode_batch(batch)
    size = len(data) // 3
    for cut in (1, 10, 63, 64, size - 1):
        assert decoder(data[: 2 * size + cut], 0, ALL, ALL, FORMAT_VERSION, None) == (
            batch[:2], 2 * size, None
        )  # fmt: skip


def _record(crc: int | None, length: int | None, plen: int, blen: int, tail: bytes) -> bytes:
    payload = struct.pack(">qqqqH16sHI", 1, 2, 3, -1, 0, b"i" * 16, plen, blen) + tail
    length = len(payload) if length is None else length
    data = struct.pack(">I", length) + payload
    return struct.pack(">I", zlib.crc32(data) if crc is None else crc) + data


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (_record(None, 10, 0, 0, b""), "record length 10 out of range"),
        (_record(None, (1 << 30) + 1, 0, 0, b""), f"record length {(1 << 30) + 1} out of range"),
        (_record(None, 60, 0, 3, b"abcd"), "lengths 0+3 do not fill a 60-byte record"),
        (_record(12345, None, 1, 1, b"pb"), "checksum mismatch"),
        (
            _record(None, None, 1, 1, b"\xffb"),
            "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
        ),
    ],
)
def test_a_damaged_record_stops_decoding_with_why(
    decoder: Decoder, bad: bytes, problem: str
) -> None:
    good = encode_batch([rec(1), rec(2)])
    data = good + bad + encode_batch([rec(3)])
    assert decoder(data, 0, ALL, ALL, FORMAT_VERSION, None) == (
        [rec(1), rec(2)],
        len(good),
        problem,
    )


@pytest.mark.parametrize("decoder", DECODERS)
def test_the_decoder_takes_any_bytes_like_buffer(decoder: Decoder) -> None:
    data = encode_batch([rec(1)])
    assert decoder(bytearray(data), 0, ALL, ALL, FORMAT_VERSION, None)[0] == [rec(1)]


@pytest.mark.skipif(c_decode_batch is None, reason="srtm.broker._diskcodec not built")
@settings(max_examples=300)
@given(
    batch=st.lists(records, min_size=1, max_size=6),
    cut=st.integers(0, 2_000),
    flips=st.lists(st.tuples(st.integers(0, 2_000), st.integers(1, 255)), max_size=3),
    version=st.sampled_from([1, FORMAT_VERSION]),
    want=st.integers(0, 8),
    max_bytes=st.integers(1, 2_000),
)
def test_c_and_python_agree_on_damaged_and_cut_short_bytes(
    batch: list[Record],
    cut: int,
    flips: list[tuple[int, int]],
    version: int,
    want: int,
    max_bytes: int,
) -> None:
    if version == FORMAT_VERSION:
        data = bytearray(encode_batch(batch))
    else:
        data = bytearray(b"".join(encode_v1(Message(*r[:7])) for r in batch))
    for at, x in flips:
        if data:
            data[at % len(data)] ^= x
    buf = bytes(data[: cut % (len(data) + 1)])
    assert c_decode_batch is not None
    args = (buf, 0, want, max_bytes, version, ORIGIN)
    assert c_decode_batch(*args) == decode_batch_py(*args)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("pos", [-1, 4])
def test_a_position_outside_the_buffer_is_refused(decoder: Decoder, pos: int) -> None:
    with pytest.raises(ValueError, match="pos"):
        decoder(b"abc", pos, 1, ALL, FORMAT_VERSION, None)


# -- the disk thread's read: a file's bytes, decoded in one call ------------------------------
@pytest.fixture(params=["c", "python"])
def decoders(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and c_decode_batch is None:
        pytest.skip("srtm.broker._diskcodec not built")
    if request.param == "python":
        monkeypatch.setattr(codec, "_c_decode_batch", None)
    return str(request.param)


def _file(path: Path, batch: list[Record], version: int = FORMAT_VERSION) -> Path:
    if version == FORMAT_VERSION:
        path.write_bytes(FILE_HEADER + encode_batch(batch))
    else:
        path.write_bytes(b"".join(encode_v1(Message(*r[:7])) for r in batch))
    return path


@pytest.mark.usefixtures("decoders")
@pytest.mark.parametrize("version", [1, FORMAT_VERSION])
def test_a_read_takes_records_across_buffer_ends_and_goes_on_where_it_stopped(
    tmp_path: Path, version: int
) -> None:
    # bodies from tiny to larger than a read's buffer: records cross its end
    batch = [rec(i, b"b" * (1 + (i * 7919) % 150_000)) for i in range(40)]
    path = _file(tmp_path / "000000.dat", batch, version)
    got: list[Record] = []
    pos = 0
    while len(got) < len(batch):
        recs, pos, exc, opened = read_batch(path, pos, len(batch) - len(got), ORIGIN)
        assert exc is None and opened and recs
        assert sum(len(r[1]) for r in recs[:-1]) < READ_AHEAD_BYTES  # about the bytes asked
        got += recs
    assert got == carrying(batch, ORIGIN) and pos == path.stat().st_size
    # inline: one at a time
    assert read_batch(path, 0, 1, None)[0] == batch[:1]


@pytest.mark.usefixtures("decoders")
def test_a_read_reports_a_file_cut_short_or_damaged_after_what_it_read(tmp_path: Path) -> None:
    batch = [rec(i, b"x" * 100) for i in range(5)]
    path = _file(tmp_path / "000000.dat", batch)
    whole = path.read_bytes()
    size = (len(whole) - len(FILE_HEADER)) // 5
    path.write_bytes(whole[:-10])
    recs, pos, exc, _ = read_batch(path, 0, 5, None)
    assert recs == batch[:4] and pos == len(FILE_HEADER) + 4 * size
    assert isinstance(exc, CorruptRecord) and str(exc) == "record cut short"
    path.write_bytes(whole)
    recs, pos, exc, _ = read_batch(path, 0, 6, None)
    assert recs == batch and isinstance(exc, CorruptRecord)
    assert str(exc) == "end of file before the records counted"
    damaged = bytearray(whole)
    damaged[len(FILE_HEADER) + 2 * size + 70] ^= 1
    path.write_bytes(bytes(damaged))
    recs, pos, exc, _ = read_batch(path, 0, 5, None)
    assert recs == batch[:2] and pos == len(FILE_HEADER) + 2 * size
    assert isinstance(exc, CorruptRecord) and str(exc) == "checksum mismatch"
    recs, pos, exc, _ = read_batch(tmp_path / "missing.dat", 0, 5, None)
    assert (recs, pos, isinstance(exc, FileNotFoundError)) == ([], 0, True)


# -- bulk pops: a queue's refill is a few calls per batch --------------------------------------
def test_pop_records_gives_what_pops_give_in_order(tmp_path: Path) -> None:
    """From the segments, then from the write buffer (a record not on disk is written and
    read back first, so it carries an origin), in any slices."""
    q = DiskQueue(tmp_path / "q", flush_bytes=1 << 30)
    first = [rec(i) for i in range(7)]
    q.push_many(first)
    q.flush()
    later = [rec(i) for i in range(7, 12)]
    q.push_many(later)  # buffered
    got = q.pop_records(3) + q.pop_records(0) + q.pop_records(6) + q.pop_records(100)
    assert [r[:7] for r in got] == [r[:7] for r in first + later]
    assert all(r[7] is not None for r in got) and q.pop_records(5) == [] and not len(q)
    assert sum(s.outstanding for s in q._segments.by_n.values()) == len(got)
    for r in got:
        assert r[7] is not None
        r[7].settle()
    assert sum(s.outstanding for s in q._segments.by_n.values()) == 0


def test_a_message_queue_refills_from_its_disk_queue_in_order(tmp_path: Path) -> None:
    """Memory first, then what overflowed (on disk, or still buffered), whatever is taken
    how: the bulk refill keeps the FIFO order of one pop at a time."""
    q = MessageQueue(4, DiskQueue(tmp_path / "q", flush_bytes=1 << 30))
    recs = [rec(i) for i in range(30)]
    q.extend(recs[:10])
    q.append(Message(*recs[10][:7]))
    q.extend(recs[11:20])
    assert q.overflow is not None
    q.overflow.push_many([])
    q.extend(recs[20:])
    ids = [r[0] for r in q.take(3)] + [q.popleft().id] + [r[0] for r in q.take(9)]
    while q:
        ids += [r[0] for r in q.take(5)]
    assert ids == [r[0] for r in recs] and len(q) == 0


# -- FINs settle their origins per run, not per message ----------------------------------------
class FakeConsumer:
    def __init__(self, rdy: int) -> None:
        self.rdy, self.in_flight, self.msg_timeout_ns = rdy, 0, 10**12


def test_a_run_of_fins_settles_each_origin_once_per_run() -> None:
    a, b = CountingOrigin(), CountingOrigin()
    origins = [a, a, a, b, b, None, a, a]
    ch = Channel("t", "c", MessageQueue(100))
    ch.queue.extend([(*rec(i)[:7], o) for i, o in enumerate(origins)])
    mine, other = FakeConsumer(rdy=6), FakeConsumer(rdy=10)
    ch.add_consumer(mine, 0)
    ((_, recs),) = ch.take(0)
    ch.remove_consumer(mine)
    ch.add_consumer(other, 0)
    ((_, theirs),) = ch.take(0)
    failed = ch.fin_many([r[0] for r in recs] + [theirs[0][0], b"unknown"], mine)
    assert [mid for mid, _ in failed] == [theirs[0][0], b"unknown"]
    assert (a.settled, a.calls, b.settled, b.calls) == (3, 1, 2, 1)
    assert mine.in_flight == 0 and len(ch.in_flight) == 2  # the other consumer's stay
    ch.fin_many([r[0] for r in theirs], other)
    assert (a.settled, b.settled) == (5, 2)
