"""The controller's store interface on SQLite: keys listed by prefix, one revision per
batch, a batch whole or not at all, a file from before revisions read as it was."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from srtm.control.store import BROKERS_KEY, TOPIC_PREFIX, SqliteStore, StateStore, load_state


def test_a_batch_is_one_revision_and_entries_list_by_prefix(tmp_path: Path) -> None:
    store: StateStore = SqliteStore(tmp_path / "s.db")
    assert store.revision == 0 and store.get(BROKERS_KEY) is None
    store.write([(BROKERS_KEY, "[]"), ("topic:b", "{}"), ("topic:a", "{}")])
    store.put("buckets:a", "{}")
    assert store.revision == 2
    assert [e.key for e in store.list(TOPIC_PREFIX)] == ["topic:b", "topic:a"]  # first first
    assert [(e.key, e.revision) for e in store.list("buckets:")] == [("buckets:a", 2)]
    store.delete("topic:b")
    assert store.revision == 3 and store.get("topic:b") is None
    store.close()
    again = SqliteStore(tmp_path / "s.db")
    assert again.revision == 3  # never back, though no row holds 3
    assert again.get(BROKERS_KEY) is not None


def test_a_failed_batch_writes_nothing(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")

    def batch() -> Iterator[tuple[str, str | None]]:
        yield "topic:t", "{}"
        raise RuntimeError("encoding failed")

    with pytest.raises(RuntimeError):
        store.write(batch())
    assert store.get("topic:t") is None and store.revision == 0


def test_a_file_from_before_revisions_is_read(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("CREATE TABLE state (key TEXT PRIMARY KEY, doc TEXT)")
        conn.execute("INSERT INTO state VALUES ('brokers', '[]'), ('topic:t', '{\"name\": \"t\"}')")
    conn.close()
    assert load_state(SqliteStore(db)) == {"brokers": [], "topics": [{"name": "t"}]}
