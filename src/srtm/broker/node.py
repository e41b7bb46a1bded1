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
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from srtm.broker.shared import Dealer
from srtm.httpkit import join_host_port
from srtm.launch import die_with_parent

log = logging.getLogger("srtm.node")

#: The highest broker id (``BrokerOptions.broker_id``: the first 3 hex digits of ids).
MAX_BROKER_ID = 4095
#: Flags the node sets for each process: given among the broker options, they are refused.
OWN_FLAGS = (
    "--broker-id", "--data-dir", "--tcp-address", "--http-address", "--host-id", "--shared-fd",
)  # fmt: skip
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


def pick_cpu(cpus: Sequence[int], in_use: Sequence[int | None]) -> int:
    """The CPU for a process: the first of ``cpus`` (the node's) that the fewest of
    ``in_use`` (its other processes' CPUs) run on, so that processes take a core each in
    turn and an added one takes a core left idle."""
    return min(cpus, key=list(in_use).count)


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


def added_plan(
    plans: Sequence[ChildPlan], broker_id: int, max_processes: int, data_dir: Path
) -> ChildPlan:
    """The plan of one more process, ``broker_id``, beside ``plans`` (the node's now): its
    data in ``data_dir/broker-ID`` (named by its id, so an id added again finds what it
    acknowledged before), any free ports on the first process's hosts. ValueError naming
    what is wrong; ``NodeFull`` when the node already runs ``max_processes``."""
    if not 0 <= broker_id <= MAX_BROKER_ID:
        raise ValueError(f"broker id {broker_id} is not in 0..{MAX_BROKER_ID}")
    if any(p.broker_id == broker_id for p in plans):
        raise ValueError(f"broker {broker_id} already runs on this node")
    if len(plans) >= max_processes:
        raise NodeFull(f"this node runs {len(plans)} of its {max_processes} processes")
    first = plans[0]
    index = max(p.index for p in plans) + 1
    return ChildPlan(index, broker_id, data_dir / f"broker-{broker_id}",
                     (first.tcp[0], 0), (first.http[0], 0))  # fmt: skip


class NodeFull(Exception):
    """The node runs as many processes as it may (``--max-brokers``)."""


