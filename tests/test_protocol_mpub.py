"""An MPUB of equal-sized messages (as load tools send them) is cut in one call: the same
messages as the general loop, and any body that is not exactly such falls back to it."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from srtm.protocol import MAGIC_V2, Mpub, Parser, ProtocolError, encode_command


def parse(data: bytes) -> list[object]:
    return list(Parser().feed(MAGIC_V2 + data))


@given(st.integers(1, 300), st.integers(1, 120), st.integers(0, 2**32 - 1))
def test_equal_sized_messages_round_trip(count: int, size: int, seed: int) -> None:
    bodies = [(seed + i).to_bytes(8, "big") * (size // 8) + b"x" * (size % 8) for i in range(count)]
    cmd = Mpub("t", bodies)
    assert parse(encode_command(cmd)) == [cmd]


@given(st.integers(2, 50), st.integers(1, 40), st.data())
def test_one_message_of_another_size_is_cut_as_it_is(
    count: int, size: int, data: st.DataObject
) -> None:
    bodies = [b"%d" % i * size for i in range(count)]
    k = data.draw(st.integers(0, count - 1))
    bodies[k] += b"+"
    cmd = Mpub("t", bodies)
    assert parse(encode_command(cmd)) == [cmd]


def test_a_count_the_body_does_not_hold_fails_as_before() -> None:
    body = struct.pack(">i", 3) + (struct.pack(">i", 2) + b"ab") * 2  # three said, two there
    (err,) = parse(b"MPUB t\n" + struct.pack(">i", len(body)) + body)
    assert isinstance(err, ProtocolError) and "MPUB failed to read message(2)" in err.message
