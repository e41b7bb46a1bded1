"""``srtm node``: one host's cores as N broker processes, each a broker in its own right
(its own id, ports and data directory) registered under one host id, supervised.

The layout (``layout``: ids, data directories, ports) and the restart backoff
(``restart_delay``) are pure; ``NodeSupervisor`` runs the children with asyncio: it starts them,
restarts one that dies (same id, ports and data directory, so what it acknowledged to
disk is delivered after the restart), and stops them all on one SIGTERM or SIGINT.
A process runs its topics' sub-buckets whole, so shaping stays exact per process; the
controller spreads a topic over hosts before processes (``srtm.placement.policies``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from srtm.httpkit import join_host_port
from srtm.launch import die_with_parent

log = logging.getLogger("srtm.node")

#: The highest broker id (``BrokerOptions.broker_id``: the first 3 hex digits of ids).
MAX_BROKER_ID = 4095
#: Flags the node sets for each process: given among the broker options, they are refused.
OWN_FLAGS = ("--broker-id", "--data-dir", "--tcp-address", "--http-address", "--host-id")
#: A process that ran this long before it died starts again at once (its failures reset).
STABLE_S = 30.0
#: The first restart's delay and the longest (s): doubled per quick death in between.
FIRST_DELAY_S, MAX_DELAY_S = 0.1, 10.0
_READY = re.compile(r"tcp=(\S+):(\d+) http=(\S+):(\d+)")


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """One broker process of the node: its index, id, data directory and the ports it
    asks for (0: any free one; a restart asks for the ones it got)."""

    index: int
    broker_id: int
    data_dir: Path
    tcp: tuple[str, int]
    http: tuple[str, int]

    def argv(self, host_id: str, extra: Sequence[str]) -> list[str]:
        """Its ``srtm broker`` command line (after ``srtm``)."""
        return ["broker", "--broker-id", str(self.broker_id), "--data-dir", str(self.data_dir),
                "--tcp-address", join_host_port(*self.tcp),
                "--http-address", join_host_port(*self.http), "--host-id", host_id,
                *extra]  # fmt: skip


def layout(
    n: int, base_id: int, data_dir: Path, tcp: tuple[str, int], http: tuple[str, int] | None
) -> list[ChildPlan]:
    """``n`` processes: ids ``base_id + i``, data in ``data_dir/b{i}``, ports ``port + i``
    (0: each any). ``http`` None: on the TCP host, from the TCP port + ``n`` (4150…: TCP
    4150..4150+n-1, HTTP 4150+n…; port 0: any). ValueError naming what is wrong."""
    if n < 1:
        raise ValueError(f"--brokers must be at least 1, got {n}")
    if base_id < 0 or base_id + n - 1 > MAX_BROKER_ID:
        raise ValueError(
            f"--broker-id {base_id} with --brokers {n} gives ids {base_id}..{base_id + n - 1}; "
            f"broker ids are 0..{MAX_BROKER_ID}"
        )
    if http is None:
        http = (tcp[0], tcp[1] + n if tcp[1] else 0)
    for flag, (_, port) in (("--tcp-address", tcp), ("--http-address", http)):
        if port and port + n - 1 > 65535:
            raise ValueError(f"{flag} port {port} + {n} brokers passes 65535")
    if tcp[1] and http[1] and tcp[0] == http[0] and abs(tcp[1] - http[1]) < n:
        raise ValueError(
            f"--tcp-address ports {tcp[1]}..{tcp[1] + n - 1} and --http-address ports "
            f"{http[1]}..{http[1] + n - 1} overlap; give them ranges {n} apart"
        )
    return [
        ChildPlan(i, base_id + i, data_dir / f"b{i}", _nth(tcp, i), _nth(http, i)) for i in range(n)
    ]


def _nth(address: tuple[str, int], i: int) -> tuple[str, int]:
    """The ``i``-th process's address from the first one's (port 0: any, for each)."""
    return address[0], address[1] + i if address[1] else 0


def restart_delay(quick_deaths: int) -> float:
    """How long to wait before restarting a process that died ``quick_deaths`` times in a
    row, each within ``STABLE_S`` of its start (1: once): a crash loop backs off."""
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2.0 ** max(0, quick_deaths - 1))


def extra_flags_refused(extra: Sequence[str]) -> str | None:
    """Why ``extra`` (the broker options every process gets) is refused, or None."""
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in OWN_FLAGS:
            return f"{flag} is set by srtm node for each process; see srtm node --help"
    return None


@dataclass
class Child:
    """A running (or restarting) process of the node."""

    plan: ChildPlan
    proc: asyncio.subprocess.Process | None = None
    started_s: float = 0.0
    quick_deaths: int = 0
    restarts: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class NodeSupervisor:
    """N broker processes under one host id: ``start`` (all ready, or none left),
    ``run`` (restarting those that die) until ``stop``."""

    def __init__(
        self,
        plans: Sequence[ChildPlan],
        host_id: str,
        extra: Sequence[str] = (),
        *,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.children = [Child(p) for p in plans]
        self.host_id, self.extra = host_id, list(extra)
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.stopping = asyncio.Event()

    async def _spawn(self, child: Child) -> None:
        """Start ``child`` and wait for its ready line; its ports are then the ones it
        got, kept for its restarts (its address stays the one the controller knows)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "srtm", *child.plan.argv(self.host_id, self.extra),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            # Its own session: a terminal's Ctrl-C reaches the node, which stops each
            # child in turn; the node's death still stops them (die_with_parent).
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        child.proc, child.started_s = proc, time.monotonic()
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(self.start_timeout_s):
                while line := (await proc.stdout.readline()).decode(errors="replace"):
                    if m := _READY.search(line):
                        break
                else:
                    raise RuntimeError(
                        f"broker {child.plan.broker_id} exited with code {await proc.wait()}"
                    )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(
                f"broker {child.plan.broker_id} was not ready in {self.start_timeout_s:g} s"
            ) from None
        p = child.plan
        child.plan = ChildPlan(p.index, p.broker_id, p.data_dir, (m[1], int(m[2])),
                               (m[3], int(m[4])))  # fmt: skip
        child.tasks.append(asyncio.create_task(_drain(proc.stdout)))

    async def start(self) -> None:
        """Every process started and ready; if one is not, none is left running."""
        try:
            await asyncio.gather(*(self._spawn(c) for c in self.children))
        except BaseException:
            await self.stop()
            raise

    def ready_line(self) -> str:
        """What the node prints once every process is ready: each one's addresses."""
        parts = [
            f"[broker {c.plan.broker_id} tcp={join_host_port(*c.plan.tcp)} "
            f"http={join_host_port(*c.plan.http)}]"
            for c in self.children
        ]
        return f"srtm node host={self.host_id} brokers={len(self.children)} " + " ".join(parts)

    async def run(self) -> None:
        """Keep every process running until ``stop``: one that dies is started again
        with its id, ports and data directory, after ``restart_delay``."""
        watchers = [asyncio.create_task(self._watch(c)) for c in self.children]
        try:
            await self.stopping.wait()
        finally:
            for w in watchers:
                w.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def _watch(self, child: Child) -> None:
        while not self.stopping.is_set():
            assert child.proc is not None
            code = await child.proc.wait()
            if self.stopping.is_set():
                return
            ran = time.monotonic() - child.started_s
            child.quick_deaths = child.quick_deaths + 1 if ran < STABLE_S else 1
            delay = restart_delay(child.quick_deaths)
            log.warning("broker %d exited with code %d after %.1f s; restarting in %.1f s",
                        child.plan.broker_id, code, ran, delay)  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
                return
            try:
                await self._spawn(child)
            except (RuntimeError, OSError) as exc:
                log.warning("broker %d did not restart: %s", child.plan.broker_id, exc)
                child.started_s = time.monotonic()
                continue
            child.restarts += 1
            p = child.plan
            log.warning("broker %d restarted: tcp=%s http=%s", p.broker_id,
                        join_host_port(*p.tcp), join_host_port(*p.http))  # fmt: skip

    async def stop(self) -> None:
        """SIGTERM to every process (each saves what it still owes), a wait of up to
        ``stop_timeout_s`` for all, then SIGKILL for any still running."""
        self.stopping.set()
        procs = [c.proc for c in self.children if c.proc is not None]
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        waits = asyncio.gather(*(p.wait() for p in procs))
        try:
            await asyncio.wait_for(waits, self.stop_timeout_s)
        except TimeoutError:
            for p in procs:
                if p.returncode is None:
                    log.warning("a broker did not stop in %g s: killed", self.stop_timeout_s)
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            await asyncio.gather(*(p.wait() for p in procs))
        for c in self.children:
            for t in c.tasks:
                t.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read what a process prints after its ready line, so it never blocks on a pipe."""
    while await stream.readline():
        pass


async def serve_node(node: NodeSupervisor, ready: Callable[[NodeSupervisor], None]) -> None:
    """Start ``node``, call ``ready``, keep it running until SIGTERM or SIGINT, then stop
    every process."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stopping.set)
    await node.start()
    ready(node)
    try:
        await node.run()
    finally:
        await node.stop()
