"""A disk queue's read side: what it read from its segments, or took from memory as it
was written, and has not handed out yet; and how much its segments hold unread."""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

from srtm.broker.disk.codec import CorruptRecord
from srtm.broker.disk.io import READ_AHEAD_BYTES
from srtm.broker.disk.segments import Segment, Segments
from srtm.broker.message import Message, Origin
from srtm.broker.queue import Record

log = logging.getLogger("srtm.broker.disk")

#: What a queue reads ahead on the disk thread at a time (records; about
#: ``READ_AHEAD_BYTES``), and how few read records left make it read the next ones.
READ_AHEAD_RECORDS = 4096
READ_AHEAD_LOW = 256


class ReadAhead:
    """The records read ahead (counted as read, not settled), oldest first, each carrying
    its segment's origin; the records on disk not read yet; whether a read runs (on the
    disk thread); whether the last one could not open its segment."""

    __slots__ = ("_segments", "open_failed", "reading", "records", "unread")

    def __init__(self, segments: Segments) -> None:
        self._segments = segments
        self.records: deque[Record] = deque()
        self.unread = 0
        self.reading = self.open_failed = False

    def __len__(self) -> int:
        return self.unread + len(self.records)

    @property
    def low(self) -> bool:
        """Few records left read ahead, and more on disk: time to read the next ones."""
        return len(self.records) <= READ_AHEAD_LOW and self.unread != 0

    def appended(self, seg: Segment, size: int, k: int, threaded: bool) -> Origin | None:
        """``k`` records (``size`` bytes) were appended to ``seg``: counted there, and as
        read (the origin they then carry, returned) where a reader that has read
        everything before them takes them from memory (no read back); else as unread.
        The caller adds them to ``records`` with that origin."""
        seg.end += size
        seg.records += k
        fill = (
            k > 0
            and threaded
            and self.unread == 0
            and not self.reading
            and seg.read == seg.records - k
            # a reader keeping up, and memory bounded: else they are read back later
            and len(self.records) < READ_AHEAD_LOW
            and k <= READ_AHEAD_RECORDS
            and size <= READ_AHEAD_BYTES
        )
        if not fill:
            self.unread += k
            return None
        self._read(seg, k, seg.end)
        return self._segments.origin(seg)

    def read(self, seg: Segment, records: list[Record], end: int) -> None:
        """A read of ``seg`` up to ``end`` gave ``records`` (carrying its origin)."""
        self._read(seg, len(records), end)
        self.unread -= len(records)
        self.records.extend(records)

    def stopped(self, seg: Segment, exc: Exception, opened: bool, directory: Path) -> None:
        """A read of ``seg`` stopped on ``exc``. A segment that cannot be opened now (out
        of descriptors, memory) has nothing read yet, nor anything behind it (FIFO): the
        next pop tries again. One missing or damaged is skipped."""
        if not opened and not isinstance(exc, (FileNotFoundError, CorruptRecord)):
            if not self.open_failed:
                log.warning("%s: cannot open a segment (%s); retrying", directory, exc)
            self.open_failed = True
        else:
            self.unread -= seg.skip_unread(exc)

    def _read(self, seg: Segment, n: int, end: int) -> None:
        seg.read += n
        seg.read_pos = end
        seg.outstanding += n

    def messages(self) -> list[Message]:
        """What was read and not handed out (saved with the head at a graceful stop: it
        counts as read)."""
        return [Message(*r) for r in self.records]
