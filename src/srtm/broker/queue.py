"""A FIFO of messages bounded in memory: past ``mem_size`` it overflows to a backend."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol

from srtm.broker.message import Message


class Overflow(Protocol):
    """Where messages beyond the memory bound go (a disk queue), FIFO."""

    def push(self, msg: Message) -> None: ...

    def pop(self) -> Message | None: ...

    def __len__(self) -> int: ...

    def clear(self) -> None: ...


class MessageQueue:
    """FIFO order across memory and overflow: once anything overflowed, later messages
    follow it there until memory has caught up.

    Without an overflow backend (ephemeral topics and channels, as in nsqd) messages past
    the bound are dropped and counted in ``dropped``.
    """

    __slots__ = ("dropped", "mem", "mem_size", "overflow")

    def __init__(self, mem_size: int, overflow: Overflow | None = None) -> None:
        if mem_size < 0:
            raise ValueError(f"mem_size must be >= 0, got {mem_size}")
        self.mem: deque[Message] = deque()
        self.mem_size = mem_size
        self.overflow = overflow
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.mem) + (len(self.overflow) if self.overflow is not None else 0)

    def __bool__(self) -> bool:
        return bool(self.mem) or (self.overflow is not None and len(self.overflow) > 0)

    @property
    def backend_depth(self) -> int:
        return len(self.overflow) if self.overflow is not None else 0

    def append(self, msg: Message) -> bool:
        """Queue ``msg`` at the back; False if it had to be dropped (no backend, full)."""
        ov = self.overflow
        if ov is not None and (len(ov) or len(self.mem) >= self.mem_size):
            ov.push(msg)
            return True
        if len(self.mem) >= self.mem_size and ov is None:
            self.dropped += 1
            return False
        self.mem.append(msg)
        return True

    def appendleft(self, msg: Message) -> None:
        """Put a message back at the front (a requeue on disconnect); never dropped."""
        self.mem.appendleft(msg)

    def _refill(self) -> None:
        ov = self.overflow
        if ov is None:
            return
        while len(ov) and len(self.mem) < max(1, self.mem_size):
            msg = ov.pop()
            if msg is None:
                break
            self.mem.append(msg)

    def peek(self) -> Message | None:
        if not self.mem:
            self._refill()
        return self.mem[0] if self.mem else None

    def popleft(self) -> Message:
        if not self.mem:
            self._refill()
        return self.mem.popleft()

    def drain(self) -> Iterator[Message]:
        """Take every message, in order (memory first, then the backend)."""
        while self:
            yield self.popleft()

    def clear(self) -> int:
        n = len(self)
        self.mem.clear()
        if self.overflow is not None:
            self.overflow.clear()
        return n
