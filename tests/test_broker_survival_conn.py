"""The broker's connection layer under fault injection on 127.0.0.1: an exhausted fd table,
clients that never read, clients that drip a command, too many connections.

Brokers run as subprocesses where the fault is process-wide (fd limits, RSS); memory is
checked only as a bound derived from the configured limits, never against a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import os
import resource
import selectors
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsq_raw import RawClient
from srtm.broker import Broker, BrokerOptions
from srtm.launch import BrokerProcess, die_with_parent, start_broker
from srtm.protocol import (
    MAGIC_V2,
    Dpub,
    Fin,
    Frame,
    FrameReader,
    FrameType,
    Identify,
    Mpub,
    Pub,
    Rdy,
    Sub,
    decode_message,
    encode_command,
)
from support import eventually

MIB = 1 << 20


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def socket_count(pid: int) -> int:
    fds = os.listdir(f"/proc/{pid}/fd")
    return sum(_readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in fds)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except FileNotFoundError:  # closed meanwhile
        return ""


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fd_limit(soft: int, hard: int) -> Callable[[], None]:
    """preexec_fn: the child starts with this RLIMIT_NOFILE (and dies with the test)."""

    def apply() -> None:
        die_with_parent()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


class Ping:
    """/ping over one kept-alive HTTP connection: it still answers when the broker has no
    fd left to accept a new one."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.conn = http.client.HTTPConnection(*broker.http, timeout=10)

    def __call__(self) -> tuple[int, str]:
        self.conn.request("GET", "/ping")
        resp = self.conn.getresponse()
        return resp.status, resp.read().decode()

    def close(self) -> None:
        self.conn.close()


async def drain_all(broker: BrokerProcess, topic: str, channel: str, n: int) -> list[bytes]:
    """Receive and FIN ``n`` messages; fails if fewer arrive."""
    c = await RawClient.connect(*broker.tcp)
    try:
        await c.send(Sub(topic, channel), Rdy(500))
        assert await c.response() == b"OK"
        got = []
        for _ in range(n):
            m = await c.message(timeout=10)
            got.append(m.body)
            await c.send(Fin(m.id))
        return got
    finally:
        await c.close()


# -- finding 1: fd exhaustion ---------------------------------------------------------------
@pytest.mark.slow
async def test_fd_exhaustion_does_not_end_accepting_and_sigterm_persists(tmp_path: Path) -> None:
    """Fill the broker's fd table with connections: the connection after that waits in the
    backlog (accept fails with EMFILE), /ping says so, and once fds free it is served;
    SIGTERM then exits 0 with every acknowledged message kept."""
    limit = 96
    data = tmp_path / "data"
    broker = start_broker(data, preexec_fn=fd_limit(limit, limit))
    clients: list[RawClient] = []
    ping = Ping(broker)
    acked: list[bytes] = []
    try:
        broker.post("/topic/create?topic=kept")
        broker.post("/channel/create?topic=kept&channel=c")
        pub = await RawClient.connect(*broker.tcp)
        clients.append(pub)
        bodies = [b"m%04d" % i for i in range(1000)]
        await pub.send(Mpub("kept", bodies))
        assert await pub.response() == b"OK"
        acked += bodies
        assert ping() == (200, "OK")
        # Every accepted connection is one more fd; publish on each, as a client would.
        pid = broker.proc.pid
        # Accepted ones are counted as sockets: a file the broker has open for a moment
        # (meta.json is written in a thread) must not look like a connection.
        while fd_count(pid) < limit:
            before = socket_count(pid)
            c = await RawClient.connect(*broker.tcp)
            clients.append(c)
            await c.send(Pub("kept", b"fill%d" % len(clients)))
            await eventually(lambda b=before: socket_count(pid) > b, what="the connection accepted")  # type: ignore[misc]
            assert await c.response() == b"OK"
            acked.append(b"fill%d" % len(clients))
        late = await RawClient.connect(*broker.tcp)  # completed by the kernel, not accepted
        await late.send(Pub("kept", b"late"))
        await eventually(lambda: ping()[0] == 500, what="/ping reporting that accepting fails")
        status, text = ping()
        assert text.startswith("NOK") and "accept" in text, (status, text)
        for c in clients[1:11]:
            await c.close()
        assert await late.response() == b"OK"  # accepted once fds were free again
        acked.append(b"late")
        await eventually(lambda: ping() == (200, "OK"), what="/ping healthy again")
        extra = await RawClient.connect(*broker.tcp)
        await extra.send(Pub("kept", b"after"))
        assert await extra.response() == b"OK"
        acked.append(b"after")
        clients += [late, extra]
    finally:
        ping.close()
        code = broker.stop()
        for c in clients:
            await c.close()
    assert code == 0
    again = start_broker(data)
    try:
        got = await drain_all(again, "kept", "c", len(acked))
        assert sorted(got) == sorted(acked)
    finally:
        assert again.stop() == 0


