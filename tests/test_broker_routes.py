"""The relay's route table (srtm.broker.routes): pure, on an explicit clock."""

from __future__ import annotations

from srtm.broker.routes import Forward, Replicas, RouteTable, TopicRoute


def route(forward: Forward | None = None, replicas: Replicas | None = None) -> TopicRoute:
    return TopicRoute("t", "a", forward, replicas, last_forward_s=100.0)


def test_a_publisher_of_its_own_goes_there_others_to_the_topics_target() -> None:
    r = route(Forward("b:1", {"p": "c:1"}, grace_s=5))
    assert r.forward_target("p", 101) == "c:1"
    assert r.forward_target("q", 101) == "b:1"
    assert r.forward_target(None, 101) == "b:1"
    only = route(Forward(None, {"p": "c:1"}))
    assert only.forward_target("q", 101) is None  # accepted here
    assert only.forward_target("p", 101) == "c:1"


def test_forwarding_ends_after_its_grace_without_forwarding() -> None:
    r = route(Forward("b:1", {}, grace_s=5))
    r.forwarded(3, 104.0)  # each forward restarts the grace
    assert r.forward_target("p", 108.9) == "b:1"
    assert r.forward_target("p", 109.0) is None
    assert r.forward is None and r.counters.forwarded == 3  # counters stay
    r2 = route(Forward("b:1", {}, grace_s=5))
    r2.expire(105.0)
    assert r2.forward is None


def test_channels_are_homed_on_one_replica_each() -> None:
    reps = Replicas({"a": "a:1", "b": "b:1", "c": "c:1"}, primary="a", homes={"x": "b"})
    r = route(replicas=reps)
    assert r.keeps("y") and not r.keeps("x")  # y: not listed, so the primary's (a)
    assert r.peers() == {"b": "b:1", "c": "c:1"}  # never itself
    assert r.channels_of("b", ["x", "y"]) == ["x"]
    assert r.channels_of("a", ["x", "y", "z"]) == ["y", "z"]
    assert r.channels_of("c", ["x", "y"]) == []
    assert route().keeps("x") and route().peers() == {}


def test_a_new_route_replaces_the_old_and_keeps_its_counters() -> None:
    table = RouteTable()
    assert not table and "t" not in table
    old = table.set(route(Forward("b:1", {})))
    old.counters.forwarded = 7
    new = table.set(route(replicas=Replicas({}, "a", {})))
    assert table.get("t") is new and new.forward is None and new.counters.forwarded == 7
    assert table.remove("t") is new and table.get("t") is None


def test_a_replicated_topic_delivers_only_the_channels_homed_here() -> None:
    from srtm.broker.message import Message
    from srtm.broker.state import Topic, memory_queues

    def msg(i: int) -> Message:
        return Message(b"%016d" % i, b"x", 0, 0)

    reps = Replicas({"a": "a:1", "b": "b:1"}, primary="b", homes={"mine": "a"})
    topic = Topic("t", memory_queues(), homing=route(replicas=reps))
    topic.put(msg(1))
    topic.release(now=1)
    assert len(topic.held) == 0  # no channel could be served here but "mine": not kept
    other = topic.channel("other")  # the primary's (b)
    mine = topic.channel("mine")
    topic.put(msg(2))
    topic.release(now=1)
    assert (other.depth, mine.depth) == (0, 1)
    # Where unlisted channels are served here (the primary), what comes first is held
    # for the first channel kept here, not handed to one served elsewhere.
    primary = Topic("t", memory_queues(), homing=TopicRoute("t", "b", None, reps, 0.0))
    primary.put(msg(3))
    primary.release(now=1)
    assert len(primary.held) == 1
    assert primary.channel("mine").depth == 0 and len(primary.held) == 1
    assert primary.channel("later").depth == 1 and len(primary.held) == 0
