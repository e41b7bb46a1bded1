"""One client connection: socket bytes → protocol events → broker calls → frames back.

Reads use ``recvmsg`` so each read carries the kernel's receive timestamp
(SO_TIMESTAMPNS); every command completed by a read gets that read's stamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import socket
import ssl
import struct
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from srtm.broker.state import DeliveryError
from srtm.protocol import (
    CLOSE_WAIT,
    HEARTBEAT,
    Auth,
    Cls,
    Dpub,
    Fin,
    Identify,
    Mpub,
    Nop,
    Parser,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    errors,
    frames,
)
from srtm.protocol.frames import message as message_frame

if TYPE_CHECKING:
    from srtm.broker.auth import Gate
    from srtm.broker.broker import Broker
    from srtm.broker.message import Message
    from srtm.broker.options import BrokerOptions
    from srtm.broker.state import Channel
    from srtm.broker.tls import TlsSession

log = logging.getLogger("srtm.broker")

#: Linux's SO_TIMESTAMPNS (== SCM_TIMESTAMPNS); the socket module does not export it.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("qq")
#: struct tcp_info (Linux >= 4.6): tcpi_rtt (µs) at byte 68, tcpi_min_rtt at byte 148.
_TCPI_U32 = struct.Struct("I")
_TCPI_RTT_OFFSET = 68
_TCPI_MIN_RTT_OFFSET = 148
# Small reads bound the work one callback does, so shaped releases are not held back.
_READ_SIZE = 32 * 1024
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)
#: Longest a connection that had a fatal error is read (and discarded) before closing.
_LINGER_S = 1.0


@contextlib.contextmanager
def _pub_failed_as(code: str) -> Iterator[None]:
    """nsqd's code for a refused MPUB or DPUB (the broker raises E_PUB_FAILED)."""
    try:
        yield
    except ProtocolError as err:
        if err.code != errors.E_PUB_FAILED:
            raise
        command = code.removeprefix("E_").removesuffix("_FAILED")  # MPUB, DPUB
        raise ProtocolError(code, err.message.replace("PUB", command, 1)) from err


class State(enum.Enum):
    INIT = "init"
    SUBSCRIBED = "subscribed"
    CLOSING = "closing"
    CLOSED = "closed"


def _incomplete(parser: Parser) -> bool:
    """Whether the parser holds part of a command (a line, or a body still arriving).
    The parser has no public view of this; only these two fields say it."""
    return bool(parser._buf) or parser._pending is not None


