"""A live move handed over (docs/controller.md, "Push order"): a controller (in process)
and two broker processes; a topic moved whole from the broker that shapes it to one that
holds it. The controller's own push of the destination's share is held back: the share
still arrives, by the source's HANDOFF on its relay link, so what the source forwards
is not held there until that push. Meanwhile no poll of the brokers' live sub-buckets
sums over the topic's (r, b), and every message published is acknowledged and delivered."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.control.actions import Hold, SetBucket
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, new_token
from support import controlled_broker, eventually
from test_no_holes import poll_sums

pytestmark = pytest.mark.slow

RATE, BURST = 1_000.0, 40.0
PUBLISHERS = [f"p{i}" for i in range(4)]


def share(b: BrokerProcess, topic: str) -> tuple[float, float] | str | None:
    """The topic's live sub-bucket on ``b``, "held", or None."""
    for t in b.stats(topic)["srtm"]["topics"]:
        if t["topic"] == topic:
            if t["bucket"] is not None:
                return t["bucket"]["rate"], t["bucket"]["burst"]
            return "held" if t["held"] else None
    return None


async def test_a_move_to_a_broker_that_held_the_topic_is_handed_over(tmp_path: Path) -> None:
    token = new_token()
    service = ControllerService(
        ControllerOptions(
            http_port=0, db=tmp_path / "c.db", token=token, broker_timeout_s=15.0,
            tick_s=0.2, adapt_settle_s=600.0, forward_grace_s=30.0,
        )
    )  # fmt: skip
    await service.start()
    assert service.http_address is not None
    url = f"http://127.0.0.1:{service.http_address[1]}"
    brokers: dict[str, BrokerProcess] = {}
    stop = asyncio.Event()
    try:
        for i in ("1", "2"):
            brokers[i] = await asyncio.to_thread(
                controlled_broker, tmp_path, int(i), url, token, 5000
            )
        await eventually(lambda: len(service.ctrl.up()), "2 brokers up", until=lambda n: n == 2)
        http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
        doc = {"name": "ho", "slo_p99_ms": 50.0, "burst": BURST, "rate": RATE, "policy": "lb",
               "publishers": [{"id": p, "rate": 100} for p in PUBLISHERS]}  # fmt: skip
        async with http.post(f"{url}/topics", json=doc) as r:
            assert r.status == 201, await r.text()

        async def move(to: str) -> None:
            async with http.post(
                f"{url}/topics/ho/move", json={"publishers": PUBLISHERS, "to": to}
            ) as r:
                assert r.status == 200, await r.text()

        def placed(b: BrokerProcess) -> tuple[Any, ...]:
            return share(b, "ho"), share(brokers["1" if b is brokers["2"] else "2"], "ho")

        await move("1")
        await eventually(lambda: asyncio.to_thread(placed, brokers["1"]), "all on 1, held on 2",
                         until=lambda s: isinstance(s[0], tuple) and s[1] == "held")  # fmt: skip

        # The controller's pushes of broker 2's share wait until released: broker 2 can
        # only get it from broker 1's handoff meanwhile.
        gate = asyncio.Event()
        waiting: list[SetBucket] = []
        push = service.pusher._push_share

        async def held_back(action: SetBucket | Hold, *args: Any) -> bool:
            if isinstance(action, SetBucket) and action.broker == "2" and not gate.is_set():
                waiting.append(action)
                await gate.wait()
            return await push(action, *args)

        service.pusher._push_share = held_back  # type: ignore[method-assign,assignment]

        got: Counter[tuple[str, int]] = Counter()

        def record(m: Received) -> None:
            assert m.header is not None
            got[(m.header.publisher, m.header.seq)] += 1

        sub = Subscriber("ho", "all", controller=url, on_message=record, refresh_s=0.2)
        await sub.start()
        pubs = [Publisher("ho", p, controller=url, max_pending=100) for p in PUBLISHERS]
        for p in pubs:
            await p.start()
        acks: dict[tuple[str, int], asyncio.Future[None]] = {}
        sums: list[tuple[float, float]] = []
        poller = asyncio.create_task(poll_sums(list(brokers.values()), "ho", sums, stop))
        done = asyncio.Event()

        async def traffic() -> None:
            while not done.is_set():
                for p in pubs:
                    ack = await p.publish()
                    acks[(p.id, p.seq - 1)] = ack
                await asyncio.sleep(0.01)  # the load's pace, not a wait for an event

        load = asyncio.create_task(traffic())
        await eventually(lambda: len(got), "traffic flowing", until=lambda n: n > 20)
        await move("2")

        def dest_now() -> bool:
            """Broker 2 shapes with a share the controller has not been let push."""
            have = share(brokers["2"], "ho")
            return any(have == (a.bucket.rate, a.bucket.burst) for a in list(waiting))

        await eventually(lambda: asyncio.to_thread(dest_now), "broker 2 shapes by the handoff")
        assert waiting and not gate.is_set()  # the controller's own push is still held back
        gate.set()
        await eventually(lambda: not service._busy, "the change carried out")
        before = len(got)
        await eventually(lambda: len(got), "traffic on 2", until=lambda n: n > before + 20)
        done.set()
        await load
        for p in pubs:
            await p.close()
        published = {(p.id, s) for p in pubs for s in range(p.seq)}
        acked = {k for k, f in acks.items() if f.done() and not f.cancelled() and not f.exception()}
        with contextlib.suppress(AssertionError):  # told below
            await eventually(lambda: set(got) >= published, "all delivered", timeout=20)
        stop.set()
        await poller
        await sub.close()
        await http.close()
        over = [(r, b) for r, b in sums if r > RATE * (1 + 1e-9) or b > BURST * (1 + 1e-9)]
        result = {"polls": len(sums), "over": len(over), "published": len(published),
                  "acknowledged": len(acked), "delivered": len(set(got) & published)}  # fmt: skip
        assert len(sums) > 5 and not over, result
        assert acked == published and result["delivered"] == len(published), result
    finally:
        stop.set()
        await service.stop()
        for b in brokers.values():
            if b.alive():
                await asyncio.to_thread(b.stop)
