"""Consumer admission control (issue 19, item 5): IDENTIFY's srtm_class, SUB refused beyond a
class's admitted count (E_SUB_FAILED, not fatal), the newest of a class disconnected when its
count falls, /srtm/admission, and nothing changed for plain consumers by default."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.broker.admission import Admission
from srtm.broker.broker import Broker
from srtm.client.subscriber import Subscriber
from srtm.protocol import Identify, Pub, Rdy, Sub, errors
from srtm.protocol.errors import ProtocolError
from srtm.protocol.frames import FrameType
from srtm.protocol.session import DEFAULT_CLASS, MAX_CLASS_LENGTH, Session, SessionSettings
from support import BrokerApi, call, eventually


# -- the session: srtm_class ------------------------------------------------------------------
class _Host:
    """Just what IDENTIFY asks of a connection."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def negotiated(self, heartbeat_changed: bool) -> None:
        pass

    def sample(self, rate: int) -> None:
        pass


def _identify(**config: Any) -> Session:
    session = Session(_Host(), SessionSettings())  # type: ignore[arg-type]
    session.receive(Identify(config), 0)
    return session


def test_a_consumer_without_a_class_is_default() -> None:
    assert _identify().consumer_class == DEFAULT_CLASS
    assert _identify(srtm_class=None).consumer_class == DEFAULT_CLASS


def test_srtm_class_is_taken() -> None:
    assert _identify(srtm_class="gold").consumer_class == "gold"
    assert _identify(srtm_class="a" * MAX_CLASS_LENGTH).consumer_class == "a" * MAX_CLASS_LENGTH


@pytest.mark.parametrize(
    "bad", [3, True, ["gold"], {"c": 1}, "", "a" * (MAX_CLASS_LENGTH + 1), "go ld", "gold\n"]
)
def test_a_bad_srtm_class_is_a_bad_body(bad: object) -> None:
    session = Session(_Host(), SessionSettings())  # type: ignore[arg-type]
    with pytest.raises(ProtocolError) as exc:
        session.receive(Identify({"srtm_class": bad}), 0)
    assert exc.value.code == errors.E_BAD_BODY and exc.value.fatal
    assert "srtm_class" in exc.value.message
    assert session.consumer_class == DEFAULT_CLASS and session.identity == {}


# -- the model --------------------------------------------------------------------------------
def test_lowering_counts_picks_the_lowest_class_first_and_the_newest_of_each() -> None:
    adm = Admission("t")
    for name in ("g1", "g2", "g3"):
        adm.join("gold", name)
    for name in ("b1", "b2"):
        adm.join("bronze", name)
    adm.join("default", "d1")
    out = adm.set({"gold": 1, "bronze": 0}, ["gold", "bronze"])
    assert out == ["b2", "b1", "g3", "g2"]
    assert adm.counts() == [("gold", 1, 1), ("bronze", 0, 0), ("default", None, 1)]
    adm.check("default")  # unlimited: not listed
    with pytest.raises(ProtocolError) as exc:
        adm.check("gold")
    assert exc.value.code == "E_SUB_FAILED" and not exc.value.fatal


# -- the broker ----------------------------------------------------------------------------
async def _consumer(
    broker: Broker, topic: str = "t", channel: str = "c", **ident: Any
) -> RawClient:
    """A connection that identified (with ``ident``) and sent SUB; its answer not read."""
    assert broker.tcp_address is not None
    c = await RawClient.connect(*broker.tcp_address)
    await c.identify(**ident)
    await c.send(Sub(topic, channel))
    return c


async def _admit(api: BrokerApi, topic: str, doc: Any) -> tuple[int, Any]:
    _, http = api
    return await call(http, "POST", f"/srtm/admission?topic={topic}", json.dumps(doc).encode())


async def test_sub_beyond_the_admitted_count_is_refused_not_fatally(broker_api: BrokerApi) -> None:
    broker, http = broker_api
    status, doc = await _admit(broker_api, "t", {"classes": {"gold": 2}, "order": ["gold"]})
    assert status == 200 and doc["disconnected"] == 0
    gold = [await _consumer(broker, srtm_class="gold") for _ in range(2)]
    for c in gold:
        assert await c.response() == b"OK"
    third = await _consumer(broker, channel="other", srtm_class="gold")
    err = await third.error()
    assert err.startswith("E_SUB_FAILED") and "'gold'" in err and "2" in err
    # Not fatal: the connection stays, and may publish or SUB again.
    await third.send(Pub("t", b"x"))
    assert await third.response() == b"OK"
    plain = await _consumer(broker)  # default: unlimited, not listed
    assert await plain.response() == b"OK"
    _, doc = await call(http, "GET", "/srtm/admission?topic=t")
    assert doc["classes"] == [
        {"name": "gold", "admitted": 2, "connected": 2},
        {"name": "default", "admitted": None, "connected": 1},
    ]
    # A gold consumer leaving lets the refused one in, on the same connection.
    await gold[0].close()
    await eventually(lambda: broker.admission["t"].counts()[0][2] == 1, "gold consumer gone")
    await third.send(Sub("t", "other"))
    assert await third.response() == b"OK"
    for c in (gold[1], third, plain):
        await c.close()


