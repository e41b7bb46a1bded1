"""Frames out (server side) and frames in (client side) of NSQ's protocol V2."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from srtm.protocol.errors import ProtocolError

_HEADER = struct.Struct(">iI")
_MESSAGE = struct.Struct(">qH")
#: A message frame up to its body: size, type, timestamp, attempts, the 16-byte id (for
#: building many: one pack and the body per message).
MESSAGE_HEAD = struct.Struct(">iIqH16s")
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
_TYPES = {int(k): k for k in FrameType}
#: Where a message frame's fields start in its data: attempts, the 16-byte id, the body.
ATTEMPTS_AT, ID_AT, BODY_AT = 8, 10, 26


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameType
    data: bytes


@dataclass(frozen=True, slots=True)
class MessageFrame:
    timestamp_ns: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes) -> MessageFrame:
    if len(data) < BODY_AT:
        raise ValueError(f"message frame too short: {len(data)} bytes")
    timestamp, attempts = _MESSAGE.unpack_from(data, 0)
    return MessageFrame(timestamp, attempts, bytes(data[ID_AT:BODY_AT]), bytes(data[BODY_AT:]))


class FrameReader:
    """Client side, sans-I/O: bytes in, complete frames out; a frame split across reads
    waits in ``buffer`` for the rest. Every NSQ frame decoder in SRTM reads through one."""

    def __init__(self, max_frame: int = 16 << 20) -> None:
        self.buffer = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes, as values."""
        buf = self.buffer
        return [Frame(_TYPES[k], bytes(buf[start:end])) for k, start, end in self.spans(data)]

    def spans(self, data: bytes = b"") -> Iterator[tuple[int, int, int]]:
        """The frames ``data`` completes, without copying them: ``(type, start, end)``, the
        frame's data being ``buffer[start:end]`` (a message's id at ``start + ID_AT``, its
        body from ``start + BODY_AT``) until the iteration ends and drops what it read.
        For readers that take a few fields of many messages (load generators)."""
        buf = self.buffer
        buf += data
        n = len(buf)
        pos = 0
        try:
            while n - pos >= 8:
                size, kind = _HEADER.unpack_from(buf, pos)
                if size < 4 or size > self._max:
                    raise ValueError(f"bad frame size {size}")
                end = pos + 4 + size
                if end > n:
                    break
                if kind not in _KINDS:
                    raise ValueError(f"unknown frame type {kind}")
                start, pos = pos + 8, end
                yield kind, start, end
        finally:
            del buf[:pos]
