"""Whether this controller may act (tick, adapt, rebalance, push to brokers, write its
state), with no I/O: ``Leadership``, the state of one controller among several on one
etcd prefix (``srtm.control.election`` drives it), or of the only one (SQLite).

A leader holds the key ``PREFIX/leader`` on its etcd lease; its *epoch* is that key's
``create_revision``. It acts only while its last successful keepalive (or the grant of
its lease) was *sent* less than ``ACTING_FRACTION`` × the lease ago: etcd renewed the
lease no earlier than that request was sent, so the key is still this leader's until at
least ``send + lease``, and the leader stops acting well before another can be elected.
Times are the caller's clock (seconds, monotonic)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from srtm.httpkit import EPOCH_HEADER

__all__ = ["EPOCH_HEADER", "LeaderInfo", "Leadership", "Role"]

#: A leader acts while its last renewal was sent less than this fraction of the lease ago.
ACTING_FRACTION = 0.6
#: The key under the prefix that the leader holds.
LEADER_KEY = "leader"


class Role(enum.Enum):
    #: The only controller (SQLite): always acting.
    ALONE = "alone"
    #: Follows the state and answers reads; writes go to the leader.
    STANDBY = "standby"
    #: Holds ``PREFIX/leader``: acts while its lease is surely its own.
    LEADER = "leader"


@dataclass(frozen=True)
class LeaderInfo:
    """What ``PREFIX/leader`` holds: who leads and where its HTTP API is."""

    id: str
    #: ``host:port``
    http_address: str
    scheme: str = "http"

    def to_json(self) -> str:
        doc = {"id": self.id, "http_address": self.http_address, "scheme": self.scheme}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> LeaderInfo:
        """ValueError naming what is wrong (another program's key, a partial write)."""
        try:
            doc: Any = json.loads(text)
        except ValueError as e:
            raise ValueError(f"the leader key is not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"the leader key is not a JSON object: {text[:100]!r}")
        id_, address, scheme = (doc.get(k) for k in ("id", "http_address", "scheme"))
        if not all(isinstance(f, str) and f for f in (id_, address, scheme)):
            raise ValueError(f"the leader key lacks id, http_address or scheme: {text[:100]!r}")
        if scheme not in ("http", "https"):
            raise ValueError(f"the leader key's scheme is {scheme!r}, not http or https")
        return cls(str(id_), str(address), str(scheme))

    def url(self, path_qs: str) -> str:
        return f"{self.scheme}://{self.http_address}{path_qs}"


class Leadership:
    """One controller's role, epoch and the leader it knows of. ``alone()``: SQLite."""

    def __init__(self, lease_s: float, me: LeaderInfo, role: Role = Role.STANDBY) -> None:
        if lease_s <= 0:
            raise ValueError(f"the leader lease must be positive, not {lease_s}")
        self.lease_s = lease_s
        self.me = me
        self.role = role
        #: The epoch this controller leads in (None: not leading).
        self.epoch: int | None = None
        #: Who leads, as far as this controller knows (itself when leading or alone).
        self.leader: LeaderInfo | None = me if role is Role.ALONE else None
        #: When the last renewal that succeeded was sent (the caller's clock).
        self._renewed_at = float("-inf")
        #: Times this controller won and lost an election (for the log and tests).
        self.terms = 0

    @classmethod
    def alone(cls, me: LeaderInfo) -> Leadership:
        return cls(1.0, me, Role.ALONE)

    def acting(self, now: float) -> bool:
        """May this controller change plans and tell brokers now?"""
        if self.role is Role.ALONE:
            return True
        return self.role is Role.LEADER and now - self._renewed_at < self.lease_s * ACTING_FRACTION

    def lapsed(self, now: float) -> bool:
        """A leader whose renewals failed too long: it must step down (``lost``)."""
        return self.role is Role.LEADER and not self.acting(now)

    def won(self, epoch: int, sent_at: float) -> None:
        """Its campaign's transaction created the leader key at ``epoch``, on a lease
        granted by a request sent at ``sent_at``."""
        self.role, self.epoch, self.leader = Role.LEADER, epoch, self.me
        self._renewed_at = sent_at
        self.terms += 1

    def renewed(self, sent_at: float) -> None:
        """A keepalive sent at ``sent_at`` was answered with a TTL above 0."""
        if self.role is Role.LEADER:
            self._renewed_at = max(self._renewed_at, sent_at)

    def lost(self) -> None:
        """Its lease is gone, its renewals failed too long, or a write was fenced."""
        if self.role is Role.LEADER:
            self.role, self.epoch, self.leader = Role.STANDBY, None, None
            self._renewed_at = float("-inf")

    def saw_leader(self, leader: LeaderInfo | None) -> None:
        """A standby read (or watched) the leader key: another leads, or none (None)."""
        if self.role is Role.STANDBY:
            self.leader = leader

    def set_me(self, me: LeaderInfo) -> None:
        """Its own address, known once its HTTP site is bound."""
        if self.leader == self.me:
            self.leader = me
        self.me = me

    def doc(self, now: float) -> dict[str, Any]:
        """``/info``'s fields: ``leader`` only while it acts (a leader whose renewals
        lapsed is not one, even before it noticed)."""
        leader, acting = self.leader, self.acting(now)
        if acting:
            plans = "made here"
        elif leader is not None and leader != self.me:
            plans = f"made by the leader at {leader.http_address}: this controller is a standby"
        else:
            plans = "wait for a leader: no controller leads now"
        return {
            "leader": acting,
            "leader_http_address": None if leader is None else leader.http_address,
            "epoch": self.epoch if acting else None,
            "plan_changes": plans,
        }
