"""A connection's two socket calls on the hot path: a read with the kernel's receive
stamp (SO_TIMESTAMPNS), and a send. Both never wait (``MSG_DONTWAIT``), and raise as the
socket module does (``BlockingIOError`` when nothing is there, or no room).

In C where ``srtm.broker._sockio`` was built at install (it keeps the GIL and parses the
stamp itself: about 1 µs less a read and its answer), else through the socket object
(``recv_stamped_py``, ``send_py``: the reference the tests hold it to).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from types import ModuleType

#: What a send takes.
Data = bytes | bytearray | memoryview

#: Linux's SO_TIMESTAMPNS (== SCM_TIMESTAMPNS); the socket module does not export it.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)
_RECV_FLAGS = socket.MSG_DONTWAIT
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


def recv_stamped_py(sock: socket.socket, size: int) -> tuple[bytes, int, int]:
    """One read of at most ``size`` bytes: (the bytes, b"" at the end; the kernel's
    receive stamp in ns, 0 where it gave none; ``time.time_ns()`` just after)."""
    data, ancdata, _, _ = sock.recvmsg(size, _ANC_SIZE, _RECV_FLAGS)
    now = time.time_ns()
    stamp = 0
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(raw)
            stamp = sec * 1_000_000_000 + nsec
    return data, stamp, now


def send_py(sock: socket.socket, data: Data) -> int:
    """One send of ``data``: how many bytes went."""
    return sock.send(data, _SEND_FLAGS)


_c: ModuleType | None
try:
    from srtm.broker import _sockio as _c
except ImportError:  # not built (no compiler at install): through the socket object
    _c = None

#: What the broker calls: C's where it was built.
recv_stamped: Callable[[socket.socket, int], tuple[bytes, int, int]] = (
    recv_stamped_py if _c is None else _c.recv_stamped
)
send: Callable[[socket.socket, Data], int] = send_py if _c is None else _c.send
