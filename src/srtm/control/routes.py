"""Brokers' routes for a topic, with no I/O: lazy plan propagation (forwarding) and
ALL_PUBLISHERS replication (Dynamoth, seed 004), as the controller records and pushes them.

A route is the body of a broker's ``POST /srtm/route`` (docs/controller.md, "Forwarding"
and "Replication"): ``{"topic", "self", "forward", "replicas"}``.

- **Forwarding.** A broker some publishers of the topic moved off (``Routing.left``)
  forwards their messages, unshaped, to the broker each now publishes to; one with no
  publisher of the topic left forwards everything else to the plan's broker with the
  largest share (``forward.to``). Plain NSQ publishers know one broker and never hear of a
  new plan: the old broker passes their messages on until none come for ``grace_s``.
- **Replication.** A replicated topic has an ordered replica set, primary first (the plan's
  one broker). Every replica relays what clients publish on it to every peer, shapes with
  the topic's whole ``(r, b)``, and delivers only the channels homed on it (an NSQ channel is
  a consumer group: two homes would deliver a message twice). A new channel is homed on the
  replica with the fewest homes, then the least egress; homes never move otherwise, except
  off a replica that goes.

``Routing`` is the record kept with a topic (``TopicState.routing``); ``routes`` computes
what every broker should have; ``changes`` turns that into the route actions to push, in an
order that never loses a message: brokers gaining a channel's home hear first (a message
may be delivered twice while homes change, never not at all).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from srtm.control.actions import DropRoute, SetRoute
from srtm.ratelimit import BucketParams

__all__ = ["FORWARD_GRACE_S", "Routing", "changes", "home_channels", "routes"]

#: A forwarding broker stops after this long without a message to forward (s).
FORWARD_GRACE_S = 10.0

#: A route body (``POST /srtm/route``).
RouteDoc = dict[str, Any]


@dataclass
class Routing:
    """A topic's forwarding and replication record."""

    #: broker -> publishers that moved off it (it forwards them while they still come).
    left: dict[str, list[str]] = field(default_factory=dict)
    #: The replica set, primary first; empty: not replicated.
    replicas: list[str] = field(default_factory=list)
    #: channel -> the replica that delivers it.
    homes: dict[str, str] = field(default_factory=dict)
    #: publisher -> broker in the last plan (rebuilt from the plan on restore).
    where: dict[str, str] = field(default_factory=dict)
    #: broker -> the route it was last given (rebuilt on restore: brokers keep theirs).
    pushed: dict[str, RouteDoc] = field(default_factory=dict)

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1

    def note_plan(
        self, assignment: Mapping[str, Iterable[str]], publishers: Container[str]
    ) -> None:
        """A new plan: who moved off a broker is forwarded from it; who came back, or left
        the topic, is not any more."""
        now = {p: b for b, ps in assignment.items() for p in ps}
        for p, was in self.where.items():
            if p in now and now[p] != was and p not in self.left.get(was, []):
                self.left.setdefault(was, []).append(p)
        for b in list(self.left):
            kept = [p for p in self.left[b] if p in publishers and now.get(p, b) != b]
            if kept:
                self.left[b] = kept
            else:
                del self.left[b]
        self.where = now

    def note_joined(self, placed: Mapping[str, Iterable[str]]) -> None:
        """A new plan that only added publishers (broker -> the new ids) to the plan last
        noted: ``note_plan``'s outcome, without its pass over every publisher (nobody
        moved or left, so nobody starts or stops being forwarded)."""
        for b, ps in placed.items():
            self.where.update(dict.fromkeys(ps, b))

    def drop_replica(self, broker: str) -> None:
        """``broker`` leaves the replica set (its homes move at the next ``home_channels``);
        a set of one is no replication."""
        self.replicas = [r for r in self.replicas if r != broker]
        if len(self.replicas) < 2:
            self.replicas, self.homes = [], {}

    def to_json(self) -> dict[str, Any]:
        return {"left": self.left, "replicas": self.replicas, "homes": self.homes}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> Routing:
        doc = doc or {}
        return cls(
            {b: list(ps) for b, ps in doc.get("left", {}).items()},
            list(doc.get("replicas", [])),
            dict(doc.get("homes", {})),
        )


