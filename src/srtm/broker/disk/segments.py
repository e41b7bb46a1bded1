"""A disk queue's files as it knows them: numbered segments read in order, the one
written, the head a graceful stop left, and the read position saved then.

What is counted at open (``Segments.load``) and what may go is decided here; the file
work itself (a delete, on the disk thread or inline) is the queue's, handed in as
``unlink``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from srtm.broker.disk.codec import FORMAT_VERSION, read_records, scan
from srtm.broker.disk.io import write_atomic, write_records
from srtm.broker.message import Message, Origin

log = logging.getLogger("srtm.broker.disk")

_SEGMENT = "{:06d}.dat"
_HEAD = "head.dat"
_META = "meta.json"
#: The number of the head file's ``Segment``.
HEAD_SEG = -1


@dataclass(slots=True)
class Segment:
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
    origin: Origin | None = None

    def skip_unread(self, exc: Exception) -> int:
        """Damaged since it was written or counted: what cannot be read is skipped (how
        many records, logged)."""
        lost = self.records - self.read
        log.error("%s: %s; %d records skipped", self.path, exc, lost)
        self.records = self.read
        return lost


class SegmentOrigin:
    """Where a popped message came from: settling it lets its segment go."""

    __slots__ = ("n", "segments")

    def __init__(self, segments: Segments, n: int) -> None:
        self.segments, self.n = segments, n

    def settle(self, k: int = 1) -> None:
        """``k`` copies are settled (a run of FINs settles them in one call)."""
        self.segments.settle(self.n, k)

    def share(self, n: int) -> None:
        """``n`` more copies must be settled before the segment can go (a fan-out)."""
        self.segments.settle(self.n, -n)


class Segments:
    """The segment files of the queue in ``directory``: ``000000.dat``, ``000001.dat``, …
    (``by_n``), of which ``write`` (the newest) takes the writes, and the head file. A
    file goes once all of it was read, everything read from it is settled, and it is
    not the one written."""

    def __init__(self, directory: Path, unlink: Callable[[Path], None]) -> None:
        self.directory = directory
        self.by_n: dict[int, Segment] = {}
        #: The head file while what was taken from it is not all settled.
        self.head: Segment | None = None
        #: A head was saved over it since (its file is not deleted then).
        self.head_replaced = False
        self._unlink = unlink
        #: The segment written to (set by ``start``).
        self.write: Segment

    def start(self, last: int) -> None:
        """Write to a new segment after ``last``: never append to a segment a crash may
        have left with a torn tail."""
        self.write = self.new(last + 1)

    def new(self, n: int) -> Segment:
        seg = self.by_n[n] = Segment(n, self.directory / _SEGMENT.format(n))
        return seg

    def origin(self, seg: Segment) -> Origin:
        """What every message read from ``seg`` carries (made once)."""
        if seg.origin is None:
            seg.origin = SegmentOrigin(self, seg.n)
        return seg.origin

    def load(self) -> tuple[int, int]:
        """Count what the segments hold, skipping what a saved read position says was
        read; returns the highest segment number found (-1: none) and the records not
        read yet."""
        directory = self.directory
        numbers = sorted(int(p.stem) for p in directory.glob("[0-9]*.dat"))
        start, start_pos = (numbers[0] if numbers else 0), 0
        meta = directory / _META
        if meta.exists():
            try:
                saved = json.loads(meta.read_text())
                if saved.get("read_segment") in numbers:
                    start, start_pos = int(saved["read_segment"]), int(saved["read_pos"])
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("%s: unreadable (%s); reading from the oldest segment", meta, exc)
            meta.unlink()
        unread = 0
        for n in numbers:
            path = directory / _SEGMENT.format(n)
            if n < start:
                path.unlink()  # read before a graceful stop
                continue
            records, problem = scan(path)
            if problem is not None:
                log.warning("%s: %s; the rest of the segment is skipped", path, problem)
                if not records:
                    continue  # nothing readable: left alone for a person to look at
            seg = self.new(n)
            seg.records = len(records)
            seg.end = records[-1][2] if records else 0
            if n == start and start_pos:
                seg.read = sum(1 for *_, after in records if after <= start_pos)
                seg.read_pos = start_pos
            unread += seg.records - seg.read
            if not seg.records - seg.read:
                self.by_n.pop(n)
                path.unlink()
        return (numbers[-1] if numbers else -1), unread

    def first_unread(self) -> Segment | None:
        return next((s for s in self.by_n.values() if s.read < s.records), None)

    # -- letting files go -------------------------------------------------------------------
    def settle(self, n: int, k: int) -> None:
        seg = self.head if n == HEAD_SEG else self.by_n.get(n)
        if seg is None:
            return  # cleared or removed meanwhile
        seg.outstanding -= k
        self.maybe_delete(seg)

    def maybe_delete(self, seg: Segment) -> None:
        if seg.outstanding > 0 or seg.read < seg.records or seg is self.write:
            return
        if seg.n == HEAD_SEG:
            self.head = None
            if self.head_replaced:
                return  # a new head has been saved over it
        else:
            self.by_n.pop(seg.n, None)
        self._unlink(seg.path)

    def rotate(self) -> None:
        """Writes go to a new segment; the old one is read, then deleted when settled."""
        old = self.write
        self.write = self.new(old.n + 1)
        if not old.records:
            self.by_n.pop(old.n)
            self._unlink(old.path)
        else:
            self.maybe_delete(old)

    def clear(self) -> None:
        """Delete every segment (their messages are dropped); writes go to a new one."""
        last = self.write.n
        for seg in self.by_n.values():
            self._unlink(seg.path)
        self.by_n.clear()
        self.start(last)

    def forget(self) -> None:
        """Forget every file (the queue's directory is being deleted)."""
        self.by_n.clear()
        self.head = None

    # -- the head ---------------------------------------------------------------------------
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
        self.head_replaced = True
        return True

    def take_head(self) -> list[tuple[Message, int | None]]:
        """What the last graceful stop held in memory. The file stays until every one of
        these messages is settled (a crash meanwhile reads it again)."""
        path = self.directory / _HEAD
        if not path.exists() or self.head is not None:
            return []
        records = list(read_records(path))
        if not records:
            path.unlink()
            return []
        seg = self.head = Segment(HEAD_SEG, path, len(records), 0, len(records))
        seg.outstanding = len(records)
        self.head_replaced = False
        for msg, _ in records:
            msg.origin = SegmentOrigin(self, HEAD_SEG)
        return records

    # -- graceful stop ----------------------------------------------------------------------
    def forget_read(self) -> None:
        """Forget what was read (the saved heads hold what of it is unsettled): delete the
        files read out and save where reading stopped in the first one left."""
        if self.head is not None and not self.head_replaced:
            with contextlib.suppress(FileNotFoundError):
                self.head.path.unlink()  # what it held is in some saved head now
        self.head = None
        first: Segment | None = None
        for seg in list(self.by_n.values()):
            if seg.read >= seg.records:
                self.by_n.pop(seg.n)
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
