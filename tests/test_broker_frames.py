"""A consumer's MESSAGE frames, built in C where ``srtm.broker._frames`` was built at
install: the same bytes as the Python reference, and what C does not take framed in
Python with nothing half-written."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.broker import tcp
from srtm.broker.queue import Record
from srtm.broker.tcp import frame_records, frame_records_py
from srtm.protocol import frames

c_frame_records = tcp._c_frame_records

records = st.builds(
    lambda mid, body, ts, attempts: (mid, body, ts, ts + 1, ts + 2, attempts, "p", None),
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=300),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**16 - 2),
)

#: The framers: Python's always, C's where it was built at install.
FRAMERS = [frame_records_py] + ([c_frame_records] if c_frame_records is not None else [])


def rec(i: int, attempts: int = 0, mid: bytes | None = None) -> Record:
    return (mid or b"%016x" % i, b"body %d" % i, 10 * i, 0, 0, attempts, "", None)


def test_the_c_framer_was_built() -> None:
    """Optional at install (no compiler: Python's is used); said here when missing."""
    if c_frame_records is None:
        pytest.skip("srtm.broker._frames not built: the pure-Python framer is used")


@pytest.mark.parametrize("framer", FRAMERS)
@given(batch=st.lists(records, max_size=20), before=st.binary(max_size=10))
def test_frames_decode_to_their_records(
    framer: Callable[[bytearray, list[Record]], None], batch: list[Record], before: bytes
) -> None:
    out = bytearray(before)
    framer(out, batch)
    assert out[: len(before)] == before
    got = []
    pos = len(before)
    while pos < len(out):
        (size,) = struct.unpack_from(">i", out, pos)
        (ftype,) = struct.unpack_from(">I", out, pos + 4)
        assert ftype == frames.FrameType.MESSAGE
        body = out[pos + 8 : pos + 4 + size]
        ts, attempts, mid = struct.unpack_from(">qH16s", body)
        got.append((mid, bytes(body[26:]), ts, attempts))
        pos += 4 + size
    assert got == [(r[0], r[1], r[2], r[5] + 1) for r in batch]


@given(batch=st.lists(records, max_size=20))
def test_c_frames_equal_python_frames(batch: list[Record]) -> None:
    if c_frame_records is None:
        pytest.skip("srtm.broker._frames not built")
    a, b = bytearray(b"x"), bytearray(b"x")
    c_frame_records(a, batch)
    frame_records_py(b, batch)
    assert a == b


@pytest.mark.parametrize(
    "odd",
    [
        rec(2, mid=b"short"),  # struct pads an id of another length
        (b"%016x" % 2, bytearray(b"body"), 20, 0, 0, 0, "", None),  # a bytearray body
    ],
)
def test_what_c_does_not_take_is_framed_in_python(odd: Record) -> None:
    if c_frame_records is not None:
        out = bytearray(b"kept")
        with pytest.raises(TypeError):
            c_frame_records(out, [rec(1), odd])
        assert out == b"kept"  # checked before anything is written
    got, want = bytearray(), bytearray()
    frame_records(got, [rec(1), odd])
    frame_records_py(want, [rec(1), odd])
    assert got == want


def test_attempts_past_a_frame_fail_as_in_python() -> None:
    out = bytearray()
    with pytest.raises(struct.error):
        frame_records(out, [rec(1, attempts=2**16 - 1)])
    if c_frame_records is not None:
        with pytest.raises(OverflowError):
            c_frame_records(out, [rec(1, attempts=2**16 - 1)])
    assert out == b""
