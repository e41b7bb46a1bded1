"""One client's NSQ V2 session, sans-I/O: commands in, calls on its connection out.

The rules nsqd applies per connection live here (what each state accepts and where it
leads, IDENTIFY's negotiation, SUB's preconditions, the error codes of failed commands,
heartbeats); the socket, TLS, buffers and timeouts are the connection's
(``srtm.broker.tcp.Client``). The session answers through the ``SessionHost`` it is given,
reads no clock (times are passed in) and starts nothing.
"""

from __future__ import annotations

import enum
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from srtm.protocol import errors
from srtm.protocol.commands import (
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Fins,
    Handoff,
    Identify,
    Mpub,
    Nop,
    Pub,
    Pubs,
    Rdy,
    Req,
    Sub,
    Touch,
)
from srtm.protocol.errors import E_AUTH_FAILED, ProtocolError
from srtm.protocol.frames import CLOSE_WAIT, HEARTBEAT, error, response
from srtm.protocol.limits import Limits

E_AUTH_DISABLED = "E_AUTH_DISABLED"
E_IDENTIFY_FAILED = "E_IDENTIFY_FAILED"
#: nsqd's code for a SUB that cannot be served; also a SUB beyond its class's admitted
#: count (not fatal then: see srtm.broker.admission).
E_SUB_FAILED = "E_SUB_FAILED"
#: The consumer class (IDENTIFY ``srtm_class``) of a consumer that names none, as plain NSQ
#: consumers do; a class is 1-MAX_CLASS_LENGTH characters of [.a-zA-Z0-9_-].
DEFAULT_CLASS = "default"
MAX_CLASS_LENGTH = 32
#: nsqd's bounds on a heartbeat interval a client asks for (ms); -1 turns heartbeats off.
MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS = 1_000, 60_000
#: nsqd's defaults and bounds for the output buffer a client asks for (bytes, ms): SRTM
#: checks and echoes them as nsqd does, but writes what a loop turn produced at its end
#: whatever they are (see docs/broker.md).
OUTPUT_BUFFER_SIZE, MIN_OUTPUT_BUFFER_SIZE, MAX_OUTPUT_BUFFER_SIZE = 16_384, 64, 65_536
OUTPUT_BUFFER_TIMEOUT_MS, MIN_OUTPUT_BUFFER_TIMEOUT_MS, MAX_OUTPUT_BUFFER_TIMEOUT_MS = (
    250,
    25,
    30_000,
)
#: nsqd's --max-deflate-level default, and the level when a client names none.
DEFLATE_LEVEL, MAX_DEFLATE_LEVEL = 6, 6
#: nsqd's sampling: a consumer asking for rate r gets each message when randint(0, 99) <= r.
MAX_SAMPLE_RATE = 99
#: IDENTIFY's fields nsqd decodes, by JSON type: another type fails the whole body, as Go's
#: decoder does (null leaves the default). Fields nsqd does not know are ignored.
_INT_FIELDS = (
    "heartbeat_interval",
    "output_buffer_size",
    "output_buffer_timeout",
    "deflate_level",
    "sample_rate",
    "msg_timeout",
)
_BOOL_FIELDS = ("feature_negotiation", "tls_v1", "deflate", "snappy")
_STR_FIELDS = ("client_id", "hostname", "user_agent", "short_id", "long_id")
_CLASS_NAME = re.compile(rf"[.a-zA-Z0-9_-]{{1,{MAX_CLASS_LENGTH}}}")
OK_FRAME = response()
HEARTBEAT_FRAME = response(HEARTBEAT)
CLOSE_WAIT_FRAME = response(CLOSE_WAIT)


class SessionState(enum.Enum):
    INIT = "init"
    SUBSCRIBED = "subscribed"
    CLOSING = "closing"
    CLOSED = "closed"


_COMMANDS: tuple[type[Command], ...] = (
    Identify,
    Auth,
    Sub,
    Pub,
    Pubs,
    Mpub,
    Dpub,
    Rdy,
    Fin,
    Fins,
    Req,
    Touch,
    Cls,
    Nop,
    Handoff,
)
_PUBLISH = (Pub, Pubs, Mpub, Dpub)

