"""``Leadership``, the pure state of one controller among several on an etcd prefix: a
leader acts only while its last renewal was sent less than 0.6 × its lease ago, so it
stops before etcd can give the key to another; SQLite's controller always acts."""

from __future__ import annotations

import pytest

from srtm.control.leadership import ACTING_FRACTION, LeaderInfo, Leadership, Role
from srtm.httpkit import EpochFence, HttpError

ME = LeaderInfo("a" * 32, "127.0.0.1:4161")
OTHER = LeaderInfo("b" * 32, "127.0.0.1:4162", "https")


def test_alone_always_acts_and_names_itself() -> None:
    lead = Leadership.alone(ME)
    assert lead.acting(0.0) and lead.acting(1e9)
    assert lead.doc(5.0) == {"leader": True, "leader_http_address": ME.http_address,
                             "epoch": None, "plan_changes": "made here"}  # fmt: skip
    moved = LeaderInfo(ME.id, "127.0.0.1:9999")
    lead.set_me(moved)
    assert lead.doc(5.0)["leader_http_address"] == "127.0.0.1:9999"


def test_a_standby_does_not_act_and_knows_the_leader() -> None:
    lead = Leadership(2.0, ME)
    assert lead.role is Role.STANDBY and not lead.acting(0.0)
    lead.saw_leader(OTHER)
    assert lead.doc(0.0) == {
        "leader": False, "leader_http_address": OTHER.http_address, "epoch": None,
        "plan_changes": f"made by the leader at {OTHER.http_address}: this controller is "
        "a standby",
    }  # fmt: skip
    lead.saw_leader(None)
    assert lead.doc(0.0)["leader_http_address"] is None
    assert lead.doc(0.0)["plan_changes"] == "wait for a leader: no controller leads now"


def test_a_leader_acts_until_0_6_of_its_lease_after_the_last_renewal_sent() -> None:
    lead = Leadership(2.0, ME)
    lead.won(7, sent_at=100.0)
    limit = 2.0 * ACTING_FRACTION
    assert lead.acting(100.0) and lead.acting(100.0 + limit - 0.01)
    assert not lead.acting(100.0 + limit) and lead.lapsed(100.0 + limit)
    assert lead.doc(100.0 + limit)["leader"] is False
    lead.renewed(sent_at=100.5)  # answered late, counted from when it was sent
    assert lead.acting(100.5 + limit - 0.01) and not lead.acting(100.5 + limit)
    lead.renewed(sent_at=100.2)  # an older answer never moves it back
    assert lead.acting(100.5 + limit - 0.01)
    assert lead.doc(101.0) == {"leader": True, "leader_http_address": ME.http_address,
                               "epoch": 7, "plan_changes": "made here"}  # fmt: skip
    assert lead.doc(100.5 + limit)["plan_changes"].startswith("wait for a leader")


def test_a_lost_leader_is_a_standby_with_no_epoch() -> None:
    lead = Leadership(2.0, ME)
    lead.won(3, sent_at=0.0)
    lead.lost()
    assert lead.role is Role.STANDBY and lead.epoch is None and lead.leader is None
    assert not lead.acting(0.1)
    lead.renewed(sent_at=0.2)  # a keepalive answered after it lost: still not leading
    assert not lead.acting(0.3)
    lead.won(9, sent_at=1.0)
    assert lead.acting(1.1) and lead.epoch == 9 and lead.terms == 2


def test_the_leader_key_is_read_back_and_bad_ones_are_named() -> None:
    assert LeaderInfo.from_json(OTHER.to_json()) == OTHER
    assert OTHER.url("/topics?x=1") == "https://127.0.0.1:4162/topics?x=1"
    for bad, words in (
        ("nope", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"id": "x"}', "lacks"),
        ('{"id": "x", "http_address": "h:1", "scheme": "ftp"}', "not http or https"),
    ):
        with pytest.raises(ValueError, match=words):
            LeaderInfo.from_json(bad)
    with pytest.raises(ValueError, match="positive"):
        Leadership(0, ME)


def test_a_broker_refuses_an_epoch_below_the_highest_seen() -> None:
    fence = EpochFence()
    assert fence.admits(None) and fence.admits("5") and fence.admits("5")
    assert not fence.admits("4")
    assert fence.admits(None)  # no header: not a leader's (SQLite, tools)
    assert fence.admits("9") and not fence.admits("5") and fence.highest == 9
    with pytest.raises(HttpError, match="BAD_EPOCH"):
        fence.admits("x")
