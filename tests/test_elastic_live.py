"""--rebalance live: a controller with the local provisioner spawns a broker when one is
overloaded, moves load onto it, and gives it back when the load is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import new_token, start_broker
from support import eventually

pytestmark = pytest.mark.slow


async def test_spawn_on_overload_and_despawn_when_idle(tmp_path: Path) -> None:
    token = new_token()
    opts = ControllerOptions(
        db=tmp_path / "c.db", http_port=0, tick_s=0.2, token=token, rebalance=True,
        rebalance_interval_s=0.3, rebalance_window_s=0.6, min_plan_interval_s=1.0,
        min_brokers=1, max_brokers=3, spawn_mcap=100.0, broker_timeout_s=5.0,
    )  # fmt: skip
    service = ControllerService(opts)
    await service.start()
    assert service.http_address is not None and service.elastic is not None
    url = "http://{}:{}".format(*service.http_address)
    seed = await asyncio.to_thread(
        start_broker, tmp_path / "seed", ["--broker-id", "1", "--controller", url,
        "--mcap", "100", "--report-interval-s", "0.2"], token=token,
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    try:
        ctrl = service.ctrl
        await eventually(lambda: "1" in ctrl.brokers, "the seed registered")
        # 4 x 20 msg/s declared, r = 88 of mcap 100: LR 0.88 > 0.80, nowhere to go
        pubs = [{"id": f"p{i}", "rate": 20, "group": f"g{i % 2}"} for i in range(4)]
        doc = {"name": "hot", "slo_p99_ms": 100, "burst": 50, "publishers": pubs}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(url + "/topics", json=doc) as r:
                assert r.status in (200, 201), await r.text()
            await eventually(
                lambda: ctrl.topics["hot"].assignment.get("1001"),
                "a broker spawned and publishers moved onto it",
                timeout=60,
            )
            assert len(ctrl.up()) == 2  # one spawn was enough
            async with http.delete(url + "/topics/hot") as r:
                assert r.status in (200, 201), await r.text()
            await eventually(
                lambda: service.elastic.despawned == 1 and len(ctrl.up()) == 1,  # type: ignore[union-attr]
                "back to one broker",
                timeout=60,
            )
            assert [b.id for b in ctrl.up()] == ["1"]
    finally:
        await service.stop()
        seed.stop()
    assert service.provisioner is not None and not service.provisioner.can_stop("1001")
