"""A read waits for a shaped release due within the read guard: a read after the loop
slept runs cold for longer than a release's margin, and the release would wait for it.
It waits for one release at most, and never where the loop does not spin. So do the scan
and the histograms' flushing (``Releaser.clear``)."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from srtm.broker import Broker
from srtm.broker.message import Message
from srtm.broker.options import BrokerOptions
from srtm.broker.queue import MessageQueue
from srtm.broker.release import READ_GUARD_NS, Releaser
from srtm.broker.scan import Scan
from srtm.broker.state import Channel, Topic, memory_queues
from srtm.broker.stats import FLUSH_AT, BrokerStats
from srtm.broker.tcp import Client
from srtm.protocol import MAGIC_V2, FrameType, Pub, encode_command
from support import MakeBroker, loopback_pair, sent_frames

S = 1_000_000_000


@dataclass
class Releases:
    """The release loop as a read sees it, set by hand: a guard of 10 s keeps the test
    apart from how fast this machine runs it."""

    next_release_ns: int | None
    read_guard_ns: int = 10 * S


def _publisher(broker: Broker, server: socket.socket, releases: Releases) -> Client:
    client = Client(broker, server, True)
    broker.clients.add(client)
    asyncio.get_running_loop().remove_reader(server.fileno())  # read here, by hand
    client.intake._releases = releases
    return client


def _unread(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


@dataclass
class Publishing:
    client: Client
    peer: socket.socket
    server: socket.socket
    releases: Releases


@contextlib.asynccontextmanager
async def publishing(make_broker: MakeBroker) -> AsyncIterator[Publishing]:
    """A publisher driven by hand whose first PUB is sent, with a release due in 5 s."""
    broker = await make_broker()
    releases = Releases(time.time_ns() + 5 * S)
    peer, server = loopback_pair()
    with peer, server:
        client = _publisher(broker, server, releases)
        peer.sendall(MAGIC_V2 + encode_command(Pub("t", b"reading")))
        yield Publishing(client, peer, server, releases)
        client.close()


async def test_a_read_waits_for_the_release_due_within_the_guard(
    make_broker: MakeBroker,
) -> None:
    async with publishing(make_broker) as p:
        for _ in range(2):  # the socket stays readable: the loop comes back to it
            p.client.intake.on_readable()
            assert _unread(p.server) and sent_frames(p.peer) == []
        p.releases.next_release_ns = None  # released: nothing else waits
        p.client.intake.on_readable()
        assert not _unread(p.server)
        assert [f.kind for f in sent_frames(p.peer)] == [FrameType.RESPONSE]
        p.releases.next_release_ns = time.time_ns() + 5 * S  # a new one, due soon
        p.peer.sendall(encode_command(Pub("t", b"the next reading")))
        p.client.intake.on_readable()  # the read before it was read: this one may wait
        assert _unread(p.server) and sent_frames(p.peer) == []


async def test_a_read_waits_for_one_release_at_most(make_broker: MakeBroker) -> None:
    async with publishing(make_broker) as p:
        releases = p.releases
        p.client.intake.on_readable()
        assert sent_frames(p.peer) == []
        assert releases.next_release_ns is not None
        releases.next_release_ns += S  # that one went, the next is within the guard too
        p.client.intake.on_readable()
        assert [f.kind for f in sent_frames(p.peer)] == [FrameType.RESPONSE]
        p.peer.sendall(encode_command(Pub("t", b"the next reading")))
        p.client.intake.on_readable()  # a new read may wait, for the release due now
        assert sent_frames(p.peer) == []
        releases.next_release_ns = time.time_ns() - 1  # due, and not gone yet: late
        p.client.intake.on_readable()
        assert [f.kind for f in sent_frames(p.peer)] == [FrameType.RESPONSE]


def _releaser(options: BrokerOptions | None = None) -> Releaser:
    def ready(_: object) -> None:
        pass

    return Releaser(options or BrokerOptions(), {}, BrokerStats(), ready, ready)


def test_the_guard_is_at_most_the_spin_and_none_without_one() -> None:
    assert _releaser().read_guard_ns == READ_GUARD_NS  # the default spin (200 µs+) covers it
    # sharing cores: reads never wait
    assert _releaser(BrokerOptions(release_spin_us=0)).read_guard_ns == 0


# -- work that can wait a little waits for a release due within the guard too --------------
async def test_clear_waits_for_the_release_due_within_the_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Releaser, "read_guard_ns", 10 * S)
    releaser = _releaser()
    releaser.next_release_ns = time.time_ns() + 5 * S
    waiting = asyncio.ensure_future(releaser.clear())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    releaser.next_release_ns += S  # it went, and the next is due within the guard too
    await asyncio.wait_for(waiting, 5)  # one release at most
    # none due; one due past the guard; one due now, released first (none waits after it)
    for due in (None, time.time_ns() + 20 * S, time.time_ns() - 1):
        releaser.next_release_ns = due
        with pytest.raises(StopIteration):  # at once, without a loop turn
            releaser.clear().send(None)


async def test_clear_waits_a_guard_past_a_release_that_does_not_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guard = 50_000_000
    monkeypatch.setattr(Releaser, "read_guard_ns", guard)
    releaser = _releaser()
    due = releaser.next_release_ns = time.time_ns() + guard // 2
    await asyncio.wait_for(releaser.clear(), 10)
    assert time.time_ns() >= due + guard


async def test_the_scan_runs_once_clear_of_releases() -> None:
    cleared = asyncio.Event()
    scans: list[int] = []

    async def clear() -> None:
        await cleared.wait()

    scan = Scan({}, lambda _: None, lambda _: None, clear)
    scan.scan = scans.append  # type: ignore[method-assign]
    scan.deferring.add(Topic("t", memory_queues()))  # something to scan
    task = asyncio.create_task(scan.run(0))
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        assert scans == []
        cleared.set()
        while not scans:
            await asyncio.sleep(0)
    finally:
        task.cancel()


async def test_an_idle_scan_sleeps_until_something_has_a_timer() -> None:
    """With no channel or topic that has a timer, the scan does not wake at all (an
    idle broker's loop woke a hundred times a second for it); the first timer wakes it."""
    scans: list[int] = []

    async def clear() -> None:
        pass

    scan = Scan({}, lambda _: None, lambda _: None, clear)
    scan.scan = scans.append  # type: ignore[method-assign]
    task = asyncio.create_task(scan.run(0))
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert scans == []
        ch = scan.watch(Channel("t", "c", MessageQueue(10)))
        ch.defer(Message(b"0" * 16, b"x", 0, 0), time.time_ns())  # a timer: it joins
        while not scans:
            await asyncio.sleep(0)
        scan.timed.clear()  # as a pass that finds nothing left does
        await asyncio.sleep(0)
        done = len(scans)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(scans) <= done + 1  # asleep again after the pass under way
    finally:
        task.cancel()


async def test_histograms_are_flushed_once_clear_of_releases(
    make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Releaser, "read_guard_ns", 60 * S)
    broker = await make_broker()
    recorder = broker.stats.topic("t").latency
    recorder.extend(array("q", [1_000] * FLUSH_AT))
    for _ in range(3):  # the release loop's first step (nothing due) before it is set
        await asyncio.sleep(0)
    broker.releaser.next_release_ns = time.time_ns() + 30 * S  # due within the guard
    await asyncio.sleep(0.3)  # the housekeeping's 100 ms came, twice
    assert len(recorder.pending) == FLUSH_AT
    assert "t" in broker.stats._touched  # not even looked for (~100 µs at 40 topics)
    broker.releaser.next_release_ns = None
    async with asyncio.timeout(10):
        while recorder.pending:
            await asyncio.sleep(0.01)
