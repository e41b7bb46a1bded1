"""One client connection: socket bytes → parser → session (srtm.protocol) → frames back.

The NSQ session rules (states, IDENTIFY, SUB, RDY, FIN/REQ/TOUCH, CLS, heartbeats, error
codes) are ``srtm.protocol.session``'s; ``Client`` keeps the socket, TLS and compression,
the consumer's side (RDY, FIN/REQ/TOUCH, message frames), heartbeats and deadlines, and
carries out what the session asks of it on the broker (``BrokerPort``: this module does
not import the broker itself). What it reads is run by its ``srtm.broker.intake.Intake``
(the publisher's side: turns, slices, blocks); what it writes leaves through its
``srtm.broker.output.Output``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from srtm.broker.auth import Authenticator, Gate
from srtm.broker.intake import Intake, ReleaseClock
from srtm.broker.output import Output
from srtm.broker.queue import PUBLISH_SLICE, Record
from srtm.broker.shared import SUB_REFUSED
from srtm.broker.sockio import SO_TIMESTAMPNS
from srtm.broker.state import DeliveryError
from srtm.broker.tls import tcp_requires_tls
from srtm.protocol import Parser, ProtocolError, errors, frames
from srtm.protocol.frames import MESSAGE_HEAD as _MESSAGE_HEAD
from srtm.protocol.session import Keys, Session, SessionSettings, SessionState

if TYPE_CHECKING:
    from srtm.broker.busypoll import BusyPoll
    from srtm.broker.closer import Closer
    from srtm.broker.handoff import Handoffs
    from srtm.broker.options import BrokerOptions
    from srtm.broker.state import Channel
    from srtm.broker.stats import BrokerStats
    from srtm.broker.tls import TlsSession

log = logging.getLogger("srtm.broker")

#: struct tcp_info (Linux >= 4.6): tcpi_rtt (µs) at byte 68, tcpi_min_rtt at byte 148.
_TCPI_U32 = struct.Struct("I")
_TCPI_RTT_OFFSET = 68
_TCPI_MIN_RTT_OFFSET = 148
_CLOSED = SessionState.CLOSED
_MESSAGE = int(frames.FrameType.MESSAGE)
#: What a message frame's size counts beyond its body: type, timestamp, attempts, id.
_MESSAGE_OVERHEAD = 30
#: Connections whose deadlines are checked per loop turn: a pass over 2,000 in one go
#: held the loop for 2-7 ms every second, and the PUBs waiting then for it.
DEADLINES_PER_TURN = 64


def frame_records_py(out: bytearray, records: list[Record]) -> None:
    """Append a MESSAGE frame per record to ``out`` (as queued: each is now on attempt
    ``attempts + 1``)."""
    pack = _MESSAGE_HEAD.pack
    for r in records:
        body = r[1]
        out += pack(len(body) + _MESSAGE_OVERHEAD, _MESSAGE, r[2], r[5] + 1, r[0])
        out += body


_c_frame_records: Callable[[bytearray, list[Record]], None] | None
try:
    from srtm.broker._frames import frame_records as _c_frame_records
except ImportError:  # not built (no compiler at install): framed in Python
    _c_frame_records = None


def frame_records(out: bytearray, records: list[Record]) -> None:
    """``frame_records_py``, in C where ``srtm.broker._frames`` was built (at install)."""
    if _c_frame_records is not None:
        try:
            _c_frame_records(out, records)
            return
        except (TypeError, OverflowError):  # a record it does not take: ``out`` unchanged
            pass
    frame_records_py(out, records)


def deflate_stream(
    level: int, broken: Callable[[Exception], bytes]
) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """Raw DEFLATE (compress, decompress), as nsqd's flate stream: each write is
    sync-flushed, so a frame never waits in the compressor; what does not decode is
    ``broken``'s."""
    deflate = zlib.compressobj(level, zlib.DEFLATED, -15)
    sync = zlib.Z_SYNC_FLUSH

    def compress(data: bytes) -> bytes:
        return deflate.compress(data) + deflate.flush(sync) if data else data

    inflate = zlib.decompressobj(-15)

    def decompress(data: bytes) -> bytes:
        try:
            plain: bytes = inflate.decompress(data)
        except zlib.error as exc:
            return broken(exc)
        return plain

    return compress, decompress


