"""Hosts in network namespaces, and links between them that tests can cut.

``Network`` (root and ``ip`` needed): a bridge in the root namespace with the address
``10.231.X.254/24`` (so the test process reaches every host), and per ``add_host`` a
namespace, a veth pair into the bridge and the address ``10.231.X.K``. ``cut(a, b)`` makes
the wire between two hosts lose every IP packet between them, both ways: on the root side
of each host's veth an HTB qdisc whose class ``1:2`` is a ``pfifo`` of length 0, and a u32
filter sending packets from the other host there. Packets vanish: a connect times out,
an open connection stalls (and resumes after ``heal`` if it has not timed out); nothing is
refused. The test process (the root namespace) and other hosts still reach both.

``ProxyNetwork`` (anywhere): the fallback on 127.0.0.1 for machines without namespaces. A
link ``address(src, dst, port)`` is a forwarding proxy in this process; cutting it stalls
its connections (nothing is read or forwarded) and new connections are accepted but never
connected onwards, so requests time out as in a partition. Only links made through
``address`` can be cut: etcd members' peer links, which etcd dials itself, cannot.

Both have ``add_host``, ``address``, ``cut``, ``heal``, ``isolate``, ``rejoin`` and
``close``; a ``Host`` has ``ip``, ``command_prefix``, ``run`` and ``popen``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: The private /16 the networks take their /24s from (unlikely to clash with real ones).
SUBNET_BASE = "10.231"
_LOCK = Path("/tmp/srtm-netns.lock")
_NS_PREFIX = "srtm-"
_LINK_NAME = re.compile(r"^sr[bv]([0-9a-z]+)-")
_DROP_CLASS = "1:2"
_STOP_TIMEOUT_S = 5.0


def netns_unavailable() -> str | None:
    """Why namespaces cannot be used here (not root, no ``ip`` or ``tc``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"network namespaces need `{tool}` (iproute2), which is not installed"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_counter = iter(range(1, 1 << 30))


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with_parent() -> None:
    from srtm.launch import die_with_parent

    die_with_parent()


class Host(Protocol):
    name: str
    ip: str

    @property
    def command_prefix(self) -> list[str]: ...

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]: ...

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]: ...


