"""A node's shared address: one TCP port for all of a node's processes (``srtm node
--shared-address``).

The node accepts each connection there and deals it to its processes in turn
(``Dealer``), passing the socket itself over a Unix socket (SCM_RIGHTS) to the process,
which serves it as its own (``srtm.broker.accept.SharedConnections``): a plain NSQ
publisher that knows one address spreads over every core, and no byte of its traffic
passes through the node.

A topic published there lands in several processes, as a topic published to several nsqd
does; consumers reach all of them through ``/lookup``. So a connection dealt this way
refuses SUB (it would get one process's messages and miss the others, silently).
"""

from __future__ import annotations

import logging
import socket
from collections import Counter

from srtm.broker.accept import Acceptor, refuse

log = logging.getLogger("srtm.broker")

#: Why a SUB on a dealt connection is refused.
SUB_REFUSED = (
    "SUB on a node's shared address reaches one of its processes and misses the others' "
    "messages: subscribe to each process (/lookup lists them)"
)


class Dealer:
    """The node's side: accepts on ``listener`` and sends each connection to the next
    process (by broker id, round robin) whose channel takes it; a closed channel is
    dropped (its process died: its restart brings a new one)."""

    def __init__(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        self.listener = listener
        self.address: tuple[str, int] = listener.getsockname()[:2]
        self._channels: dict[int, socket.socket] = {}
        self._turn = 0
        #: Connections dealt to each process so far (GET /node).
        self.dealt: Counter[int] = Counter()
        self.acceptor = Acceptor(listener, self.deal)

    def channel(self, broker_id: int) -> socket.socket:
        """A new channel to process ``broker_id`` (at its start or restart): the end to
        pass to it, which the caller closes once the process has it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self.drop(broker_id)
        self._channels[broker_id] = ours
        return theirs

    def drop(self, broker_id: int) -> None:
        if (old := self._channels.pop(broker_id, None)) is not None:
            old.close()

    def deal(self, sock: socket.socket) -> None:
        """Pass ``sock`` on to the next process that takes it (else turn it away)."""
        try:
            ids = sorted(self._channels)
            for _ in range(len(ids)):
                broker_id = ids[self._turn % len(ids)]
                self._turn += 1
                try:
                    socket.send_fds(self._channels[broker_id], [b"c"], [sock.fileno()])
                except BlockingIOError:
                    continue  # its channel is full: that process is behind; the next one
                except OSError as exc:
                    log.warning("broker %d takes no connections (%s)", broker_id, exc)
                    self.drop(broker_id)
                    continue
                self.dealt[broker_id] += 1
                return
            refuse(sock, "no process of this node takes connections now")
        finally:
            sock.close()  # the process holds its own copy

    def close(self) -> None:
        self.acceptor.detach()
        self.listener.close()
        for broker_id in list(self._channels):
            self.drop(broker_id)