def snappy_stream(
    broken: Callable[[Exception], bytes],
) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """Snappy's framing format (compress, decompress), as nsqd's (golang/snappy's)
    stream: each write is flushed as whole chunks; what does not decode is ``broken``'s."""
    from srtm.broker.snappy import SnappyError, SnappyReader, SnappyWriter

    reader = SnappyReader()

    def decompress(data: bytes) -> bytes:
        try:
            return reader.feed(data)
        except SnappyError as exc:
            return broken(exc)

    return SnappyWriter().write, decompress


class BrokerPort(Protocol):
    """What a Client needs of the broker (srtm.broker.broker.Broker is one)."""

    @property
    def options(self) -> BrokerOptions: ...

    @property
    def version(self) -> str: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def deadline_watch(self) -> dict[Client, None]: ...

    @property
    def busy_poll(self) -> BusyPoll: ...

    @property
    def closer(self) -> Closer: ...

    @property
    def releaser(self) -> ReleaseClock: ...

    @property
    def tls_context(self) -> ssl.SSLContext | None: ...

    @property
    def authenticator(self) -> Authenticator | None: ...

    @property
    def keys(self) -> Keys: ...

    def publish(
        self,
        topic_name: str,
        bodies: Iterable[bytes],
        arrival: int,
        publisher: str | None,
        client: Client | None = None,
    ) -> asyncio.Future[Any] | None: ...

    def publish_one(
        self, topic_name: str, body: bytes, arrival: int, publisher: str | None
    ) -> bool: ...

    def account_one(self) -> None:
        """Count what the last ``publish_one`` kept (after its OK's send)."""
        ...

    def publish_deferred(
        self,
        topic_name: str,
        body: bytes,
        defer_ms: int,
        arrival: int,
        publisher: str | None,
        client: Client | None = None,
    ) -> asyncio.Future[Any] | None: ...

    def subscribe(self, topic_name: str, channel_name: str, client: Client) -> Channel: ...

    @property
    def handoffs(self) -> Handoffs: ...

    def mark_ready(self, channel: Channel) -> None: ...

    def release_due(self) -> bool:
        """Release shaped messages that are due; whether any still wait."""
        ...

    def takes_runs(self, topic_name: str) -> bool:
        """Whether a read's run of PUBs to the topic may be one publish."""
        ...

    def disconnected(self, client: Client) -> None: ...


