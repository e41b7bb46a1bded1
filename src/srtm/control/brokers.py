"""The broker registry, leases and failover: registration (a broker gets its shares and
holds back), reports (load, windows, queues, resources; repairs of shares it lost),
silence on the controller's awake clock, and a broker down: its publishers placed again
on the others, a replica's topic taken over by the next replica."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from srtm.control.actions import HELD, Action, Hold, SetBucket, Share, same_bucket
from srtm.control.model import BrokerInfo, ControllerState, Resources, TopicState
from srtm.control.plans import fleet, hosts_of, new_plan, route_changes
from srtm.control.replicas import replica_down
from srtm.control.validate import ControlError, parse_address
from srtm.placement import PublisherLoad, WindowReport, for_topic, place
from srtm.ratelimit import BucketParams
from srtm.ratelimit.overflow import DEFAULT_BOUND


def register(
    c: ControllerState,
    broker_id: str,
    tcp: str,
    http: str,
    mcap: float,
    now: float,
    host: str | None = None,
) -> list[Action]:
    """Register (again); an existing id at another address is refused (409) while the
    broker there is up, so nobody takes over a live broker's id. ``host``: the host it
    runs on (None: its id, a host of its own)."""
    if not isinstance(broker_id, str) or not broker_id or len(broker_id) > 256:
        raise ControlError(400, "id must be a non-empty string of at most 256 characters")
    if isinstance(mcap, bool) or not (
        isinstance(mcap, int | float) and math.isfinite(mcap) and mcap > 0
    ):
        raise ControlError(400, f"mcap must be a number > 0, got {mcap!r}")
    parse_address(tcp, "tcp_address")
    parse_address(http, "http_address")
    if host is not None and (not isinstance(host, str) or not host or len(host) > 256):
        raise ControlError(400, "host must be a non-empty string of at most 256 characters")
    info = c.brokers.get(broker_id)
    if info is None:
        info = c.brokers[broker_id] = BrokerInfo(broker_id, tcp, http, float(mcap))
        c.replace_pending = True
    elif (info.tcp_address, info.http_address) != (tcp, http) and not info.down:
        raise ControlError(
            409,
            f"broker {broker_id!r} is registered at {info.tcp_address} and up; "
            "another address may take its id only once it is down",
        )
    if info.down:
        c.replace_pending = True
    info.tcp_address, info.http_address, info.mcap = tcp, http, float(mcap)
    info.host = host or broker_id
    info.last_seen_s, info.down = c.awake(now), False
    c.registry.drop(broker_id)  # a new producer, as an nsqd reconnecting
    info.reports, info.depths, info.waiting, info.shares = {}, {}, {}, None
    info.arrived, info.arrived_before = {}, {}
    # A broker that (re)starts, or whose lease lapsed, holds every managed topic:
    # its shares again, and a hold on every other managed topic; then its routes
    # (a restarted broker lost them; the others' name its new address).
    actions: list[Action] = [
        SetBucket(broker_id, name, t.buckets[broker_id])
        if broker_id in t.buckets
        else Hold(broker_id, name)
        for name, t in c.topics.items()
    ]
    for t in c.topics.values():
        t.routing.pushed.pop(broker_id, None)
        actions += route_changes(c, t)
    return actions


def bucket_doc(c: ControllerState, topic: str, bucket: BucketParams) -> dict[str, Any]:
    """A sub-bucket as brokers are given it (a push, a registration answer): with its
    topic's bound and overflow policy, which the broker polices by."""
    t = c.topics.get(topic)
    bound = DEFAULT_BOUND if t is None else t.bound
    return {"rate": bucket.rate, "burst": bucket.burst,
            "max_wait_ms": bound.max_wait_ms, "overflow": bound.overflow.value}  # fmt: skip


def shares(c: ControllerState, broker_id: str) -> tuple[dict[str, BucketParams], list[str]]:
    """What ``broker_id`` carries: its sub-bucket per topic, and the managed topics it
    holds (what its registration answer tells it)."""
    buckets = {n: t.buckets[broker_id] for n, t in c.topics.items() if broker_id in t.buckets}
    return buckets, [n for n in c.topics if n not in buckets]


