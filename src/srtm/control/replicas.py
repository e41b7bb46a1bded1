"""ALL_PUBLISHERS replication: a topic's replica set (primary first), each replica shaping
the whole stream and homing some of its channels. Set by count or by the rebalancer, one
replica at a time; a replica down leaves the set, the next one taking over as primary.
(A plan keeps a replicated topic on its primary: ``plans.fold_replicas``.)"""

from __future__ import annotations

from srtm.control.actions import Action
from srtm.control.model import ControllerState, TopicState
from srtm.control.plans import ledger_of, new_plan, route_changes
from srtm.control.validate import ControlError


def replica_down(c: ControllerState, topic: TopicState, broker_id: str) -> list[Action]:
    """A replica went down: it leaves the set, its channels are homed elsewhere; if it
    was the primary, the next replica takes its publishers."""
    r = topic.routing
    others = [b for b in r.replicas if b != broker_id]
    orphans = topic.assignment.pop(broker_id, None)
    r.drop_replica(broker_id)
    if orphans:
        topic.assignment.setdefault(others[0], []).extend(orphans)
    topic.events.append(
        f"replica {broker_id} down: " + (f"{others[0]} is primary" if orphans else "re-homed")
    )
    return new_plan(c, topic)


def set_replicas(
    c: ControllerState, name: str, count: int, to: list[str] | None = None
) -> list[Action]:
    """ALL_PUBLISHERS with ``count`` replicas (1: none): added from ``to`` if given,
    else the least-loaded brokers up by the ledger; removed from the end of the set
    (never the primary). The topic's publishers must be on one broker (409)."""
    topic = c.changeable(name)
    up = {b.id for b in c.up()}
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ControlError(400, f"count must be an integer >= 1, got {count!r}")
    if count > len(up):
        raise ControlError(400, f"count: {count} > {len(up)} brokers up")
    plan = [b for b, ps in topic.assignment.items() if ps]
    r = topic.routing
    have = list(r.replicas) or plan[:1]
    if len(have) == count or (not r.replicas and count == 1):
        return []
    if not r.replicas and len(plan) != 1:
        raise ControlError(
            409, f"topic {name!r}: ALL_PUBLISHERS replicates a topic whose publishers "
            f"are on one broker; they are on {len(plan)}",
        )  # fmt: skip
    if count > len(have):
        load = {e.id: e.load / e.mcap for e in ledger_of(c)}
        pool = [b for b in (to or sorted(up, key=lambda b: (load[b], b))) if b not in have]
        bad = [b for b in pool if b not in up]
        if bad:
            raise ControlError(400, f"to: broker {bad[0]!r} is not registered and up")
        have += pool[: count - len(have)]
    r.replicas = have[:count]
    if not r.replicated:
        r.replicas, r.homes = [], {}
    note = f"replicas: {', '.join(r.replicas)}" if r.replicated else "not replicated"
    topic.events.append(f"ALL_PUBLISHERS {note}")
    return new_plan(c, topic)


def replicate(c: ControllerState, name: str, to: str) -> list[Action]:
    """Add broker ``to`` to ``name``'s replica set (the rebalancer's ``Replicate``)."""
    have = c.topics[name].routing.replicas if name in c.topics else []
    if to in have:
        return []
    return set_replicas(c, name, max(len(have), 1) + 1, [to])


def unreplicate(c: ControllerState, name: str, broker: str) -> list[Action]:
    """Remove replica ``broker`` (the rebalancer's ``Unreplicate``; not the primary)."""
    topic = c.changeable(name)
    r = topic.routing
    if broker not in r.replicas[1:]:
        raise ControlError(400, f"broker {broker!r} is not a replica of {name!r}")
    r.drop_replica(broker)
    topic.events.append(f"replica {broker} removed")
    return new_plan(c, topic)


def rehome(c: ControllerState) -> list[Action]:
    """The tick's replication step: channels new to a replicated topic get a home."""
    actions: list[Action] = []
    for topic in c.topics.values():
        if topic.routing.replicated:
            actions += route_changes(c, topic)
    return actions
