"""What the controller answers, read from its state without changing it (except the
running sums it may take again): a topic's plan, a publisher's broker, a topic's
document, where subscribers read, and nsqlookupd's views (/lookup, /topics, /nodes)."""

from __future__ import annotations

from typing import Any

from srtm.control.model import BrokerInfo, ControllerState, bucket_json
from srtm.control.plans import sums
from srtm.control.validate import ControlError


def plan(c: ControllerState, name: str) -> dict[str, Any]:
    topic = c.topic(name)
    return {
        "topic": name,
        "version": topic.version,
        "policy": topic.policy,
        "status": topic.status,
        "brokers": [
            {
                "id": b,
                "tcp_address": c.brokers[b].tcp_address,
                "http_address": c.brokers[b].http_address,
                "publishers": ps,
                "bucket": bucket_json(topic.buckets.get(b)),
            }
            for b, ps in topic.assignment.items()
        ],
        "unassigned": topic.unassigned,
    }


def is_publisher(c: ControllerState, name: str, publisher: str) -> bool:
    topic = c.topics.get(name)
    return topic is not None and publisher in sums(c, topic).by_id


def assign(c: ControllerState, name: str, publisher: str) -> dict[str, Any]:
    topic = c.topic(name)
    if topic.shape().same(topic.noted_shape):  # the plan as noted: where it is, at once
        where = topic.routing.where.get(publisher)
        placed = [] if where is None else [(where, [publisher])]
    else:
        placed = list(topic.assignment.items())
    for b, ps in placed:
        if publisher in ps:
            info = c.brokers[b]
            return {
                "topic": name,
                "publisher": publisher,
                "broker": b,
                "tcp_address": info.tcp_address,
                "version": topic.version,
            }
    if publisher in topic.unassigned:
        raise ControlError(503, f"publisher {publisher!r} is unassigned: capacity is short")
    raise ControlError(404, f"publisher {publisher!r} is not in topic {name!r}")


def topic_doc(c: ControllerState, name: str) -> dict[str, Any]:
    topic = c.topic(name)
    return plan(c, name) | {
        "slo_p99_ms": topic.spec.slo_p99_ms,
        "rate": topic.spec.rate,
        "burst": topic.spec.burst,
        "max_wait_ms": topic.bound.max_wait_ms,
        "overflow": topic.bound.overflow.value,
        "publishers": len(topic.spec.publishers),
        "events": topic.events,
        "fitting": None if topic.fitting is None else topic.fitting.to_json(),
        "open": topic.open,
        "max_publisher_rate": topic.join_rate_limit() if topic.open else None,
        "join_secret_set": topic.join_secret is not None,
        "replicas": topic.routing.replicas,
        "homes": topic.routing.homes,
        "forwarding": {b: sorted(d) for b, d in topic.routing.left.items()},
        "utility": None if topic.utility is None else topic.utility.to_json(),
        "allocation": None
        if topic.allocation is None
        else topic.allocation.to_json(topic.spec.rate),
    }


def topic_brokers(c: ControllerState, name: str) -> list[BrokerInfo]:
    """The plan's brokers, then a replicated topic's other replicas."""
    topic = c.topics.get(name)
    if topic is None:
        return []
    ids = dict.fromkeys([*topic.assignment, *topic.routing.replicas])
    return [c.brokers[b] for b in ids if b in c.brokers]


def producers(c: ControllerState, name: str) -> list[BrokerInfo]:
    """Where subscribers of ``name`` read: its live brokers, then any other live broker
    still holding messages of it or draining it (a broker back after failover drains
    its backlog there; it is never a publish target, /assign does not name it)."""
    live = [b for b in topic_brokers(c, name) if not b.down]
    ids = {b.id for b in live}
    topic = c.topics.get(name)
    draining = set() if topic is None else set(topic.draining)
    return live + [
        b for b in c.up() if b.id not in ids and (b.depths.get(name, 0) > 0 or b.id in draining)
    ]


def lookup(c: ControllerState, name: str, now: float) -> tuple[list[str], list[BrokerInfo]] | None:
    """nsqlookupd's /lookup: the topic's channels and where to read it (None: no such
    topic). A managed topic's are its ``producers`` (plan, then backlogs); an
    unmanaged one's every live broker registered for it; a tombstoned broker is left
    out while its tombstone lasts."""
    reg = c.registry
    holding = producers(c, name)
    if name not in c.topics and not holding and not reg.has_topic(name):
        return None
    ids = {b.id for b in holding}
    # A managed topic's readers go where its plan and backlogs are (a broker holding
    # it with nothing left is not listed); the registry lists an unmanaged one's.
    more = [
        c.brokers[i]
        for i in reg.producers(name)
        if name not in c.topics and i not in ids and i in c.brokers and not c.brokers[i].down
    ]
    live = [b for b in holding + more if not reg.is_tombstoned(name, b.id, now)]
    return reg.channels(name), live


def topic_names(c: ControllerState) -> list[str]:
    """nsqlookupd's /topics: managed topics and every registered one."""
    return sorted(set(c.topics) | set(c.registry.topics()))


def nodes(c: ControllerState, now: float) -> list[tuple[BrokerInfo, list[str], list[bool]]]:
    """nsqlookupd's /nodes: every broker up, its topics, and whether each is
    tombstoned there."""
    reg = c.registry
    out = []
    for b in c.up():
        topics = reg.broker_topics(b.id)
        out.append((b, topics, [reg.is_tombstoned(t, b.id, now) for t in topics]))
    return out
