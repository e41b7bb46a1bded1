"""Registers the broker with the controller (the leader of those given) and reports its
load and per-topic TB Adaptor window every second, and at once when a topic or channel
appears or goes (registering again whenever the controller does not know it, or the
broker's lease lapsed; with an etcd liveness lease, only while that lease holds).

Each answer of the controller renews the broker's lease from when the request was sent;
a registration answer also carries the broker's shares and holds, applied on receipt
with the new lease (see ``Shares.lease_ok``). Which controller answers is
``srtm.controllers``' rule: one that is away is passed over, a standby's 307 is followed
to the leader, and a controller that does not know the broker (404) is registered with."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from srtm.controllers import Controllers, ControllerUnreachable
from srtm.httpkit import join_host_port
from srtm.ratelimit.overflow import Bound, check_bound
from srtm.security import bearer_header

if TYPE_CHECKING:
    from srtm.broker.broker import Broker
    from srtm.broker.state import Topic

log = logging.getLogger("srtm.broker")


def topic_depth(topic: Topic) -> int:
    """Messages ``topic`` still holds anywhere on this broker: deferred, waiting for its
    bucket or a first channel, and per channel queued, deferred and in flight (a message copied to
    two channels counts twice: what matters is whether anything is left to read)."""
    return (
        topic.depth
        + topic.deferred_count
        + sum(ch.depth + ch.deferred_count + len(ch.in_flight) for ch in topic.channels.values())
    )


class ResourceMeter:
    """The broker's resources between two reports: CPU as the process's CPU time over
    wall time (a fraction of one core), egress as bytes sent to clients per second, each
    over the interval since the previous reading; congested above the broker's
    ``cpu_congested`` and ``egress_max``."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), time.process_time(), 0)

    def read(self, broker: Broker) -> dict[str, Any]:
        """``{"cpu", "egress_bps", "congested": {"cpu", "network"}}``; the first reading
        covers the time since the meter was made (made as reporting starts)."""
        wall, cpu, sent = time.monotonic(), time.process_time(), broker.egress_bytes()
        last, self._last = self._last, (wall, cpu, sent)
        span = max(wall - last[0], 1e-6)
        used = max(0.0, cpu - last[1]) / span
        egress = max(0, sent - last[2]) / span
        return {
            "cpu": used,
            "egress_bps": egress,
            "congested": {
                "cpu": used > broker.options.cpu_congested,
                "network": egress > broker.options.egress_max,
            },
        }


def report_document(broker: Broker, meter: ResourceMeter | None = None) -> dict[str, Any]:
    now = time.time_ns()
    topics = {}
    load = 0.0
    for name, topic in list(broker.topics.items()):
        w = broker.stats.topic(name).window
        rate = w.average_rate(now)
        load += w.rate_1s(now)
        topics[name] = {
            "rate": rate,
            "backlog": w.max_backlog(now),
            "depth": topic_depth(topic),
            # A draining broker leaves its topic's split once none wait and none arrive.
            "waiting": len(topic.shaping),
            "arrived": topic.message_count,
            # What nsqlookupd learns from nsqd's REGISTER, and the share the controller
            # checks against its plan (it puts back one an NSQ tool made the topic lose).
            "channels": list(topic.channels),
            "bucket": None
            if topic.bucket is None
            else {"rate": topic.bucket.rate, "burst": topic.bucket.burst},
            "held": topic.on_hold,
            "arrived_bytes": topic.message_bytes,
        }
    for name, adm in broker.admission.items():
        if name in topics:
            topics[name]["demand"] = adm.demand()
    for name, stored in broker.storage_latency.items():
        latency = stored.take_ms()
        if name in topics and latency is not None:
            topics[name]["storage_latency_ms"] = latency
    doc: dict[str, Any] = {"version": 2, "load": load, "topics": topics}
    if meter is not None:
        doc["resources"] = meter.read(broker)
    return doc


#: The shortest time between two reports (s), when topics or channels come and go.
MIN_REPORT_GAP_S = 0.05


