"""The relay's route table, without I/O: per topic, where this broker forwards what it
is published (lazy plan propagation) and whom it replicates to, with the rules of both.

Times are seconds on a clock the caller passes in (the broker's ``time.monotonic``), so
expiry is a function of the values given. ``srtm.broker.relay`` does the sending.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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
