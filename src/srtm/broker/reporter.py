"""Registers the broker with a controller and reports its load and per-topic TB Adaptor
window every second (registering again whenever the controller does not know it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from srtm.broker.broker import Broker

log = logging.getLogger("srtm.broker")


def report_document(broker: Broker) -> dict[str, Any]:
    now = time.time_ns()
    topics = {}
    load = 0.0
    for name in list(broker.topics):
        w = broker.stats.topic(name).window
        rate = w.average_rate(now)
        load += w.rate_1s(now)
        topics[name] = {"rate": rate, "backlog": w.max_backlog(now)}
    return {"load": load, "topics": topics}


async def report_loop(broker: Broker, controller: str, mcap: float, interval_s: float) -> None:
    assert broker.tcp_address is not None and broker.http_address is not None
    me = {
        "id": str(broker.options.broker_id),
        "tcp_address": "{}:{}".format(*broker.tcp_address),
        "http_address": "{}:{}".format(*broker.http_address),
        "mcap": mcap,
    }
    base = controller.rstrip("/")
    registered = False
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if not registered:
                    async with session.post(f"{base}/brokers", json=me) as resp:
                        registered = resp.status == 200
                        if not registered:
                            log.warning("controller refused registration: %s", await resp.text())
                if registered:
                    url = f"{base}/brokers/{me['id']}/report"
                    async with session.post(url, json=report_document(broker)) as resp:
                        registered = resp.status != 404  # the controller forgot us
            await asyncio.sleep(interval_s)
