"""One asyncio NSQ V2 client connection: SRTM's clients and the broker's relay links to
other brokers both speak through it.

``Handshake`` is a connection before its reader runs: the magic, IDENTIFY with feature
negotiation, the TLS upgrade and AUTH, each step reading its own answer (no reader may
race a TLS upgrade). What to do with what IDENTIFY's answer offers is the caller's policy:
``Connection.open`` is a client's (TLS when asked for, and a broker offering none
refused; AUTH when the broker requires it); the relay has its own
(``srtm.broker.relay``). ``Handshake.connection`` then starts the ``Connection``:
commands out, frames in (through the protocol's frame reader), answers matched to
commands in order, heartbeats answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from srtm.protocol import (
    HEARTBEAT,
    MAGIC_V2,
    OK,
    Auth,
    Command,
    Frame,
    FrameReader,
    FrameType,
    Identify,
    MessageFrame,
    Nop,
    decode_message,
    encode_command,
)

log = logging.getLogger("srtm.nsq_connection")


class BrokerError(Exception):
    """An error frame in answer to a command (its text: ``CODE detail``)."""

    @property
    def code(self) -> str:
        return str(self).partition(" ")[0]


class HandshakeError(ConnectionError):
    """The broker cannot be spoken to as asked: it offers no TLS where TLS was asked for,
    it requires AUTH and no secret was given, or its answer is not NSQ's."""


def client_context(tls: ssl.SSLContext | bool) -> ssl.SSLContext | None:
    """A client's ``tls`` option as a context: True verifies the broker's certificate
    against the system's CAs and the host of its address; False is no TLS."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    return ssl.create_default_context() if tls else None


class Handshake:
    """The connection from the magic to the first command: each step writes its command
    and waits for its answer (a heartbeat is answered on the way, an error frame raised
    as ``BrokerError``, the connection closed under it as ``ConnectionError``)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        self.reader, self.writer, self.address = reader, writer, address
        self._frames = FrameReader()
        #: Frames read and not answers to the handshake: the reader takes them first.
        self._early: deque[Frame] = deque()
        #: How it is secured, for people: "plain text", "TLS TLSv1.3".
        self.secured = "plain text"

    @classmethod
    async def start(cls, address: str) -> Handshake:
        """Connect and send the magic."""
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(MAGIC_V2)
        return cls(reader, writer, address)

    @property
    def host(self) -> str:
        """The host of the address, as a certificate names it (no IPv6 brackets)."""
        return self.address.rpartition(":")[0].strip("[]")

    async def identify(self, identity: Mapping[str, Any]) -> dict[str, Any]:
        """IDENTIFY with feature negotiation; the broker's answer (what it offers: e.g.
        ``tls_v1``, ``auth_required``; {} from a broker that answers only OK)."""
        self._write(Identify({**identity, "feature_negotiation": True}))
        return _document(await self._response())

    async def upgrade(self, context: ssl.SSLContext) -> None:
        """The TLS upgrade IDENTIFY's ``tls_v1`` agreed on: the handshake, then the
        broker's OK over TLS. Raises ssl's errors (an untrusted certificate, ...)."""
        await self.writer.start_tls(context, server_hostname=self.host)
        self._frames = FrameReader()  # nothing else came before the handshake
        if await self._response() != OK:
            raise HandshakeError(f"{self.address}: no OK after the TLS upgrade")
        ssl_object = self.writer.get_extra_info("ssl_object")
        self.secured = f"TLS {ssl_object.version() if ssl_object is not None else ''}".rstrip()

    async def auth(self, secret: str) -> dict[str, Any]:
        """AUTH; the broker's answer (``identity``, ``permission_count``, ...)."""
        self._write(Auth(secret.encode()))
        return _document(await self._response())

    def connection(
        self,
        on_message: Callable[[MessageFrame], None] | None = None,
        on_order: Callable[[dict[str, Any]], None] | None = None,
        on_close: Callable[[Connection], object] | None = None,
    ) -> Connection:
        """The handshake is over: the connection's reader takes over from here."""
        conn = Connection(self.reader, self.writer, self.address, on_message, on_order, on_close)
        conn.start(self._frames, self._early)
        return conn

    def close(self) -> None:
        self.writer.close()

    def _write(self, cmd: Command) -> None:
        self.writer.write(encode_command(cmd))

    async def _response(self) -> bytes:
        """The next answer; messages and orders read meanwhile wait for the reader."""
        while (f := self._next_answer()) is None:
            chunk = await self.reader.read(1 << 16)
            if not chunk:
                raise ConnectionError(f"{self.address}: closed by the broker")
            for got in self._frames.feed(chunk):
                if got.kind is FrameType.RESPONSE and got.data == HEARTBEAT:
                    self._write(Nop())
                else:
                    self._early.append(got)
        if f.kind is FrameType.ERROR:
            raise BrokerError(f.data.decode(errors="replace"))
        return f.data

    def _next_answer(self) -> Frame | None:
        for i, f in enumerate(self._early):
            if f.kind is FrameType.RESPONSE or f.kind is FrameType.ERROR:
                del self._early[i]
                return f
        return None