@dataclass
class Child:
    """A running (or restarting) process of the node."""

    plan: ChildPlan
    proc: asyncio.subprocess.Process | None = None
    started_s: float = 0.0
    quick_deaths: int = 0
    restarts: int = 0
    #: Added after the start (``NodeSupervisor.add``), not one of ``--brokers``.
    added: bool = False
    #: The CPU it runs on (None: wherever the OS puts it); a restart keeps it.
    cpu: int | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class NodeSupervisor:
    """N broker processes under one host id: ``start`` (all ready, or none left),
    ``run`` (restarting those that die) until ``stop``; ``add`` and ``remove`` one more
    process while running, up to ``max_processes`` (the controller's elastic loop uses a
    host's idle cores before a new host: ``srtm.broker.node_http``)."""

    def __init__(
        self,
        plans: Sequence[ChildPlan],
        host_id: str,
        extra: Sequence[str] = (),
        *,
        max_processes: int | None = None,
        data_dir: Path | None = None,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        dealer: Dealer | None = None,
        cpus: Sequence[int] = (),
    ) -> None:
        self.children = [Child(p) for p in plans]
        #: The CPUs its processes are pinned to, one each in turn (none: not pinned).
        self.cpus = list(cpus)
        #: Deals the connections of the node's shared address to its processes (None: none).
        self.dealer = dealer
        self._dealing: asyncio.Task[None] | None = None
        self.host_id, self.extra = host_id, list(extra)
        self.max_processes = max(len(plans), max_processes or len(plans))
        self.data_dir = data_dir if data_dir is not None else plans[0].data_dir.parent
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.stopping = asyncio.Event()
        self._watchers: dict[int, asyncio.Task[None]] = {}
        #: Where its HTTP API answers (``serve_node``), if it has one.
        self.api_address: tuple[str, int] | None = None
        #: ``add``/``remove`` one at a time: the count checked is the count started.
        self._changing = asyncio.Lock()

    async def _spawn(self, child: Child) -> None:
        """Start ``child`` and wait for its ready line; its ports are then the ones it
        got, kept for its restarts (its address stays the one the controller knows).
        With a shared address it gets a new channel for the connections dealt to it."""
        argv = child.plan.argv(self.host_id, self.extra)
        if self.cpus and child.cpu is None:
            child.cpu = pick_cpu(self.cpus, [c.cpu for c in self.children if c is not child])
        channel = None
        if self.dealer is not None:
            channel = self.dealer.channel(child.plan.broker_id)
            argv += ["--shared-fd", str(channel.fileno())]
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "srtm", *argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                # Its own session: a terminal's Ctrl-C reaches the node, which stops each
                # child in turn; the node's death still stops them (die_with_parent).
                start_new_session=True, preexec_fn=partial(_in_child, child.cpu),
                pass_fds=() if channel is None else (channel.fileno(),),
            )  # fmt: skip
        finally:
            if channel is not None:
                channel.close()  # the process has its own copy
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
        if self.dealer is not None:
            self._dealing = asyncio.create_task(self.dealer.acceptor.run(), name="srtm-deal")

    def ready_line(self) -> str:
        """What the node prints once every process is ready: each one's addresses."""
        parts = [
            f"[broker {c.plan.broker_id} tcp={join_host_port(*c.plan.tcp)} "
            f"http={join_host_port(*c.plan.http)}]"
            for c in self.children
        ]
        api = "" if self.api_address is None else f"node={join_host_port(*self.api_address)} "
        if self.dealer is not None:
            api += f"shared={join_host_port(*self.dealer.address)} "
        return f"srtm node host={self.host_id} brokers={len(self.children)} {api}" + " ".join(parts)

    async def run(self) -> None:
        """Keep every process running until ``stop``: one that dies is started again
        with its id, ports and data directory, after ``restart_delay``."""
        for c in self.children:
            self._watchers[c.plan.broker_id] = asyncio.create_task(self._watch(c))
        try:
            await self.stopping.wait()
        finally:
            watchers = list(self._watchers.values())
            for w in watchers:
                w.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def add(self, broker_id: int) -> Child:
        """One more process, ``broker_id`` (``added_plan``: ValueError, ``NodeFull``),
        started, ready and watched like the others; RuntimeError if it did not start."""
        async with self._changing:
            plan = added_plan([c.plan for c in self.children], broker_id, self.max_processes,
                              self.data_dir)  # fmt: skip
            child = Child(plan, added=True)
            await self._spawn(child)
            self.children.append(child)
            self._watchers[broker_id] = asyncio.create_task(self._watch(child))
            log.warning("broker %d added: tcp=%s http=%s (%d of %d processes)", broker_id,
                        join_host_port(*child.plan.tcp), join_host_port(*child.plan.http),
                        len(self.children), self.max_processes)  # fmt: skip
            return child

    async def remove(self, broker_id: int) -> int:
        """Stop process ``broker_id`` for good (SIGTERM: it saves what it owes; killed after
        ``stop_timeout_s``) and return its exit code; KeyError if the node has none."""
        async with self._changing:
            child = next((c for c in self.children if c.plan.broker_id == broker_id), None)
            if child is None:
                raise KeyError(broker_id)
            if len(self.children) == 1:
                raise ValueError("the node's last process is stopped with the node (SIGTERM)")
            self.children.remove(child)
            watcher = self._watchers.pop(broker_id, None)
            if watcher is not None:
                watcher.cancel()
            if self.dealer is not None:
                self.dealer.drop(broker_id)
            code = await self._stop_all([child])
            log.warning("broker %d removed (exit code %d)", broker_id, code)
            return code

    async def _watch(self, child: Child) -> None:
        while not self.stopping.is_set():
            assert child.proc is not None
            code = await child.proc.wait()
            if self.stopping.is_set():
                return
            if self.dealer is not None:
                self.dealer.drop(child.plan.broker_id)  # none dealt to it until it is back
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
        if self._dealing is not None:
            self._dealing.cancel()
            await asyncio.gather(self._dealing, return_exceptions=True)
        if self.dealer is not None:
            self.dealer.close()  # no more connections dealt; those dealt stay served
        await self._stop_all(self.children)

    async def _stop_all(self, children: Sequence[Child]) -> int:
        """SIGTERM to ``children``, killed after ``stop_timeout_s``; the last exit code."""
        procs = [c.proc for c in children if c.proc is not None]
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
        for c in children:
            for t in c.tasks:
                t.cancel()
        return (procs[-1].returncode or 0) if procs else 0

    def to_json(self) -> dict[str, object]:
        """``GET /node``: the host, the processes it runs and may run, each one's row (with
        the connections dealt to it from the shared address)."""
        d = self.dealer
        return {
            "host": self.host_id,
            "processes": len(self.children),
            "max_processes": self.max_processes,
            "shared_address": None if d is None else join_host_port(*d.address),
            "brokers": [
                {"id": c.plan.broker_id, "tcp_address": join_host_port(*c.plan.tcp),
                 "http_address": join_host_port(*c.plan.http), "restarts": c.restarts,
                 "added": c.added, "cpu": c.cpu,
                 "dealt": 0 if d is None else d.dealt[c.plan.broker_id]}
                for c in self.children
            ],
        }  # fmt: skip


def _in_child(cpu: int | None) -> None:
    """Before a process's ``exec``: it dies with the node, and runs on ``cpu`` (with
    every thread it starts). Pinned, a process keeps its core's caches and is not moved
    onto a core another process of the node is busy on (docs/broker.md has the
    figures: single PUB into a node of two about a quarter faster)."""
    die_with_parent()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read what a process prints after its ready line, so it never blocks on a pipe."""
    while await stream.readline():
        pass
