"""A join costs the controller work independent of the topic's publishers (issue 29,
item 5): the join path reads and updates running sums (``Controller.sums``) instead of
summing every publisher again, and those sums always equal sums taken from scratch.

Work is counted, not timed: the Python steps (``sys.settrace`` events) one join takes.
A pass over the topic's publishers in Python is one step or more per publisher; the one
linear step left is the C-level copy of the publishers' tuple."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from srtm.control import Controller
from srtm.placement import RATE_MARGIN, PublisherLoad, Sums, TopicSpec
from support import registered


def steps(call: Callable[[], Any]) -> int:
    """How many Python events (calls, lines, returns) ``call`` takes."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        return tracer

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(old)
    return count


def open_topic(policy: str, *, rate_auto: bool) -> Controller:
    c = registered(3, mcap=1e12)
    spec = TopicSpec("o", (), 10.0, 100.0, 0.0 if rate_auto else 1e9)
    c.create_topic(spec, policy, now=0.0, open=True, rate_auto=rate_auto)
    return c


def join(c: Controller, i: int) -> None:
    c.join_open("o", f"p{i}", 1.0 + i % 3, f"g{i % 4}")


@pytest.mark.parametrize(("policy", "rate_auto"), [("srtm", True), ("srtm", False), ("lb", True)])
def test_a_join_takes_the_same_work_at_100_and_at_3000_publishers(
    policy: str, rate_auto: bool
) -> None:
    c = open_topic(policy, rate_auto=rate_auto)
    for i in range(100):
        join(c, i)
    small = [steps(lambda i=i: join(c, i)) for i in range(100, 106)]  # type: ignore[misc]
    for i in range(106, 3000):
        join(c, i)
    big = [steps(lambda i=i: join(c, i)) for i in range(3000, 3006)]  # type: ignore[misc]
    assert len(c.topics["o"].spec.publishers) == 3006
    # Per publisher, a linear join would take at least 2,900 more steps at 3,000.
    assert max(big) <= max(small) + 100, (small, big)


def test_a_known_publisher_and_its_broker_are_found_without_a_scan() -> None:
    c = open_topic("srtm", rate_auto=True)

    def again(p: str) -> Any:  # as ``GET /assign`` for a publisher already in
        return c.is_publisher("o", p), c.join_open("o", p, 2.0, None), c.assign("o", p)

    for i in range(100):
        join(c, i)
    small = steps(lambda: again("p99"))
    for i in range(100, 3000):
        join(c, i)
    big = steps(lambda: again("p2999"))
    assert big <= small + 20, (small, big)
    assert again("p2999")[:2] == (True, [])
    assert c.assign("o", "p2999")["broker"] in c.topics["o"].assignment
    assert not c.is_publisher("o", "p3000")


def check(c: Controller, name: str) -> None:
    """The sums the controller keeps equal the sums taken from scratch, and the
    forwarding record's publisher -> broker is the plan's."""
    t = c.topics[name]
    assert c.sums(t) == Sums.of(t.spec.publishers, t.assignment)
    assert t.routing.where == {p: b for b, ps in t.assignment.items() for p in ps}


def test_the_running_sums_equal_sums_taken_again_through_every_change() -> None:
    c = registered(4, mcap=2_000)
    pubs = tuple(PublisherLoad(f"s{i}", 0.1 * (i + 1), f"g{i % 3}") for i in range(30))
    rate = RATE_MARGIN * math.fsum(p.rate for p in pubs)
    c.create_topic(TopicSpec("o", pubs, 50.0, 100.0, rate), "srtm", 0.0, open=True,
                   rate_auto=True)  # fmt: skip
    t = c.topics["o"]
    check(c, "o")
    rates = [0.1, 0.3, 1e-3, 7.7, 1 / 3, 2.5e-5, 11.0]
    for i in range(40):
        kept = c.sums(t)
        c.join_open("o", f"j{i}", rates[i % len(rates)], f"g{i % 5}" if i % 2 else None)
        assert c.sums(t) is kept  # brought up to date, not taken again
        check(c, "o")
    other = "b1" if "j1" in t.assignment.get("b0", []) else "b0"
    changes: list[Callable[[], Any]] = [
        lambda: c.remove_publisher("o", "s3"),
        lambda: c.remove_publisher("o", "j5"),
        lambda: c.move("o", ["j1", "j2", "s4"], other),
        lambda: c.change_topic("o", burst=80.0),
        lambda: c.change_topic("o", rate=900.0),
        lambda: c.change_topic("o", policy="conc"),
        lambda: c.add_publishers("o", [PublisherLoad("a1", 3.0, "g1"), PublisherLoad("a2", 0.2)]),
        lambda: c.deregister(next(iter(t.assignment))),
        lambda: c.change_topic("o", policy="srtm"),
        lambda: c.set_rate("o", 700.0),
    ]
    for n, change in enumerate(changes):
        change()
        check(c, "o")
        for i in range(3):  # joins after each change: on the sums taken again
            c.join_open("o", f"k{n}-{i}", rates[(n + i) % len(rates)], "g2")
            check(c, "o")


def test_a_join_decides_as_with_sums_taken_from_scratch_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same joins, removals and moves on two controllers, one of which takes its
    sums again at every call: the same plans, buckets, routes and events."""

    def run() -> dict[str, Any]:
        c = registered(3, mcap=500)
        c.create_topic(TopicSpec("o", (), 20.0, 100.0, 0.0), "srtm", 0.0, open=True,
                       rate_auto=True)  # fmt: skip
        out = []
        for i in range(120):
            out += c.join_open("o", f"p{i}", 0.5 + (i * 7919 % 13) / 3, f"g{i % 6}")
            if i % 25 == 24:
                out += c.remove_publisher("o", f"p{i - 3}")
                out += c.move("o", [f"p{i - 1}"], "b2")
        return {"actions": out, "state": c.to_json()}

    kept = run()
    fresh_sums = Controller.sums

    def fresh(self: Controller, topic: Any) -> Sums:
        topic.sums = None
        return fresh_sums(self, topic)

    monkeypatch.setattr(Controller, "sums", fresh)
    assert run() == kept
