"""Where the controller's state is kept: a key-value store with revisions behind one
interface (``StateStore``), and its SQLite implementation (``SqliteStore``).

A key names one row that changes on its own: the brokers (``brokers``), each topic
(``topic:NAME``: its spec, publishers and plan) and each topic's sub-buckets
(``buckets:NAME``, which the TB Adaptor changes often). A change rewrites the rows it
touched, never the whole state: a join encodes its topic, not every topic of the cluster.
A batch of puts and deletes is applied atomically, as one revision (etcd's transaction,
SQLite's). What is written when (batches of rows marked dirty, at most every 50 ms, by one
writer thread) is the service's.

A state file from before rows (one ``controller`` row with every broker and topic) is
still read (``load_state``); the service's first write replaces it with rows.

Writes may come from a thread other than the one that opened the store (the service
writes in a single writer thread, off its event loop), one batch at a time."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: The single row of a state file written before rows: every broker and topic.
LEGACY_KEY = "controller"
BROKERS_KEY = "brokers"
#: A topic's row is ``topic:NAME``, its sub-buckets' ``buckets:NAME``.
TOPIC_PREFIX = "topic:"
BUCKETS_PREFIX = "buckets:"


@dataclass(frozen=True)
class Entry:
    key: str
    #: The encoded document (JSON).
    doc: str
    #: The store's revision that last wrote it.
    revision: int


#: A batch: each key with its new document, or None: the key is deleted.
Batch = Iterable[tuple[str, str | None]]


class StateStore(Protocol):
    """A key-value store with revisions: every batch written is one revision, applied
    whole or not at all."""

    @property
    def revision(self) -> int:
        """The revision of the last write (0: none)."""
        ...

    def get(self, key: str) -> Entry | None: ...

    def list(self, prefix: str) -> list[Entry]:
        """Every entry whose key starts with ``prefix``, in the order the keys were first
        written (SQLite's rowid; etcd's ``create_revision``, a range sorted by it). Keys
        first written in one batch: SQLite keeps the batch's order, etcd (one revision for
        them all) lists them by key."""
        ...

    def put(self, key: str, doc: str) -> None: ...

    def delete(self, key: str) -> None: ...

    def write(self, batch: Batch) -> None:
        """Apply ``batch`` atomically, as one revision: a crash leaves the old rows or the
        new ones, never half a batch."""
        ...

    def close(self) -> None: ...


class SqliteStore:
    """``StateStore`` in SQLite: a table ``state(key, doc, rev)`` and the store's
    revision in a table of its own (so that it never goes back, whatever was deleted)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False)
        with self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, doc TEXT)")
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(state)")}
            if "rev" not in columns:  # a file from before revisions: its rows are revision 0
                self._db.execute("ALTER TABLE state ADD COLUMN rev INTEGER NOT NULL DEFAULT 0")
            self._db.execute("CREATE TABLE IF NOT EXISTS revision (n INTEGER NOT NULL)")
            row = self._db.execute("SELECT n FROM revision").fetchone()
            if row is None:
                self._db.execute("INSERT INTO revision (n) VALUES (0)")
        self._revision = 0 if row is None else int(row[0])

    @property
    def revision(self) -> int:
        return self._revision

    def get(self, key: str) -> Entry | None:
        row = self._db.execute("SELECT doc, rev FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else Entry(key, row[0], row[1])

    def list(self, prefix: str) -> list[Entry]:
        rows = self._db.execute(
            "SELECT key, doc, rev FROM state WHERE substr(key, 1, ?) = ? ORDER BY rowid",
            (len(prefix), prefix),
        )
        return [Entry(key, doc, rev) for key, doc, rev in rows]

    def put(self, key: str, doc: str) -> None:
        self.write([(key, doc)])

    def delete(self, key: str) -> None:
        self.write([(key, None)])

    def write(self, batch: Batch) -> None:
        with self._db:
            revision = self._revision + 1
            for key, doc in batch:
                if doc is None:
                    self._db.execute("DELETE FROM state WHERE key = ?", (key,))
                else:
                    self._db.execute(
                        "INSERT INTO state (key, doc, rev) VALUES (?, ?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET doc = excluded.doc, rev = excluded.rev",
                        (key, doc, revision),
                    )
            self._db.execute("UPDATE revision SET n = ?", (revision,))
        self._revision = revision  # only once committed

    def close(self) -> None:
        self._db.close()


def load_state(store: StateStore) -> dict[str, Any] | None:
    """The saved state as ``Controller.to_json`` has it (None: nothing saved), every
    topic with its latest buckets laid over it; an old file's ``controller`` row
    first, then any newer rows over it."""
    doc: dict[str, Any] = {"brokers": [], "topics": []}
    found = False
    legacy = store.get(LEGACY_KEY)
    if legacy is not None:
        doc, found = json.loads(legacy.doc), True
    brokers = store.get(BROKERS_KEY)
    if brokers is not None:
        doc["brokers"], found = json.loads(brokers.doc), True
    topics = {t["name"]: t for t in doc.get("topics", [])}
    for e in store.list(TOPIC_PREFIX):
        topics[e.key.removeprefix(TOPIC_PREFIX)], found = json.loads(e.doc), True
    if not found:
        return None
    for e in store.list(BUCKETS_PREFIX):
        name = e.key.removeprefix(BUCKETS_PREFIX)
        if name in topics:
            topics[name]["buckets"] = json.loads(e.doc)
    doc["topics"] = list(topics.values())
    return doc
