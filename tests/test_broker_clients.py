"""NSQ's own client libraries, used unchanged, against a real broker process.

pynsq (tornado), gnsq (gevent, not monkey-patched) and ansq (asyncio) each publish with
PUB, MPUB and DPUB, consume one topic from two channels (every channel gets a full copy;
FIN settles), requeue with a delay (REQ: back with attempts + 1) and see a message they
neither FIN nor REQ redelivered after the msg timeout (attempts + 1). Bodies are checked
exactly, and /stats must then show every channel settled with exact counts: nothing in
flight, queued or deferred, so what a client received is all it will ever receive.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import ansq
import gevent
import gnsq
import nsq
import pytest
import tornado.ioloop
from ansq import ConnectionFeatures, ConnectionOptions

from srtm.launch import BrokerProcess, start_broker
from support import eventually

T = TypeVar("T")

DEADLINE_S = 10.0
DEFER_MS = 300
REQ_MS = 250
MSG_TIMEOUT_MS = 1000  # nsqd's minimum
#: Client-side receive times against broker-side timers: clock reads, not precision.
SLACK_S = 0.05
CHANNELS = ("alpha", "beta")


@pytest.fixture(autouse=True)
def _no_greenlets_left() -> Iterator[None]:
    """gnsq's clients must be closed and joined, not merely abandoned."""
    yield
    alive = [g for g in gc.get_objects() if isinstance(g, gevent.Greenlet) and not g.dead]
    assert alive == [], f"greenlets left running: {alive}"


# -- what is sent, what came back ---------------------------------------------------------
@dataclass(frozen=True)
class Payloads:
    pub: list[bytes]
    mpub: list[bytes]
    deferred: bytes

    @property
    def all(self) -> list[bytes]:
        return [*self.pub, *self.mpub, self.deferred]


def payloads(lib: str) -> Payloads:
    """Distinct bodies per library, with binary bytes and one body larger than a read."""
    return Payloads(
        pub=[f"{lib} pub {i}".encode() for i in range(3)],
        mpub=[
            *(f"{lib} mpub {i}".encode() for i in range(3)),
            b"\x00\n\xff\r\n " + lib.encode(),
            lib.encode() * 60_000,
        ],
        deferred=f"{lib} dpub".encode(),
    )


@dataclass(frozen=True)
class Got:
    """One delivery as a client saw it (``at``: time.monotonic() on receipt)."""

    id: bytes
    body: bytes
    attempts: int
    at: float


def label(body: bytes) -> bytes:
    """Short enough for an assertion message."""
    return body if len(body) <= 64 else body[:16] + b"...(%d bytes)" % len(body)


def check_full_copies(got: dict[str, list[Got]], sent: Payloads, t_dpub: float) -> None:
    """Every channel got every body exactly once at its first attempt, a message has the
    same id in every channel, and the DPUB'd one came no earlier than its delay."""
    expected = Counter(label(b) for b in sent.all)
    ids: dict[str, dict[bytes, bytes]] = {}
    for ch, msgs in got.items():
        assert Counter(label(g.body) for g in msgs) == expected, ch
        assert [g.attempts for g in msgs] == [1] * len(msgs), ch
        ids[ch] = {g.body: g.id for g in msgs}
        assert len(set(ids[ch].values())) == len(msgs), f"{ch}: ids not unique"
        (dpub,) = (g for g in msgs if g.body == sent.deferred)
        assert dpub.at - t_dpub >= DEFER_MS / 1000 - SLACK_S, f"{ch}: DPUB delivered early"
    first, *rest = ids.values()
    for other in rest:
        assert other == first, "a message must keep its id in every channel"


def check_redelivered(got: list[Got], body: bytes, since: float, min_s: float) -> None:
    """One message delivered twice: same id and body, attempts 1 then 2, the second no
    earlier than ``min_s`` after ``since`` (a time.monotonic() read before the broker
    could have started that wait)."""
    assert [(g.body, g.attempts) for g in got] == [(body, 1), (body, 2)]
    assert got[0].id == got[1].id
    gap = got[1].at - since
    assert gap >= min_s - SLACK_S, f"redelivered after {gap:.3f} s, expected >= {min_s} s"


