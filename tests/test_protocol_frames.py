"""The client side's frame reader (srtm.protocol.frames.FrameReader): partial input, many
frames in one chunk, and the copy-free ``spans`` view the load generators read through."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.protocol import FrameReader, FrameType, ProtocolError, error, frame, message, response
from srtm.protocol.frames import ATTEMPTS_AT, BODY_AT, ID_AT

MID = b"0123456789abcdef"
kinds = st.sampled_from(list(FrameType))
frame_lists = st.lists(st.tuples(kinds, st.binary(max_size=120)), max_size=6)


def test_a_frame_split_at_every_byte_waits_for_its_last_byte() -> None:
    data = message(5, 2, MID, b"body")
    reader = FrameReader()
    for i in range(len(data) - 1):
        assert reader.feed(data[i : i + 1]) == []
    (got,) = reader.feed(data[-1:])
    assert (got.kind, got.data[ID_AT:BODY_AT], got.data[BODY_AT:]) == (
        FrameType.MESSAGE,
        MID,
        b"body",
    )
    assert reader.buffer == bytearray()


def test_several_frames_in_one_chunk_and_a_partial_one_kept() -> None:
    tail = response(b"_heartbeat_")
    data = response() + error(ProtocolError("E_INVALID", "no")) + message(1, 1, MID, b"x")
    reader = FrameReader()
    got = reader.feed(data + tail[:7])
    assert [(f.kind, f.data[:9]) for f in got] == [
        (FrameType.RESPONSE, b"OK"),
        (FrameType.ERROR, b"E_INVALID"),
        (FrameType.MESSAGE, struct.pack(">qB", 1, 0)),
    ]
    assert reader.buffer == tail[:7]
    (last,) = reader.feed(tail[7:])
    assert last.data == b"_heartbeat_"


def test_spans_point_into_the_buffer_until_the_iteration_ends() -> None:
    reader = FrameReader()
    seen = []
    for kind, start, end in reader.spans(message(9, 3, MID, b"abc") + response()):
        buf = reader.buffer
        if kind == FrameType.MESSAGE:
            attempts = int.from_bytes(buf[start + ATTEMPTS_AT : start + ID_AT], "big")
            seen.append((attempts, bytes(buf[start + ID_AT : start + BODY_AT])))
        seen.append((kind, bytes(buf[start:end][-3:])))
    assert seen == [(3, MID), (FrameType.MESSAGE, b"abc"), (FrameType.RESPONSE, b"OK")]
    assert reader.buffer == bytearray()  # dropped once read


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">iI", 3, 0),  # smaller than its type field
        struct.pack(">iI", 17 << 20, 0),  # over the limit, refused before it arrives
        struct.pack(">iI", 6, 9) + b"OK",  # no such frame type
    ],
)
def test_garbage_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        FrameReader().feed(data)


@given(frame_lists, st.lists(st.integers(0, 2_000), max_size=8))
def test_any_split_gives_the_frames_sent(
    frames: list[tuple[FrameType, bytes]], cuts: list[int]
) -> None:
    data = b"".join(frame(kind, body) for kind, body in frames)
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    reader = FrameReader()
    got = [(f.kind, f.data) for piece in pieces for f in reader.feed(piece)]
    assert got == frames
    assert reader.buffer == bytearray()


@given(frame_lists, st.integers(0, 2_000))
def test_spans_and_feed_agree(frames: list[tuple[FrameType, bytes]], cut: int) -> None:
    data = b"".join(frame(kind, body) for kind, body in frames)
    cut %= len(data) + 1
    by_feed = FrameReader()
    by_spans = FrameReader()
    fed = [(f.kind, f.data) for part in (data[:cut], data[cut:]) for f in by_feed.feed(part)]
    spanned = [
        (FrameType(kind), bytes(by_spans.buffer[start:end]))
        for part in (data[:cut], data[cut:])
        for kind, start, end in by_spans.spans(part)
    ]
    assert fed == spanned == frames
