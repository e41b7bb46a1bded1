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
import contextlib
import errno
import logging
import os
import struct
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import TypeVar

from srtm.broker.disk.ahead import READ_AHEAD_RECORDS, ReadAhead
from srtm.broker.disk.buffer import WriteBuffer, WriteWaiters
from srtm.broker.disk.codec import (
    FILE_HEADER,
    encode_batch,
)
from srtm.broker.disk.io import (
    DiskIO,
    ReadResult,
    Writer,
    WriteResult,
    close_quietly,
    in_background,
    read_batch,
    remove_dir,
    sync_and_close,
    unlink_quietly,
    write_batch,
)
from srtm.broker.disk.segments import Segment, Segments
from srtm.broker.message import Message
from srtm.broker.queue import Record, popleft_many

log = logging.getLogger("srtm.broker.disk")

DEFAULT_SEGMENT_BYTES = 16 << 20
#: Buffered pushes are written once they hold this many bytes (else at the next flush).
DEFAULT_FLUSH_BYTES = 256 << 10
#: A reader that catches up with the write segment moves writes to a new one only once
#: this one holds this much (or a full segment): a queue whose consumer keeps up would
#: otherwise create and delete a file per message. Its settled records go with it; a
#: kill -9 meanwhile delivers them again (duplicates, bounded by this).
CATCH_UP_ROTATE_BYTES = 16 << 10
_origins = itemgetter(7)
_T = TypeVar("_T")


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
        self._segments = Segments(directory, self._unlink)
        self._ahead = ReadAhead(self._segments)
        if self.threaded:
            # Made while serving: a new queue (restored ones are opened before serving),
            # so there is nothing to load; the directory is made on the disk thread, before
            # any write (its work runs in order).
            last = -1
            self._run(lambda: directory.mkdir(parents=True, exist_ok=True))
        else:
            directory.mkdir(parents=True, exist_ok=True)
            last, self._ahead.unread = self._segments.load()
        self._segments.start(last)
        self._wfd: int | None = None
        #: A write is running (on the disk thread); another one was asked for.
        self._writing = self._again = False
        self._failed_last = False
        #: Bumped when the queue's files go (clear, remove): late completions are ignored.
        self._gen = 0
        self._waiters = WriteWaiters()
        self._buffer = WriteBuffer()

    # -- size ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ahead) + len(self._buffer.records)

    @property
    def failing(self) -> bool:
        return self.error is not None

    @property
    def pending(self) -> int:
        """Messages pushed but not written yet."""
        return len(self._buffer.records)

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
        self._waiters.resolve(len(self._buffer.records), everyone)

    # -- write side -------------------------------------------------------------------------
    def push(self, msg: Message) -> None:
        """Queue ``msg`` at the back. Never fails: while writing fails it waits in memory
        (the broker refuses new publishes meanwhile)."""
        # Its fields, not the object: the caller may hand the same one to other queues.
        self._buffer.add(
            (msg.id, msg.body, msg.timestamp_ns, msg.arrival_ns, msg.release_ns, msg.attempts,
             msg.publisher, msg.origin),
            self.error is None,
        )  # fmt: skip
        self._waiters.pushed += 1
        self._pushed_more()

    def push_many(self, records: list[Record]) -> None:
        """``push`` of each (an MPUB's overflow): one extend, no ``Message`` per record."""
        self._buffer.extend(records, self.error is None)
        self._waiters.pushed += len(records)
        self._pushed_more()

    def put_inline(self, r: Record) -> bool:
        """``push`` of one fresh record and ``written`` (a sensor's PUB past memory), where
        that writes it on the event loop at once: nothing buffered, writing works, the
        write segment open, begun and with room, and ``DiskIO.inline_allowed`` (a write
        running keeps its records buffered until it is done). False, with nothing done,
        where it would not (``push`` takes it then). The caller has the queue's reader
        dispatched, as for a message kept in memory: no ``on_readable``."""
        io, fd = self.io, self._wfd
        if fd is None or io is None or io.closed or self.error is not None:
            return False
        seg = self._segments.write
        if self._buffer.records or not 0 < seg.end < self.segment_bytes:
            return False
        try:
            data = encode_batch([r])
        except (struct.error, OverflowError, ValueError):
            return False  # ``push`` keeps it; its write fails, as any
        size = len(data)
        if not io.inline_allowed(size):
            return False
        self._waiters.pushed += 1
        res = io.write_inline(self._write, self.directory, seg.path, fd, seg.end, 0, data, 1)
        if res[2] == 1:  # written whole
            origin = self._ahead.appended(seg, size, 1, self.threaded)
            if origin is not None:
                self._ahead.records.append((*r[:7], origin))
                self._caught_up(seg)
            return True
        # Not written: it waits in memory as the general way's would, the queue failing.
        self._buffer.add(r, False)
        self._unflushed.add(self)
        self._write_done(self._gen, fd, seg, res, True)
        return True

    def _pushed_more(self) -> None:
        self._unflushed.add(self)
        self._pushed_to.add(self)
        if self._buffer.nbytes >= self.flush_bytes and self.error is None:
            self.flush()

    def written(self) -> asyncio.Future[None] | None:
        """Have what is buffered written; a future done once everything pushed so far went
        through a write (None: nothing to wait for, or already written inline). A queue
        that is failing is not waited for (the housekeeping loop retries it).

        Written on the event loop, at once, where nothing can be reordered (the file is
        open, no write of this queue runs on the thread) and ``DiskIO.inline_allowed``
        (small, no slow one lately); else on the disk thread."""
        if not self._buffer.records or self.error is not None:
            return None
        io = self.io
        if io is None or io.closed:
            self.flush()
            return None
        inline = io.inline_allowed(self._buffer.nbytes) and not self._writing
        if inline and self._wfd is not None and self._segments.write.end < self.segment_bytes:
            self._start_write(inline=True)
            if not self._buffer.records or self.error is not None:
                return None
        fut = self._waiters.wait(io.loop)
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
            while self._buffer.records:
                self._start_write()
                if self.error is not None and self._failed_last:
                    return False
            self._all_written()
            return True
        if not self._buffer.records:
            self._all_written()
            return True
        self._start_write()
        return self.error is None

    def _all_written(self) -> None:
        self._buffer.nbytes = 0
        self._unflushed.discard(self)
        if self.error is not None:
            log.info("%s: writing again after %s", self.directory, self.error)
            self.error = None
            self._failing.discard(self)
        self._resolve_waiters(False)

    def _start_write(self, inline: bool = False) -> None:
        """Write the oldest buffered records (up to a segment's size) at the end of the
        write segment; they stay readable from the buffer until the write is done.
        ``inline``: on the caller's thread, now (see ``written``)."""
        if self._segments.write.end >= self.segment_bytes:
            self._rotate(sync=True)
        seg = self._segments.write
        header = b"" if seg.end else FILE_HEADER
        size = seg.end + len(header)
        self._writing = True
        self._again = False
        gen, fd, path, end = self._gen, self._wfd, seg.path, seg.end
        directory, write = self.directory, self._write
        # Encoded here, on the caller's thread: CPU work done on the disk thread only
        # contends for the GIL, and an acknowledgement waiting for this write waited
        # for that contention too (batched publishes ran at half speed).
        try:
            encoded, count = self._buffer.batch(size, self.segment_bytes)
        except (struct.error, OverflowError, ValueError) as e:  # a field out of range
            bad: WriteResult = (fd, 0, 0, OSError(errno.EINVAL, f"cannot encode: {e}"), False)
            self._run(lambda: bad, lambda res: self._write_done(gen, fd, seg, res))
            return
        data = header + encoded
        if inline:  # a publish's write, on the event loop (no closures)
            assert self.io is not None
            res = self.io.write_inline(write, directory, path, fd, end, len(header), data, count)
            self._write_done(gen, fd, seg, res, True)
            return

        def work() -> WriteResult:
            return write_batch(write, directory, path, fd, end, len(header), data, count)

        def done(res: WriteResult) -> None:
            self._write_done(gen, fd, seg, res)

        self._run(work, done)

    def _write_done(
        self, gen: int, fd: int | None, seg: Segment, res: WriteResult, inline: bool = False
    ) -> None:
        """Back from a write: count what is on disk; on an error keep the rest buffered.
        ``inline``: written in the middle of a publish, whose dispatch comes after it."""
        new_fd, good, k, exc, truncate_failed = res
        if gen != self._gen:  # cleared or removed meanwhile: its files are going
            if new_fd is not None and new_fd != fd:
                self._run(lambda: close_quietly(new_fd))
            return
        self._writing = False
        self._wfd = new_fd
        filled = self._written(seg, good, k)
        self._failed_last = exc is not None
        if exc is not None:
            if truncate_failed:
                self._rotate(sync=False)  # the file may end on a torn record
            wseg = self._segments.write
            if wseg.records and (exc.errno == errno.EFBIG or wseg.read >= wseg.records):
                # This file cannot grow, or all of it was read (its settled records can
                # free space once it goes): the next try starts a new one.
                self._rotate(sync=False)
            self._failed(exc)
            self._again = False
            self._resolve_waiters(True)  # acknowledged as before; the topic now refuses
        else:
            if filled:
                self._caught_up(self._segments.write)
            if not self._buffer.records:
                self._all_written()
            else:
                self._resolve_waiters(False)
                # A publish waiting for its records (``written``) is not left for the
                # next flush: a write takes at most a segment, so its records may need more.
                if self.threaded and (
                    self._again
                    or self._waiters
                    or self.error is not None
                    or self._buffer.nbytes >= self.flush_bytes
                ):
                    self._start_write()
        if k and self.threaded and self._on_readable is not None:
            if not inline:
                self._on_readable()
            else:  # after the publish that wrote: once for all of this loop turn's
                assert self.io is not None
                self.io.once_soon(self._on_readable)

    def _written(self, seg: Segment, size: int, k: int) -> bool:
        """``k`` buffered records (``size`` bytes with the file header) are on disk now.
        A reader that has read everything before them takes them as read from memory (no
        read back); returns whether it did."""
        # The records' own bytes (the buffer's ``nbytes`` counts no file header).
        records_size = size - len(FILE_HEADER) if seg.end == 0 and size else size
        origin = self._ahead.appended(seg, size, k, self.threaded)
        done = self._buffer.take(k, records_size)
        for settled in filter(None, map(_origins, done)):
            settled.settle()  # durable here now: its own segment may go
        if origin is not None:
            self._ahead.records.extend([(*r[:7], origin) for r in done])
        return origin is not None

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            log.error("%s: cannot write (%s): %d messages wait in memory; publishes to this "
                      "topic are refused until a write succeeds", self.directory, exc,
                      len(self._buffer.records))  # fmt: skip
        self.error = exc
        self._failing.add(self)

    def _rotate(self, sync: bool) -> None:
        """Close the write segment and start a new one (the old one is read, then deleted
        when settled)."""
        fd, self._wfd = self._wfd, None
        if fd is not None:
            if sync:  # a full segment: made durable (and closed) in the background
                in_background(lambda: sync_and_close(fd))
            else:
                self._run(lambda: close_quietly(fd))
        self._segments.rotate()

    def _unlink(self, path: Path) -> None:
        self._run(lambda: unlink_quietly(path))

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
        ahead = self._ahead.records
        out: list[Record] = []
        while len(out) < n:
            if ahead:
                out += popleft_many(ahead, n - len(out))
                continue
            r = self._pop_record()
            if r is None:
                break
            out.append(r)
        if self._ahead.low:
            self._read_more()
        return out

    def _pop_record(self) -> Record | None:
        ahead = self._ahead.records
        if self._ahead.low:
            self._read_more()
        if ahead:
            return ahead.popleft()
        if self._ahead.unread or self._writing:
            return None  # being read, or being written (then read from memory)
        pending = self._buffer.records
        if pending and pending[0][7] is None and self.error is None:
            self.flush()
            if self.threaded:
                return None
            return self._pop_record()
        if pending:
            r = self._buffer.popleft()
            self._resolve_waiters(False)
            return r
        return None

    def _read_more(self) -> None:
        """Read the next records of the oldest segment not read out (inline, or on the
        disk thread: ``on_readable`` then tells the broker)."""
        if self._ahead.reading:
            return
        seg = self._segments.first_unread()
        if seg is None:
            self._ahead.unread = 0
            return
        self._ahead.reading = True
        gen, want, path, pos = self._gen, seg.records - seg.read, seg.path, seg.read_pos
        threaded = self.threaded
        origin = self._segments.origin(seg)

        def work() -> ReadResult:
            # inline: one record at a time (nothing read ahead that a close would forget)
            return read_batch(path, pos, min(want, READ_AHEAD_RECORDS if threaded else 1), origin)

        def done(res: ReadResult) -> None:
            self._read_done(gen, seg, res)

        self._run(work, done)

    def _read_done(self, gen: int, seg: Segment, res: ReadResult) -> None:
        msgs, end, exc, opened = res
        if gen != self._gen:
            return
        ahead = self._ahead
        ahead.reading = False
        if msgs:  # records carrying ``seg.origin``
            ahead.read(seg, msgs, end)
        if exc is not None:
            ahead.stopped(seg, exc, opened, self.directory)
        else:
            ahead.open_failed = False
        if seg.read >= seg.records:
            self._done_reading(seg)
        if self.threaded:
            if msgs and self._on_readable is not None:
                self._on_readable()
            elif not msgs and ahead.unread and not ahead.open_failed:
                self._read_more()  # skipped a damaged segment: the next one

    def _done_reading(self, seg: Segment) -> None:
        if seg is self._segments.write:
            self._caught_up(seg)
        else:
            self._segments.maybe_delete(seg)

    def _caught_up(self, seg: Segment) -> None:
        if not self._writing and seg.end >= min(self.segment_bytes, CATCH_UP_ROTATE_BYTES):
            self._rotate(sync=False)  # caught up: let this segment go once settled

    def read_ahead(self) -> list[Message]:
        """What was read from the segments and not popped yet (saved with the head at a
        graceful stop: it counts as read)."""
        return self._ahead.messages()

    # -- dropping and deleting ---------------------------------------------------------------
    def _forget_files(self) -> None:
        """The queue's files are going: work still running for them is ignored when done,
        and publishes waiting for a write are answered."""
        self._gen += 1
        self._writing = self._ahead.reading = self._again = False
        fd, self._wfd = self._wfd, None
        if fd is not None:
            self._run(lambda: close_quietly(fd))
        self._ahead.records.clear()
        self._resolve_waiters(True)

    def clear(self) -> None:
        """Drop everything queued (what was popped before stays with its holders)."""
        self._forget_files()
        for origin in filter(None, map(_origins, self._buffer.records)):
            origin.settle()
        self._buffer.clear()
        self._segments.clear()
        self._ahead.unread = 0
        if self.error is not None:
            self.error = None
            self._failing.discard(self)

    # -- graceful shutdown ------------------------------------------------------------------
    def save_head(self, records: list[tuple[Message, int | None]]) -> bool:
        """Persist what the queue held in memory; the next start reads it first.
        False (logged) if it could not be written."""
        return self._segments.save_head(records)

    def take_head(self) -> list[tuple[Message, int | None]]:
        """What the last graceful stop held in memory. The file stays until every one of
        these messages is settled (a crash meanwhile reads it again)."""
        return self._segments.take_head()

    def close(self, forget_read: bool = True) -> bool:
        """Graceful stop, after every queue's head was saved: write what is buffered, then
        with ``forget_read`` forget what was read (the saved heads hold what of it is
        unsettled). False if the buffer could not be written (logged; nothing read is
        forgotten then: the next start reads those segments again)."""
        written = self.flush()
        if not written:
            log.error("%s: %d acknowledged messages could not be written: %s",
                      self.directory, len(self._buffer.records), self.error)  # fmt: skip
        if self._wfd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._wfd)
            os.close(self._wfd)
            self._wfd = None
        if not written or not forget_read:
            return written
        self._segments.forget_read()
        return True

    def remove(self) -> None:
        """Close and delete the queue's files (its topic or channel was deleted)."""
        self._forget_files()
        self._failing.discard(self)
        self._unflushed.discard(self)
        self._buffer.clear()
        self._segments.forget()
        self._run(lambda: remove_dir(self.directory))