def wait_gevent(cond: Callable[[], T], what: str) -> T:
    """Polling that yields to the gevent hub, so gnsq's greenlets run meanwhile."""
    return eventually.blocking(cond, what, sleep=gevent.sleep)


def have(got: dict[str, list[Got]], n: int) -> bool:
    return all(len(msgs) >= n for msgs in got.values())


# -- the broker's view (/stats) ---------------------------------------------------------------
def channel_doc(broker: BrokerProcess, topic: str, channel: str) -> dict[str, Any] | None:
    for t in broker.stats(topic)["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    return None


def subscribed(broker: BrokerProcess, topic: str, channels: Iterable[str]) -> bool:
    docs = [channel_doc(broker, topic, ch) for ch in channels]
    return all(d is not None and d["client_count"] == 1 for d in docs)


def settled(
    broker: BrokerProcess, topic: str, channel: str, finished: int, depth: int = 0
) -> dict[str, Any]:
    """The channel's /stats once nothing is in flight or deferred, ``depth`` messages are
    queued and its clients have FINished ``finished``; {} (falsy) before that."""
    doc = channel_doc(broker, topic, channel)
    if doc is None or doc["in_flight_count"] or doc["deferred_count"] or doc["depth"] != depth:
        return {}
    if sum(c["finish_count"] for c in doc["clients"]) != finished:
        return {}
    return doc


def check_channel(
    doc: dict[str, Any],
    *,
    messages: int,
    deliveries: int,
    requeues: int = 0,
    timeouts: int = 0,
) -> None:
    """Exact counts for a settled channel whose one client FINished ``messages`` after
    ``deliveries`` deliveries."""
    assert doc["message_count"] == messages
    assert doc["requeue_count"] == requeues
    assert doc["timeout_count"] == timeouts
    (client,) = doc["clients"]
    assert client["message_count"] == deliveries
    assert client["finish_count"] == messages
    assert client["requeue_count"] == requeues
    assert client["in_flight_count"] == 0


def check_published(broker: BrokerProcess, topic: str, n: int) -> None:
    doc = broker.stats(topic)
    (t,) = doc["topics"]
    assert t["message_count"] == n
    counts = [p["count"] for c in doc["producers"] for p in c["pub_counts"] if p["topic"] == topic]
    assert counts == [n], "one publishing connection, counted every message"


# -- pynsq: a tornado IOLoop of its own per test ----------------------------------------------
def run_tornado(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on a fresh IOLoop (pynsq binds to IOLoop.current()), then close it."""
    loop = tornado.ioloop.IOLoop(make_current=False)
    try:
        loop.run_sync(main, timeout=3 * DEADLINE_S)
    finally:
        loop.close(all_fds=True)


def pynsq_got(message: nsq.Message) -> Got:
    return Got(message.id, message.body, message.attempts, time.monotonic())


def pynsq_close(*clients: nsq.Reader | nsq.Writer | None) -> None:
    for client in clients:
        if client is None:
            continue
        for conn in list(client.conns.values()):
            conn.close()
        if isinstance(client, nsq.Reader) and client.redist_periodic is not None:
            client.redist_periodic.stop()


class PynsqWriter:
    """nsq.Writer, connected, with every publish's response collected in order."""

    def __init__(self, address: str) -> None:
        self.writer = nsq.Writer([address])
        self.responses: list[object] = []

    async def connected(self) -> PynsqWriter:
        await eventually(
            lambda: any(c.connected() for c in self.writer.conns.values()), "Writer connected"
        )
        return self

    def ack(self, conn: object, data: object) -> None:
        self.responses.append(data)

    async def all_ok(self, n: int) -> None:
        await eventually(lambda: len(self.responses) >= n, f"{n} publish responses")
        assert self.responses == [b"OK"] * n


def pynsq_reader(
    broker: BrokerProcess, topic: str, channel: str, handler: Any, **kwargs: Any
) -> nsq.Reader:
    return nsq.Reader(
        topic,
        channel,
        message_handler=handler,
        nsqd_tcp_addresses=[broker.tcp_address],
        **kwargs,
    )


def test_pynsq_pub_mpub_dpub_two_channels_fin(broker_proc: BrokerProcess) -> None:
    topic, sent = "pynsq_fanout", payloads("pynsq")
    got: dict[str, list[Got]] = {ch: [] for ch in CHANNELS}
    docs: dict[str, dict[str, Any]] = {}
    t_dpub = 0.0

    def handler(ch: str, message: nsq.Message) -> bool:
        got[ch].append(pynsq_got(message))
        return True  # FIN

    async def main() -> None:
        nonlocal t_dpub
        readers = [
            pynsq_reader(broker_proc, topic, ch, partial(handler, ch), max_in_flight=4)
            for ch in CHANNELS
        ]
        w = None
        try:
            await eventually(lambda: subscribed(broker_proc, topic, CHANNELS), "subscribed")
            w = await PynsqWriter(broker_proc.tcp_address).connected()
            t_dpub = time.monotonic()
            w.writer.dpub(topic, DEFER_MS, sent.deferred, callback=w.ack)
            for body in sent.pub:
                w.writer.pub(topic, body, callback=w.ack)
            w.writer.mpub(topic, sent.mpub, callback=w.ack)
            await w.all_ok(5)
            await eventually(lambda: have(got, len(sent.all)), "every message on both channels")
            for ch in CHANNELS:
                docs[ch] = await eventually(
                    lambda ch=ch: settled(broker_proc, topic, ch, len(sent.all)), f"{ch} settled"
                )
            check_published(broker_proc, topic, len(sent.all))
        finally:
            pynsq_close(*readers, w and w.writer)

    run_tornado(main)
    check_full_copies(got, sent, t_dpub)
    for ch in CHANNELS:  # message_count counts the DPUB'd one too, as nsqd's does
        check_channel(docs[ch], messages=len(sent.all), deliveries=len(sent.all))


def test_pynsq_req_with_delay(broker_proc: BrokerProcess) -> None:
    topic, body = "pynsq_req", b"pynsq try again"
    got: list[Got] = []
    doc: dict[str, Any] = {}

    def handler(message: nsq.Message) -> bool | None:
        got.append(pynsq_got(message))
        if message.attempts == 1:
            message.requeue(time_ms=REQ_MS, backoff=False)  # REQ <id> 250
            return None
        return True

    async def main() -> None:
        nonlocal doc
        reader = pynsq_reader(broker_proc, topic, "worker", handler)
        w = None
        try:
            await eventually(lambda: subscribed(broker_proc, topic, ["worker"]), "subscribed")
            w = await PynsqWriter(broker_proc.tcp_address).connected()
            w.writer.pub(topic, body, callback=w.ack)
            await w.all_ok(1)
            await eventually(lambda: len(got) == 2, "the requeued message back")
            doc = await eventually(lambda: settled(broker_proc, topic, "worker", 1), "settled")
        finally:
            pynsq_close(reader, w and w.writer)

    run_tornado(main)
    check_redelivered(got, body, since=got[0].at, min_s=REQ_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, requeues=1)


def test_pynsq_timeout_redelivery(broker_proc: BrokerProcess) -> None:
    topic, body = "pynsq_timeout", b"pynsq never answered"
    got: list[Got] = []
    doc: dict[str, Any] = {}
    t_pub = 0.0

    def handler(message: nsq.Message) -> bool | None:
        got.append(pynsq_got(message))
        if message.attempts == 1:
            message.enable_async()  # and then neither FIN nor REQ
            return None
        return True

    async def main() -> None:
        nonlocal doc, t_pub
        # msg_timeout in seconds; pynsq's IDENTIFY sends it in ms
        reader = pynsq_reader(
            broker_proc, topic, "worker", handler, msg_timeout=MSG_TIMEOUT_MS / 1000
        )
        w = None
        try:
            await eventually(lambda: subscribed(broker_proc, topic, ["worker"]), "subscribed")
            w = await PynsqWriter(broker_proc.tcp_address).connected()
            t_pub = time.monotonic()
            w.writer.pub(topic, body, callback=w.ack)
            await w.all_ok(1)
            await eventually(lambda: len(got) == 2, "the timed-out message back")
            doc = await eventually(lambda: settled(broker_proc, topic, "worker", 1), "settled")
        finally:
            pynsq_close(reader, w and w.writer)

    run_tornado(main)
    check_redelivered(got, body, since=t_pub, min_s=MSG_TIMEOUT_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, timeouts=1)


# -- gnsq: gevent's hub runs while the test waits (no monkey-patching) -----------------------
def gnsq_got(message: gnsq.Message) -> Got:
    return Got(message.id, message.body, message.attempts, time.monotonic())


def gnsq_close(*clients: gnsq.Consumer | gnsq.Producer) -> None:
    for client in clients:
        client.close()
    for client in clients:
        client.join(timeout=DEADLINE_S, raise_error=True)


def gnsq_consumer(broker: BrokerProcess, topic: str, channel: str, handler: Any) -> gnsq.Consumer:
    consumer = gnsq.Consumer(
        topic,
        channel,
        nsqd_tcp_addresses=[broker.tcp_address],
        message_handler=handler,
        max_in_flight=4,
    )
    consumer.start(block=False)
    return consumer


def test_gnsq_pub_mpub_dpub_two_channels_fin(broker_proc: BrokerProcess) -> None:
    topic, sent = "gnsq_fanout", payloads("gnsq")
    got: dict[str, list[Got]] = {ch: [] for ch in CHANNELS}

    def handler(ch: str, consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        got[ch].append(gnsq_got(message))  # returning FINs it

    clients: list[gnsq.Consumer | gnsq.Producer] = []
    try:
        clients += [gnsq_consumer(broker_proc, topic, ch, partial(handler, ch)) for ch in CHANNELS]
        wait_gevent(lambda: subscribed(broker_proc, topic, CHANNELS), "both channels subscribed")
        producer = gnsq.Producer([broker_proc.tcp_address])
        clients.append(producer)
        producer.start()
        t_dpub = time.monotonic()
        assert producer.publish(topic, sent.deferred, defer=DEFER_MS) == b"OK"  # DPUB
        for body in sent.pub:
            assert producer.publish(topic, body) == b"OK"
        assert producer.multipublish(topic, sent.mpub) == b"OK"
        wait_gevent(lambda: have(got, len(sent.all)), "every message on both channels")
        docs = {
            ch: wait_gevent(
                lambda ch=ch: settled(broker_proc, topic, ch, len(sent.all)), f"{ch} settled"
            )
            for ch in CHANNELS
        }
        check_published(broker_proc, topic, len(sent.all))
    finally:
        gnsq_close(*clients)
    check_full_copies(got, sent, t_dpub)
    for ch in CHANNELS:  # message_count counts the DPUB'd one too, as nsqd's does
        check_channel(docs[ch], messages=len(sent.all), deliveries=len(sent.all))


def test_gnsq_req_with_delay(broker_proc: BrokerProcess) -> None:
    topic, body = "gnsq_req", b"gnsq try again"
    got: list[Got] = []

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        got.append(gnsq_got(message))
        if message.attempts == 1:
            message.requeue(time_ms=REQ_MS, backoff=False)

    clients: list[gnsq.Consumer | gnsq.Producer] = []
    try:
        clients.append(gnsq_consumer(broker_proc, topic, "worker", handler))
        wait_gevent(lambda: subscribed(broker_proc, topic, ["worker"]), "subscribed")
        producer = gnsq.Producer([broker_proc.tcp_address])
        clients.append(producer)
        producer.start()
        assert producer.publish(topic, body) == b"OK"
        wait_gevent(lambda: len(got) == 2, "the requeued message back")
        doc = wait_gevent(lambda: settled(broker_proc, topic, "worker", 1), "settled")
    finally:
        gnsq_close(*clients)
    check_redelivered(got, body, since=got[0].at, min_s=REQ_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, requeues=1)


def test_gnsq_timeout_redelivery_with_broker_default(tmp_path: Path) -> None:
    """gnsq cannot negotiate msg_timeout, so this broker's default (--msg-timeout-ms) is
    short: it must apply to clients that do not ask for one."""
    broker = start_broker(tmp_path / "data", ["--msg-timeout-ms", str(MSG_TIMEOUT_MS)])
    topic, body = "gnsq_timeout", b"gnsq never answered"
    got: list[Got] = []

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        got.append(gnsq_got(message))
        if message.attempts == 1:
            message.enable_async()  # and then neither FIN nor REQ

    clients: list[gnsq.Consumer | gnsq.Producer] = []
    try:
        clients.append(gnsq_consumer(broker, topic, "worker", handler))
        wait_gevent(lambda: subscribed(broker, topic, ["worker"]), "subscribed")
        producer = gnsq.Producer([broker.tcp_address])
        clients.append(producer)
        producer.start()
        t_pub = time.monotonic()
        assert producer.publish(topic, body) == b"OK"
        wait_gevent(lambda: len(got) == 2, "the timed-out message back")
        doc = wait_gevent(lambda: settled(broker, topic, "worker", 1), "settled")
    finally:
        try:
            gnsq_close(*clients)
        finally:
            broker.stop()
    check_redelivered(got, body, since=t_pub, min_s=MSG_TIMEOUT_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, timeouts=1)


def test_gnsq_cls_stops_delivery_but_allows_fin(broker_proc: BrokerProcess) -> None:
    """gnsq's low-level NsqdTCPClient: after CLS (answered CLOSE_WAIT) nothing more is
    delivered however high RDY was (nsqd's StartClose sets RDY 0), and what is in flight
    can still be FINished on the open connection."""
    topic, channel = "gnsq_cls", "worker"
    conn = gnsq.NsqdTCPClient(*broker_proc.tcp)
    conn.connect()
    try:
        conn.identify()
        conn.subscribe(topic, channel)
        conn.check_ok()
        conn.ready(5)
        broker_proc.post(f"/pub?topic={topic}", b"before CLS")
        frame, first = conn.read_response()
        assert frame == gnsq.protocol.FRAME_TYPE_MESSAGE
        assert (first.body, first.attempts) == (b"before CLS", 1)
        conn.close()  # CLS
        conn.check_ok(b"CLOSE_WAIT")
        broker_proc.post(f"/pub?topic={topic}", b"after CLS")
        doc = channel_doc(broker_proc, topic, channel)  # dispatch ran before /pub answered
        assert doc is not None
        (client,) = doc["clients"]
        assert (doc["depth"], doc["in_flight_count"], client["ready_count"]) == (1, 1, 0)
        first.finish()  # FIN while closing; failing, it would be E_FIN_FAILED
        doc = wait_gevent(lambda: settled(broker_proc, topic, channel, 1, depth=1), "FIN")
        assert (doc["message_count"], doc["client_count"]) == (2, 1)
    finally:
        conn.close_stream()


def test_commands_after_a_fatal_error_are_not_executed(broker_proc: BrokerProcess) -> None:
    """nsqd stops reading at a fatal error: a PUB pipelined behind one must not publish."""
    topic = "after_fatal"
    conn = gnsq.NsqdTCPClient(*broker_proc.tcp)
    conn.connect()
    try:
        # one write, so the broker reads both at once: RDY before SUB is fatal (E_INVALID)
        conn.send(gnsq.protocol.ready(1) + gnsq.protocol.publish(topic, b"must not publish"))
        frame, error = conn.read_response()
        assert frame == gnsq.protocol.FRAME_TYPE_ERROR
        assert isinstance(error, gnsq.errors.NSQInvalid)
        assert broker_proc.stats(topic)["topics"] == []
    finally:
        conn.close_stream()


# -- ansq: asyncio, on the test's own loop ------------------------------------------------------
def ansq_got(message: ansq.tcp.types.NSQMessage) -> Got:
    return Got(message.id.encode(), message.body, message.attempts, time.monotonic())


async def ansq_next(reader: ansq.tcp.reader.Reader) -> ansq.tcp.types.NSQMessage:
    try:
        message = await asyncio.wait_for(reader.wait_for_message(), DEADLINE_S)
    except TimeoutError:
        raise AssertionError(f"no message for ansq within {DEADLINE_S:g} s") from None
    assert message is not None, "ansq reader lost its connection"
    return message


async def ansq_close(clients: list[Any]) -> None:
    for client in clients:
        await client.close()


async def test_ansq_pub_mpub_dpub_two_channels_fin(broker_proc: BrokerProcess) -> None:
    topic, sent = "ansq_fanout", payloads("ansq")
    address = [broker_proc.tcp_address]
    got: dict[str, list[Got]] = {ch: [] for ch in CHANNELS}

    async def drain(reader: ansq.tcp.reader.Reader, ch: str) -> None:
        while len(got[ch]) < len(sent.all):
            message = await ansq_next(reader)
            got[ch].append(ansq_got(message))
            await message.fin()

    clients: list[Any] = []
    try:
        for ch in CHANNELS:  # create_reader returns once SUB is answered
            clients.append(await ansq.create_reader(topic, ch, address))
        readers = list(clients)
        writer = await ansq.create_writer(address)
        clients.append(writer)
        t_dpub = time.monotonic()
        responses = [await writer.dpub(topic, sent.deferred, DEFER_MS)]
        for body in sent.pub:
            responses.append(await writer.pub(topic, body))
        responses.append(await writer.mpub(topic, *sent.mpub))
        assert [r.body for r in responses] == [b"OK"] * 5
        await asyncio.gather(*(drain(r, ch) for r, ch in zip(readers, CHANNELS, strict=True)))
        docs = {
            ch: await eventually(
                lambda ch=ch: settled(broker_proc, topic, ch, len(sent.all)), f"{ch} settled"
            )
            for ch in CHANNELS
        }
        check_published(broker_proc, topic, len(sent.all))
    finally:
        await ansq_close(clients)
    check_full_copies(got, sent, t_dpub)
    for ch in CHANNELS:  # message_count counts the DPUB'd one too, as nsqd's does
        check_channel(docs[ch], messages=len(sent.all), deliveries=len(sent.all))


async def test_ansq_req_with_delay(broker_proc: BrokerProcess) -> None:
    topic, body = "ansq_req", b"ansq try again"
    address = [broker_proc.tcp_address]
    got: list[Got] = []
    clients: list[Any] = []
    try:
        reader = await ansq.create_reader(topic, "worker", address)
        clients.append(reader)
        writer = await ansq.create_writer(address)
        clients.append(writer)
        assert (await writer.pub(topic, body)).body == b"OK"
        first = await ansq_next(reader)
        got.append(ansq_got(first))
        await first.req(REQ_MS)
        second = await ansq_next(reader)
        got.append(ansq_got(second))
        await second.fin()
        doc = await eventually(lambda: settled(broker_proc, topic, "worker", 1), "settled")
    finally:
        await ansq_close(clients)
    check_redelivered(got, body, since=got[0].at, min_s=REQ_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, requeues=1)


async def test_ansq_timeout_redelivery(broker_proc: BrokerProcess) -> None:
    topic, body = "ansq_timeout", b"ansq never answered"
    address = [broker_proc.tcp_address]
    options = ConnectionOptions(features=ConnectionFeatures(msg_timeout=MSG_TIMEOUT_MS))
    got: list[Got] = []
    clients: list[Any] = []
    try:
        reader = await ansq.create_reader(topic, "worker", address, connection_options=options)
        clients.append(reader)
        writer = await ansq.create_writer(address)
        clients.append(writer)
        t_pub = time.monotonic()
        assert (await writer.pub(topic, body)).body == b"OK"
        got.append(ansq_got(await ansq_next(reader)))  # neither FIN nor REQ
        second = await ansq_next(reader)
        got.append(ansq_got(second))
        await second.fin()
        doc = await eventually(lambda: settled(broker_proc, topic, "worker", 1), "settled")
    finally:
        await ansq_close(clients)
    check_redelivered(got, body, since=t_pub, min_s=MSG_TIMEOUT_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, timeouts=1)


# -- all three on one topic ------------------------------------------------------------------
def test_every_library_reads_what_every_library_wrote(broker_proc: BrokerProcess) -> None:
    """Each library publishes its own bodies to one topic; a consumer of each library on
    its own channel receives all of them, whoever published them."""
    topic = "interop"
    libs = ("pynsq", "gnsq", "ansq")
    for lib in libs:  # channels first, so each gets a copy of everything
        broker_proc.post(f"/topic/create?topic={topic}")
        broker_proc.post(f"/channel/create?topic={topic}&channel={lib}")
    sent = {lib: [f"{lib} says {i}".encode() for i in range(3)] for lib in libs}
    expected = Counter(b for bs in sent.values() for b in bs)
    n = expected.total()
    got: dict[str, list[Got]] = {lib: [] for lib in libs}
    docs: dict[str, dict[str, Any]] = {}

    # publish: gnsq with PUB, pynsq with MPUB, ansq with PUB and MPUB
    producer = gnsq.Producer([broker_proc.tcp_address])
    producer.start()
    try:
        for body in sent["gnsq"]:
            assert producer.publish(topic, body) == b"OK"
    finally:
        gnsq_close(producer)

    async def pynsq_publish() -> None:
        w = await PynsqWriter(broker_proc.tcp_address).connected()
        try:
            w.writer.mpub(topic, sent["pynsq"], callback=w.ack)
            await w.all_ok(1)
        finally:
            pynsq_close(w.writer)

    run_tornado(pynsq_publish)

    async def ansq_publish() -> None:
        writer = await ansq.create_writer([broker_proc.tcp_address])
        try:
            assert (await writer.pub(topic, sent["ansq"][0])).body == b"OK"
            assert (await writer.mpub(topic, *sent["ansq"][1:])).body == b"OK"
        finally:
            await writer.close()

    asyncio.run(ansq_publish())

    # consume: each library drains its own channel with FIN, and the channel settles
    async def pynsq_consume() -> None:
        def handler(message: nsq.Message) -> bool:
            got["pynsq"].append(pynsq_got(message))
            return True

        reader = pynsq_reader(broker_proc, topic, "pynsq", handler, max_in_flight=3)
        try:
            await eventually(lambda: len(got["pynsq"]) >= n, "pynsq consumer done")
            docs["pynsq"] = await eventually(
                lambda: settled(broker_proc, topic, "pynsq", n), "pynsq settled"
            )
        finally:
            pynsq_close(reader)

    run_tornado(pynsq_consume)

    consumer = gnsq_consumer(
        broker_proc, topic, "gnsq", lambda c, message: got["gnsq"].append(gnsq_got(message))
    )
    try:
        wait_gevent(lambda: len(got["gnsq"]) >= n, "gnsq consumer done")
        docs["gnsq"] = wait_gevent(lambda: settled(broker_proc, topic, "gnsq", n), "gnsq settled")
    finally:
        gnsq_close(consumer)

    async def ansq_consume() -> None:
        reader = await ansq.create_reader(topic, "ansq", [broker_proc.tcp_address])
        try:
            while len(got["ansq"]) < n:
                message = await ansq_next(reader)
                got["ansq"].append(ansq_got(message))
                await message.fin()
            docs["ansq"] = await eventually(
                lambda: settled(broker_proc, topic, "ansq", n), "ansq settled"
            )
        finally:
            await reader.close()

    asyncio.run(ansq_consume())

    for lib in libs:
        assert Counter(g.body for g in got[lib]) == expected, lib
        assert [g.attempts for g in got[lib]] == [1] * n, lib
        check_channel(docs[lib], messages=n, deliveries=n)
    (t,) = broker_proc.stats(topic)["topics"]
    assert t["message_count"] == n
