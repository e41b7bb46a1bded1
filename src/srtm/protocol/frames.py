"""Frames out (server side) and frames in (client side) of NSQ's protocol V2."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from srtm.protocol.errors import ProtocolError

_HEADER = struct.Struct(">iI")
_MESSAGE = struct.Struct(">qH")
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"


class FrameType(enum.IntEnum):
    RESPONSE = 0
    ERROR = 1
    MESSAGE = 2
    #: SRTM's own: a JSON order (e.g. migrate), sent only to clients that negotiated
    #: ``srtm_orders`` in IDENTIFY; plain NSQ clients never see one.
    SRTM = 3


def frame(kind: FrameType, data: bytes) -> bytes:
    """``[size][type][data]``, where size counts the 4-byte type."""
    return _HEADER.pack(len(data) + 4, kind) + data


def response(data: bytes = OK) -> bytes:
    return frame(FrameType.RESPONSE, data)


def error(err: ProtocolError) -> bytes:
    return frame(FrameType.ERROR, str(err).encode())


def message(timestamp_ns: int, attempts: int, message_id: bytes, body: bytes) -> bytes:
    """A message frame: ``[timestamp int64][attempts uint16][16-byte id][body]``."""
    header = _MESSAGE.pack(timestamp_ns, attempts)
    return _HEADER.pack(len(body) + 30, FrameType.MESSAGE) + header + message_id + body


_KINDS = frozenset(int(k) for k in FrameType)


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameType
    data: bytes


@dataclass(frozen=True, slots=True)
class Message:
    timestamp_ns: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes) -> Message:
    if len(data) < 26:
        raise ValueError(f"message frame too short: {len(data)} bytes")
    timestamp, attempts = _MESSAGE.unpack_from(data, 0)
    return Message(timestamp, attempts, bytes(data[10:26]), bytes(data[26:]))


class FrameReader:
    """Client side: bytes in, frames out."""

    def __init__(self, max_frame: int = 16 << 20) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= 8:
            size, kind = _HEADER.unpack_from(buf, pos)
            if size < 4 or size > self._max:
                raise ValueError(f"bad frame size {size}")
            if len(buf) - pos < 4 + size:
                break
            if kind not in _KINDS:
                raise ValueError(f"unknown frame type {kind}")
            out.append(Frame(FrameType(kind), bytes(buf[pos + 8 : pos + 4 + size])))
            pos += 4 + size
        del buf[:pos]
        return out
