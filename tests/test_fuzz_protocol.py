"""The NSQ codec under hostile input (hypothesis): arbitrary bytes and mutated valid streams
give only commands or ProtocolError events, the same ones however the bytes are split,
and frames round-trip. Deep JSON in IDENTIFY is refused with E_BAD_BODY (finding 10)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_fuzz import commands, cut_lists, mutated_streams, split, stream
from srtm.protocol import (
    MAGIC_V2,
    Command,
    Fin,
    Fins,
    FrameReader,
    FrameType,
    Identify,
    Limits,
    Nop,
    Parser,
    ProtocolError,
    decode_message,
    frame,
    message,
)
from srtm.protocol.parser import _FIN_RUN, MAX_JSON_DEPTH, whole_fin_lines

COMMAND_TYPES = Command.__args__  # type: ignore[attr-defined]
#: The codec is cheap to fuzz: five times the profile's examples (a few seconds in all).
many = settings(max_examples=5 * settings.default.max_examples)


def normal(events: list[object]) -> list[object]:
    """Events made comparable: ProtocolError has no value equality."""
    return [("error", e.code, e.message) if isinstance(e, ProtocolError) else e for e in events]


def feed_split(data: bytes, cuts: list[int], limits: Limits | None = None) -> list[object]:
    parser = Parser(limits)
    events: list[object] = []
    for piece in split(data, cuts):
        events += parser.feed(piece)
    return events


def check_events(events: list[object]) -> None:
    """Only commands and ProtocolErrors, nothing after a fatal error."""
    for ev in events:
        assert isinstance(ev, (ProtocolError, *COMMAND_TYPES)), ev
    fatal = [i for i, ev in enumerate(events) if isinstance(ev, ProtocolError) and ev.fatal]
    assert not fatal or fatal[0] == len(events) - 1


@many
@given(st.binary(max_size=600), cut_lists)
def test_arbitrary_bytes_split_anywhere_give_the_same_events(data: bytes, cuts: list[int]) -> None:
    for raw in (data, MAGIC_V2 + data):
        whole = Parser().feed(raw)
        check_events(whole)
        assert normal(feed_split(raw, cuts)) == normal(whole)


@pytest.mark.slow
@many
@given(mutated_streams(), cut_lists)
def test_mutated_streams_split_anywhere_give_the_same_events(data: bytes, cuts: list[int]) -> None:
    whole = Parser().feed(data)
    check_events(whole)
    assert normal(feed_split(data, cuts)) == normal(whole)
    # Small limits reach the size checks with small inputs.
    small = Limits(max_msg_size=50, max_body_size=300, max_line=40)
    check_events(feed_split(data, [], small))
    assert normal(feed_split(data, cuts, small)) == normal(feed_split(data, [], small))


@pytest.mark.slow
@many
@given(st.lists(commands(), max_size=10), cut_lists)
def test_valid_streams_round_trip_split_anywhere(cmds: list[Command], cuts: list[int]) -> None:
    data = stream(cmds)
    assert feed_split(data, cuts) == cmds


def expanded(events: list[object]) -> list[object]:
    """A ``Fins`` as the ``Fin`` of each of its ids."""
    out: list[object] = []
    for ev in events:
        out += map(Fin, ev.message_ids) if isinstance(ev, Fins) else [ev]
    return out


def feed_batched(data: bytes, cuts: list[int]) -> list[object]:
    parser = Parser(batch_fins=True)
    return [ev for piece in split(data, cuts) for ev in parser.feed(piece)]


@many
@given(st.lists(commands(), max_size=10), st.integers(0, 40), cut_lists)
def test_batched_fins_are_the_same_commands(
    cmds: list[Command], fins: int, cuts: list[int]
) -> None:
    """The broker's parser (``batch_fins``) gives the same commands, FINs run together."""
    mids = [b"%016x" % i for i in range(fins)]
    data = stream([*map(Fin, mids), *cmds, *map(Fin, mids)])
    batched = feed_batched(data, cuts)
    check_events(batched)
    assert normal(expanded(batched)) == normal(feed_split(data, cuts))
    if fins and not cuts:  # a run read at once is one value
        assert isinstance(batched[0], Fins) and batched[0].message_ids[:fins] == mids


@many
@given(st.binary(max_size=600), cut_lists)
def test_batched_fins_of_arbitrary_bytes_are_the_same_events(data: bytes, cuts: list[int]) -> None:
    raw = MAGIC_V2 + data
    assert normal(expanded(feed_batched(raw, cuts))) == normal(feed_split(raw, cuts))


#: FIN lines, mostly well-formed; some with a space, "\r" or newline in their id.
fin_lines = st.builds(
    lambda mid, end: b"FIN " + mid + end,
    st.binary(min_size=16, max_size=16).map(lambda b: bytes(b"0a \r\n"[c % 5] for c in b))
    | st.just(b"0123456789abcdef"),
    st.sampled_from([b"\n", b"\n", b"\r\n", b""]),
)


@many
@given(st.lists(fin_lines | st.binary(max_size=30), max_size=30))
def test_the_quick_fin_check_agrees_with_the_regex(pieces: list[bytes]) -> None:
    """``whole_fin_lines``: what ``_FIN_RUN`` matches, where every whole line is one."""
    buf = bytearray(b"".join(pieces))
    for pos in range(min(len(buf), 30)):
        quick = whole_fin_lines(buf, pos)
        run = _FIN_RUN.match(buf, pos)
        if quick is not None:
            assert quick == (run.group() if run else b"")
            assert len(buf) - pos - len(quick) < 21  # every whole line
        elif run is not None:
            assert len(buf) - pos - len(run.group()) >= 21  # a whole line the run ends at


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
    got = [f for piece in split(data, cuts) for f in reader.feed(piece)]
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
