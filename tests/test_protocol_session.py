"""The NSQ session state machine (srtm.protocol.session), without sockets: every state ×
command pair against nsqd's behaviour written out here, independently of the module's table."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.protocol import (
    CLOSE_WAIT,
    HEARTBEAT,
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Fins,
    FrameReader,
    Handoff,
    Identify,
    Limits,
    Mpub,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    error,
    errors,
    response,
)
from srtm.protocol.session import OK_FRAME, TRANSITIONS, Session, SessionSettings, SessionState

MID = b"0123456789abcdef"
MID2 = b"fedcba9876543210"
OK = response()

#: One instance of each command, and the calls an accepted one makes on the connection.
SAMPLES: dict[type[Command], tuple[Command, list[tuple[Any, ...]]]] = {
    Identify: (Identify({}), [("negotiated", False), ("write", OK)]),
    Auth: (Auth(b"secret"), []),
    Sub: (Sub("t", "c"), [("subscribe", "t", "c"), ("write", OK)]),
    Pub: (Pub("t", b"x"), [("publish", "t", [b"x"], 7), ("write", OK)]),
    Mpub: (Mpub("t", [b"a", b"b"]), [("publish", "t", [b"a", b"b"], 7), ("write", OK)]),
    Dpub: (Dpub("t", 5, b"x"), [("publish_deferred", "t", b"x", 5, 7), ("write", OK)]),
    Rdy: (Rdy(3), [("ready", 3)]),
    Fin: (Fin(MID), [("finish", MID)]),
    Fins: (Fins([MID, MID2]), [("finish_many", [MID, MID2])]),
    Req: (Req(MID, 2), [("requeue", MID, 2_000_000)]),
    Touch: (Touch(MID), [("touch", MID)]),
    Cls: (Cls(), [("ready", 0), ("write", response(CLOSE_WAIT))]),
    Nop: (Nop(), []),
}

INIT, SUB, CLOSING, CLOSED = SessionState
REFUSED = errors.E_INVALID
IGNORED = "ignored"
#: nsqd's protocol_v2.go, per state: the state an accepted command leads to, the error
#: code of a refused one, or IGNORED (read, nothing done).
EXPECTED: dict[SessionState, dict[type[Command], SessionState | str]] = {
    INIT: {
        Identify: INIT,
        Auth: "E_AUTH_DISABLED",  # no auth server: nsqd's IsAuthEnabled() is false
        Sub: SUB,
        Pub: INIT,
        Mpub: INIT,
        Dpub: INIT,
        Rdy: REFUSED,
        Fin: REFUSED,
        Fins: REFUSED,
        Req: REFUSED,
        Touch: REFUSED,
        Cls: REFUSED,
        Nop: INIT,
    },
    SUB: {
        Identify: REFUSED,
        Auth: REFUSED,
        Sub: REFUSED,
        Pub: SUB,
        Mpub: SUB,
        Dpub: SUB,
        Rdy: SUB,
        Fin: SUB,
        Fins: SUB,
        Req: SUB,
        Touch: SUB,
        Cls: CLOSING,
        Nop: SUB,
    },
    CLOSING: {
        Identify: REFUSED,
        Auth: REFUSED,
        Sub: REFUSED,
        Pub: CLOSING,
        Mpub: CLOSING,
        Dpub: CLOSING,
        Rdy: IGNORED,  # "just ignore ready changes on a closing channel"
        Fin: CLOSING,
        Fins: CLOSING,
        Req: CLOSING,
        Touch: CLOSING,
        Cls: REFUSED,
        Nop: CLOSING,
    },
    CLOSED: dict.fromkeys(SAMPLES, IGNORED),
}


class FakeConnection:
    """Records what the session asks; ``fail`` makes the named call refuse."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, Exception | str] = {}

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        failure = self.fail.get(call[0])
        if isinstance(failure, Exception):
            raise failure

    def _settle(self, *call: Any) -> str | None:
        self.calls.append(call)
        failure = self.fail.get(call[0])
        return failure if isinstance(failure, str) else None

    def write(self, data: bytes) -> None:
        self._call("write", data)

    def handoff(self, topic: str, token: str) -> None:
        self._call("handoff", topic, token)

    def publish(self, topic: str, bodies: list[bytes], arrival_ns: int) -> None:
        self._call("publish", topic, bodies, arrival_ns)

    def publish_one(self, topic: str, body: bytes, arrival_ns: int) -> bool:
        """Kept, unless ``fail`` names it (a string: not kept at once)."""
        self._call("publish_one", topic, body, arrival_ns)
        return "publish_one" not in self.fail

    def publish_deferred(self, topic: str, body: bytes, defer_ms: int, arrival_ns: int) -> None:
        self._call("publish_deferred", topic, body, defer_ms, arrival_ns)

    def subscribe(self, topic: str, channel: str) -> None:
        self._call("subscribe", topic, channel)

    def ready(self, count: int) -> None:
        self._call("ready", count)

    def finish(self, message_id: bytes) -> str | None:
        return self._settle("finish", message_id)

    def finish_many(self, message_ids: list[bytes]) -> list[tuple[bytes, str]]:
        self.calls.append(("finish_many", message_ids))
        failure = self.fail.get("finish")
        return [(m, failure) for m in message_ids if m == MID] if isinstance(failure, str) else []

    def requeue(self, message_id: bytes, delay_ns: int) -> str | None:
        return self._settle("requeue", message_id, delay_ns)

    def touch(self, message_id: bytes) -> str | None:
        return self._settle("touch", message_id)

    def negotiated(self, heartbeat_changed: bool) -> None:
        self._call("negotiated", heartbeat_changed)

    def start_tls(self) -> None:
        self._call("start_tls")