@dataclass
class NsHost:
    """A host: its own network namespace, one interface ``eth0`` with ``ip``."""

    name: str
    index: int
    namespace: str
    #: The root-namespace end of its veth pair (where its cuts are applied).
    veth: str
    ip: str
    processes: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    @property
    def command_prefix(self) -> list[str]:
        """Prepended to a command line, runs it inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` inside the namespace."""
        kwargs.setdefault("timeout", 60)
        return subprocess.run([*self.command_prefix, *argv], **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` inside the namespace; stopped by the network's ``close``
        (and by its death: SIGTERM when the starting thread dies)."""
        kwargs.setdefault("preexec_fn", _die_with_parent)
        proc = subprocess.Popen([*self.command_prefix, *argv], **kwargs)
        self.processes.append(proc)
        return proc


class Network:
    """A bridge and hosts in namespaces; ``close`` (or the ``with`` block's end) removes
    every namespace, link and process it made, whatever happened before."""

    def __init__(self) -> None:
        if why := netns_unavailable():
            raise RuntimeError(why)
        pid36 = _base36(os.getpid())
        self.run_id = f"{pid36}-{_base36(next(_counter))}"  # interface names: <= 15 chars
        self.bridge = f"srb{self.run_id}"
        self.hosts: list[NsHost] = []
        self._cuts: set[frozenset[str]] = set()
        with _locked():
            _sweep_stale()
            self.subnet = _free_subnet()
            self.gateway = f"{self.subnet}.254"
            try:
                _sh("ip", "link", "add", self.bridge, "type", "bridge")
                _sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
                _sh("ip", "link", "set", self.bridge, "up")
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str) -> NsHost:
        """A new host in its own namespace, reachable from here and from every other."""
        k = len(self.hosts) + 1
        if k > 250:
            raise ValueError("a Network holds at most 250 hosts")
        host = NsHost(
            name, k, f"{_NS_PREFIX}{self.run_id}-{name}", f"srv{self.run_id}h{k}",
            f"{self.subnet}.{k}",
        )  # fmt: skip
        self.hosts.append(host)
        peer = f"srp{self.run_id}h{k}"
        ns = host.namespace
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
        _sh("ip", "link", "set", peer, "netns", ns)
        _sh("ip", "link", "set", host.veth, "master", self.bridge, "up")
        _sh("ip", "-n", ns, "link", "set", peer, "name", "eth0")
        _sh("ip", "-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Toward the host, unclassified packets bypass HTB (no default class): unshaped.
        # Class 1:2 is the hole a cut sends packets into: a FIFO that holds nothing.
        _sh("tc", "qdisc", "add", "dev", host.veth, "root", "handle", "1:", "htb")
        _sh("tc", "class", "add", "dev", host.veth, "parent", "1:", "classid", _DROP_CLASS,
            "htb", "rate", "8bit")  # fmt: skip
        _sh("tc", "qdisc", "add", "dev", host.veth, "parent", _DROP_CLASS, "handle", "2:",
            "pfifo", "limit", "0")  # fmt: skip
        return host

    def address(self, src: Host, dst: Host, port: int) -> str:
        """Where ``src`` reaches ``dst``'s ``port``: ``dst``'s own address."""
        return f"{dst.ip}:{port}"

    def cut(self, a: Host, b: Host) -> None:
        """Every packet between ``a`` and ``b`` is lost, both ways, until ``heal``."""
        pair = frozenset((a.name, b.name))
        if a.name == b.name or pair in self._cuts:
            return
        ha, hb = self._host(a), self._host(b)
        for to, frm in ((ha, hb), (hb, ha)):
            # On the root side of `to`'s veth, egress is what `to` receives.
            _sh("tc", "filter", "add", "dev", to.veth, "parent", "1:", "protocol", "ip",
                "pref", str(frm.index), "u32", "match", "ip", "src", f"{frm.ip}/32",
                "flowid", _DROP_CLASS)  # fmt: skip
        self._cuts.add(pair)

    def heal(self, a: Host, b: Host) -> None:
        """Undo ``cut(a, b)`` (nothing if they were not cut)."""
        pair = frozenset((a.name, b.name))
        if pair not in self._cuts:
            return
        ha, hb = self._host(a), self._host(b)
        for to, frm in ((ha, hb), (hb, ha)):
            _sh("tc", "filter", "del", "dev", to.veth, "parent", "1:", "pref", str(frm.index))
        self._cuts.discard(pair)

    def isolate(self, host: Host) -> None:
        """Cut ``host`` from every other host now in the network (not from this process)."""
        for other in self.hosts:
            self.cut(host, other)

    def rejoin(self, host: Host) -> None:
        """Heal every cut between ``host`` and another host."""
        for other in self.hosts:
            self.heal(host, other)

    def close(self) -> None:
        """Stop every process in the namespaces, then delete them and the links."""
        for host in self.hosts:
            for proc in host.processes:
                _stop(proc)
            _kill_namespace_processes(host.namespace)
            _sh("ip", "netns", "del", host.namespace, check=False)
            _sh("ip", "link", "del", host.veth, check=False)  # gone with its peer, normally
        _sh("ip", "link", "del", self.bridge, check=False)
        self.hosts.clear()
        self._cuts.clear()

    def _host(self, h: Host) -> NsHost:
        for host in self.hosts:
            if host.name == h.name:
                return host
        raise ValueError(f"{h.name} is not a host of this network")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serializes choosing a subnet between the processes of one machine (xdist)."""
    with _LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet() -> str:
    """A ``10.231.X`` no interface of the root namespace has an address in."""
    used = set(
        re.findall(rf"inet {re.escape(SUBNET_BASE)}\.(\d+)\.", _sh("ip", "-o", "-4", "addr").stdout)
    )
    start = os.getpid() % 250
    for step in range(250):
        x = (start + step) % 250 + 1
        if str(x) not in used:
            return f"{SUBNET_BASE}.{x}"
    raise RuntimeError(f"every {SUBNET_BASE}.X.0/24 is in use")


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL what still runs in ``namespace`` (started by the test through a command
    prefix rather than ``popen``); a namespace with processes outlives ``ip netns del``."""
    pids = _sh("ip", "netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _sweep_stale() -> None:
    """Remove namespaces and links left by test processes that were killed outright."""

    def dead(pid36: str) -> bool:
        try:
            return not _alive(int(pid36, 36))
        except ValueError:
            return False

    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(_NS_PREFIX) and dead(ns[len(_NS_PREFIX) :].split("-")[0]):
            _kill_namespace_processes(ns)
            _sh("ip", "netns", "del", ns, check=False)
    for name in re.findall(r"^\d+: ([^:@]+)", _sh("ip", "-o", "link").stdout, re.M):
        if (m := _LINK_NAME.match(name)) and dead(m.group(1)):
            _sh("ip", "link", "del", name, check=False)


# --- the fallback: forwarding proxies on 127.0.0.1 --------------------------------------


@dataclass
class ProxyHost:
    """A host of a ``ProxyNetwork``: 127.0.0.1, commands run here directly."""

    name: str
    ip: str = "127.0.0.1"
    processes: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    @property
    def command_prefix(self) -> list[str]:
        return []

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("timeout", 60)
        return subprocess.run(list(argv), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        kwargs.setdefault("preexec_fn", _die_with_parent)
        proc = subprocess.Popen(list(argv), **kwargs)
        self.processes.append(proc)
        return proc


@dataclass
class _Link:
    src: str
    dst: str
    target: tuple[str, int]
    open: asyncio.Event
    server: asyncio.Server | None = None
    port: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class ProxyNetwork:
    """Links as forwarding proxies in a thread of this process (see the module's text)."""

    def __init__(self) -> None:
        self.hosts: list[ProxyHost] = []
        self._links: dict[tuple[str, str, int], _Link] = {}
        self._cuts: set[frozenset[str]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> ProxyNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(self, name: str) -> ProxyHost:
        host = ProxyHost(name)
        self.hosts.append(host)
        return host

    def address(self, src: Host, dst: Host, port: int) -> str:
        """A proxy forwarding to ``127.0.0.1:port`` that ``cut(src, dst)`` cuts: where
        ``src`` must connect to reach ``dst``'s ``port``."""
        key = (src.name, dst.name, port)
        if key not in self._links:
            self._links[key] = self._call(self._listen(src.name, dst.name, port))
        return f"127.0.0.1:{self._links[key].port}"

    def cut(self, a: Host, b: Host) -> None:
        self._cuts.add(frozenset((a.name, b.name)))
        self._apply()

    def heal(self, a: Host, b: Host) -> None:
        self._cuts.discard(frozenset((a.name, b.name)))
        self._apply()

    def isolate(self, host: Host) -> None:
        for other in self.hosts:
            if other.name != host.name:
                self._cuts.add(frozenset((host.name, other.name)))
        self._apply()

    def rejoin(self, host: Host) -> None:
        self._cuts = {pair for pair in self._cuts if host.name not in pair}
        self._apply()

    def close(self) -> None:
        """Stop the hosts' processes, close every proxy and its connections."""
        for host in self.hosts:
            for proc in host.processes:
                _stop(proc)
        if self._loop.is_running():
            self._call(self._close_links())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    # --- the proxies' own thread -----------------------------------------------------

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def _apply(self) -> None:
        async def apply() -> None:
            for link in self._links.values():
                if frozenset((link.src, link.dst)) in self._cuts:
                    link.open.clear()
                else:
                    link.open.set()

        self._call(apply())

    async def _listen(self, src: str, dst: str, port: int) -> _Link:
        link = _Link(src, dst, ("127.0.0.1", port), asyncio.Event())
        if frozenset((src, dst)) not in self._cuts:
            link.open.set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            link.writers.append(writer)
            await link.open.wait()  # cut: accepted, but never connected onwards
            try:
                up_reader, up_writer = await asyncio.open_connection(*link.target)
            except OSError:
                writer.close()  # the target refuses: so does the link
                return
            link.writers.append(up_writer)
            await asyncio.gather(
                _pump(reader, up_writer, link.open), _pump(up_reader, writer, link.open)
            )

        link.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        link.port = link.server.sockets[0].getsockname()[1]
        return link

    async def _close_links(self) -> None:
        for link in self._links.values():
            if link.server is not None:
                link.server.close()
            for w in link.writers:
                w.close()
        self._links.clear()
        # Connections held by a cut wait on their link forever: end them too.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, open_: asyncio.Event
) -> None:
    """Forward bytes while the link is open; while cut, hold them (the sender's buffers
    fill and it stalls, as when packets are lost and retransmitted)."""
    try:
        while data := await reader.read(65536):
            await open_.wait()
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()
