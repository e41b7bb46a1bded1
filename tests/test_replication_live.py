"""ALL_PUBLISHERS replication decided by the rebalancer itself, live: an in-process
controller with ``--rebalance`` and a low ``--egress-max``, three broker processes. A topic
whose channels would take one broker past its egress is replicated onto all three; while
replicated every message reaches every channel exactly once, from the channel's home; then
a replica is SIGKILLed, the failover re-homes its channels on the two left, and what its
clients need survives the way the design says it does.

What the design promises for a SIGKILLed broker (docs/broker.md, "Graceful stop and
restart"; docs/architecture.md, "Plans, migration, failover"): what it held only in
memory is lost, and nothing else. So the kill comes once every message is delivered (the
replica holds nothing then), and the test asserts what follows from that: no message
delivered before the kill comes again or goes missing; every message acknowledged after
it reaches every channel, both while the controller has not noticed yet (the primary
cannot copy to the dead replica and keeps its channels' copies itself) and after the
failover re-homed the dead replica's channels. Nothing in it is timed: every wait is on
a condition, with patience for a loaded machine.
"""

from __future__ import annotations

import asyncio
import signal
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, new_token
from support import controlled_broker, eventually

pytestmark = pytest.mark.slow

CHANNELS = ("c0", "c1", "c2", "c3")
#: Declared msg/s of each of the two publishers. The rebalancer counts the topic's egress
#: as load x channels x 100 bytes: 100 x 4 x 100 = 40,000 B/s, 2.4 times the 16,800 one
#: broker may carry (target 0.6 x --egress-max 28,000): three replicas (clear of the
#: boundaries: 40,000 / 2 left is still over 16,800, so none is ever taken away).
DECLARED = 50.0
EGRESS_MAX = 28_000.0
#: What the test really publishes (msg/s, both publishers together): far below the
#: declared rate, so that measured egress never makes a broker look overloaded.
PACE = 20.0
PER_PHASE = 40

Key = tuple[str, int]
#: One delivery: the message's (publisher, seq) and the broker that delivered it.
Delivery = tuple[Key, str]


async def publish(pubs: list[Publisher], n: int) -> list[Key]:
    """``n`` messages, alternately from each publisher, at PACE on an absolute schedule;
    returns their (publisher, seq) once every one is acknowledged."""
    sent: list[Key] = []
    acks = []
    start = time.monotonic()
    for k in range(n):
        delay = start + k / PACE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the load's schedule, not a wait for an event
        pub = pubs[k % len(pubs)]
        sent.append((pub.id, pub.seq))
        acks.append(await pub.publish())
    await asyncio.gather(*acks)  # a refusal or a lost message fails the test here
    return sent


async def test_the_rebalancer_replicates_and_a_killed_replica_loses_nothing_acked(
    tmp_path: Path,
) -> None:
    token = new_token()
    # broker_timeout_s 15: a broker a loaded machine keeps from reporting for a while is
    # not failed over by mistake; the kill is noticed that much later, which costs only
    # time. max_brokers 1: nothing is spawned (the three brokers are the test's own; after
    # the kill the rebalancer would like a third replica again and finds no broker).
    opts = ControllerOptions(
        db=tmp_path / "c.db", http_port=0, tick_s=0.2, token=token, broker_timeout_s=15.0,
        rebalance=True, rebalance_interval_s=0.3, rebalance_window_s=1.0,
        min_plan_interval_s=1.0, min_brokers=1, max_brokers=1, egress_max=EGRESS_MAX,
        utility_interval_s=0,
    )  # fmt: skip
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None and service.elastic is not None
    url = "http://{}:{}".format(*service.http_address)
    ctrl = service.ctrl
    brokers: dict[str, BrokerProcess] = {}
    got: dict[str, list[Delivery]] = {c: [] for c in CHANNELS}

    def on(channel: str) -> Callable[[Received], None]:
        def record(r: Received) -> None:
            assert r.header is not None
            got[channel].append(((r.header.publisher, r.header.seq), r.broker))

        return record

    def keys(channel: str) -> list[Key]:
        return [k for k, _ in got[channel]]

    subs = [Subscriber("hot", c, controller=url, on_message=on(c), refresh_s=0.2) for c in CHANNELS]
    pubs: list[Publisher] = []
    try:
        for i in (1, 2, 3):
            brokers[str(i)] = await asyncio.to_thread(
                controlled_broker, tmp_path, i, url, token, 1000
            )
        await eventually(lambda: len(ctrl.up()) == 3, "the brokers registered")
        addresses = {b: p.tcp_address for b, p in brokers.items()}
        doc: dict[str, Any] = {
            "name": "hot", "slo_p99_ms": 1000, "burst": 50,
            "publishers": [{"id": f"p{i}", "rate": DECLARED} for i in range(2)],
        }  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.post(url + "/topics", json=doc) as r,
        ):
            assert r.status == 201, await r.text()
            (primary,) = [b["id"] for b in (await r.json())["brokers"]]
        topic = ctrl.topics["hot"]
        assert topic.routing.replicas == []  # no channel yet: one broker is enough

        async def routed(on: list[str], homes: dict[str, str]) -> bool:
            """Each of ``on`` has the route with ``homes`` and the others of ``on`` as its
            peers."""
            for b in on:
                try:
                    route = await asyncio.to_thread(brokers[b].json, "/srtm/route?topic=hot")
                except OSError:  # 404 until it is pushed
                    return False
                reps = route["replicas"]
                if reps is None or reps["homes"] != homes or set(reps["peers"]) != set(on) - {b}:
                    return False
            return True

        async def counters() -> dict[str, Any]:
            route = await asyncio.to_thread(brokers[primary].json, "/srtm/route?topic=hot")
            return dict(route["counters"], peers=sorted(route["replicas"]["peers"]))

        # -- the rebalancer replicates, once the four channels are known -------------------
        for s in subs:
            await s.start()
        await eventually(
            lambda: list(topic.routing.replicas), "the rebalancer replicated the topic",
            until=lambda reps: len(reps) == 3, timeout=60,
        )  # fmt: skip
        replicas = list(topic.routing.replicas)
        assert replicas[0] == primary
        events = [e.split(" ", 1)[1] for e in service.elastic.events]
        assert f"replicate hot: {replicas}" in events, events  # the rebalancer, no operator
        homes = dict(topic.routing.homes)
        assert set(homes) == set(CHANNELS), homes
        await eventually(lambda: routed(replicas, homes), "the route on every replica", timeout=30)
        await eventually(
            lambda: all(set(s.brokers) >= set(addresses.values()) for s in subs),
            "every subscriber on every replica", timeout=30,
        )  # fmt: skip
        pubs = [Publisher("hot", f"p{i}", controller=url) for i in range(2)]
        for p in pubs:
            await p.start()
        assert all(p.address == addresses[primary] for p in pubs)

        # -- replicated: every message exactly once per channel, from its home -----------
        first = await publish(pubs, PER_PHASE)
        await eventually(
            lambda: all(set(keys(c)) >= set(first) for c in CHANNELS),
            "every channel got the first messages", timeout=30,
        )  # fmt: skip
        before_kill = await counters()
        # Each message relayed once to each peer and no copy fell back: only a link answer
        # slower than 5 s (a stalled replica) makes a fallback, and then the design allows
        # a second copy (at least once). Exactly once is asserted where none happened.
        assert before_kill["relayed"] + before_kill["fallback_local"] == 2 * PER_PHASE
        clean_first = before_kill["fallback_local"] == 0
        if clean_first:
            for c in CHANNELS:
                assert {b for _, b in got[c]} == {addresses[homes[c]]}, (c, got[c], homes)
        else:
            warnings.warn(f"the relay fell back in the first phase: {before_kill}", stacklevel=1)
        delivered = {c: list(got[c]) for c in CHANNELS}

        # -- a replica SIGKILLed: nothing is waiting on it, so nothing is lost -----------
        count = Counter(homes.values())
        victim = max(replicas[1:], key=lambda b: (count[b], b))
        other = next(b for b in replicas[1:] if b != victim)
        killed = [c for c in CHANNELS if homes[c] == victim]
        assert killed, homes  # the kill takes channels' home away
        brokers[victim].proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(brokers[victim].proc.wait)
        # Published before the controller notices (15 s): the primary cannot copy to
        # the victim and keeps the copies for its channels, which their subscribers
        # (connected to every replica) find there.
        second = await publish(pubs, PER_PHASE)
        during = await counters()
        if victim in during["peers"]:  # not failed over yet (all but a very slow machine)
            new = {k: during[k] - before_kill[k] for k in ("relayed", "fallback_local")}
            assert new["relayed"] + new["fallback_local"] == 2 * PER_PHASE, new
            assert new["fallback_local"] >= PER_PHASE, new  # the victim took none

        # -- the failover: the victim's channels homed on the two replicas left ----------
        def failed_over() -> bool:
            return ctrl.brokers[victim].down and topic.routing.replicas == [primary, other]

        await eventually(failed_over, "the controller failed the victim over", timeout=60)
        rehomed = dict(topic.routing.homes)
        assert set(rehomed) == set(CHANNELS) and set(rehomed.values()) <= {primary, other}
        assert all(rehomed[c] == homes[c] for c in CHANNELS if c not in killed)  # stable
        survivors = [primary, other]
        await eventually(lambda: routed(survivors, rehomed), "the new homes pushed", timeout=30)
        before_third = await counters()
        third = await publish(pubs, PER_PHASE)
        after = set(second) | set(third)
        await eventually(
            lambda: all(set(keys(c)) >= after for c in CHANNELS),
            "every channel got what was published after the kill", timeout=60,
        )  # fmt: skip
        after_third = await counters()
    finally:
        for p in pubs:
            await p.close()
        for s in subs:
            await s.close()
        await service.stop()
        for b in brokers.values():
            if b.proc.poll() is None:
                b.stop()
    for c in CHANNELS:
        assert got[c][: len(delivered[c])] == delivered[c]
        count = Counter(keys(c))
        # Nothing but what was published; everything acknowledged, in every channel.
        assert set(count) == set(first) | after, c
        # While replicated, exactly once per channel; what was delivered before the kill
        # is not delivered again after it.
        if clean_first:
            assert all(count[k] == 1 for k in first), (c, count)
    # Re-homed and replicated again: the third messages exactly once, from the new homes.
    if after_third["fallback_local"] == before_third["fallback_local"]:
        for c in CHANNELS:
            count = Counter(keys(c))
            assert all(count[k] == 1 for k in third), (c, count)
            fresh = {b for k, b in got[c] if k in set(third)}
            assert fresh == {addresses[rehomed[c]]}, (c, fresh, rehomed)
    else:
        warnings.warn(f"the relay fell back in the third phase: {after_third}", stacklevel=1)
    for b in brokers.values():
        assert b.proc.poll() is not None