def report(
    c: ControllerState,
    broker_id: str,
    load: float,
    topics: dict[str, tuple[float, float]],
    now: float,
    depths: dict[str, int] | None = None,
    waiting: dict[str, int] | None = None,
    arrived: dict[str, int] | None = None,
    carried: dict[str, frozenset[str]] | None = None,
    seen: dict[str, Share] | None = None,
    resources: Mapping[str, Any] | None = None,
    demand: dict[str, dict[str, int]] | None = None,
    arrived_bytes: dict[str, int] | None = None,
    storage_latency_ms: dict[str, float] | None = None,
) -> list[Action]:
    """A broker's report: its load, each topic's TB Adaptor window, (``depths``) what
    it still holds per topic, (``waiting``) what waits for tokens and (``arrived``)
    messages accepted since it started, per topic (``BrokerInfo.settled``; the tick
    acts on them). Non-finite or negative numbers are refused whole.

    ``carried``: every topic it has, with its channels (the registry's input);
    ``seen``: each topic's share there; ``resources`` (``documents.BrokerResources``),
    ``demand``, ``arrived_bytes``, ``storage_latency_ms``: what the utility optimizer
    and rate control read
    (``BrokerInfo``). Returns what puts back a share the broker lost (an NSQ tool
    deleted or emptied the topic, say): the caller carries these out only while no
    change of that topic is on its way (``repairs``)."""
    info = c.brokers.get(broker_id)
    if info is None:
        raise ControlError(404, f"broker {broker_id!r} is not registered")
    numbers = [load, *(x for pair in topics.values() for x in pair)]
    if not all(math.isfinite(x) and x >= 0 for x in numbers):
        raise ControlError(400, f"report of {broker_id}: numbers must be finite and >= 0")
    if info.down:
        c.replace_pending = True
    info.load, info.last_seen_s, info.down = load, c.awake(now), False
    for name, (rate, backlog) in topics.items():
        info.reports[name] = WindowReport(rate, backlog, now, (waiting or {}).get(name, 0))
    if depths is not None:
        info.depths = {name: d for name, d in depths.items() if d > 0}
    info.reports_seen += 1
    info.waiting = {name: w for name, w in (waiting or {}).items() if w > 0}
    info.arrived_before, info.arrived = info.arrived, dict(arrived or {})
    if carried is not None:
        c.registry.carry(broker_id, carried)
    info.resources = None if resources is None else Resources.from_json(resources)
    info.demand = dict(demand or {})
    info.arrived_bytes = dict(arrived_bytes or {})
    info.storage_latency_ms = dict(storage_latency_ms or {})
    if seen is None:
        return []
    info.shares = {name: s for name, s in seen.items() if isinstance(s, BucketParams)}
    return repairs(c, broker_id, seen)


def repairs(c: ControllerState, broker_id: str, seen: dict[str, Share]) -> list[Action]:
    """What makes ``broker_id``'s shares what the plans give it, from what it has
    (``seen``: topic -> its sub-bucket, ``HELD``, or ``None``: neither; a topic it
    lacks is absent): its sub-bucket where it has a share, a hold on a managed topic
    it carries without one. A share that grows waits while the other brokers' live
    shares leave no room for it (``room``): their own reports shrink them first."""
    actions: list[Action] = []
    for name, topic in c.topics.items():
        want = topic.buckets.get(broker_id)
        got = seen.get(name)
        was = got if isinstance(got, BucketParams) else None
        if want is not None and (was is None or not same_bucket(was, want)):
            grows = was is None or want.rate > was.rate or want.burst > was.burst
            if not grows or room(c, topic, broker_id, want):
                actions.append(SetBucket(broker_id, name, want, was))
        elif want is None and name in seen and got != HELD:
            actions.append(Hold(broker_id, name))
    return actions


def room(c: ControllerState, topic: TopicState, broker_id: str, want: BucketParams) -> bool:
    """Would ``want`` on ``broker_id`` keep the topic's live sub-buckets within what its
    plan gives in all, each other broker up counted at the larger of its last reported
    share and its plan's? (A plan that brokers have not all carried out, one a deposed
    leader left half done, or one older than a broker's share: an increase pushed on its
    own would not wait for the others' decreases.) Not while another broker up has not
    reported its shares to this controller: after a leader change, a broker may still
    shape by the plan before the one the new leader read (a live run put a share back
    on one broker while the other still shaped by the older plan: Σ rate 425 > r = 400)."""
    name, rate, burst = topic.spec.name, want.rate, want.burst
    for b, info in c.brokers.items():
        if b == broker_id or info.down:  # down: its lease lapsed, it holds
            continue
        if info.shares is None:
            return False
        shares = [p for p in (topic.buckets.get(b), info.shares.get(name)) if p is not None]
        rate += max((p.rate for p in shares), default=0.0)
        burst += max((p.burst for p in shares), default=0.0)
    planned = topic.buckets.values()
    slack = 1 + 1e-9
    return (
        rate <= sum(p.rate for p in planned) * slack
        and burst <= sum(p.burst for p in planned) * slack
    )


