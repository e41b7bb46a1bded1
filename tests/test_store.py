"""The controller's store interface, one contract for both stores (SQLite and a real etcd
member): keys listed by prefix in the order they were first written, one revision per
batch, revisions that only grow, a batch whole or not at all; and SQLite's own cases (a
file from before revisions read as it was, a batch's new keys in batch order)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from etcd_member import EtcdMember
from srtm.control.etcd_store import EtcdStore
from srtm.control.store import BROKERS_KEY, TOPIC_PREFIX, SqliteStore, StateStore, load_state

#: Opens the test's store, the same one each time (as a restarted controller would).
OpenStore = Callable[[], StateStore]


@pytest.fixture(params=["sqlite", "etcd"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    opened: list[StateStore] = []
    if request.param == "sqlite":

        def make() -> StateStore:
            opened.append(SqliteStore(tmp_path / "s.db"))
            return opened[-1]
    else:
        member: EtcdMember = request.getfixturevalue("etcd")
        prefix = f"/test-{uuid.uuid4().hex}"  # the member is shared: a prefix per test

        def make() -> StateStore:
            opened.append(EtcdStore([member.url], prefix))
            return opened[-1]

    yield make
    for store in opened:
        store.close()


def test_a_batch_is_one_revision_and_entries_list_by_prefix(open_store: OpenStore) -> None:
    store = open_store()
    start = store.revision
    assert store.get(BROKERS_KEY) is None and store.list("") == []
    store.write([(BROKERS_KEY, "[]"), ("topic:b", "{}")])
    assert store.revision == start + 1
    store.write([("topic:a", "{}"), ("buckets:a", "{}")])
    assert store.revision == start + 2
    assert [e.key for e in store.list(TOPIC_PREFIX)] == ["topic:b", "topic:a"]  # first first
    assert [(e.key, e.revision) for e in store.list("buckets:")] == [("buckets:a", start + 2)]
    assert store.get(BROKERS_KEY) == store.list("brokers")[0]
    assert store.get(BROKERS_KEY).revision == start + 1  # type: ignore[union-attr]
    store.delete("topic:b")
    assert store.revision == start + 3 and store.get("topic:b") is None
    store.close()
    again = open_store()
    assert again.revision >= start + 3  # never back, though no row holds it
    assert again.get(BROKERS_KEY) is not None and again.get("topic:b") is None


def test_a_key_written_again_keeps_its_place_and_revisions_only_grow(
    open_store: OpenStore,
) -> None:
    store = open_store()
    seen = [store.revision]
    for key in ("topic:x", "topic:y", "topic:z"):
        store.put(key, f'{{"first": "{key}"}}')
        seen.append(store.revision)
    store.write([("topic:x", '{"again": 1}'), ("topic:w", "{}")])
    seen.append(store.revision)
    assert seen == sorted(set(seen))  # every write a new, higher revision
    entries = store.list(TOPIC_PREFIX)
    assert [e.key for e in entries] == ["topic:x", "topic:y", "topic:z", "topic:w"]
    assert (entries[0].doc, entries[0].revision) == ('{"again": 1}', seen[-1])
    store.delete("topic:y")
    store.put("topic:y", "{}")  # deleted and written again: a new key, last
    assert [e.key for e in store.list(TOPIC_PREFIX)][-1] == "topic:y"
    assert store.revision > seen[-1]


def test_a_key_changed_twice_in_a_batch_keeps_its_last_change(open_store: OpenStore) -> None:
    store = open_store()
    store.write([("a", "1"), ("a", "2"), ("b", "1"), ("b", None)])
    assert store.get("a") is not None and store.get("a").doc == "2"  # type: ignore[union-attr]
    assert store.get("b") is None


def test_a_failed_batch_writes_nothing(open_store: OpenStore) -> None:
    store = open_store()
    start = store.revision

    def batch() -> Iterator[tuple[str, str | None]]:
        yield "topic:t", "{}"
        raise RuntimeError("encoding failed")

    with pytest.raises(RuntimeError):
        store.write(batch())
    assert store.get("topic:t") is None and store.revision == start


def test_sqlite_lists_the_keys_of_one_batch_in_batch_order(tmp_path: Path) -> None:
    """etcd gives the keys one transaction creates a single ``create_revision`` and lists
    them by key (test_etcd_store); SQLite's rowid keeps the batch's order."""
    store = SqliteStore(tmp_path / "s.db")
    assert store.revision == 0
    store.write([("topic:b", "{}"), ("topic:a", "{}")])
    assert store.revision == 1
    assert [e.key for e in store.list(TOPIC_PREFIX)] == ["topic:b", "topic:a"]


def test_a_file_from_before_revisions_is_read(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("CREATE TABLE state (key TEXT PRIMARY KEY, doc TEXT)")
        conn.execute("INSERT INTO state VALUES ('brokers', '[]'), ('topic:t', '{\"name\": \"t\"}')")
    conn.close()
    assert load_state(SqliteStore(db)) == {"brokers": [], "topics": [{"name": "t"}]}
