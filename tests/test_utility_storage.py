"""The storage-latency bound (srtm.utility.storage): a reliable flow's producers wait for
each acknowledgement, so the disk's latency bounds the rate they can send."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.utility.storage import (
    LatencyEstimate,
    Logger,
    closed_loop_rates,
    inherent_latency,
    rate_bound,
    reachable_rate,
    unloaded_write_s,
)


def test_inherent_latency_leaves_out_the_schedulers_wait() -> None:
    assert inherent_latency(1_000_000, 6_000_000, 2_000_000) == pytest.approx(0.003)
    assert inherent_latency(0, 1_000, 5_000) == 0.0
    with pytest.raises(ValueError, match="before received"):
        inherent_latency(10, 5)


def test_rate_bound_is_producers_over_latency_within_the_range() -> None:
    assert rate_bound(10, 200, 2, 0.020) == pytest.approx(100)
    assert rate_bound(10, 200, 2, 0.001) == 200  # not binding
    assert rate_bound(10, 200, 1, 1.0) == 10  # never under r_min
    assert rate_bound(10, 200, 4, 0.02, per_transaction=2) == 200
    assert rate_bound(10, 200, 1, None) == 200  # no estimate yet
    with pytest.raises(ValueError):
        rate_bound(10, 200, -1, 0.1)


def test_logger_latency_grows_with_load_and_is_infinite_at_its_bandwidth() -> None:
    disk = Logger(bandwidth_bps=10e6, write_s=0.002)
    assert disk.latency(0) == pytest.approx(0.002)
    assert disk.latency(5e6) == pytest.approx(0.004)
    assert math.isinf(disk.latency(10e6))
    assert unloaded_write_s(disk.latency(5e6), 5e6, 10e6) == pytest.approx(0.002)
    assert unloaded_write_s(math.inf, 5e6, 10e6) is None


@given(
    producers=st.integers(1, 20),
    write_ms=st.floats(0.1, 20),
    record=st.floats(100, 1e5),
    other=st.floats(0, 0.9),
)
def test_reachable_rate_is_the_closed_loops_fixed_point(
    producers: int, write_ms: float, record: float, other: float
) -> None:
    disk = Logger(bandwidth_bps=50e6, write_s=write_ms / 1e3)
    got, latency = closed_loop_rates(
        disk, {"f": 1e9}, {"f": producers}, {"f": record}, background_bps=other * 50e6
    )
    want = reachable_rate(producers, write_ms / 1e3, 50e6, record, other * 50e6)
    assert got["f"] == pytest.approx(want, rel=1e-6)
    assert got["f"] == pytest.approx(producers / latency, rel=1e-6)


def test_an_allowance_under_the_bound_is_what_the_flow_sends() -> None:
    disk = Logger(bandwidth_bps=20e6, write_s=0.002)
    got, latency = closed_loop_rates(disk, {"f": 50.0}, {"f": 1}, {"f": 1064.0 * 201})
    assert got["f"] == 50.0
    assert latency < 1 / 50


def test_latency_estimate_smooths_and_skips_nonsense() -> None:
    est = LatencyEstimate(alpha=0.5)
    assert est.update(0.010) == 0.010
    assert est.update(0.020) == pytest.approx(0.015)
    assert est.update(math.nan) == pytest.approx(0.015)
    assert est.update(-1) == pytest.approx(0.015)
    with pytest.raises(ValueError):
        LatencyEstimate(alpha=0)


# -- live: the broker measures it, the controller bounds the rate by it -------------------
async def test_a_persisted_publish_reports_its_storage_latency(tmp_path: Path) -> None:
    """With --mem-queue-size 0 every PUB is acknowledged once its disk write is done: the
    broker reports the mean time from arrival to that write, per topic, once per report."""
    from srtm.broker import Broker, BrokerOptions
    from srtm.broker.reporter import report_document
    from srtm.client import Publisher

    broker = Broker(
        BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "d", mem_queue_size=0)
    )
    await broker.start()
    assert broker.tcp_address is not None
    pub = Publisher("logged", "p", address="{}:{}".format(*broker.tcp_address))
    try:
        await pub.start()
        for _ in range(20):
            await (await pub.publish())
        doc = report_document(broker)
        latency = doc["topics"]["logged"]["storage_latency_ms"]
        assert 0 < latency < 5_000
        # Taken once: the next report has nothing new to tell.
        assert "storage_latency_ms" not in report_document(broker)["topics"]["logged"]
    finally:
        await pub.close()
        await broker.stop()


async def test_an_in_memory_topic_reports_no_storage_latency(tmp_path: Path) -> None:
    from srtm.broker import Broker, BrokerOptions
    from srtm.broker.reporter import report_document
    from srtm.client import Publisher

    broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "d"))
    await broker.start()
    assert broker.tcp_address is not None
    pub = Publisher("fast", "p", address="{}:{}".format(*broker.tcp_address))
    try:
        await pub.start()
        await (await pub.publish())
        assert "storage_latency_ms" not in report_document(broker)["topics"]["fast"]
    finally:
        await pub.close()
        await broker.stop()


def test_the_controller_caps_a_persisted_topics_rate_at_its_producers_reach() -> None:
    from srtm.control.utility import UtilityControl
    from srtm.utility import optimize
    from support import registered, topic_of

    spec = {
        "kind": "one-to-many", "r_min": 10, "r_max": 200,
        "classes": [{"name": "gold", "available": 10, "utility": {"slope": 1}}],
    }  # fmt: skip
    c = registered(2)
    c.create_topic(topic_of(4, rate=50.0), "lb", 0, utility=spec)  # 4 publishers
    u = UtilityControl()

    def report(latency_ms: float | None) -> None:
        stored = None if latency_ms is None else {"t": latency_ms}
        for b in ("b0", "b1"):
            c.report(b, 50.0, {"t": (50.0, 0.0)}, 1.0, demand={"t": {"gold": 10}},
                     storage_latency_ms=stored)  # fmt: skip

    report(None)
    assert u.build(c).flows[0].r_max == 200  # nothing persisted: no bound
    report(40.0)  # 4 producers each waiting 40 ms: at most 100 msg/s
    u.observe(c)
    flow = u.build(c).flows[0]
    assert flow.r_max == pytest.approx(100)
    assert optimize(u.build(c)).rates["t"] == pytest.approx(100)
    report(1000.0)  # far slower: smoothed (a fifth of the way), never under r_min
    u.observe(c)
    assert u.storage["t"].value_s == pytest.approx(0.04 + 0.2 * (1.0 - 0.04))
    assert u.build(c).flows[0].r_max == pytest.approx(4 / u.storage["t"].value_s)


def test_a_report_with_a_bad_storage_latency_is_refused() -> None:
    from pydantic import ValidationError

    from srtm.control.documents import BrokerReport, parse

    good = {"load": 1.0, "topics": {"t": {"rate": 1.0, "backlog": 0.0, "storage_latency_ms": 3}}}
    assert parse(BrokerReport, good).storage_latency_ms() == {"t": 3}
    bad = {"load": 1.0, "topics": {"t": {"rate": 1.0, "backlog": 0.0, "storage_latency_ms": -1}}}
    with pytest.raises((ValueError, ValidationError)):
        parse(BrokerReport, bad)


@pytest.mark.slow
async def test_a_persisted_topics_rate_is_bounded_end_to_end(tmp_path: Path) -> None:
    """An in-process controller and a broker with --mem-queue-size 0 reporting to it: a
    publisher that waits for each acknowledgement gives the topic a storage latency,
    the broker reports it, and the controller's run caps the topic's r_max (10^6 in the
    spec) at 1 / latency, shown in GET /utility."""
    import asyncio
    import contextlib

    import aiohttp

    from srtm.broker import Broker, BrokerOptions
    from srtm.broker.http import serve_http
    from srtm.broker.reporter import report_loop
    from srtm.client import Publisher, Subscriber
    from srtm.control.options import ControllerOptions
    from srtm.control.service import ControllerService
    from support import eventually

    service = ControllerService(
        ControllerOptions(http_port=0, db=tmp_path / "c.db", tick_s=0.2, utility_interval_s=0.5)
    )
    await service.start()
    assert service.http_address is not None
    url = f"http://127.0.0.1:{service.http_address[1]}"
    broker = Broker(BrokerOptions(
        tcp_port=0, http_port=0, data_dir=tmp_path / "b", broker_id=1, controller=url,
        report_interval_s=0.2, mem_queue_size=0,
    ))  # fmt: skip
    await broker.start()
    runner, _ = await serve_http(broker)
    reporting = asyncio.create_task(report_loop(broker, url, 1e7, 0.2))
    spec = {"kind": "one-to-many", "r_min": 10, "r_max": 1e6,
            "classes": [{"name": "gold", "available": 1, "utility": {"slope": 1}}]}  # fmt: skip
    topic = {"name": "logged", "slo_p99_ms": 1000, "burst": 1000, "rate": 500,
             "publishers": [{"id": "p1", "rate": 400}], "utility": spec}  # fmt: skip
    sub = Subscriber("logged", "c", controller=url, refresh_s=0.2, consumer_class="gold")
    pub = Publisher("logged", "p1", controller=url)
    stop = asyncio.Event()

    def retrieved(fut: asyncio.Future[None]) -> None:
        if not fut.cancelled():
            fut.exception()  # an ack pending at the close fails; that is not the test

    async def closed_loop() -> None:  # one message per transaction
        await pub.start()
        while not stop.is_set():
            ack = await pub.publish()
            ack.add_done_callback(retrieved)
            await ack

    sending: asyncio.Task[None] | None = None
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/topics", json=topic) as r:
                assert r.status == 201, await r.text()
            await sub.start()
            sending = asyncio.create_task(closed_loop())

            async def bound() -> float:
                async with http.get(f"{url}/utility") as r:
                    flows = (await r.json())["flows"]
                return float(flows[0]["r_max"]) if flows else 1e6

            r_max = await eventually(bound, "a run capping r_max", until=lambda v: v < 1e6)
        latency = service.utility.storage["logged"].value_s
        assert latency is not None and r_max == pytest.approx(1 / latency, rel=1e-6)
    finally:
        stop.set()
        if sending is not None:  # its last acknowledgement comes while the broker is up
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(sending), 5)
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
        await pub.close()
        await sub.close()
        reporting.cancel()
        await asyncio.gather(reporting, return_exceptions=True)
        await runner.cleanup()
        await broker.stop()
        await service.stop()
