"""The what-ifs behind ``srtm place`` and ``srtm rebalance``: placement and rebalancing
computed on documents, without a cluster. Pure: documents in, typed results out.

- ``place_in_order``: topics placed one after the other, each on the capacity ledger the
  ones before it left, as the controller places them.
- ``rebalance_what_if``: a cluster state document (format in docs/controller.md,
  "Rebalancing (what-if)") parsed with errors naming the field, the rebalancer's decisions
  on it and each broker's load ratio before and after them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from srtm.placement.ledger import LedgerEntry, for_topic, ledger
from srtm.placement.model import BrokerCapacity, Placement, TopicSpec, parse_topic
from srtm.placement.policies import Policy, place
from srtm.placement.rebalance import (
    BrokerWindow,
    Decision,
    RebalanceSettings,
    RebalanceState,
    TopicLoad,
    apply,
    egress_of,
    ingress_of,
    load_ratios,
    rebalance,
)
from srtm.ratelimit import BucketParams

__all__ = [
    "PlacedTopic",
    "RatioChange",
    "RebalanceWhatIf",
    "parse_state",
    "place_in_order",
    "rebalance_what_if",
]


# -- placement ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PlacedTopic:
    """One topic's placement with the ledger before and after it."""

    spec: TopicSpec
    placement: Placement
    before: tuple[LedgerEntry, ...]
    after: tuple[LedgerEntry, ...]

    def to_json(self) -> dict[str, Any]:
        """The placement's document, plus ``topic`` and ``ledger`` (the ledger after it)."""
        ledger_doc = [
            {"id": e.id, "mcap": e.mcap, "allocated": e.allocated, "measured": e.measured,
             "rcap": e.rcap}
            for e in self.after
        ]  # fmt: skip
        return self.placement.to_json() | {"topic": self.spec.name, "ledger": ledger_doc}


def place_in_order(
    policy: Policy, fleet: Sequence[BrokerCapacity], specs: Sequence[TopicSpec], seed: int
) -> list[PlacedTopic]:
    """Each of ``specs`` placed under ``policy``, in order, on what the ones before it left
    of ``fleet`` (whose ``load`` is the measured ingress)."""
    measured = [(b.id, b.mcap, b.load) for b in fleet]
    plans: list[dict[str, BucketParams]] = []
    placed = []
    for spec in specs:
        before = ledger(measured, plans)
        result = place(policy, for_topic(spec, [e.capacity() for e in before]), spec, seed)
        plans.append({a.broker: a.bucket for a in result.assignments if a.bucket is not None})
        placed.append(PlacedTopic(spec, result, tuple(before), tuple(ledger(measured, plans))))
    return placed


# -- rebalancing ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RatioChange:
    """A broker's load ratio before the decisions and after them (None: despawned)."""

    broker: str
    before: float
    after: float | None


@dataclass(frozen=True, slots=True)
class RebalanceWhatIf:
    """What the rebalancer decides for a state at ``now_s``, and what that does to the
    brokers' load ratios."""

    now_s: float
    decisions: tuple[Decision, ...]
    brokers: tuple[RatioChange, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "now_s": self.now_s,
            "decisions": [d.to_json() for d in self.decisions],
            "brokers": [{"id": b.broker, "before": b.before, "after": b.after}
                        for b in self.brokers],
        }  # fmt: skip


def rebalance_what_if(
    doc: Any, settings: RebalanceSettings, now: float | None = None
) -> RebalanceWhatIf:
    """The rebalancer on state document ``doc`` at ``now`` (default: the state's
    ``now_s``, else 0). Raises ValueError naming the bad field."""
    state = parse_state(doc)
    when = _state_time(doc) if now is None else now
    decisions = rebalance(state, settings, when)
    before = load_ratios(state, settings)
    after = load_ratios(apply(state, decisions, settings, when), settings)
    ratios = tuple(RatioChange(b, lr, after.get(b)) for b, lr in before.items())
    return RebalanceWhatIf(when, tuple(decisions), ratios)


def _state_time(doc: Any) -> float:
    raw = doc.get("now_s", 0.0) if isinstance(doc, dict) else 0.0
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"now_s must be a number, got {raw!r}")
    return float(raw)


def _num(doc: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in doc:
        if default is None:
            raise ValueError(f"{where}: missing field {key!r}")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}.{key} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{where}.{key} must be >= 0, got {value!r}")
    return float(value)


