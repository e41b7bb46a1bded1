"""The handoff rule (srtm.control.actions.handoff): which share changes of one topic may
hand the source's share over to the destination on their relay link, and which route the
source's decrease carries. Pure: actions in, a decision out."""

from __future__ import annotations

from typing import Any

from srtm.control.actions import Hold, SetBucket, SetRoute, forwarding_first, handoff, phases
from srtm.ratelimit import BucketParams
from support import registered, topic_of

FULL = BucketParams(100.0, 10.0)


def fwd(broker: str, to: str = "d:4150") -> SetRoute:
    doc = {"topic": "t", "self": broker, "forward": {"to": to, "publishers": {}}}
    return SetRoute(broker, "t", {**doc, "replicas": None})


def decide(actions: list[Any], routes: list[SetRoute]) -> tuple[Any, list[Any]]:
    down, up = phases(list(actions))
    first, _ = forwarding_first(list(routes), down)
    plan, rest = handoff(down, up, first)
    return plan, list(rest)


def test_a_whole_move_to_a_broker_that_held_the_topic_is_handed_over_with_its_route() -> None:
    hold = Hold("s", "t", FULL)
    grow = SetBucket("d", "t", FULL, None)
    route = fwd("s")
    plan, rest = decide([hold, Hold("x", "t"), grow], [route])  # x held it and still does
    assert plan is not None and rest == []
    assert (plan.source, plan.dest, plan.route) == (hold, grow, route)


def test_a_partial_move_is_handed_over_within_what_the_source_gave_up() -> None:
    shrink = SetBucket("s", "t", BucketParams(40.0, 4.0), FULL)
    grow = SetBucket("d", "t", BucketParams(80.0, 8.0), BucketParams(20.0, 2.0))
    same = SetBucket("x", "t", BucketParams(5.0, 1.0), BucketParams(5.0, 1.0))
    plan, _ = decide([shrink, grow, same], [])
    assert plan is not None and plan.route is None


def test_no_handoff_where_the_destination_would_gain_more_than_the_source_gave_up() -> None:
    shrink = SetBucket("s", "t", BucketParams(40.0, 4.0), FULL)
    assert decide([shrink, SetBucket("d", "t", BucketParams(61.0, 6.0), None)], [])[0] is None
    assert decide([shrink, SetBucket("d", "t", BucketParams(60.0, 7.0), None)], [])[0] is None
    # A hold whose old share is not known frees nothing the rule can count on.
    assert decide([Hold("s", "t"), SetBucket("d", "t", FULL, None)], [])[0] is None


def test_no_handoff_with_two_sources_two_destinations_or_one_broker_both() -> None:
    two_down = [Hold("s", "t", FULL), Hold("r", "t", FULL), SetBucket("d", "t", FULL, None)]
    assert decide(two_down, [])[0] is None
    half = BucketParams(50.0, 5.0)
    two_up = [Hold("s", "t", FULL), SetBucket("d", "t", half, None), SetBucket("e", "t", half)]
    assert decide(two_up, [])[0] is None
    mixed = SetBucket("s", "t", BucketParams(120.0, 5.0), FULL)  # rate up, burst down
    assert decide([mixed], [])[0] is None
    plan, rest = decide([Hold("s", "t", FULL)], [fwd("s")])  # nothing grows
    assert plan is None and rest == [fwd("s")]


def test_two_decreases_keep_every_route_before_them() -> None:
    other = fwd("x")
    plan, rest = decide(
        [Hold("s", "t", FULL), SetBucket("x", "t", BucketParams(1.0, 1.0), BucketParams(2.0, 1.0)),
         SetBucket("d", "t", FULL, None)],
        [fwd("s"), other],
    )  # fmt: skip
    assert plan is None and rest == [fwd("s"), other]  # two decreases: as before


def test_the_controllers_move_names_the_old_share_in_its_hold() -> None:
    c = registered(2)
    c.create_topic(topic_of(3), "lb", now=0)
    c.move("t", ["p0", "p1", "p2"], "b0")
    before = c.topics["t"].buckets["b0"]
    actions = c.move("t", ["p0", "p1", "p2"], "b1")
    down, up = phases(actions)
    holds = [a for a in down if isinstance(a, Hold) and a.broker == "b0"]
    shrinks = [a for a in down if isinstance(a, SetBucket) and a.broker == "b0"]
    # b0 holds at once, or keeps a draining share first: either names what it had.
    assert [a.was for a in holds + shrinks] == [before]
    first, _ = forwarding_first([a for a in actions if isinstance(a, SetRoute)], down)
    plan, _ = handoff(down, up, first)
    assert plan is not None and plan.dest.broker == "b1"