def session_in(state: SessionState, **settings: Any) -> tuple[Session, FakeConnection]:
    conn = FakeConnection()
    session = Session(conn, SessionSettings(**settings))
    if state in (SUB, CLOSING):
        session.receive(Sub("t", "c"), 0)
    if state is CLOSING:
        session.receive(Cls(), 0)
    if state is CLOSED:
        session.close()
    conn.calls.clear()
    assert session.state is state
    return session, conn


PAIRS = [(state, cmd) for state in EXPECTED for cmd in EXPECTED[state]]


def test_every_state_and_command_is_covered() -> None:
    assert set(EXPECTED) == set(SessionState)
    assert all(set(row) == set(SAMPLES) for row in EXPECTED.values())


@pytest.mark.parametrize(("state", "cmd"), PAIRS, ids=[f"{s.value}-{c.__name__}" for s, c in PAIRS])
def test_state_by_command(state: SessionState, cmd: type[Command]) -> None:
    session, conn = session_in(state)
    sample, calls = SAMPLES[cmd]
    expected = EXPECTED[state][cmd]
    assert session.accepts(cmd) is (expected != REFUSED)
    if isinstance(expected, SessionState):
        session.receive(sample, 7)
        assert session.state is expected
        assert conn.calls == calls
    elif expected == IGNORED:
        session.receive(sample, 7)
        assert session.state is state
        assert conn.calls == []
    else:
        with pytest.raises(ProtocolError) as info:
            session.receive(sample, 7)
        assert info.value.code == expected
        assert info.value.fatal
        if expected == REFUSED:
            wire = "FIN" if cmd is Fins else cmd.__name__.upper()  # a run of FINs is FIN
            assert str(info.value) == f"E_INVALID cannot {wire} in current state"
        assert session.state is state
        assert conn.calls == []


@given(st.lists(st.sampled_from(sorted(SAMPLES, key=lambda c: c.__name__)), max_size=30))
def test_sequences_follow_nsqd(commands: list[type[Command]]) -> None:
    """Any sequence: the session's state walks EXPECTED's, up to the first fatal error."""
    session, _ = session_in(INIT)
    state = INIT
    for cmd in commands:
        expected = EXPECTED[state][cmd]
        try:
            session.receive(SAMPLES[cmd][0], 0)
        except ProtocolError as err:
            assert err.code == expected
            return
        assert not (isinstance(expected, str) and expected != IGNORED)
        state = expected if isinstance(expected, SessionState) else state
        assert session.state is state


def test_the_table_is_the_one_tested() -> None:
    """TRANSITIONS, read back: accepted (and where to), ignored, or refused."""
    for state, row in EXPECTED.items():
        for cmd, expected in row.items():
            if isinstance(expected, SessionState):
                assert TRANSITIONS[state][cmd] is expected
            elif expected == IGNORED:
                assert TRANSITIONS[state][cmd] is None
            elif expected == REFUSED:
                assert cmd not in TRANSITIONS[state]
            else:  # AUTH: the state takes it, and without an auth server it is refused
                assert TRANSITIONS[state][cmd] is state


# -- a sensor's read: one publish taken in place (``publish_one``) ----------------------------
ONE_PUBLISH = [Pub("t", b"m"), Mpub("t", [b"m"])]


@pytest.mark.parametrize("state", list(SessionState), ids=lambda s: s.value)
@pytest.mark.parametrize("cmd", ONE_PUBLISH, ids=["PUB", "MPUB-of-one"])
def test_publish_one_answers_where_receive_runs_it_in_place(
    state: SessionState, cmd: Pub | Mpub
) -> None:
    """It answers OK, the connection having kept the message at once, exactly where the
    table runs the command and stays; elsewhere it does nothing (``receive`` refuses,
    ignores or moves on)."""
    session, conn = session_in(state)
    answer = session.publish_one(cmd, 7)
    if EXPECTED[state][type(cmd)] is state:
        assert answer == OK_FRAME
        assert conn.calls == [("publish_one", "t", b"m", 7)]
    else:
        assert answer is None
        assert conn.calls == []
    assert session.state is state


