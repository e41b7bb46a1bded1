"""What a broker keeps across restarts, under ``data_dir``.

Each durable queue (a topic's held, shaping and deferred queues, each channel's)
overflows to a disk queue, ``queues/q-<key>``, made on first need; ``meta.json`` lists
the topics, channels, pauses and buckets, the relay's routes (``srtm.broker.routes``: a
restarted broker forwards and replicates before the controller sets them again), and the
next message id. At a graceful stop everything held in memory is written to the disk
queues (their *head*); a restart reads it all back. Topics and channels themselves stay
the broker's: it hands their registry in (``Registry``) and rebuilds it from what
``Persistence.load`` finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from srtm.broker.disk import DiskIO, DiskQueue, Reserve
from srtm.broker.message import Message, MessageIds
from srtm.broker.options import BrokerOptions
from srtm.broker.queue import MessageQueue, Record
from srtm.broker.routes import RouteTable, TopicRoute, saved_route
from srtm.broker.state import UNBOOKED, Channel, Topic
from srtm.protocol import ProtocolError, errors, is_ephemeral, is_valid_name

log = logging.getLogger("srtm.broker")
_META = "meta.json"
_FOREVER = 2**63 - 1
#: Queues written at once at a graceful stop.
_PERSIST_THREADS = 32


def _queue_dir(data_dir: Path, key: str) -> Path:
    # Names may be "." or "..": a prefix keeps every key a plain file name.
    return data_dir / "queues" / f"q-{key}"


def _meta_doc(
    topics: list[Topic], ids: MessageIds, routes: list[TopicRoute] | None = None
) -> dict[str, Any]:
    """Topics, channels, pauses and buckets, and routes: what ``meta.json`` holds. Safe in
    a thread while the loop runs: it only reads attributes and copies dicts (atomic under
    the GIL); a change made meanwhile marks the metadata dirty again, so another write
    follows. A route's grace is kept as what it has left at ``saved_at_s`` (wall clock:
    the next start counts the time the broker was down)."""
    docs = []
    for topic in topics:
        if topic.ephemeral:
            continue
        bucket = topic.bucket
        channels = list(topic.channels.values())
        docs.append(
            {
                "name": topic.name,
                "paused": topic.paused,
                "bucket": None if bucket is None else {"rate": bucket.rate, "burst": bucket.burst},
                "held": topic.on_hold,
                "bound": None
                if (bound := topic.bound) is None
                else {"max_wait_ms": bound.max_wait_ms, "overflow": bound.overflow.value},
                "channels": [
                    {"name": ch.name, "paused": ch.paused} for ch in channels if not ch.ephemeral
                ],
            }
        )
    now_s, saved_at_s = time.monotonic(), time.time()
    kept = [
        d
        for r in routes or ()
        if not is_ephemeral(r.topic) and (d := saved_route(r, now_s)) is not None
    ]
    return {
        "version": 1,
        "next_id": ids.last + 1,
        "topics": docs,
        "routes": kept,
        "saved_at_s": saved_at_s,
    }


def _write_meta(
    path: Path, topics: list[Topic], ids: MessageIds, routes: list[TopicRoute] | None = None
) -> None:
    _write_durably(path, _meta_doc(topics, ids, routes))


def _write_durably(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as JSON to ``path`` so that a crash leaves the old file or the new
    one, never an empty one: the data reaches the disk before the rename, and the rename
    before this returns. Blocking: run it in a thread while the loop serves."""
    data = json.dumps(doc).encode()  # no indent: the C encoder, 10 times faster
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan_queue_dirs(data_dir: Path) -> dict[str, list[str]]:
    """Topic -> its channels, as the queue directories name them (in name order): what
    a broker whose ``meta.json`` is lost, stale or corrupt still knows it had."""
    found: dict[str, list[str]] = {}
    root = data_dir / "queues"
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        if not path.is_dir() or not path.name.startswith("q-"):
            continue
        # ":" and "@" are never part of a valid name, so the key splits unambiguously.
        topic, _, channel = path.name[2:].split("@")[0].partition(":")
        if not is_valid_name(topic) or (channel and not is_valid_name(channel)):
            log.warning("ignoring %s: not a queue directory this broker makes", path)
            continue
        channels = found.setdefault(topic, [])
        if channel and channel not in channels:
            channels.append(channel)
    return found


