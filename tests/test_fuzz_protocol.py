"""The NSQ codec under hostile input (hypothesis): arbitrary bytes and mutated valid streams
give only commands or ProtocolError events, the same ones however the bytes are split,
and frames round-trip. Deep JSON in IDENTIFY is refused with E_BAD_BODY (finding 10)."""

from __future__ import annotations

import json
import struct
from typing import Any

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
    frame,
    message,
)
from srtm.protocol.parser import MAX_JSON_DEPTH

COMMAND_TYPES = Command.__args__  # type: ignore[attr-defined]

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
bodies = st.binary(min_size=1, max_size=200)
ids = st.binary(min_size=16, max_size=16).filter(
    lambda b: b" " not in b and b"\n" not in b and not b.endswith(b"\r")
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)
identify_configs = st.dictionaries(st.text(max_size=12), json_values, max_size=6)
commands = st.one_of(
    st.builds(Identify, identify_configs),
    st.builds(Auth, st.binary(min_size=1, max_size=40)),
    st.builds(Sub, names, names),
    st.builds(Pub, names, bodies),
    st.builds(Mpub, names, st.lists(bodies, min_size=1, max_size=6)),
    st.builds(Dpub, names, st.integers(0, 3_600_000), bodies),
    st.builds(Rdy, st.integers(0, 2500)),
    st.builds(Fin, ids),
    st.builds(Req, ids, st.integers(-10, 4_000_000)),
    st.builds(Touch, ids),
    st.just(Cls()),
    st.just(Nop()),
)


def normal(events: list[object]) -> list[object]:
    """Events made comparable: ProtocolError has no value equality."""
    return [("error", e.code, e.message) if isinstance(e, ProtocolError) else e for e in events]


def feed_split(data: bytes, cuts: list[int], limits: Limits | None = None) -> list[object]:
    parser = Parser(limits)
    events: list[object] = []
    last = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        events += parser.feed(data[last:cut])
        last = cut
    return events


def check_events(events: list[object]) -> None:
    """Only commands and ProtocolErrors, nothing after a fatal error."""
    for ev in events:
        assert isinstance(ev, (ProtocolError, *COMMAND_TYPES)), ev
    fatal = [i for i, ev in enumerate(events) if isinstance(ev, ProtocolError) and ev.fatal]
    assert not fatal or fatal[0] == len(events) - 1


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """Valid commands, then byte flips, truncations, insertions and deletions."""
    data = bytearray(
        MAGIC_V2 + b"".join(encode_command(c) for c in draw(st.lists(commands, max_size=8)))
    )
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "size"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.sampled_from([0, 0xFF, ord("\n"), ord(" "), ord("\r"), ord("{")]))
        elif kind == "insert":
            data[at:at] = draw(
                st.binary(min_size=1, max_size=8) | st.sampled_from([b"\n", b" ", b"NOP\n"])
            )
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "size" and len(data) >= at + 4:
            # An absurd size prefix where a size might be: negative, zero, huge.
            value = draw(st.sampled_from([-1, 0, 1, 2**31 - 1, -(2**31), 5 << 20, (5 << 20) + 1]))
            data[at : at + 4] = struct.pack(">i", value)
    return bytes(data)


cut_lists = st.lists(st.integers(0, 4096), max_size=12)


@given(st.binary(max_size=600), cut_lists)
def test_arbitrary_bytes_split_anywhere_give_the_same_events(data: bytes, cuts: list[int]) -> None:
    for stream in (data, MAGIC_V2 + data):
        whole = Parser().feed(stream)
        check_events(whole)
        split = feed_split(stream, [c % (len(stream) + 1) for c in cuts])
        assert normal(split) == normal(whole)


@given(mutated_streams(), cut_lists)
def test_mutated_streams_split_anywhere_give_the_same_events(data: bytes, cuts: list[int]) -> None:
    whole = Parser().feed(data)
    check_events(whole)
    split = feed_split(data, [c % (len(data) + 1) for c in cuts])
    assert normal(split) == normal(whole)
    # Small limits reach the size checks with small inputs.
    small = Limits(max_msg_size=50, max_body_size=300, max_line=40)
    check_events(feed_split(data, [], small))
    assert normal(feed_split(data, [c % (len(data) + 1) for c in cuts], small)) == normal(
        feed_split(data, [], small)
    )


