"""Shared test helpers: ``eventually`` (wait on a condition, never a fixed sleep), ``call``
(one HTTP request), and the types of the ``make_broker``, ``broker_api`` and
``controller_api`` fixtures (the fixtures are in conftest.py)."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import errno
import gc
import inspect
import json
import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

import aiohttp
import pytest
from hypothesis import strategies as st

from srtm.broker import Broker
from srtm.broker.message import Message
from srtm.broker.queue import Record, to_record
from srtm.control import Controller
from srtm.launch import BrokerProcess, start_broker
from srtm.placement import PublisherLoad, TopicSpec
from srtm.protocol import Frame, FrameReader, FrameType

T = TypeVar("T")

#: ``make_broker(**options)``: an in-process broker on 127.0.0.1 (ephemeral port).
MakeBroker = Callable[..., Awaitable[Broker]]
#: The ``broker_api`` fixture: a broker and a client session on its HTTP API.
BrokerApi = tuple[Broker, aiohttp.ClientSession]


def loopback_pair() -> tuple[socket.socket, socket.socket]:
    """A client's socket and the broker's end of its TCP connection, on 127.0.0.1 (for a
    ``tcp.Client`` driven in the test's own process)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname(), timeout=5)
        return peer, listener.accept()[0]


def sent_frames(peer: socket.socket) -> list[Frame]:
    """The frames the broker has sent to ``peer`` so far (none waited for)."""
    peer.setblocking(False)
    data = b""
    try:
        while chunk := peer.recv(65536):
            data += chunk
    except BlockingIOError:
        pass
    return FrameReader().feed(data)


def answered(peer: socket.socket) -> list[bytes]:
    """What the broker answered ``peer`` so far, frame by frame ("ERR ..." for errors)."""
    return [f.data if f.kind is FrameType.RESPONSE else b"ERR " + f.data for f in sent_frames(peer)]


def count_publishes(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Each ``Broker.publish`` (the general way) from now on: its topic and message count."""
    calls: list[tuple[str, int]] = []
    publish = broker.publish

    def counted(topic: str, bodies: list[bytes], *args: Any, **kw: Any) -> Any:
        calls.append((topic, len(bodies)))
        return publish(topic, bodies, *args, **kw)

    monkeypatch.setattr(broker, "publish", counted)
    return calls


#: What one client connection is made of on the broker (``srtm.broker.tcp.Client``).
CONNECTION_PARTS = frozenset({"Client", "Session", "Output", "Intake", "Gate"})


@contextlib.contextmanager
def collector_off() -> Iterator[Callable[[], Counter[str]]]:
    """The cyclic collector off (so that it cannot free a cycle before it is looked for),
    with a function that counts the connections' parts only it would free now."""
    gc.collect()
    gc.disable()
    try:
        yield _cyclic_parts
    finally:
        gc.enable()


def _cyclic_parts() -> Counter[str]:
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        names = (type(o).__name__ for o in gc.garbage)
        return Counter(n for n in names if n in CONNECTION_PARTS)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def tcp_address(broker: Broker) -> str:
    """The broker's TCP address as ``HOST:PORT`` (routes and links name peers so)."""
    assert broker.tcp_address is not None
    host, port = broker.tcp_address
    return f"{host}:{port}"


class BrokerNode:
    """An in-process broker with a session on its HTTP API (relay and handoff tests)."""

    def __init__(self, broker: Broker, http: aiohttp.ClientSession) -> None:
        self.broker, self.http = broker, http

    @property
    def tcp(self) -> str:
        return tcp_address(self.broker)

    async def call(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        data = None if doc is None else json.dumps(doc).encode()
        async with self.http.request(method, path, data=data) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None


class ControllerClient:
    """HTTP calls to an in-process controller (the ``controller_api`` fixture): each gives
    (status, decoded JSON)."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http, self.base = http, base

    async def call(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        async with self.http.request(method, self.base + path, json=doc) as resp:
            return resp.status, json.loads(await resp.read())


async def call(
    session: aiohttp.ClientSession, method: str, path: str, data: bytes = b""
) -> tuple[int, Any]:
    """One HTTP request: its status and its body (parsed when it is JSON)."""
    async with session.request(method, path, data=data) as resp:
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, await resp.text()


#: Default patience: long enough for a loaded machine, so that it only ends a test that
#: would otherwise hang. Tests pass ``timeout`` only where the wait is known to be longer.
TIMEOUT_S = 15.0


def controlled_broker(
    directory: Path, broker_id: int, controller: str, token: str, mcap: float
) -> BrokerProcess:
    """A broker process that registers with ``controller`` and reports every 0.2 s
    (blocking until it is ready: call it in a thread from a test's loop)."""
    args = ["--broker-id", str(broker_id), "--controller", controller, "--mcap", f"{mcap:g}",
            "--report-interval-s", "0.2"]  # fmt: skip
    return start_broker(directory / f"b{broker_id}", args, token=token)


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the cyclic collector off: CPython 3.11.7 raises "AST constructor
    recursion depth mismatch" when a finalizer (an earlier test's task collected, logging)
    runs inside the parse."""
    gc.disable()
    try:
        return ast.parse(text, filename=filename)
    finally:
        gc.enable()


def _truthy(value: object) -> bool:
    return bool(value)


@dataclass
class _Attempts:
    """One wait's deadline, and the failure that names what was awaited and what the
    condition last gave. Both loops of ``eventually`` go through it."""

    what: str
    timeout: float
    until: Callable[[Any], bool]
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def done(self, value: object) -> bool:
        if self.until(value):
            return True
        if time.monotonic() >= self.deadline:
            raise AssertionError(
                f"not reached in {self.timeout:g} s: {self.what} (last value: {value!r})"
            )
        return False


class _Eventually:
    """Poll ``cond`` until it holds, then return what it returned.

    ``cond`` returns the value judged: truthy ends the wait, or ``until(value)`` does when
    given (``cond`` then probes, e.g. ``lambda: len(got)`` with ``until=lambda n: n >= 10``,
    and a failure shows the last count). The deadline is only against hanging: a wait that
    times out fails with ``AssertionError`` naming ``what`` and the last value.

    ``await eventually(cond, "what")`` polls on the running loop (``cond`` may also return
    an awaitable, awaited each time); ``eventually.blocking(cond, "what")`` polls in this
    thread, sleeping with ``sleep`` between tries (``gevent.sleep`` lets greenlets run).
    """

    @overload
    async def __call__(
        self,
        cond: Callable[[], Awaitable[T]],
        what: str,
        *,
        until: Callable[[T], bool] = ...,
        timeout: float = ...,
        interval: float = ...,
    ) -> T: ...

    @overload
    async def __call__(
        self,
        cond: Callable[[], T],
        what: str,
        *,
        until: Callable[[T], bool] = ...,
        timeout: float = ...,
        interval: float = ...,
    ) -> T: ...

    async def __call__(
        self,
        cond: Callable[[], Any],
        what: str,
        *,
        until: Callable[[Any], bool] = _truthy,
        timeout: float = TIMEOUT_S,
        interval: float = 0.005,
    ) -> Any:
        attempts = _Attempts(what, timeout, until)
        while True:
            value = cond()
            if inspect.isawaitable(value):
                value = await value
            if attempts.done(value):
                return value
            await asyncio.sleep(interval)

    def blocking(
        self,
        cond: Callable[[], T],
        what: str,
        *,
        until: Callable[[T], bool] = _truthy,
        timeout: float = TIMEOUT_S,
        interval: float = 0.05,
        sleep: Callable[[float], object] = time.sleep,
    ) -> T:
        attempts = _Attempts(what, timeout, until)
        while True:
            value = cond()
            if attempts.done(value):
                return value
            sleep(interval)


#: The one way tests wait for something to happen (see ``_Eventually``).
eventually = _Eventually()


# -- NSQ 1.3.0's binaries, the anchors ---------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]
NSQ_TOOLS = ("nsqd", "nsqlookupd", "nsqadmin", "nsq_tail", "nsq_to_file", "nsq_stat", "to_nsq")


def anchor_dirs(name: str) -> list[Path]:
    """``../shared/anchors/NAME`` beside this checkout, and beside the main checkout when
    this is a git worktree (as benchmarks/broker.py resolves it)."""
    dirs = [REPO.parent / "shared" / "anchors" / name]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        common = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        if common:
            dirs.append(Path(common).parent.parent / "shared" / "anchors" / name)
    return dirs


def nsq_bin() -> Path:
    """The directory of NSQ 1.3.0's binaries (``$SRTM_NSQ_BIN``, else the anchors); the
    calling test fails, never skips, without it."""
    env = os.environ.get("SRTM_NSQ_BIN")
    candidates = [Path(env)] if env else anchor_dirs("nsq-1.3.0")
    for d in candidates:
        if all(os.access(d / t, os.X_OK) for t in NSQ_TOOLS):
            return d.resolve()
    pytest.fail(
        f"NSQ 1.3.0's binaries ({', '.join(NSQ_TOOLS)}) not found in "
        f"{', '.join(map(str, candidates))}: set SRTM_NSQ_BIN to the directory that holds them",
        pytrace=False,
    )


# -- the controller without I/O -----------------------------------------------------------------
def registered(n: int = 3, mcap: float = 1_000) -> Controller:
    """A pure ``Controller`` with brokers ``b0`` … ``b{n-1}`` registered at time 0."""
    c = Controller(broker_timeout_s=5)
    for i in range(n):
        c.register(f"b{i}", f"127.0.0.1:{4150 + i}", f"127.0.0.1:{5150 + i}", mcap, now=0)
    return c


def topic_of(n: int, name: str = "t", rate: float = 10.0) -> TopicSpec:
    """``n`` publishers of ``rate`` in groups of 10, burst 100, SLO 1 ms, r = 1.1 × load."""
    pubs = tuple(PublisherLoad(f"p{i}", rate, f"g{i // 10}") for i in range(n))
    return TopicSpec(name, pubs, 100, 1.0, 1.1 * rate * n)


_INT64 = st.integers(-(2**63), 2**63 - 1)


def queue_records(min_body: int = 0) -> st.SearchStrategy[Record]:
    """Fresh queue records (no origin) with any field the disk format holds."""
    return st.builds(
        lambda mid, body, ts, arrival, release, attempts, publisher: (
            mid, body, ts, arrival, release, attempts, publisher, None
        ),
        st.binary(min_size=16, max_size=16),
        st.binary(min_size=min_body, max_size=300),
        _INT64,
        _INT64,
        _INT64,
        st.integers(0, 2**16 - 1),
        st.text(max_size=20),
    )  # fmt: skip


class ListOverflow:
    """A disk queue's stand-in: FIFO records, all readable at once. ``inline``: it takes a
    PUB's record the short way (``put_inline``) as a disk queue writing it at once does;
    else never (``push_many`` takes it)."""

    def __init__(self, inline: bool = False) -> None:
        self.inline = inline
        self.records: list[Record] = []

    def push(self, msg: Message) -> None:
        self.records.append(to_record(msg))

    def push_many(self, records: list[Record]) -> None:
        self.records += records

    def put_inline(self, r: Record) -> bool:
        if self.inline:
            self.records.append(r)
        return self.inline

    def pop_records(self, n: int) -> list[Record]:
        out, self.records = self.records[:n], self.records[n:]
        return out

    def __len__(self) -> int:
        return len(self.records)

    def clear(self) -> None:
        self.records.clear()

    def read_ahead(self) -> list[Message]:
        return []


class FullableDisk:
    """A disk queue's writer (``DiskQueue(writer=disk.write)``): ``os.write``, or ENOSPC
    while ``full``."""

    def __init__(self) -> None:
        self.full = False

    def write(self, fd: int, data: Any) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)
