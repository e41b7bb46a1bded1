"""No holes in (r, b), end to end: a controller (in process) and three broker processes
with traffic; a task polls every broker's /stats as fast as it can and records, per poll,
the sum of the live sub-buckets' rates and bursts, through moves, TB Adaptor re-splits, a
broker stopped (failover) and restarted, publishers joining (POST /topics/NAME/publishers)
and one leaving (DELETE). Every sum stays within the topic's (r, b), and every message
published is acknowledged and delivered: a broker dropped from the plan drains what waits
for tokens there before it holds the topic, so nothing is left held at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.control import plans
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, new_token
from support import controlled_broker, eventually

RATE, BURST = 1_000.0, 40.0
N_PUBLISHERS = 6


async def poll_sums(
    brokers: list[BrokerProcess], topic: str, sums: list[tuple[float, float]], stop: asyncio.Event
) -> None:
    """Every broker's /stats, over and over: per pair of consecutive rounds, the sum over
    the brokers of the smaller of each one's two live sub-buckets of ``topic`` (a broker
    that does not answer counts as holding nothing).

    One round reads the brokers one after another, not at one instant: a decrease on one
    broker and the increase it makes room for on another can both fall between its reads,
    and the round would add the old share to the new. Every read of round k precedes every
    read of round k + 1, so at an instant T between the two rounds each broker held at
    least the smaller of its two reads (unless its share changed twice in that window): a
    sum of those over the topic's bucket is a real overlap at T, never an artefact."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:

        async def one(b: BrokerProcess) -> tuple[float, float]:
            try:
                async with s.get(b.url(f"/stats?format=json&topic={topic}")) as r:
                    doc = await r.json()
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return 0.0, 0.0
            rate = burst = 0.0
            for t in doc["srtm"]["topics"]:
                if t["topic"] == topic and t["bucket"] is not None:
                    rate, burst = t["bucket"]["rate"], t["bucket"]["burst"]
            return rate, burst

        last: list[tuple[float, float]] | None = None
        while not stop.is_set():
            parts = await asyncio.gather(*(one(b) for b in list(brokers)))
            if last is not None and len(last) == len(parts):
                low = [(min(a[0], b[0]), min(a[1], b[1])) for a, b in zip(last, parts, strict=True)]
                sums.append((math.fsum(p[0] for p in low), math.fsum(p[1] for p in low)))
            last = parts


@pytest.mark.slow
async def test_live_sub_buckets_never_exceed_the_topic_bucket(tmp_path: Path) -> None:
    await run_scenario(tmp_path, ordered=True)


async def test_a_stopping_broker_holds_before_the_controller_hears_it_go(tmp_path: Path) -> None:
    """The controller gives a deregistered broker's share away at once; that broker
    must not shape by it any more while its stop goes on (two live sub-buckets would
    then sum over the topic's bucket). Read at the moment the controller takes the
    deregistration, its share is already held."""
    token = new_token()
    opts = ControllerOptions(http_port=0, db=tmp_path / "c.db", token=token, tick_s=0.2)
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None
    url = f"http://127.0.0.1:{service.http_address[1]}"
    brokers = [
        await asyncio.to_thread(controlled_broker, tmp_path, i, url, token, 5000) for i in (1, 2)
    ]
    seen: list[dict[str, Any]] = []
    deregister = service.ctrl.deregister

    def deregister_seen(broker_id: str) -> Any:
        # Still serving HTTP: the broker awaits this answer before it stops.
        (topic,) = brokers[0].stats("nh")["srtm"]["topics"]
        seen.append(topic)
        return deregister(broker_id)

    service.ctrl.deregister = deregister_seen  # type: ignore[method-assign]
    try:
        await eventually(lambda: len(service.ctrl.up()), "2 brokers up", until=lambda n: n == 2)
        doc = {"name": "nh", "slo_p99_ms": 50.0, "burst": BURST, "rate": RATE, "policy": "lb",
               "publishers": [{"id": f"p{i}", "rate": 100} for i in range(4)]}  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.post(f"{url}/topics", json=doc) as r,
        ):
            assert r.status == 201, await r.text()

        def share() -> Any:
            with contextlib.suppress(OSError):  # the topic is not there before its push
                return brokers[0].json("/srtm/bucket?topic=nh")["bucket"]
            return None

        await eventually(share, "broker 1's share", until=lambda b: b is not None)
        await asyncio.to_thread(brokers[0].stop)
        assert len(seen) == 1, seen
        assert seen[0]["bucket"] is None and seen[0]["held"], seen
    finally:
        await service.stop()
        for b in brokers:
            if b.alive():
                await asyncio.to_thread(b.stop)