def enable_kernel_timestamps(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class Client:
    """A connected NSQ client (a publisher, a consumer, or both)."""

    def __init__(self, broker: Broker, sock: socket.socket, kernel_timestamps: bool) -> None:
        self.broker = broker
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.parser = Parser(broker.options.limits)
        self.state = State.INIT
        self.rdy = 0
        self.in_flight = 0
        self.msg_timeout_ns = broker.options.msg_timeout_ms * 1_000_000
        self.heartbeat_ns = broker.options.heartbeat_interval_ms * 1_000_000
        self.channel: Channel | None = None
        self.identity: dict[str, Any] = {}
        self.connected_ns = time.time_ns()
        self.last_read_ns = self.connected_ns
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        #: Refreshed every second by the broker (TCP_INFO), for latency estimates.
        self.rtt_cache_ns = 0
        self.kernel_timestamps = kernel_timestamps and enable_kernel_timestamps(sock)
        host, port = sock.getpeername()[:2]
        self.remote = f"{host}:{port}"
        self._out = bytearray()
        #: Writes of publishes not done yet, and what waits for them to be sent.
        self._holds = 0
        self._held = bytearray()
        self._writing = False
        self._send_scheduled = False
        self._close_when_flushed = False
        self._heartbeat: asyncio.TimerHandle | None = None
        #: Set while closing after a fatal error (see _linger).
        self._lingering: asyncio.TimerHandle | None = None
        self._init_limits(broker.options)
        #: TLS once IDENTIFY asked for it; the gate (--tls-required, AUTH) where configured.
        self.tls: TlsSession | None = None
        self.gate: Gate | None = None
        if broker.tls_context is not None or broker.authenticator is not None:
            from srtm.broker.auth import new_gate

            self.gate = new_gate(self)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop.add_reader(sock.fileno(), self._on_readable)
        self._arm_heartbeat()

    # -- reading -------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data, ancdata, _, _ = self.sock.recvmsg(_READ_SIZE, _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        user_ns = time.time_ns()
        if not data:
            self.close()
            return
        arrival = user_ns
        if ancdata:
            sec, nsec = _TIMESPEC.unpack_from(ancdata[0][2])
            arrival = sec * 1_000_000_000 + nsec
            self.broker.stats.stamp_gaps.add(user_ns - arrival)
        self.last_read_ns = user_ns
        if self.tls is not None and not (data := self._tls_receive(data)):
            return
        events = self.parser.feed(data)
        self._note_partial(bool(events), user_ns)
        for i, event in enumerate(events):
            if self.state is State.CLOSED or self._close_when_flushed:
                return  # closed, or a fatal error: nsqd runs nothing after one
            if i & 31 == 31:
                self.broker.release_due()
            if self.gate is not None and self.gate.consumes(event, arrival):
                continue  # refused, or held until the auth server answers
            self.run(event, arrival)

    def _handle(self, cmd: object, arrival: int) -> None:
        broker = self.broker
        match cmd:
            case Pub(topic, body):
                self._hold_until(broker.publish(topic, [body], arrival, self._publisher))
                self._published(topic, 1)
            case Mpub(topic, bodies):
                with _pub_failed_as(errors.E_MPUB_FAILED):
                    written = broker.publish(topic, bodies, arrival, self._publisher)
                self._hold_until(written)
                self._published(topic, len(bodies))
            case Dpub(topic, defer_ms, body):
                with _pub_failed_as(errors.E_DPUB_FAILED):
                    broker.publish_deferred(topic, body, defer_ms, arrival, self._publisher)
                self._published(topic, 1)
            case Rdy(count):
                self._rdy(count)
            case Fin(mid):
                self._settle(mid, "FIN", lambda ch: ch.fin(mid, self))
                self.finish_count += 1
            case Req(mid, timeout_ms):
                self._settle(
                    mid, "REQ", lambda ch: ch.req(mid, self, timeout_ms * 1_000_000, time.time_ns())
                )
                self.requeue_count += 1
            case Touch(mid):
                self._settle(mid, "TOUCH", lambda ch: ch.touch(mid, self, time.time_ns()))
            case Sub(topic, channel):
                self._sub(topic, channel)
            case Identify(config):
                self._identify(config)
            case Cls():
                if self.state is not State.SUBSCRIBED:
                    raise ProtocolError(errors.E_INVALID, "cannot CLS in current state")
                self.state = State.CLOSING
                self.rdy = 0  # nsqd's StartClose: RDY 0, so no more messages
                self.write(frames.response(CLOSE_WAIT))
            case Auth():
                raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
            case Nop():
                pass

    def _hold_until(self, written: asyncio.Future[Any] | None) -> None:
        """A publish is acknowledged once what it overflowed to disk is written: its OK,
        and every frame after it on this connection (order is kept), wait for ``written``
        (other connections do not)."""
        if written is None:
            return
        self._holds += 1
        written.add_done_callback(self._unhold)

    def _unhold(self, _: asyncio.Future[Any]) -> None:
        self._holds -= 1
        if self._holds or not self._held:
            return
        held, self._held = self._held, bytearray()
        self._out += held
        if not self._send_scheduled and not self._writing and self.state is not State.CLOSED:
            self._send_scheduled = True
            self.loop.call_soon(self._send)

    def _published(self, topic: str, n: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + n
        self.write(frames.response())

    @property
    def publisher(self) -> str:
        return str(self.identity.get("srtm_publisher") or self.identity.get("client_id") or "")

    @property
    def _publisher(self) -> str | None:
        """Who published what this connection sends; None: the publisher each message's
        measurement header names (a workload emulator multiplexes many on one connection)."""
        if self.identity.get("srtm_header_publisher") is True:
            return None
        return self.publisher

    def _identify(self, config: dict[str, Any]) -> None:
        if self.state is not State.INIT:
            raise ProtocolError(errors.E_INVALID, "cannot IDENTIFY in current state")
        self.identity = config
        opts = self.broker.options
        limits = opts.limits
        heartbeat = config.get("heartbeat_interval", 0)
        if isinstance(heartbeat, int) and heartbeat != 0:
            if heartbeat == -1:
                self.heartbeat_ns = 0
            elif 1000 <= heartbeat <= 60_000:
                self.heartbeat_ns = heartbeat * 1_000_000
            else:
                raise ProtocolError(
                    errors.E_BAD_BODY, f"IDENTIFY heartbeat interval ({heartbeat}) is invalid"
                )
            self._arm_heartbeat()
        timeout = config.get("msg_timeout", 0)
        if isinstance(timeout, int) and timeout != 0:
            if not limits.min_msg_timeout_ms <= timeout <= limits.max_msg_timeout_ms:
                raise ProtocolError(
                    errors.E_BAD_BODY,
                    f"IDENTIFY msg timeout ({timeout}) is invalid",
                )
            self.msg_timeout_ns = timeout * 1_000_000
        if not config.get("feature_negotiation"):
            self.write(frames.response())
            return
        tls_v1 = (
            config.get("tls_v1") is True
            and self.broker.tls_context is not None
            and self.tls is None
        )  # a second IDENTIFY does not upgrade twice
        reply = {
            "max_rdy_count": limits.max_rdy_count,
            "version": self.broker.version,
            "max_msg_timeout": limits.max_msg_timeout_ms,
            "msg_timeout": self.msg_timeout_ns // 1_000_000,
            "tls_v1": tls_v1,
            "deflate": False,
            "deflate_level": 6,
            "max_deflate_level": 6,
            "snappy": False,
            "sample_rate": 0,
            "auth_required": self.broker.authenticator is not None,
            "output_buffer_size": 16384,
            "output_buffer_timeout": 250,
            # SRTM's own (clients ignore fields they do not know): which broker this is,
            # so subscriber-side trace rows join broker-side ones on (run, broker, msg_id).
            "srtm_broker_id": str(self.broker.options.broker_id),
            # nsqd does not say it; a client that knows it refuses a too-big body itself
            # instead of being disconnected for it.
            "srtm_max_msg_size": limits.max_msg_size,
        }
        self.write(frames.response(json.dumps(reply).encode()))
        if tls_v1:
            self._start_tls()

    def _sub(self, topic: str, channel: str) -> None:
        if self.state is not State.INIT:
            raise ProtocolError(errors.E_INVALID, "cannot SUB in current state")
        if self.heartbeat_ns == 0:
            raise ProtocolError(errors.E_INVALID, "cannot SUB with heartbeats disabled")
        self.channel = self.broker.subscribe(topic, channel, self)
        self.state = State.SUBSCRIBED
        self.write(frames.response())

    def _rdy(self, count: int) -> None:
        if self.state is State.CLOSING:
            return  # nsqd ignores RDY once the client said CLS
        if self.state is not State.SUBSCRIBED:
            raise ProtocolError(errors.E_INVALID, "cannot RDY in current state")
        if self._paused:
            self._rdy_wanted = count  # in force once its output has drained
            return
        self.rdy = count
        if self.channel is not None:
            self.broker.mark_ready(self.channel)

    def _settle(self, mid: bytes, name: str, action: Any) -> None:
        if self.state not in (State.SUBSCRIBED, State.CLOSING) or self.channel is None:
            raise ProtocolError(errors.E_INVALID, f"cannot {name} in current state")
        try:
            action(self.channel)
        except DeliveryError as exc:
            shown = mid.decode(errors="replace")
            raise ProtocolError(f"E_{name}_FAILED", f"{name} {shown} failed {exc}") from None
        self.broker.mark_ready(self.channel)

    # -- writing -------------------------------------------------------------------------
    def send_message(self, msg: Message) -> None:
        self.message_count += 1
        self.write(message_frame(msg.timestamp_ns, msg.attempts, msg.id, msg.body))

    def rtt_ns(self) -> int:
        """The connection's round-trip time from the kernel (0 where unknown): the minimum
        seen, where the kernel reports it, since the smoothed one counts delayed ACKs of
        sparse traffic (milliseconds on loopback)."""
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 152)
        except (OSError, AttributeError):
            return 0
        for offset in (_TCPI_MIN_RTT_OFFSET, _TCPI_RTT_OFFSET):
            if len(info) >= offset + 4:
                (rtt_us,) = _TCPI_U32.unpack_from(info, offset)
                if rtt_us:
                    return int(rtt_us) * 1_000
        return 0

    @property
    def takes_orders(self) -> bool:
        """Whether it negotiated SRTM's order frames in IDENTIFY."""
        return self.identity.get("srtm_orders") is True

    def send_order(self, order: dict[str, Any]) -> None:
        self.write(frames.frame(frames.FrameType.SRTM, json.dumps(order).encode()))
        self.send_now()

    def send_error(self, err: ProtocolError) -> None:
        self.write(frames.error(err))
        if err.fatal and not self._close_when_flushed:
            self._close_when_flushed = True
            fd = self.sock.fileno()
            if fd >= 0:
                self.loop.remove_reader(fd)  # nothing read after it is executed

    def write(self, data: bytes) -> None:
        """Queue ``data``; everything written in one loop turn leaves in one send."""
        if self.state is State.CLOSED:
            return
        if self.tls is not None:
            data = self.tls.wrap(data)  # ciphertext, with any handshake bytes due
        if self._holds:
            self._held += data  # behind an OK that waits for its write
            if len(self._out) + len(self._held) >= self._out_high and not self._paused:
                self._pause()
            return
        self._out += data
        if len(self._out) >= self._out_high and not self._paused:
            self._pause()
        if not self._send_scheduled and not self._writing:
            self._send_scheduled = True
            self.loop.call_soon(self._send)

    def send_now(self) -> None:
        """Send what is queued now rather than at the end of the loop turn."""
        if self._send_scheduled:
            self._send()

    def _send(self) -> None:
        self._send_scheduled = False
        if self.state is State.CLOSED or self._writing or not self._out:
            return
        self._on_writable()
        if self._out and not self.closed:
            self._writing = True
            self.loop.add_writer(self.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self._out[:sent]
        self._sent_bytes += sent
        if self._paused and len(self._out) <= self._out_low:
            self._resume()
        if self._out:
            return
        if self._writing:
            self.loop.remove_writer(self.sock.fileno())
            self._writing = False
        if self._close_when_flushed and not self._holds:  # else after what is held
            self._linger()

    def _linger(self) -> None:
        """After the last frame of a fatal error: stop writing, then read and discard
        what the client still sends until it closes (or _LINGER_S pass), so its kernel
        gets our FIN; closing with unread bytes sends a reset, which makes the client's
        kernel drop the error frame it has not read yet."""
        if self.state is State.CLOSED or self._lingering is not None:
            return
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close()
            return
        self.loop.add_reader(self.sock.fileno(), self._discard)
        self._lingering = self.loop.call_later(_LINGER_S, self.close)

    def _discard(self) -> None:
        try:
            data = self.sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()

    # -- liveness ------------------------------------------------------------------------
    def _arm_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self.heartbeat_ns:
            self._heartbeat = self.loop.call_later(self.heartbeat_ns / 1e9, self._beat)

    def _beat(self) -> None:
        if self.state is State.CLOSED:
            return
        if time.time_ns() - self.last_read_ns > 2 * self.heartbeat_ns:
            self.close()  # silent for two intervals: gone
            return
        self.write(frames.response(HEARTBEAT))
        self._arm_heartbeat()

    # -- bounds: output buffer, read and write deadlines ------------------------------------
    def _init_limits(self, opts: BrokerOptions) -> None:
        high = opts.max_output_buffer_bytes
        self._out_high = high if high > 0 else sys.maxsize
        self._out_low = self._out_high // 2
        #: Over the output high-water mark: its socket is not read and it gets no messages
        #: (RDY 0, the one it asked for kept in ``_rdy_wanted``) until below the low one.
        self._paused = False
        self._rdy_wanted = 0
        #: How often it was paused so (for tests and diagnostics).
        self.output_pauses = 0
        self._read_timeout_ns = opts.read_timeout_ms * 1_000_000
        self._write_timeout_ns = opts.write_timeout_ms * 1_000_000
        self._sent_bytes = 0
        #: Bytes sent at the last deadline check, and since when nothing more was.
        self._sent_seen = 0
        self._stalled_since_ns = 0
        #: When the first byte of a command still incomplete arrived (0: none pending).
        self._partial_since_ns = 0

    def _note_partial(self, completed: bool, now: int) -> None:
        """After a read: does a command wait for more bytes, and since when? A read that
        completed commands started whatever is left over."""
        if not _incomplete(self.parser):
            self._partial_since_ns = 0
        elif completed or not self._partial_since_ns:
            self._partial_since_ns = now

    def _pause(self) -> None:
        self._paused = True
        self.output_pauses += 1
        self._rdy_wanted, self.rdy = self.rdy, 0
        fd = self.sock.fileno()
        if fd >= 0 and not self._close_when_flushed:
            self.loop.remove_reader(fd)

    def _resume(self) -> None:
        self._paused = False
        if self.state is State.SUBSCRIBED:
            self.rdy = self._rdy_wanted
        if self.state is State.CLOSED or self._close_when_flushed:
            return
        # Its command could not progress while it was not read: the deadline restarts.
        self._partial_since_ns = time.time_ns() if _incomplete(self.parser) else 0
        if self.gate is None or not self.gate.waiting:  # else AUTH resumes reading
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
        if self.channel is not None and self.rdy:
            self.broker.mark_ready(self.channel)

    def check_deadlines(self, now: int) -> None:
        """Called about every second: close a connection whose pending output made no
        progress for the write timeout, or whose current command is not complete within
        the read timeout."""
        if self.state is State.CLOSED:
            return
        if not self._out:
            self._stalled_since_ns = 0
        elif self._sent_bytes != self._sent_seen or not self._stalled_since_ns:
            self._sent_seen = self._sent_bytes
            self._stalled_since_ns = now
        elif self._write_timeout_ns and now - self._stalled_since_ns >= self._write_timeout_ns:
            log.warning(
                "closing %s: %d bytes pending, none written for %d ms",
                self.remote,
                len(self._out),
                self._write_timeout_ns // 1_000_000,
            )
            self.close()
            return
        since = self._partial_since_ns
        if (
            since
            and self._read_timeout_ns
            and not self._paused
            and not self._close_when_flushed
            and now - since >= self._read_timeout_ns
        ):
            ms = self._read_timeout_ns // 1_000_000
            log.warning("closing %s: a command still incomplete after %d ms", self.remote, ms)
            self.send_error(ProtocolError(errors.E_INVALID, f"command incomplete after {ms} ms"))
            self._send()
            self.close()  # whether or not the error frame left: its partial command goes

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def close(self) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._lingering is not None:
            self._lingering.cancel()
        if self.gate is not None:
            self.gate.close()
        if self.tls is not None and not self._out:
            # Best effort, as a closing TLS peer does (not after unsent records: it would
            # arrive out of sequence).
            with contextlib.suppress(OSError):
                self.sock.send(self.tls.close_notify())
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
            if self._writing:
                self.loop.remove_writer(fd)
        self.sock.close()
        self.broker.disconnected(self)

    # -- TLS and the gate (srtm.broker.tls, srtm.broker.auth) -----------------------------
    def _start_tls(self) -> None:
        """Upgrade after IDENTIFY's plain-text reply, as nsqd: the client starts the
        handshake, nsqd's OK follows it over TLS; a handshake not done in time ends it."""
        from srtm.broker.tls import TlsSession

        assert self.broker.tls_context is not None
        self.tls = TlsSession(self.broker.tls_context)
        self.write(frames.response())
        timeout_s = self.broker.options.tls_handshake_timeout_ms / 1000
        self.loop.call_later(timeout_s, self._tls_deadline)

    def _tls_deadline(self) -> None:
        if self.tls is not None and not self.tls.established and not self.closed:
            log.info("TLS handshake from %s not done in time", self.remote)
            self.close()

    def _tls_receive(self, data: bytes) -> bytes:
        """Ciphertext read → plaintext for the parser; what TLS must answer is sent."""
        assert self.tls is not None
        try:
            plain = self.tls.receive(data)
        except ssl.SSLError as exc:
            log.info("TLS with %s ended: %s", self.remote, exc)
            self.close()
            return b""
        self.write(b"")
        if self.tls.peer_closed and not self._close_when_flushed:
            self._close_when_flushed = True  # its close_notify answered, then closed
            self.loop.remove_reader(self.sock.fileno())
            if not self._out and not self._holds:
                self.close()
        return plain

    @property
    def finishing(self) -> bool:
        """Closed, or closing after a fatal error: nothing more is read or run."""
        return self.state is State.CLOSED or self._close_when_flushed

    def hold_reads(self) -> None:
        fd = self.sock.fileno()
        if fd >= 0 and not self.finishing:
            self.loop.remove_reader(fd)

    def release_reads(self) -> None:
        if not self.finishing and not self._paused:  # paused: the output drain resumes
            # What waited in the socket meanwhile was the broker's delay, not silence.
            self.last_read_ns = time.time_ns()
            self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def respond(self, body: bytes) -> None:
        self.write(frames.response(body))

    def run(self, event: object, arrival: int) -> None:
        """Run a command just read, or one the gate held back (read earlier, in order)."""
        if isinstance(event, ProtocolError):
            self.send_error(event)
            return
        try:
            self._handle(event, arrival)
        except ProtocolError as err:
            self.send_error(err)
        except Exception:
            # A broker bug costs this client its connection, not the whole loop.
            log.exception("internal error on %s from %s", type(event).__name__, self.remote)
            self.send_error(ProtocolError(errors.E_INVALID, "internal error"))
