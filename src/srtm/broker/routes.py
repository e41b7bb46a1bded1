"""The relay's route table, without I/O: per topic, where this broker forwards what it
is published (lazy plan propagation) and whom it replicates to, with the rules of both.

Times are seconds on a clock the caller passes in (the broker's ``time.monotonic``), so
expiry is a function of the values given. ``srtm.broker.relay`` does the sending.

``saved_route`` and ``restored_route`` are a route as ``meta.json`` keeps it across a
restart (``srtm.broker.persistence``): the forward part with the grace it had left, so
that one whose grace ran out while the broker was down is not restored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Bounds of a saved route, as of /srtm/route's body (srtm.broker.documents): entries of
#: each map, the grace, the length of an id or an address.
MAX_ENTRIES, MAX_GRACE_S, MAX_NAME = 10_000, 86_400.0, 256


@dataclass(frozen=True, slots=True)
class Forward:
    """Where messages for the topic go instead of being accepted here: a publisher's own
    target first, else ``to`` (None: only the listed publishers are forwarded)."""

    to: str | None
    publishers: Mapping[str, str]
    grace_s: float = 10.0

    def target(self, publisher: str | None) -> str | None:
        if publisher and (own := self.publishers.get(publisher)) is not None:
            return own
        return self.to


@dataclass(frozen=True, slots=True)
class Replicas:
    """ALL_PUBLISHERS replication: every peer gets a copy of what clients publish here;
    a channel is served by its home replica only (``homes``, else ``primary``)."""

    peers: Mapping[str, str]
    primary: str
    homes: Mapping[str, str]

    def home(self, channel: str) -> str:
        return self.homes.get(channel, self.primary)


@dataclass(slots=True)
class Counters:
    """What a route did (kept when its forward part ends, until the route is removed)."""

    forwarded: int = 0
    relayed: int = 0
    fallback_local: int = 0


@dataclass(slots=True)
class TopicRoute:
    """One topic's route on this broker (``self_id``: this broker's id in the controller)."""

    topic: str
    self_id: str
    forward: Forward | None
    replicas: Replicas | None
    #: When forwarding last happened (or the route was set): the grace runs from there.
    last_forward_s: float
    counters: Counters = field(default_factory=Counters)
    #: Publishers already sent their migrate order (once each per route).
    ordered: set[str] = field(default_factory=set)
    #: Read back from ``meta.json`` at start, not set in this run: the controller's
    #: routes replace it at registration.
    restored: bool = False

    def forward_target(self, publisher: str | None, now_s: float) -> str | None:
        """Where a message from ``publisher`` goes now (None: accepted here). The forward
        part ends once nothing was forwarded for its grace."""
        fwd = self.forward
        if fwd is None:
            return None
        if now_s - self.last_forward_s >= fwd.grace_s:
            self.forward = None
            return None
        return fwd.target(publisher)

    def expire(self, now_s: float) -> None:
        """Drop the forward part if its grace has run out (reading the route does this)."""
        self.forward_target(None, now_s)

    def forwarded(self, n: int, now_s: float) -> None:
        self.counters.forwarded += n
        self.last_forward_s = now_s

    def keeps(self, channel: str) -> bool:
        """Whether ``channel`` is delivered on this broker (always, unless replicated)."""
        reps = self.replicas
        return reps is None or reps.home(channel) == self.self_id

    @property
    def serves_unlisted(self) -> bool:
        """Whether a channel named nowhere is served here (this broker is the primary)."""
        reps = self.replicas
        return reps is None or reps.primary == self.self_id

    def peers(self) -> dict[str, str]:
        """The replicas to copy to: every peer but this broker."""
        reps = self.replicas
        if reps is None:
            return {}
        return {b: addr for b, addr in reps.peers.items() if b != self.self_id}

    def channels_of(self, peer: str, local: list[str]) -> list[str]:
        """The channels homed on ``peer``: those named in ``homes``, and, if it is the
        primary, the ``local`` channels named nowhere (what a copy to it would have fed)."""
        reps = self.replicas
        if reps is None:
            return []
        named = [c for c, home in reps.homes.items() if home == peer]
        if peer == reps.primary:
            named += [c for c in local if c not in reps.homes]
        return named


class RouteTable:
    """The routes by topic. ``get`` is the publish hook's one lookup."""

    def __init__(self) -> None:
        self.routes: dict[str, TopicRoute] = {}

    def __contains__(self, topic: str) -> bool:
        return topic in self.routes

    def __bool__(self) -> bool:
        return bool(self.routes)

    def get(self, topic: str) -> TopicRoute | None:
        return self.routes.get(topic)

    def set(self, route: TopicRoute) -> TopicRoute:
        """Replace the topic's route; its counters carry on (they only grow)."""
        old = self.routes.get(route.topic)
        if old is not None:
            route.counters = old.counters
        self.routes[route.topic] = route
        return route

    def remove(self, topic: str) -> TopicRoute | None:
        return self.routes.pop(topic, None)


