"""No holes in (r, b), the controller's part without I/O: every broker up and out of a
plan holds the topic, and share changes are ordered decreases first."""

from __future__ import annotations

import math

from srtm.control import Hold, PlanChanged, SetBucket
from srtm.control.actions import Action, SetRoute, phases
from srtm.ratelimit import BucketParams
from support import registered as cluster
from support import topic_of


def holds(actions: list[Action]) -> set[str]:
    return {a.broker for a in actions if isinstance(a, Hold)}


def sets(actions: list[Action]) -> dict[str, SetBucket]:
    return {a.broker: a for a in actions if isinstance(a, SetBucket)}


def test_every_broker_out_of_a_new_plan_holds_the_topic() -> None:
    c = cluster()
    actions = c.create_topic(topic_of(50), "srtm", now=0)  # 500 msg/s: one broker
    (placed,) = sets(actions)
    assert holds(actions) == {"b0", "b1", "b2"} - {placed}
    assert actions[-1] == PlanChanged("t", 1)


def test_a_broker_that_registers_gets_its_shares_and_holds_for_every_other_topic() -> None:
    c = cluster()
    c.create_topic(topic_of(50, "a"), "srtm", now=0)
    c.create_topic(topic_of(50, "b"), "srtm", now=0)
    b_broker = next(iter(c.topics["b"].buckets))
    actions = c.register(b_broker, "127.0.0.1:4151", "127.0.0.1:5151", 1_000, now=1)
    assert [(type(a).__name__, a.topic) for a in actions if a.topic == "b"] == [("SetBucket", "b")]
    assert {a.topic for a in actions if isinstance(a, Hold)} == (
        set() if b_broker in c.topics["a"].buckets else {"a"}
    )
    assert c.shares(b_broker)[0]["b"] == c.topics["b"].buckets[b_broker]
    newcomer = c.register("b9", "127.0.0.1:4159", "127.0.0.1:5159", 1_000, now=1)
    assert newcomer == [Hold("b9", "a"), Hold("b9", "b")]
    assert c.shares("b9") == ({}, ["a", "b"])


def test_a_broker_dropped_from_the_plan_by_a_move_drains_then_gets_a_hold() -> None:
    c = cluster()
    c.create_topic(topic_of(50), "srtm", now=0)
    (first,) = c.topics["t"].buckets
    to = next(b for b in ("b0", "b1", "b2") if b != first)
    actions = c.move("t", [f"p{i}" for i in range(50)], to)
    assert first not in holds(actions) and first in c.topics["t"].draining
    assert sets(actions)[to].was is None  # it held the topic: a new bucket is an increase
    for now in (0.1, 0.2):  # the second report was sent after the drop: nothing waits
        c.report(first, 0.0, {}, now, {}, {}, {})
    assert Hold(first, "t") in c.tick(0.3)
    assert set(c.topics["t"].buckets) == {to}


def test_a_broker_dropped_by_failover_gets_a_hold_when_it_comes_back() -> None:
    c = cluster()
    c.create_topic(topic_of(50), "srtm", now=0)
    (first,) = c.topics["t"].buckets
    for b in c.brokers:
        if b != first:
            c.report(b, 0.0, {}, now=4)
    actions = c.tick(now=6)  # first is silent past 5 s: down, its publishers move
    assert first not in c.topics["t"].buckets and first not in holds(actions)  # it is down
    back = c.register(first, *(lambda i: (i.tcp_address, i.http_address))(c.brokers[first]),
                      1_000, now=7)  # fmt: skip
    # and a route: it forwards its old publishers' messages if they come back to it
    assert [a for a in back if not isinstance(a, SetRoute)] == [Hold(first, "t")]


def test_decreases_come_before_increases_and_a_mixed_change_is_split() -> None:
    big, small = BucketParams(100, 10), BucketParams(50, 5)
    actions: list[Action] = [
        SetBucket("b0", "t", big, small),  # up
        SetBucket("b1", "t", small, big),  # down
        Hold("b2", "t"),  # down
        SetBucket("b3", "t", BucketParams(100, 5), BucketParams(50, 10)),  # both
        SetBucket("b4", "t", small),  # new: up
        PlanChanged("t", 2),
    ]
    down, up = phases(actions)
    assert down == [
        SetBucket("b1", "t", small, big),
        Hold("b2", "t"),
        SetBucket("b3", "t", BucketParams(50, 5), BucketParams(50, 10)),
    ]
    assert up == [
        SetBucket("b0", "t", big, small),
        SetBucket("b3", "t", BucketParams(100, 5), BucketParams(50, 5)),
        SetBucket("b4", "t", small),
    ]


def test_applying_a_move_in_phases_never_exceeds_the_topic_bucket() -> None:
    """Replay each plan change phase by phase on a model of the brokers: after every
    single push, the live sums stay within (r, b)."""
    c = cluster(4, mcap=1_000)
    spec = topic_of(150)  # 1,500 msg/s: two brokers
    live: dict[str, BucketParams] = {}

    def apply(actions: list[Action]) -> None:
        down, up = phases(actions)
        for a in [*down, *up]:
            if isinstance(a, Hold):
                live.pop(a.broker, None)
            else:
                live[a.broker] = a.bucket
            assert math.fsum(p.rate for p in live.values()) <= spec.rate * (1 + 1e-9)
            assert math.fsum(p.burst for p in live.values()) <= spec.burst * (1 + 1e-9)

    apply(c.create_topic(spec, "srtm", now=0))
    for step in range(6):
        plan = c.topics["t"].assignment
        src = sorted(plan)[step % len(plan)]
        dst = f"b{(int(src[1:]) + 1 + step) % 4}"
        if dst != src:
            apply(c.move("t", plan[src][: 20 + 10 * step], dst))
    assert live == c.topics["t"].buckets
