"""A publisher's run of PUBs, found in C where ``srtm.protocol._pubrun`` was built at
install: the same runs as the Python reference, and a parser that takes runs gives the
same events as one that reads every PUB line by line, however the bytes are split."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_fuzz import cut_lists, mutated_streams, split
from srtm.protocol import MAGIC_V2, Limits, Parser, ProtocolError, Pub, parser
from srtm.protocol.parser import pub_run_py

c_pub_run = parser._c_pub_run
RunFinder = Callable[[bytes | bytearray, int, int, int], tuple[bytes, list[bytes], int] | None]
#: The run finders: Python's always, C's where it was built at install.
FINDERS: list[RunFinder] = [pub_run_py] + ([c_pub_run] if c_pub_run is not None else [])
many = settings(max_examples=5 * settings.default.max_examples)
SMALL = Limits(max_msg_size=50, max_body_size=300, max_line=40)


def pub(topic: bytes, body: bytes, size: int | None = None) -> bytes:
    return b"PUB " + topic + b"\n" + struct.pack(">i", len(body) if size is None else size) + body


#: PUBs, plain and not (a carriage return, a second space, an extra parameter, a bad
#: topic, a long line, sizes out of range), and other commands between them.
pieces = st.one_of(
    st.builds(pub, st.sampled_from([b"t", b"u", b"t" * 60]), st.binary(min_size=1, max_size=80)),
    st.builds(
        pub,
        st.sampled_from([b"t\r", b" t", b"t x", b"bad!", b"", b"t\r\n"]),
        st.binary(min_size=1, max_size=5),
    ),
    st.builds(pub, st.just(b"t"), st.binary(max_size=3), st.sampled_from([0, -1, 2**31 - 1])),
    st.sampled_from([b"NOP\n", b"RDY 5\n", b"FIN " + b"0" * 16 + b"\n", b"PUB t"]),
)
streams = st.builds(b"".join, st.lists(pieces, max_size=12))


def test_the_parser_finds_runs_in_c_where_it_was_built() -> None:
    """Optional at install (no compiler: Python's is used); said here when missing."""
    if c_pub_run is None:
        pytest.skip("srtm.protocol._pubrun not built: the pure-Python run finder is used")
    assert parser.pub_run is c_pub_run


def test_a_run_is_the_plain_pubs_to_its_first_topic() -> None:
    data = pub(b"t", b"a") + pub(b"t", b"bc") + pub(b"u", b"d")
    for find in FINDERS:
        assert find(data, 0, 64, 100) == (b"t", [b"a", b"bc"], len(pub(b"t", b"a")) * 2 + 1)
        assert find(bytearray(data), 0, 64, 100) == find(data, 0, 64, 100)
        cut = len(pub(b"t", b"a") + pub(b"t", b"bc"))
        assert find(data, cut, 64, 100) == (b"u", [b"d"], len(data))
        assert find(data[:-1], cut, 64, 100) is None  # its body not whole yet
        assert find(pub(b"t", b"a", size=0), 0, 64, 100) is None  # the general path refuses
        assert find(pub(b"t", b"x" * 11), 0, 64, 10) is None  # too big: the same
        assert find(pub(b"t" * 61, b"x"), 0, 64, 10) is None  # a line over max_line
        assert find(pub(b"t" * 60, b"x"), 0, 64, 10) == (b"t" * 60, [b"x"], 70)


@many
@given(streams, st.integers(0, 200), st.sampled_from([(64, 100), (40, 50), (4, 1), (5, 3)]))
def test_c_finds_the_runs_python_does(data: bytes, pos: int, bounds: tuple[int, int]) -> None:
    pos = min(pos, len(data))
    want = pub_run_py(data, pos, *bounds)
    for find in FINDERS:
        assert find(data, pos, *bounds) == want
        assert find(bytearray(data), pos, *bounds) == want


def normal(events: list[object]) -> list[object]:
    return [("error", e.code, e.message) if isinstance(e, ProtocolError) else e for e in events]


def events_with(
    finder: RunFinder,
    data: bytes,
    cuts: list[int],
    limits: Limits | None,
    monkeypatch: pytest.MonkeyPatch,
) -> list[object]:
    monkeypatch.setattr(parser, "pub_run", finder)
    parser._VALID_TOPICS.clear()  # each parser meets its topics anew
    p = Parser(limits, batch_fins=True)
    return normal([ev for piece in split(data, cuts) for ev in p.feed(piece)])


@many
@given(streams, cut_lists, st.sampled_from([None, SMALL]))
def test_runs_give_the_events_of_line_by_line_parsing(
    data: bytes, cuts: list[int], limits: Limits | None
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        plain = events_with(lambda *_: None, MAGIC_V2 + data, cuts, limits, mp)
        for find in FINDERS:
            assert events_with(find, MAGIC_V2 + data, cuts, limits, mp) == plain


@pytest.mark.slow
@many
@given(mutated_streams(), cut_lists)
def test_runs_in_mutated_streams_give_the_same_events(data: bytes, cuts: list[int]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for limits in (None, SMALL):
            plain = events_with(lambda *_: None, data, cuts, limits, mp)
            for find in FINDERS:
                assert events_with(find, data, cuts, limits, mp) == plain


def test_a_pipelining_publishers_read_is_parsed_as_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first PUB to a topic (checked line by line), a read of PUBs to it is one
    run, and a PUB cut at the read's end waits for the rest."""
    found: list[int] = []

    def spy(
        buf: bytes | bytearray, pos: int, max_line: int, max_size: int
    ) -> tuple[bytes, list[bytes], int] | None:
        run = pub_run_py(buf, pos, max_line, max_size)
        found.append(0 if run is None else len(run[1]))
        return run

    monkeypatch.setattr(parser, "pub_run", spy)
    parser._VALID_TOPICS.clear()
    p = Parser()
    assert p.feed(MAGIC_V2 + pub(b"t", b"first")) == [Pub("t", b"first")]
    found.clear()
    read = b"".join(pub(b"t", b"%d" % i) for i in range(5))
    assert p.feed(read + pub(b"t", b"cut")[:-1]) == [Pub("t", b"%d" % i) for i in range(5)]
    assert found == [5, 0]  # the run once, then the cut PUB: none yet
    assert p.feed(b"t") == [Pub("t", b"cut")]