async def run_scenario(tmp_path: Path, ordered: bool, drain: bool = True) -> dict[str, Any]:
    """The scenario; asserted only when ``ordered`` and ``drain`` (the others show what
    the order and draining members prevent: see the result printed)."""
    token = new_token()
    service = ControllerService(
        ControllerOptions(
            http_port=0, db=tmp_path / "c.db", token=token, broker_timeout_s=2.0,
            tick_s=0.2, adapt_settle_s=0.5, hysteresis=0.01,
        )
    )  # fmt: skip
    service.pusher.ordered = ordered
    if not drain:  # a dropped broker holds at once, as before draining members
        plans.update_draining = lambda *_: None  # type: ignore[assignment]
        plans.drain = lambda *_: []  # type: ignore[assignment]
    await service.start()
    assert service.http_address is not None
    url = f"http://127.0.0.1:{service.http_address[1]}"
    headers = {"Authorization": f"Bearer {token}"}

    def broker(i: int) -> BrokerProcess:
        return controlled_broker(tmp_path, i, url, token, 5000)

    brokers = [await asyncio.to_thread(broker, i) for i in (1, 2, 3)]
    sums: list[tuple[float, float]] = []
    stop = asyncio.Event()
    got: Counter[tuple[str, int]] = Counter()
    try:
        await eventually(lambda: len(service.ctrl.up()), "3 brokers up", until=lambda n: n == 3)
        http = aiohttp.ClientSession(headers=headers)
        doc = {
            "name": "nh",
            "slo_p99_ms": 50.0,
            "burst": BURST,
            "rate": RATE,
            "policy": "lb",
            "publishers": [{"id": f"p{i}", "rate": 100 + 30 * i} for i in range(N_PUBLISHERS)],
        }
        async with http.post(f"{url}/topics", json=doc) as r:
            assert r.status == 201, await r.text()

        def record(m: Received) -> None:
            assert m.header is not None
            got[(m.header.publisher, m.header.seq)] += 1

        sub = Subscriber("nh", "all", controller=url, on_message=record, refresh_s=0.2)
        await sub.start()
        pubs = [Publisher("nh", f"p{i}", controller=url, max_pending=100)
                for i in range(N_PUBLISHERS)]  # fmt: skip
        for p in pubs:
            await p.start()
        active = list(pubs)  # those publishing now (joins add, a leave removes)
        acks: dict[tuple[str, int], asyncio.Future[None]] = {}
        poller = asyncio.create_task(poll_sums(brokers, "nh", sums, stop))
        running = asyncio.Event()

        async def send(p: Publisher) -> None:
            ack = await p.publish()
            acks[(p.id, p.seq - 1)] = ack

        async def traffic() -> None:
            while not running.is_set():
                for p in list(active):
                    await send(p)
                await asyncio.sleep(0.01)  # the load's pace, not a wait for an event

        load = asyncio.create_task(traffic())

        async def move(publishers: list[str], to: str) -> None:
            body = {"publishers": publishers, "to": to}
            async with http.post(f"{url}/topics/nh/move", json=body) as r:
                assert r.status == 200, await r.text()
            await asyncio.sleep(0.7)  # traffic under the new plan, adaptor re-splits

        def placed() -> dict[str, list[str]]:
            return {b: list(ps) for b, ps in service.ctrl.topics["nh"].assignment.items()}

        async def join(ids: list[str]) -> None:
            body = {"publishers": [{"id": i, "rate": 60} for i in ids]}
            async with http.post(f"{url}/topics/nh/publishers", json=body) as r:
                assert r.status == 200, await r.text()
            for i in ids:  # joined first, then publishing
                p = Publisher("nh", i, controller=url, max_pending=100)
                await p.start()
                pubs.append(p)
                active.append(p)

        async def leave(p: Publisher) -> None:
            active.remove(p)  # it stops, then leaves the topic
            await p.flush()
            async with http.delete(f"{url}/topics/nh/publishers/{p.id}") as r:
                assert r.status == 200, await r.text()

        for step in range(4):
            plan = placed()
            src = sorted(plan)[0]
            dst = next(b for b in (*("3", "2", "1")[step % 3 :], "3", "2", "1") if b != src)
            await move(plan[src][: 1 + step % 2], dst)
            await join([f"j{step}"] if step % 2 else [f"j{step}", f"j{step}b"])
            if step == 2:
                await leave(pubs[N_PUBLISHERS - 1])
        victim = brokers[0]
        await asyncio.to_thread(victim.stop)  # graceful: what it holds is on disk
        await eventually(lambda: "1" in placed(), "failover", until=lambda x: not x, timeout=20)
        brokers[0] = await asyncio.to_thread(broker, 1)
        await eventually(lambda: service.ctrl.brokers["1"].down, "back", until=lambda d: not d)
        await move([f"p{i}" for i in range(N_PUBLISHERS // 2)], "1")  # it gets a share again
        # A broker dropped right after a burst of its publishers, more than its share's
        # burst: messages wait for tokens there when it leaves the plan (it drains them).
        plan = placed()
        src = sorted(plan)[-1]
        burst = [p for p in active if p.id in plan[src]]
        for _ in range(40):
            for p in burst:
                await send(p)
        await move(plan[src], next(b for b in ("1", "2", "3") if b != src))
        running.set()
        await load
        for p in pubs:
            await p.close()
        published = {(p.id, s) for p in pubs for s in range(p.seq)}
        acked = {k for k, f in acks.items() if f.done() and not f.cancelled() and not f.exception()}

        async def held() -> int:
            n = 0
            for b in brokers:
                stats = await asyncio.to_thread(b.stats, "nh")
                n += sum(t["shaping_depth"] for t in stats["srtm"]["topics"] if t["held"])
            return n

        with contextlib.suppress(AssertionError):  # told below, with what is still held
            await eventually(lambda: set(got) >= published, "all delivered", timeout=15)
        stop.set()
        await poller
        await sub.close()
        await http.close()
        over = [(r, b) for r, b in sums if r > RATE * (1 + 1e-9) or b > BURST * (1 + 1e-9)]
        result = {
            "polls": len(sums),
            "over": len(over),
            "worst": max(sums, default=None),
            "published": len(published),
            "acknowledged": len(acked),
            "delivered": len(set(got) & published),
            "held": await held(),
            "joined": sum(1 for p in pubs if p.id.startswith("j")),
        }
        print(json.dumps(result))
        if ordered and drain:
            assert len(sums) > 20, result  # the poller ran throughout (~200 when idle)
            assert not over, result
            # Nothing lost, nothing stuck: every message published was acknowledged and
            # delivered; no broker dropped from the plan still holds any.
            assert acked == published, result
            assert result["delivered"] == len(published) and result["held"] == 0, result
        return result
    finally:
        stop.set()
        await service.stop()
        for b in brokers:
            if b.alive():
                await asyncio.to_thread(b.stop)
