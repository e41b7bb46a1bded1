"""The controller's decisions, without I/O: registry, placement, plans, failover, adaptor."""

from __future__ import annotations

import math

import pytest

from srtm.control import ControlError, Controller, PlanChanged, SetBucket
from support import registered as cluster
from support import topic_of


def test_a_topic_is_placed_and_every_broker_gets_its_sub_bucket() -> None:
    c = cluster()
    # 1,800 msg/s, a bucket of 1,980: two brokers of 1,000 (2,000 msg/s would need three,
    # its bucket of 2,200 being what the ledger counts)
    actions = c.create_topic(topic_of(180), "srtm", now=0)
    sets = [a for a in actions if isinstance(a, SetBucket)]
    assert {a.broker for a in sets} == {"b0", "b1"}
    assert math.fsum(a.bucket.rate for a in sets) == pytest.approx(1_980)
    assert math.fsum(a.bucket.burst for a in sets) == pytest.approx(100)
    assert actions[-1] == PlanChanged("t", 1)
    plan = c.plan("t")
    assert plan["version"] == 1 and plan["status"] == "placed"
    assert sum(len(b["publishers"]) for b in plan["brokers"]) == 180
    assert all(e.allocated <= e.mcap for e in c.ledger())
    who = c.assign("t", "p7")
    assert who["tcp_address"] in {"127.0.0.1:4150", "127.0.0.1:4151"}


def test_a_move_that_leaves_a_small_share_still_gives_every_broker_a_sub_bucket() -> None:
    c = cluster()
    c.create_topic(topic_of(150), "srtm", now=0)  # 1,500 msg/s, burst 100, on b0 and b1
    on_b0 = next(b["publishers"] for b in c.plan("t")["brokers"] if b["id"] == "b0")
    actions = c.move("t", on_b0[:1], "b2")  # 10 msg/s of 1,500: 2/3 of a token, floored
    sets = {a.broker: a.bucket for a in actions if isinstance(a, SetBucket)}
    assert set(sets) == {"b0", "b1", "b2"} and sets["b2"].burst == 1.0
    assert math.fsum(b.burst for b in sets.values()) == 100


def test_requests_the_controller_refuses() -> None:
    c = Controller()
    with pytest.raises(ControlError, match="no broker") as e:
        c.create_topic(topic_of(5), "srtm", now=0)
    assert e.value.status == 503
    c = cluster()
    c.create_topic(topic_of(5), "srtm", now=0)
    with pytest.raises(ControlError, match="exists"):
        c.create_topic(topic_of(5), "srtm", now=0)
    with pytest.raises(ControlError, match="not registered"):
        c.report("ghost", 0.0, {}, now=1)
    with pytest.raises(ControlError, match="does not exist"):
        c.plan("nope")
    with pytest.raises(ControlError, match="not in topic"):
        c.assign("t", "stranger")
    with pytest.raises(ControlError, match="mcap"):
        c.register("b9", "h:1", "h:2", -1, now=0)


def test_a_silent_broker_is_marked_down_and_its_publishers_move() -> None:
    c = cluster()
    c.create_topic(topic_of(150), "srtm", now=0)  # 1,500 msg/s on b0 and b1
    on_b1 = set(c.topics["t"].assignment["b1"])
    for b in ("b0", "b2"):
        c.report(b, 0.0, {}, now=4)
    actions = c.tick(now=6)  # b1 last seen at 0: down
    assert c.brokers["b1"].down and "b1" not in c.topics["t"].assignment
    assert PlanChanged("t", 2) in actions
    moved = {p for b, ps in c.topics["t"].assignment.items() for p in ps}
    assert on_b1 <= moved and len(moved) == 150
    assert {a.broker for a in actions if isinstance(a, SetBucket)} <= {"b0", "b2"}


def test_the_adaptor_follows_reported_traffic_and_keeps_the_sum() -> None:
    c = cluster(2, mcap=600)
    c.create_topic(topic_of(100), "srtm", now=0)  # 1,000 msg/s over both
    before = dict(c.topics["t"].buckets)
    assert c.tick(now=1) == []  # a new plan: the windows still hold older traffic
    c.report("b0", 900, {"t": (900.0, 30.0)}, now=11)
    c.report("b1", 100, {"t": (100.0, 2.0)}, now=11)
    assert c.tick(now=11.5) == [] and c.topics["t"].buckets == before  # still settling
    c.report("b0", 900, {"t": (900.0, 30.0)}, now=12)
    c.report("b1", 100, {"t": (100.0, 2.0)}, now=12)
    actions = c.tick(now=12.5)
    after = c.topics["t"].buckets
    assert after["b0"].rate > 3 * after["b1"].rate
    assert {a.broker for a in actions if isinstance(a, SetBucket)} == {"b0", "b1"}
    assert math.fsum(p.rate for p in after.values()) == pytest.approx(
        math.fsum(p.rate for p in before.values()), rel=1e-12
    )


def test_state_survives_a_restart() -> None:
    c = cluster()
    c.create_topic(topic_of(150), "maxmin", now=0)
    again = Controller()
    again.restore(c.to_json(), now=100)
    assert again.plan("t") == c.plan("t")
    assert again.topics["t"].spec == c.topics["t"].spec
    # Brokers get a full timeout to report again before they count as down.
    assert again.tick(now=104) == []
    assert not any(b.down for b in again.brokers.values())
    again.tick(now=106)
    assert all(b.down for b in again.brokers.values())