#: The state table: for each state, the commands it accepts and the state each leads to
#: (entered once the command succeeded), or None for a command read and ignored.
#: A command a state does not list is refused: E_INVALID "cannot X in current state"
#: (fatal). Publishing needs no subscription; RDY after CLS is ignored, as nsqd does.
#: ``Fins`` (a run of FINs read together) goes wherever FIN goes, ``Pubs`` wherever PUB.
TRANSITIONS: dict[SessionState, dict[type[Command], SessionState | None]] = {
    SessionState.INIT: {
        Identify: SessionState.INIT,
        Auth: SessionState.INIT,
        Sub: SessionState.SUBSCRIBED,
        **{cmd: SessionState.INIT for cmd in _PUBLISH},
        Nop: SessionState.INIT,
        # SRTM's: a relay link (IDENTIFY srtm_relay) never subscribes.
        Handoff: SessionState.INIT,
    },
    SessionState.SUBSCRIBED: {
        **{cmd: SessionState.SUBSCRIBED for cmd in (*_PUBLISH, Rdy, Fin, Fins, Req, Touch, Nop)},
        Cls: SessionState.CLOSING,
    },
    SessionState.CLOSING: {
        **{cmd: SessionState.CLOSING for cmd in (*_PUBLISH, Fin, Fins, Req, Touch, Nop)},
        Rdy: None,
    },
    # A closed connection runs nothing more of what it had read.
    SessionState.CLOSED: dict.fromkeys(_COMMANDS),
}


def command_name(cmd: type[Command]) -> str:
    """The command's name on the wire (``Mpub`` -> ``MPUB``; ``Fins`` -> ``FIN``)."""
    return "FIN" if cmd is Fins else "PUB" if cmd is Pubs else cmd.__name__.upper()


class SessionHost(Protocol):
    """What a session asks of its connection. Refusals are ProtocolErrors (raised), except
    that FIN, REQ and TOUCH return why they failed (None: done)."""

    def write(self, data: bytes) -> None: ...

    def publish(self, topic: str, bodies: list[bytes], arrival_ns: int) -> None: ...

    def publish_one(self, topic: str, body: bytes, arrival_ns: int) -> bool:
        """``publish`` of one message where the connection keeps it at once; False, with
        nothing done, elsewhere (``publish`` then takes it, or says why not)."""

    def publish_deferred(self, topic: str, body: bytes, defer_ms: int, arrival_ns: int) -> None: ...

    def subscribe(self, topic: str, channel: str) -> None: ...

    def ready(self, count: int) -> None: ...

    def finish(self, message_id: bytes) -> str | None: ...

    def finish_many(self, message_ids: list[bytes]) -> list[tuple[bytes, str]]:
        """``finish`` of each; those that failed and why."""

    def requeue(self, message_id: bytes, delay_ns: int) -> str | None: ...

    def touch(self, message_id: bytes) -> str | None: ...

    def negotiated(self, heartbeat_changed: bool) -> None:
        """IDENTIFY's heartbeat interval and message timeout are now the session's."""

    def start_tls(self) -> None:
        """Upgrade to TLS: whatever is written from now on is encrypted."""

    def start_deflate(self, level: int) -> None:
        """Upgrade to deflate: what is written from now on is compressed, what is read
        from the next read on is decompressed."""

    def start_snappy(self) -> None:
        """Likewise, with Snappy's framing format."""

    def sample(self, rate: int) -> None:
        """Deliver each message to this consumer with nsqd's probability for ``rate``."""

    def handoff(self, topic: str, token: str) -> None:
        """A relay link's HANDOFF: apply the share armed under ``token`` (an unknown or
        expired one is ignored)."""