class LazyDisk:
    """A durable queue's ``DiskQueue``, made on first need (an overflow, a graceful stop
    with messages in memory, a restart): a new topic then costs no directory, no file
    and no disk I/O on the event loop, however many names clients invent."""

    def __init__(
        self,
        data_dir: Path,
        key: str,
        segment_bytes: int,
        failing: set[DiskQueue],
        unflushed: set[DiskQueue],
        io: Callable[[], DiskIO | None] = lambda: None,
        on_readable: Callable[[], None] | None = None,
        pushed: set[DiskQueue] | None = None,
    ) -> None:
        self._data_dir, self._key = data_dir, key
        self._segment_bytes, self._failing, self._unflushed = segment_bytes, failing, unflushed
        #: The broker's disk thread once it serves (None before: the restore is inline).
        self._io, self._on_readable, self._pushed = io, on_readable, pushed
        self._disk: DiskQueue | None = None

    @property
    def directory(self) -> Path:
        return _queue_dir(self._data_dir, self._key)

    @property
    def opened(self) -> bool:
        return self._disk is not None

    def open(self) -> DiskQueue:
        if self._disk is None:
            self._disk = DiskQueue(
                self.directory,
                self._segment_bytes,
                failing=self._failing,
                unflushed=self._unflushed,
                io=self._io(),
                pushed=self._pushed,
                on_readable=self._on_readable,
            )
        return self._disk

    def attach(self, io: DiskIO) -> None:
        """The broker serves now: a queue opened before (restored) uses its disk thread."""
        if self._disk is not None:
            self._disk.io = io

    # the Overflow protocol (MessageQueue's backend)
    def push(self, msg: Message) -> None:
        self.open().push(msg)

    def push_many(self, records: list[Record]) -> None:
        self.open().push_many(records)

    def put_inline(self, r: Record) -> bool:
        return self._disk is not None and self._disk.put_inline(r)

    def pop(self) -> Message | None:
        return None if self._disk is None else self._disk.pop()

    def pop_records(self, n: int) -> list[Record]:
        return [] if self._disk is None else self._disk.pop_records(n)

    def __len__(self) -> int:
        return 0 if self._disk is None else len(self._disk)

    def clear(self) -> None:
        if self._disk is not None:
            self._disk.clear()

    def read_ahead(self) -> list[Message]:
        return [] if self._disk is None else self._disk.read_ahead()

    # what the broker itself asks of a disk queue
    @property
    def error(self) -> OSError | None:
        return None if self._disk is None else self._disk.error

    def flush(self) -> bool:
        return True if self._disk is None else self._disk.flush()

    def written(self) -> asyncio.Future[None] | None:
        return None if self._disk is None else self._disk.written()

    def save_head(self, records: list[tuple[Message, int | None]]) -> bool:
        return self.open().save_head(records) if records else True

    def take_head(self) -> list[tuple[Message, int | None]]:
        return [] if self._disk is None else self._disk.take_head()

    def close(self, forget_read: bool = True) -> bool:
        return True if self._disk is None else self._disk.close(forget_read)

    def remove(self) -> None:
        if self._disk is not None or self.directory.exists():
            self.open().remove()


@dataclass(frozen=True)
class SavedChannel:
    name: str
    paused: bool = False


