"""A share passed on from one broker to another over the relay link (docs/broker.md,
"Handoff").

At the destination, the controller arms a share under a one-time token (``arm``); nothing
changes there until a relay link sends HANDOFF with that token (``take``), which applies
it as the controller's own push would. At the source, a decrease that names the
destination queues that HANDOFF on the relay link to it (``send``), behind everything
already relayed there. ``Arms`` is the armed shares themselves, without I/O, on the clock
it is handed.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from srtm.broker.state import LeaseExpired
from srtm.protocol import ProtocolError
from srtm.ratelimit import check_bucket

log = logging.getLogger("srtm.broker")

#: How long a share armed for a handoff waits for it (s): a handoff comes one push and one
#: relay hop after the arm, or never (the controller's own push then gives the share).
ARM_TTL_S = 5.0
#: Armed shares kept at most (topics): beyond, the one armed first goes.
MAX_ARMED = 4096


@dataclass(slots=True)
class Armed:
    rate: float
    burst: float
    token: str
    until_s: float


class Arms:
    """Shares armed for a handoff (``POST /srtm/bucket/arm``), at most one per topic,
    each good once and until ``ARM_TTL_S`` after it was armed."""

    def __init__(self) -> None:
        self.armed: dict[str, Armed] = {}

    def arm(self, topic: str, rate: float, burst: float, token: str, now_s: float) -> None:
        self.armed.pop(topic, None)
        for name in [t for t, a in self.armed.items() if a.until_s <= now_s]:
            del self.armed[name]
        if len(self.armed) >= MAX_ARMED:
            del self.armed[next(iter(self.armed))]
        self.armed[topic] = Armed(rate, burst, token, now_s + ARM_TTL_S)

    def take(self, topic: str, token: str, now_s: float) -> tuple[float, float] | None:
        """The share armed for ``topic`` under ``token``, spent now; None: none (no arm,
        another token, or lapsed)."""
        armed = self.armed.get(topic)
        if armed is None or not hmac.compare_digest(armed.token, token):
            return None
        del self.armed[topic]
        if armed.until_s <= now_s:
            return None
        return armed.rate, armed.burst

    def clear(self, topic: str) -> None:
        self.armed.pop(topic, None)


class Link(Protocol):
    def send_handoff(self, topic: str, token: str, done: Callable[[bool], None]) -> bool: ...


class Links(Protocol):
    """What the source's end needs of the relay (``srtm.broker.relay.Relay`` is one)."""

    @property
    def stopping(self) -> bool: ...

    def link(self, address: str) -> Link: ...


class Handoffs:
    """Both ends of a handoff on this broker: the shares armed here (the destination's
    end) and the HANDOFF sent after a decrease (the source's). ``set_bucket`` applies a
    share as the controller's push does (``Shares.set_bucket``)."""

    def __init__(
        self,
        relay: Links,
        set_bucket: Callable[[str, float, float], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.relay = relay
        self.set_bucket = set_bucket
        self.clock = clock
        self.arms = Arms()

    # -- the destination -------------------------------------------------------------------
    def arm(self, topic_name: str, rate: float, burst: float, token: str) -> None:
        """Keep ``(rate, burst)`` for ``topic_name`` until a relay link hands it over with
        ``token`` (``take``); nothing changes here until then. Replaces an armed share of
        the topic; lapses after ``ARM_TTL_S``."""
        check_bucket(rate, burst)
        self.arms.arm(topic_name, rate, burst, token, self.clock())

    def take(self, topic_name: str, token: str) -> bool:
        """A relay link's HANDOFF: the broker that sent it gave up the share armed here
        under ``token``; apply it as the controller's ``set_bucket`` would (lease rules
        included). An unknown, spent or lapsed token does nothing (logged)."""
        armed = self.arms.take(topic_name, token, self.clock())
        if armed is None:
            log.info("topic %s: a handoff with no matching armed share ignored", topic_name)
            return False
        try:
            self.set_bucket(topic_name, *armed)
        except (LeaseExpired, ValueError, OverflowError, ProtocolError) as exc:
            log.warning("topic %s: handed-over share %r not applied: %s", topic_name, armed, exc)
            return False
        return True

    def clear(self, topic_name: str) -> None:
        """The controller's own word on the topic replaces a share armed for it."""
        self.arms.clear(topic_name)

    # -- the source ------------------------------------------------------------------------
    def send(self, topic: str, address: str | None, token: str | None) -> bool:
        """After a decrease that names a destination (``address`` and ``token``, both or
        neither): send it a HANDOFF of ``topic`` after everything queued to it so far.
        False if none was asked or its link is down (the controller's push gives the
        share). The link is kept while a route names the address (a forwarding route
        does)."""
        if address is None or token is None or self.relay.stopping:
            return False

        def done(ok: bool) -> None:
            if not ok:
                log.warning("topic %s: handoff to %s not delivered", topic, address)

        return self.relay.link(address).send_handoff(topic, token, done)