@dataclass(frozen=True, slots=True)
class Keys:
    """What proves an identity on this broker (see docs/security.md, "Identities").

    ``operator``: the cluster token and the relay secret; a connection that AUTHs with one
    is the cluster's own (a relay link may say ``srtm_relay``, and it may name any class).
    ``classes``: each class's secret (``--class-secret``), given as IDENTIFY
    ``srtm_class_secret`` or as AUTH. A broker with no key and no auth server has nothing
    to check a claim against and takes it as said (as its HTTP API without a token)."""

    operator: tuple[str, ...] = ()
    classes: Mapping[str, str] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.operator or self.classes)

    def is_operator(self, secret: str) -> bool:
        given = secret.encode()
        # Each compared in constant time, and all of them, whichever matches.
        return sum(hmac.compare_digest(given, k.encode()) for k in self.operator) > 0

    def class_of(self, secret: str) -> str | None:
        """The class ``secret`` is the secret of (None: none)."""
        given = secret.encode()
        found = None
        for klass, key in self.classes.items():
            if hmac.compare_digest(given, key.encode()):
                found = klass
        return found

    def __repr__(self) -> str:  # never a secret, in a log or a traceback
        return f"Keys(operator={len(self.operator)}, classes={sorted(self.classes)})"


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """The server's side of a session (what IDENTIFY negotiates against)."""

    limits: Limits = field(default_factory=Limits)
    heartbeat_interval_ms: int = 30_000
    msg_timeout_ms: int = 60_000
    version: str = ""
    broker_id: str = ""
    #: TLS can be negotiated (the server has a certificate).
    tls: bool = False
    #: An auth server decides AUTH (the connection's gate answers it, not the session).
    auth: bool = False
    keys: Keys = field(default_factory=Keys)

    @property
    def checks_identities(self) -> bool:
        """Whether a relay link or a class above ``default`` must prove itself."""
        return self.auth or self.keys.any


_Handler = Callable[["Session", Any, int], None]


