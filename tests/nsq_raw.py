"""A bare NSQ V2 client over asyncio streams, built on the project's own codec (tests only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from srtm.protocol import (
    MAGIC_V2,
    Command,
    Frame,
    FrameReader,
    FrameType,
    Identify,
    MessageFrame,
    decode_message,
    encode_command,
)


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._frames = FrameReader()
        self._pending: list[Frame] = []

    @classmethod
    async def connect(cls, host: str, port: int, magic: bytes = MAGIC_V2) -> RawClient:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(magic)
        return cls(reader, writer)

    async def send(self, *cmds: Command | bytes) -> None:
        self.writer.write(b"".join(c if isinstance(c, bytes) else encode_command(c) for c in cmds))
        await self.writer.drain()

    async def identify(self, **config: Any) -> dict[str, Any]:
        await self.send(Identify({"feature_negotiation": True, **config}))
        f = await self.frame()
        assert f.kind is FrameType.RESPONSE, f
        reply: dict[str, Any] = json.loads(f.data)
        return reply

    async def frame(self, timeout: float = 5.0, skip_heartbeats: bool = True) -> Frame:
        """The next frame; raises EOFError if the server closed the connection."""
        async with asyncio.timeout(timeout):
            while True:
                while self._pending:
                    f = self._pending.pop(0)
                    if skip_heartbeats and f.data == b"_heartbeat_":
                        continue
                    return f
                data = await self.reader.read(1 << 16)
                if not data:
                    raise EOFError("connection closed by the broker")
                self._pending += self._frames.feed(data)

    async def response(self) -> bytes:
        f = await self.frame()
        assert f.kind is FrameType.RESPONSE, f"expected a response, got {f}"
        return f.data

    async def error(self) -> str:
        f = await self.frame()
        assert f.kind is FrameType.ERROR, f"expected an error, got {f}"
        return f.data.decode()

    async def message(self, timeout: float = 5.0) -> MessageFrame:
        f = await self.frame(timeout)
        assert f.kind is FrameType.MESSAGE, f"expected a message, got {f}"
        return decode_message(f.data)

    async def closed(self, timeout: float = 5.0) -> bool:
        """True once the broker has closed the connection (frames before that are skipped)."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(1 << 16):
                    pass
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
