"""Publishers move between brokers while a subscriber consumes: every (publisher, sequence
number) arrives, once. Controller and three brokers are real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.launch import LocalCluster, start_cluster
from srtm.protocol import header as mheader
from support import eventually

N_PUBLISHERS = 6
PER_PUBLISHER = 300


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    traces = ["--trace-dir", str(tmp_path / "traces"), "--run", "move"]
    c = start_cluster(tmp_path, 3, broker_args=["--mcap", "5000", *traces])
    try:
        yield c
    finally:
        c.stop()


async def publish_all(pubs: list[Publisher], rate: float) -> None:
    """Every publisher sends PER_PUBLISHER messages at ``rate``/s on an absolute schedule."""
    start = time.monotonic()
    for k in range(PER_PUBLISHER):
        delay = start + k / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the load's schedule, not a wait for an event
        for p in pubs:
            await p.publish()


@pytest.mark.slow
async def test_moving_publishers_loses_and_duplicates_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    ctrl, brokers, url = cluster.controller, cluster.brokers, cluster.url
    doc = {
        "name": "moving",
        "slo_p99_ms": 5.0,
        "burst": 50,
        "policy": "srtm",
        "publishers": [
            {"id": f"p{i}", "rate": 100, "group": f"g{i % 2}"} for i in range(N_PUBLISHERS)
        ],
    }
    plan = json.loads(ctrl.post("/topics", json.dumps(doc).encode()))
    assert len(plan["brokers"]) == 1  # 600 msg/s fits on one broker of 5,000
    first = plan["brokers"][0]["id"]
    others = [str(i) for i in (1, 2, 3) if str(i) != first]

    got: list[tuple[str, int]] = []
    where: Counter[str] = Counter()

    def record(r: Received) -> None:
        assert r.header is not None
        got.append((r.header.publisher, r.header.seq))
        where[r.broker] += 1

    sub = Subscriber(
        "moving", "all", controller=url, on_message=record, refresh_s=0.2,
        trace_dir=tmp_path / "traces", run="move",
    )  # fmt: skip
    await sub.start()
    pubs = [
        Publisher("moving", f"p{i}", controller=url, max_pending=50) for i in range(N_PUBLISHERS)
    ]
    for p in pubs:
        await p.start()

    async def moves() -> None:
        """Both moves while the traffic runs; p2 moves again once its first move is made."""
        await eventually(
            lambda: pubs[0].seq, "a fifth sent", until=lambda n: n >= PER_PUBLISHER // 5
        )
        body = json.dumps({"publishers": ["p0", "p1", "p2"], "to": others[0]}).encode()
        await asyncio.to_thread(ctrl.post, "/topics/moving/move", body)
        await eventually(
            lambda: [p.migrations for p in pubs[:3]], "p0-p2 moved", until=lambda m: m == [1] * 3
        )
        body = json.dumps({"publishers": ["p2", "p3"], "to": others[1]}).encode()
        await asyncio.to_thread(ctrl.post, "/topics/moving/move", body)

    await asyncio.gather(publish_all(pubs, rate=200), moves())
    for p in pubs:
        await p.close()
    await eventually(
        lambda: len(got),
        "every message received",
        until=lambda n: n >= N_PUBLISHERS * PER_PUBLISHER,
    )
    await sub.close()

    expected = {(f"p{i}", s) for i in range(N_PUBLISHERS) for s in range(PER_PUBLISHER)}
    counts = Counter(got)
    assert set(counts) == expected, f"missing {len(expected - set(counts))}"
    assert max(counts.values()) == 1, "duplicates"
    assert {p.id: p.migrations for p in pubs} == {
        "p0": 1, "p1": 1, "p2": 2, "p3": 1, "p4": 0, "p5": 0
    }  # fmt: skip
    assert len(where) == 3  # the subscriber found all three brokers through the plan
    assert json.loads(ctrl.get("/plan?topic=moving"))["version"] == 3
    assert sub.latency.get_total_count() == len(got)

    # Subscriber-side trace rows join the brokers' on (run, broker, msg_id), one to one.
    for b in brokers:
        b.stop()  # flushes the broker-side traces
    sub_rows = pq.read_table(tmp_path / "traces" / "subscriber").to_pylist()
    broker_rows = pq.read_table(tmp_path / "traces" / "broker").to_pylist()
    assert len(sub_rows) == len(broker_rows) == N_PUBLISHERS * PER_PUBLISHER
    by_key = {(r["run"], r["broker"], r["msg_id"]): r for r in broker_rows}
    for r in sub_rows:
        b = by_key[(r["run"], r["broker"], r["msg_id"])]
        assert b["publisher"] == r["publisher"]
        assert r["t_send_ns"] <= b["t_arrive_ns"] <= b["t_dispatch_ns"] <= r["t_recv_ns"]


def test_header_round_trip_and_plain_bodies() -> None:
    h = mheader.Header("sensor-17", "block-3", 42, 1_700_000_000_000_000_000)
    body = mheader.encode(h, 100)
    assert len(body) == 100 and mheader.decode(body) == h
    assert mheader.decode(b"hello") is None
    with pytest.raises(ValueError, match="publisher"):
        mheader.encode(mheader.Header("x" * 25, None, 0, 0))
