"""The controller's state in SQLite: one document for brokers, topics and plans (written
when they change), and a small one per topic for its sub-buckets (which the TB Adaptor
changes often).

Writes may come from a thread other than the one that opened it (the service writes in a
single writer thread, off its event loop), one at a time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, doc TEXT)")
        self._db.commit()

    def put_text(self, key: str, text: str) -> None:
        """Store an encoded document under ``key``."""
        with self._db:  # one transaction: a crash leaves the old or the new document
            self._db.execute(
                "INSERT INTO state (key, doc) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET doc = excluded.doc",
                (key, text),
            )

    def load(self) -> dict[str, Any] | None:
        """The saved document with every topic's latest buckets laid over it."""
        row = self._db.execute("SELECT doc FROM state WHERE key = 'controller'").fetchone()
        if row is None:
            return None
        doc: dict[str, Any] = json.loads(row[0])
        rows = self._db.execute("SELECT key, doc FROM state WHERE key LIKE 'buckets:%'")
        latest = {key.removeprefix("buckets:"): json.loads(d) for key, d in rows}
        for t in doc.get("topics", []):
            if t["name"] in latest:
                t["buckets"] = latest[t["name"]]
        return doc

    def close(self) -> None:
        self._db.close()
