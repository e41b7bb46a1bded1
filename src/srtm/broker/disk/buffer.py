"""A disk queue's write buffer: records pushed and not written yet, encoded when pushed,
cut into batches for writing; and the publishes waiting for their records' write."""

from __future__ import annotations

import asyncio
import struct
from collections import deque

from srtm.broker.disk.codec import encode_batch, record_bytes, records_bytes
from srtm.broker.queue import Record

#: At most this many records per write (in whole pushes): a write's completion settles
#: its records on the event loop one by one, and a million one-byte messages of one MPUB
#: in one write stalled the loop for 50-70 ms there.
MAX_WRITE_RECORDS = 16_384


class WriteBuffer:
    """Pushed, not written yet, as records (their ``origin`` is settled once written),
    oldest first, and what they take on disk (``nbytes``, no file header).

    The records are encoded when pushed, as (records, bytes) chunks in order (``chunks``,
    covering the first ``encoded`` records): a write then only joins them (its encoding
    was done while the write before it ran). Used only while they cover every record."""

    __slots__ = ("chunks", "encoded", "nbytes", "records")

    def __init__(self) -> None:
        self.records: deque[Record] = deque()
        self.nbytes = 0
        self.chunks: deque[tuple[int, bytes]] = deque()
        self.encoded = 0

    def add(self, r: Record, encode: bool) -> None:
        """Push ``r`` (encoded now if ``encode``: writing works)."""
        self.records.append(r)
        if encode:
            self._encode([r], 1)
        self.nbytes += record_bytes(r)

    def extend(self, records: list[Record], encode: bool) -> None:
        """``add`` of each (an MPUB's overflow): one extend, one encoding."""
        self.records.extend(records)
        encoded = self._encode(records, len(records)) if encode else None
        # the length of their records, known once encoded
        self.nbytes += encoded if encoded is not None else records_bytes(records)

    def _encode(self, records: list[Record], n: int) -> int | None:
        """Encode the ``n`` records just pushed, if every one before them is encoded (while
        writing fails, what waits is encoded when written); their length (None: not
        encoded)."""
        if self.encoded + n != len(self.records):
            return None
        try:
            data = encode_batch(records)
        except (struct.error, OverflowError, ValueError):
            self.forget_encoded()  # encoded again when written: that write fails then
            return None
        self.chunks.append((n, data))
        self.encoded += n
        return len(data)

    def forget_encoded(self) -> None:
        """The chunks no longer line up with the records (some were taken, or a chunk was
        written in part): writes encode from the records until none is left."""
        self.chunks.clear()
        self.encoded = 0

    def batch(self, size: int, segment_bytes: int) -> tuple[bytes, int]:
        """The oldest records to write next, at the end of a segment of ``size`` bytes
        (file header included) that ends once it holds ``segment_bytes``: their encoding
        and how many they are (struct.error, OverflowError, ValueError: a field out of
        range)."""
        records = self.records
        count = len(records)
        lined_up = self.encoded == count
        if size + self.nbytes < segment_bytes and count <= MAX_WRITE_RECORDS:
            # All of it fits (the usual case): no loop per record; encoded when pushed.
            if lined_up:
                if len(self.chunks) == 1:  # one publish's (a PUB's): no join
                    return self.chunks[0][1], count
                return b"".join([data for _, data in self.chunks]), count
            return encode_batch(list(records)), count
        if lined_up:
            # What fits of what was encoded when pushed, in whole pushes (an MPUB's
            # overflow is one, so a segment may end past its size by one MPUB's body):
            # not a size per record (a segment holds 250,000 small ones, a quarter of a
            # second of work on the event loop).
            chunks: list[bytes] = []
            count = 0
            for n, data in self.chunks:
                if chunks and (size >= segment_bytes or count >= MAX_WRITE_RECORDS):
                    break
                chunks.append(data)
                count += n
                size += len(data)
            return b"".join(chunks), count
        batch: list[Record] = []
        for r in records:
            if batch and (size >= segment_bytes or len(batch) >= MAX_WRITE_RECORDS):
                break
            batch.append(r)
            size += record_bytes(r)
        return encode_batch(batch), len(batch)

    def take(self, k: int, nbytes: int) -> list[Record]:
        """The first ``k`` records are written (``nbytes`` on disk): out of the buffer."""
        self._take_encoded(k)
        records = self.records
        if k == len(records):
            done = list(records)
            records.clear()
            self.nbytes = 0
        else:
            popleft = records.popleft
            done = [popleft() for _ in range(k)]
            self.nbytes -= nbytes
        return done

    def _take_encoded(self, k: int) -> None:
        chunks = self.chunks
        if self.encoded != len(self.records):
            if chunks:
                self.forget_encoded()
            return
        while k and chunks and chunks[0][0] <= k:
            n = chunks.popleft()[0]
            k -= n
            self.encoded -= n
        if k:
            self.forget_encoded()

    def popleft(self) -> Record:
        """The oldest record, handed out from memory (not written)."""
        if self.chunks:
            self.forget_encoded()
        r = self.records.popleft()
        self.nbytes -= record_bytes(r)
        return r

    def clear(self) -> None:
        self.records.clear()
        self.forget_encoded()
        self.nbytes = 0


class WriteWaiters:
    """Publishes waiting for their records to leave the write buffer (written, or handed
    out from memory while writing fails), each for the first ``n`` records pushed."""

    __slots__ = ("_waiting", "pushed")

    def __init__(self) -> None:
        #: Records pushed so far.
        self.pushed = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def wait(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done once every record pushed so far is out of the buffer."""
        fut = loop.create_future()
        self._waiting.append((self.pushed, fut))
        return fut

    def resolve(self, left: int, everyone: bool) -> None:
        """``left`` records are still buffered: those waiting for none of them are done
        (``everyone``: all, whatever they wait for)."""
        if not self._waiting:
            return
        done = self.pushed - left
        keep = []
        for target, fut in self._waiting:
            if everyone or target <= done:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((target, fut))
        self._waiting = keep
