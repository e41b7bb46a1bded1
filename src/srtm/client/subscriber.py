"""An asyncio subscriber of every broker of a topic: it finds them through the controller's
nsqlookupd-style ``/lookup`` (again every ``refresh_s``, so it follows plan changes; of
the first of several controllers that answers) or
takes fixed addresses, FINs each message and records end-to-end latency from the
measurement header in an HDR histogram; with ``trace_dir``, it writes subscriber-side
trace rows.

With ``consumer_class`` it names its class in IDENTIFY (``srtm_class``), and with
``class_secret`` proves it (``srtm_class_secret``: the class's ``--class-secret``, or the
cluster token; a broker with keys refuses a class above ``default`` without proof, with
E_AUTH_FAILED). A SUB its class is not admitted for (E_SUB_FAILED, which leaves the
connection open) is sent again on the same connection after a backoff doubling from
``retry_s`` up to ``max_retry_s``, for as long as the subscriber runs (logged once per
connection)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from hdrh.histogram import HdrHistogram

from srtm.client.traces import SubscriberTraces
from srtm.controllers import Controllers, ControllerUnreachable
from srtm.nsq_connection import BrokerError, Connection, client_context
from srtm.protocol import Fin, MessageFrame, Rdy, Sub, header
from srtm.protocol.session import E_SUB_FAILED

log = logging.getLogger("srtm.client")


@dataclass(frozen=True, slots=True)
class Received:
    broker: str
    message: MessageFrame
    header: header.Header | None
    recv_ns: int


def producer_addresses(doc: object) -> list[str]:
    """HOST:PORT of each producer a ``/lookup`` answer lists; what is not one is skipped
    (a controller's odd answer is no broker, not the end of the refreshes)."""
    producers = doc.get("producers") if isinstance(doc, dict) else None
    out = []
    for p in producers if isinstance(producers, list) else []:
        host = p.get("broadcast_address") if isinstance(p, dict) else None
        port = p.get("tcp_port") if isinstance(p, dict) else None
        if isinstance(host, str) and host and isinstance(port, int) and not isinstance(port, bool):
            out.append(f"{host}:{port}")
    return out


class Subscriber:
    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        controller: str | Sequence[str] | None = None,
        addresses: Sequence[str] = (),
        on_message: Callable[[Received], None] | None = None,
        max_in_flight: int = 500,
        refresh_s: float = 1.0,
        trace_dir: Path | None = None,
        run: str = "default",
        consumer_class: str | None = None,
        class_secret: str | None = None,
        retry_s: float = 0.5,
        max_retry_s: float = 30.0,
        tls: ssl.SSLContext | bool = False,
        auth_secret: str | None = None,
    ) -> None:
        if controller is None and not addresses:
            raise ValueError("give a controller (URL) or broker addresses")
        self.topic, self.channel = topic, channel
        #: The controllers (``URL[,URL...]`` or a list): ``/lookup`` is asked of the first
        #: that answers (``srtm.controllers``).
        self.controllers = (
            None
            if controller is None
            else Controllers(controller, log=log, switch_level=logging.INFO)
        )
        self.addresses = list(addresses)
        self.on_message = on_message
        self.max_in_flight = max_in_flight
        self.refresh_s = refresh_s
        self.consumer_class = consumer_class
        self._class_secret = class_secret
        self._tls = client_context(tls)
        self._auth_secret = auth_secret
        self.retry_s, self.max_retry_s = retry_s, max_retry_s
        #: SUBs refused because the class was not admitted (each retry counts).
        self.refused = 0
        #: Connections whose SUB waits to be admitted, retried in the background.
        self._retries: dict[str, asyncio.Task[None]] = {}
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
        if self.controllers is not None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
            await self.refresh()
            self._refresh = asyncio.create_task(self._refresh_loop())
        for address in self.addresses:
            await self._subscribe(address)

    async def refresh(self) -> None:
        """Subscribe to every broker the controller lists for the topic, not yet subscribed.
        No controller answering is no change (asked again next refresh)."""
        assert self._session is not None and self.controllers is not None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ControllerUnreachable):
            r = await self.controllers.request(
                self._session, "GET", "/lookup", params={"topic": self.topic}
            )
            if r.status != 200:
                return
            for address in producer_addresses(r.json()):
                if address not in self._conns:
                    with contextlib.suppress(OSError):
                        await self._subscribe(address)

    async def _refresh_loop(self) -> None:
        """``refresh`` every ``refresh_s`` for as long as the subscriber runs: a failed
        refresh (a broker's refusal, a controller's odd answer) is logged, once while it
        repeats, and the next one tried."""
        last = ""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
                last = ""
            except Exception as exc:
                if repr(exc) != last:
                    who = f"{self.topic}/{self.channel}"
                    log.warning("subscriber %s: refresh failed: %r", who, exc)
                last = repr(exc)

    async def _subscribe(self, address: str) -> None:
        fields: dict[str, object] = {"client_id": f"srtm-sub-{self.channel}",
                                     "heartbeat_interval": 5_000}  # fmt: skip
        if self.consumer_class is not None:
            fields["srtm_class"] = self.consumer_class
            if self._class_secret is not None:
                fields["srtm_class_secret"] = self._class_secret
        conn = await Connection.open(
            address,
            fields,
            tls=self._tls,
            auth_secret=self._auth_secret,
            on_message=lambda m: self._message(address, m),
            on_close=lambda c: self._conns.pop(address, None),
        )
        reply = conn.features
        self._broker_ids[address] = str(reply.get("srtm_broker_id", address))
        self._conns[address] = conn  # also while waiting to be admitted: not opened twice
        try:
            await conn.request(Sub(self.topic, self.channel))
        except BrokerError as exc:
            if exc.code != E_SUB_FAILED or conn.closed.is_set():
                self._conns.pop(address, None)
                raise
            self.refused += 1
            log.warning("%s: %s; retrying with backoff", address, exc)
            self._retries[address] = asyncio.create_task(self._retry(address, conn))
            return
        conn.send(Rdy(self.max_in_flight))

    async def _retry(self, address: str, conn: Connection) -> None:
        """SUB again after a backoff until admitted or the connection is gone."""
        delay = self.retry_s
        try:
            while not conn.closed.is_set():
                await asyncio.sleep(delay)
                try:
                    await conn.request(Sub(self.topic, self.channel))
                except BrokerError as exc:
                    if exc.code != E_SUB_FAILED:
                        log.warning("%s: %s; giving up", address, exc)
                        await conn.close()
                        self._conns.pop(address, None)
                        return
                    self.refused += 1
                    delay = min(delay * 2, self.max_retry_s)
                    continue
                except ConnectionError:
                    return
                log.info("%s: admitted", address)
                conn.send(Rdy(self.max_in_flight))
                return
        finally:
            self._retries.pop(address, None)

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
        """The brokers it is subscribed to (admitted)."""
        return sorted(a for a in self._conns if a not in self._retries)

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
        for task in list(self._retries.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for conn in list(self._conns.values()):
            await conn.close()
        if self.traces is not None:
            await self.traces.close()
        if self._session is not None:
            await self._session.close()
