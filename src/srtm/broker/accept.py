"""Accepting connections under pressure: which accept failures are retried how, and how a
connection over the limit is turned away. No asyncio here; the broker's accept loop uses it.
"""

from __future__ import annotations

import errno
import socket

from srtm.protocol import ProtocolError, frames

#: The error code a client over ``max_connections`` reads before the broker closes it.
E_TOO_MANY_CONNECTIONS = "E_TOO_MANY_CONNECTIONS"

#: The connection failed before it was accepted (accept(2): Linux passes pending network
#: errors on); the next one is unaffected, so accept again at once.
_GONE = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.ENETDOWN,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.ENONET,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
        errno.EPERM,  # a firewall rule refused it
        errno.EINTR,
        errno.EAGAIN,
    }
)


class AcceptBackoff:
    """Delays between retries of a failing accept: out of fds (EMFILE, ENFILE), buffers or
    memory (ENOBUFS, ENOMEM), or anything unexpected, the failure lasts until something
    else frees resources, so retry after 5 ms, doubling up to 1 s, and log the 1st, 2nd,
    4th, 8th... failure of a streak rather than every one."""

    FIRST_S = 0.005
    MAX_S = 1.0

    def __init__(self) -> None:
        self.count = 0
        self._delay = self.FIRST_S

    def failed(self, exc: OSError) -> float | None:
        """Seconds to wait before the next accept, or None to accept again at once."""
        if exc.errno in _GONE:
            return None
        self.count += 1
        delay = self._delay
        self._delay = min(self._delay * 2, self.MAX_S)
        return delay

    def should_log(self) -> bool:
        return self.count & (self.count - 1) == 0

    def reset(self) -> None:
        self.count = 0
        self._delay = self.FIRST_S


def refuse(sock: socket.socket, reason: str) -> None:
    """Turn an accepted connection away: one fatal error frame, then close. The frame fits
    an empty send buffer, so a non-blocking send never waits for the client."""
    try:
        sock.setblocking(False)
        sock.send(frames.error(ProtocolError(E_TOO_MANY_CONNECTIONS, reason)))
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # gone already: nothing to tell
    finally:
        sock.close()
