"""What a topic's SLO is judged on: delivery latency to subscribers that were there, over a
sliding window (``WindowRecorder``, moved by the clock it is given), with waits for a
subscriber kept apart. Unit tests of the window and of the served/waited rule, and the
README quick start's case live: a controller and a broker on 127.0.0.1, a managed topic,
one ``/pub``, a subscriber a second later, more traffic; the console says the SLO is met
and shows the second as backlog."""

from __future__ import annotations

import asyncio
import contextlib
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.broker import Broker, BrokerOptions
from srtm.broker.http import serve_http
from srtm.broker.queue import Record
from srtm.broker.reporter import report_loop
from srtm.broker.state import Topic, memory_queues
from srtm.broker.stats import NS_PER_S, RateWindow, TopicStats, WindowRecorder
from srtm.client import Received, Subscriber
from srtm.control.console import ConsoleState
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from support import eventually

MS = 1_000_000
STEP = 10 * NS_PER_S


def values(*ns: int) -> array[int]:
    return array("q", ns)


# -- the window ------------------------------------------------------------------------------


def test_the_window_keeps_its_steps_and_drops_those_that_left() -> None:
    w = WindowRecorder(step_ns=STEP, steps=6)
    assert w.seconds == 60.0
    w.extend(values(*[5 * MS] * 99, 900 * MS), now=1 * NS_PER_S)  # step [0, 10 s)
    w.extend(values(*[2 * MS] * 100), now=25 * NS_PER_S)  # step [20, 30 s)
    at_30 = w.summary(now=30 * NS_PER_S)
    assert at_30["count"] == 200 and 890 * MS <= at_30["p999"] <= 910 * MS
    # The step [0, 10 s) is in the window until the one beginning at 60 s ...
    assert w.summary(now=59 * NS_PER_S)["count"] == 200
    # ... then it leaves whole, with its 900 ms: the p99 is the recent traffic's.
    at_60 = w.summary(now=60 * NS_PER_S)
    assert at_60["count"] == 100
    assert 1.98 * MS <= at_60["p99"] <= 2.02 * MS  # two significant digits
    assert w.summary(now=90 * NS_PER_S)["count"] == 0  # nothing in the last 50-60 s


def test_values_recorded_long_ago_and_never_read_do_not_come_back() -> None:
    """A step is begun by the first call in it, not by a housekeeping pass: values of a
    quiet topic recorded long before the next read stay in the step they were made in."""
    w = WindowRecorder(step_ns=STEP, steps=6)
    w.extend(values(7 * MS), now=3 * NS_PER_S)
    w.extend(values(1 * MS), now=500 * NS_PER_S)  # the next value, minutes later
    s = w.summary(now=501 * NS_PER_S)
    assert s["count"] == 1 and s["p99"] < 1.1 * MS


def test_the_window_adds_like_a_recorder_and_flushes_when_read() -> None:
    w = WindowRecorder(step_ns=STEP, steps=2)
    w.extend(values(1, 2, 3), now=0)
    assert list(w.current.pending) == [1, 2, 3] and w.recorders() == [w.current]
    assert w.summary(now=1)["count"] == 3 and not w.current.pending
    with pytest.raises(ValueError):
        WindowRecorder(step_ns=0)


# -- served or waited ------------------------------------------------------------------------


def record(i: int, arrival: int, attempts: int = 0) -> Record:
    return (b"%016x" % i, b"b", arrival, arrival, arrival, attempts, "", None)


def test_a_dispatch_tells_what_waited_for_a_subscriber_from_what_was_served() -> None:
    ts = TopicStats(RateWindow())
    now = 100 * NS_PER_S
    subscribed = now - 2 * NS_PER_S
    # Two arrived before the channel's subscriber, two after; one is a redelivery.
    recs = [record(0, subscribed - NS_PER_S), record(1, subscribed - 1), record(2, subscribed),
            record(3, now - 5 * MS), record(4, subscribed - NS_PER_S, attempts=1)]  # fmt: skip
    ts.dispatched("c", recs, now, False, True, False, subscribed)
    assert list(ts.delivery.current.pending) == [2 * NS_PER_S, 5 * MS]
    assert list(ts.subscriber_wait.current.pending) == [3 * NS_PER_S, 2 * NS_PER_S + 1]
    # The topic's since-start figure (nsqd's) still counts them all, waits included.
    assert len(ts.latency.pending) == 4
    # A channel with nothing left from before its subscriber is not looked at again.
    ts.dispatched("c", [record(5, subscribed - NS_PER_S)], now, False, False, False, 0)
    assert len(ts.delivery.current.pending) == 3