def deregister(c: ControllerState, broker_id: str) -> list[Action]:
    """A broker stopping cleanly: down at once (its publishers move), not after
    ``broker_timeout_s`` of silence."""
    info = c.brokers.get(broker_id)
    if info is None:
        raise ControlError(404, f"broker {broker_id!r} is not registered")
    c.registry.drop(broker_id)
    if info.down:
        return []
    info.down = True
    return broker_down(c, broker_id)


def silent(c: ControllerState, now: float, after_s: float) -> list[str]:
    """Brokers up that sent nothing for ``after_s`` (awake clock), not down yet: the
    ones worth asking whether anything still listens at their address."""
    awake = c.awake(now)
    return [b.id for b in c.brokers.values() if not b.down and awake - b.last_seen_s > after_s]


def gone(
    c: ControllerState, broker_id: str, http_address: str, now: float, after_s: float
) -> list[Action] | None:
    """A silent broker whose address (``http_address``, as it was asked) refused the
    connection: its process is gone (a kill, a crash), so it is down now, as after
    ``broker_timeout_s``: the actions. None if it spoke or registered again
    meanwhile (or is down already)."""
    info = c.brokers.get(broker_id)
    if info is None or info.down or info.http_address != http_address:
        return None
    if c.awake(now) - info.last_seen_s <= after_s:
        return None
    info.down = True
    c.registry.drop(broker_id)
    return broker_down(c, broker_id)


def expire(c: ControllerState, now: float) -> list[Action]:
    """The tick's failover step: brokers silent for ``broker_timeout_s`` on the awake
    clock are down, their publishers placed again. With etcd (``c.live``): a broker
    holding a live key is not down for silence, one whose key was deleted is down now
    (its lease expired: it stopped shaping before), one without a key keeps the rule."""
    awake = c.awake(now)
    live = c.live
    deleted = live.take_deleted() if live is not None else set()
    expired: list[str] = []
    for info in c.brokers.values():
        if info.down:
            continue
        if live is not None and live.holds(info.id, info.http_address):
            continue
        if info.id in deleted or awake - info.last_seen_s > c.broker_timeout_s:
            info.down = True
            c.registry.drop(info.id)
            expired.append(info.id)
    # All down before any failover: a host's processes expire together, and one's
    # publishers must not be placed on a sibling that is down too.
    actions: list[Action] = []
    for broker_id in expired:
        actions += broker_down(c, broker_id)
    return actions


def broker_down(c: ControllerState, broker_id: str) -> list[Action]:
    """Failover: each topic's publishers on ``broker_id`` are placed on the brokers up
    (what the previous topics were given counts), a draining share is freed, and a
    replicated topic goes on with its other replicas."""
    actions: list[Action] = []
    for topic in c.topics.values():
        if broker_id in topic.routing.replicas:  # the next replica takes over
            actions += replica_down(c, topic, broker_id)
            continue
        orphans = topic.assignment.pop(broker_id, None)
        if not orphans:
            if broker_id in topic.draining:  # its share is freed, as at failover
                topic.events.append(f"broker {broker_id} down: no longer draining")
                actions += new_plan(c, topic)
            continue
        # per topic: what the previous topics were given counts
        brokers = fleet(c, placing=topic.spec.name)
        by_id = {p.id: p for p in topic.spec.publishers}
        pool: list[PublisherLoad] = [by_id[p] for p in orphans]
        brokers = for_topic(topic.spec, brokers)
        pool_spec = topic.spec.with_publishers(pool)
        placement = place(topic.policy, brokers, pool_spec, c.seed, hosts_of(c, topic))
        for a in placement.assignments:
            topic.assignment.setdefault(a.broker, []).extend(a.publishers)
        topic.unassigned += placement.unassigned
        topic.events.append(
            f"broker {broker_id} down: {len(orphans)} publishers moved to "
            f"{', '.join(placement.brokers) or 'no broker'}"
        )
        actions += new_plan(c, topic)
    return actions
