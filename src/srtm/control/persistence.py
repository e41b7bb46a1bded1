"""The controller's state as it is saved and rebuilt: the brokers' row
(``brokers_json``), one row per topic (``topic_json``: a change of a topic rewrites only
its own), and ``restore`` from them after a restart (``srtm.control.store`` keeps them)."""

from __future__ import annotations

from typing import Any

from srtm.control.model import (
    MAX_EVENTS,
    BrokerInfo,
    ControllerState,
    Events,
    FitState,
    FittingProgress,
    TopicState,
    TopicUtility,
    bucket_json,
)
from srtm.control.plans import new_plan
from srtm.control.routes import Routing, routes
from srtm.control.topics import set_publishers
from srtm.placement import PublisherLoad, TopicSpec
from srtm.ratelimit import MAX_RATE, BucketParams
from srtm.ratelimit.overflow import DEFAULT_BOUND, Bound, check_bound


def to_json(c: ControllerState) -> dict[str, Any]:
    """Everything that is saved (``brokers_json`` and each ``topic_json``)."""
    return {"brokers": brokers_json(c), "topics": [topic_json(c, n) for n in c.topics]}


def brokers_json(c: ControllerState) -> list[dict[str, Any]]:
    return [
        {
            "id": b.id,
            "tcp_address": b.tcp_address,
            "http_address": b.http_address,
            "mcap": b.mcap,
            "host": b.host,
        }
        for b in c.brokers.values()
    ]


def topic_json(c: ControllerState, name: str) -> dict[str, Any]:
    """One topic as it is saved (its own row: a change of it rewrites only this)."""
    t = c.topics[name]
    return {
        "name": t.spec.name,
        "policy": t.policy,
        "slo_p99_ms": t.spec.slo_p99_ms,
        "rate": t.spec.rate,
        "burst": t.spec.burst,
        "publishers": [{"id": p.id, "rate": p.rate, "group": p.group} for p in t.spec.publishers],
        "version": t.version,
        "assignment": t.assignment,
        "buckets": {b: bucket_json(p) for b, p in t.buckets.items()},
        "unassigned": t.unassigned,
        "events": t.events,
        "fitting": None if t.fitting is None else t.fitting.to_json(),
        "open": t.open,
        "max_publisher_rate": t.max_publisher_rate,
        "join_secret": t.join_secret,
        "rate_auto": t.rate_auto,
        "draining": t.draining,
        "routing": t.routing.to_json(),
        "utility": None if t.utility is None else t.utility.to_json(),
        "bound": {"max_wait_ms": t.bound.max_wait_ms, "overflow": t.bound.overflow.value},
    }


def restore(c: ControllerState, doc: dict[str, Any], now: float) -> None:
    """Rebuild from ``to_json``; brokers get a full timeout to report again."""
    for b in doc.get("brokers", []):
        c.brokers[b["id"]] = BrokerInfo(
            b["id"], b["tcp_address"], b["http_address"], b["mcap"],
            host=b.get("host") or b["id"], last_seen_s=c.awake(now),
        )  # fmt: skip
    for t in doc.get("topics", []):
        pubs = tuple(PublisherLoad(p["id"], p["rate"], p.get("group")) for p in t["publishers"])
        spec = TopicSpec(t["name"], pubs, t["burst"], t["slo_p99_ms"], t["rate"])
        topic = c.topics[spec.name] = TopicState(
            spec,
            t["policy"],
            t["version"],
            {b: list(ps) for b, ps in t["assignment"].items()},
            {b: BucketParams(x["rate"], x["burst"]) for b, x in t["buckets"].items() if x},
            list(t["unassigned"]),
            Events(list(t.get("events", []))[-MAX_EVENTS:]),
            _interrupted(t.get("fitting")),
            open=bool(t.get("open", False)),
            max_publisher_rate=t.get("max_publisher_rate"),
            join_secret=t.get("join_secret"),
            rate_auto=bool(t.get("rate_auto", False)),
            draining={b: float(w) for b, w in t.get("draining", {}).items()},
            routing=Routing.from_json(t.get("routing")),
            utility=_restored_utility(t.get("utility"), t["name"]),
            bound=_restored_bound(t.get("bound")),
        )
        _restore_routes(c, topic)
        _drop_impossible(c, topic)
        if t["unassigned"]:
            c.replace_pending = True


def _drop_impossible(c: ControllerState, topic: TopicState) -> None:
    """A state saved before joins were bounded may hold a publisher whose rate no
    bucket can carry (``rate=1e308`` by an anonymous ``/assign``): its topic lost
    its sub-buckets and every sum over it overflows. Such publishers leave the topic
    at restore (an event says so) and it gets a new plan; the brokers get their
    shares back by the repairs of their next reports."""
    bad = [
        p
        for p in topic.spec.publishers
        if not (isinstance(p.rate, int | float) and 0 < p.rate <= MAX_RATE)
    ]
    if not bad:
        return
    gone = {p.id for p in bad}
    set_publishers(topic, [p for p in topic.spec.publishers if p.id not in gone])
    topic.assignment = {b: [p for p in ps if p not in gone] for b, ps in topic.assignment.items()}
    topic.unassigned = [p for p in topic.unassigned if p not in gone]
    topic.events.append(
        f"at restore: {len(bad)} publishers with a rate no bucket can carry removed "
        f"({', '.join(repr(p.id) for p in bad[:3])})"
    )
    new_plan(c, topic)


def _restore_routes(c: ControllerState, topic: TopicState) -> None:
    """After a restart: brokers kept the routes they were given, which the record
    says (every registered broker counts as up until it is marked down)."""
    r, name = topic.routing, topic.spec.name
    r.where = {p: b for b, ps in topic.assignment.items() for p in ps}
    tcp = {b.id: b.tcp_address for b in c.brokers.values()}
    r.pushed = routes(name, r, topic.assignment, topic.buckets, tcp, c.forward_grace_s)


def _interrupted(doc: dict[str, Any] | None) -> FittingProgress | None:
    """A fitting that was running when the controller stopped is not running any more."""
    if doc is None:
        return None
    fitting = FittingProgress.from_json(doc)
    if fitting.running:
        fitting.state = FitState.INTERRUPTED
    return fitting


def _restored_utility(doc: Any, topic: str) -> TopicUtility | None:
    """A saved utility spec, as it was saved (absent or null: none)."""
    return None if doc is None else TopicUtility.from_json(doc, topic)


def _restored_bound(doc: Any) -> Bound:
    """A saved bound (absent, from before bounds: the default)."""
    if not isinstance(doc, dict):
        return DEFAULT_BOUND
    return check_bound(doc.get("max_wait_ms"), doc.get("overflow"))
