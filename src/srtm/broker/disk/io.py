"""The disk queue's file work and the thread it runs on.

The operations on segment files (writing a batch, reading ahead, fsync in the background,
atomic replacement, deleting) as plain functions, and ``DiskIO``, a broker's disk thread,
which runs them one at a time in the order asked so that the event loop never waits for
the disk.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import errno
import logging
import os
import queue
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from srtm.broker.disk.codec import (
    CHUNK,
    FILE_HEADER,
    CorruptRecord,
    decode_batch,
    encode,
    file_version,
    whole_records,
)
from srtm.broker.message import Message, Origin
from srtm.broker.queue import Record

log = logging.getLogger("srtm.broker.disk")

#: What a queue reads ahead on the disk thread at a time (about bytes).
READ_AHEAD_BYTES = 256 << 10
#: An inline write slower than this (ns) that waited in the kernel (the kernel throttled
#: it, the journal or a page lock held it: ``sleeps`` went up) sends every write to the
#: disk thread for a pause: the first ``INLINE_PAUSE_NS``, doubled for each slow one
#: within ``STRIKES_KEPT_NS`` of the last pause's end, up to ``MAX_INLINE_PAUSE_NS``. One
#: that never waited spent its time on the CPU, or lost its core to another task or to
#: the hypervisor: not the disk's doing, and the loop loses that time whatever it runs.
SLOW_INLINE_NS = 500_000
INLINE_PAUSE_NS = 50_000_000
MAX_INLINE_PAUSE_NS = 5_000_000_000
STRIKES_KEPT_NS = 10_000_000_000

#: Writes ``data`` at the end of the open file ``fd``; returns how many bytes it wrote.
Writer = Callable[[int, bytes | memoryview], int]

_syncer: concurrent.futures.ThreadPoolExecutor | None = None


_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


def thread_sleeps() -> int:
    """How often the calling thread has waited in the kernel (voluntary context switches;
    -1 where the OS does not count them per thread: every slow write then counts)."""
    if _RUSAGE_THREAD is None:
        return -1
    return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


def in_background(fn: Callable[[], None]) -> None:
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


def sync_and_close(fd: int) -> None:
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


def remove_dir(directory: Path) -> None:
    for p in directory.iterdir():
        p.unlink()
    directory.rmdir()


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


#: A write's result: the file's descriptor (None: it could not be opened), the bytes and
#: records written whole, the error that stopped it, whether taking a torn tail back failed.
WriteResult = tuple[int | None, int, int, OSError | None, bool]


def write_batch(
    write: Writer,
    directory: Path,
    path: Path,
    fd: int | None,
    end: int,
    header: int,
    data: bytes,
    count: int,
) -> WriteResult:
    """Append ``data`` (a file header of ``header`` bytes, then ``count`` version-2 records) to the
    segment ``path`` (opened if ``fd`` is None), which holds ``end`` good bytes. A failed
    write is taken back to its last whole record (``ftruncate`` needs no space)."""
    written = 0
    exc: OSError | None = None
    try:
        if fd is None:
            new = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if new:  # the file's name survives a power loss
                in_background(lambda: fsync_dir(directory))
        while written < len(data):
            n = write(fd, memoryview(data)[written:] if written else data)
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
        good, k = whole_records(data, header, written)
    truncate_failed = False
    if exc is not None and fd is not None:
        try:
            os.ftruncate(fd, end + good)
        except OSError:
            truncate_failed = True
    return fd, good, k, exc, truncate_failed


#: A read's result: the records, the offset after the last one, the error that stopped it
#: and whether the file could be opened.
ReadResult = tuple[list[Record], int, Exception | None, bool]


def read_batch(path: Path, pos: int, want: int, origin: Origin | None) -> ReadResult:
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
            version = file_version(f)
            if pos:
                f.seek(pos)
            start = end = f.tell()
            # One record (inline): a chunk; else the bytes wanted and the record crossing them.
            buf = f.read(CHUNK if want == 1 else READ_AHEAD_BYTES + CHUNK)
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
                more = f.read(max(CHUNK, len(rest)))
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

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        inline_bytes: int = 0,
        clock: Callable[[], int] = time.monotonic_ns,
        sleeps: Callable[[], int] = thread_sleeps,
    ) -> None:
        self.loop = loop
        #: A publish's overflow up to this size is written on the event loop when its file
        #: is open and idle (``DiskQueue.written``): into the page cache, a few
        #: microseconds, where this thread's hand-off costs two thread wake-ups on the
        #: acknowledgement's path (0: never).
        self.inline_bytes = inline_bytes
        self.clock, self.sleeps = clock, sleeps
        #: Until when (``clock``) no write runs inline, after a slow one; slow ones in a
        #: row (each within ``STRIKES_KEPT_NS`` of the last pause's end).
        self._inline_paused_until = 0
        self._strikes = 0
        #: Inline writes; the slow ones among them (``SLOW_INLINE_NS``) that waited in the
        #: kernel, and those that did not (no pause).
        self.inline_writes = self.slow_inline_writes = self.busy_inline_writes = 0
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        #: Work submitted whose completion has not run yet.
        self.outstanding = 0
        self._idle = asyncio.Event()
        self._idle.set()
        #: Set by ``quiesce``: queues then work inline (the graceful stop).
        self.closed = False
        #: What ``once_soon`` runs at the end of this loop turn, in order.
        self._soon: dict[Callable[[], None], None] = {}
        # A daemon, stopped (after the work queued) at a graceful stop or at exit, as an
        # executor's thread would be: an interpreter exit never waits for it forever.
        self._thread = threading.Thread(target=self._serve, name="srtm-disk_0", daemon=True)
        self._thread.start()
        atexit.register(self._stop)

    def inline_allowed(self, nbytes: int) -> bool:
        """Whether a write of ``nbytes`` may run on the event loop now: at most
        ``inline_bytes``, and not paused after a slow one."""
        return (
            0 < nbytes <= self.inline_bytes
            and not self.closed
            and self.clock() >= self._inline_paused_until
        )

    def write_inline(
        self, write: Writer, directory: Path, path: Path, fd: int | None, end: int,
        header: int, data: bytes, count: int,
    ) -> WriteResult:  # fmt: skip
        """``write_batch`` on the caller's thread (the event loop), now, timed."""
        started, sleeps = self.clock(), self.sleeps()
        try:
            return write_batch(write, directory, path, fd, end, header, data, count)
        finally:
            self.inline_took(self.clock() - started, sleeps)

    def once_soon(self, fn: Callable[[], None]) -> None:
        """``fn`` at the end of this loop turn, once however often asked meanwhile."""
        if not self._soon:
            self.loop.call_soon(self._run_soon)
        self._soon[fn] = None

    def _run_soon(self) -> None:
        soon, self._soon = self._soon, {}
        for fn in soon:
            try:
                fn()
            except Exception:  # the others still run (each was its own loop callback)
                log.exception("disk: a callback after the loop turn's writes failed")

    def inline_took(self, ns: int, sleeps_before: int) -> None:
        """An inline write took ``ns`` (``sleeps`` was ``sleeps_before`` as it began): a
        slow one that waited in the kernel pauses inline writes (Redis writes its log on
        its event loop the same way; the pause bounds how often the loop can wait for the
        disk, and grows while slow writes keep coming)."""
        self.inline_writes += 1
        if ns <= SLOW_INLINE_NS:
            return
        if sleeps_before >= 0 and self.sleeps() == sleeps_before:
            self.busy_inline_writes += 1
            return
        now = self.clock()
        in_a_row = now < self._inline_paused_until + STRIKES_KEPT_NS
        self._strikes = self._strikes + 1 if in_a_row else 1
        pause = min(MAX_INLINE_PAUSE_NS, INLINE_PAUSE_NS << min(self._strikes - 1, 16))
        self._inline_paused_until = now + pause
        self.slow_inline_writes += 1
        log.warning("a write to disk on the event loop took %.1f ms: writes go to the disk "
                    "thread for %g s", ns / 1e6, pause / 1e9)  # fmt: skip

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
