"""--rebalance live: a controller with the local provisioner spawns a broker when one is
overloaded, moves load onto it while publishers publish, and gives it back when load
falls; every acknowledged message is delivered and no broker process is left."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from srtm.client import Publisher, Received, Subscriber
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import BrokerProcess, new_token, start_broker
from support import eventually

pytestmark = pytest.mark.slow

RATE = 20.0  # each publisher's declared and offered msg/s


def loop_state(service: ControllerService) -> str:
    """What a failed wait should show: the loop's events and what each broker carries."""
    ctrl, el = service.ctrl, service.elastic
    assert el is not None
    t = ctrl.topics["hot"]
    lines = [f"elastic: {el.to_json()}", f"assignment: {t.assignment}",
             f"buckets: {t.buckets}", f"draining: {t.draining}"]  # fmt: skip
    now = time.monotonic()
    lines += [f"broker {b.id}: down={b.down} load={b.load} usage={b.usage()} "
              f"waiting={b.waiting} window={el.averager.window(b.id, b.mcap, now)}"
              for b in ctrl.brokers.values()]  # fmt: skip
    return "\n".join(lines)


async def publish(pub: Publisher, stop: asyncio.Event, acked: set[tuple[str, int]]) -> None:
    """Publish at RATE on an absolute schedule until ``stop``; record what is acknowledged."""
    start = time.monotonic()
    k = 0
    while not stop.is_set():
        delay = start + k / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # the load's schedule, not a wait for an event
        seq = pub.seq
        ack = await pub.publish()
        ack.add_done_callback(
            lambda f, s=seq: acked.add((pub.id, s)) if not f.exception() else None
        )
        k += 1


async def test_spawn_on_overload_and_despawn_when_load_falls(tmp_path: Path) -> None:
    token = new_token()
    # broker_timeout_s 15: a seed that misses its reports for longer (a loaded CI machine)
    # is failed over, the whole topic re-placed on 1001; that is failover, not this test.
    opts = ControllerOptions(
        db=tmp_path / "c.db", http_port=0, tick_s=0.2, token=token, rebalance=True,
        rebalance_interval_s=0.3, rebalance_window_s=0.6, min_plan_interval_s=1.0,
        min_brokers=1, max_brokers=3, spawn_mcap=100.0, broker_timeout_s=15.0,
    )  # fmt: skip
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None and service.elastic is not None
    el = service.elastic
    url = "http://{}:{}".format(*service.http_address)
    seed = await asyncio.to_thread(
        start_broker, tmp_path / "seed", ["--broker-id", "1", "--controller", url,
        "--mcap", "100", "--report-interval-s", "0.2"], token=token,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    got: list[tuple[str, int]] = []

    def record(r: Received) -> None:
        assert r.header is not None
        got.append((r.header.publisher, r.header.seq))

    acked: set[tuple[str, int]] = set()
    sub = Subscriber("hot", "all", controller=url, on_message=record, refresh_s=0.2)
    pubs: dict[str, Publisher] = {}
    stops: dict[str, asyncio.Event] = {}
    tasks: dict[str, asyncio.Task[None]] = {}
    spawned: BrokerProcess | None = None
    try:
        ctrl = service.ctrl
        await eventually(lambda: "1" in ctrl.brokers, "the seed registered")
        # 4 x 20 msg/s declared, r = 88 of mcap 100: LR 0.88 > 0.80, nowhere to go
        ids = [f"p{i}" for i in range(4)]
        doc = {"name": "hot", "slo_p99_ms": 100, "burst": 50,
               "publishers": [{"id": p, "rate": RATE, "group": f"g{i % 2}"}
                              for i, p in enumerate(ids)]}  # fmt: skip
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(url + "/topics", json=doc) as r:
                assert r.status in (200, 201), await r.text()
            await sub.start()
            for i, p in enumerate(ids):
                pubs[p] = Publisher("hot", p, controller=url, group=f"g{i % 2}", rate=RATE)
                await pubs[p].start()
                stops[p] = asyncio.Event()
                tasks[p] = asyncio.create_task(publish(pubs[p], stops[p], acked))

            def on_new() -> list[str]:
                return list(ctrl.topics["hot"].assignment.get("1001", []))

            moved = await eventually(on_new, "a broker spawned and publishers moved onto it",
                                     timeout=60)  # fmt: skip
            new_addr = ctrl.brokers["1001"].tcp_address
            await eventually(
                lambda: all(pubs[p].address == new_addr for p in moved),
                "the moved publishers followed their migration orders",
                timeout=30,
            )
            assert len(ctrl.up()) == 2  # one spawn was enough
            assert ctrl.topics["hot"].assignment.get("1"), "a slice moved, not the topic"
            assert service.provisioner is not None
            spawned = service.provisioner.children["1001"]  # type: ignore[attr-defined]
            await eventually(lambda: sub.brokers, "subscribed to both", until=lambda b: len(b) == 2)
            # Load falls: one publisher on each broker leaves (r 44: LR 0.22 on each), so
            # 1001 is despawned and its publisher moved back while it publishes.
            stay = ctrl.topics["hot"].assignment["1"]
            leaving = [moved[0], stay[0]]
            for p in leaving:
                stops[p].set()
                await tasks.pop(p)
                await pubs[p].close()
                async with http.delete(f"{url}/topics/hot/publishers/{p}") as r:
                    assert r.status == 200, await r.text()
            try:
                await eventually(
                    lambda: el.despawned == 1 and len(ctrl.up()) == 1,
                    "back to one broker",
                    timeout=120,
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{loop_state(service)}") from None
            assert [b.id for b in ctrl.up()] == ["1"]
            seed_addr = ctrl.brokers["1"].tcp_address
            assert all(pubs[p].address == seed_addr for p in tasks)
            mark = {p: pubs[p].seq for p in tasks}
            await eventually(
                lambda: all(pubs[p].seq >= mark[p] + 10 for p in tasks), "still publishing"
            )
        for p, task in tasks.items():
            stops[p].set()
            await task
            await pubs[p].close()
        await eventually(
            lambda: set(got) >= acked, "every acknowledged message delivered", timeout=30
        )
    finally:
        for task in tasks.values():
            task.cancel()
        await sub.close()
        for pub in pubs.values():
            await pub.close()
        await service.stop()
        seed.stop()
    published = {(p, s) for p, pub in pubs.items() for s in range(pub.seq)}
    assert acked == published, f"{len(published - acked)} not acknowledged"
    assert set(got) == published
    dups = sum(n - 1 for n in Counter(got).values())
    assert dups == 0, f"{dups} duplicates"
    assert {p: pubs[p].migrations for p in moved} == dict.fromkeys(moved, 1) | {
        p: 2 for p in moved if p not in leaving
    }
    assert spawned is not None and not spawned.alive()
    assert service.provisioner is not None and not service.provisioner.can_stop("1001")
    assert not seed.alive()
