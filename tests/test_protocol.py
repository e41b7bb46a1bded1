from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.protocol import (
    MAGIC_V2,
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    FrameReader,
    FrameType,
    Identify,
    Limits,
    Mpub,
    Nop,
    Parser,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    decode_message,
    encode_command,
    error,
    is_valid_name,
    message,
    response,
)

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,50}(#ephemeral)?", fullmatch=True)
bodies = st.binary(min_size=1, max_size=300)
# Like nsqd, the parser drops a line's trailing \r, so an id cannot end in one (real ids
# are 16 hex characters).
ids = st.binary(min_size=16, max_size=16).filter(
    lambda b: b" " not in b and b"\n" not in b and not b.endswith(b"\r")
)
commands = st.one_of(
    st.builds(Identify, st.dictionaries(st.text(max_size=8), st.integers(), max_size=4)),
    st.builds(Auth, st.binary(min_size=1, max_size=40)),
    st.builds(Sub, names, names),
    st.builds(Pub, names, bodies),
    st.builds(Mpub, names, st.lists(bodies, min_size=1, max_size=8)),
    st.builds(Dpub, names, st.integers(0, 3_600_000), bodies),
    st.builds(Rdy, st.integers(0, 2500)),
    st.builds(Fin, ids),
    st.builds(Req, ids, st.integers(0, 3_600_000)),
    st.builds(Touch, ids),
    st.just(Cls()),
    st.just(Nop()),
)


def parse_all(data: bytes, chunk: int = 0, limits: Limits | None = None) -> list[object]:
    parser = Parser(limits)
    if not chunk:
        return list(parser.feed(data))
    out: list[object] = []
    for i in range(0, len(data), chunk):
        out += parser.feed(data[i : i + chunk])
    return out


@given(st.lists(commands, max_size=12), st.integers(0, 7))
def test_commands_round_trip_in_any_chunking(cmds: list[Command], chunk: int) -> None:
    data = MAGIC_V2 + b"".join(encode_command(c) for c in cmds)
    assert parse_all(data, chunk) == cmds


@given(st.binary(max_size=400), st.integers(0, 9))
def test_arbitrary_bytes_give_only_commands_or_protocol_errors(data: bytes, chunk: int) -> None:
    events = parse_all(MAGIC_V2 + data, chunk)
    for event in events:
        assert isinstance(event, (ProtocolError, *Command.__args__))  # type: ignore[attr-defined]
    fatal = [i for i, ev in enumerate(events) if isinstance(ev, ProtocolError) and ev.fatal]
    assert not fatal or fatal[0] == len(events) - 1  # nothing after a fatal error


@given(st.binary(max_size=100))
def test_arbitrary_bytes_without_magic(data: bytes) -> None:
    events = parse_all(data)
    assert all(isinstance(ev, ProtocolError) for ev in events)


def error_of(data: bytes, limits: Limits | None = None) -> ProtocolError:
    events = parse_all(MAGIC_V2 + data, limits=limits)
    assert events and isinstance(events[-1], ProtocolError), events
    return events[-1]


@pytest.mark.parametrize(
    ("data", "code", "text", "fatal"),
    [
        (b"BOGUS x\n", "E_INVALID", "invalid command BOGUS", True),
        (b"SUB t\n", "E_INVALID", "SUB insufficient number of parameters", True),
        (b"SUB bad!name ch\n", "E_BAD_TOPIC", "SUB topic name 'bad!name' is not valid", True),
        (b"SUB t " + b"c" * 65 + b"\n", "E_BAD_CHANNEL", "SUB channel name", True),
        (
            b"PUB t\n" + struct.pack(">i", 0),
            "E_BAD_MESSAGE",
            "PUB invalid message body size 0",
            True,
        ),
        (b"RDY 2501\n", "E_INVALID", "RDY count 2501 out of range 0-2500", True),
        (b"RDY -1\n", "E_INVALID", "RDY count -1 out of range 0-2500", True),
        (b"RDY x\n", "E_INVALID", "RDY could not parse count x", True),
        (b"FIN 123\n", "E_INVALID", "FIN invalid message ID '123'", True),
        (
            b"DPUB t 3600001\n" + struct.pack(">i", 1) + b"x",
            "E_INVALID",
            "DPUB timeout 3600001 out of range",
            True,
        ),
        (
            b"MPUB t\n" + struct.pack(">i", 4) + struct.pack(">i", 0),
            "E_BAD_BODY",
            "MPUB invalid message count 0",
            True,
        ),
        (
            b"IDENTIFY\n" + struct.pack(">i", 3) + b"{x}",
            "E_BAD_BODY",
            "IDENTIFY failed to decode JSON body",
            True,
        ),
    ],
)
def test_edge_cases_get_nsqd_codes(data: bytes, code: str, text: str, fatal: bool) -> None:
    err = error_of(data)
    assert err.code == code
    assert text in err.message
    assert err.fatal is fatal


def test_bad_magic_is_fatal() -> None:
    parser = Parser()
    (err,) = parser.feed(b"  V1PUB t\n")
    assert isinstance(err, ProtocolError) and err.code == "E_BAD_PROTOCOL" and err.fatal
    assert parser.failed and parser.feed(b"NOP\n") == []


def test_oversize_bodies_are_refused_before_they_arrive() -> None:
    limits = Limits(max_msg_size=100, max_body_size=1000)
    big = b"PUB t\n" + struct.pack(">i", 101)  # no body sent: refused on the size alone
    assert error_of(big, limits).message == "PUB message too big 101 > 100"
    mpub = b"MPUB t\n" + struct.pack(">i", 1001)
    assert error_of(mpub, limits).message == "MPUB body too big 1001 > 1000"
    inner = struct.pack(">i", 1) + struct.pack(">i", 101) + b"x" * 101
    mpub_msg = b"MPUB t\n" + struct.pack(">i", len(inner)) + inner
    assert error_of(mpub_msg, limits).message == "MPUB message too big 101 > 100"


def test_fin_req_touch_failures_are_not_fatal() -> None:
    assert not ProtocolError("E_FIN_FAILED", "x").fatal
    assert not ProtocolError("E_REQ_FAILED", "x").fatal
    assert not ProtocolError("E_TOUCH_FAILED", "x").fatal
    assert ProtocolError("E_BAD_TOPIC", "x").fatal


def test_req_timeout_is_clamped_and_bare_rdy_means_one() -> None:
    mid = b"0123456789abcdef"
    assert parse_all(MAGIC_V2 + b"REQ " + mid + b" 99999999\r\nRDY\n") == [
        Req(mid, 3_600_000),
        Rdy(1),
    ]


def test_garbage_without_newline_is_bounded() -> None:
    assert error_of(b"x" * 2000).message == "command line too long"


@given(
    st.integers(0, 2**62),
    st.integers(0, 65535),
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=200),
)
def test_message_frames_round_trip(ts: int, attempts: int, mid: bytes, body: bytes) -> None:
    reader = FrameReader()
    data = message(ts, attempts, mid, body) + response() + error(ProtocolError("E_X", "y"))
    frames = reader.feed(data[:5]) + reader.feed(data[5:])
    assert [f.kind for f in frames] == [FrameType.MESSAGE, FrameType.RESPONSE, FrameType.ERROR]
    msg = decode_message(frames[0].data)
    assert (msg.timestamp_ns, msg.attempts, msg.id, msg.body) == (ts, attempts, mid, body)
    assert frames[1].data == b"OK"
    assert frames[2].data == b"E_X y"


@pytest.mark.parametrize("name", ["t", "a.b_c-d", "x" * 64, "t#ephemeral"])
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)


# "t\n": a regex ending in `$` accepts a trailing newline; nsqd's does not.
@pytest.mark.parametrize("name", ["", "x" * 65, "t\n", "a b", "t#eph", "#ephemeral", "é"])
def test_invalid_names(name: str) -> None:
    assert not is_valid_name(name)