def saved_route(route: TopicRoute, now_s: float) -> dict[str, Any] | None:
    """``route`` as ``meta.json`` keeps it (None: nothing left to keep). The forward part
    carries ``grace_left_s``, what its grace had left at ``now_s``. Reads the route only
    (safe in the metadata writer's thread)."""
    fwd, reps = route.forward, route.replicas
    left = 0.0 if fwd is None else fwd.grace_s - (now_s - route.last_forward_s)
    if left <= 0:
        fwd = None
    if fwd is None and reps is None:
        return None
    return {
        "topic": route.topic,
        "self": route.self_id,
        "forward": None
        if fwd is None
        else {
            "to": fwd.to,
            "publishers": dict(fwd.publishers),
            "grace_s": fwd.grace_s,
            "grace_left_s": min(left, fwd.grace_s),
        },
        "replicas": None
        if reps is None
        else {"peers": dict(reps.peers), "primary": reps.primary, "homes": dict(reps.homes)},
    }


def restored_route(doc: Any, now_s: float, down_s: float) -> TopicRoute | None:
    """The route ``saved_route`` kept, ``down_s`` seconds later (``math.inf``: unknown);
    its grace goes on from what it had left. None when nothing is left of it (its forward
    part ended and it replicates nothing). Raises ValueError for a document that is not
    one, or out of the bounds /srtm/route takes."""
    if not isinstance(doc, dict):
        raise ValueError("not a route")
    topic, self_id = _name(doc.get("topic"), "topic"), _name(doc.get("self"), "self")
    fwd, reps, left = None, None, 0.0
    if (f := doc.get("forward")) is not None:
        if not isinstance(f, dict):
            raise ValueError("forward: not an object")
        to = None if f.get("to") is None else _name(f.get("to"), "forward.to")
        grace = _number(f.get("grace_s"), "forward.grace_s", MAX_GRACE_S)
        left = min(_number(f.get("grace_left_s"), "forward.grace_left_s", grace), grace)
        fwd = Forward(to, _names(f.get("publishers", {}), "forward.publishers"), grace)
        left -= down_s
    if (r := doc.get("replicas")) is not None:
        if not isinstance(r, dict):
            raise ValueError("replicas: not an object")
        peers = _names(r.get("peers"), "replicas.peers")
        primary = _name(r.get("primary"), "replicas.primary")
        homes = _names(r.get("homes", {}), "replicas.homes")
        if not {primary, *homes.values()} <= {*peers, self_id}:
            raise ValueError("replicas: a home is not a peer or self")
        reps = Replicas(peers, primary, homes)
    if left <= 0:
        fwd = None  # its grace ended while the broker was down
    if fwd is None and reps is None:
        return None
    last = now_s - (fwd.grace_s - left) if fwd is not None else now_s
    return TopicRoute(topic, self_id, fwd, reps, last, restored=True)


def _name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
        raise ValueError(f"{what}: not a name")
    return v


def _names(v: Any, what: str) -> dict[str, str]:
    if not isinstance(v, dict) or len(v) > MAX_ENTRIES:
        raise ValueError(f"{what}: not a map of at most {MAX_ENTRIES} names")
    return {_name(k, what): _name(x, what) for k, x in v.items()}


def _number(v: Any, what: str, most: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= most:
        raise ValueError(f"{what}: not a number in [0, {most}]")
    if not math.isfinite(v):
        raise ValueError(f"{what}: not finite")
    return float(v)
