"""The framed-snappy reader: a stream cut anywhere decodes to what was written, and what
it holds back is never more than one chunk."""

from __future__ import annotations

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.broker.snappy import MAX_CHUNK_LENGTH, SnappyError, SnappyReader, SnappyWriter


@given(
    writes=st.lists(st.binary(max_size=3000) | st.just(b"ab" * 40_000), max_size=6),
    cuts=st.lists(st.integers(1, 5000), max_size=40),
)
def test_a_stream_cut_anywhere_reads_back_whole(writes: list[bytes], cuts: list[int]) -> None:
    writer = SnappyWriter()
    stream = b"".join(writer.write(w) for w in writes)
    reader = SnappyReader()
    plain, pos = b"", 0
    for n in [*cuts, len(stream)]:
        plain += reader.feed(stream[pos : pos + n])
        pos += n
        assert len(reader._buf) <= 4 + MAX_CHUNK_LENGTH
    assert plain == b"".join(writes)


def test_what_cramjam_writes_is_one_framed_stream() -> None:
    writer = SnappyWriter()
    stream = writer.write(b"one") + writer.write(b"") + writer.write(b"two")
    assert bytes(cramjam.snappy.decompress(stream)) == b"onetwo"


def test_a_chunk_too_long_is_refused_from_its_header() -> None:
    reader = SnappyReader()
    reader.feed(b"\xff\x06\x00\x00sNaPpY")
    with pytest.raises(SnappyError):
        reader.feed(b"\x00" + (MAX_CHUNK_LENGTH + 1).to_bytes(3, "little"))