async def test_soft_fd_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "data", preexec_fn=fd_limit(64, 4096))
    try:
        with open(f"/proc/{broker.proc.pid}/limits") as f:
            row = next(line for line in f if line.startswith("Max open files"))
        assert row.split()[3:5] == ["4096", "4096"]
    finally:
        assert broker.stop() == 0


async def test_stop_persists_when_a_background_task_died(tmp_path: Path) -> None:
    """A background task that died with an exception is logged and reported by /ping;
    stop() still persists every message it owes."""
    opts = BrokerOptions(tcp_port=0, http_port=0, data_dir=tmp_path / "data")
    broker = Broker(opts)
    await broker.start()

    def broken(now: int) -> None:
        raise RuntimeError("injected scan failure")

    broker.scan.scan = broken  # type: ignore[method-assign]
    broker.channel("owed", "c")
    c = await RawClient.connect(*broker.tcp_address)  # type: ignore[misc]
    await c.send(Mpub("owed", [b"a", b"b", b"c"]))
    assert await c.response() == b"OK"
    await c.send(Dpub("owed", 3_600_000, b"later"))  # a timer: the scan runs, and dies
    assert await c.response() == b"OK"
    scan = next(t for t in broker._tasks if t.get_name() == "srtm-scan")
    await eventually(scan.done, what="the scan task dead")
    assert "srtm-scan" in (broker.health() or "")  # /ping: NOK
    await c.close()
    await broker.stop()  # must not raise, must persist

    again = Broker(opts)
    await again.start()
    try:
        owed = again.topics["owed"]
        assert (owed.channels["c"].depth, owed.deferred_count) == (3, 1)
    finally:
        await again.stop()


# -- finding 2: memory per connection -------------------------------------------------------
class RssPeak:
    """The highest RSS of a process, sampled every few ms while the test awaits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = rss_bytes(pid)
        self.peak = self.base
        self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(0.005)  # the sampling period, not a wait for an event

    async def stop(self) -> int:
        """Stop sampling; the growth over the baseline, in bytes."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.peak = max(self.peak, rss_bytes(self.pid))
        return self.peak - self.base


def non_reading_socket(address: tuple[str, int], first: bytes) -> socket.socket:
    """A client with a tiny receive buffer that sends ``first`` and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(address)
    s.sendall(MAGIC_V2 + first)
    return s


#: Python's allocator, histograms, a read's worth of replies: RSS a broker may grow by
#: with any client, on top of what the configured bounds allow.
RSS_SLACK = 16 * MIB


@pytest.mark.slow
async def test_a_client_that_never_reads_its_replies_is_bounded_then_cut_off(
    tmp_path: Path,
) -> None:
    """FINs of unknown ids (an error frame each, 2.9 times their size) sent without reading
    a reply: the broker stops reading at its output bound, closes the connection once
    nothing is written for the write timeout, and grows by no more than the bound."""
    out_max = 1 * MIB
    broker = start_broker(
        tmp_path / "data",
        ["--max-output-buffer", str(out_max), "--write-timeout-ms", "2000"],
        preexec_fn=die_with_parent,
    )
    try:
        s = non_reading_socket(broker.tcp, encode_command(Sub("t", "c")))
        await eventually(
            lambda: broker.stats("t")["topics"][0]["channels"][0]["client_count"] == 1,
            "the consumer subscribed",
        )
        flood = b"".join(b"FIN %016d\n" % i for i in range(1_500_000))  # 39 MB

        def send() -> str:
            s.settimeout(120)
            try:
                s.sendall(flood)
            except OSError:
                return "closed by the broker"
            return "all sent"

        rss = RssPeak(broker.proc.pid)
        outcome = await asyncio.to_thread(send)
        growth = await rss.stop()
        s.close()
        assert growth <= out_max + RSS_SLACK, f"RSS grew {growth / MIB:.0f} MiB"
        assert outcome == "closed by the broker"
        c = await RawClient.connect(*broker.tcp)  # the broker still serves
        await c.send(Pub("t", b"x"))
        assert await c.response() == b"OK"
        await c.close()
    finally:
        assert broker.stop() == 0


@pytest.mark.slow
async def test_a_stalled_consumer_is_bounded_and_its_messages_go_to_another(
    tmp_path: Path,
) -> None:
    """A consumer with RDY for the whole batch and a 1 s msg timeout that stops reading: its
    batch is not re-sent every second on top of what is pending; its connection is closed
    after the write timeout; another consumer gets every message."""
    out_max, n, size = 1 * MIB, 50, 256 * 1024
    broker = start_broker(
        tmp_path / "data",
        ["--max-output-buffer", str(out_max), "--write-timeout-ms", "3000"],
        preexec_fn=die_with_parent,
    )
    try:
        broker.post("/topic/create?topic=t")
        broker.post("/channel/create?topic=t&channel=c")
        bodies = [b"%03d" % i + os.urandom(size - 3) for i in range(n)]
        pub = await RawClient.connect(*broker.tcp)
        for i in range(0, n, 10):  # 2.5 MiB per MPUB, under its 5 MiB limit
            await pub.send(Mpub("t", bodies[i : i + 10]))
            assert await pub.response() == b"OK"
        await pub.close()

        def channel() -> dict[str, Any]:
            doc: dict[str, Any] = broker.stats("t")["topics"][0]["channels"][0]
            return doc

        rss = RssPeak(broker.proc.pid)
        stalled = non_reading_socket(
            broker.tcp,
            encode_command(Identify({"msg_timeout": 1000}))
            + encode_command(Sub("t", "c"))
            + encode_command(Rdy(n)),
        )
        await eventually(lambda: channel()["client_count"] == 1, what="the consumer subscribed")
        # Fixed: closed by the write timeout. Unfixed: the batch re-sent every second.
        await eventually(
            lambda: channel()["client_count"] == 0 or channel()["timeout_count"] >= 8 * n,
            "the stalled consumer closed (or its batch timed out 8 times)",
            timeout=60,
        )
        growth = await rss.stop()
        stalled.close()
        # One batch may be queued beyond the bound (all it has RDY for), never a second.
        bound = out_max + n * (size + 30) + RSS_SLACK
        assert growth <= bound, f"RSS grew {growth / MIB:.0f} MiB > {bound / MIB:.0f} MiB"
        assert channel()["client_count"] == 0
        got = await drain_all(broker, "t", "c", n)
        assert sorted(got) == sorted(bodies)
    finally:
        assert broker.stop() == 0


@pytest.mark.parametrize(
    "partial",
    [
        # A body that trickles in (the IDENTIFY of the report: 5 MiB, a byte per 20 s).
        b"IDENTIFY\n" + struct.pack(">I", 1 * MIB) + b"{" + b" " * (256 * 1024),
        # A command line that never ends.
        b"PUB topic_name_that_never_ends",
    ],
    ids=["body", "line"],
)
async def test_a_command_dripped_byte_by_byte_is_cut_off(
    make_broker: Callable[..., Any], partial: bytes
) -> None:
    """Each byte keeps the connection alive (heartbeats), but a command must be complete
    within the read timeout: E_INVALID, closed, the partial bytes freed."""
    broker = await make_broker(read_timeout_ms=1000)
    c = await RawClient.connect(*broker.tcp_address)
    await c.send(partial)

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(300):
                await asyncio.sleep(0.05)  # the drip itself: one byte per 50 ms
                await c.send(b" ")

    dripping = asyncio.create_task(drip())
    try:
        err = await c.error()  # waits up to 5 s
        assert err.startswith("E_INVALID") and "incomplete" in err, err
        assert await c.closed()
        assert not broker.clients
    finally:
        dripping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripping
        await c.close()


async def test_backpressure_delays_but_loses_nothing(make_broker: Callable[..., Any]) -> None:
    """A publisher that reads its replies late and a consumer that starts reading late both
    get everything, in order, once they read: the bound pauses them, never drops."""
    broker = await make_broker(max_output_buffer_bytes=64 * 1024)
    address = broker.tcp_address
    n = 50_000

    async def slow_client() -> SlowReader:
        """Tiny kernel buffers both sides (a fixed SO_SNDBUF stops the broker's from
        growing to 4 MB), so what it is sent piles up in the broker."""
        known = set(broker.clients)
        c = await SlowReader.connect(address, b"")
        await eventually(lambda: len(broker.clients) > len(known), "the client accepted")
        for new in broker.clients - known:
            new.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return c

    pub = await slow_client()
    pub.writer.write(b"".join(encode_command(Pub("bp", b"%05d" % i)) for i in range(n)))
    # Its 500 kB of replies cannot all fit the bound and the kernel's buffers.
    await eventually(lambda: any(c.output_pauses for c in broker.clients), what="publisher paused")
    assert [f.data for f in await pub.frames(n)] == [b"OK"] * n
    sub = await slow_client()
    sub.writer.write(encode_command(Sub("bp", "c")) + encode_command(Rdy(2500)))
    await eventually(lambda: any(c.output_pauses for c in broker.clients if c.channel), what="sub")
    got: list[bytes] = []
    while len(got) < n:
        for f in await sub.frames(1):
            if f.kind is FrameType.MESSAGE:
                m = decode_message(f.data)
                got.append(m.body)
                sub.writer.write(encode_command(Fin(m.id)))
    assert got == [b"%05d" % i for i in range(n)]
    for c in (pub, sub):
        c.writer.close()


class SlowReader:
    """A client with a tiny receive buffer that reads only when told to."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._frames = FrameReader()

    @classmethod
    async def connect(cls, address: tuple[str, int], first: bytes) -> SlowReader:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        await asyncio.get_running_loop().sock_connect(s, address)
        reader, writer = await asyncio.open_connection(sock=s)
        writer.write(MAGIC_V2 + first)
        return cls(reader, writer)

    async def frames(self, at_least: int) -> list[Frame]:
        """The frames that arrive until there are ``at_least``."""
        out: list[Frame] = []
        while len(out) < at_least:
            data = await asyncio.wait_for(self.reader.read(1 << 16), 10)
            assert data, "closed by the broker"
            out += self._frames.feed(data)
        return out


