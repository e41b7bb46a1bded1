"""Hypothesis strategies for NSQ V2 streams, shared by the codec and session fuzz tests:
valid commands, and valid streams mutated (flips, insertions, deletions, truncations,
absurd size prefixes)."""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from srtm.protocol import (
    MAGIC_V2,
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Identify,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    encode_command,
)

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
bodies = st.binary(min_size=1, max_size=200)
# The parser drops a line's trailing \r, so an id cannot end in one.
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
#: The fields the broker reads, with values of every JSON type, beside arbitrary ones.
_KNOWN_FIELDS = [
    "heartbeat_interval", "msg_timeout", "feature_negotiation", "client_id", "hostname",
    "user_agent", "srtm_publisher", "srtm_orders", "srtm_header_publisher", "srtm_group",
    "srtm_rate", "tls_v1", "deflate", "snappy", "sample_rate", "output_buffer_size",
    "output_buffer_timeout",
]  # fmt: skip
_field_values = json_values | st.sampled_from([-1, 0, 1, 999, 1000, 60_000, 60_001, 2**63, True])
identify_configs = st.dictionaries(
    st.sampled_from(_KNOWN_FIELDS) | st.text(max_size=12), _field_values, max_size=6
)


def commands(
    topics: st.SearchStrategy[str] = names,
    channels: st.SearchStrategy[str] = names,
    defer_ms: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[Command]:
    """Valid commands; topics, channels and DPUB delays from the given strategies."""
    defer_ms = st.integers(0, 3_600_000) if defer_ms is None else defer_ms
    return st.one_of(
        st.builds(Identify, identify_configs),
        st.builds(Auth, st.binary(min_size=1, max_size=40)),
        st.builds(Sub, topics, channels),
        st.builds(Pub, topics, bodies),
        st.builds(Mpub, topics, st.lists(bodies, min_size=1, max_size=6)),
        st.builds(Dpub, topics, defer_ms, bodies),
        st.builds(Rdy, st.integers(0, 2500)),
        st.builds(Fin, ids),
        st.builds(Req, ids, st.integers(0, 3_600_000)),
        st.builds(Touch, ids),
        st.just(Cls()),
        st.just(Nop()),
    )


def stream(cmds: list[Command]) -> bytes:
    return MAGIC_V2 + b"".join(encode_command(c) for c in cmds)


_MUTATIONS = ["flip", "set", "insert", "delete", "truncate", "size"]
_SPECIAL_BYTES = [0, 0xFF, ord("\n"), ord(" "), ord("\r"), ord("{"), ord("[")]
_SIZES = [-1, 0, 1, 2**31 - 1, -(2**31), 1 << 20, (1 << 20) + 1, 5 << 20, (5 << 20) + 1]


def mutate(draw: st.DrawFn, data: bytes, max_mutations: int = 6) -> bytes:
    """``data`` after up to ``max_mutations`` random edits."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, max_mutations))):
        kind = draw(st.sampled_from(_MUTATIONS))
        at = draw(st.integers(0, max(0, len(buf) - 1)))
        if kind == "flip" and buf:
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and buf:
            buf[at] = draw(st.sampled_from(_SPECIAL_BYTES))
        elif kind == "insert":
            extra = st.binary(min_size=1, max_size=8) | st.sampled_from([b"\n", b" ", b"NOP\n"])
            buf[at:at] = draw(extra)
        elif kind == "delete":
            del buf[at : at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del buf[at:]
        elif kind == "size" and len(buf) >= at + 4:
            # An absurd size prefix where a size might be: negative, zero, huge.
            buf[at : at + 4] = struct.pack(">i", draw(st.sampled_from(_SIZES)))
    return bytes(buf)


def mutated_streams(
    cmds: st.SearchStrategy[Command] | None = None, max_commands: int = 8
) -> st.SearchStrategy[bytes]:
    """Valid streams of ``cmds``, mutated."""
    each = commands() if cmds is None else cmds

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        return mutate(draw, stream(draw(st.lists(each, max_size=max_commands))))

    return build()


#: Where to split a stream into reads (taken modulo its length + 1).
cut_lists = st.lists(st.integers(0, 4096), max_size=12)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` in pieces, cut at ``cuts`` (modulo its length + 1)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces
