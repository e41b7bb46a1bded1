"""Run ``srtm broker`` and ``srtm controller`` as child processes on ephemeral ports and
talk to their HTTP APIs.

For tests, benchmarks and local clusters: the child prints its bound addresses on its
first line; its stdout is drained by a thread afterwards so it can never block on a
full pipe; ``stop`` is SIGTERM (a graceful stop that persists), then a kill if it hangs.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

_BROKER_READY = re.compile(r"tcp=([\d.]+):(\d+) http=([\d.]+):(\d+)")
_CONTROLLER_READY = re.compile(r"srtm controller http=([\d.]+):(\d+)")
_NODE_READY = re.compile(r"srtm node host=(\S+) brokers=(\d+) (.*)")
_NODE_API = re.compile(r"^node=([\d.]+):(\d+) ")
_NODE_SHARED = re.compile(r"shared=([\d.]+):(\d+) ")
_NODE_BROKER = re.compile(r"\[broker (\d+) tcp=([\d.]+):(\d+) http=([\d.]+):(\d+)\]")


@dataclass
class ServerProcess:
    """A child ``srtm`` server and its HTTP address."""

    proc: subprocess.Popen[str]
    http: tuple[str, int]
    #: The last lines it printed on stdout after the ready line.
    stdout_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=20)
    )
    #: The cluster token it was given (SRTM_TOKEN); ``request`` sends it.
    token: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer <token>`` for its mutating endpoints (none without)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def http_address(self) -> str:
        return f"{self.http[0]}:{self.http[1]}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def url(self, path: str) -> str:
        return f"http://{self.http_address}{path}"

    def request(
        self, path: str, method: str = "GET", body: bytes | None = None, timeout: float = 10.0
    ) -> bytes:
        if body is None and method in ("POST", "PUT"):
            body = b""
        req = urllib.request.Request(self.url(path), data=body, method=method, headers=self.headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data: bytes = resp.read()
            return data

    def get(self, path: str) -> bytes:
        return self.request(path)

    def post(self, path: str, body: bytes = b"") -> bytes:
        return self.request(path, "POST", body)

    def json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then wait for the exit code; killed (and TimeoutExpired) if it hangs."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@dataclass
class BrokerProcess(ServerProcess):
    tcp: tuple[str, int] = ("", 0)
    data_dir: Path = Path()

    @property
    def tcp_address(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}"

    def stats(self, topic: str | None = None) -> dict[str, Any]:
        q = f"&topic={topic}" if topic else ""
        doc: dict[str, Any] = self.json(f"/stats?format=json{q}")
        return doc


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGTERM when the process that started it dies
    (Linux), so a killed experiment leaves no server behind. The parent must start it
    from a thread that lives as long as the child (the main thread)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _pump(stream: IO[str], tail: collections.deque[str]) -> None:
    try:
        for line in stream:
            tail.append(line.rstrip())
    except (OSError, ValueError):
        pass  # closed by stop()


def new_token() -> str:
    """A random cluster token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def _start(
    cmd: list[str],
    ready: re.Pattern[str],
    *,
    stderr: IO[str] | int | None,
    new_session: bool,
    preexec_fn: Callable[[], None] | None,
    timeout: float,
    token: str,
    command_prefix: Sequence[str] = (),
) -> tuple[subprocess.Popen[str], re.Match[str]]:
    proc = subprocess.Popen(
        [*command_prefix, sys.executable, "-m", "srtm", *cmd],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=new_session,
        preexec_fn=preexec_fn,
        # The token travels in the environment, not on the command line (where any
        # local user could read it from /proc/PID/cmdline).
        env={**os.environ, "SRTM_TOKEN": token} if token else _without_token(),
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sel.select(deadline - time.monotonic()):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if m := ready.search(line):
                return proc, m
        raise RuntimeError(f"srtm {cmd[0]} did not start (exit code {proc.poll()})")
    except BaseException:
        proc.kill()  # not ready in time, or interrupted while waiting: leave nothing running
        proc.wait()
        proc.stdout.close()
        raise
    finally:
        sel.close()


def _without_token() -> dict[str, str]:
    """The environment for a child told no token (``token=""``: ``--insecure-loopback``)."""
    return {k: v for k, v in os.environ.items() if k != "SRTM_TOKEN"}


def _drain(server: ServerProcess) -> None:
    assert server.proc.stdout is not None
    threading.Thread(
        target=_pump, args=(server.proc.stdout, server.stdout_tail), daemon=True
    ).start()


def start_broker(
    data_dir: Path,
    args: Sequence[str] = (),
    *,
    stderr: IO[str] | int | None = None,
    new_session: bool = False,
    preexec_fn: Callable[[], None] | None = None,
    timeout: float = 30.0,
    token: str | None = None,
    host: str = "127.0.0.1",
    command_prefix: Sequence[str] = (),
) -> BrokerProcess:
    """Start ``srtm broker`` on ``host`` with ephemeral ports; return once it is ready.

    ``new_session`` keeps a terminal's Ctrl-C from reaching the child (the caller then
    stops it). If it does not come up within ``timeout`` it is killed and RuntimeError
    raised, with its exit code. ``token``: the cluster token (a new random one if None;
    "": none, for a broker started with ``--insecure-loopback``). ``command_prefix`` is
    put before its command line (``ip netns exec NS``: inside a network namespace).
    """
    token = new_token() if token is None else token
    cmd = [
        "broker", "--tcp-address", f"{host}:0", "--http-address", f"{host}:0",
        "--data-dir", str(data_dir), *args,
    ]  # fmt: skip
    proc, m = _start(
        cmd, _BROKER_READY, stderr=stderr, new_session=new_session, preexec_fn=preexec_fn,
        timeout=timeout, token=token, command_prefix=command_prefix,
    )  # fmt: skip
    broker = BrokerProcess(
        proc, (m[3], int(m[4])), token=token, tcp=(m[1], int(m[2])), data_dir=data_dir
    )
    _drain(broker)
    return broker


@dataclass
class NodeProcess(ServerProcess):
    """``srtm node``: ``http`` is its first broker's; ``brokers``: each one's id, TCP and
    HTTP address, as its ready line gave them."""

    host: str = ""
    brokers: list[tuple[int, tuple[str, int], tuple[str, int]]] = field(default_factory=list)
    #: Its own HTTP API (``--node-address``), if it serves one.
    api: tuple[str, int] | None = None
    #: Its shared address (``--shared-address``), if it has one.
    shared: tuple[str, int] | None = None


def start_node(
    data_dir: Path,
    brokers: int,
    args: Sequence[str] = (),
    *,
    timeout: float = 60.0,
    token: str | None = None,
    stderr: IO[str] | int | None = None,
) -> NodeProcess:
    """Start ``srtm node --brokers N`` on 127.0.0.1, every process on ephemeral ports;
    return once all are ready (``args``: more node or broker options; ``stderr``: where
    its processes' logs go, None: ours)."""
    token = new_token() if token is None else token
    cmd = ["node", "--brokers", str(brokers), "--tcp-address", "127.0.0.1:0",
           "--http-address", "127.0.0.1:0", "--data-dir", str(data_dir), *args]  # fmt: skip
    proc, m = _start(
        cmd, _NODE_READY, stderr=stderr, new_session=False, preexec_fn=None, timeout=timeout,
        token=token,
    )  # fmt: skip
    parts = [(int(b[1]), (b[2], int(b[3])), (b[4], int(b[5]))) for b in _NODE_BROKER.finditer(m[3])]
    api = (a[1], int(a[2])) if (a := _NODE_API.match(m[3])) else None
    shared = (s[1], int(s[2])) if (s := _NODE_SHARED.search(m[3])) else None
    node = NodeProcess(
        proc, parts[0][2], token=token, host=m[1], brokers=parts, api=api, shared=shared
    )
    _drain(node)
    return node


def start_controller(
    db: Path,
    args: Sequence[str] = (),
    *,
    stderr: IO[str] | int | None = None,
    preexec_fn: Callable[[], None] | None = None,
    timeout: float = 30.0,
    token: str | None = None,
    host: str = "127.0.0.1",
    command_prefix: Sequence[str] = (),
) -> ServerProcess:
    """Start ``srtm controller`` on ``host`` (ephemeral port) with its state in ``db``;
    ``token``: the cluster token (a new random one if None); ``command_prefix``: as for
    ``start_broker``."""
    token = token or new_token()
    cmd = ["controller", "--http-address", f"{host}:0", "--db", str(db), *args]
    proc, m = _start(
        cmd, _CONTROLLER_READY, stderr=stderr, new_session=False, preexec_fn=preexec_fn,
        timeout=timeout, token=token, command_prefix=command_prefix,
    )  # fmt: skip
    server = ServerProcess(proc, (m[1], int(m[2])), token=token)
    _drain(server)
    return server


@dataclass
class LocalCluster:
    """A controller and brokers 1..n registered with it, all children of this process."""

    controller: ServerProcess
    brokers: list[BrokerProcess]

    @property
    def url(self) -> str:
        return f"http://{self.controller.http_address}"

    @property
    def token(self) -> str | None:
        """The cluster's token (every child has it)."""
        return self.controller.token

    @property
    def headers(self) -> dict[str, str]:
        """What a mutating request to the controller or a broker must carry."""
        return self.controller.headers

    def stop(self) -> None:
        # The controller first: brokers stop one by one, flushing traces, and a controller
        # still adapting would warn about every one already gone. Brokers take a missing
        # controller silently.
        self.controller.stop()
        for b in self.brokers:
            if b.alive():
                b.stop()
            else:
                b.proc.wait()


def start_cluster(
    directory: Path,
    brokers: int,
    *,
    broker_args: Sequence[str] = (),
    controller_args: Sequence[str] = (),
    tie_to_parent: bool = False,
    timeout: float = 30.0,
) -> LocalCluster:
    """Start a controller and ``brokers`` brokers (ids 1..n, data under ``directory``) and
    return once every broker has registered; on any failure nothing is left running.
    ``tie_to_parent``: they get SIGTERM if this process dies (``die_with_parent``).
    One random token per cluster goes to every child (``cluster.token``)."""
    pre = die_with_parent if tie_to_parent else None
    token = new_token()
    controller = start_controller(
        directory / "controller.db", controller_args, preexec_fn=pre, token=token
    )
    cluster = LocalCluster(controller, [])
    try:
        for i in range(1, brokers + 1):
            args = ["--broker-id", str(i), "--controller", cluster.url, *broker_args]
            cluster.brokers.append(
                start_broker(directory / f"broker-{i}", args, preexec_fn=pre, token=token)
            )
        deadline = time.monotonic() + timeout
        while len(controller.json("/nodes")["producers"]) < brokers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only some of {brokers} brokers registered in {timeout} s")
            time.sleep(0.05)
    except BaseException:
        cluster.stop()
        raise
    return cluster