async def test_connections_beyond_the_limit_are_told_and_closed(
    make_broker: Callable[..., Any],
) -> None:
    broker = await make_broker(max_connections=3)
    held = []
    for i in range(3):
        c = await RawClient.connect(*broker.tcp_address)
        await c.send(Pub("t", b"%d" % i))
        assert await c.response() == b"OK"
        held.append(c)
    over = await RawClient.connect(*broker.tcp_address)  # refused at once: just read
    err = await over.error()
    assert err.startswith("E_TOO_MANY_CONNECTIONS") and "(3)" in err, err
    assert await over.closed()
    assert broker.refused_connections == 1
    await held.pop().close()
    await eventually(lambda: len(broker.clients), "two clients", until=lambda n: n == 2)
    again = await RawClient.connect(*broker.tcp_address)
    await again.send(Pub("t", b"again"))
    assert await again.response() == b"OK"
    for c in [*held, over, again]:
        await c.close()


async def test_a_crowd_connecting_while_the_broker_is_busy_completes_its_handshakes(
    make_broker: Callable[..., Any],
) -> None:
    """Sensors that reconnect at once, while the loop is busy: the kernel completes each
    handshake and queues it until the broker accepts, up to the listen backlog. Python's
    default of 128 dropped the rest (each sensor retried a second later); the broker asks
    for as many as the system allows, as nsqd does."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    n = min(300, somaxconn)
    broker = await make_broker()
    socks = []
    with selectors.DefaultSelector() as sel:
        for _ in range(n):  # without yielding to the loop: nothing is accepted meanwhile
            sock = socket.socket()
            sock.setblocking(False)
            assert sock.connect_ex(broker.tcp_address) == errno.EINPROGRESS
            sel.register(sock, selectors.EVENT_WRITE)
            socks.append(sock)
        connected = 0
        deadline = time.monotonic() + 0.5  # a dropped handshake is retried after 1 s
        while connected < n and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sel.unregister(key.fileobj)
                assert key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                connected += 1
    try:
        assert connected == n
        for sock in socks:
            sock.send(MAGIC_V2 + encode_command(Pub("t", b"x")))
        await eventually(lambda: broker.topics["t"].depth if "t" in broker.topics else 0,
                         "every PUB taken", until=lambda d: d == n)  # fmt: skip
    finally:
        for sock in socks:
            sock.close()


def test_flushing_histograms_imports_nothing() -> None:
    """The first flush may come while the broker is out of fds: a module loaded lazily then
    fails with EMFILE (numpy.ctypeslib did, and killed the broker's housekeeping)."""
    code = (
        "import sys\n"
        "import srtm.broker.broker\n"
        "from srtm.broker.stats import Recorder\n"
        "before = set(sys.modules)\n"
        "r = Recorder()\n"
        "for v in (1_000, 50_000, 3_000_000): r.add(v)\n"
        "r.flush()\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