async def report_loop(
    broker: Broker, controllers: Controllers | str, mcap: float, interval_s: float
) -> None:
    """Register with the controllers' leader and report every ``interval_s`` until
    cancelled; deregister then. ``controllers`` (or ``URL[,URL...]``) follows a standby's
    307 to the leader and passes over a controller that is away (see ``srtm.controllers``)."""
    if isinstance(controllers, str):
        controllers = Controllers(controllers, what="--controller", log=log)
    assert broker.tcp_address is not None and broker.http_address is not None
    headers = bearer_header(broker.options.token)
    me = {
        "id": str(broker.options.broker_id),
        "tcp_address": join_host_port(*broker.tcp_address),
        "http_address": join_host_port(*broker.http_address),
        "mcap": mcap,
        "host": broker.options.host_id or socket.gethostname(),
    }
    meter = ResourceMeter()
    registered = False
    lease_s: float | None = None  # told at registration (an older controller tells none)
    lapses = 0  # the shares' lapses when it registered: one more, and it registers again
    refused = 0  # the last refusal's status, logged once rather than every second
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=5), headers=headers
    ) as session:
        task = asyncio.current_task()
        try:
            while True:
                if task is not None and task.cancelling():
                    # A cancel that a library turned into a timeout, or that wait_for
                    # dropped (Python 3.11), must still end the loop: the stop waits on it.
                    raise asyncio.CancelledError
                try:
                    if registered and broker.shares.lapses != lapses:
                        registered = False  # lapsed: the shares come back with a registration
                    if not registered and broker.shares.may_register():
                        sent, lapses = time.monotonic(), broker.shares.lapses
                        resp = await controllers.request(session, "POST", "/brokers", json=me)
                        registered = resp.status == 200
                        if not registered:
                            log.warning("controller refused registration: %s", resp.text())
                        elif broker.shares.lapses != lapses:
                            registered = False  # lapsed meanwhile: its answer may be stale
                        else:
                            lease_s = apply_registration(broker, sent, resp.json())
                    if registered:
                        path = f"/brokers/{me['id']}/report"
                        sent = time.monotonic()
                        doc = report_document(broker, meter)
                        resp = await controllers.request(session, "POST", path, json=doc)
                        registered = resp.status != 404  # the controller forgot us
                        if resp.status == 200 and lease_s is not None:
                            broker.shares.renew_lease(sent, lease_s)
                        if resp.status not in (200, 404) and resp.status != refused:
                            log.warning("controller refused a report: %s", resp.text())
                        refused = 0 if resp.status == 200 else resp.status
                except (aiohttp.ClientError, TimeoutError, ControllerUnreachable):
                    pass  # no controller answers: try again next interval
                except Exception:  # never let one bad report end reporting for good
                    log.exception("reporting to the controller failed")
                await next_report(broker, interval_s)

        except asyncio.CancelledError:
            # Stopping cleanly: the controller drops this broker at once, so nobody is
            # sent here for the seconds it would take to notice the silence.
            await deregister(session, controllers, f"/brokers/{me['id']}")
            raise


async def next_report(broker: Broker, interval_s: float) -> None:
    """Wait ``interval_s``, or less when a topic or channel appears or goes: nsqd tells
    nsqlookupd at once, and a go-nsq consumer that finds no producer asks again only after
    its lookupd poll interval (a minute). At most one report per ``MIN_REPORT_GAP_S``
    even so: a burst of new topics must not become a stream of reports."""
    gap = min(MIN_REPORT_GAP_S, interval_s)
    await asyncio.sleep(gap)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(interval_s - gap):  # never drops a cancel, unlike wait_for
            await broker.names_changed.wait()
    broker.names_changed.clear()


async def deregister(session: aiohttp.ClientSession, controllers: Controllers, path: str) -> None:
    """``DELETE /brokers/{id}`` at the leader, briefly: controllers away must not hold up
    the stop (a second in all)."""
    try:
        async with asyncio.timeout(1.0):
            resp = await controllers.request(session, "DELETE", path, timeout_s=0.5)
        if resp.status not in (200, 404):
            log.warning("controller refused deregistration: %s", resp.text())
    except (aiohttp.ClientError, TimeoutError, ControllerUnreachable):
        pass


def apply_registration(broker: Broker, sent: float, answer: Any) -> float | None:
    """Apply a registration answer (the request sent at ``sent``, monotonic s): the lease,
    then the shares and holds it lists. Returns the lease (None: the controller gives
    none, and the broker shapes by what it is pushed, as before leases)."""
    broker.relay.registered()  # the controller's routes replace those read back at start
    if not broker.shares.watched_by(
        answer.get("live_prefix") if isinstance(answer, dict) else None
    ):
        return None  # with etcd, and a controller that does not watch the key: held
    lease = answer.get("lease_s") if isinstance(answer, dict) else None
    if not isinstance(lease, int | float) or isinstance(lease, bool) or not lease > 0:
        broker.shares.renew_lease(sent, float("inf"))
        return None
    broker.shares.renew_lease(sent, float(lease))
    buckets = answer.get("buckets") or {}
    shares = {
        name: (float(b["rate"]), float(b["burst"]))
        for name, b in buckets.items()
        if isinstance(b, dict) and "rate" in b and "burst" in b
    }
    held = [n for n in answer.get("held") or [] if isinstance(n, str)]
    bounds: dict[str, Bound] = {}
    for name, b in buckets.items():
        if name in shares and ("max_wait_ms" in b or "overflow" in b):
            try:
                bounds[name] = check_bound(b.get("max_wait_ms"), b.get("overflow"))
            except ValueError as exc:
                log.error("topic %s: bound from the controller refused: %s", name, exc)
    broker.shares.apply(shares, held, bounds, sent, answer_order(answer.get("order")))
    return float(lease)


def answer_order(value: Any) -> tuple[int, int] | None:
    """A registration answer's ``order``, ``[epoch, number]`` (None: absent or not two
    whole numbers, as from a controller that numbers nothing)."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return value[0], value[1]
    return None
