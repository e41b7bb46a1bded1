"""The measurement header workload messages start with (DESIGN.md, Data).

Fixed 70 bytes: magic ``SRTM``, version, flags, sequence number, send time (ns,
CLOCK_REALTIME), publisher id and correlation group (UTF-8, NUL-padded to 24 bytes),
then padding up to the message size. Brokers treat bodies as opaque, except that a
connection may ask the broker to attribute each message to the publisher its header
names (``publisher_of``): one connection then carries many emulated publishers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"SRTM"
VERSION = 1
_HEADER = struct.Struct(">4sBBQq24s24s")
SIZE = _HEADER.size  # 70
_ID_BYTES = 24
_PUBLISHER_AT = 22  # magic, version, flags, seq, send time


@dataclass(frozen=True, slots=True)
class Header:
    publisher: str
    group: str | None
    seq: int
    send_ns: int


def _field(text: str, name: str) -> bytes:
    raw = text.encode()
    if len(raw) > _ID_BYTES or b"\0" in raw:
        raise ValueError(f"{name} must be at most {_ID_BYTES} UTF-8 bytes without NUL: {text!r}")
    return raw


def encode(header: Header, size: int = SIZE) -> bytes:
    """The header, padded with zeros to ``size`` bytes (at least the header's 70)."""
    body = _HEADER.pack(
        MAGIC,
        VERSION,
        0,
        header.seq,
        header.send_ns,
        _field(header.publisher, "publisher"),
        _field(header.group or "", "group"),
    )
    return body + bytes(max(0, size - SIZE))


def decode(body: bytes) -> Header | None:
    """The header of a workload message, or None for any other body."""
    if len(body) < SIZE or body[:4] != MAGIC or body[4] != VERSION:
        return None
    _, _, _, seq, send_ns, pub, group = _HEADER.unpack_from(body)
    g = group.rstrip(b"\0").decode(errors="replace")
    return Header(pub.rstrip(b"\0").decode(errors="replace"), g or None, seq, send_ns)


def publisher_of(body: bytes) -> str:
    """The publisher a workload message's header names ("" for any other body); cheap,
    for the broker's hot path."""
    if body[:4] != MAGIC or len(body) < SIZE:
        return ""
    return body[_PUBLISHER_AT : _PUBLISHER_AT + _ID_BYTES].rstrip(b"\0").decode(errors="replace")
