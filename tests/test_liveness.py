"""The liveness lease's rules, without etcd: a broker's liveness is valid for 0.6 x the
lease after the send of the last keepalive etcd answered (``LivenessLease``), its shares
follow that lease and not the controller's answers (``Shares``), the ``--etcd-*`` flags
are checked by name, and the controller's failover step reads the live keys
(``LiveBrokers``, ``brokers.expire``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from srtm.broker import Broker, BrokerOptions
from srtm.broker.liveness import (
    VALID_FRACTION,
    LeaseStep,
    LivenessLease,
    live_document,
    liveness_settings,
)
from srtm.broker.state import LeaseExpired
from srtm.config import SettingError, resolve
from srtm.control.liveness import LiveBrokers, LiveKey
from srtm.etcd import EventKind, KeyValue, WatchEvent
from support import MakeBroker, registered


def test_the_liveness_is_valid_for_0_6_of_the_lease_after_the_send() -> None:
    lease = LivenessLease(lease_s=5)
    assert lease.next_step(0.0) is LeaseStep.GRANT and not lease.valid(0.0)
    lease.granted(77, sent=10.0)
    assert lease.valid_until() == 10.0 + VALID_FRACTION * 5 == 13.0
    assert lease.valid(12.99) and not lease.valid(13.0)
    assert lease.next_step(11.0) is LeaseStep.KEEPALIVE
    # A keepalive answered in time renews from its send, not from its answer.
    assert lease.kept(5, sent=11.0, now=12.5)
    assert lease.valid_until() == 14.0 and lease.lease == 77
    # Past validity (two keepalives failed), the next step is a new lease.
    assert lease.next_step(14.0) is LeaseStep.GRANT


def test_a_lease_gone_or_answered_too_late_is_lost() -> None:
    lease = LivenessLease(lease_s=2)
    lease.granted(5, sent=0.0)
    assert not lease.kept(0, sent=0.5, now=0.6)  # etcd: the lease is gone
    assert lease.lease == 0 and lease.valid_until() is None
    lease.granted(6, sent=1.0)
    # Answered with a TTL, but after the liveness ran out: the shares lapsed meanwhile.
    assert not lease.kept(2, sent=1.5, now=2.3)
    assert lease.next_step(2.3) is LeaseStep.GRANT


def test_the_flags_are_checked_by_name() -> None:
    base = {"controller": "http://127.0.0.1:4161"}
    assert liveness_settings(BrokerOptions(**base)) is None  # type: ignore[arg-type]
    s = liveness_settings(
        BrokerOptions(etcd_endpoints="127.0.0.1:2379,h:1", broker_id=7, **base)  # type: ignore[arg-type]
    )
    assert s is not None and s.endpoints == ("http://127.0.0.1:2379", "http://h:1")
    assert s.key == "/srtm/live/7" and s.lease_s == 5 and s.interval_s == 1.25
    with pytest.raises(ValueError, match="--etcd-endpoints: 'http://h:1'"):
        liveness_settings(BrokerOptions(etcd_endpoints="http://h:1", **base))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--etcd-prefix"):
        liveness_settings(BrokerOptions(etcd_endpoints="h:1", etcd_prefix="srtm", **base))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--etcd-endpoints needs --controller"):
        liveness_settings(BrokerOptions(etcd_endpoints="h:1"))
    with pytest.raises(SettingError, match="integer"):
        resolve(BrokerOptions, "SRTM_", cli={"etcd_lease_s": "1.5"}, environ={}, file={})
    with pytest.raises(SettingError):
        resolve(BrokerOptions, "SRTM_", cli={"etcd_lease_s": "0"}, environ={}, file={})
    # A broker is refused at construction, before it binds anything.
    with pytest.raises(ValueError, match="needs --controller"):
        Broker(BrokerOptions(etcd_endpoints="h:1", data_dir=Path("unused")))


async def test_shares_follow_the_liveness_lease_not_the_controller(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9", etcd_endpoints="127.0.0.1:9")
    shares = broker.shares
    assert not shares.may_register()  # no liveness yet: no registration, no shares
    shares.renew_liveness(time.monotonic() + 60, fresh=True)
    assert shares.lapses == 1 and shares.may_register()
    # A controller that does not watch the key: no share is used (a push is refused).
    assert not shares.watched_by(None) and not shares.lease_ok()
    with pytest.raises(LeaseExpired):
        shares.set_bucket("t", 100.0, 10.0)
    assert shares.watched_by("/srtm/live/") and shares.lease_ok()
    shares.set_bucket("t", 100.0, 10.0, leased=True)
    # The controller's answers do not move the lease: etcd's does.
    shares.renew_lease(time.monotonic() - 120, 1.0)
    assert shares.lease_ok() and broker.topics["t"].bucket is not None
    shares.renew_liveness(time.monotonic() - 0.001, fresh=False)  # it ran out
    assert not shares.lease_ok()
    assert broker.topics["t"].bucket is None and broker.topics["t"].on_hold
    assert shares.lapses == 2 and not shares.may_register()
    # A new lease holds whatever is shaped (a stale answer applied during the lapse).
    shares.set_bucket("t", 100.0, 10.0, leased=True)
    shares.renew_liveness(time.monotonic() + 60, fresh=True)
    assert broker.topics["t"].on_hold and shares.lapses == 3


async def test_no_push_is_taken_between_a_new_lease_and_the_registration_answer(
    make_broker: MakeBroker,
) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9", etcd_endpoints="127.0.0.1:9")
    shares = broker.shares
    shares.renew_liveness(time.monotonic() + 60, fresh=True)
    assert shares.watched_by("/srtm/live/")
    shares.set_bucket("t", 200.0, 20.0)  # a push, taken
    shares.lapse("liveness ran out")  # cut from etcd (and the controllers)
    shares.renew_liveness(time.monotonic() + 60, fresh=True)  # healed: a new lease
    assert broker.topics["t"].on_hold and shares.may_register()
    # A push sent before the lapse and held up on the cut link arrives before the
    # registration's answer: the controller has since given the share to another broker.
    with pytest.raises(LeaseExpired):
        shares.set_bucket("t", 1.99, 19.97)
    assert broker.topics["t"].bucket is None and not shares.lease_ok()
    # The registration's answer: pushes are taken again.
    assert shares.watched_by("/srtm/live/") and shares.lease_ok()
    shares.set_bucket("t", 200.0, 20.0)
    assert broker.topics["t"].bucket is not None


async def test_without_etcd_the_controllers_lease_decides(make_broker: MakeBroker) -> None:
    broker = await make_broker(controller="http://127.0.0.1:9")
    shares = broker.shares
    assert shares.liveness is None and shares.may_register()
    shares.renew_lease(time.monotonic(), 60.0)
    shares.set_bucket("t", 100.0, 10.0)
    assert shares.lease_ok()
    shares.renew_lease(time.monotonic() - 2, 1.0)
    assert not shares.lease_ok() and broker.topics["t"].on_hold and shares.lapses == 1


def put(key: str, lease: int, http: str = "a:2") -> WatchEvent:
    return WatchEvent(EventKind.PUT, key, live_document(lease, "a:1", http), 1)


def test_live_brokers_follow_puts_and_deletes() -> None:
    live = LiveBrokers("/p/live/")
    live.load([KeyValue("/p/live/1", "{}", 3, 3, 11), KeyValue("/p/live/2", "x", 4, 4, 0)])
    assert live.keys == {"1": LiveKey(11, None), "2": LiveKey(0, None)}
    live.apply(put("/p/live/3", 33))
    live.apply(put("/p/liveliness", 1))  # not a broker's key
    live.apply(WatchEvent(EventKind.DELETE, "/p/live/1", "", 5))
    live.apply(WatchEvent(EventKind.DELETE, "/p/live/2", "", 6))
    live.apply(put("/p/live/2", 22))  # lapsed and back on a new lease before a tick
    live.apply(WatchEvent(EventKind.DELETE, "/p/live/9", "", 7))  # never seen: nothing
    assert live.keys == {"2": LiveKey(22, "a:2"), "3": LiveKey(33, "a:2")}
    assert live.holds("3", "a:2") and not live.holds("1", "a:2")
    assert not live.holds("3", "b:2")  # the same id registered at another address
    assert live.take_deleted() == {"1"} and live.take_deleted() == set()
    # The watch lost and the keys read again: one gone meanwhile was deleted.
    live.load([KeyValue("/p/live/3", live_document(34, "a:1", "a:2"), 8, 8, 34)])
    assert live.keys == {"3": LiveKey(34, "a:2")} and live.take_deleted() == {"2"}
    assert LiveKey.parse('{"lease": true}') == LiveKey(0, None) == LiveKey.parse("[1]")


def test_a_live_key_not_silence_decides_when_a_broker_is_down() -> None:
    c = registered(3)  # brokers b0, b1, b2 at 127.0.0.1:515X, seen at 0 s
    live = c.live = LiveBrokers("/p/live/")
    live.load([KeyValue(f"/p/live/b{i}", live_document(10 + i, "t", f"127.0.0.1:{5150 + i}"),
                        1, 1, 10 + i) for i in (0, 1)])  # fmt: skip
    later = c.broker_timeout_s * 10
    c.tick(later)  # all three silent for ten timeouts
    assert [c.brokers[b].down for b in ("b0", "b1", "b2")] == [False, False, True]
    # b1 reports, then its key is deleted (its lease expired): down at the next tick,
    # however recently it spoke.
    c.report("b1", 0.0, {}, now=later)
    live.apply(WatchEvent(EventKind.DELETE, "/p/live/b1", "", 9))
    c.tick(later + 0.1)
    assert c.brokers["b1"].down and not c.brokers["b0"].down
    # b0 restarted at another address put its key: the old registration is silent, so
    # down, and the new process may take the id.
    live.apply(put("/p/live/b0", 50, http="127.0.0.1:6000"))
    c.tick(later * 2)
    assert c.brokers["b0"].down
    c.register("b0", "127.0.0.1:5999", "127.0.0.1:6000", 1000, now=later * 2)
    c.tick(later * 3)
    assert not c.brokers["b0"].down  # its key covers it now, silent or not
