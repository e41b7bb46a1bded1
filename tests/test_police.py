"""A topic over its envelope is policed (issue 29, item 2), and a flooding connection
cannot take the broker's loop (item 3): the bound on what waits behind a sub-bucket,
its three overflow policies, and the per-connection budget of commands per loop turn.

The pure tests run the topic on injected clocks; the live ones on a broker started here,
with a raw NSQ client over TCP and the HTTP API."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from nsq_raw import RawClient
from srtm.broker.intake import TURN_BUDGET
from srtm.broker.message import Message
from srtm.broker.report import stats_document
from srtm.broker.reporter import apply_registration
from srtm.broker.state import Topic, memory_queues
from srtm.broker.tcp import Client
from srtm.control.actions import SetBucket
from srtm.control.console import ConsoleState, console_state, latencies
from srtm.control.state import Controller
from srtm.control.validate import ControlError
from srtm.placement import PublisherLoad, TopicSpec
from srtm.protocol import Nop, Pub
from srtm.ratelimit import TokenBucket, check_conformance
from srtm.ratelimit.overflow import (
    DEFAULT_BOUND,
    DEFAULT_MAX_WAIT_MS,
    Bound,
    OverflowPolicy,
    check_bound,
    wait_ns,
)
from support import (
    BrokerApi,
    ControllerClient,
    MakeBroker,
    call,
    eventually,
    registered,
    topic_of,
)

MS = 1_000_000


def message(i: int, arrival: int = 0) -> Message:
    return Message(b"%016x" % i, b"m%d" % i, arrival, arrival)


# -- the bound, pure --------------------------------------------------------------------
def test_the_default_blocks_and_lets_a_second_wait_several_times() -> None:
    assert Bound(DEFAULT_MAX_WAIT_MS, OverflowPolicy.BLOCK) == DEFAULT_BOUND
    assert DEFAULT_MAX_WAIT_MS >= 1_000
    assert check_bound(None, None) == DEFAULT_BOUND
    assert check_bound(250, "drop-oldest") == Bound(250.0, OverflowPolicy.DROP_OLDEST)


@pytest.mark.parametrize(
    ("wait", "overflow", "named"),
    [
        (0, None, "max_wait_ms"),
        (-5, None, "max_wait_ms"),
        (float("nan"), None, "max_wait_ms"),
        (float("inf"), None, "max_wait_ms"),
        (True, None, "max_wait_ms"),
        ("100", None, "max_wait_ms"),
        (100, "drop", "overflow"),
        (100, 3, "overflow"),
    ],
)
def test_a_bad_bound_is_refused_naming_the_field(
    wait: object, overflow: object, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        check_bound(wait, overflow)


def test_the_wait_is_the_meters_backlog_over_its_rate_and_falls_with_time() -> None:
    now = [0]
    meter = TokenBucket(100, 10, clock=lambda: now[0])
    assert wait_ns(meter, 0) == 0
    for _ in range(20):
        meter.reserve(at=0)
    # 20 booked at t = 0 on (100/s, 10): the next passes after the 10 beyond the burst
    # and itself, less the burst's tolerance: 110 ms.
    assert wait_ns(meter, 0) == pytest.approx(110 * MS, abs=1_000)
    assert wait_ns(meter, 60 * MS) == pytest.approx(50 * MS, abs=1_000)
    assert wait_ns(meter, 200 * MS) == 0


def test_a_topic_is_over_its_bound_only_while_shaped() -> None:
    now = [0]
    topic = Topic("t", memory_queues(), bound=Bound(50, OverflowPolicy.BLOCK))
    for i in range(10):
        topic.put(message(i))
    assert topic.over_bound_ns(0) == 0  # unshaped: nothing waits behind a bucket
    topic.shape(100, 1, clock=lambda: now[0])
    for i in range(10):
        topic.put(message(i))
    # 10 booked at 0 on (100/s, 1): the 11th would wait 100 ms, 50 over the bound.
    assert topic.over_bound_ns(0) == pytest.approx(50 * MS, abs=1_000)
    assert topic.over_bound_ns(50 * MS) <= 0
    topic.hold()
    assert topic.over_bound_ns(0) == 0


def test_drop_oldest_keeps_the_newest_within_the_bound_and_counts_the_rest() -> None:
    now = [0]
    topic = Topic("t", memory_queues(), bound=Bound(50, OverflowPolicy.DROP_OLDEST))
    topic.shape(100, 1, clock=lambda: now[0])
    ch = topic.channel("c")
    for i in range(100):
        topic.put(message(i))  # a flood at t = 0: 1 s of the rate
    # 6 may wait (0, 10, ..., 50 ms); each later one takes the oldest's place.
    assert len(topic.shaping) == 6 and topic.dropped_over_bound == 94
    assert topic.over_bound_ns(0) == pytest.approx(10 * MS, abs=1_000)  # a 7th: 60 ms
    releases = []
    while topic.shaping:
        due = topic.next_release_ns()
        assert due is not None
        now[0] = due
        releases += [r.due_ns for r in topic.release(due)]
    assert [m.body for m in ch.queue.memory()] == [b"m%d" % i for i in range(94, 100)]
    assert check_conformance(releases, 100, 1) is None
    assert releases[-1] <= 50 * MS  # nothing waited longer than the bound


def test_drop_oldest_gives_back_a_booked_heads_token() -> None:
    now = [0]
    topic = Topic("t", memory_queues(), bound=Bound(15, OverflowPolicy.DROP_OLDEST))
    topic.shape(100, 1, clock=lambda: now[0])
    topic.channel("c")
    topic.put(message(0))
    assert topic.release(0)  # the first passes at once
    topic.put(message(1))
    assert topic.next_release_ns() == 10 * MS  # the head is booked on the bucket
    topic.put(message(2))  # waits 20 ms: over, and message 1 makes room
    assert topic.dropped_over_bound == 1
    assert topic.next_release_ns() == 10 * MS  # message 2 gets message 1's token


def test_block_and_refuse_leave_the_queue_to_the_broker() -> None:
    for overflow in (OverflowPolicy.BLOCK, OverflowPolicy.REFUSE):
        topic = Topic("t", memory_queues(), bound=Bound(10, overflow))
        topic.shape(100, 1, clock=lambda: 0)
        for i in range(50):
            topic.put(message(i))
        assert len(topic.shaping) == 50 and topic.dropped_over_bound == 0


# -- live: a broker started here ----------------------------------------------------------
async def test_refuse_answers_e_pub_failed_naming_the_limit(broker_api: BrokerApi) -> None:
    broker, session = broker_api
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.policing.set_bound("t", Bound(10, OverflowPolicy.REFUSE))
    pub = await RawClient.connect(*broker.tcp_address)
    try:
        await pub.send(Pub("t", b"first"), Pub("t", b"second"))
        assert await pub.response() == b"OK"  # nothing waits: it passes at once
        err = await pub.error()
        assert err.startswith("E_PUB_FAILED") and "max_wait_ms 10" in err, err
        assert await pub.closed()  # fatal, as nsqd's E_PUB_FAILED
    finally:
        await pub.close()
    status, doc = await call(session, "POST", "/pub?topic=t", b"third")
    assert status == 503 and "E_PUB_FAILED" in str(doc) and "max_wait_ms" in str(doc), doc
    assert broker.topics["t"].refused_over_bound == 2
    assert broker.topics["t"].message_count == 1
    status, stats = await call(session, "GET", "/stats?format=json&topic=t")
    bound = stats["srtm"]["topics"][0]["bound"]
    assert bound["overflow"] == "refuse" and bound["refused"] == 2 and bound["over"], bound


async def test_drop_oldest_drops_what_waits_and_shows_it(broker_api: BrokerApi) -> None:
    broker, session = broker_api
    broker.shares.set_bucket("t", 2.0, 1.0)
    status, answer = await call(
        session, "POST", "/srtm/bucket?topic=t&rate=2&burst=1&max_wait_ms=100&overflow=drop-oldest"
    )
    assert status == 200 and answer["bound"]["overflow"] == "drop-oldest", answer
    broker.channel("t", "c")
    pub = await RawClient.connect(*broker.tcp_address)
    try:
        await pub.send(*[Pub("t", b"m%d" % i) for i in range(20)])
        for _ in range(20):
            assert await pub.response() == b"OK"  # the publisher is not refused
    finally:
        await pub.close()
    topic = broker.topics["t"]
    assert topic.message_count == 20 and topic.dropped_over_bound >= 15
    assert topic.depth + topic.channels["c"].depth == 20 - topic.dropped_over_bound
    status, stats = await call(session, "GET", "/stats?format=json&topic=t")
    assert stats["srtm"]["topics"][0]["bound"]["dropped"] == topic.dropped_over_bound
    status, metrics = await call(session, "GET", "/metrics")
    assert f'srtm_topic_over_bound_dropped_total{{topic="t"}} {topic.dropped_over_bound}' in (
        metrics
    ), metrics


def client_of(broker: object, n: int = 1) -> Client:
    clients = [c for c in broker.clients if c.pub_counts]  # type: ignore[attr-defined]
    assert len(clients) == n
    return clients[0]


async def test_block_stops_reading_the_publisher_and_resumes_as_it_drains(
    broker_api: BrokerApi,
) -> None:
    broker, _ = broker_api
    broker.shares.set_bucket("t", 100.0, 1.0)
    broker.policing.set_bound("t", Bound(50, OverflowPolicy.BLOCK))
    pub = await RawClient.connect(*broker.tcp_address)
    try:
        start = time.monotonic()
        await pub.send(*[Pub("t", b"m%d" % i) for i in range(60)])
        topic = broker.topics["t"]
        await eventually(lambda: broker.policing.blocked.get("t"), "the publisher blocked")
        client = client_of(broker)
        assert client.blocked and topic.message_count < 60
        bound = stats_document(broker, "t")["srtm"]["topics"][0]["bound"]
        assert bound["blocked_connections"] == 1, bound
        assert [x["blocked"] for x in bound["senders"]] == [True], bound
        for _ in range(60):
            assert await pub.response() == b"OK"
        # 60 at 100/s with 50 ms allowed to wait: accepted at the rate, not at once.
        assert time.monotonic() - start >= 0.4
        assert topic.message_count == 60 and client.blocks >= 1
        await eventually(lambda: not client.blocked, "read again once drained")
        # Nothing that waited ever waited much longer than the bound allows.
        assert topic.over_bound_ns(time.time_ns()) <= 0
    finally:
        await pub.close()


async def test_a_blocked_publisher_is_read_again_when_its_topic_is_unshaped(
    broker_api: BrokerApi,
) -> None:
    broker, _ = broker_api
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.policing.set_bound("t", Bound(10, OverflowPolicy.BLOCK))
    pub = await RawClient.connect(*broker.tcp_address)
    try:
        await pub.send(*[Pub("t", b"m%d" % i) for i in range(10)])
        await eventually(lambda: broker.policing.blocked.get("t"), "the publisher blocked")
        await asyncio.sleep(0.2)
        assert broker.topics["t"].message_count < 10  # at 1/s it would stay blocked
        broker.shares.clear("t")
        for _ in range(10):
            assert (await pub.frame(3.0)).data == b"OK"
        assert not client_of(broker).blocked
    finally:
        await pub.close()


async def test_a_relay_link_is_never_blocked(broker_api: BrokerApi) -> None:
    broker, _ = broker_api
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.policing.set_bound("t", Bound(10, OverflowPolicy.BLOCK))
    link = await RawClient.connect(*broker.tcp_address)
    try:
        await link.identify(srtm_relay=True, srtm_header_publisher=True)
        await link.send(*[Pub("t", b"m%d" % i) for i in range(10)])
        for _ in range(10):
            assert (await link.frame(2.0)).data == b"OK"
        assert not broker.policing.blocked and broker.topics["t"].message_count == 10
    finally:
        await link.close()


async def test_an_http_publish_over_a_blocking_bound_waits_until_it_drains(
    broker_api: BrokerApi,
) -> None:
    broker, session = broker_api
    broker.shares.set_bucket("t", 10.0, 1.0)
    broker.policing.set_bound("t", Bound(150, OverflowPolicy.BLOCK))
    assert (await call(session, "POST", "/pub?topic=t", b"first"))[0] == 200
    assert (await call(session, "POST", "/pub?topic=t", b"second"))[0] == 200
    start = time.monotonic()
    # The third would wait 200 ms behind the bucket: its answer waits until it would
    # wait 150 ms, 50 ms from now.
    assert (await call(session, "POST", "/pub?topic=t", b"third"))[0] == 200
    assert time.monotonic() - start >= 0.04
    assert broker.topics["t"].message_count == 3
    # Waiting longer than max_wait_ms more for it: 503, naming the limit.
    broker.policing.set_bound("t", Bound(10, OverflowPolicy.BLOCK))
    status, doc = await call(session, "POST", "/pub?topic=t", b"fourth")
    assert status == 503 and "max_wait_ms 10" in str(doc), doc
    assert broker.topics["t"].message_count == 3


async def test_a_flooding_connection_runs_a_bounded_number_of_commands_per_loop_turn(
    broker_api: BrokerApi,
) -> None:
    broker, _ = broker_api
    n = 8 * TURN_BUDGET
    samples: list[int] = []
    loop = asyncio.get_running_loop()

    def sample() -> None:  # once per loop turn
        topic = broker.topics.get("t")
        samples.append(0 if topic is None else topic.message_count)
        if samples[-1] < n:
            loop.call_soon(sample)

    pub = await RawClient.connect(*broker.tcp_address)
    try:
        await pub.send(Nop())  # a connection made before the flood
        loop.call_soon(sample)
        await pub.send(*[Pub("t", b"m") for _ in range(n)])  # one write: few reads
        await eventually(lambda: samples and samples[-1] >= n, "the flood accepted")
        steps = [b - a for a, b in itertools.pairwise(samples)]
        assert max(steps) <= TURN_BUDGET, steps
    finally:
        await pub.close()


# -- the controller: the bound is the tenant's, set at creation and by PATCH --------------
def test_a_topics_bound_goes_to_brokers_with_its_sub_buckets_and_survives_a_restart() -> None:
    ctrl = registered(2)
    bound = Bound(200, OverflowPolicy.REFUSE)
    actions = ctrl.create_topic(topic_of(4), "srtm", now=0, bound=bound)
    pushed = [a for a in actions if isinstance(a, SetBucket)]
    assert pushed
    for a in pushed:
        doc = ctrl.bucket_doc(a.topic, a.bucket)
        assert doc["max_wait_ms"] == 200 and doc["overflow"] == "refuse"
    again = Controller()
    again.restore(ctrl.to_json(), now=0)
    assert again.topics["t"].bound == bound
    assert ctrl.topic_doc("t")["overflow"] == "refuse"


def test_a_topic_without_a_bound_gets_the_default() -> None:
    ctrl = registered(1)
    ctrl.create_topic(topic_of(2), "srtm", now=0)
    assert ctrl.topics["t"].bound == DEFAULT_BOUND
    doc = ctrl.to_json()
    del doc["topics"][0]["bound"]  # a state saved before bounds
    again = Controller()
    again.restore(doc, now=0)
    assert again.topics["t"].bound == DEFAULT_BOUND


def test_patching_the_bound_pushes_the_same_sub_buckets_with_it() -> None:
    ctrl = registered(2)
    ctrl.create_topic(topic_of(4), "srtm", now=0)
    buckets = dict(ctrl.topics["t"].buckets)
    actions = ctrl.change_topic("t", max_wait_ms=50, overflow="drop-oldest")
    assert {(a.broker, a.bucket) for a in actions if isinstance(a, SetBucket)} == set(
        buckets.items()
    )
    assert ctrl.topics["t"].bound == Bound(50, OverflowPolicy.DROP_OLDEST)
    assert ctrl.topics["t"].events[-1] == "changed max_wait_ms 50, overflow drop-oldest"
    assert ctrl.change_topic("t", overflow="drop-oldest") == []  # nothing changed
    with pytest.raises(ControlError, match="overflow"):
        ctrl.change_topic("t", overflow="drop")


async def test_the_api_takes_the_bound_at_creation_and_by_patch(
    controller_api: ControllerClient,
) -> None:
    reg = {"id": "a", "tcp_address": "127.0.0.1:9", "http_address": "127.0.0.1:9", "mcap": 1e6}
    assert (await controller_api.call("POST", "/brokers", reg))[0] == 200
    status, body = await controller_api.call("POST", "/brokers", reg)
    assert body["buckets"] == {}  # none yet; a topic's come with its bound (below)
    pubs = [{"id": "p0", "rate": 10}]
    doc = {"name": "t", "slo_p99_ms": 5.0, "burst": 20, "publishers": pubs}
    status, body = await controller_api.call("POST", "/topics", doc | {"overflow": "drop"})
    assert status == 400 and "overflow" in body["message"], body
    status, body = await controller_api.call("POST", "/topics", doc | {"max_wait_ms": -1})
    assert status == 400 and "max_wait_ms" in body["message"], body
    status, body = await controller_api.call("POST", "/topics", doc)
    assert status == 201 and body["overflow"] == "block", body
    assert body["max_wait_ms"] == DEFAULT_MAX_WAIT_MS
    status, body = await controller_api.call("PATCH", "/topics/t", {"max_wait_ms": 250})
    assert status == 200 and body["max_wait_ms"] == 250 and body["overflow"] == "block", body
    status, body = await controller_api.call("POST", "/brokers", reg)
    assert body["buckets"]["t"]["max_wait_ms"] == 250, body
    assert body["buckets"]["t"]["overflow"] == "block", body


async def test_a_registration_answer_gives_the_broker_its_topics_bounds(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    answer = {
        "lease_s": 3.0,
        "buckets": {
            "a": {"rate": 10.0, "burst": 2.0, "max_wait_ms": 75.0, "overflow": "refuse"},
            "b": {"rate": 10.0, "burst": 2.0, "max_wait_ms": -1, "overflow": "refuse"},
        },
        "held": [],
    }
    apply_registration(broker, time.monotonic(), answer)
    assert broker.topics["a"].bound == Bound(75, OverflowPolicy.REFUSE)
    assert broker.topics["b"].bucket is not None and broker.topics["b"].bound is None


# -- the console marks a topic over its envelope, and who sends it --------------------------
def _console_controller() -> Controller:
    ctrl = registered(2, mcap=400)
    pubs = tuple(PublisherLoad(f"p{i}", 100.0, f"g{i % 2}") for i in range(4))
    ctrl.create_topic(TopicSpec("t", pubs, 40.0, 5.0, 440.0), "maxmin", 0.0)
    return ctrl


def test_the_console_marks_a_topic_sent_faster_than_its_sub_bucket_and_its_publishers() -> None:
    ctrl = _console_controller()
    topic = ctrl.topics["t"]
    flooded, calm = sorted(topic.buckets)
    ctrl.report(flooded, 13_000.0, {"t": (13_000.0, 0.0)}, 1.0)  # against ~220 allocated
    ctrl.report(calm, 150.0, {"t": (150.0, 0.0)}, 1.0)
    doc = ConsoleState.model_validate(console_state(ctrl, {}, {}, 2.0))
    (t,) = doc.topics
    assert t.over_envelope and t.measured_rate == pytest.approx(13_150.0)
    shares = {s.id: s for s in t.brokers}
    assert shares[flooded].over_envelope and not shares[calm].over_envelope
    assert t.senders == sorted(topic.assignment[flooded])  # the plan's, none named


def test_the_console_names_the_senders_a_broker_reports_over_the_bound() -> None:
    ctrl = _console_controller()
    b = sorted(ctrl.topics["t"].buckets)[0]
    stats = {"srtm": {"topics": [{
        "topic": "t", "delivery_ns": {"count": 0}, "backlog_age_ns": 0,
        "bound": {"over": True, "senders": [{"publisher": "flooder", "remote_address": "x"}]},
    }]}}  # fmt: skip
    readings = {b: latencies(stats)}
    assert readings[b]["t"].over_bound and readings[b]["t"].senders == ("flooder",)
    (t,) = console_state(ctrl, readings, {}, 0.0)["topics"]
    assert t["over_envelope"] and t["senders"] == ["flooder"]
    assert not console_state(ctrl, {}, {}, 0.0)["topics"][0]["over_envelope"]


async def test_a_topics_bound_survives_a_restart(make_broker: MakeBroker) -> None:
    first = await make_broker()
    first.shares.set_bucket("t", 10.0, 2.0)
    first.policing.set_bound("t", Bound(75, OverflowPolicy.DROP_OLDEST))
    first.shares.set_bucket("u", 10.0, 2.0)  # no bound given: none
    await first.stop()
    second = await make_broker()
    assert second.topics["t"].bound == Bound(75, OverflowPolicy.DROP_OLDEST)
    assert second.topics["u"].bound is None
