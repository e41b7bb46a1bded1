"""An asyncio subscriber of every broker of a topic: it finds them through the controller's
nsqlookupd-style ``/lookup`` (again every ``refresh_s``, so it follows plan changes) or
takes fixed addresses, FINs each message and records end-to-end latency from the
measurement header in an HDR histogram; with ``trace_dir``, it writes subscriber-side
trace rows."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from hdrh.histogram import HdrHistogram

from srtm.client.connection import Connection
from srtm.client.traces import SubscriberTraces
from srtm.protocol import Fin, MessageFrame, Rdy, Sub, header


@dataclass(frozen=True, slots=True)
class Received:
    broker: str
    message: MessageFrame
    header: header.Header | None
    recv_ns: int


class Subscriber:
    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        controller: str | None = None,
        addresses: Sequence[str] = (),
        on_message: Callable[[Received], None] | None = None,
        max_in_flight: int = 500,
        refresh_s: float = 1.0,
        trace_dir: Path | None = None,
        run: str = "default",
    ) -> None:
        if controller is None and not addresses:
            raise ValueError("give a controller (URL) or broker addresses")
        self.topic, self.channel = topic, channel
        self.controller = controller.rstrip("/") if controller else None
        self.addresses = list(addresses)
        self.on_message = on_message
        self.max_in_flight = max_in_flight
        self.refresh_s = refresh_s
        #: End-to-end latency (send stamp in the header → receipt), ns.
        self.latency = HdrHistogram(1, 3_600_000_000_000, 3)
        self.received = 0
        self._conns: dict[str, Connection] = {}
        #: broker address -> its id (from IDENTIFY), for trace rows
        self._broker_ids: dict[str, str] = {}
        self.traces = None if trace_dir is None else SubscriberTraces(trace_dir, run)
        self._session: aiohttp.ClientSession | None = None
        self._refresh: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.controller:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
            await self.refresh()
            self._refresh = asyncio.create_task(self._refresh_loop())
        for address in self.addresses:
            await self._subscribe(address)

    async def refresh(self) -> None:
        """Subscribe to every broker the controller lists for the topic, not yet subscribed."""
        assert self._session is not None
        url = f"{self.controller}/lookup"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._session.get(url, params={"topic": self.topic}) as r:
                if r.status != 200:
                    return
                doc = await r.json()
            for p in doc.get("producers", []):
                address = f"{p['broadcast_address']}:{p['tcp_port']}"
                if address not in self._conns:
                    with contextlib.suppress(OSError):
                        await self._subscribe(address)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def _subscribe(self, address: str) -> None:
        conn = await Connection.open(
            address,
            on_message=lambda m: self._message(address, m),
            on_close=lambda c: self._conns.pop(address, None),
        )
        reply = await conn.identify(client_id=f"srtm-sub-{self.channel}", heartbeat_interval=5_000)
        self._broker_ids[address] = str(reply.get("srtm_broker_id", address))
        await conn.request(Sub(self.topic, self.channel))
        conn.send(Rdy(self.max_in_flight))
        self._conns[address] = conn

    def _message(self, address: str, msg: MessageFrame) -> None:
        now = time.time_ns()
        h = header.decode(msg.body)
        if h is not None:
            self.latency.record_value(max(1, now - h.send_ns))
            if self.traces is not None:
                self.traces.add(
                    self._broker_ids.get(address, address), self.topic, msg.id.decode(),
                    h.publisher, h.group, h.seq, h.send_ns, now,
                )  # fmt: skip
        self.received += 1
        conn = self._conns.get(address)
        if conn is not None:
            conn.send(Fin(msg.id))
        if self.on_message is not None:
            self.on_message(Received(address, msg, h, now))

    @property
    def brokers(self) -> list[str]:
        return sorted(self._conns)

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
        for conn in list(self._conns.values()):
            await conn.close()
        if self.traces is not None:
            await self.traces.close()
        if self._session is not None:
            await self._session.close()