def parse_state(doc: Any) -> RebalanceState:
    """The what-if state (format in docs/controller.md, "Rebalancing (what-if)"); errors
    name the field. A broker's ``ingress``/``egress`` default to what its plans send it."""
    if not isinstance(doc, dict):
        raise ValueError("state must be a JSON object")
    topics_doc = doc.get("topics", [])
    if not isinstance(topics_doc, list):
        raise ValueError("topics must be an array")
    brokers_doc = doc.get("brokers")
    if not isinstance(brokers_doc, list) or not brokers_doc:
        raise ValueError("brokers must be a non-empty array of objects")
    ids: list[str] = []
    for i, item in enumerate(brokers_doc):
        if not isinstance(item, dict):
            raise ValueError(f"brokers[{i}] must be an object, got {item!r}")
        bid = item.get("id")
        if not isinstance(bid, str) or not bid:
            raise ValueError(f"brokers[{i}].id must be a non-empty string, got {bid!r}")
        ids.append(bid)
    if len(set(ids)) != len(ids):
        raise ValueError(f"brokers: duplicate ids {sorted({i for i in ids if ids.count(i) > 1})}")
    topics = tuple(_parse_topic(t, i, set(ids)) for i, t in enumerate(topics_doc))
    names = [t.name for t in topics]
    if len(set(names)) != len(names):
        raise ValueError(
            f"topics: duplicate names {sorted({n for n in names if names.count(n) > 1})}"
        )
    brokers = []
    for i, item in enumerate(brokers_doc):
        where = f"brokers[{i}]"
        mcap = _num(item, "mcap", where)
        if mcap <= 0:
            raise ValueError(f"{where}.mcap must be > 0, got {mcap!r}")
        ingress = _num(item, "ingress", where, math.fsum(ingress_of(t, ids[i]) for t in topics))
        egress = _num(item, "egress", where, math.fsum(egress_of(t, ids[i]) for t in topics))
        cpu = _num(item, "cpu", where, 0.0)
        streak = _num(item, "slo_streak", where, 0.0)
        if streak != int(streak):
            raise ValueError(f"{where}.slo_streak must be an integer, got {streak!r}")
        emax = _num(item, "egress_max", where) if "egress_max" in item else None
        if emax is not None and emax <= 0:
            raise ValueError(f"{where}.egress_max must be > 0, got {emax!r}")
        stoppable = item.get("stoppable", True)
        if not isinstance(stoppable, bool):
            raise ValueError(f"{where}.stoppable must be true or false, got {stoppable!r}")
        brokers.append(
            BrokerWindow(ids[i], mcap, ingress, egress, cpu, int(streak), emax, stoppable)
        )
    spawning = _num(doc, "spawning", "state", 0.0)
    return RebalanceState(tuple(brokers), topics, int(spawning))


def _parse_topic(doc: Any, i: int, brokers: set[str]) -> TopicLoad:
    where = f"topics[{i}]"
    try:
        spec = parse_topic(doc)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    assert isinstance(doc, dict)
    plan_doc = doc.get("plan")
    if not isinstance(plan_doc, dict) or not plan_doc:
        raise ValueError(f"{where}.plan must be an object: broker id -> [publisher ids]")
    known = {p.id for p in spec.publishers}
    seen: set[str] = set()
    plan: dict[str, tuple[str, ...]] = {}
    for b, pubs in plan_doc.items():
        if b not in brokers:
            raise ValueError(f"{where}.plan: unknown broker {b!r}")
        if not isinstance(pubs, list) or not all(isinstance(p, str) for p in pubs):
            raise ValueError(f"{where}.plan.{b} must be an array of publisher ids")
        for p in pubs:
            if p not in known:
                raise ValueError(f"{where}.plan.{b}: unknown publisher {p!r}")
            if p in seen:
                raise ValueError(f"{where}.plan: publisher {p!r} on two brokers")
            seen.add(p)
        plan[b] = tuple(pubs)
    replicas = doc.get("replicas", [])
    if not isinstance(replicas, list) or any(r not in brokers for r in replicas):
        raise ValueError(f"{where}.replicas must be an array of known broker ids")
    if replicas and len(plan) != 1:
        raise ValueError(f"{where}.replicas: an ALL_PUBLISHERS topic has a one-broker plan")
    subs = _num(doc, "subscribers", where, 1.0)
    if subs != int(subs):
        raise ValueError(f"{where}.subscribers must be an integer, got {subs!r}")
    size = _num(doc, "message_bytes", where, 100.0)
    last = _num(doc, "last_change_s", where) if "last_change_s" in doc else None
    return TopicLoad(spec, plan, int(subs), size, tuple(replicas), last)