class Sub:
    rdy, in_flight, msg_timeout_ns = 10, 0, 60 * NS_PER_S


def test_the_first_subscriber_marks_what_arrived_before_it() -> None:
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    first, second = Sub(), Sub()
    ch.add_consumer(first, 1_000)
    ch.add_consumer(second, 2_000)  # not the first: nothing more waited
    assert ch.unserved_before_ns == 1_000
    ch.remove_consumer(first)
    ch.remove_consumer(second)
    ch.add_consumer(first, 3_000)  # none between: what came meanwhile waited
    assert ch.unserved_before_ns == 3_000


def test_a_topic_says_whether_it_may_still_hold_a_message_from_before() -> None:
    topic = Topic("t", memory_queues())
    ch = topic.channel("c")
    assert not topic.may_hold_before(ch, 1_000) and topic.oldest_arrival_ns() is None
    ch.queue.extend([record(0, 500), record(1, 1_500)])
    assert topic.may_hold_before(ch, 1_000) and topic.oldest_arrival_ns() == 500
    ch.queue.take(1)
    assert not topic.may_hold_before(ch, 1_000) and topic.oldest_arrival_ns() == 1_500
    topic.held.extend([record(2, 2_000)])  # held for a first channel: may be older
    assert topic.may_hold_before(ch, 1_000)


# -- the quick start, live -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def quick_start(tmp_path: Path) -> AsyncIterator[tuple[str, Broker, str]]:
    """A controller and one broker reporting to it, in process on 127.0.0.1: the
    controller's URL, the broker and the broker's HTTP URL."""
    service = ControllerService(ControllerOptions(db=tmp_path / "c.db", http_port=0, tick_s=0.2))
    await service.start()
    assert service.http_address is not None
    url = "http://{}:{}".format(*service.http_address)
    broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "b1",
                                  broker_id=1, controller=url, report_interval_s=0.2))  # fmt: skip
    await broker.start()
    runner, port = await serve_http(broker)
    reporting = asyncio.create_task(report_loop(broker, url, 1000.0, 0.2))
    try:
        await eventually(lambda: service.ctrl.up(), "the broker registered")
        yield url, broker, f"http://127.0.0.1:{port}"
    finally:
        reporting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporting
        await runner.cleanup()
        await broker.stop()
        await service.stop()


async def test_the_quick_start_meets_its_slo_and_shows_the_wait_as_backlog(
    tmp_path: Path,
) -> None:
    async with quick_start(tmp_path) as (url, broker, broker_url), aiohttp.ClientSession() as http:

        async def call(method: str, path: str, **kw: Any) -> Any:
            async with http.request(method, path, **kw) as resp:
                assert resp.status in (200, 201), await resp.text()
                return await resp.json() if resp.content_type == "application/json" else None

        await call("POST", url + "/topics", json={
            "name": "sensors", "slo_p99_ms": 20, "burst": 40,
            "publishers": [{"id": "p1", "rate": 10}, {"id": "p2", "rate": 10}]})  # fmt: skip
        await eventually(lambda: getattr(broker.topics.get("sensors"), "bucket", None),
                         "the topic's sub-bucket on its broker")  # fmt: skip
        await call("POST", broker_url + "/pub?topic=sensors", data=b"hello")
        await asyncio.sleep(1.0)  # the user's subscriber comes a second later
        got: list[Received] = []
        sub = Subscriber("sensors", "all", controller=url, on_message=got.append, refresh_s=0.2)
        await sub.start()
        try:
            await eventually(lambda: len(got), "the first message", until=lambda n: n == 1)
            for k in range(20):  # more traffic, within the topic's burst
                await call("POST", broker_url + "/pub?topic=sensors", data=b"m%d" % k)
            await eventually(lambda: len(got), "every message", until=lambda n: n == 21)
            state = await call("GET", url + "/ui/state")
        finally:
            await sub.close()
    (t,) = ConsoleState.model_validate(state).topics
    assert t.slo_met is True, t
    assert t.deliveries == 20 and t.delivery_p99_ms is not None and t.delivery_p99_ms < 20
    # The second waited for the subscriber: backlog, apart from the SLO.
    assert t.waits == 1 and t.wait_p99_ms is not None and t.wait_p99_ms >= 1000, t
    assert t.backlog_age_ms == 0  # nothing left waiting
    (share,) = t.brokers
    assert (share.deliveries, share.waits) == (20, 1)