def enable_kernel_timestamps(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


async def check_deadlines(watched: dict[Client, None]) -> None:
    """``Client.check_deadlines`` of each watched connection, ``DEADLINES_PER_TURN`` a loop
    turn; one with nothing a deadline bounds any more leaves ``watched`` (it comes back
    through ``Client.watch_deadlines``). Every connection, each second, was 5-9 µs each
    (cold objects): 7-12 ms of the loop a second with 2,000 idle sensors."""
    batch = list(watched)
    for k in range(0, len(batch), DEADLINES_PER_TURN):
        if k:
            await asyncio.sleep(0)
        now = time.time_ns()
        for client in batch[k : k + DEADLINES_PER_TURN]:
            if not client.check_deadlines(now):
                watched.pop(client, None)


async def deadline_loop(
    read_timeout_ms: int, write_timeout_ms: int, watched: dict[Client, None]
) -> None:
    """Close connections whose writes or partly received commands stalled too long: the
    watched ones checked four times per shortest timeout, at least once a second."""
    timeouts = [t for t in (read_timeout_ms, write_timeout_ms) if t > 0]
    if not timeouts:
        return
    interval = min(1.0, min(timeouts) / 4000)
    while True:
        await asyncio.sleep(interval)
        await check_deadlines(watched)


def session_settings(broker: BrokerPort) -> SessionSettings:
    opts = broker.options
    return SessionSettings(
        limits=opts.limits,
        heartbeat_interval_ms=opts.heartbeat_interval_ms,
        msg_timeout_ms=opts.msg_timeout_ms,
        version=broker.version,
        broker_id=str(opts.broker_id),
        tls=broker.tls_context is not None,
        auth=broker.authenticator is not None,
        keys=broker.keys,
    )


class Client:
    """A connected NSQ client (a publisher, a consumer, or both): the ``SessionHost`` its
    session answers through. What it reads is run by its ``Intake``, what it writes
    leaves through its ``Output``; the session's orders on the broker are carried out
    here."""

    def __init__(
        self, broker: BrokerPort, sock: socket.socket, kernel_timestamps: bool, shared: bool = False
    ) -> None:
        self.broker = broker
        self.sock = sock
        #: Dealt by the node from its shared address: a publisher's (SUB is refused).
        self.shared = shared
        self.loop = asyncio.get_running_loop()
        opts = broker.options
        self.parser = Parser(opts.limits, batch_fins=True)
        self.session = Session(self, session_settings(broker))
        #: Read by the channel for every message it dispatches: plain attributes.
        self.rdy = 0
        self.in_flight = 0
        self.msg_timeout_ns = self.session.msg_timeout_ns
        self.channel: Channel | None = None
        self.connected_ns = time.time_ns()
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        #: Refreshed every second by the broker (TCP_INFO), for latency estimates.
        self.rtt_cache_ns = 0
        self.kernel_timestamps = kernel_timestamps and enable_kernel_timestamps(sock)
        host, port = sock.getpeername()[:2]
        self.remote = f"{host}:{port}"
        self.output = Output(
            sock, self.loop, self.session, opts.max_output_buffer_bytes, opts.write_timeout_ms,
            self.remote, self,
        )  # fmt: skip
        #: The session's frames go straight to the output (an OK per PUB: no call between).
        self.write = self.output.write
        #: Over the output's high-water mark it gets no messages (RDY 0, the one it asked
        #: for kept in ``_rdy_wanted``) and is not read; how often (tests, diagnostics).
        self._rdy_wanted = 0
        self.output_pauses = 0
        self._heartbeat: asyncio.TimerHandle | None = None
        #: TLS once IDENTIFY asked for it; the gate (--tls-required, AUTH) where configured.
        self.tls: TlsSession | None = None
        #: Ends a TLS handshake not done in time (cancelled at close: it holds the client).
        self._tls_timer: asyncio.TimerHandle | None = None
        #: Decompresses what is read once deflate or snappy is on ("" once the stream broke).
        self._inflate: Callable[[bytes], bytes] | None = None
        self.gate: Gate | None = None
        if broker.tls_context is not None or broker.authenticator is not None:
            self.gate = Gate(self, tcp_requires_tls(opts), broker.authenticator, broker.keys)
        self.intake = Intake(
            self, broker, sock, self.session, self.parser, self.gate, self.output,
            opts.read_timeout_ms,
        )  # fmt: skip
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop.add_reader(sock.fileno(), self.intake.on_readable)
        self._arm_heartbeat()

    # -- the session's view ----------------------------------------------------------------
    @property
    def state(self) -> SessionState:
        return self.session.state

    @property
    def identity(self) -> dict[str, Any]:
        return self.session.identity

    @property
    def heartbeat_ns(self) -> int:
        return self.session.heartbeat_ns

    @property
    def publisher(self) -> str:
        return self.session.publisher

    @property
    def consumer_class(self) -> str:
        """Its class for admission control (IDENTIFY ``srtm_class``, else ``default``)."""
        return self.session.consumer_class

    @property
    def relay(self) -> bool:
        """Whether it is another broker's relay link (IDENTIFY ``srtm_relay``, proven)."""
        return self.session.relay

    def granted(self, operator: bool, relay: bool, klass: str | None) -> None:
        """The gate's AUTH proved an identity (srtm.broker.auth)."""
        self.session.granted(operator, relay, klass)

    @property
    def sent_bytes(self) -> int:
        """Bytes sent on its socket so far (the broker's egress; counted per send, not
        per message)."""
        return self.output.sent_bytes

    @property
    def takes_orders(self) -> bool:
        """Whether it negotiated SRTM's order frames in IDENTIFY."""
        return self.session.takes_orders

    @property
    def last_read_ns(self) -> int:
        """When it was last read (or the broker's delay in reading it ended)."""
        return self.intake.last_read_ns

    # -- what the session asks (srtm.protocol.session.SessionHost) ---------------------------
    def publish(self, topic: str, bodies: list[bytes], arrival_ns: int) -> None:
        written = self.broker.publish(topic, bodies, arrival_ns, self.session.attributed_to, self)
        if written is not None:
            self.output.hold_until(written)
            if len(bodies) > PUBLISH_SLICE:
                self.intake.run_after(written)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)

    def publish_one(self, topic: str, body: bytes, arrival_ns: int) -> bool:
        if not self.broker.publish_one(topic, body, arrival_ns, self.session.attributed_to):
            return False
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + 1
        return True

    def publish_deferred(self, topic: str, body: bytes, defer_ms: int, arrival_ns: int) -> None:
        written = self.broker.publish_deferred(
            topic, body, defer_ms, arrival_ns, self.session.attributed_to, self
        )
        if written is not None:  # written to disk, or relayed: OK once done
            self.output.hold_until(written)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + 1

    def subscribe(self, topic: str, channel: str) -> None:
        if self.shared:
            raise ProtocolError(errors.E_INVALID, SUB_REFUSED)
        self.channel = self.broker.subscribe(topic, channel, self)

    def handoff(self, topic: str, token: str) -> None:
        self.broker.handoffs.take(topic, token)

    def ready(self, count: int) -> None:
        if self.output.paused:
            self._rdy_wanted = count  # in force once its output has drained
            return
        self.rdy = count
        if self.channel is not None:
            self.broker.mark_ready(self.channel)

    def finish(self, message_id: bytes) -> str | None:
        channel = self.channel
        assert channel is not None  # subscribed: the session says FIN only then
        try:
            channel.fin(message_id, self)
        except DeliveryError as exc:
            return str(exc)
        self.finish_count += 1
        self.broker.mark_ready(channel)
        return None

    def finish_many(self, message_ids: list[bytes]) -> list[tuple[bytes, str]]:
        """``finish`` of each, in order, the channel dispatched once; the ones that failed
        and why."""
        channel = self.channel
        assert channel is not None
        failed = channel.fin_many(message_ids, self)
        self.finish_count += len(message_ids) - len(failed)
        self.broker.mark_ready(channel)
        return failed

    def requeue(self, message_id: bytes, delay_ns: int) -> str | None:
        channel = self.channel
        assert channel is not None
        try:
            channel.req(message_id, self, delay_ns, time.time_ns())
        except DeliveryError as exc:
            return str(exc)
        self.requeue_count += 1
        self.broker.mark_ready(channel)
        return None

    def touch(self, message_id: bytes) -> str | None:
        channel = self.channel
        assert channel is not None
        try:
            channel.touch(message_id, self, time.time_ns())
        except DeliveryError as exc:
            return str(exc)
        self.broker.mark_ready(channel)
        return None

    def negotiated(self, heartbeat_changed: bool) -> None:
        self.msg_timeout_ns = self.session.msg_timeout_ns
        if heartbeat_changed:
            self._arm_heartbeat()

    def start_tls(self) -> None:
        """Upgrade after IDENTIFY's plain-text reply, as nsqd: the client starts the
        handshake; a handshake not done in time ends the connection."""
        from srtm.broker.tls import TlsSession

        assert self.broker.tls_context is not None
        self.tls = TlsSession(self.broker.tls_context)
        self.output.wrap = self.tls.wrap
        self.intake.unwrap = self._unwrap
        timeout_s = self.broker.options.tls_handshake_timeout_ms / 1000
        self._tls_timer = self.loop.call_later(timeout_s, self._tls_deadline)

    def start_deflate(self, level: int) -> None:
        """Raw DEFLATE both ways, as nsqd's flate stream (inside TLS where both are on)."""
        self._compress(*deflate_stream(level, lambda exc: self._broken("deflate", exc)))

    def start_snappy(self) -> None:
        """Snappy's framing format both ways, as nsqd's (golang/snappy's) stream, inside
        TLS where both are on."""
        self._compress(*snappy_stream(lambda exc: self._broken("snappy", exc)))

    def _compress(
        self, compress: Callable[[bytes], bytes], decompress: Callable[[bytes], bytes]
    ) -> None:
        """Writes go through ``compress`` (then TLS, if on), reads (after TLS) through
        ``decompress``, from now on."""
        inner = self.output.wrap

        def wrap(data: bytes) -> bytes:
            data = compress(data)
            return inner(data) if inner is not None else data

        self.output.wrap = wrap
        self._inflate = decompress
        self.intake.unwrap = self._unwrap

    def _unwrap(self, data: bytes) -> bytes:
        """What was read → what the parser gets (b"": nothing yet, or the stream ended)."""
        if self.tls is not None and not (data := self._tls_receive(data)):
            return data
        if self._inflate is not None:
            return self._inflate(data)
        return data

    def _broken(self, kind: str, exc: Exception) -> bytes:
        """A compressed stream that does not decode ends the connection without an answer,
        as nsqd's read error does."""
        log.info("%s stream from %s broken: %s", kind, self.remote, exc)
        self.close()
        return b""

    def sample(self, rate: int) -> None:
        """nsqd's sample_rate: only this connection pays for it (its own send_records)."""
        if rate:
            setattr(self, "send_records", self._send_sampled)  # noqa: B010
        else:
            self.__dict__.pop("send_records", None)

    def _send_sampled(self, records: list[Record]) -> None:
        """Send each message when randint(0, 99) <= the rate, as nsqd; else it is dropped,
        as nsqd drops it (finished without delivery), and the consumer's RDY slot is free."""
        rate = self.session.sample_rate
        kept = [r for r in records if random.randrange(100) <= rate]
        if kept:
            Client.send_records(self, kept)
        channel = self.channel
        if len(kept) == len(records) or channel is None:
            return
        dropped = {r[0] for r in records} - {r[0] for r in kept}
        for mid in dropped:
            channel.fin(mid, self)
        self.broker.mark_ready(channel)

    # -- writing -------------------------------------------------------------------------
    def send_records(self, records: list[Record]) -> None:
        """Message frames for ``records`` (as queued: each is now on attempt
        ``attempts + 1``), built straight into the output buffer where nothing (TLS,
        compression, a held publish) stands between, else in one ``write``."""
        self.message_count += len(records)
        if self.session.state is _CLOSED:
            return
        out = self.output
        if out.wrap is not None or out.holds:
            frames_ = bytearray()
            frame_records(frames_, records)
            out.write(bytes(frames_))
            return
        frame_records(out.buf, records)
        out.queued()

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

    def send_order(self, order: dict[str, Any]) -> None:
        self.write(frames.frame(frames.FrameType.SRTM, json.dumps(order).encode()))
        self.output.send_now()

    def send_now(self) -> None:
        """Send what is queued now rather than at the end of the loop turn."""
        self.output.send_now()

    def send_error(self, err: ProtocolError) -> None:
        self.write(frames.error(err))
        if err.fatal and not self.output.closing:
            self.output.closing = True
            fd = self.sock.fileno()
            if fd >= 0:
                self.loop.remove_reader(fd)  # nothing read after it is executed
            # Nothing is sent after the error either: a consumer gets no more messages
            # (what it has in flight times out, as at close).
            if self.channel is not None:
                self.channel.remove_consumer(self)

    def evict(self, err: ProtocolError) -> None:
        """Disconnect a consumer its class no longer admits: it gets no more messages,
        then ``err`` (fatal), then the connection closes."""
        self.rdy = 0
        self.send_error(err)

    def respond(self, body: bytes) -> None:
        self.write(frames.response(body))

    # -- liveness ------------------------------------------------------------------------
    def _arm_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self.heartbeat_ns:
            self._heartbeat = self.loop.call_later(self.heartbeat_ns / 1e9, self._beat)

    def _beat(self) -> None:
        if self.closed:
            return
        now = time.time_ns()
        # Not read while blocked: the broker's doing, not the client's silence.
        intake = self.intake
        frame = self.session.beat(now, now if intake.blocked else intake.last_read_ns)
        if frame is None:
            self.close()  # silent for too long: gone
            return
        self.write(frame)
        self._arm_heartbeat()

    # -- bounds: output back-pressure, deadlines ----------------------------------------------
    def output_paused(self) -> None:
        self.output_pauses += 1
        self._rdy_wanted, self.rdy = self.rdy, 0
        self.intake.stop_reading()

    def output_resumed(self) -> None:
        if self.session.state is SessionState.SUBSCRIBED:
            self.rdy = self._rdy_wanted
        if self.finishing:
            return
        self.intake.resumed()
        if self.channel is not None and self.rdy:
            self.broker.mark_ready(self.channel)

    def watch_deadlines(self) -> None:
        """Something a deadline bounds began (output a send left behind, a command partly
        read): the broker's deadline pass looks at this connection until it is over."""
        self.broker.deadline_watch[self] = None

    def check_deadlines(self, now: int) -> bool:
        """Called about every second while watched: close a connection whose pending output
        made no progress for the write timeout, or whose current command is not complete
        within the read timeout. Whether a deadline still bounds it (False: unwatch)."""
        if self.closed:
            return False
        if self.output.stalled(now):
            self.close()
            return False
        if ms := self.intake.overdue(now):
            log.warning("closing %s: a command still incomplete after %d ms", self.remote, ms)
            self.send_error(ProtocolError(errors.E_INVALID, f"command incomplete after {ms} ms"))
            self.output.send()
            self.close()  # whether or not the error frame left: its partial command goes
            return False
        return bool(self.output.buf) or self.intake.partial

    @property
    def closed(self) -> bool:
        return self.session.state is _CLOSED

    def close(self) -> None:
        if self.closed:
            return
        self.session.close()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._tls_timer is not None:
            self._tls_timer.cancel()
        self.output.stop()
        if self.gate is not None:
            self.gate.close()
        if self.tls is not None and not self.output.buf:
            # Best effort, as a closing TLS peer does (not after unsent records: it would
            # arrive out of sequence).
            with contextlib.suppress(OSError):
                self.sock.send(self.tls.close_notify())
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
        self.sock.close()
        self.broker.disconnected(self)
        if not self.loop.is_closed():
            self.loop.call_soon(self._detach)  # once what runs now (its caller) is done

    def _detach(self) -> None:
        """Its parts let go of it: each refers back to it (and it to a compressed
        stream's callback), so a closed connection would be cyclic garbage that only a
        full collection frees, the loop held meanwhile (``benchmarks/churn.py``'s
        anchor). So reference counting frees it, once nothing else holds it (a message
        in flight to it does until it times out). Whatever runs later finds its parts
        closed."""
        self.session.detach()
        self.output.detach()
        self.intake.detach()
        if self.gate is not None:
            self.gate.detach()
        self._inflate = None

    # -- TLS and the gate (srtm.broker.tls, srtm.broker.auth) -----------------------------
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
        if self.tls.peer_closed and not self.output.closing:
            self.output.closing = True  # its close_notify answered, then closed
            self.loop.remove_reader(self.sock.fileno())
            if not self.output.buf and not self.output.holds:
                self.close()
        return plain

    @property
    def finishing(self) -> bool:
        """Closed, or closing after a fatal error: nothing more is read or run."""
        return self.closed or self.output.closing

    def hold_reads(self) -> None:
        self.intake.stop_reading()

    def release_reads(self) -> None:
        self.intake.release()

    def run(self, event: object, arrival: int) -> None:
        """Run a command the gate held back (read earlier, in order)."""
        self.intake.run(event, arrival)

    # -- policing: a topic over its bound under ``block`` (srtm.ratelimit.overflow) -------------
    @property
    def blocked(self) -> bool:
        return self.intake.blocked

    @property
    def blocks(self) -> int:
        return self.intake.blocks

    def block_reads(self) -> None:
        """Stop reading, and running what was read, until ``unblock_reads``: TCP pushes
        back on the publisher once the socket's buffers fill."""
        self.intake.block()

    def unblock_reads(self) -> None:
        """Read again (unless output back-pressure or AUTH still hold it), and run first
        what was read before the block."""
        self.intake.unblock()
