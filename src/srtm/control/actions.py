"""What the controller asks of brokers and tells the service: the actions its decisions
return, and the order that keeps a topic's live sub-buckets within its ``(r, b)``.

Pure data and rules (no I/O); the controller's decisions make them, the service carries them
out (``srtm.control.service``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from srtm.ratelimit import BucketParams

__all__ = [
    "HELD", "Action", "DropRoute", "HandoffPlan", "Hold", "Migrate", "PlanChanged", "SetBucket",
    "SetRoute", "Share", "TopicAction", "Unmanage", "forwarding_first", "handoff", "phases",
    "same_bucket",
]  # fmt: skip


class TopicAction(Protocol):
    """What every action has: the topic it is about (the service groups and serialises
    a topic's changes by it)."""

    @property
    def topic(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SetBucket:
    """Give ``broker`` this sub-bucket of ``topic``; ``was``: the one the plan gave it
    before (None: none, it held the topic or did not have it)."""

    broker: str
    topic: str
    bucket: BucketParams
    was: BucketParams | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """``broker`` has no share of the managed ``topic``: it keeps what arrives for it and
    releases nothing (its sub-bucket, if any, goes)."""

    broker: str
    topic: str
    #: The sub-bucket the plan gave it before (None: none or not known); not compared.
    was: BucketParams | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class PlanChanged:
    topic: str
    version: int


@dataclass(frozen=True, slots=True)
class Migrate:
    """Tell ``publisher``, through its current broker, to move to ``to`` (TCP address)."""

    broker: str
    topic: str
    publisher: str
    to: str
    version: int


@dataclass(frozen=True, slots=True)
class Unmanage:
    """``topic`` is no longer managed: ``broker`` drops its sub-bucket and releases what
    it holds of it (messages already accepted are still delivered)."""

    broker: str
    topic: str


@dataclass(frozen=True, slots=True)
class SetRoute:
    """Give ``broker`` this route of ``topic`` (``POST /srtm/route``: forwarding and
    replication, ``srtm.control.routes``); it replaces the one it had. Carried out after
    the share changes of the same actions (a broker relays only to brokers that already
    shape with their new share: make-before-break), except a forwarding route of a
    broker whose share shrinks: that one goes first (``forwarding_first``)."""

    broker: str
    topic: str
    doc: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DropRoute:
    """``broker`` drops its route of ``topic`` (``DELETE /srtm/route``)."""

    broker: str
    topic: str


#: Every one a ``TopicAction``: it names its topic.
Action = SetBucket | Hold | PlanChanged | Migrate | Unmanage | SetRoute | DropRoute


def phases(actions: list[Action]) -> tuple[list[SetBucket | Hold], list[SetBucket]]:
    """The share changes among ``actions``, in the order that keeps every topic's live
    sub-buckets within its ``(r, b)``: first every decrease (holds, smaller buckets),
    then, once all are applied, every increase. A change that lowers one of rate and
    burst and raises the other is both: first down to the smaller of each, then up."""
    down: list[SetBucket | Hold] = []
    up: list[SetBucket] = []
    for a in actions:
        if isinstance(a, Hold):
            down.append(a)
        elif isinstance(a, SetBucket):
            new, was = a.bucket, a.was
            if was is None or (new.rate >= was.rate and new.burst >= was.burst):
                up.append(a)
            elif new.rate <= was.rate and new.burst <= was.burst:
                down.append(a)
            else:
                low = BucketParams(min(new.rate, was.rate), min(new.burst, was.burst))
                down.append(SetBucket(a.broker, a.topic, low, was))
                up.append(SetBucket(a.broker, a.topic, new, low))
    return down, up


def forwarding_first(
    routes: list[SetRoute | DropRoute], down: list[SetBucket | Hold]
) -> tuple[list[SetRoute | DropRoute], list[SetRoute | DropRoute]]:
    """``routes`` as (before the decreases ``down``, after the increases), each in its
    order. Before: the forwarding routes (no replication) of brokers whose share shrinks
    or is held in the same change. Such a broker is losing publishers; what they still
    send it until it forwards would wait on its small draining share (a live move held
    15 messages up to 1 s at 5 % of the old rate). Forwarded, they are shaped by their
    new broker, with its old share until its increase (or held there): within ``(r, b)``
    all along, a wait of one push at most."""
    shrinking = {a.broker for a in down}

    def early(r: SetRoute | DropRoute) -> bool:
        return (
            isinstance(r, SetRoute)
            and r.broker in shrinking
            and r.doc.get("forward") is not None
            and r.doc.get("replicas") is None
        )

    return [r for r in routes if early(r)], [r for r in routes if not early(r)]


@dataclass(frozen=True, slots=True)
class HandoffPlan:
    """A topic's change that moves share from one broker to one other: the source's
    decrease hands what it gave up to the destination over their relay link (a HANDOFF
    after all it forwarded there before), carrying the source's forwarding route."""

    source: SetBucket | Hold
    dest: SetBucket
    #: The source's forwarding route, set by its decrease in the same step (None: none).
    route: SetRoute | None


def handoff(
    down: list[SetBucket | Hold], up: list[SetBucket], first: list[SetRoute | DropRoute]
) -> tuple[HandoffPlan | None, list[SetRoute | DropRoute]]:
    """The handoff of one topic's change (``phases``' ``down`` and ``up``, the routes
    ``forwarding_first`` puts before), and the routes still pushed on their own first.

    One when exactly one broker's live share shrinks and exactly one other's grows, by
    no more than the first gave up in rate and in burst: the destination may then take
    its new share the moment the source has dropped its old one, and the sum stays within
    ``(r, b)``. A hold of a broker that had no share, or an unchanged bucket, is no
    change. Otherwise None (every push as ``phases`` orders them)."""
    shrinks = [a for a in down if a.was is not None]
    grows = [a for a in up if a.was is None or not same_bucket(a.was, a.bucket)]
    if len(shrinks) != 1 or len(grows) != 1:
        return None, first
    source, dest = shrinks[0], grows[0]
    if source.broker == dest.broker or source.was is None:
        return None, first
    left = (source.bucket.rate, source.bucket.burst) if isinstance(source, SetBucket) else (0, 0)
    had = (0.0, 0.0) if dest.was is None else (dest.was.rate, dest.was.burst)
    if not (
        _within(dest.bucket.rate - had[0], source.was.rate - left[0])
        and _within(dest.bucket.burst - had[1], source.was.burst - left[1])
    ):
        return None, first
    carried = [r for r in first if isinstance(r, SetRoute) and r.broker == source.broker]
    route = carried[0] if len(carried) == 1 else None
    return HandoffPlan(source, dest, route), [r for r in first if r is not route]


def _within(need: float, freed: float) -> bool:
    return need <= freed or math.isclose(need, freed, rel_tol=1e-9, abs_tol=1e-9)


#: A topic a broker holds (managed, no share there), as a report tells it.
HELD = "held"
#: A topic's share on a broker: its sub-bucket, ``HELD``, or None (unmanaged there).
Share = BucketParams | str | None


def same_bucket(a: BucketParams, b: BucketParams) -> bool:
    return math.isclose(a.rate, b.rate, rel_tol=1e-9) and math.isclose(
        a.burst, b.burst, rel_tol=1e-9
    )
