"""A read holding exactly one PUB, or an MPUB of one message (a sensor's, ``one_publish``),
or whole FIN lines (a consumer's) is parsed without the parser's buffer: the same events
as the general parser gives for the same bytes, whatever they are; ``one_publish`` in C
(where ``srtm.protocol._pubrun`` was built at install) gives what its Python reference
gives."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.protocol import (
    MAGIC_V2,
    Fin,
    Mpub,
    Parser,
    ProtocolError,
    Pub,
    Sub,
    encode_command,
    parser,
)
from srtm.protocol.limits import Limits
from srtm.protocol.parser import one_publish_py

c_one_publish = parser._c_one_publish
#: Python's always, C's where it was built at install.
PARSERS = [one_publish_py] + ([c_one_publish] if c_one_publish is not None else [])

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
bodies = st.binary(min_size=1, max_size=200)
publishes = st.one_of(
    st.builds(Pub, names, bodies), st.builds(Mpub, names, st.lists(bodies, min_size=1, max_size=3))
)


def seen(event: object) -> object:
    """An event as compared: errors by what they say (exceptions compare by identity)."""
    if isinstance(event, ProtocolError):
        return ("error", event.code, event.message, event.fatal)
    return event


def whole(data: bytes, limits: Limits | None = None, batch_fins: bool = False) -> list[object]:
    """``data`` in one read after the magic: where the fast path applies."""
    parser = Parser(limits, batch_fins)
    assert parser.feed(MAGIC_V2) == []
    return [seen(e) for e in parser.feed(data)]


def general(data: bytes, limits: Limits | None = None, batch_fins: bool = False) -> list[object]:
    """The same bytes through the buffer: the first byte alone, then the rest."""
    parser = Parser(limits, batch_fins)
    out = parser.feed(MAGIC_V2 + data[:1])
    out += parser.feed(data[1:])
    return [seen(e) for e in out]


def mutated(data: bytes, at: int, byte: int) -> bytes:
    return data[:at] + bytes([byte]) + data[at + 1 :] if data else data


@given(publishes, st.data())
def test_the_same_events_as_the_general_parser(cmd: Pub | Mpub, draw: st.DataObject) -> None:
    data = encode_command(cmd)
    general(data)  # the topic's name is then one seen valid, as on a live connection
    assert whole(data) == general(data) == [cmd]
    # Cut short, run on into a second command, or one byte changed: still the same.
    cut = draw.draw(st.integers(1, len(data) - 1))
    at = draw.draw(st.integers(0, len(data) - 1))
    byte = draw.draw(st.integers(0, 255))
    for variant in (data[:cut], data + data[:cut], data + data, mutated(data, at, byte)):
        assert whole(variant) == general(variant)


@given(publishes, st.integers(-1, 1), st.integers(-1, 1))
def test_limits_are_kept(cmd: Pub | Mpub, msg_by: int, body_by: int) -> None:
    """Limits one byte under, at and over what the command needs."""
    data = encode_command(cmd)
    size = len(cmd.body) if isinstance(cmd, Pub) else max(map(len, cmd.bodies))
    body = len(data) - data.index(b"\n") - 5
    limits = Limits(max_msg_size=size + msg_by, max_body_size=body + body_by)
    general(data)
    assert whole(data, limits) == general(data, limits)


def test_the_parser_reads_a_sensor_s_publish_in_c_where_it_was_built() -> None:
    """Optional at install (no compiler: Python's is used); said here when missing."""
    if c_one_publish is None:
        pytest.skip("srtm.protocol._pubrun not built: the pure-Python one_publish is used")
    assert parser.one_publish is c_one_publish


@given(publishes, st.data(), st.integers(-1, 1), st.integers(-1, 1), st.integers(-2, 1))
def test_c_reads_what_python_reads(
    cmd: Pub | Mpub, draw: st.DataObject, msg_by: int, body_by: int, line_by: int
) -> None:
    """The same command, or None, for a publish whole, cut, run on, or with a byte
    changed (its size, count or newline among them), under limits around it."""
    data = encode_command(cmd)
    general(data)  # its topic's name found valid
    if draw.draw(st.booleans()):
        general(encode_command(Pub(draw.draw(names), b"x")))  # another name, the table grows
    size = len(cmd.body) if isinstance(cmd, Pub) else max(map(len, cmd.bodies))
    body, line = len(data) - data.index(b"\n") - 5, data.index(b"\n")
    limits = Limits(
        max_msg_size=size + msg_by, max_body_size=body + body_by, max_line=line + line_by
    )
    cut = draw.draw(st.integers(1, len(data) - 1))
    at = draw.draw(st.integers(0, len(data) - 1))
    byte = draw.draw(st.integers(0, 255))
    for variant in (data, data[:cut], data + data[:cut], mutated(data, at, byte)):
        for lim in (limits, Limits()):
            assert {repr(p(variant, lim)) for p in PARSERS} == {repr(one_publish_py(variant, lim))}


class _Called:
    """A command type whose fields are not slots: C makes it by calling it."""

    def __init__(self, topic: str, body: object) -> None:
        self.args = (topic, body)


@pytest.mark.skipif(c_one_publish is None, reason="srtm.protocol._pubrun not built")
def test_c_makes_a_command_by_its_slots_or_else_by_calling_its_type() -> None:
    """Pub and Mpub are made by setting their two slots, as their __init__ would: the
    same value, equal and hashed alike; a type without such slots is called."""
    from srtm.protocol import _pubrun

    general(b"PUB made\n" + struct.pack(">i", 1) + b"x")
    data = b"PUB made\n" + struct.pack(">i", 2) + b"ab"
    one = b"MPUB made\n" + struct.pack(">iii", 10, 1, 2) + b"ab"
    assert c_one_publish is not None
    made, reference = c_one_publish(data, Limits()), Pub("made", b"ab")
    assert type(made) is Pub and made == reference and hash(made) == hash(reference)
    assert c_one_publish(one, Limits()) == Mpub("made", [b"ab"])
    try:
        _pubrun.configure(parser._VALID_TOPICS, _Called, _Called)
        called = c_one_publish(data, Limits())
        assert isinstance(called, _Called) and called.args == ("made", b"ab")
        called = c_one_publish(one, Limits())
        assert isinstance(called, _Called) and called.args == ("made", [b"ab"])
    finally:
        _pubrun.configure(parser._VALID_TOPICS, Pub, Mpub)
    assert c_one_publish(data, Limits()) == reference


@pytest.mark.parametrize("one_publish", PARSERS)
def test_what_it_takes_and_leaves(one_publish: Callable[[bytes, Limits], object]) -> None:
    general(b"PUB seen\n" + struct.pack(">i", 1) + b"x")
    limits = Limits()
    assert one_publish(b"PUB seen\n" + struct.pack(">i", 2) + b"ab", limits) == Pub("seen", b"ab")
    one = b"MPUB seen\n" + struct.pack(">iii", 9, 1, 1) + b"z"
    assert one_publish(one, limits) == Mpub("seen", [b"z"])
    # a name never parsed before is left to the general path, which checks it
    assert one_publish(b"PUB unseen-x\n" + struct.pack(">i", 1) + b"x", limits) is None
    assert one_publish(b"PUB seen\r\n" + struct.pack(">i", 1) + b"x", limits) is None
    assert one_publish(b"PUB seen extra\n" + struct.pack(">i", 1) + b"x", limits) is None
    assert one_publish(b"PUB seen\n" + struct.pack(">i", 0), limits) is None
    two = b"MPUB seen\n" + struct.pack(">iii", 14, 2, 1) + b"z" + struct.pack(">i", 1) + b"y"
    assert one_publish(two, limits) is None
    assert whole(two) == general(two) == [Mpub("seen", [b"z", b"y"])]
    long_line = Limits(max_line=6)  # "PUB seen" is 8 bytes long
    data = b"PUB seen\n" + struct.pack(">i", 1) + b"x"
    assert one_publish(data, long_line) is None
    assert whole(data, long_line) == general(data, long_line)
    assert whole(data, long_line)[0][1] == "E_INVALID"  # type: ignore[index]


@pytest.mark.parametrize("one_publish", PARSERS)
def test_a_subscribed_topic_s_first_pub_takes_the_quick_path(
    one_publish: Callable[[bytes, Limits], object],
) -> None:
    """A consumer's SUB puts its topic among the names seen valid: the first PUB to it
    (the first release of a shaped topic, due on arrival) is not left to the general
    path. A bad name in a SUB is refused as before, and not taken."""
    parser._VALID_TOPICS.clear()
    data = b"PUB subscribed\n" + struct.pack(">i", 1) + b"x"
    assert one_publish(data, Limits()) is None
    assert general(b"SUB subscribed ch\n") == [Sub("subscribed", "ch")]
    assert one_publish(data, Limits()) == Pub("subscribed", b"x")
    refused = general(b"SUB bad*name ch\n")
    assert refused == [("error", "E_BAD_TOPIC", "SUB topic name 'bad*name' is not valid", True)]
    assert b"bad*name" not in parser._VALID_TOPICS
    assert general(b"SUB\n") == [
        ("error", "E_INVALID", "SUB insufficient number of parameters", True)
    ]


ids = st.binary(min_size=16, max_size=16)


@given(st.lists(ids, min_size=1, max_size=70), st.booleans(), st.data())
def test_fin_lines_give_the_same_events(
    mids: list[bytes], batch: bool, draw: st.DataObject
) -> None:
    """Ids with a space, a newline or a \r in them, a line cut short, a byte changed or
    another command after: the general parser's events, batched (``Fins``) or not."""
    data = b"".join(encode_command(Fin(m)) for m in mids)
    cut = draw.draw(st.integers(1, len(data) - 1))
    at = draw.draw(st.integers(0, len(data) - 1))
    byte = draw.draw(st.integers(0, 255))
    tail = encode_command(Pub("t", b"x"))
    for variant in (data, data[:cut], data + tail, mutated(data, at, byte)):
        assert whole(variant, batch_fins=batch) == general(variant, batch_fins=batch)


def test_whole_fin_lines_in_one_read() -> None:
    mids = [b"%016d" % i for i in range(40)]
    data = b"".join(encode_command(Fin(m)) for m in mids)
    assert whole(data) == [Fin(m) for m in mids]
    (fins,) = whole(data, batch_fins=True)
    assert fins.message_ids == mids  # type: ignore[attr-defined]
