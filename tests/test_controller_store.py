"""The controller saves what a change touched, not its whole state (issue 29, finding 3):
a join rewrites its topic's rows only, a burst of joins encodes its topic once, a flood
keeps the state and what waits for the writer bounded, and a restarted controller loads
what was saved (the old single-row file included)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from srtm.control.model import MAX_EVENTS
from srtm.control.service import ControllerOptions, ControllerService
from srtm.control.state import ControlError, Controller
from srtm.control.store import SqliteStore, load_state
from srtm.control.store_writer import WRITE_INTERVAL_S
from srtm.placement import PublisherLoad, TopicSpec

#: The longest publisher id there is: the finding's flood used 211 characters.
LONG = 128


def service_at(db: Path, **options: Any) -> ControllerService:
    return ControllerService(ControllerOptions(db=db, http_port=0, tick_s=60, **options))


def populate(service: ControllerService, others: int = 0) -> None:
    """Two brokers, an open topic ``O`` and ``others`` closed topics of 50 publishers."""
    ctrl = service.ctrl
    for b in ("a", "b"):
        service.execute(ctrl.register(b, f"127.0.0.1:{9 if b == 'a' else 10}",
                                      f"127.0.0.1:{9 if b == 'a' else 10}", 1e9, 0.0))  # fmt: skip
    spec = TopicSpec("O", (PublisherLoad("p0", 1.0),), 20, 5.0, 1e6)
    service.execute(ctrl.create_topic(spec, "srtm", 0.0, open=True, join_secret="s" * 16))
    for i in range(others):
        pubs = tuple(PublisherLoad(f"q{i}-{j}-" + "x" * 100, 1.0) for j in range(50))
        service.execute(ctrl.create_topic(TopicSpec(f"t{i}", pubs, 20, 5.0, 100.0), "srtm", 0.0))


def joiner(i: int) -> str:
    return f"{i:06d}-" + "j" * (LONG - 7)


def rows_of(db: Path) -> dict[str, str]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT key, doc FROM state"))


async def test_a_burst_of_2000_joins_encodes_its_topic_once_and_stays_bounded(
    tmp_path: Path,
) -> None:
    """Before, each join encoded the whole state on the loop and queued it for the writer
    thread: 2,000 joins queued 2,000 copies (1 GB of RSS in the finding)."""
    service = service_at(tmp_path / "c.db")
    await service.start()
    try:
        populate(service, others=20)
        await service.save_state()
        encodes, size = service.writer.encodes, service.writer.encoded_bytes
        for i in range(2000):
            service.execute(service.ctrl.join_open("O", joiner(i), 1.0, None))
        # Nothing is encoded in the burst itself; the write after it encodes O's rows.
        assert service.writer.encodes == encodes
        await service.save_topic("O")
        assert service.writer.encodes - encodes == 1  # topic:O, once (its buckets in it)
        row = len(json.dumps(service.ctrl.topic_json("O")))
        assert service.writer.encoded_bytes - size < row + 1000  # not the other 20 topics
        # What the topic holds per publisher: its id twice (spec, plan) and a few numbers,
        # nothing that grows with the number of joins (events are capped).
        assert row / 2001 < 2 * LONG + 100
        topic = service.ctrl.topics["O"]
        assert len(topic.events) == MAX_EVENTS
        assert len(topic.spec.publishers) == 2001
    finally:
        await service.stop()


async def test_joins_one_after_another_encode_their_topic_at_most_every_interval(
    tmp_path: Path,
) -> None:
    """2,000 joins, each in its own turn of the loop as requests come: the topic's row is
    encoded at most once per ``WRITE_INTERVAL_S`` (a count the code bounds, whatever the
    machine's speed: a slower run only allows more)."""
    service = service_at(tmp_path / "c.db")
    await service.start()
    loop = asyncio.get_running_loop()
    try:
        populate(service, others=5)
        await service.save_state()
        encodes, size, start = service.writer.encodes, service.writer.encoded_bytes, loop.time()
        for i in range(2000):
            service.execute(service.ctrl.join_open("O", joiner(i), 1.0, None))
            await asyncio.sleep(0)
        await service.save_topic("O")
        elapsed = loop.time() - start
        assert service.writer.encodes - encodes <= elapsed / WRITE_INTERVAL_S + 2
        # Each encode is O's row alone: the bytes encoded per join stay a fraction of
        # what encoding O after every join would cost (the whole state, before).
        row = len(json.dumps(service.ctrl.topic_json("O")))
        assert service.writer.encoded_bytes - size <= (service.writer.encodes - encodes) * row
        assert len(service.ctrl.topics["O"].events) == MAX_EVENTS
    finally:
        await service.stop()


async def test_each_join_writes_only_its_topics_rows(tmp_path: Path) -> None:
    """Joins one by one (each written before the next, a write interval apart): every
    write carries O's rows and nothing else, however big the rest of the state is."""
    service = service_at(tmp_path / "c.db")
    batches: list[list[str]] = []
    write = service.store.write

    def recording(rows: list[tuple[str, str | None]]) -> None:
        batches.append([key for key, _ in rows])
        write(rows)

    service.store.write = recording  # type: ignore[method-assign]
    await service.start()
    try:
        populate(service, others=20)
        await service.save_state()
        whole = len(json.dumps(service.ctrl.to_json()))
        batches.clear()
        size = service.writer.encoded_bytes
        for i in range(20):
            service.execute(service.ctrl.join_open("O", joiner(i), 1.0, None))
            await service.save_topic("O")
        assert batches and all(set(b) <= {"topic:O", "buckets:O"} for b in batches), batches[:3]
        per_join = (service.writer.encoded_bytes - size) / 20
        assert per_join < whole / 10, (per_join, whole)
    finally:
        await service.stop()


async def test_writes_wait_in_one_batch_while_the_writer_is_busy(tmp_path: Path) -> None:
    """However many changes come while a write is on its way, one batch waits for it."""
    service = service_at(tmp_path / "c.db")
    release = asyncio.Event()
    loop_writes: list[int] = []
    write = service.store.write

    def slow(rows: list[tuple[str, str | None]]) -> None:
        loop_writes.append(len(rows))
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=10)
        write(rows)

    service.store.write = slow  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    await service.start()
    try:
        populate(service)
        first = service.save_topic("O")
        await asyncio.sleep(0)  # the first batch goes to the writer and blocks there
        waiting = set()
        for i in range(500):
            service.execute(service.ctrl.join_open("O", joiner(i), 1.0, None))
            waiting.add(id(service.writer._next_write))
            await asyncio.sleep(0)
        assert len(waiting) == 1  # every join joined the one waiting batch
        encodes = service.writer.encodes
        release.set()
        await first
        await service.save_topic("O")
        assert service.writer.encodes - encodes <= 4 and len(loop_writes) <= 3
    finally:
        release.set()
        await service.stop()


