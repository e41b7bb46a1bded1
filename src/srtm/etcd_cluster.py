"""A real etcd v3.4 cluster of N members as child processes: for tests and live experiments.

Each member gets its own data directory, log file and (by default) free ports on 127.0.0.1;
members may run on other host addresses and behind a command prefix (``["ip", "netns",
"exec", "NS"]`` runs one inside a network namespace). ``start_all`` returns once every
member's ``/health`` says true, which etcd only says when the member knows a leader and a
quorum answers. Members get SIGTERM when the thread that started them dies (Linux), and
``stop_all`` (or leaving the ``with`` block) stops every one, so nothing is left behind.

The client URLs must be reachable from this process (the health checks use them).
Imports only the standard library: the tests and ``srtm experiment`` use it alike.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

#: Raft timing, given explicitly (they equal etcd 3.4's defaults) so that tests do not
#: depend on a packaged default: a lost leader is replaced in about 1-2 s.
DEFAULT_HEARTBEAT_MS = 100
DEFAULT_ELECTION_MS = 1000
#: How long a member may take to become healthy (a cold start on a busy machine: ~1 s).
START_TIMEOUT_S = 30.0
#: How long a SIGTERMed member may take to exit before it is killed.
STOP_TIMEOUT_S = 5.0
_DEBIAN_ETCD = "/usr/bin/etcd"
_PR_SET_PDEATHSIG = 1


class EtcdClusterError(RuntimeError):
    """etcd is missing, or a member did not start or become healthy (the message says
    which, with the end of its log)."""


def etcd_binary() -> str:
    """The etcd executable: Debian's ``/usr/bin/etcd``, else ``etcd`` on PATH."""
    if Path(_DEBIAN_ETCD).is_file():
        return _DEBIAN_ETCD
    found = shutil.which("etcd")
    if found is None:
        raise EtcdClusterError(
            "etcd is not installed (neither /usr/bin/etcd nor etcd on PATH): "
            "install Debian's etcd-server package (`make test` installs it)"
        )
    return found


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports nothing listens on now on ``host`` (bound to port 0
    together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """For ``preexec_fn``: SIGTERM to the child when the thread that started it dies
    (as ``srtm.launch.die_with_parent``; repeated here to import nothing of srtm)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class EtcdNode:
    """One member: where it listens, where its data and log live, how it is run."""

    name: str
    host: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    #: Prepended to etcd's command line (e.g. ``ip netns exec NS``); empty: run directly.
    command_prefix: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` of its client URL, as ``--etcd-endpoints`` takes it."""
        return f"{self.host}:{self.client_port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def member_healthy(client_url: str, timeout_s: float = 1.0) -> bool:
    """Whether the member at ``client_url`` answers ``/health`` with true (it knows a
    leader and its cluster has a quorum)."""
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=timeout_s) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


