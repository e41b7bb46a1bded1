"""An asyncio publisher: plan-aware, pipelined, bounded, and it moves without losing a message.

It learns its broker from the controller (``/assign``) or takes a fixed address, and
IDENTIFYs with its SRTM fields so brokers can send it orders. PUBs are pipelined up to
``max_pending`` unanswered (then ``publish`` waits: backpressure). A migration order is
followed make-before-break: connect to the new broker, send everything new there, and
close the old connection only once all it carried is acknowledged. If a broker goes
away, the publisher asks again where to go (backing off) and resends what was not
acknowledged: nothing accepted by ``publish`` is lost (it may arrive twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import aiohttp

from srtm.client.connection import Connection
from srtm.protocol import Pub, header

log = logging.getLogger("srtm.client")


class Publisher:
    def __init__(
        self,
        topic: str,
        publisher_id: str,
        *,
        controller: str | None = None,
        address: str | None = None,
        group: str | None = None,
        rate: float | None = None,
        max_pending: int = 1_000,
        message_size: int = header.SIZE,
    ) -> None:
        if (controller is None) == (address is None):
            raise ValueError("give exactly one of controller (URL) or address (HOST:PORT)")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.topic, self.id, self.group, self.rate = topic, publisher_id, group, rate
        self.controller = controller.rstrip("/") if controller else None
        self.address = address
        self.message_size = message_size
        self.seq = 0
        self.migrations = 0
        self.reconnects = 0
        self._slots = asyncio.Semaphore(max_pending)
        self._conn: Connection | None = None
        #: Bodies sent on the current connection and not acknowledged yet, in order.
        self._unacked: deque[tuple[bytes, asyncio.Future[bytes]]] = deque()
        self._ready = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._moving: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        if self.controller:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        await self._connect(await self._where())

    async def _where(self) -> str:
        if self.controller is None:
            assert self.address is not None
            return self.address
        assert self._session is not None
        url = f"{self.controller}/assign"
        async with self._session.get(url, params={"topic": self.topic, "publisher": self.id}) as r:
            doc: dict[str, Any] = await r.json()
            if r.status != 200:
                raise ConnectionError(f"controller: {doc.get('message')}")
            return str(doc["tcp_address"])

    async def _open(self, address: str) -> Connection:
        conn = await Connection.open(address, on_order=self._on_order, on_close=self._lost)
        fields = {"srtm_publisher": self.id, "srtm_orders": True, "client_id": self.id,
                  "user_agent": "srtm-client/0.1"}  # fmt: skip
        if self.group:
            fields["srtm_group"] = self.group
        if self.rate:
            fields["srtm_rate"] = self.rate
        await conn.identify(**fields)
        return conn

    async def _connect(self, address: str) -> None:
        self._conn = await self._open(address)
        self.address = address
        self._ready.set()

    # -- publishing ----------------------------------------------------------------------
    def next_body(self) -> bytes:
        """A body carrying the measurement header with the next sequence number."""
        h = header.Header(self.id, self.group, self.seq, time.time_ns())
        self.seq += 1
        return header.encode(h, self.message_size)

    async def publish(self, body: bytes | None = None) -> None:
        """Send one message (a measurement body if none is given); returns once it is sent,
        waiting while ``max_pending`` are unanswered."""
        await self._slots.acquire()
        await self._ready.wait()
        self._send(self.next_body() if body is None else body)

    def _send(self, body: bytes) -> None:
        assert self._conn is not None
        fut = self._conn.request(Pub(self.topic, body))
        self._unacked.append((body, fut))
        fut.add_done_callback(self._answered)

    def _answered(self, fut: asyncio.Future[bytes]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # resent after the reconnect, which releases its slot then
        while self._unacked and self._unacked[0][1].done() and not self._unacked[0][1].exception():
            self._unacked.popleft()
            self._slots.release()

    async def flush(self) -> None:
        """Wait until everything published so far is acknowledged."""
        while self._unacked or not self._ready.is_set():
            await self._ready.wait()
            if self._conn is not None:
                await self._conn.drain()
            await asyncio.sleep(0)

    # -- moving --------------------------------------------------------------------------
    def _on_order(self, order: dict[str, Any]) -> None:
        m = order.get("migrate")
        if isinstance(m, dict) and m.get("topic") == self.topic and m.get("to") != self.address:
            self._moving = asyncio.get_running_loop().create_task(self._migrate(str(m["to"])))

    async def _migrate(self, to: str) -> None:
        """Make before break: the new connection first, then the old one drained."""
        try:
            new = await self._open(to)
        except OSError as exc:
            log.warning("publisher %s cannot reach %s: %s; staying", self.id, to, exc)
            return
        old, self._conn, self.address = self._conn, new, to
        carried, self._unacked = self._unacked, deque()
        self.migrations += 1
        if old is not None:
            await old.drain()
            lost = [body for body, fut in carried if fut.exception() is not None]
            for _ in carried:
                self._slots.release()
            for body in lost:  # the old broker went away meanwhile: resend here
                await self._slots.acquire()
                self._send(body)
            await old.close()

    def _lost(self, conn: Connection) -> None:
        if conn is self._conn and not self._closed:
            self._ready.clear()
            asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        pending = [body for body, _ in self._unacked]
        self._unacked.clear()
        delay = 0.05
        while not self._closed:
            try:
                await self._connect(await self._where())
                break
            except (OSError, aiohttp.ClientError, TimeoutError) as exc:
                log.info("publisher %s reconnecting in %.2f s: %s", self.id, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        self.reconnects += 1
        for body in pending:
            self._send(body)

    async def close(self) -> None:
        """Flush, then close."""
        with contextlib.suppress(ConnectionError):
            await self.flush()
        if self._moving is not None:
            await self._moving
        self._closed = True
        if self._conn is not None:
            await self._conn.close()
        if self._session is not None:
            await self._session.close()
