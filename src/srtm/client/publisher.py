"""An asyncio publisher: plan-aware, pipelined, bounded, and it moves without losing a message.

It learns its broker from the controller (``/assign``, from the first of several that
answers) or takes a fixed address, and
IDENTIFYs with its SRTM fields so brokers can send it orders. PUBs are pipelined up to
``max_pending`` unanswered (then ``publish`` waits: backpressure). A migration order is
followed make-before-break: connect to the new broker, send everything new there, and
close the old connection only once all it carried is acknowledged. If a broker goes
away, the publisher asks again where to go (backing off) and resends what was not
acknowledged: nothing accepted by ``publish`` is lost (it may arrive twice).

Only a lost connection causes a resend. A message the broker answers with an error
(E_BAD_MESSAGE, E_BAD_TOPIC, E_PUB_FAILED, ...) is refused: its ``publish`` future fails
with ``PublishRefused`` and it is never sent again; a body over the broker's advertised
size (IDENTIFY) is refused before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp

from srtm.controllers import Controllers
from srtm.nsq_connection import BrokerError, Connection, client_context
from srtm.protocol import Pub, header
from srtm.version import __version__

log = logging.getLogger("srtm.client")


class PublishRefused(BrokerError):
    """The broker refused a message (or would: over its size limit); it is not resent."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code} {detail}")


@dataclass(eq=False)
class _Sent:
    """A message accepted by ``publish`` and not yet answered for good."""

    body: bytes
    #: What ``publish`` returned: done on the acknowledgement or the refusal.
    ack: asyncio.Future[None]
    #: The connection it was last sent on, and that connection's answer.
    conn: Connection | None = None
    reply: asyncio.Future[bytes] | None = field(default=None, repr=False)


