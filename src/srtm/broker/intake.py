"""What one client connection reads, run as commands, in order (the publisher's side).

Each read carries the kernel's receive timestamp (SO_TIMESTAMPNS;
``srtm.broker.sockio``); every command completed by a read gets that read's stamp. A run of a
read's PUBs to one topic is one publish (``Pubs``). A connection
runs at most ``TURN_BUDGET`` commands per loop turn; nothing after a publish taken in
slices (``PUBLISH_SLICE``) until it is taken; and nothing at all, nor reads, while a
topic it published to is over its bound under ``block`` (``block``/``unblock``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from srtm.broker.output import CLOSED, Output
from srtm.broker.sockio import recv_stamped
from srtm.protocol import Event, Fins, Mpub, Parser, ProtocolError, Pub, Pubs, errors
from srtm.protocol.session import Session, SessionState

if TYPE_CHECKING:
    from srtm.broker.auth import Gate
    from srtm.broker.busypoll import BusyPoll
    from srtm.broker.closer import Closer
    from srtm.broker.stats import BrokerStats

log = logging.getLogger("srtm.broker")

# Small reads bound the work one callback does, so shaped releases are not held back.
_READ_SIZE = 32 * 1024
_CLOSED = SessionState.CLOSED
#: FINs of a run (``Fins``) run at a time, with due releases looked at in between.
_FIN_CHUNK = 32
#: Commands one connection runs per loop turn (a run of FINs counting one): what one
#: read completed beyond it waits for the next turn, and the socket is not read
#: meanwhile, so a flooding connection gets a turn as long as any other's, not 32 KiB of
#: commands (~900 PUBs) per turn. A loop turn more per 64 commands costs a busy
#: connection a few per cent at most; MPUBs are few per read.
TURN_BUDGET = 64


class ReleaseClock(Protocol):
    """What ``Intake`` reads of the release loop (``srtm.broker.release.Releaser``)."""

    #: The next shaped release (None: nothing waits for tokens).
    next_release_ns: int | None

    @property
    def read_guard_ns(self) -> int: ...


class IntakeBroker(Protocol):
    """What ``Intake`` needs of the broker."""

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def releaser(self) -> ReleaseClock: ...

    @property
    def busy_poll(self) -> BusyPoll: ...

    @property
    def closer(self) -> Closer: ...

    def release_due(self) -> bool: ...

    def account_one(self) -> None: ...

    def takes_runs(self, topic_name: str) -> bool: ...


class IntakeConn(Protocol):
    """What ``Intake`` needs of its connection (``srtm.broker.tcp.Client``)."""

    remote: str

    @property
    def finishing(self) -> bool: ...

    def close(self) -> None: ...

    def send_error(self, err: ProtocolError) -> None: ...

    def watch_deadlines(self) -> None: ...


class Intake:
    """Reads ``sock`` into ``parser`` and runs what it completes through ``session``
    (past ``gate``, where there is one), writing through ``output``."""

    def __init__(
        self,
        conn: IntakeConn,
        broker: IntakeBroker,
        sock: socket.socket,
        session: Session,
        parser: Parser,
        gate: Gate | None,
        output: Output,
        read_timeout_ms: int,
    ) -> None:
        self._conn, self._broker, self._sock = conn, broker, sock
        self._session, self._parser, self._gate, self._output = session, parser, gate, output
        self._loop = asyncio.get_running_loop()
        self.last_read_ns = time.time_ns()
        #: The broker's ``BusyPoll`` and this connection's rule, where the broker polls
        #: (None: off, and no call on every read). Not its bound ``read``: an object
        #: more per connection for the collector to walk.
        poll = broker.busy_poll
        self._poll = poll if poll.enabled else None
        self._poll_window = poll.window()
        self._releases = broker.releaser
        #: The shaped release this read waits for (0: none; see ``_waits_for_release``).
        self._waiting_for = 0
        #: What a read goes through before the parser once TLS or compression is on
        #: (b"": nothing for the parser, or the connection closed).
        self.unwrap: Callable[[bytes], bytes] | None = None
        #: What the last read completed and this turn's budget left for later, from
        #: ``_pending_at`` (None: nothing), and that read's arrival stamp.
        self._pending: list[Event] | None = None
        self._pending_at = 0
        self._pending_arrival = 0
        #: Not read (nor its pending commands run) while a topic it published to is over
        #: its bound under ``block``; how often that happened.
        self.blocked = False
        self.blocks = 0
        #: A publish taken in slices (``PUBLISH_SLICE``): until it is done, what comes
        #: after it waits in ``_later`` (event, arrival, whether the gate passed it).
        self._taking: asyncio.Future[Any] | None = None
        self._later: deque[tuple[Event, int, bool]] = deque()
        self._read_timeout_ns = read_timeout_ms * 1_000_000
        #: When the first byte of a command still incomplete arrived (0: none pending).
        self._partial_since_ns = 0

    # -- reading ---------------------------------------------------------------------------
    def on_readable(self) -> None:
        if self._pending:
            return  # what the last read completed runs first (``_run_pending``)
        if self._releases.next_release_ns is not None and self._waits_for_release():
            return
        self._waiting_for = 0  # read: the next read may wait for a release again
        try:
            data, stamp, user_ns = recv_stamped(self._sock, _READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._gone()
            return
        if not data:
            self._gone()
            return
        arrival = user_ns
        if stamp:
            arrival = stamp
            self._broker.stats.stamp_gaps.pending.append(user_ns - stamp)  # ``add``, inline
        self.last_read_ns = user_ns
        if self.unwrap is not None and not (data := self.unwrap(data)):
            return
        one = self._parser.one(data)
        if one is None:
            events = self._parser.feed(data)
            self._note_partial(bool(events), user_ns)
            self._run_turn(events, 0, arrival)
        else:
            self._partial_since_ns = 0  # one whole command: nothing waits for more bytes
            if not self._took_one(one, arrival):
                self._run_turn([one], 0, arrival)
        if self._poll is not None:
            self._poll.read(self._poll_window, user_ns)

    def _waits_for_release(self) -> bool:
        """Whether this read waits for the shaped release due within the read guard
        (``Releaser.read_guard_ns``), so that a release is not late by the read's work;
        the socket stays readable meanwhile, so the loop comes back at once, spinning as
        the release loop does. A read waits for one release at most: once it has gone
        (or the guard has passed), it is read."""
        releases = self._releases
        due = releases.next_release_ns
        assert due is not None
        now = time.time_ns()
        if self._waiting_for:  # until it goes (or the next is booked sooner), or is due
            return due == self._waiting_for and due > now
        if 0 < due - now <= releases.read_guard_ns:
            self._waiting_for = due
            return True
        return False

    def _gone(self) -> None:
        """The peer closed or reset the connection: not read again, and closed in a
        slice with the others that went at once (``Closer``), not in this read."""
        self.stop_reading()
        self._broker.closer.add(self._conn)

    def detach(self) -> None:
        """The connection is closed and gone: let go of it, so that the two are not
        cyclic garbage (``Client.close``)."""
        self._conn = CLOSED
        self.unwrap = None

    def stop_reading(self) -> None:
        fd = self._sock.fileno()
        if fd >= 0 and not self._conn.finishing:
            self._loop.remove_reader(fd)

    def release(self) -> None:
        """The gate's ``release_reads``: AUTH answered."""
        # paused: the output drain resumes; taking a publish: its end does; blocked:
        # ``unblock`` does
        waits = self._output.paused or self._taking is not None or self.blocked
        if not self._conn.finishing and not waits:
            self.last_read_ns = time.time_ns()
            self._loop.add_reader(self._sock.fileno(), self.on_readable)

    def resumed(self) -> None:
        """Output back-pressure is over: read again (unless something else holds it)."""
        self.restart_deadline()
        waits = self._taking is not None or self.blocked
        if not waits and (self._gate is None or not self._gate.waiting):
            self._loop.add_reader(self._sock.fileno(), self.on_readable)  # else they resume it

    # -- running what was read -------------------------------------------------------------
    def _run_turn(self, events: list[Event], start: int, arrival: int) -> None:
        """Run ``events[start:]`` up to this turn's budget; the rest waits for the next
        turn (``_run_pending``), or for the topic to be within its bound where its
        publishes block this connection."""
        out = self._output
        out.in_read = True
        try:
            done = self._run_all(events, start, arrival)
            # What the read made due (a publish its bucket lets through at once) goes
            # now, before the answers: not after a loop turn and a wake of the release
            # loop, nor after the answers' send.
            self._broker.release_due()
        finally:
            out.in_read = False
            if out.send_scheduled:
                out.send()
        if done < len(events) and not self._conn.finishing:
            self._pending, self._pending_at, self._pending_arrival = events, done, arrival
            if not self.blocked:
                self._loop.call_soon(self._run_pending)
        else:
            self._pending = None

    def _took_one(self, one: Pub | Mpub, arrival: int) -> bool:
        """A read that is one publish (a sensor's), where the session runs it in place
        and the connection keeps it at once (``Session.publish_one``): run and answered
        without ``_run_turn``'s steps, which it does not need (nothing waits before it,
        no gate judges it, nothing it publishes waits for tokens). False elsewhere, the
        command not run (due releases may have gone first, as the general way sends them)."""
        out = self._output
        if self._gate is not None or self._taking is not None or self._later or self.blocked:
            return False
        if out.closing:
            return False
        self._broker.release_due()  # what is due goes before it, as ``_run_all`` does
        try:
            answer = self._session.publish_one(one, arrival)
        except Exception:
            self._internal_error(one)
            return True
        if answer is None:
            return False
        out.answer(answer)
        self._broker.account_one()
        return True

    def _run_pending(self) -> None:
        events = self._pending
        if events is None or self.blocked or self._conn.finishing:
            return
        self._run_turn(events, self._pending_at, self._pending_arrival)

    def _run_all(self, events: list[Event], start: int, arrival: int) -> int:
        """Run what one read completed, in order, from ``start``, until ``TURN_BUDGET``
        commands ran or a publish blocked the connection; how far it got. Due shaped
        releases are looked at before every command (a clock read while any wait, a few
        µs apart), and while releases wait a FIN of a long run (``Fins``, one per message
        a consumer got) is run ``_FIN_CHUNK`` FINs at a time (else at once: FINs release
        nothing). A run of PUBs to one topic (a pipelining publisher's) is one publish,
        ``Pubs``, answered OK each (each counts toward the budget), where nothing judges
        each PUB: no auth gate, and no bound on the topic (``takes_runs``)."""
        gate, session, out = self._gate, self._session, self._output
        release_due = self._broker.release_due
        end = min(len(events), start + TURN_BUDGET)
        i = start
        while i < end:
            if self.blocked:
                return i
            event = events[i]
            waiting = release_due()
            if type(event) is Fins and len(ids := event.message_ids) > _FIN_CHUNK and waiting:
                for k in range(0, len(ids), _FIN_CHUNK):
                    if k:
                        release_due()
                    if session.state is _CLOSED or out.closing:
                        return len(events)  # closed, or a fatal error: nothing after it
                    self._run_one(Fins(ids[k : k + _FIN_CHUNK]), arrival, gate)
                i += 1
                continue
            if session.state is _CLOSED or out.closing:
                return len(events)
            after = i + 1
            if (
                type(event) is Pub
                and gate is None
                and after < end
                and type(events[after]) is Pub
                and self._broker.takes_runs(event.topic)
            ):
                bodies = _pub_run(event, events, after, end)
                if len(bodies) > 1:
                    event, after = Pubs(event.topic, bodies), i + len(bodies)
            self._run_one(event, arrival, gate)
            if self._taking is not None:  # the rest runs once it is taken
                self._later.extend((e, arrival, False) for e in events[after:])
                return len(events)
            i = after
        return end

    def _run_one(self, event: Event, arrival: int, gate: Gate | None) -> None:
        if gate is not None and gate.consumes(event, arrival):
            return  # refused, or held until the auth server answers
        try:
            self._session.receive(event, arrival)
        except ProtocolError as err:
            self._conn.send_error(err)
            # A parse error is the read's event too: its traceback's frames hold it.
            err.__traceback__ = None
        except Exception:
            self._internal_error(event)

    def run(self, event: object, arrival: int) -> None:
        """Run a command the gate held back (read earlier, in order)."""
        if self._taking is not None:
            self._later.append((event, arrival, True))  # type: ignore[arg-type]
            return
        try:
            self._session.receive(event, arrival)  # type: ignore[arg-type]
        except ProtocolError as err:
            self._conn.send_error(err)
            err.__traceback__ = None  # as in ``_run_one``
        except Exception:
            self._internal_error(event)

    def _internal_error(self, event: object) -> None:
        # A broker bug costs this client its connection, not the whole loop.
        log.exception("internal error on %s from %s", type(event).__name__, self._conn.remote)
        self._conn.send_error(ProtocolError(errors.E_INVALID, "internal error"))

    # -- running nothing else while a publish is taken in slices ----------------------------
    def run_after(self, taken: asyncio.Future[Any]) -> None:
        """The publish just run is taken over loop turns: the commands after it run (and
        the socket is read) once it is done, as nsqd runs a connection's commands one
        after another."""
        self._taking = taken
        self.stop_reading()
        taken.add_done_callback(self._taken)

    def _taken(self, _: asyncio.Future[Any]) -> None:
        self._taking = None
        self._run_later()

    def _run_later(self) -> None:
        """Run what waited for a publish taken in slices, until another such publish,
        or a block (``unblock`` runs the rest)."""
        if self._taking is not None:
            return  # another publish is taken meanwhile: its end runs them
        later, self._later = self._later, deque()
        conn, out = self._conn, self._output
        if conn.finishing:
            return
        out.in_read = True
        try:
            while later and self._taking is None and not self.blocked and not conn.finishing:
                event, arrival, gated = later.popleft()
                if gated:
                    self.run(event, arrival)
                else:
                    self._run_one(event, arrival, self._gate)
        finally:
            out.in_read = False
            if out.send_scheduled:
                out.send()
        if later:  # another publish taken in slices, or a block: the rest waits for it
            later.extend(self._later)
            self._later = later
        elif not conn.finishing and (self._gate is None or not self._gate.waiting):
            # (else AUTH's answer resumes reading; ``release`` waits for a take)
            # A command it had begun could not progress meanwhile: its deadline restarts.
            self.restart_deadline()
            self.release()

    # -- policing: a topic over its bound under ``block`` (srtm.ratelimit.overflow) -------------
    def block(self) -> None:
        """Stop reading, and running what was read, until ``unblock``: TCP pushes back on
        the publisher once the socket's buffers fill."""
        if self.blocked or self._conn.finishing:
            return
        self.blocked = True
        self.blocks += 1
        fd = self._sock.fileno()
        if fd >= 0:
            self._loop.remove_reader(fd)

    def unblock(self) -> None:
        """Read again (unless output back-pressure or AUTH still hold it), and run first
        what was read before the block."""
        if not self.blocked:
            return
        self.blocked = False
        if self._conn.finishing:
            return
        self.restart_deadline()
        if self._taking is not None:
            return  # its end runs what waits and reads again
        if self._later:
            self._loop.call_soon(self._run_later)  # which reads again once they ran
            return
        if self._pending is not None:
            self._loop.call_soon(self._run_pending)
        if not self._output.paused and (self._gate is None or not self._gate.waiting):
            self.last_read_ns = time.time_ns()
            self._loop.add_reader(self._sock.fileno(), self.on_readable)

    # -- the read deadline -----------------------------------------------------------------
    def _note_partial(self, completed: bool, now: int) -> None:
        """After a read: does a command wait for more bytes, and since when? A read that
        completed commands started whatever is left over."""
        if not self._parser.incomplete:
            self._partial_since_ns = 0
        elif completed or not self._partial_since_ns:
            if not self._partial_since_ns:
                self._conn.watch_deadlines()
            self._partial_since_ns = now

    def restart_deadline(self) -> None:
        """Its command could not progress while it was not read: the deadline restarts."""
        if not self._parser.incomplete:
            self._partial_since_ns = 0
            return
        if not self._partial_since_ns:
            self._conn.watch_deadlines()
        self._partial_since_ns = time.time_ns()

    @property
    def partial(self) -> bool:
        """A command waits for more bytes (the read deadline bounds it)."""
        return self._partial_since_ns != 0

    def overdue(self, now: int) -> int:
        """The read timeout in ms where a command is still incomplete after it while the
        connection was read all along (else 0)."""
        since = self._partial_since_ns
        if (
            since
            and self._read_timeout_ns
            and not self._output.paused
            and self._taking is None
            and not self.blocked
            and not self._output.closing
            and now - since >= self._read_timeout_ns
        ):
            return self._read_timeout_ns // 1_000_000
        return 0


def _pub_run(first: Pub, events: list[Event], start: int, end: int) -> list[bytes]:
    """The bodies of ``first`` and of the PUBs to its topic that follow it from ``start``
    (by ``end``): a pipelining publisher's PUBs read together, taken as one publish."""
    bodies = [first.body]
    for e in itertools.islice(events, start, end):
        if type(e) is not Pub or e.topic != first.topic:
            break
        bodies.append(e.body)
    return bodies