async def test_max_publishers_applies_to_joins(tmp_path: Path) -> None:
    service = service_at(tmp_path / "c.db", max_publishers=50)
    await service.start()
    try:
        populate(service)
        for i in range(49):
            service.execute(service.ctrl.join_open("O", joiner(i), 1.0, None))
        with pytest.raises(ControlError, match=r"publishers: 51 > 50 per topic") as refused:
            service.ctrl.join_open("O", joiner(99), 1.0, None)
        assert refused.value.status == 413
    finally:
        await service.stop()


async def test_a_restarted_controller_loads_what_it_saved(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    service = service_at(db)
    await service.start()
    try:
        populate(service, others=3)
        service.save_state()
        for i in range(30):
            service.execute(service.ctrl.join_open("O", joiner(i), 1.0 + i, None))
        service.execute(service.ctrl.delete_topic("t1"))
        service.ctrl.set_join("O", max_publisher_rate=7.0)
        service.save_topic("O")
        saved = service.ctrl.to_json()
    finally:
        await service.stop()
    assert "controller" not in rows_of(db)
    again = service_at(db)
    try:
        assert again.ctrl.to_json() == saved
        topic = again.ctrl.topics["O"]
        assert (topic.join_secret, topic.max_publisher_rate) == ("s" * 16, 7.0)
        assert set(again.ctrl.topics) == {"O", "t0", "t2"}
    finally:
        again.store.close()


async def test_an_old_single_row_state_file_is_read_and_rewritten_as_rows(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    ctrl = Controller()
    for b in ("a", "b"):
        ctrl.register(b, "127.0.0.1:9", f"127.0.0.1:{ord(b)}", 1e9, 0.0)
    spec = TopicSpec("O", (PublisherLoad("p0", 1.0),), 20, 5.0, 1e6)
    ctrl.create_topic(spec, "srtm", 0.0, open=True)
    for i in range(2):
        ctrl.create_topic(TopicSpec(f"t{i}", spec.publishers, 20, 5.0, 100.0), "srtm", 0.0)
    saved = ctrl.to_json()
    old = SqliteStore(db)  # as the controller wrote it before: one row
    old.put("controller", json.dumps(saved))
    old.close()
    again = service_at(db)
    assert again.ctrl.to_json() == saved
    await again.start()
    try:
        again.execute(again.ctrl.join_open("O", "late", 1.0, None))
        await again.save_topic("O")
    finally:
        await again.stop()
    rows = rows_of(db)
    assert "controller" not in rows and {"brokers", "topic:O", "topic:t0", "topic:t1"} <= set(rows)
    loaded = load_state(SqliteStore(db))
    assert loaded is not None
    assert [t["name"] for t in loaded["topics"]] == ["O", "t0", "t1"]
    assert any(p["id"] == "late" for p in loaded["topics"][0]["publishers"])


def test_the_broken_state_of_the_finding_is_repaired_at_restore() -> None:
    """A state saved by the old controller after ``rate=1e308`` joins (a topic with no
    sub-buckets, every sum over it overflowing) loads as a working topic."""
    ctrl = Controller()
    ctrl.register("a", "127.0.0.1:9", "127.0.0.1:9", 1e6, 0.0)
    ctrl.create_topic(TopicSpec("O", (PublisherLoad("p1", 10.0),), 20, 5.0, 100.0), "srtm", 0.0,
                      open=True)  # fmt: skip
    doc = ctrl.to_json()
    (topic,) = doc["topics"]
    topic["publishers"] += [{"id": "big", "rate": 1e308, "group": None},
                            {"id": "big2", "rate": 1e308, "group": None}]  # fmt: skip
    topic["unassigned"], topic["buckets"] = ["big", "big2"], {}
    again = Controller()
    again.restore(doc, 0.0)
    t = again.topics["O"]
    assert [p.id for p in t.spec.publishers] == ["p1"] and t.unassigned == []
    assert t.status == "placed" and t.buckets["a"].rate == pytest.approx(100.0)
    assert "rate no bucket can carry" in t.events[-1]
    again.join_open("O", "p2", 5.0, None)  # joins work again (an OverflowError before)
    assert again.assign("O", "p2")["broker"] == "a"
