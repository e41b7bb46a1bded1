"""Draining members, without I/O: a broker dropped from a topic's plan keeps a share of
its bucket (counted in the sum and the ledger) until a report sent after the drop shows
nothing of the topic waiting there; then it holds the topic and the others grow."""

from __future__ import annotations

import math

import pytest

from srtm.control import Controller
from srtm.control.actions import Hold, SetBucket, SetRoute, phases
from srtm.control.plans import DRAIN_FLOOR, DRAIN_S, drain_weight
from srtm.placement import PublisherLoad, TopicSpec
from support import registered

RATE, BURST = 110.0, 20.0


def cluster() -> Controller:
    c = registered(3)
    pubs = tuple(PublisherLoad(f"p{i}", 10.0 + i) for i in range(6))
    c.create_topic(TopicSpec("t", pubs, BURST, 1.0, RATE), "lb", now=0)
    return c


def report(c: Controller, broker: str, now: float, waiting: int = 0, arrived: int = 0) -> None:
    c.report(broker, 0.0, {"t": (0.0, 0.0)}, now, {}, {"t": waiting}, {"t": arrived})


def sums(c: Controller) -> tuple[float, float]:
    buckets = c.topics["t"].buckets.values()
    return math.fsum(b.rate for b in buckets), math.fsum(b.burst for b in buckets)


def move_all_off(c: Controller) -> tuple[str, list[SetBucket | Hold]]:
    """Move every publisher of the first broker of the plan to another; its id, actions."""
    plan = c.topics["t"].assignment
    src = sorted(plan)[0]
    dst = next(b for b in ("b0", "b1", "b2") if b != src)
    actions = c.move("t", list(plan[src]), dst)
    return src, [a for a in actions if isinstance(a, SetBucket | Hold)]


def test_a_broker_moved_off_drains_with_what_its_queue_needs() -> None:
    c = cluster()
    src = sorted(c.topics["t"].assignment)[0]
    share = c.topics["t"].buckets[src]
    _, actions = move_all_off(c)
    t = c.topics["t"]
    had = share.rate * t.spec.load / RATE
    assert src not in t.assignment and src in t.draining
    # nothing waiting there: the floor, so the members keep their rates
    assert t.draining[src] == pytest.approx(DRAIN_FLOOR * had)
    members = {b: t.buckets[b].rate for b in t.assignment}
    rate_of = {p.id: p.rate for p in t.spec.publishers}
    for b, rate in members.items():
        assert rate > math.fsum(rate_of[p] for p in t.assignment[b])
    assert not any(isinstance(a, Hold) and a.broker == src for a in actions)
    assert src in t.buckets and sums(c) == pytest.approx((RATE, BURST))
    # never a publish target; /lookup lists it; the ledger counts its share
    assert all(c.assign("t", f"p{i}")["broker"] != src for i in range(6))
    assert src in {b.id for b in c.producers("t")}
    ledger = {e.id: e.allocated for e in c.ledger()}
    assert ledger[src] == pytest.approx(t.buckets[src].rate)


def test_a_report_sent_after_the_drop_with_nothing_waiting_ends_the_drain() -> None:
    c = cluster()
    src, _ = move_all_off(c)
    report(c, src, 0.1)  # may have been sent before the drop: not enough
    assert not [a for a in c.tick(0.2) if getattr(a, "broker", None) == src]
    assert src in c.topics["t"].draining
    report(c, src, 0.3)  # sent after the answer to the one before: after the drop
    actions = c.tick(0.4)
    t = c.topics["t"]
    assert src not in t.draining and src not in t.buckets
    assert sums(c) == pytest.approx((RATE, BURST))
    down, up = phases(actions)  # type: ignore[arg-type]
    assert Hold(src, "t") in down
    assert up and all(a.was is not None and a.bucket.rate >= a.was.rate for a in up)
    assert all(isinstance(a, SetBucket) and a.broker != src for a in up)


@pytest.mark.parametrize("kind", ["waiting", "arriving"])
def test_messages_waiting_or_arriving_keep_it_draining(kind: str) -> None:
    c = cluster()
    src, _ = move_all_off(c)
    for i in range(4):
        if kind == "waiting":
            report(c, src, 0.1 * i, waiting=3)
        else:  # a plain publisher still publishing there: nothing waits, some arrive
            report(c, src, 0.1 * i, arrived=10 * i)
        c.tick(0.1 * i + 0.05)
    assert src in c.topics["t"].draining and src in c.topics["t"].buckets
    report(c, src, 1.0, arrived=30)
    report(c, src, 1.1, arrived=30)  # nothing waits, nothing arrived in between
    c.tick(1.2)
    assert src not in c.topics["t"].draining