async def test_the_default_class_can_be_limited(broker_api: BrokerApi) -> None:
    broker, _ = broker_api
    await _admit(broker_api, "t", {"classes": {"default": 1}})
    first = await _consumer(broker)
    assert await first.response() == b"OK"
    second = await _consumer(broker)
    assert (await second.error()).startswith("E_SUB_FAILED")
    gold = await _consumer(broker, srtm_class="gold")  # not listed: unlimited
    assert await gold.response() == b"OK"
    for c in (first, second, gold):
        await c.close()


async def test_lowering_a_count_disconnects_the_newest_of_that_class(
    broker_api: BrokerApi,
) -> None:
    broker, http = broker_api
    silver = []
    for _ in range(3):
        c = await _consumer(broker, srtm_class="silver")
        assert await c.response() == b"OK"
        silver.append(c)
    gold = await _consumer(broker, channel="g", srtm_class="gold")
    assert await gold.response() == b"OK"
    status, doc = await _admit(
        broker_api, "t", {"classes": {"gold": 5, "silver": 1}, "order": ["gold", "silver"]}
    )
    assert status == 200 and doc["disconnected"] == 2
    assert doc["classes"][:2] == [
        {"name": "gold", "admitted": 5, "connected": 1},
        {"name": "silver", "admitted": 1, "connected": 1},
    ]
    for c in silver[1:]:
        f = await c.frame()
        assert f.kind is FrameType.ERROR and f.data.startswith(b"E_SUB_FAILED")
        assert await c.closed()
    # The oldest silver and the gold one (on its own channel) still get messages.
    for c in (silver[0], gold):
        await c.send(Rdy(1))
    await silver[0].send(Pub("t", b"m"))
    assert await silver[0].response() == b"OK"
    assert (await silver[0].message()).body == b"m"
    assert (await gold.message()).body == b"m"
    _, stats = await call(http, "GET", "/stats?format=json")
    (topic,) = stats["srtm"]["topics"]
    assert {"name": "silver", "admitted": 1, "connected": 1} in topic["admission"]
    for c in (silver[0], gold):
        await c.close()


async def test_raising_a_count_lets_a_retrying_subscriber_in(broker_api: BrokerApi) -> None:
    broker, _ = broker_api
    await _admit(broker_api, "t", {"classes": {"gold": 1}})
    assert broker.tcp_address is not None
    host, port = broker.tcp_address
    address = f"{host}:{port}"
    first = Subscriber("t", "c", addresses=[address], consumer_class="gold")
    second = Subscriber(
        "t", "c2", addresses=[address], consumer_class="gold", retry_s=0.02, max_retry_s=0.1
    )
    await first.start()
    await second.start()
    assert first.brokers == [address] and second.brokers == []
    await eventually(lambda: second.refused >= 2, "the second retried")
    await _admit(broker_api, "t", {"classes": {"gold": 2}})
    await eventually(lambda: second.brokers == [address], "the second admitted")
    assert broker.admission["t"].counts() == [("gold", 2, 2)]
    await first.close()
    await second.close()


async def test_plain_consumers_are_unchanged_without_admission(broker_api: BrokerApi) -> None:
    broker, http = broker_api
    consumers = [await _consumer(broker) for _ in range(5)]
    for c in consumers:
        assert await c.response() == b"OK"
    _, stats = await call(http, "GET", "/stats?format=json")
    (topic,) = stats["srtm"]["topics"]
    assert topic["admission"] == [{"name": "default", "admitted": None, "connected": 5}]
    for c in consumers:
        await c.close()
    await eventually(lambda: "t" not in broker.admission, "admission forgotten when idle")


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b"", "INVALID_BODY", "body"),
        (b"[1]", "INVALID_BODY", "body"),
        (b"{}", "MISSING_ARG_CLASSES", "classes"),
        (b'{"classes": {"gold": -1}}', "INVALID_CLASSES", "classes"),
        (b'{"classes": {"gold": 1.5}}', "INVALID_CLASSES", "classes"),
        (b'{"classes": {"go ld": 1}}', "INVALID_CLASSES", "classes"),
        (b'{"classes": {}, "order": ["a", "a"]}', "INVALID_ORDER", "order"),
        (b'{"classes": {}, "order": [""]}', "INVALID_ORDER", "order"),
    ],
)
async def test_admission_refusals_name_the_field(
    broker_api: BrokerApi, body: bytes, code: str, field: str
) -> None:
    broker, http = broker_api
    status, doc = await call(http, "POST", "/srtm/admission?topic=t", body)
    assert status == 400 and doc["message"] == code, doc
    assert doc["detail"].startswith(field), doc
    assert "t" not in broker.admission


async def test_admission_needs_a_topic(broker_api: BrokerApi) -> None:
    _, http = broker_api
    status, doc = await call(http, "GET", "/srtm/admission")
    assert status == 400 and doc["message"] == "MISSING_ARG_TOPIC"
    status, doc = await call(http, "GET", "/srtm/admission?topic=nothing")
    assert status == 200 and doc == {"topic": "nothing", "order": [], "classes": []}