class Session:
    """Feed it each command (or parse error) with its arrival time; it answers through
    the connection, and raises a ProtocolError to send (fatal unless errors.NON_FATAL
    says otherwise)."""

    def __init__(self, conn: SessionHost, settings: SessionSettings) -> None:
        self.conn = conn
        self.settings = settings
        self.state = SessionState.INIT
        self._handlers = _HANDLERS[SessionState.INIT]
        #: What IDENTIFY sent, and what the session made of it.
        self.identity: dict[str, Any] = {}
        self.heartbeat_ns = settings.heartbeat_interval_ms * 1_000_000
        self.msg_timeout_ns = settings.msg_timeout_ms * 1_000_000
        self.publisher = ""
        #: Who published what this connection sends; None: the publisher each message's
        #: measurement header names (a workload emulator multiplexes many on one connection).
        self.attributed_to: str | None = ""
        self.takes_orders = False
        #: The consumer class, for admission control: what IDENTIFY named (srtm_class),
        #: or what AUTH proved; checked, and fixed, at SUB.
        self.consumer_class = DEFAULT_CLASS
        #: What IDENTIFY claimed (srtm_class, srtm_relay) and what proved an identity.
        self.claimed_class: str | None = None
        self.claims_relay = False
        self.operator = False
        self.relay_granted = False
        self.proven_classes: set[str] = set()
        #: A relay link (IDENTIFY srtm_relay, proven): what it sends is never relayed again.
        self.relay = False
        #: Claims srtm_relay without proof: its publishes and HANDOFFs are refused.
        self.fake_relay = False
        self.tls = False
        self.deflate_level = 0
        self.snappy = False
        self.sample_rate = 0
        self.output_buffer_size = OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout_ms = OUTPUT_BUFFER_TIMEOUT_MS

    def receive(self, event: Command | ProtocolError, arrival_ns: int) -> None:
        """Run one command that arrived at ``arrival_ns``; a parse error is raised back."""
        self._handlers[type(event)](self, event, arrival_ns)

    def publish_one(self, cmd: Pub | Mpub, arrival_ns: int) -> bytes | None:
        """``receive`` of a PUB, or of an MPUB of one message (what a sensor's read
        brings), where this state runs it in place and the connection keeps it at once
        (``SessionHost.publish_one``): the answer to send (its OK), which the caller
        sends as ``write`` would. None, with nothing done, elsewhere: ``receive`` then
        runs it, and refuses it where it should."""
        kind = type(cmd)
        if self._handlers[kind] is not _RUN[kind] or self.fake_relay:
            return None
        if isinstance(cmd, Pub):
            body = cmd.body
        elif len(cmd.bodies) == 1:
            body = cmd.bodies[0]
        else:
            return None
        return OK_FRAME if self.conn.publish_one(cmd.topic, body, arrival_ns) else None

    def accepts(self, cmd: type[Command]) -> bool:
        """Whether the current state runs ``cmd`` (rather than refusing it)."""
        return cmd in TRANSITIONS[self.state]

    def close(self) -> None:
        self._enter(SessionState.CLOSED)

    def detach(self) -> None:
        """Closed, it runs nothing more: let go of the connection, so that the two are
        not cyclic garbage (a closed connection would wait for a full collection)."""
        assert self.state is SessionState.CLOSED
        del self.conn

    def beat(self, now_ns: int, last_read_ns: int) -> bytes | None:
        """The heartbeat frame due now, or None when the client has been silent for two
        intervals: it is gone, close it."""
        if now_ns - last_read_ns > 2 * self.heartbeat_ns:
            return None
        return HEARTBEAT_FRAME

    def _enter(self, state: SessionState) -> None:
        self.state = state
        self._handlers = _HANDLERS[state]

    # -- commands ----------------------------------------------------------------------------
    def _identify(self, cmd: Identify, arrival_ns: int) -> None:
        config = cmd.config
        _check_types(config)
        limits = self.settings.limits
        heartbeat_ns = self.heartbeat_ns
        heartbeat = config.get("heartbeat_interval") or 0
        changed = heartbeat != 0
        if heartbeat == -1:
            heartbeat_ns = 0
        elif changed:
            if not MIN_HEARTBEAT_MS <= heartbeat <= MAX_HEARTBEAT_MS:
                raise _invalid(f"heartbeat interval ({heartbeat})")
            heartbeat_ns = heartbeat * 1_000_000
        size, timeout_ms = self._output_buffer(config)
        sample_rate = config.get("sample_rate") or 0
        if not 0 <= sample_rate <= MAX_SAMPLE_RATE:
            raise _invalid(f"sample rate ({sample_rate})")
        timeout = config.get("msg_timeout") or 0
        if timeout != 0:
            if not limits.min_msg_timeout_ms <= timeout <= limits.max_msg_timeout_ms:
                raise _invalid(f"msg timeout ({timeout})")
            self.msg_timeout_ns = timeout * 1_000_000
        klass = config.get("srtm_class")
        if klass is not None and not is_valid_class(klass):
            raise _invalid(f"srtm_class ({str(klass)[: MAX_CLASS_LENGTH + 8]!r})")
        proof = config.get("srtm_class_secret")
        if proof is not None:
            self._prove_class(klass, proof)
        self.identity = config
        self.claimed_class = klass
        self.consumer_class = klass or DEFAULT_CLASS
        self.claims_relay = config.get("srtm_relay") is True
        self._settle_relay()
        self.heartbeat_ns = heartbeat_ns
        self.output_buffer_size, self.output_buffer_timeout_ms = size, timeout_ms
        if sample_rate != self.sample_rate:
            self.sample_rate = sample_rate
            self.conn.sample(sample_rate)
        self.publisher = str(config.get("srtm_publisher") or config.get("client_id") or "")
        header = config.get("srtm_header_publisher") is True
        self.attributed_to = None if header else self.publisher
        self.takes_orders = config.get("srtm_orders") is True
        self.conn.negotiated(changed)
        if not config.get("feature_negotiation"):
            self.conn.write(OK_FRAME)
            return
        # A second IDENTIFY does not upgrade twice.
        tls = config.get("tls_v1") is True and self.settings.tls and not self.tls
        compressed = self.snappy or self.deflate_level > 0
        deflate = config.get("deflate") is True and not compressed
        level = min(config.get("deflate_level") or 0, MAX_DEFLATE_LEVEL)
        level = level if deflate and level > 0 else DEFLATE_LEVEL
        snappy = config.get("snappy") is True and not compressed
        if deflate and snappy:
            raise ProtocolError(
                E_IDENTIFY_FAILED, "cannot enable both deflate and snappy compression"
            )
        features = self._features(tls, deflate, level, snappy)
        self.conn.write(response(json.dumps(features).encode()))
        if tls:
            # nsqd's order: the reply in plain text, then its OK over TLS.
            self.tls = True
            self.conn.start_tls()
            self.conn.write(OK_FRAME)
        if deflate:
            # Likewise: the reply as it was, then an OK through the compressed stream.
            self.deflate_level = level
            self.conn.start_deflate(level)
            self.conn.write(OK_FRAME)
        if snappy:
            self.snappy = True
            self.conn.start_snappy()
            self.conn.write(OK_FRAME)

    def _output_buffer(self, config: dict[str, Any]) -> tuple[int, int]:
        """The output buffer size and timeout IDENTIFY asks for, by nsqd's rules."""
        size, timeout = self.output_buffer_size, self.output_buffer_timeout_ms
        asked_timeout = config.get("output_buffer_timeout") or 0
        if asked_timeout == -1:
            timeout = 0
        elif asked_timeout != 0:
            if not MIN_OUTPUT_BUFFER_TIMEOUT_MS <= asked_timeout <= MAX_OUTPUT_BUFFER_TIMEOUT_MS:
                raise _invalid(f"output buffer timeout ({asked_timeout})")
            timeout = asked_timeout
        asked_size = config.get("output_buffer_size") or 0
        if asked_size == -1:
            size, timeout = 1, 0  # nsqd: no buffering at all
        elif asked_size != 0:
            if not MIN_OUTPUT_BUFFER_SIZE <= asked_size <= MAX_OUTPUT_BUFFER_SIZE:
                raise _invalid(f"output buffer size ({asked_size})")
            size = asked_size
        return size, timeout

    def _features(self, tls: bool, deflate: bool, level: int, snappy: bool) -> dict[str, Any]:
        """IDENTIFY's reply under feature negotiation."""
        s = self.settings
        return {
            "max_rdy_count": s.limits.max_rdy_count,
            "version": s.version,
            "max_msg_timeout": s.limits.max_msg_timeout_ms,
            "msg_timeout": self.msg_timeout_ns // 1_000_000,
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": MAX_DEFLATE_LEVEL,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": s.auth,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": self.output_buffer_timeout_ms,
            # SRTM's own (clients ignore fields they do not know): which broker this is,
            # so subscriber-side trace rows join broker-side ones on (run, broker, msg_id).
            "srtm_broker_id": s.broker_id,
            # nsqd does not say it; a client that knows it refuses a too-big body itself
            # instead of being disconnected for it.
            "srtm_max_msg_size": s.limits.max_msg_size,
            # A relay link must AUTH with the token or relay secret to say srtm_relay.
            "srtm_relay_auth": s.keys.any,
        }

    # -- identities (docs/security.md) ----------------------------------------------------
    def _prove_class(self, klass: object, proof: object) -> None:
        """IDENTIFY ``srtm_class_secret``: the secret of the class it names, or the token."""
        keys = self.settings.keys
        if not self.settings.checks_identities:
            return  # nothing to check it against: the class is taken as named
        if not isinstance(proof, str):
            raise ProtocolError(E_AUTH_FAILED, "srtm_class_secret must be a string")
        if not isinstance(klass, str):
            raise ProtocolError(E_AUTH_FAILED, "srtm_class_secret needs srtm_class")
        if keys.is_operator(proof):
            self.operator = True
        elif keys.class_of(proof) == klass:
            self.proven_classes.add(klass)
        else:
            raise ProtocolError(
                E_AUTH_FAILED, f"srtm_class_secret is not the secret of class {klass!r}"
            )

    def granted(self, operator: bool, relay: bool, klass: str | None) -> None:
        """AUTH proved an identity: the cluster's own (``operator``), a relay link the
        auth server vouches for, a class (its secret, or the auth server's answer)."""
        self.operator = self.operator or operator
        self.relay_granted = self.relay_granted or relay
        if klass is not None:
            self.proven_classes.add(klass)
        self._settle_relay()

    def _settle_relay(self) -> None:
        proven = self.operator or self.relay_granted or not self.settings.checks_identities
        self.relay = self.claims_relay and proven
        self.fake_relay = self.claims_relay and not proven

    def _class_at_sub(self) -> str:
        """The class this SUB is admitted in: the one claimed, if proven (or nothing is
        checked here), else the one AUTH proved; a claim without proof is refused."""
        claimed = self.claimed_class
        proven = self.proven_classes
        if claimed is None or claimed == DEFAULT_CLASS:
            # Not claimed: the class AUTH proved, if one (the auth server's says who).
            return next(iter(proven)) if claimed is None and len(proven) == 1 else DEFAULT_CLASS
        if self.operator or claimed in proven or not self.settings.checks_identities:
            return claimed
        raise ProtocolError(
            E_AUTH_FAILED,
            f"consumer class {claimed!r} is not proven: give its secret "
            "(IDENTIFY srtm_class_secret, or AUTH)",
        )

    def _refuse_fake_relay(self) -> None:
        raise ProtocolError(
            E_AUTH_FAILED, "srtm_relay needs AUTH with the cluster token or the relay secret"
        )

    def _auth(self, cmd: Auth, arrival_ns: int) -> None:
        """AUTH without an auth server (with one, the connection's gate answers it): the
        token or relay secret, or a class's secret; nsqd's E_AUTH_DISABLED where the
        broker has no key at all."""
        keys = self.settings.keys
        if not keys.any:
            raise ProtocolError(E_AUTH_DISABLED, "AUTH disabled")
        secret = cmd.secret.decode(errors="replace")
        if keys.is_operator(secret):
            identity = "srtm-cluster"
            self.granted(True, False, None)
        elif (klass := keys.class_of(secret)) is not None:
            identity = f"srtm-class:{klass}"
            self.granted(False, False, klass)
        else:
            raise ProtocolError(E_AUTH_FAILED, "AUTH failed")
        doc: dict[str, Any] = {"identity": identity, "identity_url": "", "permission_count": 0}
        if self.operator:  # as srtm.broker.auth's answer: the relay checks it
            doc["srtm_relay"] = True
        self.conn.write(response(json.dumps(doc).encode()))

    def _sub(self, cmd: Sub, arrival_ns: int) -> None:
        if self.heartbeat_ns == 0:
            raise ProtocolError(errors.E_INVALID, "cannot SUB with heartbeats disabled")
        self.consumer_class = self._class_at_sub()
        self.conn.subscribe(cmd.topic, cmd.channel)
        self.conn.write(OK_FRAME)

    def _pub(self, cmd: Pub, arrival_ns: int) -> None:
        if self.fake_relay:
            self._refuse_fake_relay()
        self.conn.publish(cmd.topic, [cmd.body], arrival_ns)
        self.conn.write(OK_FRAME)

    def _pubs(self, cmd: Pubs, arrival_ns: int) -> None:
        """A PUB of each body, taken as one publish (and so taken or refused whole, as an
        MPUB of them would be: the broker makes runs only where nothing judges each PUB),
        each answered OK."""
        if self.fake_relay:
            self._refuse_fake_relay()
        self.conn.publish(cmd.topic, cmd.bodies, arrival_ns)
        self.conn.write(OK_FRAME * len(cmd.bodies))

    def _mpub(self, cmd: Mpub, arrival_ns: int) -> None:
        if self.fake_relay:
            self._refuse_fake_relay()
        try:
            self.conn.publish(cmd.topic, cmd.bodies, arrival_ns)
        except ProtocolError as err:
            raise _failed_as(err, errors.E_MPUB_FAILED) from err
        self.conn.write(OK_FRAME)

    def _dpub(self, cmd: Dpub, arrival_ns: int) -> None:
        if self.fake_relay:
            self._refuse_fake_relay()
        try:
            self.conn.publish_deferred(cmd.topic, cmd.body, cmd.defer_ms, arrival_ns)
        except ProtocolError as err:
            raise _failed_as(err, errors.E_DPUB_FAILED) from err
        self.conn.write(OK_FRAME)

    def _rdy(self, cmd: Rdy, arrival_ns: int) -> None:
        self.conn.ready(cmd.count)

    def _fin(self, cmd: Fin, arrival_ns: int) -> None:
        why = self.conn.finish(cmd.message_id)
        if why is not None:
            raise _settle_failed("FIN", cmd.message_id, why)

    def _fins(self, cmd: Fins, arrival_ns: int) -> None:
        """As ``_fin`` of each, in one call to the connection; each that failed is
        answered with its error frame (not fatal: the rest run, as one by one)."""
        for mid, why in self.conn.finish_many(cmd.message_ids):
            self.conn.write(error(_settle_failed("FIN", mid, why)))

    def _req(self, cmd: Req, arrival_ns: int) -> None:
        why = self.conn.requeue(cmd.message_id, cmd.timeout_ms * 1_000_000)
        if why is not None:
            raise _settle_failed("REQ", cmd.message_id, why)

    def _touch(self, cmd: Touch, arrival_ns: int) -> None:
        why = self.conn.touch(cmd.message_id)
        if why is not None:
            raise _settle_failed("TOUCH", cmd.message_id, why)

    def _cls(self, cmd: Cls, arrival_ns: int) -> None:
        self.conn.ready(0)  # nsqd's StartClose: RDY 0, so no more messages
        self.conn.write(CLOSE_WAIT_FRAME)

    def _nop(self, cmd: Nop, arrival_ns: int) -> None:
        pass

    def _handoff(self, cmd: Handoff, arrival_ns: int) -> None:
        # Only a broker's relay link hands a share over; any other client is refused as
        # for a command it has no business sending (the token is the real check).
        if self.fake_relay:
            self._refuse_fake_relay()
        if not self.relay:
            raise ProtocolError(errors.E_INVALID, "HANDOFF is for relay links")
        self.conn.handoff(cmd.topic, cmd.token)
        self.conn.write(OK_FRAME)


