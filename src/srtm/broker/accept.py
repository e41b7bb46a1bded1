"""Accepting connections under pressure: the broker's accept loop (``Acceptor``), which
accept failures it retries how, and how a connection over the limit is turned away; and
the connections its node accepted for it on the node's shared address
(``SharedConnections``, see ``srtm.broker.shared``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable
from functools import partial

from srtm.protocol import ProtocolError, frames

log = logging.getLogger("srtm.broker")

#: The listen backlog asked for: the kernel caps it at ``net.core.somaxconn`` (4,096
#: by default since Linux 5.4), as Go's listeners (nsqd's) take it. Python's default,
#: 128, overflowed while 2,000 sensors connected 200 at a time: 643 handshakes dropped,
#: each sensor retrying a second later (``benchmarks/churn.py``).
LISTEN_BACKLOG = 65_535

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


class Acceptor:
    """Accepts connections on ``listener`` and hands each to ``admit``, until ``detach``.
    A failed accept never ends it: out of fds or memory it is retried with a backoff (the
    connection waits in the kernel's backlog meanwhile, and ``error`` says so, for /ping);
    a connection gone before it was accepted is skipped."""

    def __init__(
        self,
        listener: socket.socket,
        admit: Callable[..., None],
        shared_fd: int | None = None,
    ) -> None:
        self.listener: socket.socket | None = listener
        self._admit = admit
        #: Why accepting TCP connections fails right now (None: it does not).
        self.error: str | None = None
        #: What the node deals it from its shared address (``admit(sock, shared=True)``).
        self.shared: SharedConnections | None = None
        if shared_fd is not None:
            try:
                channel = socket.socket(fileno=shared_fd)
            except OSError as exc:
                raise OSError(exc.errno, f"--shared-fd {shared_fd} (set by srtm node): "
                              f"{exc.strerror}") from exc  # fmt: skip
            self.shared = SharedConnections(channel, partial(admit, shared=True))

    def detach(self) -> socket.socket | None:
        """Tell the loop it is over (and the node: no more of its connections); the caller
        closes the listener once the loop's task has ended."""
        if self.shared is not None:
            self.shared.close()
        listener, self.listener = self.listener, None
        return listener

    async def run(self) -> None:
        listener = self.listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        backoff = AcceptBackoff()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if self.listener is None:
                    return  # detached: the broker stops
                delay = backoff.failed(exc)
                if delay is None:
                    continue
                self.error = f"accepting TCP connections fails: {exc}"
                if backoff.should_log():
                    log.error("%s; retrying (%d failures so far)", self.error, backoff.count)
                await asyncio.sleep(delay)
                continue
            if self.error is not None:
                log.warning("accepting TCP connections again after %d failures", backoff.count)
                self.error = None
            backoff.reset()
            self._admit(sock)


class SharedConnections:
    """A process's side: the connections its node deals arrive on ``channel``, each
    handed to ``admit``; a closed channel (the node is gone) ends it."""

    def __init__(self, channel: socket.socket, admit: Callable[[socket.socket], None]) -> None:
        channel.setblocking(False)
        self.channel: socket.socket | None = channel
        self._admit = admit
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(channel.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        while self.channel is not None:
            try:
                msg, fds, _, _ = socket.recv_fds(self.channel, 16, 16)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("the node's channel failed (%s): no more shared connections", exc)
                self.close()
                return
            if not msg and not fds:
                self.close()  # the node closed it
                return
            for fd in fds:
                try:
                    sock = socket.socket(fileno=fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        socket.close(fd)
                    continue
                self._admit(sock)

    def close(self) -> None:
        if self.channel is not None:
            self._loop.remove_reader(self.channel.fileno())
            self.channel.close()
            self.channel = None
