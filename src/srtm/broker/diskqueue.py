"""A FIFO of messages on disk: append-only segment files, read in order.

Used as a ``MessageQueue``'s overflow and for what a queue held in memory at shutdown
(its *head*: read back before the segments on the next start). The format, the crash
guarantees and the disk-full behaviour are described in docs/durability.md.

The write side and the read side are separate: pushes are buffered in memory and written
in batches (``flush``); ``pop`` reads what the segments hold, then what is still buffered,
in FIFO order, so reading never depends on a write succeeding. A write that fails (disk
full, file too big, I/O error) leaves the buffer as it was and marks the queue
``failing`` until a later flush succeeds; the broker then refuses publishes to the topic.

While the broker serves, the file work (encoding and writing batches, reading ahead,
opening, closing and deleting files) runs on its disk thread (``DiskIO``), never on the
event loop; without one (tests, the restore before serving, the graceful stop) it runs
inline.

A segment is deleted only once every message read from it is *settled*: FIN'd, or
written to another durable queue (each popped message carries an ``origin`` to settle).
After ``kill -9`` the queue restarts from the oldest segment left: duplicates, no losses.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import errno
import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from srtm.broker.message import Message, Origin
from srtm.broker.queue import Record, popleft_many

_c_encode_batch: Callable[[list[Record]], bytes] | None
#: (buf, pos, want, max_bytes, version, origin) -> (records, end, problem)
_Decoder = Callable[
    [bytes, int, int, int, int, Origin | None], tuple[list[Record], int, str | None]
]
_c_decode_batch: _Decoder | None
try:
    from srtm.broker._diskcodec import decode_batch as _c_decode_batch
    from srtm.broker._diskcodec import encode_batch as _c_encode_batch
except ImportError:  # not built (no compiler at install): encoded and decoded in Python
    _c_encode_batch = _c_decode_batch = None

log = logging.getLogger("srtm.broker.disk")

# timestamp, arrival, release, due (-1: none), attempts, id, publisher length, body length
_RECORD = struct.Struct(">qqqqH16sHI")
#: Version 2 frames each record: CRC-32 of (length field + payload), payload length.
_FRAME = struct.Struct(">II")
_CRC = struct.Struct(">I")
#: The length field followed by the payload's fixed part (what the CRC starts with).
_LENGTH_RECORD = struct.Struct(">I" + _RECORD.format[1:])
#: Every version-2 file starts with this (version-1 files have no header at all).
MAGIC = b"SRTMDQ"
FORMAT_VERSION = 2
FILE_HEADER = MAGIC + struct.pack(">H", FORMAT_VERSION)
#: A record longer than this is corrupt (bodies are limited far below it).
MAX_RECORD = 1 << 30
_SEGMENT = "{:06d}.dat"
_HEAD = "head.dat"
_META = "meta.json"
_HEAD_SEG = -1
DEFAULT_SEGMENT_BYTES = 16 << 20
#: Buffered pushes are written once they hold this many bytes (else at the next flush).
DEFAULT_FLUSH_BYTES = 256 << 10
#: At most this many records per write (in whole pushes): a write's completion settles
#: its records on the event loop one by one, and a million one-byte messages of one MPUB
#: in one write stalled the loop for 50-70 ms there.
MAX_WRITE_RECORDS = 16_384
#: A reader that catches up with the write segment moves writes to a new one only once
#: this one holds this much (or a full segment): a queue whose consumer keeps up would
#: otherwise create and delete a file per message. Its settled records go with it; a
#: kill -9 meanwhile delivers them again (duplicates, bounded by this).
CATCH_UP_ROTATE_BYTES = 16 << 10
#: Per-record overhead beyond publisher and body, on disk.
RECORD_OVERHEAD = _FRAME.size + _RECORD.size
#: Bytes read from a file at a time.
_CHUNK = 1 << 16
#: What a queue reads ahead on the disk thread at a time (records, about bytes), and how
#: few read records left make it read the next ones.
READ_AHEAD_RECORDS = 4096
READ_AHEAD_BYTES = 256 << 10
READ_AHEAD_LOW = 256

#: Writes ``data`` at the end of the open file ``fd``; returns how many bytes it wrote.
Writer = Callable[[int, memoryview], int]
#: A message's fields as ``MessageQueue`` keeps them (id, body, timestamp, arrival,
#: release, attempts, publisher).
Fields = tuple[bytes, bytes, int, int, int, int, str]
_origins = itemgetter(7)


class CorruptRecord(Exception):
    """A record that fails its length or checksum test (a torn or zero-filled tail)."""


def _encode(f: Fields, due_ns: int | None) -> bytes:
    mid, body, ts, arrival, release, attempts, publisher = f
    pub = publisher.encode()
    data = _LENGTH_RECORD.pack(
        _RECORD.size + len(pub) + len(body),
        ts, arrival, release, -1 if due_ns is None else due_ns, attempts, mid, len(pub),
        len(body),
    ) + pub + body  # fmt: skip
    return _CRC.pack(zlib.crc32(data)) + data


def encode_batch_py(records: list[Record]) -> bytes:
    """Version-2 records of ``records`` (no due time), back to back: what ``_encode`` of
    each would give, joined; per message one struct call and one CRC, no ``Message`` and
    no record joined twice (it runs on the event loop for every message that overflows)."""
    pack, crc, crc_pack, size = _LENGTH_RECORD.pack, zlib.crc32, _CRC.pack, _RECORD.size
    parts: list[bytes] = []
    add = parts.append
    for mid, body, ts, arrival, release, attempts, publisher, _ in records:
        if publisher:
            pub = publisher.encode()
            data = pack(size + len(pub) + len(body), ts, arrival, release, -1, attempts,
                        mid, len(pub), len(body)) + pub + body  # fmt: skip
        else:
            data = pack(size + len(body), ts, arrival, release, -1, attempts, mid, 0,
                        len(body)) + body  # fmt: skip
        add(crc_pack(crc(data)))
        add(data)
    return b"".join(parts)


def encode_batch(records: list[Record]) -> bytes:
    """``encode_batch_py``, in C where ``srtm.broker._diskcodec`` was built (at install):
    the same bytes, in about a quarter of the time."""
    if _c_encode_batch is None:
        return encode_batch_py(records)
    try:
        return _c_encode_batch(records)
    except TypeError:  # a field of a type the C version does not take (struct may)
        return encode_batch_py(records)


def _whole_records(data: bytes, start: int, written: int) -> tuple[int, int]:
    """Of version-2 records in ``data`` from ``start``: the bytes (from 0) and number of
    those that lie whole in its first ``written`` bytes."""
    good, k = start, 0
    length = _FRAME.unpack_from
    while good + _FRAME.size <= written:
        end = good + _FRAME.size + length(data, good)[1]
        if end > written:
            break
        good, k = end, k + 1
    return good, k


def _record_bytes(r: Record) -> int:
    """The size of ``r``'s record on disk (what it counts towards ``flush_bytes``): a
    batch's sum is the length of its ``encode_batch``. Never fails (a publisher that
    cannot be encoded fails its write, not its push)."""
    return RECORD_OVERHEAD + len(r[1]) + len(r[6].encode("utf-8", "surrogatepass"))


def _pending_bytes(records: list[Record]) -> int:
    return sum(map(_record_bytes, records))


def _fields(msg: Message) -> Fields:
    return (
        msg.id, msg.body, msg.timestamp_ns, msg.arrival_ns, msg.release_ns, msg.attempts,
        msg.publisher,
    )  # fmt: skip


def encode(msg: Message, due_ns: int | None = None) -> bytes:
    """One version-2 record: CRC-32, length, then the payload."""
    return _encode(_fields(msg), due_ns)


def encode_v1(msg: Message, due_ns: int | None = None) -> bytes:
    """One version-1 record (no checksum): what older brokers wrote."""
    return _encode(_fields(msg), due_ns)[_FRAME.size :]


def decode_batch_py(
    buf: bytes, pos: int, want: int, max_bytes: int, version: int, origin: Origin | None
) -> tuple[list[Record], int, str | None]:
    """Up to ``want`` records of ``buf`` (records of a ``version`` file) from ``pos``,
    stopping once they take ``max_bytes``, as queue records carrying ``origin``; the
    offset after them; and why decoding stopped early (None: ``want`` or ``max_bytes``
    reached, or the buffer ends, cleanly or within a record whose rest it lacks). Checked
    as ``_Cursor.next`` checks; the due time is not kept (segments hold none)."""
    if not 0 <= pos <= len(buf):
        raise ValueError("decode_batch: pos out of the buffer")
    frame = _FRAME.size if version == FORMAT_VERSION else 0
    fixed, n = _RECORD.size, len(buf)
    out: list[Record] = []
    unpack_frame, unpack, crc32 = _FRAME.unpack_from, _RECORD.unpack_from, zlib.crc32
    view = memoryview(buf)
    p = pos
    while len(out) < want and p - pos < max_bytes and n - p >= frame + fixed:
        if frame:
            crc, length = unpack_frame(buf, p)
            if not fixed <= length <= MAX_RECORD:
                return out, p, f"record length {length} out of range"
        ts, arrival, release, _, attempts, mid, plen, blen = unpack(buf, p + frame)
        if not frame:
            length = fixed + plen + blen
        elif fixed + plen + blen != length:
            return out, p, f"lengths {plen}+{blen} do not fill a {length}-byte record"
        end = p + frame + length
        if end > n:
            break
        if frame and crc32(view[p + 4 : end]) != crc:
            return out, p, "checksum mismatch"
        start = p + frame + fixed
        try:
            publisher = bytes(view[start : start + plen]).decode()
        except UnicodeDecodeError as exc:
            return out, p, str(exc)
        out.append((mid, bytes(view[start + plen : end]), ts, arrival, release, attempts,
                    publisher, origin))  # fmt: skip
        p = end
    return out, p, None


def decode_batch(
    buf: bytes, pos: int, want: int, max_bytes: int, version: int, origin: Origin | None
) -> tuple[list[Record], int, str | None]:
    """``decode_batch_py``, in C where ``srtm.broker._diskcodec`` was built."""
    if _c_decode_batch is None:
        return decode_batch_py(buf, pos, want, max_bytes, version, origin)
    return _c_decode_batch(buf, pos, want, max_bytes, version, origin)


def _file_version(f: BinaryIO) -> int:
    """The format version of the file ``f`` from its start (left after its header)."""
    start = f.read(len(FILE_HEADER))
    if start == FILE_HEADER:
        return FORMAT_VERSION
    if start[: len(MAGIC)] == MAGIC:
        raise CorruptRecord(f"unknown format version {start[len(MAGIC) :]!r}")
    f.seek(0)
    return 1


class _Cursor:
    """Reads the records of one file through a buffer refilled in large chunks."""

    __slots__ = ("_buf", "_file", "_offset", "_pos", "version")

    def __init__(self, f: BinaryIO, offset: int = 0) -> None:
        self.version = _file_version(f)
        if offset:
            f.seek(offset)
        self._file = f
        self._offset = f.tell()  # file offset of _buf[0]
        self._buf = b""
        self._pos = 0

    def tell(self) -> int:
        return self._offset + self._pos

    def _need(self, n: int) -> bool:
        """At least ``n`` bytes from the position in the buffer (False: the file ends)."""
        if len(self._buf) - self._pos >= n:
            return True
        rest = self._buf[self._pos :]
        more = self._file.read(max(_CHUNK, n - len(rest)))
        self._offset += self._pos
        self._buf = rest + more if rest else more
        self._pos = 0
        return len(self._buf) >= n

    def next(self) -> tuple[Message, int | None] | None:
        """The next record; None at a clean end; CorruptRecord for anything else."""
        frame = _FRAME.size if self.version == FORMAT_VERSION else 0
        if not self._need(frame + _RECORD.size):
            if len(self._buf) == self._pos:
                return None
            raise CorruptRecord("record cut short")
        buf, p = self._buf, self._pos
        if frame:
            crc, length = _FRAME.unpack_from(buf, p)
            if not _RECORD.size <= length <= MAX_RECORD:
                raise CorruptRecord(f"record length {length} out of range")
        ts, arrival, release, due, attempts, mid, plen, blen = _RECORD.unpack_from(buf, p + frame)
        if not frame:
            length = _RECORD.size + plen + blen
        elif _RECORD.size + plen + blen != length:
            raise CorruptRecord(f"lengths {plen}+{blen} do not fill a {length}-byte record")
        if not self._need(frame + length):
            raise CorruptRecord(f"record cut short (a {length}-byte record)")
        buf, p = self._buf, self._pos
        end = p + frame + length
        if frame and zlib.crc32(memoryview(buf)[p + 4 : end]) != crc:
            raise CorruptRecord("checksum mismatch")
        start = p + frame + _RECORD.size
        try:
            publisher = buf[start : start + plen].decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecord(str(exc)) from exc
        self._pos = end
        msg = Message(mid, buf[start + plen : end], ts, arrival, release, attempts, publisher)
        return msg, (None if due < 0 else due)


def scan(path: Path) -> tuple[list[tuple[Message, int | None, int]], str | None]:
    """Every valid record of a file with the offset after it, and why reading stopped
    early (None: a clean end)."""
    out: list[tuple[Message, int | None, int]] = []
    with path.open("rb") as f:
        try:
            cursor = _Cursor(f)
            while (rec := cursor.next()) is not None:
                out.append((rec[0], rec[1], cursor.tell()))
        except CorruptRecord as exc:
            return out, f"{exc} at byte {out[-1][2] if out else 0}"
    return out, None


def read_records(path: Path) -> Iterator[tuple[Message, int | None]]:
    records, problem = scan(path)
    if problem is not None:
        log.warning("%s: %s; the rest of the file is skipped", path, problem)
    for msg, due, _ in records:
        yield msg, due


_syncer: concurrent.futures.ThreadPoolExecutor | None = None


def _in_background(fn: Callable[[], None]) -> None:
    """Run an fsync off the caller's thread (the broker's event loop must not wait for
    the disk); errors are logged."""
    global _syncer
    if _syncer is None:
        _syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="srtm-fsync")

    def run() -> None:
        try:
            fn()
        except OSError as exc:
            log.warning("fsync failed: %s", exc)

    _syncer.submit(run)


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` crash-safely: temporary file, fsync, rename, dir fsync."""
    tmp = path.with_suffix(".tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def write_records(path: Path, records: list[tuple[Message, int | None]]) -> None:
    """Write ``records`` to ``path`` atomically (a version-2 file)."""
    write_atomic(path, FILE_HEADER + b"".join(encode(m, due) for m, due in records))


@dataclass(slots=True)
class _Segment:
    """What the queue knows of one segment file (``n`` -1: the head file)."""

    n: int
    path: Path
    #: Valid records in the file, and the byte offset after the last one.
    records: int = 0
    end: int = 0
    #: Records read out so far, and the byte offset after the last one read.
    read: int = 0
    read_pos: int = 0
    #: Read out but not settled yet (in memory, in flight, in another queue's buffer).
    outstanding: int = 0
    #: What every message read from it carries (one object for all of them).
    origin: _Origin | None = None


class _Origin:
    """Where a popped message came from: settling it lets its segment go."""

    __slots__ = ("n", "queue")

    def __init__(self, queue: DiskQueue, n: int) -> None:
        self.queue, self.n = queue, n

    def settle(self, k: int = 1) -> None:
        """``k`` copies are settled (a run of FINs settles them in one call)."""
        self.queue._settle(self.n, k)

    def share(self, n: int) -> None:
        """``n`` more copies must be settled before the segment can go (a fan-out)."""
        self.queue._settle(self.n, -n)


class DiskQueue:
    """Messages in ``directory``: segments ``000000.dat``, ``000001.dat``, … read in order.

    The read position survives a graceful close (``meta.json``); after a crash the queue
    starts again at the oldest segment left, so messages may be delivered twice, never lost.
    ``failing`` (a set shared by the broker's queues) holds the queues whose last write
    failed.
    """

    def __init__(
        self,
        directory: Path,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        *,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
        writer: Writer = os.write,
        failing: set[DiskQueue] | None = None,
        unflushed: set[DiskQueue] | None = None,
        io: DiskIO | None = None,
        pushed: set[DiskQueue] | None = None,
        on_readable: Callable[[], None] | None = None,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.flush_bytes = flush_bytes
        self._write = writer
        self._failing: set[DiskQueue] = failing if failing is not None else set()
        #: Shared with the broker: queues holding pushes not written yet, which it writes
        #: before acknowledging the publish that made them.
        self._unflushed: set[DiskQueue] = unflushed if unflushed is not None else set()
        #: Shared with the broker: queues pushed to since it last cleared it (what one
        #: publish must wait for).
        self._pushed_to: set[DiskQueue] = pushed if pushed is not None else set()
        #: Why the last write failed (None: writing works).
        self.error: OSError | None = None
        #: The broker's disk thread (None, or closed: file work runs inline).
        self.io = io
        #: Called (on the event loop) when records were read or written that ``pop`` can
        #: now give: the broker dispatches the queue's channel or topic again.
        self._on_readable = on_readable
        self._segments: dict[int, _Segment] = {}
        self._unread = 0  # records on disk not read yet
        if self.threaded:
            # Made while serving: a new queue (restored ones are opened before serving),
            # so there is nothing to load; the directory is made on the disk thread, before
            # any write (its work runs in order).
            last = -1
            self._run(lambda: directory.mkdir(parents=True, exist_ok=True))
        else:
            directory.mkdir(parents=True, exist_ok=True)
            last = self._load()
        # Never append to a segment a crash may have left with a torn tail.
        self._wseg = self._new_segment(last + 1)
        self._wfd: int | None = None
        #: Read from the segments (counted as read, not settled), not popped yet.
        #: As queue records carrying their segment's origin (decoded on the disk thread).
        self._ahead: deque[Record] = deque()
        #: A write / a read is running (on the disk thread); another write was asked for.
        self._writing = self._reading = self._again = False
        self._failed_last = False
        #: Bumped when the queue's files go (clear, remove): late completions are ignored.
        self._gen = 0
        #: Pushes so far, and publishes waiting for the write of the first ``n`` of them.
        self._pushed = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: Pushed, not written yet, as records (their ``origin`` is settled once written).
        self._pending: deque[Record] = deque()
        self._pending_bytes = 0
        #: The pending records encoded when pushed, as (records, bytes) chunks in order:
        #: a write then only joins them (its encoding was done while the write before it
        #: ran). Used only while they cover every pending record (``_encoded_n``).
        self._encoded: deque[tuple[int, bytes]] = deque()
        self._encoded_n = 0
        self._head: _Segment | None = None
        self._head_replaced = False
        self._open_failed = False

    # -- start ----------------------------------------------------------------------------
    def _path(self, n: int) -> Path:
        return self.directory / _SEGMENT.format(n)

    def _new_segment(self, n: int) -> _Segment:
        seg = self._segments[n] = _Segment(n, self._path(n))
        return seg

    def _load(self) -> int:
        """Count what the segments hold, skipping what a saved read position says was read;
        returns the highest segment number found (-1: none)."""
        numbers = sorted(int(p.stem) for p in self.directory.glob("[0-9]*.dat"))
        start, start_pos = (numbers[0] if numbers else 0), 0
        meta = self.directory / _META
        if meta.exists():
            try:
                saved = json.loads(meta.read_text())
                if saved.get("read_segment") in numbers:
                    start, start_pos = int(saved["read_segment"]), int(saved["read_pos"])
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("%s: unreadable (%s); reading from the oldest segment", meta, exc)
            meta.unlink()
        for n in numbers:
            path = self._path(n)
            if n < start:
                path.unlink()  # read before a graceful stop
                continue
            records, problem = scan(path)
            if problem is not None:
                log.warning("%s: %s; the rest of the segment is skipped", path, problem)
                if not records:
                    continue  # nothing readable: left alone for a person to look at
            seg = self._new_segment(n)
            seg.records = len(records)
            seg.end = records[-1][2] if records else 0
            if n == start and start_pos:
                seg.read = sum(1 for *_, after in records if after <= start_pos)
                seg.read_pos = start_pos
            self._unread += seg.records - seg.read
            if not seg.records - seg.read:
                self._segments.pop(n)
                path.unlink()
        return numbers[-1] if numbers else -1

    # -- size ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._unread + len(self._ahead) + len(self._pending)

    @property
    def failing(self) -> bool:
        return self.error is not None

    @property
    def pending(self) -> int:
        """Messages pushed but not written yet."""
        return len(self._pending)

    # -- running file work ------------------------------------------------------------------
    @property
    def threaded(self) -> bool:
        """Whether file work runs on the broker's disk thread (else inline, synchronously:
        tests driving a queue directly, the restore before serving, the graceful stop)."""
        return self.io is not None and not self.io.closed

    def _run(self, work: Callable[[], _T], done: Callable[[_T], None] | None = None) -> None:
        """Run ``work`` on the disk thread (``done`` later, on the event loop) or inline."""
        if self.io is not None and not self.io.closed:
            self.io.submit(work, done)
            return
        result = work()
        if done is not None:
            done(result)

    def _resolve_waiters(self, everyone: bool) -> None:
        """Publishes waiting for their records' write: done once they went through one."""
        if not self._waiters:
            return
        done = self._pushed - len(self._pending)
        keep = []
        for target, fut in self._waiters:
            if everyone or target <= done:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._waiters = keep

    # -- write side -------------------------------------------------------------------------
    def push(self, msg: Message) -> None:
        """Queue ``msg`` at the back. Never fails: while writing fails it waits in memory
        (the broker refuses new publishes meanwhile)."""
        # Its fields, not the object: the caller may hand the same one to other queues.
        self._pending.append(
            (msg.id, msg.body, msg.timestamp_ns, msg.arrival_ns, msg.release_ns, msg.attempts,
             msg.publisher, msg.origin)
        )  # fmt: skip
        self._encode_ahead([self._pending[-1]], 1)
        self._pushed += 1
        self._pending_bytes += _record_bytes(self._pending[-1])
        self._pushed_more()

    def push_many(self, records: list[Record]) -> None:
        """``push`` of each (an MPUB's overflow): one extend, no ``Message`` per record."""
        self._pending.extend(records)
        encoded = self._encode_ahead(records, len(records))
        self._pushed += len(records)
        # the length of their records, known once encoded
        self._pending_bytes += encoded if encoded is not None else _pending_bytes(records)
        self._pushed_more()

    def _encode_ahead(self, records: list[Record], n: int) -> int | None:
        """Encode the ``n`` records just pushed, if every one before them is encoded (and
        writing works: while it fails, what waits is encoded when written); their length
        (None: not encoded)."""
        if self._encoded_n + n != len(self._pending) or self.error is not None:
            return None
        try:
            data = encode_batch(records)
        except (struct.error, OverflowError, ValueError):
            self._forget_encoded()  # encoded again when written: that write fails then
            return None
        self._encoded.append((n, data))
        self._encoded_n += n
        return len(data)

    def _forget_encoded(self) -> None:
        """The chunks no longer line up with the pending records (some were taken, or a
        chunk was written in part): writes encode from the records until none is left."""
        self._encoded.clear()
        self._encoded_n = 0

    def _take_encoded(self, k: int) -> None:
        """The first ``k`` pending records are written (before they are taken)."""
        enc = self._encoded
        if self._encoded_n != len(self._pending):
            if enc:
                self._forget_encoded()
            return
        while k and enc and enc[0][0] <= k:
            n = enc.popleft()[0]
            k -= n
            self._encoded_n -= n
        if k:
            self._forget_encoded()

    def _pushed_more(self) -> None:
        self._unflushed.add(self)
        self._pushed_to.add(self)
        if self._pending_bytes >= self.flush_bytes and self.error is None:
            self.flush()

    def written(self) -> asyncio.Future[None] | None:
        """Have what is buffered written; a future done once everything pushed so far went
        through a write (None: nothing to wait for, or already written inline). A queue
        that is failing is not waited for (the housekeeping loop retries it)."""
        if not self._pending or self.error is not None:
            return None
        if not self.threaded:
            self.flush()
            return None
        assert self.io is not None
        fut = self.io.loop.create_future()
        self._waiters.append((self._pushed, fut))
        self.flush()
        return fut

    def flush(self) -> bool:
        """Write what is buffered (batched, no fsync: a killed process loses none of it).
        Inline: False if a write failed; what did not fit stays buffered for the next try.
        On the disk thread the write is started (or another one asked for after the one
        running) and the result is whether the queue is not failing."""
        if self._writing:
            self._again = True
            return self.error is None
        if not self.threaded:
            while self._pending:
                self._start_write()
                if self.error is not None and self._failed_last:
                    return False
            self._all_written()
            return True
        if not self._pending:
            self._all_written()
            return True
        self._start_write()
        return self.error is None

    def _all_written(self) -> None:
        self._pending_bytes = 0
        self._unflushed.discard(self)
        if self.error is not None:
            log.info("%s: writing again after %s", self.directory, self.error)
            self.error = None
            self._failing.discard(self)
        self._resolve_waiters(False)

    def _start_write(self) -> None:
        """Write the oldest buffered records (up to a segment's size) at the end of the
        write segment; they stay readable from the buffer until the write is done."""
        if self._wseg.end >= self.segment_bytes:
            self._rotate(sync=True)
        seg = self._wseg
        header = b"" if seg.end else FILE_HEADER
        size = seg.end + len(header)
        pending = self._pending
        batch: list[Record] = []
        encoded: bytes | None = None
        count = len(pending)
        if size + self._pending_bytes < self.segment_bytes and count <= MAX_WRITE_RECORDS:
            # All of it fits (the usual case): no loop per record; encoded when pushed.
            if self._encoded_n == len(pending):
                encoded = b"".join([data for _, data in self._encoded])
            else:
                batch = list(pending)
        elif self._encoded_n == len(pending):
            # What fits of what was encoded when pushed, in whole pushes (an MPUB's
            # overflow is one, so a segment may end past its size by one MPUB's body):
            # not a size per record (a segment holds 250,000 small ones, a quarter of a
            # second of work on the event loop).
            chunks: list[bytes] = []
            count = 0
            for n, data in self._encoded:
                if chunks and (size >= self.segment_bytes or count >= MAX_WRITE_RECORDS):
                    break
                chunks.append(data)
                count += n
                size += len(data)
            encoded = b"".join(chunks)
        else:
            batch = []
            for r in pending:
                if batch and (size >= self.segment_bytes or len(batch) >= MAX_WRITE_RECORDS):
                    break
                batch.append(r)
                size += _record_bytes(r)
        self._writing = True
        self._again = False
        gen, fd, path, end = self._gen, self._wfd, seg.path, seg.end
        directory, write = self.directory, self._write
        # Encoded here, on the caller's thread: CPU work done on the disk thread only
        # contends for the GIL, and an acknowledgement waiting for this write waited
        # for that contention too (batched publishes ran at half speed).
        try:
            if encoded is not None:
                data = header + encoded
            else:
                data, count = header + encode_batch(batch), len(batch)
        except (struct.error, OverflowError, ValueError) as e:  # a field out of range
            bad: _WriteResult = (fd, 0, 0, OSError(errno.EINVAL, f"cannot encode: {e}"), False)
            self._run(lambda: bad, lambda res: self._write_done(gen, fd, seg, res))
            return

        def work() -> _WriteResult:
            return _write_batch(write, directory, path, fd, end, len(header), data, count)

        def done(res: _WriteResult) -> None:
            self._write_done(gen, fd, seg, res)

        self._run(work, done)

    def _write_done(self, gen: int, fd: int | None, seg: _Segment, res: _WriteResult) -> None:
        """Back from a write: count what is on disk; on an error keep the rest buffered."""
        new_fd, good, k, exc, truncate_failed = res
        if gen != self._gen:  # cleared or removed meanwhile: its files are going
            if new_fd is not None and new_fd != fd:
                self._run(lambda: _close_quietly(new_fd))
            return
        self._writing = False
        self._wfd = new_fd
        filled = self._written(seg, good, k)
        self._failed_last = exc is not None
        if exc is not None:
            if truncate_failed:
                self._rotate(sync=False)  # the file may end on a torn record
            wseg = self._wseg
            if wseg.records and (exc.errno == errno.EFBIG or wseg.read >= wseg.records):
                # This file cannot grow, or all of it was read (its settled records can
                # free space once it goes): the next try starts a new one.
                self._rotate(sync=False)
            self._failed(exc)
            self._again = False
            self._resolve_waiters(True)  # acknowledged as before; the topic now refuses
        else:
            if filled:
                self._caught_up(self._wseg)
            if not self._pending:
                self._all_written()
            else:
                self._resolve_waiters(False)
                # A publish waiting for its records (``written``) is not left for the
                # next flush: a write takes at most a segment, so its records may need more.
                if self.threaded and (
                    self._again
                    or self._waiters
                    or self.error is not None
                    or self._pending_bytes >= self.flush_bytes
                ):
                    self._start_write()
        if k and self.threaded and self._on_readable is not None:
            self._on_readable()

    def _written(self, seg: _Segment, size: int, k: int) -> bool:
        """``k`` buffered records (``size`` bytes with the file header) are on disk now.
        A reader that has read everything before them takes them as read from memory (no
        read back); returns whether it did."""
        fill = (
            k > 0
            and self.threaded
            and self._unread == 0
            and not self._reading
            and seg.read == seg.records
            # a reader keeping up, and memory bounded: else they are read back later
            and len(self._ahead) < READ_AHEAD_LOW
            and k <= READ_AHEAD_RECORDS
            and size <= READ_AHEAD_BYTES
        )
        # The records' own bytes (``_pending_bytes`` counts no file header).
        records_size = size - len(FILE_HEADER) if seg.end == 0 and size else size
        seg.end += size
        seg.records += k
        origin: _Origin | None = None
        if fill:
            seg.read += k
            seg.read_pos = seg.end
            seg.outstanding += k
            origin = seg.origin = seg.origin or _Origin(self, seg.n)
        else:
            self._unread += k
        self._take_encoded(k)
        pending = self._pending
        if k == len(pending):
            done = list(pending)
            pending.clear()
            self._pending_bytes = 0
        else:
            popleft = pending.popleft
            done = [popleft() for _ in range(k)]
            self._pending_bytes -= records_size
        for settled in filter(None, map(_origins, done)):
            settled.settle()  # durable here now: its own segment may go
        if origin is not None:
            self._ahead.extend([(*r[:7], origin) for r in done])
        return fill

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            log.error(
                "%s: cannot write (%s): %d messages wait in memory; publishes to this "
                "topic are refused until a write succeeds",
                self.directory,
                exc,
                len(self._pending),
            )
        self.error = exc
        self._failing.add(self)

    def _rotate(self, sync: bool) -> None:
        """Start a new write segment (the old one is read, then deleted when settled)."""
        fd, self._wfd = self._wfd, None
        if fd is not None:
            if sync:  # a full segment: made durable (and closed) in the background
                _in_background(lambda: _sync_and_close(fd))
            else:
                self._run(lambda: _close_quietly(fd))
        old = self._wseg
        self._wseg = self._new_segment(old.n + 1)
        if not old.records:
            self._segments.pop(old.n)
            self._unlink(old.path)
        else:
            self._maybe_delete(old)

    def _unlink(self, path: Path) -> None:
        self._run(lambda: _unlink_quietly(path))

    # -- read side --------------------------------------------------------------------------
    def pop(self) -> Message | None:
        """The oldest message: read ahead from the segments, then from the write buffer.

        On the disk thread, reading is ahead of ``pop``: None while what is unread has
        not been read yet (``on_readable`` is called once it has).

        A buffered message with no ``origin`` has no other copy on disk: it is written
        first and read back, so that it carries an origin and stays durable wherever it
        goes next (a shaped topic's head waiting for its token, a channel's buffer). While
        writing fails it is handed out from memory (reading never waits for a write)."""
        r = self._pop_record()
        return None if r is None else Message(*r)

    def pop_records(self, n: int) -> list[Record]:
        """Up to ``n`` of the oldest messages, as ``pop`` would give them one by one (it
        may give fewer while reading is behind), as queue records: the read-ahead's taken
        in one slice."""
        ahead = self._ahead
        out: list[Record] = []
        while len(out) < n:
            if ahead:
                out += popleft_many(ahead, n - len(out))
                continue
            r = self._pop_record()
            if r is None:
                break
            out.append(r)
        if len(ahead) <= READ_AHEAD_LOW and self._unread:
            self._read_more()
        return out

    def _pop_record(self) -> Record | None:
        ahead = self._ahead
        if len(ahead) <= READ_AHEAD_LOW and self._unread:
            self._read_more()
        if ahead:
            return ahead.popleft()
        if self._unread or self._writing:
            return None  # being read, or being written (then read from memory)
        pending = self._pending
        if pending and pending[0][7] is None and self.error is None:
            self.flush()
            if self.threaded:
                return None
            return self._pop_record()
        if pending:
            if self._encoded:
                self._forget_encoded()
            r = pending.popleft()
            self._pending_bytes -= _record_bytes(r)
            self._resolve_waiters(False)
            return r
        return None

    def _read_more(self) -> None:
        """Read the next records of the oldest segment not read out (inline, or on the
        disk thread: ``on_readable`` then tells the broker)."""
        if self._reading:
            return
        seg = next((s for s in self._segments.values() if s.read < s.records), None)
        if seg is None:
            self._unread = 0
            return
        self._reading = True
        gen, want, path, pos = self._gen, seg.records - seg.read, seg.path, seg.read_pos
        threaded = self.threaded
        origin = seg.origin = seg.origin or _Origin(self, seg.n)

        def work() -> _ReadResult:
            # inline: one record at a time (nothing read ahead that a close would forget)
            return _read_batch(path, pos, min(want, READ_AHEAD_RECORDS if threaded else 1), origin)

        def done(res: _ReadResult) -> None:
            self._read_done(gen, seg, res)

        self._run(work, done)

    def _read_done(self, gen: int, seg: _Segment, res: _ReadResult) -> None:
        msgs, end, exc, opened = res
        if gen != self._gen:
            return
        self._reading = False
        if msgs:  # records carrying ``seg.origin``
            n = len(msgs)
            seg.read += n
            seg.read_pos = end
            seg.outstanding += n
            self._unread -= n
            self._ahead.extend(msgs)
        if exc is not None:
            if not opened and not isinstance(exc, (FileNotFoundError, CorruptRecord)):
                # Cannot open it now (out of fds, memory): nothing to read yet, and nothing
                # from behind it either (FIFO); the next pop tries again.
                if not self._open_failed:
                    log.warning("%s: cannot open a segment (%s); retrying", self.directory, exc)
                self._open_failed = True
            else:
                self._unreadable(seg, exc)
        else:
            self._open_failed = False
        if seg.read >= seg.records:
            self._done_reading(seg)
        if self.threaded:
            if msgs and self._on_readable is not None:
                self._on_readable()
            elif not msgs and self._unread and not self._open_failed:
                self._read_more()  # skipped a damaged segment: the next one

    def _unreadable(self, seg: _Segment, exc: Exception) -> None:
        """Damaged since it was written or counted: skip what cannot be read."""
        lost = seg.records - seg.read
        log.error("%s: %s; %d records skipped", seg.path, exc, lost)
        self._unread -= lost
        seg.records = seg.read

    def _done_reading(self, seg: _Segment) -> None:
        if seg is self._wseg:
            self._caught_up(seg)
        else:
            self._maybe_delete(seg)

    def _caught_up(self, seg: _Segment) -> None:
        if not self._writing and seg.end >= min(self.segment_bytes, CATCH_UP_ROTATE_BYTES):
            self._rotate(sync=False)  # caught up: let this segment go once settled

    def read_ahead(self) -> list[Message]:
        """What was read from the segments and not popped yet (saved with the head at a
        graceful stop: it counts as read)."""
        return [Message(*r) for r in self._ahead]

    # -- settling ---------------------------------------------------------------------------
    def _settle(self, n: int, k: int) -> None:
        seg = self._head if n == _HEAD_SEG else self._segments.get(n)
        if seg is None:
            return  # cleared or removed meanwhile
        seg.outstanding -= k
        self._maybe_delete(seg)

    def _maybe_delete(self, seg: _Segment) -> None:
        if seg.outstanding > 0 or seg.read < seg.records or seg is self._wseg:
            return
        if seg.n == _HEAD_SEG:
            self._head = None
            if self._head_replaced:
                return  # a new head has been saved over it
        else:
            self._segments.pop(seg.n, None)
        self._unlink(seg.path)

    def _forget_files(self) -> None:
        """The queue's files are going: work still running for them is ignored when done,
        and publishes waiting for a write are answered."""
        self._gen += 1
        self._writing = self._reading = self._again = False
        fd, self._wfd = self._wfd, None
        if fd is not None:
            self._run(lambda: _close_quietly(fd))
        self._ahead.clear()
        self._resolve_waiters(True)

    def clear(self) -> None:
        """Drop everything queued (what was popped before stays with its holders)."""
        self._forget_files()
        for origin in filter(None, map(_origins, self._pending)):
            origin.settle()
        self._pending.clear()
        self._forget_encoded()
        self._pending_bytes = 0
        last = self._wseg.n
        for seg in list(self._segments.values()):
            self._unlink(seg.path)
        self._segments.clear()
        self._unread = 0
        self._wseg = self._new_segment(last + 1)
        if self.error is not None:
            self.error = None
            self._failing.discard(self)

    # -- graceful shutdown ------------------------------------------------------------------
    def save_head(self, records: list[tuple[Message, int | None]]) -> bool:
        """Persist what the queue held in memory; the next start reads it first.
        False (logged) if it could not be written."""
        if not records:
            return True
        try:
            write_records(self.directory / _HEAD, records)
        except OSError as exc:
            log.error("%s: %d messages held in memory not saved: %s", self.directory,
                      len(records), exc)  # fmt: skip
            return False
        self._head_replaced = True
        return True

    def take_head(self) -> list[tuple[Message, int | None]]:
        """What the last graceful stop held in memory. The file stays until every one of
        these messages is settled (a crash meanwhile reads it again)."""
        path = self.directory / _HEAD
        if not path.exists() or self._head is not None:
            return []
        records = list(read_records(path))
        if not records:
            path.unlink()
            return []
        seg = self._head = _Segment(_HEAD_SEG, path, len(records), 0, len(records))
        seg.outstanding = len(records)
        self._head_replaced = False
        for msg, _ in records:
            msg.origin = _Origin(self, _HEAD_SEG)
        return records

    def close(self, forget_read: bool = True) -> bool:
        """Graceful stop, after every queue's head was saved: write what is buffered, then
        with ``forget_read`` forget what was read (the saved heads hold what of it is
        unsettled). False if the buffer could not be written (logged; nothing read is
        forgotten then: the next start reads those segments again)."""
        written = self.flush()
        if not written:
            log.error("%s: %d acknowledged messages could not be written: %s",
                      self.directory, len(self._pending), self.error)  # fmt: skip
        if self._wfd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._wfd)
            os.close(self._wfd)
            self._wfd = None
        if not written or not forget_read:
            return written
        if self._head is not None and not self._head_replaced:
            with contextlib.suppress(FileNotFoundError):
                self._head.path.unlink()  # what it held is in some saved head now
        self._head = None
        first: _Segment | None = None
        for seg in list(self._segments.values()):
            if seg.read >= seg.records:
                self._segments.pop(seg.n)
                with contextlib.suppress(FileNotFoundError):
                    seg.path.unlink()
            elif first is None:
                first = seg
        if first is not None and first.read_pos:
            try:
                meta = {"version": FORMAT_VERSION, "read_segment": first.n,
                        "read_pos": first.read_pos}  # fmt: skip
                write_atomic(self.directory / _META, json.dumps(meta).encode())
            except OSError as exc:
                # Without it the segment is read from its start: duplicates, no loss.
                log.warning("%s: read position not saved: %s", self.directory, exc)
        return True

    def remove(self) -> None:
        """Close and delete the queue's files (its topic or channel was deleted)."""
        self._forget_files()
        self._failing.discard(self)
        self._unflushed.discard(self)
        self._pending.clear()
        self._forget_encoded()
        self._segments.clear()
        self._head = None
        self._run(lambda: _remove_dir(self.directory))


def _remove_dir(directory: Path) -> None:
    for p in directory.iterdir():
        p.unlink()
    directory.rmdir()


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


#: A write's result: the file's descriptor (None: it could not be opened), the bytes and
#: records written whole, the error that stopped it, whether taking a torn tail back failed.
_WriteResult = tuple[int | None, int, int, OSError | None, bool]


def _write_batch(
    write: Writer,
    directory: Path,
    path: Path,
    fd: int | None,
    end: int,
    header: int,
    data: bytes,
    count: int,
) -> _WriteResult:
    """Append ``data`` (a file header of ``header`` bytes, then ``count`` version-2 records) to the
    segment ``path`` (opened if ``fd`` is None), which holds ``end`` good bytes. A failed
    write is taken back to its last whole record (``ftruncate`` needs no space)."""
    view = memoryview(data)
    written = 0
    exc: OSError | None = None
    try:
        if fd is None:
            new = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if new:  # the file's name survives a power loss
                _in_background(lambda: fsync_dir(directory))
        while written < len(data):
            n = write(fd, view[written:])
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            written += n
    except OSError as e:
        exc = e
    # What was written up to the last whole record counts; a torn one is taken back.
    good = k = 0
    if written == len(data):
        good, k = written, count
    elif written >= header:
        good, k = _whole_records(data, header, written)
    truncate_failed = False
    if exc is not None and fd is not None:
        try:
            os.ftruncate(fd, end + good)
        except OSError:
            truncate_failed = True
    return fd, good, k, exc, truncate_failed


#: A read's result: the records, the offset after the last one, the error that stopped it
#: and whether the file could be opened.
_ReadResult = tuple[list[Record], int, Exception | None, bool]


def _read_batch(path: Path, pos: int, want: int, origin: Origin | None) -> _ReadResult:
    """Up to ``want`` records (and about ``READ_AHEAD_BYTES``) of ``path`` from ``pos``, as
    queue records carrying ``origin``: the file's bytes read in one piece, decoded in one
    call (in C where built), so the disk thread seldom holds the GIL."""
    out: list[Record] = []
    end = pos
    try:
        f = path.open("rb")
    except OSError as exc:
        return out, end, exc, isinstance(exc, FileNotFoundError)
    try:
        with f:
            version = _file_version(f)
            if pos:
                f.seek(pos)
            start = end = f.tell()
            # One record (inline): a chunk; else the bytes wanted and the record crossing them.
            buf = f.read(_CHUNK if want == 1 else READ_AHEAD_BYTES + _CHUNK)
            base = p = start  # file offset of buf[0], and where decoding goes on
            while True:
                recs, stop, problem = decode_batch(
                    buf, p - base, want - len(out), READ_AHEAD_BYTES - (p - start), version, origin
                )
                out += recs
                p = end = base + stop
                if problem is not None:
                    raise CorruptRecord(problem)
                if len(out) >= want or p - start >= READ_AHEAD_BYTES:
                    break
                # The buffer ended (within a record whose rest it lacks, or cleanly).
                rest = buf[stop:]
                more = f.read(max(_CHUNK, len(rest)))
                if not more:
                    raise CorruptRecord(
                        "record cut short" if rest else "end of file before the records counted"
                    )
                buf, base = rest + more, p
    except Exception as exc:  # anything unreadable is skipped (and logged)
        return out, end, exc, True
    return out, end, None, True


_T = TypeVar("_T")
#: A piece of the disk thread's work and what runs on the loop with its result.
_Work = tuple[Callable[[], Any], Callable[[Any], None] | None]


class DiskIO:
    """A broker's disk thread: its disk queues' file work (encoding and writing batches,
    reading ahead, opening, closing and deleting segments) runs there, one piece at a
    time in the order asked (a queue's close or delete never overtakes its write), so
    the event loop never waits for the disk; each completion runs back on the loop.

    A thread of its own on a ``SimpleQueue``, not an executor: a hand-off is one ``put``
    (no future, no lock), and the thread runs little Python, so it seldom waits for the
    GIL the event loop holds (an MPUB that overflows waits for its write)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        #: Work submitted whose completion has not run yet.
        self.outstanding = 0
        self._idle = asyncio.Event()
        self._idle.set()
        #: Set by ``quiesce``: queues then work inline (the graceful stop).
        self.closed = False
        # A daemon, stopped (after the work queued) at a graceful stop or at exit, as an
        # executor's thread would be: an interpreter exit never waits for it forever.
        self._thread = threading.Thread(target=self._serve, name="srtm-disk_0", daemon=True)
        self._thread.start()
        atexit.register(self._stop)

    def submit(self, work: Callable[[], _T], done: Callable[[_T], None] | None = None) -> None:
        self.outstanding += 1
        self._idle.clear()
        self._queue.put((work, done))

    def _serve(self) -> None:
        get, call = self._queue.get, self.loop.call_soon_threadsafe
        while (item := get()) is not None:
            work, done = item
            try:
                result = work()
            except Exception:
                log.exception("disk work failed")
                result, done = None, None
            with contextlib.suppress(RuntimeError):  # the loop is gone (interpreter exit)
                call(self._finish, done, result)

    def _finish(self, done: Callable[[Any], None] | None, result: object) -> None:
        self.outstanding -= 1
        try:
            if done is not None:
                done(result)
        finally:
            if not self.outstanding:
                self._idle.set()

    def _stop(self) -> None:
        """Let the thread end after the work queued (at exit: and wait for it)."""
        self._queue.put(None)
        if not self.closed:
            self._thread.join()

    async def quiesce(self) -> None:
        """Wait until no work is left, then have the queues work inline from now on."""
        while self.outstanding:
            await self._idle.wait()
        self.closed = True
        atexit.unregister(self._stop)
        self._stop()


_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class Reserve:
    """Space claimed at start (a preallocated file) and given back at a graceful stop, so
    that the heads saved then still fit on a full disk."""

    NAME = "reserve.dat"

    def __init__(self, directory: Path, size: int) -> None:
        self.path = directory / self.NAME
        self.size = size
        self.held = 0
        self._next_try = 0.0

    def claim(self, retry: bool = False) -> None:
        """Preallocate the reserve (kept if already there); on failure log it (once, for
        ``retry``: the broker tries again while it runs) and hold none."""
        if self.size <= 0 or self.held:
            return
        if retry and time.monotonic() < self._next_try:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            self._next_try = time.monotonic() + 10.0
            if not retry:
                level = logging.WARNING if exc.errno in _NO_SPACE else logging.ERROR
                log.log(level, "no %d-byte disk reserve at %s (%s): a stop on a full disk "
                        "may not save what memory holds", self.size, self.path, exc)  # fmt: skip
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        if retry:
            log.info("disk reserve of %d bytes claimed at %s", self.size, self.path)
        self.held = self.size

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.held = 0
