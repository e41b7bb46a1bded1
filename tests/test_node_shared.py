"""A node's shared address (``srtm node --shared-address``): the node deals each
connection to its processes in turn, passing the socket itself; a dealt connection
publishes and refuses SUB; a process that dies is passed over until it is back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.broker.accept import E_TOO_MANY_CONNECTIONS
from srtm.broker.shared import SUB_REFUSED, Dealer
from srtm.launch import start_node
from srtm.protocol import Pub, Sub
from support import MakeBroker, eventually
from test_node import alive, children


def _listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


async def _received(channel: socket.socket) -> int:
    """How many connections were passed on ``channel`` (each closed here)."""
    n = 0
    channel.setblocking(False)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(channel, 16, 16)
        except BlockingIOError:
            return n
        for fd in fds:
            os.close(fd)
            n += 1


async def test_connections_are_dealt_in_turn_and_a_closed_channel_is_passed_over() -> None:
    dealer = Dealer(_listener())
    ends = {broker_id: dealer.channel(broker_id) for broker_id in (3, 1)}
    task = asyncio.create_task(dealer.acceptor.run())
    clients: list[RawClient] = []
    try:
        for _ in range(4):
            clients.append(await RawClient.connect(*dealer.address))
            await eventually(lambda: sum(dealer.dealt.values()) == len(clients), what="dealt")
        assert dealer.dealt == {1: 2, 3: 2}
        assert [await _received(ends[b]) for b in (1, 3)] == [2, 2]
        ends.pop(3).close()  # process 3 died: its end of the channel is gone
        for _ in range(2):
            clients.append(await RawClient.connect(*dealer.address))
            await eventually(lambda: sum(dealer.dealt.values()) == len(clients), what="dealt")
        assert dealer.dealt == {1: 4, 3: 2}
        assert await _received(ends[1]) == 2
        ends.pop(1).close()  # none left: a connection is turned away, with a reason
        last = await RawClient.connect(*dealer.address)
        clients.append(last)
        assert (await last.error()).startswith(E_TOO_MANY_CONNECTIONS)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for c in clients:
            await c.close()
        dealer.close()
        for end in ends.values():
            end.close()


async def test_a_broker_serves_a_dealt_connection_as_its_own_but_refuses_sub(
    make_broker: MakeBroker,
) -> None:
    dealer = Dealer(_listener())
    theirs = dealer.channel(0)
    broker = await make_broker(shared_fd=theirs.detach())  # the broker owns it now
    task = asyncio.create_task(dealer.acceptor.run())
    try:
        pub = await RawClient.connect(*dealer.address)
        await pub.send(Pub("readings", b"21.5"))
        assert await pub.response() == b"OK"
        assert broker.topics["readings"].message_count == 1
        await pub.close()
        sub = await RawClient.connect(*dealer.address)
        await sub.send(Sub("readings", "c"))
        assert await sub.error() == f"E_INVALID {SUB_REFUSED}"
        assert await sub.closed()
        assert broker.topics["readings"].channels == {}
        assert broker.tcp_address is not None
        own = await RawClient.connect(*broker.tcp_address)  # its own address: SUB as ever
        await own.send(Sub("readings", "c"))
        assert await own.response() == b"OK"
        await own.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        dealer.close()


def _node_doc(api: tuple[str, int]) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{api[0]}:{api[1]}/node", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _topic_counts(http: tuple[str, int], token: str | None) -> dict[str, int]:
    req = urllib.request.Request(f"http://{http[0]}:{http[1]}/stats?format=json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.loads(resp.read())
    return {t["topic_name"]: t["message_count"] for t in doc["topics"]}


async def _publish(address: tuple[str, int], topic: str) -> None:
    c = await RawClient.connect(*address)
    await c.send(Pub(topic, b"x"))
    assert await c.response() == b"OK"
    await c.close()


async def test_a_node_deals_its_shared_address_over_its_live_processes(tmp_path: Path) -> None:
    node = start_node(tmp_path, 2, ["--shared-address", "127.0.0.1:0",
                                    "--node-address", "127.0.0.1:0"])  # fmt: skip
    try:
        assert node.shared is not None and node.api is not None
        shared, api = node.shared, node.api
        for i in range(4):
            await _publish(shared, f"t{i}")
        https = {bid: http for bid, _, http in node.brokers}
        counts = {bid: _topic_counts(http, node.token) for bid, http in https.items()}
        assert counts == {0: {"t0": 1, "t2": 1}, 1: {"t1": 1, "t3": 1}}
        assert [b["dealt"] for b in _node_doc(api)["brokers"]] == [2, 2]
        # process 1 killed: connections go to process 0 until 1 is back
        pid = children(node.proc.pid)[1]
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: not alive(pid), what="process 1 gone")
        for i in range(4, 6):
            await _publish(shared, f"t{i}")
        assert [b["dealt"] for b in _node_doc(api)["brokers"]] == [4, 2]
        await eventually(
            lambda: _node_doc(api)["brokers"][1]["restarts"] == 1, what="process 1 back"
        )
        for i in range(6, 8):
            await _publish(shared, f"t{i}")
        assert [b["dealt"] for b in _node_doc(api)["brokers"]] == [5, 3]
        assert node.stop(timeout=60) == 0
    finally:
        if node.alive():
            node.stop()


async def test_a_shared_fd_that_is_no_socket_is_refused_by_name(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    with (tmp_path / "plain").open("w") as f, pytest.raises(OSError, match="--shared-fd"):
        await make_broker(shared_fd=f.fileno())
