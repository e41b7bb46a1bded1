"""Snappy's framing format, as nsqd speaks it after IDENTIFY asked for ``snappy``.

The codec (block compression, the masked CRC-32C of each chunk, the stream identifier) is
cramjam's; this module only cuts what the socket delivers into whole chunks, with the
bounds of golang/snappy's Reader (nsqd's), so a client cannot make a connection buffer
more than one chunk. Imported only by connections that negotiate snappy.
"""

from __future__ import annotations

import cramjam

#: The chunk a framed stream starts with (type 0xff, length 6, "sNaPpY").
STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_IDENTIFIER_TYPE = 0xFF
#: golang/snappy's Reader refuses a chunk longer than its buffer: the longest encoding of
#: a 64 KiB block (32 + 65536 + 65536/6) plus the 4-byte checksum.
MAX_CHUNK_LENGTH = 76_494
#: Chunk types 0x02..0x7f are reserved unskippable: a reader that meets one stops.
_RESERVED = range(0x02, 0x80)


class SnappyError(Exception):
    """The stream is not Snappy's framing format (or breaks golang/snappy's bounds)."""


class SnappyReader:
    """Framed snappy in (as it arrives, in any pieces), plain bytes out."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._started = False

    def feed(self, data: bytes) -> bytes:
        """The plain bytes of the chunks ``data`` completes; the rest of a chunk waits
        (at most one chunk). Raises SnappyError on a broken stream."""
        buf = self._buf
        buf += data
        end = 0
        while len(buf) - end >= 4:
            kind = buf[end]
            length = int.from_bytes(buf[end + 1 : end + 4], "little")
            if not self._started and kind != _IDENTIFIER_TYPE:
                raise SnappyError("the stream does not start with its identifier")
            if kind in _RESERVED:
                raise SnappyError(f"unsupported chunk type {kind:#x}")
            if length > MAX_CHUNK_LENGTH:
                raise SnappyError(f"chunk of {length} bytes")
            if len(buf) - end - 4 < length:
                break
            self._started = True
            end += 4 + length
        if not end:
            return b""
        # cramjam decodes whole streams: each batch of chunks gets the identifier in front
        # (a repeated identifier is allowed), and cramjam checks every chunk's CRC, the
        # identifier's body and each block's decoded length (at most 64 KiB).
        chunks = STREAM_IDENTIFIER + buf[:end]
        del buf[:end]
        try:
            return bytes(cramjam.snappy.decompress(chunks))
        except cramjam.DecompressionError as exc:
            raise SnappyError(str(exc)) from None


class SnappyWriter:
    """Plain bytes in, framed snappy out; each write is flushed whole (the first one
    carries the stream identifier), so a frame never waits in the compressor."""

    def __init__(self) -> None:
        self._compressor = cramjam.snappy.Compressor()

    def write(self, data: bytes) -> bytes:
        if not data:
            return b""
        self._compressor.compress(data)
        return bytes(self._compressor.flush())