def test_a_draining_broker_down_leaves_the_split() -> None:
    c = cluster()
    src, _ = move_all_off(c)
    for now in (1.0, 3.0, 5.0):
        for b in ("b0", "b1", "b2"):
            if b != src:
                report(c, b, now)
    c.tick(5.5)  # src silent for 5.5 s > 5 s: down
    t = c.topics["t"]
    assert c.brokers[src].down and src not in t.draining and src not in t.buckets
    assert sums(c) == pytest.approx((RATE, BURST))


def test_a_restarted_broker_with_restored_messages_drains() -> None:
    c = cluster()
    src, _ = move_all_off(c)
    report(c, src, 0.1)
    report(c, src, 0.2)
    c.tick(0.3)
    assert src not in c.topics["t"].buckets  # settled: it holds the topic
    info = c.brokers[src]
    actions = c.register(src, info.tcp_address, info.http_address, 1_000, now=0.4)
    # and its route again: it forwards what its old publishers still send it
    assert [a for a in actions if not isinstance(a, SetRoute)] == [Hold(src, "t")]
    report(c, src, 0.5, waiting=7)  # messages restored from disk wait for tokens
    c.tick(0.6)
    t = c.topics["t"]
    assert src in t.draining and src in t.buckets and src not in t.assignment
    rate_of = {p.id: p.rate for p in t.spec.publishers}
    smallest = min(math.fsum(rate_of[p] for p in ps) for ps in t.assignment.values())
    assert t.draining[src] >= smallest
    assert sums(c) == pytest.approx((RATE, BURST))
    report(c, src, 0.7)
    c.tick(0.8)
    assert src not in t.draining and src not in t.buckets


def test_the_draining_set_survives_a_controller_restart() -> None:
    c = cluster()
    src, _ = move_all_off(c)
    again = Controller(broker_timeout_s=5)
    again.restore(c.to_json(), now=0)
    t = again.topics["t"]
    assert t.draining == pytest.approx(c.topics["t"].draining)
    assert t.buckets == c.topics["t"].buckets
    report(again, src, 0.1)  # every report a restarted controller gets is after the drop
    report(again, src, 0.2)
    again.tick(0.3)
    assert src not in again.topics["t"].draining


def test_drain_weight_releases_the_waiting_queue_within_its_old_share() -> None:
    assert drain_weight(100.0, 0) == pytest.approx(DRAIN_FLOOR * 100.0)
    assert drain_weight(100.0, 30) == pytest.approx(30 / DRAIN_S)
    assert drain_weight(100.0, 10_000) == pytest.approx(100.0)
    assert drain_weight(0.0, 0) > 0


def test_a_broker_moved_off_forwards_before_its_share_shrinks() -> None:
    """What its old publishers still send it between its shrink and its route would wait
    on the drain share (5 % of its rate: a live move held 15 messages up to 1 s); its
    forwarding route goes first, every other route after the shares."""
    from srtm.control.actions import forwarding_first

    c = cluster()
    plan = c.topics["t"].assignment
    src = sorted(plan)[0]
    dst = next(b for b in ("b0", "b1", "b2") if b != src)
    actions = c.move("t", list(plan[src]), dst)
    down, _ = phases(actions)  # type: ignore[arg-type]
    routes = [a for a in actions if isinstance(a, SetRoute)]
    assert any(a.broker == src for a in down)
    first, after = forwarding_first(routes, down)
    assert [r.broker for r in first] == [src] and first[0].doc["forward"]
    assert all(r.broker != src for r in after) and len(first) + len(after) == len(routes)
    assert forwarding_first(routes, []) == ([], routes)  # nothing shrinks: all after


def test_a_relaying_route_waits_for_the_shares() -> None:
    from srtm.control.actions import forwarding_first

    reps = {"peers": {}, "primary": "b0", "homes": {}}
    relay = SetRoute("b0", "t", {"topic": "t", "self": "b0", "forward": None, "replicas": reps})
    both = SetRoute("b0", "t", {**relay.doc, "forward": {"to": "x:1", "publishers": {}}})
    shrink = [Hold("b0", "t")]
    assert forwarding_first([relay, both], shrink) == ([], [relay, both])
