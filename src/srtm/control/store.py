"""The controller's state in SQLite, one row per thing that changes on its own: the
brokers (``brokers``), each topic (``topic:NAME``: its spec, publishers and plan) and each
topic's sub-buckets (``buckets:NAME``, which the TB Adaptor changes often). A change
rewrites the rows it touched, never the whole state: a join encodes its topic, not every
topic of the cluster.

A state file from before (one ``controller`` row with every broker and topic) is still
read; the service's first write replaces it with rows (``legacy``).

Writes may come from a thread other than the one that opened it (the service writes in a
single writer thread, off its event loop), one batch at a time."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The row of a state file written before per-topic rows.
LEGACY_KEY = "controller"
BROKERS_KEY = "brokers"
TOPIC_PREFIX = "topic:"
BUCKETS_PREFIX = "buckets:"


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, doc TEXT)")
        self._db.commit()
        #: The file holds the old single ``controller`` row (``load`` tells).
        self.legacy = False

    def write(self, rows: Iterable[tuple[str, str | None]]) -> None:
        """Store each encoded document under its key (None: delete the key), all in one
        transaction: a crash leaves the old rows or the new ones, never half a batch."""
        with self._db:
            for key, text in rows:
                if text is None:
                    self._db.execute("DELETE FROM state WHERE key = ?", (key,))
                else:
                    self._db.execute(
                        "INSERT INTO state (key, doc) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET doc = excluded.doc",
                        (key, text),
                    )

    def put_text(self, key: str, text: str) -> None:
        """Store one encoded document under ``key``."""
        self.write([(key, text)])

    def load(self) -> dict[str, Any] | None:
        """The saved state as ``Controller.to_json`` has it (None: nothing saved), every
        topic with its latest buckets laid over it; an old file's ``controller`` row
        first, then any newer rows over it."""
        doc: dict[str, Any] = {"brokers": [], "topics": []}
        found = False
        row = self._db.execute("SELECT doc FROM state WHERE key = ?", (LEGACY_KEY,)).fetchone()
        if row is not None:
            doc, found, self.legacy = json.loads(row[0]), True, True
        rows = self._db.execute("SELECT key, doc FROM state ORDER BY rowid").fetchall()
        topics = {t["name"]: t for t in doc.get("topics", [])}
        buckets = {}
        for key, text in rows:
            if key == BROKERS_KEY:
                doc["brokers"], found = json.loads(text), True
            elif key.startswith(TOPIC_PREFIX):
                topics[key.removeprefix(TOPIC_PREFIX)], found = json.loads(text), True
            elif key.startswith(BUCKETS_PREFIX):
                buckets[key.removeprefix(BUCKETS_PREFIX)] = json.loads(text)
        if not found:
            return None
        for name, t in topics.items():
            if name in buckets:
                t["buckets"] = buckets[name]
        doc["topics"] = list(topics.values())
        return doc

    def close(self) -> None:
        self._db.close()
