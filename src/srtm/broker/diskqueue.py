"""A FIFO of messages on disk: append-only segment files, read in order, deleted when read.

Used as a ``MessageQueue``'s overflow and for what a queue held in memory at shutdown
(its *head*: read back before the segments on the next start).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from srtm.broker.message import Message

# timestamp, arrival, release, due (-1: none), attempts, id, publisher length, body length
_RECORD = struct.Struct(">qqqqH16sHI")
_SEGMENT = "{:06d}.dat"
_HEAD = "head.dat"
_META = "meta.json"
DEFAULT_SEGMENT_BYTES = 16 << 20


def encode(msg: Message, due_ns: int | None = None) -> bytes:
    publisher = msg.publisher.encode()
    return (
        _RECORD.pack(
            msg.timestamp_ns,
            msg.arrival_ns,
            msg.release_ns,
            -1 if due_ns is None else due_ns,
            msg.attempts,
            msg.id,
            len(publisher),
            len(msg.body),
        )
        + publisher
        + msg.body
    )


def _read_record(f: BinaryIO) -> tuple[Message, int | None] | None:
    head = f.read(_RECORD.size)
    if len(head) < _RECORD.size:
        return None  # end, or a record cut short by a crash
    ts, arrival, release, due, attempts, mid, plen, blen = _RECORD.unpack(head)
    rest = f.read(plen + blen)
    if len(rest) < plen + blen:
        return None
    msg = Message(mid, rest[plen:], ts, arrival, release, attempts, rest[:plen].decode())
    return msg, (None if due < 0 else due)


def read_records(path: Path) -> Iterator[tuple[Message, int | None]]:
    with path.open("rb") as f:
        while (rec := _read_record(f)) is not None:
            yield rec


def write_records(path: Path, records: list[tuple[Message, int | None]]) -> None:
    """Write ``records`` to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        for msg, due in records:
            f.write(encode(msg, due))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class DiskQueue:
    """Messages in ``directory``: segments ``000000.dat``, ``000001.dat``, … read in order.

    The read position survives a graceful close (``meta.json``); after a crash the queue
    starts again at the oldest segment left, so messages may be delivered twice, never lost.
    """

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        segments = sorted(int(p.stem) for p in directory.glob("[0-9]*.dat"))
        self._read_seg = segments[0] if segments else 0
        self._write_seg = segments[-1] if segments else 0
        self._read_pos = 0
        meta = directory / _META
        if meta.exists():
            saved = json.loads(meta.read_text())
            if saved.get("read_segment") in segments:
                self._read_seg, self._read_pos = saved["read_segment"], saved["read_pos"]
            meta.unlink()
        self._count = self._count_unread(segments)
        # Opened on the first push: an idle queue (most topics) holds no file open.
        self._writer: BinaryIO | None = None
        self._reader: BinaryIO | None = None
        self._dirty = False

    def _segment(self, n: int) -> Path:
        return self.directory / _SEGMENT.format(n)

    def _count_unread(self, segments: list[int]) -> int:
        count = 0
        for n in segments:
            if n < self._read_seg:
                self._segment(n).unlink()  # read before a crash: stale
                continue
            with self._segment(n).open("rb") as f:
                if n == self._read_seg:
                    f.seek(self._read_pos)
                while _read_record(f) is not None:
                    count += 1
        return count

    def __len__(self) -> int:
        return self._count

    def push(self, msg: Message) -> None:
        if self._writer is None:
            self._writer = self._segment(self._write_seg).open("ab")
        elif self._writer.tell() >= self.segment_bytes:
            self._writer.close()
            self._write_seg += 1
            self._writer = self._segment(self._write_seg).open("ab")
        self._writer.write(encode(msg))
        self._dirty = True
        self._count += 1

    def flush(self) -> None:
        """Hand buffered writes to the OS (a killed process then loses none of them)."""
        if self._dirty and self._writer is not None:
            self._writer.flush()
            self._dirty = False

    def pop(self) -> Message | None:
        while self._count:
            self.flush()
            if self._reader is None:
                self._reader = self._segment(self._read_seg).open("rb")
                self._reader.seek(self._read_pos)
            rec = _read_record(self._reader)
            if rec is not None:
                self._read_pos = self._reader.tell()
                self._count -= 1
                if not self._count:
                    self._reset()
                return rec[0]
            if self._read_seg >= self._write_seg:
                # Counted but unreadable: a record cut short by a crash. Forget it.
                self._count = 0
                self._reset()
                return None
            self._reader.close()
            self._reader = None
            self._segment(self._read_seg).unlink()
            self._read_seg += 1
            self._read_pos = 0
        return None

    def _reset(self) -> None:
        """Everything read: start over with one empty segment."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for p in self.directory.glob("[0-9]*.dat"):
            p.unlink()
        self._read_seg = self._write_seg = 0
        self._read_pos = 0
        self._dirty = False

    def clear(self) -> None:
        self._count = 0
        self._reset()

    # -- graceful shutdown --------------------------------------------------------------
    def save_head(self, records: list[tuple[Message, int | None]]) -> None:
        """Persist what the queue held in memory; the next start reads it first."""
        if records:
            write_records(self.directory / _HEAD, records)

    def take_head(self) -> list[tuple[Message, int | None]]:
        path = self.directory / _HEAD
        if not path.exists():
            return []
        records = list(read_records(path))
        path.unlink()
        return records

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._count:
            (self.directory / _META).write_text(
                json.dumps({"read_segment": self._read_seg, "read_pos": self._read_pos})
            )

    def remove(self) -> None:
        """Close and delete the queue's files (its topic or channel was deleted)."""
        with contextlib.suppress(OSError):
            if self._writer is not None:
                self._writer.close()
        if self._reader is not None:
            self._reader.close()
        for p in self.directory.iterdir():
            p.unlink()
        self.directory.rmdir()