def is_valid_class(name: object) -> bool:
    """Whether ``name`` may be a consumer class (IDENTIFY ``srtm_class``)."""
    return isinstance(name, str) and _CLASS_NAME.fullmatch(name) is not None


def _invalid(what: str) -> ProtocolError:
    return ProtocolError(errors.E_BAD_BODY, f"IDENTIFY {what} is invalid")


def _check_types(config: dict[str, Any]) -> None:
    """Refuse what Go's decoder would not put in nsqd's identify struct."""
    for name, value in config.items():
        if value is None:
            continue
        if name in _INT_FIELDS:
            bits = 31 if name == "sample_rate" else 63  # an int32 in nsqd, else an int
            ok = type(value) is int and -(1 << bits) <= value < 1 << bits
        elif name in _BOOL_FIELDS:
            ok = type(value) is bool
        elif name in _STR_FIELDS:
            ok = type(value) is str
        else:
            continue
        if not ok:
            raise ProtocolError(errors.E_BAD_BODY, "IDENTIFY failed to decode JSON body")


def _failed_as(err: ProtocolError, code: str) -> ProtocolError:
    """nsqd's code for a refused MPUB or DPUB (the connection raises E_PUB_FAILED)."""
    if err.code != errors.E_PUB_FAILED:
        return err
    command = code.removeprefix("E_").removesuffix("_FAILED")  # MPUB, DPUB
    return ProtocolError(code, err.message.replace("PUB", command, 1))