def test_publish_one_leaves_what_it_does_not_take_to_receive() -> None:
    """An MPUB of two, a relay link's fake publisher, or a message the connection does
    not keep at once: nothing done, nothing written (``receive`` runs them)."""
    session, conn = session_in(INIT)
    assert session.publish_one(Mpub("t", [b"a", b"b"]), 7) is None
    session.fake_relay = True
    assert session.publish_one(Pub("t", b"m"), 7) is None
    assert conn.calls == []
    session.fake_relay = False
    conn.fail["publish_one"] = "not at once"
    assert session.publish_one(Pub("t", b"m"), 7) is None
    assert conn.calls == [("publish_one", "t", b"m", 7)]  # asked; nothing written


# -- what the commands do -------------------------------------------------------------------
def test_parse_errors_are_raised_back() -> None:
    session, conn = session_in(INIT)
    err = ProtocolError(errors.E_BAD_TOPIC, "nope")
    with pytest.raises(ProtocolError) as info:
        session.receive(err, 0)
    assert info.value is err and conn.calls == []


def test_handoff_is_run_for_a_relay_link_only_and_never_after_sub() -> None:
    """SRTM's HANDOFF (docs/broker.md, "Handoff"): a relay link's, before any SUB."""
    session, conn = session_in(INIT)
    session.receive(Identify({"srtm_relay": True}), 0)
    conn.calls.clear()
    session.receive(Handoff("t", "k"), 0)
    assert conn.calls == [("handoff", "t", "k"), ("write", OK)] and session.state is INIT
    for state, identity in ((INIT, {}), (INIT, {"srtm_relay": "yes"}), (SUB, {})):
        session, conn = session_in(state)
        if identity:
            session.receive(Identify(identity), 0)
            conn.calls.clear()
        with pytest.raises(ProtocolError) as info:
            session.receive(Handoff("t", "k"), 0)
        assert info.value.code == errors.E_INVALID and info.value.fatal
        assert conn.calls == []


def test_a_refused_sub_leaves_the_session_unsubscribed() -> None:
    session, conn = session_in(INIT)
    conn.fail["subscribe"] = ProtocolError(errors.E_BAD_CHANNEL, "too many channels")
    with pytest.raises(ProtocolError, match="too many channels"):
        session.receive(Sub("t", "c"), 0)
    assert session.state is INIT
    assert ("write", OK) not in conn.calls


@pytest.mark.parametrize(
    ("cmd", "call", "code", "text"),
    [
        (Mpub("t", [b"x"]), "publish", errors.E_MPUB_FAILED, "MPUB topic t full"),
        (Dpub("t", 1, b"x"), "publish_deferred", errors.E_DPUB_FAILED, "DPUB topic t full"),
        (Pub("t", b"x"), "publish", errors.E_PUB_FAILED, "PUB topic t full"),
    ],
)
def test_failed_publishes_get_the_commands_code(
    cmd: Command, call: str, code: str, text: str
) -> None:
    session, conn = session_in(INIT)
    conn.fail[call] = ProtocolError(errors.E_PUB_FAILED, "PUB topic t full")
    with pytest.raises(ProtocolError) as info:
        session.receive(cmd, 0)
    assert (info.value.code, info.value.message) == (code, text)
    assert ("write", OK) not in conn.calls


def test_other_publish_refusals_keep_their_code() -> None:
    session, conn = session_in(INIT)
    conn.fail["publish"] = ProtocolError(errors.E_BAD_TOPIC, "MPUB topic limit")
    with pytest.raises(ProtocolError) as info:
        session.receive(Mpub("t", [b"x"]), 0)
    assert info.value.code == errors.E_BAD_TOPIC


@pytest.mark.parametrize(
    ("cmd", "call", "code"),
    [
        (Fin(MID), "finish", "E_FIN_FAILED"),
        (Req(MID, 0), "requeue", "E_REQ_FAILED"),
        (Touch(MID), "touch", "E_TOUCH_FAILED"),
    ],
)
def test_settling_a_message_not_in_flight_is_not_fatal(cmd: Command, call: str, code: str) -> None:
    session, conn = session_in(SUB)
    conn.fail[call] = "not in flight"
    with pytest.raises(ProtocolError) as info:
        session.receive(cmd, 0)
    name = code.removeprefix("E_").removesuffix("_FAILED")
    assert str(info.value) == f"{code} {name} {MID.decode()} failed not in flight"
    assert not info.value.fatal
    assert session.state is SUB


