"""A silent broker whose address refuses connections is down at once (the controller
asks it ``GET /ping`` once it is silent for ``--probe-after-s``), not after
``--broker-timeout-s``: a killed broker's publishers move sooner. One that answers, even
without reporting, waits for the timeout as before. A fake broker (an HTTP app that
never reports) stands in for the process; closing it is the kill."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp import web

from srtm.control.options import ControllerOptions
from srtm.control.service import ControllerService
from srtm.launch import new_token
from support import eventually


async def test_a_silent_broker_is_down_once_its_address_refuses(tmp_path: Path) -> None:
    pings: list[str] = []

    async def ping(request: web.Request) -> web.Response:
        pings.append(request.path)
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    token = new_token()
    # A timeout no test waits for: only the probe can take the broker down here.
    options = ControllerOptions(
        http_port=0, db=tmp_path / "c.db", token=token, broker_timeout_s=3600.0,
        tick_s=0.05, probe_after_s=0.2,
    )  # fmt: skip
    service = ControllerService(options)
    await service.start()
    try:
        assert service.http_address is not None
        url = f"http://127.0.0.1:{service.http_address[1]}"
        doc = {"id": "b0", "tcp_address": "127.0.0.1:9", "http_address": f"127.0.0.1:{port}",
               "mcap": 1000}  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.post(f"{url}/brokers", json=doc) as r,
        ):
            assert r.status == 200, await r.text()
        # Silent but answering: asked, and still up.
        await eventually(lambda: len(pings), "probed twice", until=lambda n: n >= 2)
        assert not service.ctrl.brokers["b0"].down
        await runner.cleanup()  # nothing listens at its address any more
        await eventually(lambda: service.ctrl.brokers["b0"].down, "down by the probe")
    finally:
        await service.stop()
        await runner.cleanup()