@dataclass(frozen=True)
class SavedTopic:
    """A topic as the last run left it: from ``meta.json``, or only its directories."""

    name: str
    paused: bool = False
    #: As saved ({"rate", "burst"}), unchecked: a bad one is logged when applied.
    bucket: Any = None
    channels: list[SavedChannel] = field(default_factory=list)
    #: Managed with no share here (``Topic.on_hold``).
    held: bool = False
    #: As saved ({"max_wait_ms", "overflow"}), unchecked: a bad one is logged when applied.
    bound: Any = None


@dataclass(frozen=True)
class Saved:
    """What a restart finds under ``data_dir``."""

    next_id: int
    topics: list[SavedTopic]
    #: The routes as ``saved_route`` kept them (unchecked: ``restored_route`` checks).
    routes: list[Any] = field(default_factory=list)
    #: When they were saved (``time.time`` s; None: not known).
    saved_at_s: float | None = None


class Registry(Protocol):
    """What ``meta.json`` describes: the broker's topics and the next message id."""

    @property
    def topics(self) -> dict[str, Topic]: ...

    @property
    def ids(self) -> MessageIds: ...


class Persistence:
    """The broker's durable side: the disk queues (made on first need, one per durable
    queue key), ``meta.json`` (written in a thread as topics and channels change), what a
    restart finds, and the save of everything held in memory at a graceful stop.

    ``readable(key)`` is called when the disk queue of ``key`` has records ``pop`` can
    give (read back, or written after a failure): its owner dispatches again.
    """

    def __init__(
        self, options: BrokerOptions, registry: Registry, readable: Callable[[str], None]
    ) -> None:
        self._options, self._registry, self._readable = options, registry, readable
        self.data_dir = options.data_dir
        self.disks: dict[str, LazyDisk] = {}
        #: Disk queues whose last write failed (disk full...): their topics refuse PUBs.
        self.failing: set[DiskQueue] = set()
        #: Disk queues with pushes not written yet (see write_through).
        self._unflushed: set[DiskQueue] = set()
        #: The disk thread of the queues while serving (see DiskIO).
        self._io: DiskIO | None = None
        #: Disk queues pushed to by the publish running (what its OK waits for).
        self.pushed: set[DiskQueue] = set()
        self._reserve = Reserve(options.data_dir, options.disk_reserve_bytes)
        #: Set while the broker rebuilds its topics from what ``load`` found: queues read
        #: back what they hold, limits and metadata writes wait.
        self.restoring = False
        #: Metadata changed since the last write; at most one write in flight, in a
        #: thread, so N new topics cost a few writes, not N (each O(N)) on the loop.
        self._meta_dirty = False
        self._meta_task: asyncio.Task[None] | None = None
        self._stopping = False
        #: meta.json writes done (tests and /stats-style curiosity).
        self.meta_writes = 0
        #: The relay's routes, saved with the rest (the relay hands its table in).
        self.routes = RouteTable()

    # -- queues --------------------------------------------------------------------------
    def queue(self, key: str) -> MessageQueue:
        """Keys are ``topic``, ``topic@shaping``, ``topic@deferred`` or ``topic:channel``;
        a queue is durable unless its topic or channel is ephemeral (those are never
        persisted)."""
        mem = self._options.mem_queue_size
        if any(is_ephemeral(part) for part in re.split("[:@]", key)):
            return MessageQueue(mem)
        disk = LazyDisk(
            self.data_dir,
            key,
            self._options.max_bytes_per_file,
            self.failing,
            self._unflushed,
            lambda: self._io,
            lambda: self._readable(key),
            self.pushed,
        )
        if self.restoring and disk.directory.is_dir():
            disk.open()  # what an earlier run left there is read back now
        self.disks[key] = disk
        return MessageQueue(mem, disk)

    def remove(self, key: str) -> None:
        disk = self.disks.pop(key, None)
        if disk is not None:
            disk.remove()

    def write_through(self) -> asyncio.Future[Any] | None:
        """Write what this publish overflowed to disk before it is acknowledged: its OK
        then means the OS holds it, so it survives kill -9 (as with nsqd, one write per
        publish that overflows, or fewer: publishes arriving while one is written go
        together in the next). The writes run on the disk thread; the future returned is
        done when they are (None: written inline, or nothing to write)."""
        if len(self.pushed) == 1:  # the usual case: one queue (a PUB's channel)
            return self.pushed.pop().written()
        waits = []
        pushed = list(self.pushed)
        self.pushed.clear()  # the same set: the queues hold it
        for disk in pushed:
            # a failing one is not waited for: the housekeeping loop retries it
            if (fut := disk.written()) is not None:
                waits.append(fut)
        if not waits:
            return None
        return waits[0] if len(waits) == 1 else asyncio.gather(*waits)

    def refuse_if_failing(self, topic: Topic, what: str) -> None:
        """E_PUB_FAILED while a disk queue of ``topic`` cannot write (disk full...): what
        was acknowledged waits in memory, and nothing more is taken until writing works."""
        keys = [topic.name, f"{topic.name}@shaping", f"{topic.name}@deferred"]
        keys += [f"{topic.name}:{name}" for name in topic.channels]
        for key in keys:
            disk = self.disks.get(key)
            if disk is not None and disk.error is not None:
                raise ProtocolError(
                    errors.E_PUB_FAILED, f"{what} failed: cannot write to disk ({disk.error})"
                )

    @property
    def io(self) -> DiskIO | None:
        """The disk thread, once the broker serves (its counts of inline writes)."""
        return self._io

    # -- serving -------------------------------------------------------------------------
    def serve(self) -> None:
        """The broker serves now (after the restore): hold the disk reserve, and from now
        on run the disk queues' file work on a thread of their own."""
        self._reserve.claim()  # after the restore: it may need the space first
        self._io = DiskIO(asyncio.get_running_loop(), self._options.disk_inline_write_bytes)
        for disk in self.disks.values():
            disk.attach(self._io)

    async def housekeep(self) -> None:
        """Every second: like nsqd's sync every 2 s, overflowed messages reach the OS; the
        disk reserve is claimed again if space came back since the start."""
        for disk in list(self.disks.values()):
            disk.flush()
        if not self._reserve.held and not self.failing:
            # fallocate may take a while: a thread
            await asyncio.to_thread(self._reserve.claim, True)

    # -- metadata ------------------------------------------------------------------------
    @property
    def meta_pending(self) -> bool:
        """A metadata write is due or in flight."""
        return self._meta_dirty or self._meta_task is not None

    def save_meta(self) -> None:
        """Metadata changed: have it written (as nsqd does, so that after a crash the disk
        queues are found again), soon and in a thread; a burst of changes is one write.
        Without a running loop it is written at once."""
        if self.restoring:
            return
        self._meta_dirty = True
        if self._meta_task is not None or self._stopping:
            return  # the writer in flight goes round again; stop() writes the last one
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._meta_dirty = False
            reg = self._registry
            _write_meta(self.data_dir / _META, list(reg.topics.values()), reg.ids, self._routes())
            self.meta_writes += 1
            return
        self._meta_task = loop.create_task(self._meta_writer(), name="srtm-meta")

    async def _meta_writer(self) -> None:
        path = self.data_dir / _META
        try:
            while self._meta_dirty and not self._stopping:
                self._meta_dirty = False
                # Only the list is taken on the loop; the document (20 ms for 10,000
                # topics) is made in the thread, which yields the GIL every 5 ms.
                topics, routes = list(self._registry.topics.values()), self._routes()
                try:
                    ids = self._registry.ids
                    await asyncio.to_thread(_write_meta, path, topics, ids, routes)
                    self.meta_writes += 1
                except Exception:
                    # Never fatal: queues still find their directories on the next start
                    # (load), and the graceful stop writes once more.
                    log.exception("could not write %s; retrying in 1 s", path)
                    self._meta_dirty = True
                    await asyncio.sleep(1.0)
        finally:
            self._meta_task = None

    def _routes(self) -> list[TopicRoute]:
        return list(self.routes.routes.values())

    # -- restart -------------------------------------------------------------------------
    def load(self) -> Saved:
        """The topics and channels the last run had: those ``meta.json`` lists, then those
        only a queue directory still tells of (a crash before the metadata was written)."""
        meta = self._read_meta()
        found = _scan_queue_dirs(self.data_dir)
        next_id = meta.get("next_id", 0)
        entries: list[dict[str, Any]] = [
            t for t in meta.get("topics", []) if isinstance(t, dict) and _valid(t.get("name"))
        ]
        known = {t["name"] for t in entries}
        entries += [{"name": name} for name in found if name not in known]
        routes = meta.get("routes")
        routes = routes[: self._options.max_topics] if isinstance(routes, list) else []
        saved_at = meta.get("saved_at_s")
        if isinstance(saved_at, bool) or not isinstance(saved_at, int | float):
            saved_at = None
        return Saved(
            next_id if isinstance(next_id, int) else 0,
            [_saved_topic(t, found.get(t["name"], [])) for t in entries],
            routes,
            None if saved_at is None else float(saved_at),
        )

    def _read_meta(self) -> dict[str, Any]:
        """``meta.json``, or an empty one if it is missing, empty or corrupt (logged: the
        queue directories then tell which topics and channels there were)."""
        path = self.data_dir / _META
        if not path.exists():
            return {}
        try:
            meta = json.loads(path.read_bytes())
            if not isinstance(meta, dict) or not isinstance(meta.get("topics", []), list):
                raise ValueError("not a metadata document")
            return meta
        except (OSError, ValueError) as exc:
            log.error(
                "%s is unreadable (%s): recovering topics from the queue directories", path, exc
            )
            return {}

    def restore_channel(self, ch: Channel) -> None:
        """What ``ch`` held in memory at the last stop, back in its queue and timers."""
        head = self.disks[f"{ch.topic}:{ch.name}"].take_head()
        ch.queue.extendleft([m for m, due in head if due is None])
        for msg, due in head:
            if due is not None:
                ch.defer(msg, due)

    def restore_topic(self, topic: Topic) -> None:
        """What ``topic`` itself held (for its first channel, or waiting for tokens)."""
        held = self.disks[topic.name].take_head()
        topic.held.extendleft([m for m, due in held if due is None])
        # What waited, deferred, for a first channel is shaped when due, as DPUBs are.
        deferred = [m for m, _ in self.disks[f"{topic.name}@deferred"].take_head()]
        for msg, due in held:
            if due is not None:
                msg.release_ns = due
                deferred.append(msg)
        topic.deferred.restore(deferred)
        shaping = [m for m, _ in self.disks[f"{topic.name}@shaping"].take_head()]
        for msg in shaping:
            msg.release_ns = UNBOOKED  # booked on the old run's bucket
        topic.shaping.extendleft(shaping)
        if topic.channels and topic.held:
            first = next(iter(topic.channels.values()))
            for msg in topic.held.drain():
                first.put(msg)

    # -- graceful stop -------------------------------------------------------------------
    async def stop_meta_writes(self) -> None:
        """No more writes in the background; one in flight finishes (the final one, in
        ``persist``, must not race its rename)."""
        self._stopping = True
        if self._meta_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._meta_task)

    async def persist(self) -> list[str]:
        """Graceful stop: once the disk thread's work has ended, what every durable queue
        holds in memory, then the metadata, inline (see ``_save_all``). Returns the keys
        that could not be written (and ``meta.json`` if it could not)."""
        if self._io is not None:
            await self._io.quiesce()
        return self._save_all()

    def _save_all(self) -> list[str]:
        """The disk reserve goes first, so that on a full disk the heads still fit. Each
        queue is written on its own, in a pool of threads (one fsync per file, and a
        journaling file system commits concurrent ones together: 16 times faster here for
        thousands of topics); one that cannot be written (a full disk, a value out of
        range) is logged and skipped, never costing another queue its messages. A queue
        forgets what it read only once every head and buffer is saved (else the next
        start reads it again: duplicates, not losses)."""
        self._reserve.release()
        topics = self._registry.topics
        heads: dict[str, list[tuple[Message, int | None]]] = {}
        for topic in list(topics.values()):
            if topic.ephemeral:
                continue
            for key, head in topic.head():
                heads[key] = head
            for ch in topic.channels.values():
                if not ch.ephemeral:
                    heads[f"{topic.name}:{ch.name}"] = ch.head()
        keys = [k for k, disk in self.disks.items() if heads.get(k) or disk.opened]
        failed: list[str] = []
        if keys:
            with ThreadPoolExecutor(_PERSIST_THREADS, thread_name_prefix="srtm-persist") as pool:
                saved = pool.map(lambda key: self._save_head(key, heads.get(key, [])), keys)
                failed = [key for key, ok in zip(keys, saved, strict=True) if not ok]
                # every buffer written before any queue forgets what it read
                flushed = pool.map(lambda key: self.disks[key].flush(), keys)
                failed += [key for key, ok in zip(keys, flushed, strict=True) if not ok]
                forget = not failed
                closed = pool.map(lambda key: self._close_queue(key, forget), keys)
                failed += [key for key, ok in zip(keys, closed, strict=True) if not ok]
        self.disks.clear()
        try:
            _write_meta(
                self.data_dir / _META, list(topics.values()), self._registry.ids, self._routes()
            )
            self.meta_writes += 1
        except Exception:
            log.exception("could not write %s", _META)
            failed.append(_META)
        if failed:
            failed = sorted(set(failed))
            log.error("stopped; %d queue(s) could not be persisted: %s", len(failed), failed)
        return failed

    def _save_head(self, key: str, head: list[tuple[Message, int | None]]) -> bool:
        """Write one queue's in-memory messages; on an error, once more with times
        clamped into int64 (a time out of range must not cost the message). True if
        nothing was lost."""
        disk = self.disks[key]
        if not head:
            return True
        try:
            return disk.save_head(head)
        except Exception:
            log.exception("could not write the %d messages of %s; retrying", len(head), key)
            try:
                return disk.save_head([_clamped(m, due) for m, due in head])
            except Exception:
                log.exception("lost the %d in-memory messages of %s", len(head), key)
                return False

    def _close_queue(self, key: str, forget_read: bool) -> bool:
        try:
            return self.disks[key].close(forget_read=forget_read)
        except Exception:
            log.exception("could not close the disk queue of %s", key)
            return False