def _document(answer: bytes) -> dict[str, Any]:
    """IDENTIFY's (or AUTH's) JSON answer; a broker's plain OK says nothing."""
    if answer == OK:
        return {}
    try:
        doc = json.loads(answer)
    except (ValueError, RecursionError) as exc:
        raise HandshakeError(f"unreadable answer {answer[:100]!r}") from exc
    return doc if isinstance(doc, dict) else {}


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
        on_close: Callable[[Connection], object] | None = None,
    ) -> None:
        self.reader, self.writer, self.address = reader, writer, address
        self.on_message, self.on_order, self.on_close = on_message, on_order, on_close
        self._waiting: deque[asyncio.Future[bytes]] = deque()
        #: The broker's IDENTIFY answer ({} when it was not sent or said nothing).
        self.features: dict[str, Any] = {}
        #: The broker's largest message body, when its IDENTIFY answer says.
        self.max_msg_size: int | None = None
        self.closed = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self, frames: FrameReader, early: Iterable[Frame] = ()) -> None:
        """Start reading: first the frames the handshake read and did not take, then on
        with its frame reader (which may hold the start of the next frame)."""
        self._task = asyncio.get_running_loop().create_task(self._read(frames, list(early)))

    @classmethod
    async def open(
        cls,
        address: str,
        identity: Mapping[str, Any] | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        auth_secret: str | None = None,
        on_message: Callable[[MessageFrame], None] | None = None,
        on_order: Callable[[dict[str, Any]], None] | None = None,
        on_close: Callable[[Connection], object] | None = None,
    ) -> Connection:
        """A client's connection: with ``identity``, IDENTIFY (asking for TLS with a
        ``tls`` context), upgrade to TLS (a broker that offers none is refused:
        ``HandshakeError``) and AUTH with ``auth_secret`` where the broker requires it
        (none given: ``HandshakeError``; refused: ``BrokerError``). Without ``identity``
        nothing but the magic is sent."""
        hs = await Handshake.start(address)
        try:
            features = {} if identity is None else await _negotiate(hs, identity, tls, auth_secret)
        except BaseException:
            hs.close()
            raise
        conn = hs.connection(on_message, on_order, on_close)
        conn.features = features
        return conn

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

    async def _read(self, frames: FrameReader, early: list[Frame]) -> None:
        try:
            for f in early:
                self._frame(f.kind, f.data)
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

    def close_nowait(self) -> None:
        """Close without waiting (from a ``finally`` a repeated cancel may interrupt):
        the reader ends on its own, what was never answered failed."""
        self._closing = True
        self.writer.close()
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        self.close_nowait()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._closed()


async def _negotiate(
    hs: Handshake,
    identity: Mapping[str, Any],
    context: ssl.SSLContext | None,
    auth_secret: str | None,
) -> dict[str, Any]:
    """A client's policy: IDENTIFY's answer decides the TLS upgrade and AUTH."""
    features = await hs.identify(identity if context is None else {**identity, "tls_v1": True})
    if context is not None:
        if features.get("tls_v1") is not True:
            raise HandshakeError(f"{hs.address} offers no TLS (tls was asked for)")
        await hs.upgrade(context)
    if features.get("auth_required") is True:
        if auth_secret is None:
            raise HandshakeError(f"{hs.address} requires AUTH and no auth_secret is given")
        await hs.auth(auth_secret)
    return features


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