def test_a_failed_fin_in_a_run_is_answered_and_the_rest_run() -> None:
    """Fins, as Fin of each: the one that failed gets its (non-fatal) error frame."""
    session, conn = session_in(SUB)
    conn.fail["finish"] = "not in flight"
    session.receive(Fins([MID2, MID, MID2]), 0)
    failed = ProtocolError("E_FIN_FAILED", f"FIN {MID.decode()} failed not in flight")
    assert conn.calls == [("finish_many", [MID2, MID, MID2]), ("write", error(failed))]
    assert session.state is SUB


# -- IDENTIFY -------------------------------------------------------------------------------
def identify(session: Session, **config: Any) -> None:
    session.receive(Identify(config), 0)


def reply(conn: FakeConnection) -> dict[str, Any]:
    written = b"".join(c[1] for c in conn.calls if c[0] == "write")
    (body,) = [f.data for f in FrameReader().feed(written) if f.data != b"OK"]
    doc: dict[str, Any] = json.loads(body)
    return doc


@pytest.mark.parametrize("interval", [999, 60_001, -2])
def test_identify_refuses_a_heartbeat_out_of_range(interval: int) -> None:
    session, conn = session_in(INIT)
    with pytest.raises(ProtocolError) as info:
        identify(session, heartbeat_interval=interval)
    assert info.value.code == errors.E_BAD_BODY and info.value.fatal
    assert conn.calls == []


@pytest.mark.parametrize("timeout", [999, 15 * 60_000 + 1])
def test_identify_refuses_a_msg_timeout_out_of_range(timeout: int) -> None:
    session, _ = session_in(INIT, limits=Limits(min_msg_timeout_ms=1_000))
    with pytest.raises(ProtocolError) as info:
        identify(session, msg_timeout=timeout)
    assert info.value.code == errors.E_BAD_BODY
    assert session.msg_timeout_ns == 60_000 * 1_000_000


def test_identify_negotiates_heartbeat_and_timeout() -> None:
    session, conn = session_in(INIT, heartbeat_interval_ms=30_000)
    identify(session, heartbeat_interval=5_000, msg_timeout=2_000)
    assert (session.heartbeat_ns, session.msg_timeout_ns) == (5_000_000_000, 2_000_000_000)
    assert conn.calls == [("negotiated", True), ("write", OK)]


def test_heartbeats_off_refuse_sub() -> None:
    session, _ = session_in(INIT)
    identify(session, heartbeat_interval=-1)
    assert session.heartbeat_ns == 0
    with pytest.raises(ProtocolError, match="heartbeats disabled"):
        session.receive(Sub("t", "c"), 0)
    assert session.state is INIT


def test_feature_negotiation_replies_with_the_settings() -> None:
    settings = {"version": "9.9", "broker_id": "b7", "auth": True}
    session, conn = session_in(INIT, **settings)
    identify(session, feature_negotiation=True, msg_timeout=5_000, tls_v1=True)
    doc = reply(conn)
    assert doc["version"] == "9.9" and doc["srtm_broker_id"] == "b7"
    assert doc["msg_timeout"] == 5_000 and doc["auth_required"] is True
    assert doc["tls_v1"] is False  # no certificate: no upgrade
    assert doc["max_rdy_count"] == Limits().max_rdy_count
    assert ("start_tls",) not in conn.calls


def test_tls_upgrades_once_with_its_ok_after_the_upgrade() -> None:
    session, conn = session_in(INIT, tls=True)
    identify(session, feature_negotiation=True, tls_v1=True)
    assert reply(conn)["tls_v1"] is True
    assert [c[0] for c in conn.calls] == ["negotiated", "write", "start_tls", "write"]
    assert conn.calls[-1] == ("write", OK)
    conn.calls.clear()
    identify(session, feature_negotiation=True, tls_v1=True)
    assert reply(conn)["tls_v1"] is False and ("start_tls",) not in conn.calls


def test_identity_names_the_publisher() -> None:
    session, _ = session_in(INIT)
    assert (session.publisher, session.attributed_to, session.takes_orders) == ("", "", False)
    identify(session, client_id="c1", srtm_orders=True)
    assert (session.publisher, session.attributed_to, session.takes_orders) == ("c1", "c1", True)
    identify(session, client_id="c1", srtm_publisher="p9", srtm_header_publisher=True)
    assert (session.publisher, session.attributed_to, session.takes_orders) == ("p9", None, False)


# -- heartbeats -----------------------------------------------------------------------------
def test_heartbeat_due_until_two_intervals_of_silence() -> None:
    session, _ = session_in(INIT, heartbeat_interval_ms=1_000)
    second = 1_000_000_000
    assert session.beat(now_ns=10 * second, last_read_ns=8 * second) == response(HEARTBEAT)
    assert session.beat(now_ns=10 * second + 1, last_read_ns=8 * second) is None
