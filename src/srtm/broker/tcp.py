"""One client connection: socket bytes → parser → session (srtm.protocol) → frames back.

The NSQ session rules (states, IDENTIFY, SUB, RDY, FIN/REQ/TOUCH, CLS, heartbeats, error
codes) are ``srtm.protocol.session``'s; ``Client`` keeps the socket, TLS, buffers,
back-pressure and timeouts, feeds the session what the parser completes and carries out
what the session asks of it on the broker (``BrokerPort``: this module does not import the
broker itself).

Reads use ``recvmsg`` so each read carries the kernel's receive timestamp
(SO_TIMESTAMPNS); every command completed by a read gets that read's stamp.
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
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from srtm.broker.auth import Authenticator, Gate
from srtm.broker.queue import PUBLISH_SLICE, Record
from srtm.broker.state import DeliveryError
from srtm.broker.tls import tcp_requires_tls
from srtm.protocol import Event, Fins, Parser, ProtocolError, errors, frames
from srtm.protocol.frames import MESSAGE_HEAD as _MESSAGE_HEAD
from srtm.protocol.session import Keys, Session, SessionSettings, SessionState

if TYPE_CHECKING:
    from srtm.broker.handoff import Handoffs
    from srtm.broker.options import BrokerOptions
    from srtm.broker.state import Channel
    from srtm.broker.stats import BrokerStats
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
_CLOSED = SessionState.CLOSED
_MESSAGE = int(frames.FrameType.MESSAGE)
#: What a message frame's size counts beyond its body: type, timestamp, attempts, id.
_MESSAGE_OVERHEAD = 30
#: FINs of a run (``Fins``) run at a time, with due releases looked at in between.
_FIN_CHUNK = 32
#: Commands one connection runs per loop turn (a FIN of a run counting one, as in
#: ``_run_all``): what one read completed beyond it waits for the next turn, and the
#: socket is not read meanwhile, so a flooding connection gets a turn as long as any
#: other's, not 32 KiB of commands (~900 PUBs) per turn. A loop turn more per 64
#: commands costs a busy connection a few per cent at most; MPUBs are few per read.
TURN_BUDGET = 64


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


class BrokerPort(Protocol):
    """What a Client needs of the broker (srtm.broker.broker.Broker is one)."""

    @property
    def options(self) -> BrokerOptions: ...

    @property
    def version(self) -> str: ...

    @property
    def stats(self) -> BrokerStats: ...

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

    def disconnected(self, client: Client) -> None: ...


def enable_kernel_timestamps(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


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
    session answers through."""

    def __init__(self, broker: BrokerPort, sock: socket.socket, kernel_timestamps: bool) -> None:
        self.broker = broker
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.parser = Parser(broker.options.limits, batch_fins=True)
        self.session = Session(self, session_settings(broker))
        #: Read by the channel for every message it dispatches: plain attributes.
        self.rdy = 0
        self.in_flight = 0
        self.msg_timeout_ns = self.session.msg_timeout_ns
        self.channel: Channel | None = None
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
        #: Set while a read is handled: what it writes leaves when it is done, in one send,
        #: not a loop callback later (a synchronous PUB's OK a whole loop turn sooner).
        self._in_read = False
        self._close_when_flushed = False
        #: What the last read completed and this turn's budget left for later, from
        #: ``_pending_at`` (None: nothing), and that read's arrival stamp.
        self._pending: list[Event] | None = None
        self._pending_at = 0
        self._pending_arrival = 0
        #: Not read (nor its pending commands run) while a topic it published to is over
        #: its bound under ``block`` (``block_reads``); how often that happened.
        self._blocked = False
        self.blocks = 0
        self._heartbeat: asyncio.TimerHandle | None = None
        #: A publish taken in slices (``PUBLISH_SLICE``): until it is done, what comes
        #: after it waits in ``_later`` (event, arrival, whether the gate passed it).
        self._taking: asyncio.Future[Any] | None = None
        self._later: deque[tuple[Event, int, bool]] = deque()
        #: Set while closing after a fatal error (see _linger).
        self._lingering: asyncio.TimerHandle | None = None
        self._init_limits(broker.options)
        #: TLS once IDENTIFY asked for it; the gate (--tls-required, AUTH) where configured.
        self.tls: TlsSession | None = None
        #: What every write goes through once TLS or compression is on (None: as it is).
        self._wrap: Callable[[bytes], bytes] | None = None
        #: Decompresses what is read once deflate or snappy is on ("" once the stream broke).
        self._inflate: Callable[[bytes], bytes] | None = None
        self.gate: Gate | None = None
        if broker.tls_context is not None or broker.authenticator is not None:
            self.gate = Gate(
                self, tcp_requires_tls(broker.options), broker.authenticator, broker.keys
            )
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop.add_reader(sock.fileno(), self._on_readable)
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
        return self._sent_bytes

    @property
    def takes_orders(self) -> bool:
        """Whether it negotiated SRTM's order frames in IDENTIFY."""
        return self.session.takes_orders

    # -- reading -------------------------------------------------------------------------
    def _on_readable(self) -> None:
        if self._pending:
            return  # what the last read completed runs first (``_run_pending``)
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
        if self._inflate is not None and not (data := self._inflate(data)):
            return
        events = self.parser.feed(data)
        self._note_partial(bool(events), user_ns)
        self._run_turn(events, 0, arrival)

    def _run_turn(self, events: list[Event], start: int, arrival: int) -> None:
        """Run ``events[start:]`` up to this turn's budget; the rest waits for the next
        turn (``_run_pending``), or for the topic to be within its bound where its
        publishes block this connection."""
        self._in_read = True
        try:
            done = self._run_all(events, start, arrival)
        finally:
            self._in_read = False
            if self._send_scheduled:
                self._send()
        if done < len(events) and not self.finishing:
            self._pending, self._pending_at, self._pending_arrival = events, done, arrival
            if not self._blocked:
                self.loop.call_soon(self._run_pending)
        else:
            self._pending = None

    def _run_pending(self) -> None:
        events = self._pending
        if events is None or self._blocked or self.finishing:
            return
        self._run_turn(events, self._pending_at, self._pending_arrival)

    def _run_all(self, events: list[Event], start: int, arrival: int) -> int:
        """Run what one read completed, in order, from ``start``, until ``TURN_BUDGET``
        commands ran or a publish blocked the connection; how far it got. Due shaped
        releases are looked at every 32 commands, a FIN of a run (``Fins``, one per
        message a consumer got) counting as one: while releases wait, a long run is run
        32 FINs at a time (else at once: FINs release nothing)."""
        gate = self.gate
        work = 0
        check = 32
        end = min(len(events), start + TURN_BUDGET)
        for i in range(start, end):
            if self._blocked:
                return i
            event = events[i]
            if (
                type(event) is Fins
                and len(ids := event.message_ids) > _FIN_CHUNK
                and self.broker.release_due()
            ):
                for k in range(0, len(ids), _FIN_CHUNK):
                    if work >= check:
                        check = work + 32
                        self.broker.release_due()
                    if self.session.state is _CLOSED or self._close_when_flushed:
                        return len(events)  # closed, or a fatal error: nothing after it
                    self._run_one(Fins(ids[k : k + _FIN_CHUNK]), arrival, gate)
                    work += _FIN_CHUNK
                continue
            if work >= check:
                check = work + 32
                self.broker.release_due()
            if self.session.state is _CLOSED or self._close_when_flushed:
                return len(events)
            self._run_one(event, arrival, gate)
            work += len(event.message_ids) if type(event) is Fins else 1
            if self._taking is not None:  # the rest runs once it is taken
                self._later.extend((e, arrival, False) for e in events[i + 1 :])
                return len(events)
        return end

    def _run_one(self, event: Event, arrival: int, gate: Gate | None) -> None:
        if gate is not None and gate.consumes(event, arrival):
            return  # refused, or held until the auth server answers
        try:
            self.session.receive(event, arrival)
        except ProtocolError as err:
            self.send_error(err)
        except Exception:
            self._internal_error(event)

    def run(self, event: object, arrival: int) -> None:
        """Run a command the gate held back (read earlier, in order)."""
        if self._taking is not None:
            self._later.append((event, arrival, True))  # type: ignore[arg-type]
            return
        try:
            self.session.receive(event, arrival)  # type: ignore[arg-type]
        except ProtocolError as err:
            self.send_error(err)
        except Exception:
            self._internal_error(event)

    def _internal_error(self, event: object) -> None:
        # A broker bug costs this client its connection, not the whole loop.
        log.exception("internal error on %s from %s", type(event).__name__, self.remote)
        self.send_error(ProtocolError(errors.E_INVALID, "internal error"))

    # -- what the session asks (srtm.protocol.session.SessionHost) ---------------------------
    def publish(self, topic: str, bodies: list[bytes], arrival_ns: int) -> None:
        written = self.broker.publish(topic, bodies, arrival_ns, self.session.attributed_to, self)
        if written is not None:
            self._hold_until(written)
            if len(bodies) > PUBLISH_SLICE:
                self._run_after(written)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)

    def publish_deferred(self, topic: str, body: bytes, defer_ms: int, arrival_ns: int) -> None:
        written = self.broker.publish_deferred(
            topic, body, defer_ms, arrival_ns, self.session.attributed_to, self
        )
        if written is not None:  # written to disk, or relayed: OK once done
            self._hold_until(written)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + 1

    def subscribe(self, topic: str, channel: str) -> None:
        self.channel = self.broker.subscribe(topic, channel, self)

    def handoff(self, topic: str, token: str) -> None:
        self.broker.handoffs.take(topic, token)

    def ready(self, count: int) -> None:
        if self._paused:
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
        self._wrap = self.tls.wrap
        timeout_s = self.broker.options.tls_handshake_timeout_ms / 1000
        self.loop.call_later(timeout_s, self._tls_deadline)

    def start_deflate(self, level: int) -> None:
        """Raw DEFLATE both ways, as nsqd's flate stream (inside TLS where both are on);
        each write is sync-flushed, so a frame never waits in the compressor."""
        deflate = zlib.compressobj(level, zlib.DEFLATED, -15)
        sync = zlib.Z_SYNC_FLUSH

        def compress(data: bytes) -> bytes:
            return deflate.compress(data) + deflate.flush(sync) if data else data

        inflate = zlib.decompressobj(-15)

        def decompress(data: bytes) -> bytes:
            try:
                plain: bytes = inflate.decompress(data)
            except zlib.error as exc:
                return self._broken("deflate", exc)
            return plain

        self._compress(compress, decompress)

    def start_snappy(self) -> None:
        """Snappy's framing format both ways, as nsqd's (golang/snappy's) stream, inside
        TLS where both are on; each write is flushed as whole chunks."""
        from srtm.broker.snappy import SnappyError, SnappyReader, SnappyWriter

        reader = SnappyReader()

        def decompress(data: bytes) -> bytes:
            try:
                return reader.feed(data)
            except SnappyError as exc:
                return self._broken("snappy", exc)

        self._compress(SnappyWriter().write, decompress)

    def _compress(
        self, compress: Callable[[bytes], bytes], decompress: Callable[[bytes], bytes]
    ) -> None:
        """Writes go through ``compress`` (then TLS, if on), reads (after TLS) through
        ``decompress``, from now on."""
        inner = self._wrap

        def wrap(data: bytes) -> bytes:
            data = compress(data)
            return inner(data) if inner is not None else data

        self._wrap = wrap
        self._inflate = decompress

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

    # -- running nothing else while a publish is taken in slices ----------------------------
    def _run_after(self, taken: asyncio.Future[Any]) -> None:
        """The publish just run is taken over loop turns: the commands after it run (and
        the socket is read) once it is done, as nsqd runs a connection's commands one
        after another."""
        self._taking = taken
        fd = self.sock.fileno()
        if fd >= 0 and not self.finishing:
            self.loop.remove_reader(fd)
        taken.add_done_callback(self._taken)

    def _taken(self, _: asyncio.Future[Any]) -> None:
        self._taking = None
        self._run_later()

    def _run_later(self) -> None:
        """Run what waited for a publish taken in slices, until another such publish,
        or a block (``unblock_reads`` runs the rest)."""
        if self._taking is not None:
            return  # another publish is taken meanwhile: its end runs them
        later, self._later = self._later, deque()
        if self.finishing:
            return
        self._in_read = True
        try:
            while later and self._taking is None and not self._blocked and not self.finishing:
                event, arrival, gated = later.popleft()
                if gated:
                    self.run(event, arrival)
                else:
                    self._run_one(event, arrival, self.gate)
        finally:
            self._in_read = False
            if self._send_scheduled:
                self._send()
        if later:  # another publish taken in slices, or a block: the rest waits for it
            later.extend(self._later)
            self._later = later
        elif not self.finishing and (self.gate is None or not self.gate.waiting):
            # (else AUTH's answer resumes reading; ``release_reads`` waits for a take)
            # A command it had begun could not progress meanwhile: its deadline restarts.
            self._partial_since_ns = time.time_ns() if self.parser.incomplete else 0
            self.release_reads()

    # -- holding answers until their publish is on disk ------------------------------------
    def _hold_until(self, written: asyncio.Future[Any]) -> None:
        """A publish is acknowledged once what it overflowed to disk is written: its OK,
        and every frame after it on this connection (order is kept), wait for ``written``
        (other connections do not)."""
        self._holds += 1
        written.add_done_callback(self._unhold)

    def _unhold(self, _: asyncio.Future[Any]) -> None:
        self._holds -= 1
        if self._holds or not self._held:
            return
        held, self._held = self._held, bytearray()
        self._out += held
        if not self._send_scheduled and not self._writing and not self.closed:
            self._send_scheduled = True
            self.loop.call_soon(self._send)

    # -- writing -------------------------------------------------------------------------
    def send_records(self, records: list[Record]) -> None:
        """Message frames for ``records`` (as queued: each is now on attempt
        ``attempts + 1``), built straight into the output buffer where nothing (TLS,
        compression, a held publish) stands between, else in one ``write``."""
        self.message_count += len(records)
        if self.session.state is _CLOSED:
            return
        if self._wrap is not None or self._holds:
            frames_ = bytearray()
            frame_records(frames_, records)
            self.write(bytes(frames_))
            return
        frame_records(self._out, records)
        self._queued()

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
        self.send_now()

    def send_error(self, err: ProtocolError) -> None:
        self.write(frames.error(err))
        if err.fatal and not self._close_when_flushed:
            self._close_when_flushed = True
            fd = self.sock.fileno()
            if fd >= 0:
                self.loop.remove_reader(fd)  # nothing read after it is executed

    def evict(self, err: ProtocolError) -> None:
        """Disconnect a consumer its class no longer admits: it gets no more messages,
        then ``err`` (fatal), then the connection closes."""
        if self.channel is not None:
            self.channel.remove_consumer(self)  # what it has in flight times out, as at close
        self.rdy = 0
        self.send_error(err)

    def write(self, data: bytes) -> None:
        """Queue ``data``; everything written in one loop turn leaves in one send."""
        if self.session.state is _CLOSED:
            return
        if self._wrap is not None:
            data = self._wrap(data)  # compressed and/or ciphertext (with handshake bytes)
        if self._holds:
            self._held += data  # behind an OK that waits for its write
            if len(self._out) + len(self._held) >= self._out_high and not self._paused:
                self._pause()
            return
        self._out += data
        self._queued()

    def _queued(self) -> None:
        """Bytes were added to ``_out``: bound it, and send at the end of the loop turn."""
        if len(self._out) >= self._out_high and not self._paused:
            self._pause()
        if not self._send_scheduled and not self._writing:
            self._send_scheduled = True
            if not self._in_read:
                self.loop.call_soon(self._send)

    def send_now(self) -> None:
        """Send what is queued now rather than at the end of the loop turn."""
        if self._send_scheduled:
            self._send()

    def _send(self) -> None:
        self._send_scheduled = False
        if self.session.state is _CLOSED or self._writing or not self._out:
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
        if self.closed or self._lingering is not None:
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
        if self.closed:
            return
        now = time.time_ns()
        # Not read while blocked: the broker's doing, not the client's silence.
        frame = self.session.beat(now, now if self._blocked else self.last_read_ns)
        if frame is None:
            self.close()  # silent for too long: gone
            return
        self.write(frame)
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
        if not self.parser.incomplete:
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
        if self.session.state is SessionState.SUBSCRIBED:
            self.rdy = self._rdy_wanted
        if self.closed or self._close_when_flushed:
            return
        # Its command could not progress while it was not read: the deadline restarts.
        self._partial_since_ns = time.time_ns() if self.parser.incomplete else 0
        waits = self._taking is not None or self._blocked
        if not waits and (self.gate is None or not self.gate.waiting):
            self.loop.add_reader(self.sock.fileno(), self._on_readable)  # else they resume it
        if self.channel is not None and self.rdy:
            self.broker.mark_ready(self.channel)

    def check_deadlines(self, now: int) -> None:
        """Called about every second: close a connection whose pending output made no
        progress for the write timeout, or whose current command is not complete within
        the read timeout."""
        if self.closed:
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
            and self._taking is None
            and not self._blocked
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
        return self.session.state is _CLOSED

    def close(self) -> None:
        if self.closed:
            return
        self.session.close()
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
        return self.closed or self._close_when_flushed

    def hold_reads(self) -> None:
        fd = self.sock.fileno()
        if fd >= 0 and not self.finishing:
            self.loop.remove_reader(fd)

    def release_reads(self) -> None:
        # paused: the output drain resumes; taking a publish: its end does; blocked:
        # ``unblock_reads`` does
        waits = self._paused or self._taking is not None or self._blocked
        if not self.finishing and not waits:
            # What waited in the socket meanwhile was the broker's delay, not silence.
            self.last_read_ns = time.time_ns()
            self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def respond(self, body: bytes) -> None:
        self.write(frames.response(body))

    # -- policing: a topic over its bound under ``block`` (srtm.ratelimit.overflow) -------------
    @property
    def blocked(self) -> bool:
        return self._blocked

    def block_reads(self) -> None:
        """Stop reading, and running what was read, until ``unblock_reads``: TCP pushes
        back on the publisher once the socket's buffers fill."""
        if self._blocked or self.finishing:
            return
        self._blocked = True
        self.blocks += 1
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)

    def unblock_reads(self) -> None:
        """Read again (unless output back-pressure or AUTH still hold it), and run first
        what was read before the block."""
        if not self._blocked:
            return
        self._blocked = False
        if self.finishing:
            return
        self._partial_since_ns = time.time_ns() if self.parser.incomplete else 0
        if self._taking is not None:
            return  # its end runs what waits and reads again
        if self._later:
            self.loop.call_soon(self._run_later)  # which reads again once they ran
            return
        if self._pending is not None:
            self.loop.call_soon(self._run_pending)
        if not self._paused and (self.gate is None or not self.gate.waiting):
            self.last_read_ns = time.time_ns()
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
