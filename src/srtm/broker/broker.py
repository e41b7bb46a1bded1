"""The broker: topics and clients on one asyncio loop, a precise releaser, timers,
durable queues under ``data_dir`` and the graceful shutdown that fills them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from srtm.broker.accept import AcceptBackoff, refuse
from srtm.broker.auth import Authenticator, close_quietly
from srtm.broker.diskqueue import DiskIO, DiskQueue, Reserve
from srtm.broker.measurement import Measurement, Measurements
from srtm.broker.message import Message, MessageIds
from srtm.broker.options import VERSION, BrokerOptions
from srtm.broker.queue import MessageQueue
from srtm.broker.release import Releaser
from srtm.broker.state import UNBOOKED, Channel, LimitReached, Topic
from srtm.broker.stats import BrokerStats
from srtm.broker.tcp import Client, enable_kernel_timestamps
from srtm.broker.tls import server_context
from srtm.broker.traces import TraceWriter
from srtm.protocol import ProtocolError, errors, is_ephemeral, is_valid_name
from srtm.protocol.header import publisher_of
from srtm.ratelimit import TokenBucket, check_bucket

log = logging.getLogger("srtm.broker")
_META = "meta.json"
_FOREVER = 2**63 - 1
#: Queues written at once at a graceful stop.
_PERSIST_THREADS = 32
#: nsqd's code for a SUB that cannot be served (not in srtm.protocol.errors yet).
_E_SUB_FAILED = "E_SUB_FAILED"


def _queue_dir(data_dir: Path, key: str) -> Path:
    # Names may be "." or "..": a prefix keeps every key a plain file name.
    return data_dir / "queues" / f"q-{key}"


def _meta_doc(topics: list[Topic], ids: MessageIds) -> dict[str, Any]:
    """Topics, channels, pauses and buckets: what ``meta.json`` holds. Safe in a thread
    while the loop runs: it only reads attributes and copies dicts (atomic under the GIL);
    a change made meanwhile marks the metadata dirty again, so another write follows."""
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
                "channels": [
                    {"name": ch.name, "paused": ch.paused} for ch in channels if not ch.ephemeral
                ],
            }
        )
    return {"version": 1, "next_id": ids.last + 1, "topics": docs}


def _write_meta(path: Path, topics: list[Topic], ids: MessageIds) -> None:
    _write_durably(path, _meta_doc(topics, ids))


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

    def pop(self) -> Message | None:
        return None if self._disk is None else self._disk.pop()

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


class Broker:
    """Owns the topics; ``Client`` objects call into it, it calls back to send frames."""

    def __init__(self, options: BrokerOptions | None = None) -> None:
        self.options = options or BrokerOptions()
        self.version = VERSION
        self.topics: dict[str, Topic] = {}
        self.clients: set[Client] = set()
        self.stats = BrokerStats(self.options.window_seconds)
        self.ids = MessageIds(self.options.broker_id, time.time_ns() // 1000)
        self.started_ns = time.time_ns()
        self.tcp_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.https_address: tuple[str, int] | None = None
        #: TLS and AUTH (srtm.broker.tls, srtm.broker.auth); None where not configured.
        self.tls_context = server_context(self.options)
        self.authenticator = (
            Authenticator(self.options.auth_http_address)
            if self.options.auth_http_address
            else None
        )
        self.traces: TraceWriter | None = None
        self._disk: dict[str, LazyDisk] = {}
        #: Disk queues whose last write failed (disk full...): their topics refuse PUBs.
        self._failing_disks: set[DiskQueue] = set()
        #: Disk queues with pushes not written yet (see _write_through).
        self._unflushed_disks: set[DiskQueue] = set()
        #: The disk thread of the queues while serving (see DiskIO).
        self._io: DiskIO | None = None
        #: Disk queues pushed to by the publish running (what its OK waits for).
        self._pushed_disks: set[DiskQueue] = set()
        self._reserve = Reserve(self.options.data_dir, self.options.disk_reserve_bytes)
        self._restoring = False
        #: Metadata changed since the last write; at most one write in flight, in a
        #: thread, so N new topics cost a few writes, not N (each O(N)) on the loop.
        self._meta_dirty = False
        self._meta_task: asyncio.Task[None] | None = None
        self._stopping = False
        #: meta.json writes done (tests and /stats-style curiosity).
        self.meta_writes = 0
        self._dirty: set[Channel] = set()
        #: Channels with deferred messages or in-flight deadlines: all that _scan visits.
        self._timed: set[Channel] = set()
        self._flush_scheduled = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: socket.socket | None = None
        #: Why accepting TCP connections fails right now (None: it does not).
        self.accept_error: str | None = None
        #: Connections closed at once because ``max_connections`` were open.
        self.refused_connections = 0
        self.stopped = asyncio.Event()
        self.measurements = Measurements()
        self.releaser = Releaser(
            self.options, self.topics, self.stats, self.mark_ready, self._dispatch
        )

    # -- queues --------------------------------------------------------------------------
    def _queue(self, key: str) -> MessageQueue:
        """Keys are ``topic``, ``topic@shaping`` or ``topic:channel``; a queue is durable
        unless its topic or channel is ephemeral (those are never persisted)."""
        mem = self.options.mem_queue_size
        if any(is_ephemeral(part) for part in re.split("[:@]", key)):
            return MessageQueue(mem)
        disk = LazyDisk(
            self.options.data_dir,
            key,
            self.options.max_bytes_per_file,
            self._failing_disks,
            self._unflushed_disks,
            lambda: self._io,
            lambda: self._disk_readable(key),
            self._pushed_disks,
        )
        if self._restoring and disk.directory.is_dir():
            disk.open()  # what an earlier run left there is read back now
        self._disk[key] = disk
        return MessageQueue(mem, disk)

    def _disk_readable(self, key: str) -> None:
        """The disk queue of ``key`` has read or written records ``pop`` can give now:
        dispatch its channel, or release its topic, again."""
        name, sep, channel = key.partition(":")
        topic = self.topics.get(name.split("@")[0])
        if topic is None:
            return
        if name == topic.name:
            # What the topic held for its first channel (read back after a restart):
            # that channel takes it, as it took what was in memory when it was made.
            first = next(iter(topic.channels.values()), None)
            if first is not None:
                for msg in topic.held.drain():
                    first.put(msg)
                self.mark_ready(first)
        elif not sep:
            self.releaser.kick(topic)
        elif (ch := topic.channels.get(channel)) is not None:
            self.mark_ready(ch)

    def _remove_queue(self, key: str) -> None:
        disk = self._disk.pop(key, None)
        if disk is not None:
            disk.remove()

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        self._restore()
        self._reserve.claim()  # after the restore: it may need the space first
        # From now on the disk queues' file work runs on a thread of their own.
        self._io = DiskIO(asyncio.get_running_loop())
        for disk in self._disk.values():
            disk.attach(self._io)
        if opts.trace_dir is not None:
            self.traces = TraceWriter(
                opts.trace_dir, opts.run, str(opts.broker_id), opts.trace_sample
            )
        listener = socket.create_server((opts.tcp_host, opts.tcp_port))
        listener.setblocking(False)
        if opts.kernel_timestamps:
            # Accepted sockets inherit it, so even bytes that arrive before the accept
            # (a client's first PUB) carry their kernel receive stamp.
            enable_kernel_timestamps(listener)
        self._listener = listener
        self.tcp_address = listener.getsockname()[:2]
        self._tasks = [
            asyncio.create_task(self._accept_loop(listener), name="srtm-accept"),
            asyncio.create_task(self._scan_loop(), name="srtm-scan"),
            asyncio.create_task(self._housekeeping_loop(), name="srtm-housekeeping"),
        ]
        self.releaser.start()
        self._tasks.append(asyncio.create_task(self.releaser.run(), name="srtm-release"))
        self._tasks.append(asyncio.create_task(self._deadline_loop(), name="srtm-deadlines"))
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        for topic in self.topics.values():
            self.releaser.kick(topic)

    async def stop(self) -> None:
        """Stop serving and persist every message still owed (queued, deferred, in flight)."""
        if self.stopped.is_set():
            return
        self._stopping = True
        if self._meta_task is not None:
            # Let a write in flight finish: the final one below must not race its rename.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._meta_task)
        self.releaser.stop()
        listener, self._listener = self._listener, None  # tells the accept loop it is over
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                # Already logged when it died; what the broker owes is persisted anyway.
                log.warning("stopping after background task %s died", task.get_name())
        self._tasks = []
        if listener is not None:
            listener.close()
        for client in list(self.clients):
            client.close()  # in-flight messages go back to their channel's queue
        self.releaser.processed(None)  # what the emulated server still holds is owed too
        if self._io is not None:
            # What runs on the disk thread ends first; the queues are saved inline.
            await self._io.quiesce()
        self._persist()
        await close_quietly(self.authenticator)
        if self.traces is not None:
            await self.traces.close()
        self.stopped.set()

    def _persist(self) -> list[str]:
        """Graceful stop: what every durable queue holds in memory, then the metadata.

        The disk reserve goes first, so that on a full disk the heads still fit. Each
        queue is written on its own, in a pool of threads (one fsync per file, and a
        journaling file system commits concurrent ones together: 16 times faster here for
        thousands of topics); one that cannot be written (a full disk, a value out of
        range) is logged and skipped, never costing another queue its messages. A queue
        forgets what it read only once every head and buffer is saved (else the next
        start reads it again: duplicates, not losses). Returns the keys that could not
        be written (and ``meta.json`` if it could not).
        """
        self._reserve.release()
        heads: dict[str, list[tuple[Message, int | None]]] = {}
        for topic in list(self.topics.values()):
            if topic.ephemeral:
                continue
            for key, head in topic.head():
                heads[key] = head
            for ch in topic.channels.values():
                if not ch.ephemeral:
                    heads[f"{topic.name}:{ch.name}"] = ch.head()
        keys = [k for k, disk in self._disk.items() if heads.get(k) or disk.opened]
        failed: list[str] = []
        if keys:
            with ThreadPoolExecutor(_PERSIST_THREADS, thread_name_prefix="srtm-persist") as pool:
                saved = pool.map(lambda key: self._save_head(key, heads.get(key, [])), keys)
                failed = [key for key, ok in zip(keys, saved, strict=True) if not ok]
                # every buffer written before any queue forgets what it read
                flushed = pool.map(lambda key: self._disk[key].flush(), keys)
                failed += [key for key, ok in zip(keys, flushed, strict=True) if not ok]
                forget = not failed
                closed = pool.map(lambda key: self._close_queue(key, forget), keys)
                failed += [key for key, ok in zip(keys, closed, strict=True) if not ok]
        self._disk.clear()
        try:
            _write_meta(self.options.data_dir / _META, list(self.topics.values()), self.ids)
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
        disk = self._disk[key]
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
            return self._disk[key].close(forget_read=forget_read)
        except Exception:
            log.exception("could not close the disk queue of %s", key)
            return False

    def _save_meta(self) -> None:
        """Metadata changed: have it written (as nsqd does, so that after a crash the disk
        queues are found again), soon and in a thread; a burst of changes is one write.
        Without a running loop it is written at once."""
        if self._restoring:
            return
        self._meta_dirty = True
        if self._meta_task is not None or self._stopping:
            return  # the writer in flight goes round again; stop() writes the last one
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._meta_dirty = False
            _write_meta(self.options.data_dir / _META, list(self.topics.values()), self.ids)
            self.meta_writes += 1
            return
        self._meta_task = loop.create_task(self._meta_writer(), name="srtm-meta")

    async def _meta_writer(self) -> None:
        path = self.options.data_dir / _META
        try:
            while self._meta_dirty and not self._stopping:
                self._meta_dirty = False
                # Only the list is taken on the loop; the document (20 ms for 10,000
                # topics) is made in the thread, which yields the GIL every 5 ms.
                topics = list(self.topics.values())
                try:
                    await asyncio.to_thread(_write_meta, path, topics, self.ids)
                    self.meta_writes += 1
                except Exception:
                    # Never fatal: queues still find their directories on the next start
                    # (_restore), and stop() writes once more.
                    log.exception("could not write %s; retrying in 1 s", path)
                    self._meta_dirty = True
                    await asyncio.sleep(1.0)
        finally:
            self._meta_task = None

    def _read_meta(self) -> dict[str, Any]:
        """``meta.json``, or an empty one if it is missing, empty or corrupt (logged: the
        queue directories then tell which topics and channels there were)."""
        path = self.options.data_dir / _META
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

    def _restore(self) -> None:
        meta = self._read_meta()
        found = _scan_queue_dirs(self.options.data_dir)
        self._restoring = True
        next_id = meta.get("next_id", 0)
        self.ids = MessageIds(
            self.options.broker_id,
            max(next_id if isinstance(next_id, int) else 0, self.ids.last + 1),
        )
        now = time.time_ns()
        entries: list[dict[str, Any]] = [
            t for t in meta.get("topics", []) if isinstance(t, dict) and _valid(t.get("name"))
        ]
        known = {t["name"] for t in entries}
        entries += [{"name": name} for name in found if name not in known]
        for t in entries:
            self._restore_one(t, found.get(t["name"], []), now)
        self._restoring = False
        self._save_meta()
        restored = sum(
            t.depth + sum(c.depth + c.deferred_count for c in t.channels.values())
            for t in self.topics.values()
        )
        if restored:
            log.info("restored %d messages from %s", restored, self.options.data_dir)

    def _restore_one(self, t: dict[str, Any], on_disk: list[str], now: int) -> None:
        """One topic from its metadata entry and the channel directories found for it."""
        topic = self.topic(t["name"])
        topic.paused = bool(t.get("paused"))
        # What waited for tokens is booked again, not as if it arrived before this
        # run: a restart must not burst.
        topic.book_not_before_ns = now
        bucket = t.get("bucket")
        if bucket:
            try:
                topic.shape(bucket["rate"], bucket["burst"], time.time_ns)
                self.releaser.shaped[topic.name] = topic
            except (KeyError, TypeError, ValueError) as exc:
                log.error("topic %s: saved bucket %r ignored (%s)", topic.name, bucket, exc)
        saved = t.get("channels")
        channels = [c for c in saved if isinstance(c, dict)] if isinstance(saved, list) else []
        names = {c.get("name") for c in channels}
        channels += [{"name": name} for name in on_disk if name not in names]
        for c in channels:
            if not _valid(c.get("name")) or is_ephemeral(c["name"]):
                continue
            ch = self._watched(topic.channel(c["name"]))
            ch.paused = bool(c.get("paused"))
            self._restore_channel(ch)
        self._restore_topic(topic, now)

    def _restore_channel(self, ch: Channel) -> None:
        head = self._disk[f"{ch.topic}:{ch.name}"].take_head()
        ch.queue.extendleft([m for m, due in head if due is None])
        for msg, due in head:
            if due is not None:
                ch.defer(msg, due)

    def _restore_topic(self, topic: Topic, now: int) -> None:
        held = self._disk[topic.name].take_head()
        topic.held.extendleft([m for m, due in held if due is None])
        topic.held_deferred += [(m, due) for m, due in held if due is not None]
        shaping = [m for m, _ in self._disk[f"{topic.name}@shaping"].take_head()]
        for msg in shaping:
            msg.release_ns = UNBOOKED  # booked on the old run's bucket
        topic.shaping.extendleft(shaping)
        if topic.channels and topic.held:
            first = next(iter(topic.channels.values()))
            for msg in topic.held.drain():
                first.put(msg)

    async def _accept_loop(self, listener: socket.socket) -> None:
        """Accept clients until stopped. A failed accept never ends it: out of fds or
        memory it is retried with a backoff (the connection waits in the kernel's
        backlog meanwhile, and /ping says so); a connection gone before it was
        accepted is skipped."""
        loop = asyncio.get_running_loop()
        backoff = AcceptBackoff()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if self._listener is None:
                    return  # closed by stop()
                delay = backoff.failed(exc)
                if delay is None:
                    continue
                self.accept_error = f"accepting TCP connections fails: {exc}"
                if backoff.should_log():
                    log.error("%s; retrying (%d failures so far)", self.accept_error, backoff.count)
                await asyncio.sleep(delay)
                continue
            if self.accept_error is not None:
                log.warning("accepting TCP connections again after %d failures", backoff.count)
                self.accept_error = None
            backoff.reset()
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        limit = self.options.max_connections
        if limit and len(self.clients) >= limit:
            self.refused_connections += 1
            refuse(sock, f"max connections ({limit}) reached")
            return
        try:
            self.clients.add(Client(self, sock, self.options.kernel_timestamps))
        except OSError:
            sock.close()  # gone before we could set it up

    def health(self) -> str | None:
        """What is wrong with this broker (for /ping), or None."""
        if self.accept_error is not None:
            return self.accept_error
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return f"task {task.get_name()} died: {task.exception()!r}"
        return None

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Log a background task's death when it happens, not at the next stop."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s died", task.get_name(), exc_info=exc)

    async def _deadline_loop(self) -> None:
        """Close connections whose writes or partly received commands stalled too long."""
        opts = self.options
        timeouts = [t for t in (opts.read_timeout_ms, opts.write_timeout_ms) if t > 0]
        if not timeouts:
            return
        interval = min(1.0, min(timeouts) / 4000)
        while True:
            await asyncio.sleep(interval)
            now = time.time_ns()
            for client in list(self.clients):
                client.check_deadlines(now)

    def disconnected(self, client: Client) -> None:
        self.clients.discard(client)
        ch = client.channel
        if ch is None:
            return
        ch.remove_consumer(client)
        topic = self.topics.get(ch.topic)
        if topic is None or topic.channels.get(ch.name) is not ch:
            return  # its channel is being deleted
        self.mark_ready(ch)
        if ch.ephemeral and not ch.consumers:
            self.delete_channel(ch.topic, ch.name)

    # -- topics and channels -------------------------------------------------------------
    def topic(self, name: str, limit_code: str = errors.E_BAD_TOPIC) -> Topic:
        """The topic ``name``, created on first use; ``limit_code`` is the error code
        when the broker already has ``max_topics`` (the command's own, e.g. E_PUB_FAILED)."""
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_name(name):
                raise ProtocolError(errors.E_BAD_TOPIC, f"topic name {name!r} is not valid")
            limit = self.options.max_topics
            if len(self.topics) >= limit and not self._restoring:
                raise LimitReached(
                    limit_code,
                    f"topic {name!r} not created: this broker has its maximum of {limit} "
                    "topics (--max-topics)",
                    "TOO_MANY_TOPICS",
                )
            topic = self.topics[name] = Topic(name, self._queue)
            if not topic.ephemeral:
                self._save_meta()
        return topic

    def channel(
        self, topic_name: str, channel_name: str, limit_code: str = errors.E_BAD_CHANNEL
    ) -> Channel:
        if not is_valid_name(channel_name):
            raise ProtocolError(errors.E_BAD_CHANNEL, f"channel name {channel_name!r} is not valid")
        topic = self.topic(topic_name, limit_code)
        new = channel_name not in topic.channels
        limit = self.options.max_channels_per_topic
        if new and len(topic.channels) >= limit and not self._restoring:
            raise LimitReached(
                limit_code,
                f"channel {channel_name!r} not created: topic {topic_name!r} has its maximum "
                f"of {limit} channels (--max-channels-per-topic)",
                "TOO_MANY_CHANNELS",
            )
        ch = self._watched(topic.channel(channel_name))
        if new and not ch.ephemeral and not topic.ephemeral:
            self._save_meta()
        self.mark_ready(ch)
        return ch

    def _watched(self, ch: Channel) -> Channel:
        """Have the scan look at ``ch`` whenever it has timers."""
        if ch.watch is None:
            ch.watch = self._timed
            if ch.next_due_ns() is not None:  # what the topic deferred before it existed
                self._timed.add(ch)
        return ch

    def subscribe(self, topic_name: str, channel_name: str, client: Client) -> Channel:
        ch = self.channel(topic_name, channel_name, _E_SUB_FAILED)
        ch.add_consumer(client)
        return ch

    def delete_channel(self, topic_name: str, channel_name: str) -> None:
        topic = self.topics.get(topic_name)
        if topic is None or channel_name not in topic.channels:
            raise KeyError(channel_name)
        ch = topic.channels.pop(channel_name)
        self._timed.discard(ch)
        for consumer in list(ch.consumers):
            if isinstance(consumer, Client):
                consumer.close()
        ch.discard()  # what it read from the topic's disk queues is settled
        self._remove_queue(f"{topic_name}:{channel_name}")
        self.stats.drop_channel(topic_name, channel_name)
        if topic.ephemeral and not topic.channels:
            self.delete_topic(topic_name)
        elif not ch.ephemeral:
            self._save_meta()

    def delete_topic(self, name: str) -> None:
        topic = self.topics.pop(name)
        self.releaser.shaped.pop(name, None)
        for ch_name in list(topic.channels):
            ch = topic.channels.pop(ch_name)
            self._timed.discard(ch)
            for consumer in list(ch.consumers):
                if isinstance(consumer, Client):
                    consumer.close()
            self._remove_queue(f"{name}:{ch_name}")
        self._remove_queue(name)
        self._remove_queue(f"{name}@shaping")
        self.stats.drop_topic(name)
        if not topic.ephemeral:
            self._save_meta()

    def set_bucket(self, topic_name: str, rate: float, burst: float) -> TokenBucket:
        """Give a topic its sub-bucket, or retune it keeping its state; what already waits
        is paced by the new parameters from now on."""
        check_bucket(rate, burst)  # a bad pair creates no topic
        topic = self.topic(topic_name)
        bucket = topic.shape(rate, burst, time.time_ns)
        self.releaser.shaped[topic_name] = topic
        self._save_meta()
        self.releaser.kick(topic)
        return bucket

    def clear_bucket(self, topic_name: str) -> None:
        """Stop shaping: what waits for tokens is released at once."""
        topic = self.topic(topic_name)
        topic.unshape()
        self.releaser.shaped.pop(topic_name, None)
        self._save_meta()
        self.releaser.release_all(topic)

    def pause_topic(self, name: str, paused: bool) -> None:
        topic = self.topics[name]
        topic.paused = paused
        self._save_meta()
        if not paused:
            self.releaser.kick(topic)

    def pause_channel(self, topic_name: str, channel_name: str, paused: bool) -> None:
        ch = self.topics[topic_name].channels[channel_name]
        ch.paused = paused
        self._save_meta()
        self.mark_ready(ch)

    def order(self, publisher: str, order: dict[str, Any]) -> int:
        """Send an SRTM order to every connection of ``publisher`` that takes orders."""
        clients = [c for c in self.clients if c.publisher == publisher and c.takes_orders]
        for c in clients:
            c.send_order(order)
        return len(clients)

    # -- publishing ----------------------------------------------------------------------
    def publish(
        self, topic_name: str, bodies: Iterable[bytes], arrival: int, publisher: str | None
    ) -> asyncio.Future[Any] | None:
        """Accept messages that arrived at ``arrival``; ``publisher`` None: each one is
        attributed to the publisher its measurement header names. Returns a future done
        once what overflowed to disk is written (None: nothing to wait for): the publish
        is acknowledged only then."""
        topic = self._publish_topic(topic_name, "PUB", errors.E_PUB_FAILED)
        self._pushed_disks.clear()
        now = time.time_ns()
        n = 0
        backlog = 0.0
        for body in bodies:
            who = publisher_of(body) if publisher is None else publisher
            b = topic.put(Message(self.ids.next(), body, now, arrival, publisher=who))
            backlog = max(backlog, b)
            n += 1
        self.stats.topic(topic_name).window.add(arrival, n, backlog)
        self.releaser.kick(topic)
        if self._pushed_disks:
            return self._write_through()
        return None

    def _write_through(self) -> asyncio.Future[Any] | None:
        """Write what this publish overflowed to disk before it is acknowledged: its OK
        then means the OS holds it, so it survives kill -9 (as with nsqd, one write per
        publish that overflows, or fewer: publishes arriving while one is written go
        together in the next). The writes run on the disk thread; the future returned is
        done when they are (None: written inline, or nothing to write)."""
        waits = []
        pushed = list(self._pushed_disks)
        self._pushed_disks.clear()  # the same set: the queues hold it
        for disk in pushed:
            # a failing one is not waited for: the housekeeping loop retries it
            if (fut := disk.written()) is not None:
                waits.append(fut)
        if not waits:
            return None
        return waits[0] if len(waits) == 1 else asyncio.gather(*waits)

    def publish_deferred(
        self, topic_name: str, body: bytes, defer_ms: int, arrival: int, publisher: str | None
    ) -> None:
        topic = self._publish_topic(topic_name, "DPUB", errors.E_DPUB_FAILED)
        now = time.time_ns()
        who = publisher_of(body) if publisher is None else publisher
        topic.defer(
            Message(self.ids.next(), body, now, arrival, publisher=who),
            now + defer_ms * 1_000_000,
        )
        self.stats.topic(topic_name).window.add(arrival, 1, 0.0)

    def _publish_topic(self, name: str, what: str, limit_code: str) -> Topic:
        """The topic to publish to, or E_PUB_FAILED if it cannot take messages now
        (``limit_code`` when it would be one topic too many)."""
        try:
            topic = self.topic(name, limit_code)
        except OSError as exc:  # its metadata could not be written (disk full...)
            raise ProtocolError(errors.E_PUB_FAILED, f"{what} failed: {exc}") from exc
        if self._failing_disks:
            self._refuse_if_failing(topic, what)
        return topic

    def _refuse_if_failing(self, topic: Topic, what: str) -> None:
        """E_PUB_FAILED while a disk queue of ``topic`` cannot write (disk full...): what
        was acknowledged waits in memory, and nothing more is taken until writing works."""
        keys = [topic.name, f"{topic.name}@shaping"]
        keys += [f"{topic.name}:{name}" for name in topic.channels]
        for key in keys:
            disk = self._disk.get(key)
            if disk is not None and disk.error is not None:
                raise ProtocolError(
                    errors.E_PUB_FAILED, f"{what} failed: cannot write to disk ({disk.error})"
                )

    def release_due(self) -> None:
        """Release shaped messages that are due (see ``Releaser.release_due``)."""
        self.releaser.release_due()

    # -- delivery ------------------------------------------------------------------------
    def mark_ready(self, channel: Channel) -> None:
        """Dispatch this channel soon (once per loop turn, however many calls)."""
        self._dirty.add(channel)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for ch in dirty:
            self._dispatch(ch)

    def _dispatch(self, ch: Channel, send: bool = False) -> None:
        now = time.time_ns()
        out = ch.dispatch(now)
        if not out:
            return
        self._account(ch, out, now)
        for consumer, msg in out:
            assert isinstance(consumer, Client)
            consumer.send_message(msg)
        if send:
            for consumer in {c for c, _ in out}:
                assert isinstance(consumer, Client)
                consumer.send_now()

    def _account(self, ch: Channel, out: Sequence[tuple[object, Message]], now: int) -> None:
        topic = self.topics.get(ch.topic)
        if topic is None:
            return
        ts = self.stats.topic(ch.topic)
        cs = ts.channel(ch.name)
        shaped = topic.bucket is not None
        # else the lateness is measured when the emulated server has processed it
        lateness = shaped and self.releaser.server is None
        first_channel = next(iter(topic.channels.values()), None) is ch
        traces = self.traces
        first = sum(1 for _, m in out if m.attempts == 1)
        if first:
            cs.window.add(now, first, 0.0)
        for _, msg in out:
            if msg.attempts != 1:
                continue
            latency = now - msg.arrival_ns
            cs.latency.add(latency)
            if shaped:
                cs.token_wait.add(msg.release_ns - msg.arrival_ns)
            if first_channel:
                ts.latency.add(latency)
                if lateness:
                    ts.lateness.add(now - msg.release_ns)
                if traces is not None:
                    traces.add(ch.topic, msg, now)
        if first_channel and self.measurements.running:
            self.measurements.record(ch.topic, out, now)

    async def measure(
        self, topic: str, publishers: frozenset[str] | None, window_ns: int
    ) -> Measurement:
        """Run a measurement round for ``window_ns`` and return it; cancelling the call
        ends the round. At most ``max_measurements`` run at once (MeasurementsBusy)."""
        return await self.measurements.run(topic, publishers, window_ns, self.clients)

    @property
    def max_measurements(self) -> int:
        return self.measurements.limit

    @max_measurements.setter
    def max_measurements(self, limit: int) -> None:
        self.measurements.limit = limit

    async def _scan_loop(self) -> None:
        """Deferred messages that came due and in-flight messages that timed out."""
        interval = self.options.scan_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._scan(time.time_ns())

    def _scan(self, now: int) -> None:
        # A function of its own: no loop variable keeps a deleted topic alive while the
        # loop sleeps (freeing it later, all at once, stalled the loop). Only channels
        # with timers are visited: thousands of idle ones cost nothing.
        for ch in list(self._timed):
            due = ch.next_due_ns()
            if due is None:
                self._timed.discard(ch)  # it puts itself back when it gets a timer
            elif due <= now and ch.tick(now):
                self.mark_ready(ch)

    async def _housekeeping_loop(self) -> None:
        """Move measured values into the histograms every 100 ms, one histogram per loop
        turn, so no single step holds the loop (and shaped releases) for long."""
        rolled = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            recorders = self.stats.pending_recorders()
            for rec in recorders:
                rec.flush()
                await asyncio.sleep(0)
            del recorders  # no reference to a deleted topic's histograms while sleeping
            if time.monotonic() - rolled >= 1.0:
                rolled = time.monotonic()
                self.measurements.refresh_rtts(self.clients)
                # Like nsqd's sync every 2 s: overflowed messages reach the OS each second.
                for disk in list(self._disk.values()):
                    disk.flush()
                if not self._reserve.held and not self._failing_disks:
                    # space came back since the start; fallocate may take a while: a thread
                    await asyncio.to_thread(self._reserve.claim, True)
                if self.traces is not None:
                    self.traces.maybe_roll()


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
