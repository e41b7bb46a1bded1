"""A held topic (managed, no share on this broker): what arrives is kept and released
only by a sub-bucket that comes, or at once when the topic is unmanaged; the hold
survives a restart, a broker with a controller restores its shaped topics held, and a
lapsed lease or a stop holds them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from srtm.broker.broker import Broker
from srtm.broker.options import BrokerOptions
from srtm.broker.state import LeaseExpired
from support import BrokerApi, MakeBroker, call, eventually

FAR = 10**18  # a release time no bucket reaches


async def publish(broker: Broker, topic: str, n: int) -> None:
    for i in range(n):
        broker.publish(topic, [b"m%d" % i], time.time_ns(), "p")


def queued(broker: Broker, topic: str) -> int:
    return broker.topics[topic].channels["c"].depth


async def test_a_held_topic_keeps_messages_until_a_bucket_releases_them_at_its_pace(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    broker.shares.hold("t")
    broker.channel("t", "c")
    await publish(broker, "t", 5)
    broker.releaser.release_shaped(FAR)  # even far in the future, nothing is due
    assert queued(broker, "t") == 0 and broker.topics["t"].depth == 5
    start = time.monotonic()
    broker.shares.set_bucket("t", 100.0, 1.0)  # one token, then one every 10 ms
    assert not broker.topics["t"].on_hold
    await eventually(lambda: queued(broker, "t"), "all five released", until=lambda n: n == 5)
    assert time.monotonic() - start >= 0.035  # four waits of 10 ms: paced, not at once


async def test_unmanaging_a_held_topic_releases_what_waits_at_once(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()
    broker.shares.hold("t")
    broker.channel("t", "c")
    await publish(broker, "t", 3)
    assert queued(broker, "t") == 0
    broker.shares.clear("t")
    assert queued(broker, "t") == 3 and not broker.topics["t"].on_hold


async def test_a_shaped_topic_put_on_hold_stops_releasing(make_broker: MakeBroker) -> None:
    broker = await make_broker()
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.channel("t", "c")
    await publish(broker, "t", 3)  # one token: one out, two wait
    await eventually(lambda: queued(broker, "t"), "the first released", until=lambda n: n == 1)
    broker.shares.hold("t")
    broker.releaser.release_shaped(FAR)
    assert queued(broker, "t") == 1 and broker.topics["t"].bucket is None


async def test_the_hold_survives_a_restart(tmp_path: Path) -> None:
    opts = BrokerOptions(tcp_port=0, data_dir=tmp_path / "d")
    broker = Broker(opts)
    await broker.start()
    broker.shares.hold("t")
    await publish(broker, "t", 2)
    await broker.stop()
    again = Broker(opts)
    await again.start()
    try:
        assert again.topics["t"].on_hold and again.topics["t"].depth == 2
    finally:
        await again.stop()


async def test_with_a_controller_a_saved_bucket_is_restored_held(tmp_path: Path) -> None:
    standalone = BrokerOptions(tcp_port=0, data_dir=tmp_path / "d")
    broker = Broker(standalone)
    await broker.start()
    broker.shares.set_bucket("t", 50.0, 5.0)
    await broker.stop()
    managed = BrokerOptions(tcp_port=0, data_dir=tmp_path / "d", controller="http://127.0.0.1:9")
    again = Broker(managed)
    await again.start()
    try:
        topic = again.topics["t"]
        assert topic.on_hold and topic.bucket is None
        with pytest.raises(LeaseExpired):  # no lease before it registers
            again.shares.set_bucket("t", 50.0, 5.0)
        again.shares.renew_lease(time.monotonic(), 60.0)
        again.shares.set_bucket("t", 50.0, 5.0)
        assert topic.bucket is not None and not topic.on_hold
    finally:
        await again.stop()
    plain = Broker(standalone)  # standalone, it shapes by its saved bucket as before
    await plain.start()
    try:
        assert plain.topics["t"].bucket is not None
    finally:
        await plain.stop()


async def test_a_lapsed_lease_holds_shaped_topics(make_broker: MakeBroker) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9")
    broker.shares.renew_lease(time.monotonic(), 0.2)
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.shares.set_bucket("u", 1.0, 1.0)
    assert broker.shares.lease_ok()
    await eventually(broker.shares.lease_ok, "the lease lapsed", until=lambda ok: not ok)
    assert all(t.on_hold and t.bucket is None for t in broker.topics.values())
    with pytest.raises(LeaseExpired):
        broker.shares.set_bucket("t", 1.0, 1.0)
    broker.shares.apply({"t": (2.0, 1.0)}, ["u"])  # a registration answer, with a lease
    assert broker.topics["t"].bucket is not None and broker.topics["u"].on_hold


async def test_a_stopping_broker_holds_its_shares_and_takes_no_other(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9")
    broker.shares.renew_lease(time.monotonic(), 60.0)
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.shares.stop()
    assert broker.topics["t"].on_hold and broker.topics["t"].bucket is None
    broker.shares.renew_lease(time.monotonic(), 60.0)  # an answer that comes after
    assert not broker.shares.lease_ok()
    with pytest.raises(LeaseExpired):
        broker.shares.set_bucket("t", 1.0, 1.0)
    broker.shares.apply({"t": (2.0, 1.0)}, [])  # a registration answer, with a lease
    assert broker.topics["t"].bucket is None


async def test_a_stopping_broker_without_a_controller_keeps_shaping(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker()  # no one gives its share away: saved as it is
    broker.shares.set_bucket("t", 1.0, 1.0)
    broker.shares.stop()
    assert broker.topics["t"].bucket is not None and not broker.topics["t"].on_hold


async def test_hold_and_unmanage_over_http(broker_api: BrokerApi) -> None:
    broker, s = broker_api
    status, doc = await call(s, "DELETE", "/srtm/bucket?topic=missing")
    assert status == 404 and "missing" not in broker.topics  # unmanaging creates nothing
    status, doc = await call(s, "POST", "/srtm/bucket/hold?topic=h")
    assert status == 200 and doc == {"topic": "h", "bucket": None, "held": True, "handoff": False}
    status, stats = await call(s, "GET", "/stats?format=json")
    (srtm,) = stats["srtm"]["topics"]
    assert srtm["held"] is True and srtm["bucket"] is None
    status, doc = await call(s, "DELETE", "/srtm/bucket?topic=h")
    assert status == 200 and doc["held"] is False and not broker.topics["h"].on_hold


async def test_a_push_after_the_registration_was_sent_beats_its_answer(
    make_broker: MakeBroker,
) -> None:
    """With etcd a broker takes pushes before its registration answer comes: the answer,
    computed before the push's change, must not put back a share the push took away."""
    broker = await make_broker(controller="http://127.0.0.1:9")
    broker.shares.renew_lease(time.monotonic(), 60)
    sent = time.monotonic()
    broker.shares.set_bucket("t", 1.0, 1.0)  # pushed after the registration was sent
    broker.shares.hold("u")
    broker.shares.apply({"t": (5.0, 5.0), "u": (5.0, 5.0), "v": (3.0, 3.0)}, ["w"], sent=sent)
    t, u, v = (broker.topics[n] for n in "tuv")
    assert t.bucket is not None and t.bucket.rate == 1.0  # the push's, not the answer's
    assert u.on_hold and u.bucket is None
    assert v.bucket is not None and v.bucket.rate == 3.0 and broker.topics["w"].on_hold
    broker.shares.apply({"t": (5.0, 5.0)}, [], sent=time.monotonic())  # a newer answer
    assert t.bucket is not None and t.bucket.rate == 5.0