class EtcdCluster:
    """``size`` etcd members started by ``start_all`` and stopped by ``stop_all``.

    ``hosts``: each member's listen address (default 127.0.0.1 for all);
    ``command_prefixes``: each member's command prefix (default none); ``ports``: each
    member's (client, peer) ports (default: free ports on 127.0.0.1, distinct across
    members, which also suits members alone in their own network namespaces).
    Indices ``i`` below count members from 0.
    """

    def __init__(
        self,
        directory: Path,
        size: int = 1,
        *,
        hosts: Sequence[str] | None = None,
        command_prefixes: Sequence[Sequence[str]] | None = None,
        ports: Sequence[tuple[int, int]] | None = None,
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
        election_ms: int = DEFAULT_ELECTION_MS,
        binary: str | None = None,
        token: str = "srtm-etcd",
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least 1 member, not {size}")
        hosts = list(hosts) if hosts is not None else ["127.0.0.1"] * size
        prefixes = [tuple(p) for p in command_prefixes] if command_prefixes else [()] * size
        if ports is None:
            flat = free_ports(2 * size)
            ports = [(flat[2 * i], flat[2 * i + 1]) for i in range(size)]
        for what, given in (("hosts", hosts), ("command_prefixes", prefixes), ("ports", ports)):
            if len(given) != size:
                raise ValueError(f"{what} has {len(given)} entries for {size} members")
        self.binary = binary if binary is not None else etcd_binary()
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.token = token
        self.start_timeout_s = start_timeout_s
        self.nodes = [
            EtcdNode(
                name=f"m{i}", host=hosts[i], client_port=ports[i][0], peer_port=ports[i][1],
                data_dir=directory / f"m{i}", log=directory / f"m{i}.log",
                command_prefix=prefixes[i],
            )
            for i in range(size)
        ]  # fmt: skip
        directory.mkdir(parents=True, exist_ok=True)

    # --- addresses -------------------------------------------------------------------

    @property
    def client_urls(self) -> list[str]:
        """Every member's client URL, ``http://host:port``."""
        return [n.client_url for n in self.nodes]

    @property
    def endpoints(self) -> str:
        """``host:port,host:port,...``: the value of ``--etcd-endpoints``."""
        return ",".join(n.endpoint for n in self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # --- life cycle ------------------------------------------------------------------

    def start_all(self) -> EtcdCluster:
        """Start every member and wait until each is healthy; on failure none is left
        running and EtcdClusterError says which member failed, with its log."""
        try:
            for i in range(len(self.nodes)):
                self._spawn(i)
            self._await_healthy(range(len(self.nodes)), self.start_timeout_s)
        except BaseException:
            self.stop_all()
            raise
        return self

    def start(self, i: int, *, wait: bool = True) -> None:
        """(Re)start member ``i`` on its data directory and ports; with ``wait``, return
        once it is healthy (which needs a quorum of the cluster running)."""
        if self.nodes[i].running():
            raise EtcdClusterError(f"etcd member {self.nodes[i].name} is already running")
        self._spawn(i)
        if wait:
            self.wait_healthy(i)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (a crash: nothing flushed) and reap it."""
        node = self.nodes[i]
        if node.process is not None:
            node.process.kill()
            node.process.wait()

    def stop(self, i: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM member ``i``; killed if it has not exited within ``timeout_s``."""
        node = self.nodes[i]
        if node.process is None:
            return
        node.process.terminate()
        try:
            node.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()

    def stop_all(self) -> None:
        """Stop every member, one after another: a leader SIGTERMed hands its leadership
        to a follower first, which takes seconds if that follower is stopping too."""
        for i in range(len(self.nodes)):
            self.stop(i)

    def __enter__(self) -> EtcdCluster:
        return self.start_all()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    # --- health ----------------------------------------------------------------------

    def healthy(self, i: int) -> bool:
        return member_healthy(self.nodes[i].client_url)

    def wait_healthy(self, i: int, timeout_s: float | None = None) -> None:
        """Wait until member ``i`` says it is healthy; EtcdClusterError (with the end of
        its log) if it exits first or ``timeout_s`` (default ``start_timeout_s``) passes."""
        self._await_healthy([i], self.start_timeout_s if timeout_s is None else timeout_s)

    def _await_healthy(self, indices: Iterable[int], timeout_s: float) -> None:
        pending = [self.nodes[i] for i in indices]
        deadline = time.monotonic() + timeout_s
        while pending:
            pending = [n for n in pending if not member_healthy(n.client_url)]
            exited = [n for n in pending if not n.running()]
            if exited or (pending and time.monotonic() > deadline):
                raise self._unhealthy((exited or pending)[0])
            time.sleep(0.05)

    @staticmethod
    def _unhealthy(node: EtcdNode) -> EtcdClusterError:
        code = node.process.poll() if node.process is not None else None
        state = f"exited with {code}" if code is not None else "still unhealthy"
        return EtcdClusterError(
            f"etcd member {node.name} at {node.client_url} did not become healthy "
            f"({state}); the end of {node.log}:\n{node.log_tail()}"
        )

    # --- internals -------------------------------------------------------------------

    def _command(self, node: EtcdNode) -> list[str]:
        initial = ",".join(f"{n.name}={n.peer_url}" for n in self.nodes)
        return [
            *node.command_prefix, self.binary,
            "--name", node.name, "--data-dir", str(node.data_dir),
            "--listen-client-urls", node.client_url, "--advertise-client-urls", node.client_url,
            "--listen-peer-urls", node.peer_url, "--initial-advertise-peer-urls", node.peer_url,
            "--initial-cluster", initial, "--initial-cluster-token", self.token,
            "--initial-cluster-state", "new",  # ignored on a restart: the data dir has it
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
        ]  # fmt: skip

    def _spawn(self, i: int) -> None:
        node = self.nodes[i]
        with node.log.open("ab") as out:
            try:
                node.process = subprocess.Popen(
                    self._command(node), stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                )  # fmt: skip
            except OSError as e:
                raise EtcdClusterError(f"cannot start etcd member {node.name}: {e}") from e