@given(st.lists(commands, max_size=10), cut_lists)
def test_valid_streams_round_trip_split_anywhere(cmds: list[Command], cuts: list[int]) -> None:
    data = MAGIC_V2 + b"".join(encode_command(c) for c in cmds)
    assert feed_split(data, [c % (len(data) + 1) for c in cuts]) == cmds


def test_an_overlong_line_is_refused_however_it_arrives() -> None:
    """Found by the split test: a long line was "too long" only when it arrived without its
    newline; whole, it was parsed (here: E_BAD_TOPIC instead of E_INVALID)."""
    data = MAGIC_V2 + b"SUB " + b"t" * 2000 + b" c\n"
    for cuts in ([], [1500], list(range(0, len(data), 7))):
        (err,) = feed_split(data, cuts)
        assert isinstance(err, ProtocolError)
        assert (err.code, err.message) == ("E_INVALID", "command line too long")


# -- finding 10: deep JSON in IDENTIFY ----------------------------------------------------
def nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    inner = opener * depth + "1" + closer * depth
    return json.dumps({"client_id": "x"}).encode()[:-1] + b', "deep": ' + inner.encode() + b"}"


def identify_bytes(body: bytes) -> bytes:
    return MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">i", len(body)) + body + b"NOP\n"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 10_000, 200_000])
@pytest.mark.parametrize("brackets", [("[", "]"), ('{"a":', "}")])
def test_deeply_nested_identify_is_a_bad_body(depth: int, brackets: tuple[str, str]) -> None:
    opener, closer = brackets
    events = Parser().feed(identify_bytes(nested(depth, opener, closer)))
    (err,) = events
    assert isinstance(err, ProtocolError) and err.fatal
    assert err.code == "E_BAD_BODY"
    assert f"nested deeper than {MAX_JSON_DEPTH}" in err.message


def test_identify_at_the_depth_limit_is_accepted() -> None:
    body = nested(MAX_JSON_DEPTH - 1)  # the outer object is one level
    events = Parser().feed(identify_bytes(body))
    assert events == [Identify(json.loads(body)), Nop()]


def test_brackets_inside_strings_do_not_count() -> None:
    body = json.dumps({"client_id": "[" * 5000, "esc": '\\"[[[[' * 100}).encode()
    assert Parser().feed(identify_bytes(body)) == [Identify(json.loads(body)), Nop()]


@given(st.integers(0, 3 * MAX_JSON_DEPTH), st.lists(st.sampled_from(["[]", "{}"]), min_size=1))
def test_depth_bound_is_exact(depth: int, kinds: list[str]) -> None:
    """Mixed arrays and objects: accepted exactly up to the bound, refused above it."""
    value: Any = 1
    for i in range(depth):
        value = [value] if kinds[i % len(kinds)] == "[]" else {"k": value}
    body = json.dumps({"v": value}).encode()
    events = Parser().feed(identify_bytes(body))
    if depth + 1 <= MAX_JSON_DEPTH:
        assert events == [Identify({"v": value}), Nop()]
    else:
        (err,) = events
        assert isinstance(err, ProtocolError) and err.code == "E_BAD_BODY"


# -- frames ------------------------------------------------------------------------------
@given(
    st.lists(st.tuples(st.sampled_from(list(FrameType)), st.binary(max_size=300)), max_size=8),
    cut_lists,
)
def test_frames_round_trip_split_anywhere(
    frames: list[tuple[FrameType, bytes]], cuts: list[int]
) -> None:
    data = b"".join(frame(kind, body) for kind, body in frames)
    reader = FrameReader()
    got = []
    last = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        got += reader.feed(data[last:cut])
        last = cut
    assert [(f.kind, f.data) for f in got] == frames


@given(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 65535),
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=300),
)
def test_message_frames_round_trip(ts: int, attempts: int, mid: bytes, body: bytes) -> None:
    (f,) = FrameReader().feed(message(ts, attempts, mid, body))
    msg = decode_message(f.data)
    assert f.kind is FrameType.MESSAGE
    assert (msg.timestamp_ns, msg.attempts, msg.id, msg.body) == (ts, attempts, mid, body)


@given(st.binary(max_size=400))
def test_frame_reader_refuses_garbage_with_value_error_only(data: bytes) -> None:
    """The client side's contract: frames, or ValueError (the connection is then dropped)."""
    try:
        for f in FrameReader().feed(data):
            if f.kind is FrameType.MESSAGE and len(f.data) >= 26:
                decode_message(f.data)
    except ValueError:
        pass
