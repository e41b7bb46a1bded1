"""Deferred messages (DPUB, ``/pub?defer=``) go through the topic's sub-bucket when due:
on the pure topic (property-tested against (r, b)), bounded in memory, and on a live
broker where a flood of ``DPUB topic 0`` once walked around the envelope (issue 29)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from hypothesis import given
from hypothesis import strategies as st

from nsq_raw import RawClient
from srtm.broker import Broker
from srtm.broker.http import serve_http
from srtm.broker.message import Message
from srtm.broker.queue import DeferredQueue, MessageQueue
from srtm.broker.state import Topic, memory_queues
from srtm.protocol import Dpub, FrameType, Mpub, Rdy, Sub, decode_message
from srtm.ratelimit import check_conformance
from support import ListOverflow, MakeBroker, eventually

MS = 1_000_000
S = 1_000_000_000


def message(i: int, arrival: int = 0) -> Message:
    return Message(b"%016x" % i, b"body%d" % i, arrival, arrival)


# -- the deferred queue --------------------------------------------------------------------
def test_the_soonest_due_stay_in_memory_the_rest_go_to_the_backend() -> None:
    disk = ListOverflow()
    q = DeferredQueue(MessageQueue(2, disk))
    for i, due in enumerate((300, 100, 200, 50)):
        q.push(message(i), due)
    assert (q.memory_depth, q.backend_depth, len(q)) == (2, 2, 4)
    assert [r[4] for r in disk.records] == [300, 200]  # pushed out, due kept in the record
    assert q.next_due_ns() == 50
    assert [m.release_ns for m in q.pop_due(99)] == [50]
    assert [m.release_ns for m in q.pop_due(250)] == [100, 200]
    assert [m.body for m in q.pop_due(300)] == [b"body0"] and len(q) == 0


def test_a_short_deferral_is_not_held_behind_long_ones_past_the_bound() -> None:
    """Found by test_fuzz_session: four DPUBs of an hour filled memory (4 messages), and
    a DPUB of 0 waited on disk behind them, for an hour."""
    for mem in (0, 2):
        q = DeferredQueue(MessageQueue(mem, ListOverflow()))
        for i in range(3):
            q.push(message(i), 3_600 * S)
        q.push(message(9), 5)
        assert q.next_due_ns() == 5
        assert [m.body for m in q.pop_due(5)] == [b"body9"], mem


def test_a_pass_finds_what_is_due_on_disk_behind_later_ones() -> None:
    disk = ListOverflow()
    q = DeferredQueue(MessageQueue(1, disk))
    for i, due in enumerate((100, 200, 50)):  # memory: 50; disk: 200, then 100
        q.push(message(i), due)
    assert [m.release_ns for m in q.pop_due(50)] == [50]
    assert q.next_due_ns() == 100  # 200 came back to memory; 100 may be due on disk
    assert [m.release_ns for m in q.pop_due(100)] == [100]  # on time, not behind 200
    assert [m.release_ns for m in q.pop_due(200)] == [200]


def test_without_a_backend_the_excess_is_dropped_and_counted() -> None:
    q = DeferredQueue(MessageQueue(1))
    assert q.push(message(0), 10) and not q.push(message(1), 5)
    assert len(q) == 1 and q.spill.dropped == 1


def test_a_memory_bound_of_zero_writes_every_one_and_reads_back_a_few() -> None:
    disk = ListOverflow()
    q = DeferredQueue(MessageQueue(0, disk), read_back=2)
    for i in range(5):
        q.push(message(i), 10 * i)
    assert (q.memory_depth, q.backend_depth) == (0, 5)  # acknowledged means written
    assert q.next_due_ns() == 0 and q.memory_depth == 2  # read back: still on disk too
    assert [m.body for m in q.pop_due(40)] == [b"body%d" % i for i in range(5)]


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), max_size=60),
    st.integers(0, 3),
    st.integers(1, 3),
)
def test_every_deferred_message_comes_out_exactly_when_due(
    pushes: list[tuple[int, int]], mem: int, read_back: int
) -> None:
    """Whatever the bound: driven by ``next_due_ns``, each comes out at its due time."""
    q = DeferredQueue(MessageQueue(mem, ListOverflow()), read_back=read_back)
    now, due, out = 0, {}, []

    def run_until(t: int) -> None:
        nonlocal now
        while (nxt := q.next_due_ns()) is not None and nxt <= t:
            now = max(now, nxt)
            out.extend((now, m) for m in q.pop_due(now))
        now = max(now, t)

    for i, (gap, delay) in enumerate(pushes):
        run_until(now + gap)
        m = message(i)
        due[m.id] = now + delay
        q.push(m, due[m.id])
        out.extend((now, m) for m in q.pop_due(now))
    run_until(1 << 40)
    assert sorted(m.id for _, m in out) == sorted(due)
    assert all(t == due[m.id] for t, m in out)
    assert len(q) == 0


# -- the pure topic ------------------------------------------------------------------------
def new_topic() -> Topic:
    return Topic("t", memory_queues())


def drain(topic: Topic, now: int, until: int) -> list[tuple[int, Message]]:
    """Run an ideal release loop from ``now`` to ``until``: every deferred message moved
    and every release made at the very time it is due. (release time, message) pairs."""
    out: list[tuple[int, Message]] = []
    while now <= until:
        topic.tick(now)
        out += [(now, r.message) for r in topic.release(now)]
        nxt = [t for t in (topic.next_deferred_ns(), topic.next_release_ns()) if t is not None]
        if not nxt:
            break
        now = max(now + 1, min(nxt))
    return out


def test_dpub_0_is_paced_by_the_bucket_like_a_pub() -> None:
    topic = new_topic()
    topic.shape(100, 10, clock=lambda: 0)
    ch = topic.channel("c")
    for i in range(200):
        topic.defer(message(i), 0)
    out = drain(topic, 0, 10 * S)
    times = [t for t, _ in out]
    assert len(out) == 200 and ch.depth == 200
    assert check_conformance(times, 100, 10) is None
    assert times[9] == 0 and times[10] > 0 and times[-1] >= 1.89 * S


def test_a_deferred_backlog_due_together_is_paced_from_when_it_is_due() -> None:
    """Booked at their arrival, 1,000 messages deferred 10 s would all be due at once."""
    topic = new_topic()
    topic.shape(100, 10, clock=lambda: 0)
    topic.channel("c")
    for i in range(1_000):
        topic.defer(message(i, arrival=i * MS), 10 * S)
    out = drain(topic, 0, 30 * S)
    times = [t for t, _ in out]
    assert times[0] == 10 * S and len(out) == 1_000
    assert check_conformance(times, 100, 10) is None


def test_a_held_or_paused_topic_releases_no_deferred_message() -> None:
    held = new_topic()
    held.hold()
    held.channel("c")
    held.defer(message(0), 5)
    assert drain(held, 0, 10 * S) == [] and len(held.shaping) == 1
    held.shape(100, 10, clock=lambda: 10 * S)  # a share: it flows
    assert [m.body for _, m in drain(held, 10 * S, 11 * S)] == [b"body0"]

    paused = new_topic()
    paused.channel("c")
    paused.set_paused(True, 0)
    paused.defer(message(1), 5)
    assert drain(paused, 0, 10 * S) == []
    paused.set_paused(False, 10 * S)
    assert [m.body for _, m in drain(paused, 10 * S, 11 * S)] == [b"body1"]


def test_an_unmanaged_topic_delivers_a_deferred_message_when_due() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    topic.defer(message(0), 5 * MS)
    assert drain(topic, 0, 5 * MS - 1) == [] and ch.depth == 0
    assert [t for t, _ in drain(topic, 5 * MS - 1, S)] == [5 * MS]
    assert ch.depth == 1 and ch.message_count == 1


@dataclass(frozen=True)
class Arrival:
    gap_us: int  # after the previous arrival
    kind: str  # PUB, MPUB, DPUB, PAUSE (pauses for ``n`` ms)
    n: int  # MPUB: messages; DPUB: delay (ms); PAUSE: its length (ms)


arrivals = st.lists(
    st.builds(
        Arrival,
        st.integers(0, 30_000),
        st.sampled_from(["PUB", "MPUB", "DPUB", "DPUB", "PAUSE"]),
        st.integers(0, 40),
    ),
    max_size=80,
)


@given(
    arrivals,
    st.sampled_from([(100.0, 10.0), (1_000.0, 1.0), (250.0, 32.0), (7.5, 3.0)]),
)
def test_any_mix_of_pub_mpub_and_dpub_is_released_within_r_b_and_none_lost(
    events: list[Arrival], bucket: tuple[float, float]
) -> None:
    """An ideal release loop on the pure topic (injected clock): whatever arrives when,
    no window of length t sees more than b + r t releases, every accepted message is
    released exactly once, and none before it is due."""
    rate, burst = bucket
    now = 0
    topic = new_topic()
    topic.shape(rate, burst, clock=lambda: now)
    topic.channel("c")
    due: dict[bytes, int] = {}
    released: list[tuple[int, Message]] = []
    ids = iter(range(1 << 30))
    unpause_at: int | None = None

    def run_until(t: int) -> None:
        nonlocal now, unpause_at
        while True:
            nxt = [x for x in (topic.next_deferred_ns(), topic.next_release_ns()) if x is not None]
            if unpause_at is not None:
                nxt.append(unpause_at)
            step = min(nxt, default=None)
            if step is None or step > t:
                now = max(now, t)
                return
            now = max(now, step)
            if unpause_at is not None and now >= unpause_at:
                topic.set_paused(False, now)
                unpause_at = None
            topic.tick(now)
            released.extend((now, r.message) for r in topic.release(now))

    for ev in events:
        run_until(now + ev.gap_us * 1_000)
        if ev.kind == "PAUSE":
            if unpause_at is None:
                topic.set_paused(True, now)
                unpause_at = now + ev.n * MS
            continue
        if ev.kind == "DPUB":
            m = message(next(ids), now)
            due[m.id] = now + ev.n * MS
            topic.defer(m, due[m.id])
        elif ev.kind == "PUB":
            m = message(next(ids), now)
            due[m.id] = now
            topic.put(m)
        else:
            batch = [b"%016x" % next(ids) for _ in range(ev.n + 1)]
            due.update(dict.fromkeys(batch, now))
            topic.put_many(batch, [b"x"] * len(batch), now, now, "p")
        topic.tick(now)
        released.extend((now, r.message) for r in topic.release(now))
    run_until(1 << 62)

    times = [t for t, _ in released]
    assert check_conformance(times, rate, burst) is None
    got = [m.id for _, m in released]
    assert sorted(got) == sorted(due) and len(set(got)) == len(got)  # all, once
    assert all(t >= due[m.id] for t, m in released)


# -- a live broker ---------------------------------------------------------------------------
class Collector:
    """A consumer with RDY 2500 on a topic's channel ``c``: ``got`` fills with the arrival
    times (monotonic) of what it gets (never FIN'd: RDY outlasts every test here)."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.got: list[float] = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    @classmethod
    async def on(cls, broker: Broker, topic: str) -> Collector:
        c = await connect(broker)
        await c.send(Sub(topic, "c"), Rdy(2500))
        assert await c.response() == b"OK"
        return cls(c)

    async def _run(self) -> None:
        while True:
            f = await self.client.frame(timeout=60)
            if f.kind is FrameType.MESSAGE:
                decode_message(f.data)
                self.got.append(time.monotonic())

    def within(self, start: float, seconds: float) -> int:
        """Messages received from ``start`` for ``seconds`` (not before: what the bucket
        released while the requests were still being made is no part of the window)."""
        return sum(1 for t in self.got if 0 <= t - start <= seconds)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.client.close()


async def connect(broker: Broker) -> RawClient:
    host, port = broker.tcp_address or ("", 0)
    return await RawClient.connect(host, port)


async def test_a_flood_of_dpub_0_on_a_shaped_topic_is_released_at_its_pace(
    make_broker: MakeBroker,
) -> None:
    """Issue 29, finding 1: on a topic shaped at (100/s, 10), 2,000 ``DPUB topic 0`` (and
    DPUBs of 1 to 10 ms) delivered all 2,000 within 2 s; now about b + r t do."""
    broker = await make_broker()
    broker.shares.set_bucket("t", 100.0, 10.0)
    consumer = await Collector.on(broker, "t")
    pub = await connect(broker)
    try:
        start = time.monotonic()
        await pub.send(*(Dpub("t", i % 11, b"d%d" % i) for i in range(2_000)))
        for _ in range(2_000):
            assert await pub.response() == b"OK"
        await asyncio.sleep(max(0.0, start + 2.0 - time.monotonic()))
        in_2s = consumer.within(start, 2.0)
        assert 150 <= in_2s <= 10 + 100 * 2.0 + 15, in_2s  # b + r t, and a loop's slack
        topic, ch = broker.topics["t"], broker.topics["t"].channels["c"]
        owed = topic.depth + topic.deferred_count + ch.depth + len(ch.in_flight)
        assert owed == 2_000  # none lost (none FIN'd: each is still somewhere)
    finally:
        await pub.close()
        await consumer.close()


async def test_http_pub_defer_and_mpub_go_through_the_bucket(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    broker.shares.set_bucket("t", 100.0, 10.0)
    consumer = await Collector.on(broker, "t")
    runner, http_port = await serve_http(broker)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{http_port}") as s:

            async def post(path: str, body: bytes) -> None:
                async with s.post(path, data=body) as resp:
                    assert resp.status == 200, await resp.text()

            await asyncio.gather(*(post("/pub?topic=t&defer=0", b"x") for _ in range(300)))
            await post("/mpub?topic=t", b"\n".join(b"m%d" % i for i in range(300)))
            # The window opens once all 600 wait for tokens: how long 301 requests take
            # is the machine's, not the bucket's.
            start = time.monotonic()
            await asyncio.sleep(1.0)
        in_1s = consumer.within(start, 1.0)
        assert 50 <= in_1s <= 10 + 100 * 1.0 + 15, in_1s
    finally:
        await runner.cleanup()
        await consumer.close()


async def test_a_paused_or_held_topic_delivers_no_dpub_until_it_flows(
    make_broker: MakeBroker,
) -> None:
    """nsqd 1.3.0 delivers none of the DPUBs to a paused topic (SRTM delivered them all),
    nor does SRTM while a managed topic is held; unpaused, or shaped, they flow."""
    broker = await make_broker()
    broker.channel("p", "c")
    broker.pause_topic("p", True)
    broker.shares.hold("h")
    broker.channel("h", "c")
    paused, held = await Collector.on(broker, "p"), await Collector.on(broker, "h")
    pub = await connect(broker)
    try:
        await pub.send(*(Dpub(t, 0, b"x") for t in ("p", "h") for _ in range(20)))
        for _ in range(40):
            assert await pub.response() == b"OK"
        await asyncio.sleep(0.3)  # many scans: the DPUBs are due, none may go out
        assert paused.got == [] and held.got == []
        broker.pause_topic("p", False)
        broker.shares.set_bucket("h", 1_000.0, 5.0)
        await eventually(lambda: len(paused.got), "all once unpaused", until=lambda n: n == 20)
        await eventually(lambda: len(held.got), "all once shaped", until=lambda n: n == 20)
    finally:
        await pub.close()
        await paused.close()
        await held.close()


async def test_a_paused_channel_gets_no_dpub_until_unpaused(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    broker.channel("t", "c")
    broker.pause_channel("t", "c", True)
    consumer = await Collector.on(broker, "t")
    pub = await connect(broker)
    try:
        await pub.send(*(Dpub("t", 0, b"x") for _ in range(10)), Mpub("t", [b"y"] * 5))
        for _ in range(11):
            assert await pub.response() == b"OK"
        await asyncio.sleep(0.2)
        assert consumer.got == []
        broker.pause_channel("t", "c", False)
        await eventually(lambda: len(consumer.got), "all once unpaused", until=lambda n: n == 15)
    finally:
        await pub.close()
        await consumer.close()


async def test_deferred_messages_beyond_mem_queue_size_wait_on_disk_and_survive_a_stop(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker(mem_queue_size=10)
    pub = await connect(broker)
    await pub.send(*(Dpub("t", 3_600_000, b"later%d" % i) for i in range(50)))
    for _ in range(50):
        assert await pub.response() == b"OK"
    await pub.close()
    deferred = broker.topics["t"].deferred
    assert (deferred.memory_depth, deferred.backend_depth) == (10, 40)
    await broker.stop()
    again = await make_broker(mem_queue_size=10)
    assert again.topics["t"].deferred_count == 50
    assert again.topics["t"].depth == 0  # still deferred, not released by the restart