def home_channels(
    homes: Mapping[str, str], replicas: list[str], channels: Iterable[str],
    egress: Mapping[str, float],
) -> dict[str, str]:  # fmt: skip
    """Each channel's home: kept where it is on a replica still in the set (a channel the
    registry does not list yet, after a restart say, keeps its home; an ephemeral one
    gone loses it); a new one (or one whose replica went) on the replica with the fewest
    of this topic's homes, then the least egress (bytes/s), then first in the set.

    Fewest homes first: a home given a moment ago carries no traffic yet, and the
    replicas' egress is then all something else (handshakes, heartbeats, other topics).
    Counting each home at the average egress per home let that egress decide: idle
    replicas reporting 2, 2 and 21 kB/s got two of three new channels on one replica."""
    if len(replicas) < 2:
        return {}
    listed = set(channels)
    out = {
        c: r
        for c, r in homes.items()
        if r in replicas and (c in listed or not c.endswith("#ephemeral"))
    }
    count = {r: sum(1 for h in out.values() if h == r) for r in replicas}
    for c in sorted(listed - set(out)):
        out[c] = best = min(
            replicas, key=lambda r: (count[r], egress.get(r, 0.0), replicas.index(r))
        )
        count[best] += 1
    return out


def routes(
    topic: str,
    routing: Routing,
    assignment: Mapping[str, list[str]],
    buckets: Mapping[str, BucketParams],
    tcp: Mapping[str, str],
    grace_s: float = FORWARD_GRACE_S,
    where: Mapping[str, str] | None = None,
) -> dict[str, RouteDoc]:
    """What every broker should have for ``topic`` (a broker absent: no route). ``tcp``:
    broker id -> its ``HOST:PORT`` for NSQ (brokers up). ``where``: publisher -> its
    broker in ``assignment``, if known (``Routing.where`` just noted)."""
    out: dict[str, RouteDoc] = {}
    members = [b for b, ps in assignment.items() if ps and b in tcp]
    reps = routing.replicas if routing.replicated else []
    # The plan's broker with the largest share (ties: first in the plan).
    biggest = max(
        members, key=lambda b: (buckets[b].rate if b in buckets else -math.inf, -members.index(b)),
        default=None,
    )  # fmt: skip
    if where is None:
        where = {p: b for b, ps in assignment.items() for p in ps}
    for b in sorted(set(routing.left) | set(reps)):
        if b not in tcp:
            continue
        forward = None
        if b not in reps:
            pubs = {
                p: tcp[where[p]]
                for p in routing.left.get(b, [])
                if p in where and where[p] != b and where[p] in tcp
            }
            to = tcp[biggest] if biggest is not None and b not in members else None
            if pubs or to is not None:
                forward = {"to": to, "publishers": pubs, "grace_s": grace_s}
        replicas = None
        if b in reps:
            peers = {r: tcp[r] for r in reps if r != b and r in tcp}
            replicas = {"peers": peers, "primary": reps[0], "homes": dict(routing.homes)}
        if forward is not None or replicas is not None:
            out[b] = {"topic": topic, "self": b, "forward": forward, "replicas": replicas}
    return out


def changes(routing: Routing, want: Mapping[str, RouteDoc]) -> list[SetRoute | DropRoute]:
    """The route actions that take the brokers from ``routing.pushed`` to ``want`` (and
    record ``want`` as pushed): first the brokers that gain a channel's home, then the
    other changes, then the removals. A removal last: a broker that loses its route
    delivers every channel again, so the others must have stopped relaying to it."""
    was = routing.pushed

    def homes_of(doc: RouteDoc | None, b: str) -> set[str]:
        reps = (doc or {}).get("replicas") or {}
        primary = reps.get("primary")
        return {c for c, h in reps.get("homes", {}).items() if h == b} | (
            {""} if primary == b else set()
        )

    changed = [b for b, doc in want.items() if was.get(b) != doc]
    gaining = [b for b in changed if homes_of(want[b], b) - homes_of(was.get(b), b)]
    rest = [b for b in changed if b not in gaining]
    out: list[SetRoute | DropRoute] = [
        SetRoute(b, want[b]["topic"], want[b]) for b in gaining + rest
    ]
    out += [DropRoute(b, doc["topic"]) for b, doc in was.items() if b not in want]
    routing.pushed = dict(want)
    return out