def test_a_restarted_broker_gets_its_shares_again() -> None:
    c = cluster()
    c.create_topic(topic_of(150), "srtm", now=0)
    actions = c.register("b0", "127.0.0.1:4150", "127.0.0.1:5150", 1_000, now=10)
    assert [a.broker for a in actions] == ["b0"] and isinstance(actions[0], SetBucket)


def test_a_silent_broker_whose_address_refuses_is_down_before_its_timeout() -> None:
    """``silent`` lists the brokers worth probing; ``gone`` (the probe was refused: the
    process is gone) takes one down at once and moves its publishers, as the timeout
    would 5 s later; not if it spoke or registered elsewhere meanwhile."""
    c = cluster(2)
    c.create_topic(topic_of(4), "lb", now=0)
    on = {b for b, ps in c.topics["t"].assignment.items() if ps}
    c.report("b0", 0.0, {}, 1.0)
    c.report("b1", 0.0, {}, 1.0)
    assert c.silent(2.0, 1.5) == []
    assert sorted(c.silent(3.0, 1.5)) == ["b0", "b1"]
    assert c.gone("b0", c.brokers["b0"].http_address, 2.0, 1.5) is None  # not silent yet
    assert c.gone("b0", "127.0.0.1:1", 3.0, 1.5) is None  # asked at an old address
    c.report("b1", 0.0, {}, 2.9)
    assert c.gone("b1", c.brokers["b1"].http_address, 3.0, 1.5) is None  # it spoke
    actions = c.gone("b0", c.brokers["b0"].http_address, 3.0, 1.5)
    assert actions is not None and c.brokers["b0"].down
    assert c.silent(3.0, 1.5) == []
    assert "b0" not in c.topics["t"].assignment or not c.topics["t"].assignment["b0"]
    if "b0" in on:
        assert any(isinstance(a, PlanChanged) for a in actions)
    assert c.gone("b0", c.brokers["b0"].http_address, 4.0, 1.5) is None  # down already


def test_a_repair_that_grows_a_share_waits_for_room_among_the_others() -> None:
    """A broker's share is put back only where the others' live shares leave room: a
    share no plan gives (a push delivered late, a change a deposed leader left half
    done) is held first."""
    from srtm.control.actions import HELD, Hold
    from srtm.placement import PublisherLoad, TopicSpec
    from srtm.ratelimit import BucketParams

    c = Controller()
    for b in ("a", "b"):
        c.register(b, f"127.0.0.1:{ord(b)}", f"127.0.0.1:{ord(b) + 1}", 1e6, 0.0)
    spec = TopicSpec("t", (PublisherLoad("p", 100.0),), 40.0, 5.0, 400.0)
    c.create_topic(spec, "lb", 0.0)
    (member,) = [b for b, ps in c.topics["t"].assignment.items() if ps]
    other = "b" if member == "a" else "a"
    assert c.topics["t"].buckets == {member: BucketParams(400.0, 40.0)}
    stray = BucketParams(1.99, 19.98)  # a share the plan does not give
    assert c.report(other, 0.0, {}, now=1, seen={"t": stray}) == [Hold(other, "t")]
    short = BucketParams(398.0, 20.0)
    assert c.report(member, 0.0, {}, now=1, seen={"t": short}) == []  # no room yet
    assert c.report(other, 0.0, {}, now=2, seen={"t": HELD}) == []
    (grow,) = c.report(member, 0.0, {}, now=2, seen={"t": short})
    assert isinstance(grow, SetBucket) and grow.bucket == BucketParams(400.0, 40.0)
    # A share that shrinks never waits.
    c.report(other, 0.0, {}, now=3, seen={"t": stray})
    (shrink,) = c.report(member, 0.0, {}, now=3, seen={"t": BucketParams(500.0, 50.0)})
    assert isinstance(shrink, SetBucket) and shrink.bucket == BucketParams(400.0, 40.0)


def test_a_repair_that_grows_waits_until_every_other_broker_reported_to_this_controller() -> None:
    """A new leader (or a restarted controller) reads the plan but not what brokers
    shape: one may still shape by the plan before it. Until each other broker up has
    reported, no share grows by a repair; one that shrinks goes at once."""
    from srtm.control.follow import replace_state
    from srtm.placement import PublisherLoad, TopicSpec
    from srtm.ratelimit import BucketParams

    c = Controller()
    for b in ("a", "b"):
        c.register(b, f"127.0.0.1:{ord(b)}", f"127.0.0.1:{ord(b) + 1}", 1e6, 0.0)
    pubs = (PublisherLoad("p", 100.0), PublisherLoad("q", 100.0))
    c.create_topic(TopicSpec("t", pubs, 40.0, 5.0, 400.0), "lb", 0.0)
    plan = dict(c.topics["t"].buckets)
    assert set(plan) == {"a", "b"}
    leader = Controller()  # another controller takes over: it reads the state
    replace_state(leader, c.to_json(), 10.0)
    below = BucketParams(plan["a"].rate / 2, plan["a"].burst / 2)
    assert leader.report("a", 0.0, {}, now=11, seen={"t": below}) == []  # b unheard of
    leader.report("b", 0.0, {}, now=11, seen={"t": plan["b"]})
    (grow,) = leader.report("a", 0.0, {}, now=12, seen={"t": below})
    assert isinstance(grow, SetBucket) and grow.bucket == plan["a"]
    replace_state(leader, c.to_json(), 13.0)
    above = BucketParams(plan["a"].rate * 2, plan["a"].burst)
    (shrink,) = leader.report("a", 0.0, {}, now=14, seen={"t": above})
    assert isinstance(shrink, SetBucket) and shrink.bucket == plan["a"]