def _settle_failed(name: str, message_id: bytes, why: str) -> ProtocolError:
    shown = message_id.decode(errors="replace")
    return ProtocolError(f"E_{name}_FAILED", f"{name} {shown} failed {why}")


_RUN: dict[type[Command], _Handler] = {
    Identify: Session._identify,
    Auth: Session._auth,
    Sub: Session._sub,
    Pub: Session._pub,
    Pubs: Session._pubs,
    Mpub: Session._mpub,
    Dpub: Session._dpub,
    Rdy: Session._rdy,
    Fin: Session._fin,
    Fins: Session._fins,
    Req: Session._req,
    Touch: Session._touch,
    Cls: Session._cls,
    Nop: Session._nop,
    Handoff: Session._handoff,
}


def _refused(cmd: type[Command]) -> _Handler:
    message = f"cannot {command_name(cmd)} in current state"

    def refuse(session: Session, event: Any, arrival_ns: int) -> None:
        raise ProtocolError(errors.E_INVALID, message)

    return refuse


def _ignored(session: Session, event: Any, arrival_ns: int) -> None:
    pass


def _moving(run: _Handler, to: SessionState) -> _Handler:
    def run_then_enter(session: Session, event: Any, arrival_ns: int) -> None:
        run(session, event, arrival_ns)
        session._enter(to)

    return run_then_enter


def _raise(session: Session, event: Any, arrival_ns: int) -> None:
    raise event


def _handlers(state: SessionState) -> dict[type[Command | ProtocolError], _Handler]:
    """The table's row for ``state`` as one dict lookup per command: the common commands
    (those that stay in their state) call their handler directly."""
    row = TRANSITIONS[state]
    table: dict[type[Command | ProtocolError], _Handler] = {ProtocolError: _raise}
    for cmd in _COMMANDS:
        if cmd not in row:
            table[cmd] = _refused(cmd)
            continue
        to = row[cmd]
        if to is None:
            table[cmd] = _ignored
        elif to is state:
            table[cmd] = _RUN[cmd]
        else:
            table[cmd] = _moving(_RUN[cmd], to)
    return table


_HANDLERS = {state: _handlers(state) for state in SessionState}