class Publisher:
    def __init__(
        self,
        topic: str,
        publisher_id: str,
        *,
        controller: str | Sequence[str] | None = None,
        address: str | None = None,
        group: str | None = None,
        rate: float | None = None,
        join_secret: str | None = None,
        max_pending: int = 1_000,
        message_size: int = header.SIZE,
        tls: ssl.SSLContext | bool = False,
        auth_secret: str | None = None,
    ) -> None:
        if (controller is None) == (address is None):
            raise ValueError("give exactly one of controller (URL) or address (HOST:PORT)")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.topic, self.id, self.group, self.rate = topic, publisher_id, group, rate
        #: An open topic's join secret, sent as a header (out of the controller's logs).
        self.join_secret = join_secret
        #: The controllers (``URL[,URL...]`` or a list): ``/assign`` is asked of the first
        #: that answers (``srtm.controllers``).
        self.controllers = (
            None
            if controller is None
            else Controllers(controller, log=log, switch_level=logging.INFO)
        )
        self.address = address
        self.message_size = message_size
        self._tls = client_context(tls)
        self._auth_secret = auth_secret
        self.seq = 0
        self.migrations = 0
        self.reconnects = 0
        #: Messages the broker refused (never resent), and the first refusal since the
        #: last ``flush``, which that ``flush`` raises.
        self.refused = 0
        self._refusal: PublishRefused | None = None
        #: The current broker's largest message (its IDENTIFY answer; None: not told).
        self.max_msg_size: int | None = None
        self._slots = asyncio.Semaphore(max_pending)
        self._conn: Connection | None = None
        #: Messages sent and not answered for good, in publish order (a dict as an
        #: ordered set): what a reconnect resends.
        self._unacked: dict[_Sent, None] = {}
        self._ready = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._moving: asyncio.Task[None] | None = None
        #: Where a migration under way goes: the same order again (the controller's, and
        #: the old broker's when it forwards) does not start a second one.
        self._moving_to: str | None = None
        self._closed = False
        #: The task that connects again after a lost connection (held: close cancels it).
        self._reconnecting: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.controllers is not None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        await self._connect(await self._where())

    async def _where(self) -> str:
        if self.controllers is None:
            assert self.address is not None
            return self.address
        assert self._session is not None
        # Its rate and group too: an open topic places a publisher it does not know yet.
        params = {"topic": self.topic, "publisher": self.id}
        if self.rate:
            params["rate"] = repr(float(self.rate))
        if self.group:
            params["group"] = self.group
        headers = {"X-SRTM-Join-Secret": self.join_secret} if self.join_secret else None
        r = await self.controllers.request(
            self._session, "GET", "/assign", params=params, headers=headers
        )
        doc: dict[str, Any] = r.json()
        if r.status != 200:
            raise ConnectionError(f"controller {r.url}: {doc.get('message')}")
        return str(doc["tcp_address"])

    async def _open(self, address: str) -> Connection:
        fields = {"srtm_publisher": self.id, "srtm_orders": True, "client_id": self.id,
                  "user_agent": f"srtm-client/{__version__}"}  # fmt: skip
        if self.group:
            fields["srtm_group"] = self.group
        if self.rate:
            fields["srtm_rate"] = self.rate
        conn = await Connection.open(
            address, fields, tls=self._tls, auth_secret=self._auth_secret,
            on_order=self._on_order, on_close=self._lost,
        )  # fmt: skip
        doc = conn.features
        size = doc.get("srtm_max_msg_size", doc.get("max_msg_size"))
        conn.max_msg_size = size if isinstance(size, int) and size > 0 else None
        return conn

    async def _connect(self, address: str) -> None:
        self._conn = await self._open(address)
        self.address, self.max_msg_size = address, self._conn.max_msg_size
        self._ready.set()

    # -- publishing ----------------------------------------------------------------------
    def next_body(self) -> bytes:
        """A body carrying the measurement header with the next sequence number."""
        h = header.Header(self.id, self.group, self.seq, time.time_ns())
        self.seq += 1
        return header.encode(h, self.message_size)

    async def publish(self, body: bytes | None = None) -> asyncio.Future[None]:
        """Send one message (a measurement body if none is given); returns once it is sent,
        waiting while ``max_pending`` are unanswered.

        The returned future is done when the broker acknowledges the message, or fails
        with ``PublishRefused`` when it refuses it. A body over the broker's advertised
        limit (or empty) raises ``PublishRefused`` here and is not sent."""
        if body is not None:
            self._check(body)
        await self._slots.acquire()
        try:
            await self._ready.wait()
            body = self.next_body() if body is None else body
            self._check(body)  # against the broker connected by now
        except BaseException:
            self._slots.release()
            raise
        sent = _Sent(body, asyncio.get_running_loop().create_future())
        self._unacked[sent] = None
        self._send(sent)
        return sent.ack

    def _check(self, body: bytes) -> None:
        """Refuse up front what every broker refuses (and closes the connection for)."""
        if not body:
            raise PublishRefused("E_BAD_MESSAGE", "PUB of an empty body; not sent")
        most = self.max_msg_size
        if most is not None and len(body) > most:
            raise PublishRefused(
                "E_BAD_MESSAGE",
                f"PUB body of {len(body)} bytes is over the broker's limit of {most}; not sent",
            )

    def _send(self, sent: _Sent) -> None:
        assert self._conn is not None
        sent.conn, sent.reply = self._conn, self._conn.request(Pub(self.topic, sent.body))
        sent.reply.add_done_callback(partial(self._answered, sent))

    def _answered(self, sent: _Sent, reply: asyncio.Future[bytes]) -> None:
        if reply is sent.reply:  # else an earlier send's answer: it was resent since
            self._settle(sent)

    def _settle(self, sent: _Sent) -> None:
        """Finish ``sent`` if its answer is final: an acknowledgement or an error frame.
        A lost connection is not final: the message waits to be resent."""
        reply = sent.reply
        if sent.ack.done() or reply is None or not reply.done() or reply.cancelled():
            return
        exc = reply.exception()
        if exc is None:
            sent.ack.set_result(None)
        elif isinstance(exc, BrokerError):
            self._refuse(sent, exc)
        else:
            return
        del self._unacked[sent]
        self._slots.release()

    def _refuse(self, sent: _Sent, exc: BrokerError) -> None:
        code, _, detail = str(exc).partition(" ")
        refusal = PublishRefused(code, f"{detail} ({len(sent.body)} bytes); not resent")
        log.warning("publisher %s: broker %s refused a message: %s", self.id, self.address, refusal)
        self.refused += 1
        if self._refusal is None:
            self._refusal = refusal
        sent.ack.set_exception(refusal)
        sent.ack.exception()  # retrieved: a caller that ignores the future gets flush's

    async def flush(self) -> None:
        """Wait until everything published so far is answered; raises the first
        ``PublishRefused`` since the last flush if the broker refused any of it."""
        pending = [sent.ack for sent in self._unacked]
        if pending:
            await asyncio.wait(pending)
        refusal, self._refusal = self._refusal, None
        if refusal is not None:
            raise refusal

    # -- moving --------------------------------------------------------------------------
    def _on_order(self, order: dict[str, Any]) -> None:
        m = order.get("migrate")
        if not isinstance(m, dict) or m.get("topic") != self.topic:
            return
        to = m.get("to")
        port = to.rpartition(":")[2] if isinstance(to, str) else ""
        if not (isinstance(to, str) and port.isascii() and port.isdigit()):
            log.warning("publisher %s ignores a migration to %r (not HOST:PORT)", self.id, to)
        elif to not in (self.address, self._moving_to):
            self._moving_to = to
            self._moving = asyncio.get_running_loop().create_task(self._migrate(to))

    async def _migrate(self, to: str) -> None:
        """Make before break: the new connection first, then the old one drained."""
        try:
            new = await self._open(to)
        except (OSError, TimeoutError, BrokerError) as exc:
            log.warning("publisher %s cannot reach %s: %s; staying", self.id, to, exc)
            self._moving_to = None
            return
        old, self._conn, self.address = self._conn, new, to
        self._moving_to = None
        self.max_msg_size = new.max_msg_size
        self.migrations += 1
        if old is not None:
            await old.drain()
            self._resend(lambda sent: sent.conn is old)  # the old broker went away meanwhile
            await old.close()

    def _resend(self, which: Callable[[_Sent], bool]) -> None:
        """Resend, in order, the messages among ``which`` that lost their connection."""
        for sent in list(self._unacked):
            self._settle(sent)  # an error frame read just before the loss is final
            lost = sent.reply is not None and sent.reply.done()
            if lost and not sent.ack.done() and which(sent):
                self._send(sent)

    def _lost(self, conn: Connection) -> None:
        if conn is self._conn and not self._closed:
            self._ready.clear()
            self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.05
        while not self._closed:
            try:
                await self._connect(await self._where())
                break
            except (OSError, aiohttp.ClientError, TimeoutError, BrokerError) as exc:
                log.info("publisher %s reconnecting in %.2f s: %s", self.id, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        else:
            return
        self.reconnects += 1
        self._resend(lambda sent: True)

    async def close(self) -> None:
        """Flush, then close."""
        with contextlib.suppress(ConnectionError, PublishRefused):
            await self.flush()
        if self._moving is not None:
            await self._moving
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnecting
        if self._conn is not None:
            await self._conn.close()
        if self._session is not None:
            await self._session.close()