async def test_a_deleted_topic_leaves_no_push_record(make_broker: MakeBroker) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9")
    broker.shares.renew_lease(time.monotonic(), 60)
    broker.shares.set_bucket("gone", 1.0, 1.0)
    broker.delete_topic("gone")
    assert "gone" not in broker.shares._pushed_at
    assert "gone" not in broker.shares._heard


async def test_a_share_change_older_than_one_taken_is_refused(broker_api: BrokerApi) -> None:
    """A push held up on a cut link and delivered after the heal (its controller timed it
    out and moved on) must not bring back a share given away since: brokers take a
    controller's orders in its numbering, per topic (409 STALE_PUSH, nothing changed)."""
    broker, s = broker_api

    async def push(path: str, order: int | None, epoch: int | None = None) -> tuple[int, Any]:
        headers = {} if order is None else {"X-SRTM-Order": str(order)}
        if epoch is not None:
            headers["X-SRTM-Epoch"] = str(epoch)
        async with s.post(path, headers=headers) as r:
            return r.status, await r.json()

    assert (await push("/srtm/bucket?topic=t&rate=9&burst=9", 20))[0] == 200
    status, doc = await push("/srtm/bucket?topic=t&rate=50&burst=50", 10)
    assert status == 409 and doc["message"] == "STALE_PUSH", doc
    bucket = broker.topics["t"].bucket
    assert bucket is not None and bucket.rate == 9.0  # unchanged
    assert (await push("/srtm/bucket/hold?topic=t", 15))[0] == 409
    assert (await push("/srtm/bucket/arm?topic=t&rate=1&burst=1&token=x", 19))[0] == 409
    assert broker.topics["t"].bucket is not None
    # Another topic has its own numbering; a newer leader's epoch beats any number.
    assert (await push("/srtm/bucket?topic=u&rate=2&burst=2", 5))[0] == 200
    assert (await push("/srtm/bucket?topic=t&rate=3&burst=3", 1, epoch=2))[0] == 200
    assert (await push("/srtm/bucket?topic=t&rate=4&burst=4", 99, epoch=1))[0] == 409
    assert (await push("/srtm/bucket?topic=t&rate=5&burst=5", None))[0] == 200  # a tool's
    status, doc = await push("/srtm/bucket?topic=t&rate=5&burst=5", "x")  # type: ignore[arg-type]
    assert status == 400 and doc["message"] == "BAD_ORDER", doc


async def test_a_push_sent_before_the_registration_answer_is_refused_after_it(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9")
    broker.shares.renew_lease(time.monotonic(), 60)
    broker.shares.apply({}, ["t"], order=(3, 1000))
    assert not broker.shares.admit("t", (3, 999))  # sent before the answer
    assert not broker.shares.admit("t", (2, 5000))  # a deposed leader's
    assert broker.shares.admit("t", (3, 1001))
    assert not broker.shares.admit("t", (3, 1001))  # the same order twice
    broker.shares.apply({}, ["t"], order=(3, 10))  # an older answer lowers nothing
    assert not broker.shares.admit("u", (3, 500))
