"""NSQ's own client libraries, used unchanged, against a real broker process.

pynsq (tornado), gnsq (gevent, not monkey-patched) and ansq (asyncio) each publish with
PUB, MPUB and DPUB, consume one topic from two channels (every channel gets a full copy;
FIN settles), requeue with a delay (REQ: back with attempts + 1) and see a message they
neither FIN nor REQ redelivered after the msg timeout (attempts + 1). Bodies are checked
exactly, and /stats must then show every channel settled with the exact counts, so no
message can still be on its way: what a client received is all it will ever receive.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
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

from broker_proc import BrokerProcess, start_broker

T = TypeVar("T")

DEADLINE_S = 10.0
POLL_S = 0.01
DEFER_MS = 300
REQ_MS = 250
MSG_TIMEOUT_MS = 1000  # nsqd's minimum
#: Client receive times vs broker timers: allow this much early (clock reads, not timers).
SLACK_S = 0.05
CHANNELS = ("alpha", "beta")


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
    return body if len(body) <= 64 else body[:16] + b"...(%d bytes)" % len(body)


def bodies(got: Iterable[Got]) -> Counter[bytes]:
    return Counter(label(g.body) for g in got)


def check_full_copies(got: dict[str, list[Got]], sent: Payloads, t_dpub: float) -> None:
    """Every channel got every body exactly once, first attempt, the same id per body in
    every channel, and the deferred one no earlier than its delay."""
    ids: dict[str, dict[bytes, bytes]] = {}
    for ch, msgs in got.items():
        assert bodies(msgs) == bodies(Got(b"", b, 1, 0) for b in sent.all), ch
        assert [g.attempts for g in msgs] == [1] * len(msgs), ch
        ids[ch] = {g.body: g.id for g in msgs}
        assert len(set(ids[ch].values())) == len(msgs), f"{ch}: ids not unique"
        (dpub,) = (g for g in msgs if g.body == sent.deferred)
        assert dpub.at - t_dpub >= DEFER_MS / 1000 - SLACK_S, f"{ch}: DPUB delivered early"
    first, *rest = ids.values()
    for other in rest:
        assert other == first, "a message must keep its id in every channel"


def check_redelivered(got: list[Got], body: bytes, min_gap_s: float) -> None:
    """One message, delivered twice: same id and body, attempts 1 then 2, ``min_gap_s`` apart."""
    assert [(g.body, g.attempts) for g in got] == [(body, 1), (body, 2)]
    assert got[0].id == got[1].id
    gap = got[1].at - got[0].at
    assert gap >= min_gap_s - SLACK_S, f"redelivered after {gap:.3f} s, expected >= {min_gap_s}"


# -- waiting --------------------------------------------------------------------------------
def wait_sync(
    cond: Callable[[], T | None], what: str, sleep: Callable[[float], object] = time.sleep
) -> T:
    """Poll ``cond`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {DEADLINE_S:g} s waiting for {what}")
        sleep(POLL_S)


async def wait_async(cond: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {DEADLINE_S:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


def wait_gevent(cond: Callable[[], T | None], what: str) -> T:
    """Polling that yields to the gevent hub, so gnsq's greenlets run meanwhile."""
    return wait_sync(cond, what, sleep=gevent.sleep)


def have(got: dict[str, list[Got]], n: int) -> bool:
    return all(len(msgs) >= n for msgs in got.values())


# -- the broker's view ----------------------------------------------------------------------
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


def settled(broker: BrokerProcess, topic: str, channel: str, finished: int) -> dict[str, Any]:
    """The channel's /stats once nothing is queued, deferred or in flight and its client
    has FINished ``finished`` messages; {} (falsy) before that."""
    doc = channel_doc(broker, topic, channel)
    if doc is None or doc["depth"] or doc["in_flight_count"] or doc["deferred_count"]:
        return {}
    if sum(c["finish_count"] for c in doc["clients"]) != finished:
        return {}
    return doc


def settled_but(
    broker: BrokerProcess, topic: str, channel: str, *, depth: int, finished: int
) -> dict[str, Any]:
    """Like ``settled``, with ``depth`` messages left queued on purpose."""
    doc = channel_doc(broker, topic, channel)
    if doc is None or doc["depth"] != depth or doc["in_flight_count"] or doc["deferred_count"]:
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
    counted: int | None = -1,
) -> None:
    """Exact counts for a settled channel with one client that FINished ``messages``
    (``counted``: the channel's message_count, ``messages`` unless given; None: unchecked)."""
    if counted is not None:
        assert doc["message_count"] == (messages if counted == -1 else counted)
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


# -- pynsq: a tornado IOLoop of its own per test --------------------------------------------
def run_tornado(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on a fresh IOLoop (pynsq binds to IOLoop.current()), then close it."""
    loop = tornado.ioloop.IOLoop(make_current=False)
    try:
        loop.run_sync(main, timeout=3 * DEADLINE_S)
    finally:
        loop.close(all_fds=True)


def pynsq_got(message: nsq.Message) -> Got:
    return Got(message.id, message.body, message.attempts, time.monotonic())


def pynsq_close(*clients: nsq.Reader | nsq.Writer) -> None:
    for client in clients:
        for conn in list(client.conns.values()):
            conn.close()
        if isinstance(client, nsq.Reader) and client.redist_periodic is not None:
            client.redist_periodic.stop()


async def pynsq_writer(address: str) -> nsq.Writer:
    writer = nsq.Writer([address])
    await wait_async(
        lambda: any(c.connected() for c in writer.conns.values()), "pynsq Writer connected"
    )
    return writer


def test_pynsq_pub_mpub_dpub_two_channels_fin(broker_proc: BrokerProcess) -> None:
    topic, sent = "pynsq_fanout", payloads("pynsq")
    got: dict[str, list[Got]] = {ch: [] for ch in CHANNELS}
    acks: list[object] = []
    docs: dict[str, dict[str, Any]] = {}
    t_dpub = 0.0

    def handler(ch: str, message: nsq.Message) -> bool:
        got[ch].append(pynsq_got(message))
        return True  # FIN

    async def main() -> None:
        nonlocal t_dpub
        readers = [
            nsq.Reader(
                topic,
                ch,
                message_handler=partial(handler, ch),
                nsqd_tcp_addresses=[broker_proc.tcp_address],
                max_in_flight=4,
            )
            for ch in CHANNELS
        ]
        writer = None
        try:
            await wait_async(
                lambda: subscribed(broker_proc, topic, CHANNELS), "both channels subscribed"
            )
            writer = await pynsq_writer(broker_proc.tcp_address)

            def ack(conn: object, data: object) -> None:
                acks.append(data)

            t_dpub = time.monotonic()
            writer.dpub(topic, DEFER_MS, sent.deferred, callback=ack)
            for body in sent.pub:
                writer.pub(topic, body, callback=ack)
            writer.mpub(topic, sent.mpub, callback=ack)
            await wait_async(lambda: len(acks) == 5, "5 publish responses")
            assert acks == [b"OK"] * 5
            await wait_async(lambda: have(got, len(sent.all)), "every message on both channels")
            for ch in CHANNELS:
                docs[ch] = await wait_async(
                    lambda ch=ch: settled(broker_proc, topic, ch, len(sent.all)), f"{ch} settled"
                )
            check_published(broker_proc, topic, len(sent.all))
        finally:
            pynsq_close(*readers, *([writer] if writer else []))

    run_tornado(main)
    check_full_copies(got, sent, t_dpub)
    for ch in CHANNELS:
        check_channel(docs[ch], messages=len(sent.all), deliveries=len(sent.all), counted=None)


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
        reader = nsq.Reader(
            topic, "worker", message_handler=handler, nsqd_tcp_addresses=[broker_proc.tcp_address]
        )
        writer = None
        try:
            await wait_async(lambda: subscribed(broker_proc, topic, ["worker"]), "subscribed")
            writer = await pynsq_writer(broker_proc.tcp_address)
            writer.pub(topic, body)
            await wait_async(lambda: len(got) == 2, "the requeued message back")
            doc = await wait_async(lambda: settled(broker_proc, topic, "worker", 1), "settled")
        finally:
            pynsq_close(reader, *([writer] if writer else []))

    run_tornado(main)
    check_redelivered(got, body, REQ_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, requeues=1)


def test_pynsq_timeout_redelivery(broker_proc: BrokerProcess) -> None:
    topic, body = "pynsq_timeout", b"pynsq never answered"
    got: list[Got] = []
    doc: dict[str, Any] = {}

    def handler(message: nsq.Message) -> bool | None:
        got.append(pynsq_got(message))
        if message.attempts == 1:
            message.enable_async()  # and then neither FIN nor REQ
            return None
        return True

    async def main() -> None:
        nonlocal doc
        reader = nsq.Reader(
            topic,
            "worker",
            message_handler=handler,
            nsqd_tcp_addresses=[broker_proc.tcp_address],
            msg_timeout=MSG_TIMEOUT_MS / 1000,  # seconds; IDENTIFY carries ms
        )
        writer = None
        try:
            await wait_async(lambda: subscribed(broker_proc, topic, ["worker"]), "subscribed")
            writer = await pynsq_writer(broker_proc.tcp_address)
            writer.pub(topic, body)
            await wait_async(lambda: len(got) == 2, "the timed-out message back")
            doc = await wait_async(lambda: settled(broker_proc, topic, "worker", 1), "settled")
        finally:
            pynsq_close(reader, *([writer] if writer else []))

    run_tornado(main)
    check_redelivered(got, body, MSG_TIMEOUT_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, timeouts=1)


# -- gnsq: gevent's hub runs while the test waits (no monkey-patching) ---------------------
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
        assert producer.publish(topic, sent.deferred, defer=DEFER_MS) == b"OK"
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
    for ch in CHANNELS:
        check_channel(docs[ch], messages=len(sent.all), deliveries=len(sent.all), counted=None)


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
    check_redelivered(got, body, REQ_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, requeues=1)


def test_gnsq_timeout_redelivery_with_broker_default(tmp_path: Path) -> None:
    """gnsq cannot negotiate msg_timeout, so the broker's default (--msg-timeout-ms) is
    short here: it must apply to clients that do not ask for one."""
    broker = start_broker(tmp_path / "data", "--msg-timeout-ms", str(MSG_TIMEOUT_MS))
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
        assert producer.publish(topic, body) == b"OK"
        wait_gevent(lambda: len(got) == 2, "the timed-out message back")
        doc = wait_gevent(lambda: settled(broker, topic, "worker", 1), "settled")
    finally:
        try:
            gnsq_close(*clients)
        finally:
            broker.stop()
    check_redelivered(got, body, MSG_TIMEOUT_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, timeouts=1)


def gnsq_connection(broker: BrokerProcess) -> gnsq.NsqdTCPClient:
    """gnsq's low-level connection (its public NsqdTCPClient), connected and identified."""
    host, port = broker.tcp
    conn = gnsq.NsqdTCPClient(host, port, timeout=DEADLINE_S)
    conn.connect()
    conn.identify()
    return conn


def test_gnsq_cls_stops_delivery_but_allows_fin(broker_proc: BrokerProcess) -> None:
    """CLS: CLOSE_WAIT, no further message however high RDY was (nsqd's StartClose sets
    RDY 0), and what is in flight can still be FINished."""
    topic, channel = "gnsq_cls", "worker"
    conn = gnsq_connection(broker_proc)
    try:
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
        doc = channel_doc(broker_proc, topic, channel)
        assert doc is not None
        (client,) = doc["clients"]
        assert (doc["depth"], doc["in_flight_count"], client["ready_count"]) == (1, 1, 0)
        first.finish()  # FIN while closing; a failure would come back as E_FIN_FAILED
        doc = wait_gevent(
            lambda: settled_but(broker_proc, topic, channel, depth=1, finished=1), "FIN counted"
        )
        assert doc["message_count"] == 2
        conn.nop()  # the connection is still open and usable until the client goes
    finally:
        conn.close_stream()


def test_commands_after_a_fatal_error_are_not_executed(broker_proc: BrokerProcess) -> None:
    """nsqd stops reading at a fatal error: a PUB pipelined behind it must not publish."""
    topic = "after_fatal"
    conn = gnsq.NsqdTCPClient(*broker_proc.tcp, timeout=DEADLINE_S)
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


# -- ansq: asyncio, on the test's own loop ---------------------------------------------------
def ansq_got(message: ansq.tcp.types.NSQMessage) -> Got:
    return Got(message.id.encode(), message.body, message.attempts, time.monotonic())


async def ansq_next(reader: ansq.tcp.reader.Reader) -> ansq.tcp.types.NSQMessage:
    message = await asyncio.wait_for(reader.wait_for_message(), DEADLINE_S)
    assert message is not None, "ansq reader lost its connection"
    return message


async def ansq_close(*clients: ansq.tcp.reader.Reader | ansq.tcp.writer.Writer) -> None:
    for client in clients:
        await client.close()


async def test_ansq_pub_mpub_dpub_two_channels_fin(broker_proc: BrokerProcess) -> None:
    topic, sent = "ansq_fanout", payloads("ansq")
    got: dict[str, list[Got]] = {ch: [] for ch in CHANNELS}
    address = [broker_proc.tcp_address]

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
            ch: await wait_async(
                lambda ch=ch: settled(broker_proc, topic, ch, len(sent.all)), f"{ch} settled"
            )
            for ch in CHANNELS
        }
        check_published(broker_proc, topic, len(sent.all))
    finally:
        await ansq_close(*clients)
    check_full_copies(got, sent, t_dpub)
    for ch in CHANNELS:
        check_channel(docs[ch], messages=len(sent.all), deliveries=len(sent.all), counted=None)


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
        doc = await wait_async(lambda: settled(broker_proc, topic, "worker", 1), "settled")
    finally:
        await ansq_close(*clients)
    check_redelivered(got, body, REQ_MS / 1000)
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
        assert (await writer.pub(topic, body)).body == b"OK"
        got.append(ansq_got(await ansq_next(reader)))  # neither FIN nor REQ
        second = await ansq_next(reader)
        got.append(ansq_got(second))
        await second.fin()
        doc = await wait_async(lambda: settled(broker_proc, topic, "worker", 1), "settled")
    finally:
        await ansq_close(*clients)
    check_redelivered(got, body, MSG_TIMEOUT_MS / 1000)
    check_channel(doc, messages=1, deliveries=2, timeouts=1)


@pytest.mark.xfail(
    strict=True,
    reason="broker bug (state.py, Topic.defer): a DPUB'd message does not count in the "
    "channel's message_count; nsqd's Channel.PutMessageDeferred counts it",
)
async def test_dpub_counts_in_channel_message_count(broker_proc: BrokerProcess) -> None:
    topic, body = "dpub_count", b"counted when deferred"
    address = [broker_proc.tcp_address]
    clients: list[Any] = []
    try:
        reader = await ansq.create_reader(topic, "worker", address)
        clients.append(reader)
        writer = await ansq.create_writer(address)
        clients.append(writer)
        assert (await writer.dpub(topic, body, DEFER_MS)).body == b"OK"
        message = await ansq_next(reader)
        assert (message.body, message.attempts) == (body, 1)
        await message.fin()
        doc = await wait_async(lambda: settled(broker_proc, topic, "worker", 1), "settled")
    finally:
        await ansq_close(*clients)
    check_channel(doc, messages=1, deliveries=1)


# -- all three on one topic ------------------------------------------------------------------
def test_every_library_reads_what_every_library_wrote(broker_proc: BrokerProcess) -> None:
    """Each library publishes its own bodies to one topic; a consumer of each library on its
    own channel receives all of them: the broker, not a library pairing, does the work."""
    topic = "interop"
    libs = ("pynsq", "gnsq", "ansq")
    for lib in libs:  # channels first, so each gets a copy of everything
        broker_proc.post(f"/channel/create?topic={topic}&channel={lib}")
    sent = {lib: [f"{lib} says {i}".encode() for i in range(3)] for lib in libs}
    expected = Counter(b for bs in sent.values() for b in bs)
    n = sum(expected.values())
    got: dict[str, list[Got]] = {lib: [] for lib in libs}
    docs: dict[str, dict[str, Any]] = {}

    # publish: gnsq (PUB), pynsq (MPUB), ansq (PUB + MPUB)
    producer = gnsq.Producer([broker_proc.tcp_address])
    producer.start()
    try:
        for body in sent["gnsq"]:
            assert producer.publish(topic, body) == b"OK"
    finally:
        gnsq_close(producer)

    async def pynsq_publish() -> None:
        writer = await pynsq_writer(broker_proc.tcp_address)
        acks: list[object] = []
        try:
            writer.mpub(topic, sent["pynsq"], callback=lambda conn, data: acks.append(data))
            await wait_async(lambda: acks, "MPUB response")
            assert acks == [b"OK"]
        finally:
            pynsq_close(writer)

    run_tornado(pynsq_publish)

    async def ansq_publish() -> None:
        writer = await ansq.create_writer([broker_proc.tcp_address])
        try:
            assert (await writer.pub(topic, sent["ansq"][0])).body == b"OK"
            assert (await writer.mpub(topic, *sent["ansq"][1:])).body == b"OK"
        finally:
            await writer.close()

    asyncio.run(ansq_publish())

    # consume: each library drains its own channel, FINs, and the channel settles
    async def pynsq_consume() -> None:
        def handler(message: nsq.Message) -> bool:
            got["pynsq"].append(pynsq_got(message))
            return True

        reader = nsq.Reader(
            topic,
            "pynsq",
            message_handler=handler,
            nsqd_tcp_addresses=[broker_proc.tcp_address],
            max_in_flight=3,
        )
        try:
            await wait_async(lambda: len(got["pynsq"]) >= n, "pynsq consumer done")
            docs["pynsq"] = await wait_async(
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
            docs["ansq"] = await wait_async(
                lambda: settled(broker_proc, topic, "ansq", n), "ansq settled"
            )
        finally:
            await reader.close()

    asyncio.run(ansq_consume())

    for lib in libs:
        assert Counter(g.body for g in got[lib]) == expected, lib
        assert {g.attempts for g in got[lib]} == {1}, lib
        check_channel(docs[lib], messages=n, deliveries=n)
    (t,) = broker_proc.stats(topic)["topics"]
    assert t["message_count"] == n


@pytest.fixture(autouse=True)
def _no_gevent_leftovers() -> Any:
    """Every gnsq greenlet must be gone after a test (closed, not merely abandoned)."""
    yield
    import gc

    from gevent import Greenlet

    alive = [g for g in gc.get_objects() if isinstance(g, Greenlet) and not g.dead]
    assert alive == [], f"greenlets left running: {alive}"
