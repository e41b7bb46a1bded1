"""One client connection: socket bytes → protocol events → broker calls → frames back.

Reads use ``recvmsg`` so each read carries the kernel's receive timestamp
(SO_TIMESTAMPNS); every command completed by a read gets that read's stamp.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import socket
import struct
import time
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
    from srtm.broker.broker import Broker
    from srtm.broker.message import Message
    from srtm.broker.state import Channel

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


class State(enum.Enum):
    INIT = "init"
    SUBSCRIBED = "subscribed"
    CLOSING = "closing"
    CLOSED = "closed"


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
        self._writing = False
        self._send_scheduled = False
        self._close_when_flushed = False
        self._heartbeat: asyncio.TimerHandle | None = None
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
        for i, event in enumerate(self.parser.feed(data)):
            if self.state is State.CLOSED or self._close_when_flushed:
                return  # closed, or a fatal error: nsqd runs nothing after one
            if i & 31 == 31:
                self.broker.release_due()
            if isinstance(event, ProtocolError):
                self.send_error(event)
            else:
                try:
                    self._handle(event, arrival)
                except ProtocolError as err:
                    self.send_error(err)
                except Exception:
                    # A broker bug costs this client its connection, not the whole loop.
                    log.exception("internal error on %s from %s", type(event).__name__, self.remote)
                    self.send_error(ProtocolError(errors.E_INVALID, "internal error"))

    def _handle(self, cmd: object, arrival: int) -> None:
        broker = self.broker
        match cmd:
            case Pub(topic, body):
                broker.publish(topic, [body], arrival, self._publisher)
                self._published(topic, 1)
            case Mpub(topic, bodies):
                broker.publish(topic, bodies, arrival, self._publisher)
                self._published(topic, len(bodies))
            case Dpub(topic, defer_ms, body):
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
        reply = {
            "max_rdy_count": limits.max_rdy_count,
            "version": self.broker.version,
            "max_msg_timeout": limits.max_msg_timeout_ms,
            "msg_timeout": self.msg_timeout_ns // 1_000_000,
            "tls_v1": False,
            "deflate": False,
            "deflate_level": 6,
            "max_deflate_level": 6,
            "snappy": False,
            "sample_rate": 0,
            "auth_required": False,
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
        self._out += data
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
        if self._out:
            return
        if self._writing:
            self.loop.remove_writer(self.sock.fileno())
            self._writing = False
        if self._close_when_flushed:
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

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def close(self) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
            if self._writing:
                self.loop.remove_writer(fd)
        self.sock.close()
        self.broker.disconnected(self)
