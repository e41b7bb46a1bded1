"""The disk queue's record format: records encoded and decoded, files scanned.

A version-2 file starts with ``FILE_HEADER``; each record is framed by a CRC-32 of (length
field + payload) and the payload's length; version-1 files (older brokers) have neither
header nor frames. docs/durability.md describes the format. Batches are encoded and
decoded in C where ``srtm.broker._diskcodec`` was built (at install), else in Python.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from srtm.broker.message import Message, Origin
from srtm.broker.queue import Record

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
#: Per-record overhead beyond publisher and body, on disk.
RECORD_OVERHEAD = _FRAME.size + _RECORD.size
#: Bytes read from a file at a time.
CHUNK = 1 << 16

#: A message's fields as ``MessageQueue`` keeps them (id, body, timestamp, arrival,
#: release, attempts, publisher).
Fields = tuple[bytes, bytes, int, int, int, int, str]


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


def whole_records(data: bytes, start: int, written: int) -> tuple[int, int]:
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


def record_bytes(r: Record) -> int:
    """The size of ``r``'s record on disk (what it counts towards ``flush_bytes``): a
    batch's sum is the length of its ``encode_batch``. Never fails (a publisher that
    cannot be encoded fails its write, not its push)."""
    return RECORD_OVERHEAD + len(r[1]) + len(r[6].encode("utf-8", "surrogatepass"))


def records_bytes(records: list[Record]) -> int:
    return sum(map(record_bytes, records))


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


def file_version(f: BinaryIO) -> int:
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
        self.version = file_version(f)
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
        more = self._file.read(max(CHUNK, n - len(rest)))
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
