"""The broker's C extensions read a record's int64 fields (``_int64.h``) as their Python
references do: every value from one 30-bit digit to the edges of int64 the same, and
one past an edge refused."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from srtm.broker import stats, tcp
from srtm.broker.disk import codec
from srtm.broker.queue import Record
from srtm.broker.stats import first_attempt_times, first_attempt_times_py
from srtm.broker.tcp import frame_records_py

LOW, HIGH = -(2**63), 2**63 - 1
#: One digit, two digits, a nanosecond timestamp, and the edges.
IN_RANGE = [0, 1, 2**30 - 1, 2**30, -(2**30), 1_764_000_000_000_000_000, LOW, HIGH]
PAST = [LOW - 1, HIGH + 1, 2**64]


def rec(ts: int, arrival: int = 0, release: int = 0) -> Record:
    return (b"%016x" % 1, b"body", ts, arrival, release, 0, "p", None)


def built(fn: Callable[..., Any] | None) -> Callable[..., Any]:
    if fn is None:
        pytest.skip("this C extension was not built: its Python reference is used")
    return fn


def framed(framer: Callable[[bytearray, list[Record]], None], recs: list[Record]) -> bytes:
    out = bytearray()
    framer(out, recs)
    return bytes(out)


@pytest.mark.parametrize("value", IN_RANGE)
def test_frames_and_disk_records_take_every_int64(value: int) -> None:
    c_frames, c_encode = built(tcp._c_frame_records), built(codec._c_encode_batch)
    recs = [rec(value, value, value)]
    assert framed(c_frames, recs) == framed(frame_records_py, recs)
    assert c_encode(recs) == codec.encode_batch_py(recs)


@pytest.mark.parametrize("value", PAST)
def test_frames_and_disk_records_refuse_past_int64(value: int) -> None:
    c_frames, c_encode = built(tcp._c_frame_records), built(codec._c_encode_batch)
    with pytest.raises(struct.error):
        framed(frame_records_py, [rec(value)])
    with pytest.raises(OverflowError):
        framed(c_frames, [rec(value)])
    for field in (2, 3, 4):
        bad = list(rec(0))
        bad[field] = value
        with pytest.raises((struct.error, OverflowError)):
            codec.encode_batch_py([tuple(bad)])  # type: ignore[list-item]
        with pytest.raises(OverflowError):
            c_encode([tuple(bad)])


@pytest.mark.parametrize("value", IN_RANGE)
def test_first_attempt_times_take_every_int64(value: int) -> None:
    """Arrival ``value``, release half of it, now a quarter: no difference leaves int64."""
    c_times = built(stats._c_first_attempt_times)
    recs = [rec(0, value, value // 2)]
    n, *times = c_times(recs, value // 4)
    want = first_attempt_times_py(recs, value // 4)
    assert [n, *(list(struct.unpack(f"{n}q", t)) for t in times)] == [
        want[0],
        *(list(w) for w in want[1:]),
    ]


@pytest.mark.parametrize("value", PAST)
def test_first_attempt_times_past_int64_are_left_to_python(value: int) -> None:
    """C refuses the field; Python takes it where the differences still fit."""
    c_times = built(stats._c_first_attempt_times)
    recs = [rec(0, value, 0)]
    with pytest.raises(OverflowError):
        c_times(recs, 0)
    try:
        want: object = first_attempt_times_py(recs, 0)
    except OverflowError:
        with pytest.raises(OverflowError):
            first_attempt_times(recs, 0)
    else:
        assert first_attempt_times(recs, 0) == want