def _saved_topic(t: dict[str, Any], on_disk: list[str]) -> SavedTopic:
    """One topic from its metadata entry and the channel directories found for it."""
    saved = t.get("channels")
    channels = [c for c in saved if isinstance(c, dict)] if isinstance(saved, list) else []
    names = {c.get("name") for c in channels}
    channels += [{"name": name} for name in on_disk if name not in names]
    return SavedTopic(
        t["name"],
        bool(t.get("paused")),
        t.get("bucket"),
        [
            SavedChannel(c["name"], bool(c.get("paused")))
            for c in channels
            if _valid(c.get("name")) and not is_ephemeral(c["name"])
        ],
        bool(t.get("held")),
        t.get("bound"),
    )


def _clamped(msg: Message, due: int | None) -> tuple[Message, int | None]:
    """A copy whose times fit the disk format's int64 fields."""

    def fit(v: int) -> int:
        return min(max(v, -1), _FOREVER)

    m = msg.copy()
    m.timestamp_ns, m.arrival_ns, m.release_ns = (
        fit(m.timestamp_ns),
        fit(m.arrival_ns),
        fit(m.release_ns),
    )
    return m, None if due is None else fit(due)


def _valid(name: object) -> bool:
    return isinstance(name, str) and is_valid_name(name)
