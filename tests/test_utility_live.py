"""The utility optimizer and rate control on a live cluster: an in-process controller with
short intervals and two in-process brokers reporting to it. A topic with a utility spec
gets its bucket rate and its admitted consumers per class from the controller (on both
brokers), and a broker reporting its CPU congested makes rate control lower the rate."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from srtm.broker import Broker, BrokerOptions
from srtm.broker.http import serve_http
from srtm.broker.reporter import ResourceMeter, report_document, report_loop
from srtm.client import Subscriber
from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from support import BrokerApi, call, eventually

SPEC: dict[str, Any] = {
    "kind": "one-to-many", "r_min": 10, "r_max": 200,
    "classes": [
        {"name": "gold", "available": 5, "utility": {"slope": 100}},
        {"name": "silver", "available": 1, "utility": {"slope": 1}},
    ],
}  # fmt: skip


async def test_reports_carry_resources_and_the_demand_of_refused_consumers(
    broker_api: BrokerApi,
) -> None:
    """A consumer refused by admission control counts in its class's demand while it is
    connected and retrying; the report tells the broker's resources."""
    broker, http = broker_api
    body = json.dumps({"classes": {"gold": 1}}).encode()
    status, _ = await call(http, "POST", "/srtm/admission?topic=d", body)
    assert status == 200
    assert broker.tcp_address is not None
    address = "{}:{}".format(*broker.tcp_address)
    first = Subscriber("d", "c", addresses=[address], consumer_class="gold")
    second = Subscriber("d", "c", addresses=[address], consumer_class="gold", retry_s=0.02)
    meter = ResourceMeter()
    try:
        await first.start()
        await second.start()
        await eventually(lambda: second.refused >= 1, "the second refused")
        broker.options = dataclasses.replace(broker.options, cpu_congested=1e6)
        doc = report_document(broker, meter)
        assert doc["topics"]["d"]["demand"] == {"gold": 2}
        resources = doc["resources"]
        assert resources["cpu"] >= 0 and resources["egress_bps"] > 0  # IDENTIFY's answers
        assert resources["congested"] == {"cpu": False, "network": False}
        broker.options = dataclasses.replace(broker.options, cpu_congested=-1.0, egress_max=-1)
        assert report_document(broker, meter)["resources"]["congested"] == {
            "cpu": True, "network": True,
        }  # fmt: skip
        await second.close()
        await eventually(
            lambda: report_document(broker)["topics"]["d"].get("demand"),
            "the refused consumer gone from the demand",
            until=lambda d: d == {"gold": 1},
        )
    finally:
        await first.close()
        await second.close()


@pytest.mark.slow
async def test_the_controller_sets_rates_and_admission_and_congestion_lowers_them(
    tmp_path: Path,
) -> None:
    service = ControllerService(
        ControllerOptions(
            http_port=0, db=tmp_path / "c.db", tick_s=0.2, utility_interval_s=1.0,
            rate_control_interval_s=0.1,
        )
    )  # fmt: skip
    await service.start()
    assert service.http_address is not None
    url = f"http://127.0.0.1:{service.http_address[1]}"
    brokers: list[Broker] = []
    cleanup: list[Any] = []
    tasks: list[asyncio.Task[None]] = []
    subs: list[Subscriber] = []
    try:
        for i in (1, 2):
            opts = BrokerOptions(
                tcp_port=0, http_port=0, data_dir=tmp_path / f"b{i}", broker_id=i,
                controller=url, report_interval_s=0.1, cpu_congested=1e6,
            )  # fmt: skip
            b = Broker(opts)
            await b.start()
            runner, _ = await serve_http(b)
            brokers.append(b)
            cleanup.append(runner)
            tasks.append(asyncio.create_task(report_loop(b, url, 1000.0, 0.1)))
        await eventually(lambda: len(service.ctrl.up()), "2 brokers up", until=lambda n: n == 2)
        topic = {
            "name": "u", "slo_p99_ms": 50, "burst": 20, "rate": 22, "policy": "lb",
            "publishers": [{"id": "p1", "rate": 10}, {"id": "p2", "rate": 10}],
            "utility": SPEC,
        }  # fmt: skip
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/topics", json=topic) as r:
                assert r.status == 201, await r.text()
                assert (await r.json())["utility"] == SPEC
            # Two gold consumers and two silver ones ask; the spec has room for one silver.
            for klass in ("gold", "gold", "silver", "silver"):
                sub = Subscriber("u", "c", controller=url, refresh_s=0.2, consumer_class=klass)
                await sub.start()
                subs.append(sub)

            async def run() -> dict[str, Any]:
                async with http.get(f"{url}/utility") as r:
                    doc: dict[str, Any] = await r.json()
                    return doc

            def placed(doc: dict[str, Any]) -> bool:
                flows = doc["flows"]
                return bool(flows) and flows[0]["admitted"] == {"gold": 2, "silver": 1}

            doc = await eventually(run, "a run admitting 2 gold, 1 silver", until=placed)
            rate = doc["flows"][0]["rate"]
            assert rate == pytest.approx(200)  # the capacity is ample: r_max

            def enforced() -> bool:
                buckets = [b.topics["u"].bucket for b in brokers if "u" in b.topics]
                total = math.fsum(x.rate for x in buckets if x is not None)
                counts = [b.admission.get("u") for b in brokers]
                return math.isclose(total, rate, rel_tol=1e-6) and all(
                    a is not None and a.admitted == {"gold": 2, "silver": 1} for a in counts
                )

            await eventually(enforced, "brokers' buckets sum to the rate, counts set")
            async with http.get(f"{url}/topics/u") as r:
                status = await r.json()
            assert status["allocation"]["admitted"] == {"gold": 2, "silver": 1}

            # Broker 1's CPU over its threshold: rate control lowers the rate.
            b1 = brokers[0]
            b1.options = dataclasses.replace(b1.options, cpu_congested=0.0)
            await eventually(
                lambda: service.ctrl.topics["u"].spec.rate,
                "rate control lowering the rate",
                until=lambda r: r < 0.999 * rate,
            )
    finally:
        for sub in subs:
            await sub.close()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for runner in cleanup:
            await runner.cleanup()
        for b in brokers:
            await b.stop()
        await service.stop()
