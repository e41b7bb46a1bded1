"""One NSQ V2 connection for SRTM's clients: commands out, frames in, in order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from srtm.protocol import (
    MAGIC_V2,
    Command,
    FrameReader,
    FrameType,
    Identify,
    MessageFrame,
    Nop,
    decode_message,
    encode_command,
)

HEARTBEAT = b"_heartbeat_"
log = logging.getLogger("srtm.client")


class BrokerError(Exception):
    """An error frame in answer to a command (its text: ``CODE detail``)."""

    @property
    def code(self) -> str:
        return str(self).partition(" ")[0]


def _order(data: bytes) -> dict[str, Any] | None:
    """An SRTM order frame's JSON object; anything else is ignored (not fatal: deeply
    nested JSON raises RecursionError, which would end the reader)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        log.warning("ignoring an SRTM order that is not JSON (%d bytes)", len(data))
        return None
    return doc if isinstance(doc, dict) else None


class Connection:
    """Responses are matched to commands in order (nsqd answers strictly in order).

    ``on_message`` gets message frames, ``on_order`` SRTM order frames (decoded JSON),
    ``on_close`` the end of the connection, with what was never answered failed.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        address: str,
        on_message: Callable[[MessageFrame], None] | None = None,
        on_order: Callable[[dict[str, Any]], None] | None = None,
        on_close: Callable[[Connection], None] | None = None,
    ) -> None:
        self.reader, self.writer, self.address = reader, writer, address
        self.on_message, self.on_order, self.on_close = on_message, on_order, on_close
        self._waiting: deque[asyncio.Future[bytes]] = deque()
        #: The broker's largest message body, when its IDENTIFY answer says.
        self.max_msg_size: int | None = None
        self.closed = asyncio.Event()
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, address: str, **callbacks: Any) -> Connection:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(MAGIC_V2)
        return cls(reader, writer, address, **callbacks)

    async def identify(self, **fields: Any) -> dict[str, Any]:
        reply = await self.request(Identify({"feature_negotiation": True, **fields}))
        doc: dict[str, Any] = json.loads(reply) if reply.startswith(b"{") else {}
        return doc

    def send(self, *cmds: Command) -> None:
        """Commands that get no answer (RDY, FIN, REQ, TOUCH, NOP); on a lost connection
        they go nowhere (its ``on_close`` tells the owner)."""
        self._write(b"".join(encode_command(c) for c in cmds))

    def request(self, cmd: Command) -> asyncio.Future[bytes]:
        """A command that gets a response; the future resolves with it (or BrokerError,
        or ConnectionError once the connection is lost: never raised here)."""
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if self.closed.is_set() or not self._write(encode_command(cmd)):
            fut.set_exception(ConnectionError(f"connection to {self.address} is closed"))
            return fut
        self._waiting.append(fut)
        return fut

    def _write(self, data: bytes) -> bool:
        """Write, or False if the connection is already lost. uvloop raises RuntimeError
        when writing to a transport the peer reset before our reader saw it (a broker
        killed): that must fail the command, not the caller's loop."""
        if self.writer.transport.is_closing():
            return False
        try:
            self.writer.write(data)
        except (RuntimeError, ConnectionError):
            return False
        return True

    async def drain(self) -> None:
        """Wait until every command sent so far has its answer."""
        if self._waiting:
            await asyncio.gather(*self._waiting, return_exceptions=True)

    async def _read(self) -> None:
        frames = FrameReader()
        try:
            while data := await self.reader.read(1 << 16):
                for f in frames.feed(data):
                    self._frame(f.kind, f.data)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            self._closed()

    def _frame(self, kind: FrameType, data: bytes) -> None:
        if kind is FrameType.MESSAGE:
            if self.on_message is not None:
                self.on_message(decode_message(data))
        elif kind is FrameType.SRTM:
            order = _order(data)
            if self.on_order is not None and order is not None:
                self.on_order(order)
        elif kind is FrameType.RESPONSE and data == HEARTBEAT:
            self.send(Nop())
        elif kind is FrameType.RESPONSE:
            if self._waiting:
                _answer(self._waiting.popleft(), data)
        elif self._waiting and not data.startswith((b"E_FIN", b"E_REQ", b"E_TOUCH")):
            _answer(self._waiting.popleft(), BrokerError(data.decode(errors="replace")))

    def _closed(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError(f"connection to {self.address} closed"))
        if self.on_close is not None and not self._closing:
            self.on_close(self)  # lost, not closed by us

    async def close(self) -> None:
        self._closing = True
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._closed()


def _answer(fut: asyncio.Future[bytes], answer: bytes | BrokerError) -> None:
    """Settle the oldest command's future. A caller that gave up on it (cancelled, e.g.
    by a timeout) still had its slot: the answer is taken and dropped, and the reader
    lives on (setting a done future would raise and end it)."""
    if fut.done():
        return
    if isinstance(answer, BrokerError):
        fut.set_exception(answer)
    else:
        fut.set_result(answer)
