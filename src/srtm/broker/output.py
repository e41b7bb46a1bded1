"""What one client connection sends: frames queued, sent together, held, bounded.

Everything written in one loop turn (or while one read is handled) leaves in one send
(a dispatch, which runs at the turn's end, sends what it wrote at once);
answers behind a publish whose disk write is pending wait for it, and so does every
frame after them (order is kept); over the high-water mark the connection is paused
until what is queued drains below the low one; after a fatal error the connection
lingers, reading and discarding, until the client closes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any, Protocol

from srtm.broker.sockio import send
from srtm.protocol.errors import ProtocolError
from srtm.protocol.session import Session, SessionState

log = logging.getLogger("srtm.broker")

_CLOSED = SessionState.CLOSED
#: Longest a connection that had a fatal error is read (and discarded) before closing.
LINGER_S = 1.0
#: Bytes read (and discarded) at a time while lingering.
_DISCARD_SIZE = 32 * 1024


class OutputOwner(Protocol):
    """What an ``Output`` tells its connection (``srtm.broker.tcp.Client``): one owner
    rather than a callback each, four objects fewer per connection for the collector to
    walk."""

    def close(self) -> None:
        """End the connection (a send failed, or lingering is over)."""
        ...

    def output_paused(self) -> None:
        """``buf`` (with what is held) crossed the high-water mark."""
        ...

    def output_resumed(self) -> None:
        """``buf`` drained below the low-water mark."""
        ...

    def watch_deadlines(self) -> None:
        """A send left bytes behind: ``stalled`` matters until they are gone."""
        ...


class ClosedConnection:
    """What a closed connection's output and intake hold once they let go of it
    (``detach``): finishing, so that whatever completes after the close (a send, a
    publish taken in slices, an unblock) does nothing."""

    remote = "(closed)"
    finishing = True

    def close(self) -> None:
        pass

    def send_error(self, err: ProtocolError) -> None:
        pass

    def output_paused(self) -> None:
        pass

    def output_resumed(self) -> None:
        pass

    def watch_deadlines(self) -> None:
        pass


CLOSED = ClosedConnection()


class Output:
    """The output of one connection on ``sock``: ``buf`` is what waits to be sent; what
    it has to tell the connection goes to ``owner``."""

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        session: Session,
        max_bytes: int,
        write_timeout_ms: int,
        remote: str,
        owner: OutputOwner,
    ) -> None:
        self._sock, self._loop, self._session, self._owner = sock, loop, session, owner
        self._remote = remote
        self.buf = bytearray()
        #: Writes of publishes not done yet, and what waits for them to be sent.
        self.holds = 0
        self._held = bytearray()
        self._writing = False
        self.send_scheduled = False
        #: Set while a read is handled: what it writes leaves when it is done, in one send,
        #: not a loop callback later (a synchronous PUB's OK a whole loop turn sooner).
        self.in_read = False
        #: After a fatal error: closed once what is queued is sent (``linger``).
        self.closing = False
        self._lingering: asyncio.TimerHandle | None = None
        #: What every write goes through once TLS or compression is on (None: as it is).
        self.wrap: Callable[[bytes], bytes] | None = None
        self._high = max_bytes if max_bytes > 0 else sys.maxsize
        self._low = self._high // 2
        #: Over the high-water mark, until below the low one.
        self.paused = False
        self.sent_bytes = 0
        self._write_timeout_ns = write_timeout_ms * 1_000_000
        #: Bytes sent at the last deadline check, and since when nothing more was.
        self._sent_seen = 0
        self._stalled_since_ns = 0

    def write(self, data: bytes) -> None:
        """Queue ``data``; everything written in one loop turn leaves in one send. Nothing
        once the connection lingers: its write side is shut (a send would fail, and the
        close it made would reset the connection)."""
        if self._session.state is _CLOSED or self._lingering is not None:
            return
        if self.wrap is not None:
            data = self.wrap(data)  # compressed and/or ciphertext (with handshake bytes)
        if self.holds:
            self._held += data  # behind an OK that waits for its write
            if len(self.buf) + len(self._held) >= self._high and not self.paused:
                self._pause()
            return
        self.buf += data
        self.queued()

    def answer(self, data: bytes) -> None:
        """``write`` of a read's only answer (a sensor's OK), sent now: straight from
        ``data`` where nothing is queued, held or wrapped before it, else as ``write``
        and ``send`` would."""
        if self.buf or self.holds or self._writing or self.wrap is not None:
            self.in_read = True  # sent below, not a loop turn later
            self.write(data)
            self.in_read = False
            self.send_now()
            return
        if self._session.state is _CLOSED:
            return
        try:
            sent = send(self._sock, data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._owner.close()
            return
        self.sent_bytes += sent
        if sent < len(data):
            self.buf += data[sent:]
            self.send()

    def queued(self) -> None:
        """Bytes were added to ``buf``: bound it, and send at the end of the loop turn."""
        if len(self.buf) >= self._high and not self.paused:
            self._pause()
        if not self.send_scheduled and not self._writing:
            self.send_scheduled = True
            if not self.in_read:
                self._loop.call_soon(self.send)

    def send_now(self) -> None:
        """Send what is queued now rather than at the end of the loop turn."""
        if self.send_scheduled:
            self.send()

    def send(self) -> None:
        self.send_scheduled = False
        if self._session.state is _CLOSED or self._writing or not self.buf:
            return
        self._on_writable()
        if self.buf and self._session.state is not _CLOSED:
            self._writing = True
            self._loop.add_writer(self._sock.fileno(), self._on_writable)
            self._owner.watch_deadlines()

    def _on_writable(self) -> None:
        try:
            sent = send(self._sock, self.buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._owner.close()
            return
        del self.buf[:sent]
        self.sent_bytes += sent
        if self.paused and len(self.buf) <= self._low:
            self.paused = False
            self._owner.output_resumed()
        if self.buf:
            return
        if self._writing:
            self._loop.remove_writer(self._sock.fileno())
            self._writing = False
        if self.closing and not self.holds:  # else after what is held
            self._linger()

    def _pause(self) -> None:
        self.paused = True
        self._owner.output_paused()

    # -- holding answers until their publish is on disk ------------------------------------
    def hold_until(self, written: asyncio.Future[Any]) -> None:
        """A publish is acknowledged once what it overflowed to disk is written: its OK,
        and every frame after it on this connection (order is kept), wait for ``written``
        (other connections do not)."""
        self.holds += 1
        written.add_done_callback(self._unhold)

    def _unhold(self, _: asyncio.Future[Any]) -> None:
        self.holds -= 1
        if self.holds or not self._held:
            return
        held, self._held = self._held, bytearray()
        self.buf += held
        if not self.send_scheduled and not self._writing and self._session.state is not _CLOSED:
            self.send_scheduled = True
            self._loop.call_soon(self.send)

    # -- ending ----------------------------------------------------------------------------
    def _linger(self) -> None:
        """After the last frame of a fatal error: stop writing, then read and discard
        what the client still sends until it closes (or LINGER_S pass), so its kernel
        gets our FIN; closing with unread bytes sends a reset, which makes the client's
        kernel drop the error frame it has not read yet."""
        if self._session.state is _CLOSED or self._lingering is not None:
            return
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._owner.close()
            return
        self._loop.add_reader(self._sock.fileno(), self._discard)
        self._lingering = self._loop.call_later(LINGER_S, self._owner.close)

    def _discard(self) -> None:
        try:
            data = self._sock.recv(_DISCARD_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._owner.close()

    def stalled(self, now: int) -> bool:
        """Called about every second: whether what is queued made no progress for the
        write timeout (logged)."""
        if not self.buf:
            self._stalled_since_ns = 0
        elif self.sent_bytes != self._sent_seen or not self._stalled_since_ns:
            self._sent_seen = self.sent_bytes
            self._stalled_since_ns = now
        elif self._write_timeout_ns and now - self._stalled_since_ns >= self._write_timeout_ns:
            log.warning(
                "closing %s: %d bytes pending, none written for %d ms",
                self._remote,
                len(self.buf),
                self._write_timeout_ns // 1_000_000,
            )
            return True
        return False

    def stop(self) -> None:
        """The connection is closing: stop lingering and writing (before its socket
        closes)."""
        if self._lingering is not None:
            self._lingering.cancel()
        fd = self._sock.fileno()
        if fd >= 0 and self._writing:
            self._loop.remove_writer(fd)

    def detach(self) -> None:
        """The connection is closed and gone: let go of it, so that the two are not
        cyclic garbage (``Client.close``)."""
        self._owner = CLOSED
        self.wrap = None
