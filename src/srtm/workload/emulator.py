"""Many emulated publishers, one asyncio scheduler, few connections.

The emulator sends a ``Schedule`` on time: at each wake-up it takes every event now due,
stamps each message's measurement header with the real send time, and sends one MPUB per
broker. Publishers are multiplexed over one connection per broker; the connection asks
the broker to attribute each message to the publisher its header names. Where each
publisher sends is a routing table the caller may change at any time (a new plan from the
controller): later messages go to the new broker, while the old connection finishes what
it carries, so a move loses nothing. Send lateness (real send time − intended time) is
measured for every message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from srtm.controllers import Controllers, ControllerUnreachable
from srtm.nsq_connection import BrokerError, Connection
from srtm.protocol import Mpub, header
from srtm.quantiles import quantiles
from srtm.version import __version__
from srtm.workload.schedule import Schedule

log = logging.getLogger("srtm.workload")

_SEQ_TIME = struct.Struct(">Qq")
_SEQ_AT = 6  # the header's sequence number and send time follow magic, version, flags


@dataclass
class EmulatorReport:
    """What a run sent: counts, and send lateness per message (ns, −1 if never sent)."""

    scheduled: int
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    #: Due while their publisher had no broker (the controller left it unassigned).
    unrouted: int = 0
    #: Not sent because the emulator fell more than ``max_late_ns`` behind (CPU stall).
    skipped_late: int = 0
    lateness_ns: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    started_ns: int = 0
    finished_ns: int = 0
    #: Messages sent per publisher id (its highest sequence number + 1).
    per_publisher: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Messages per second actually sent."""
        span = (self.finished_ns - self.started_ns) / 1e9
        return self.sent / span if span > 0 else 0.0

    def lateness_summary(self) -> dict[str, float]:
        """Send lateness in µs: p50, p99, p99.9 and max over messages sent (0 if none)."""
        late = self.lateness_ns[self.lateness_ns >= 0]
        out = quantiles(late, (0.5, 0.99, 0.999), scale=1e3, suffix="_us", empty=0.0)
        return out | {"max_us": float(late.max() / 1e3) if late.size else 0.0}


class Emulator:
    """Sends ``schedule``'s messages to ``topic``, each publisher to the broker its route
    names (``routes``: publisher id -> broker TCP address)."""

    def __init__(
        self,
        schedule: Schedule,
        topic: str,
        routes: Mapping[str, str],
        *,
        message_size: int = 100,
        name: str = "emulator",
        max_late_s: float | None = None,
    ) -> None:
        if message_size < header.SIZE:
            raise ValueError(f"message_size must be at least {header.SIZE} (the header)")
        self.schedule, self.topic, self.name = schedule, topic, name
        self.message_size = message_size
        specs = schedule.publishers
        # One template body per publisher; a send only writes its seq and send time.
        self._templates = [
            header.encode(header.Header(p.id, p.group, 0, 0), message_size) for p in specs
        ]
        self._index = {p.id: i for i, p in enumerate(specs)}
        self._route: list[str | None] = [None] * len(specs)
        self._seq = [0] * len(specs)
        self._conns: dict[str, Connection] = {}
        self._opening: dict[str, asyncio.Task[Connection]] = {}
        self._pending: set[asyncio.Future[bytes]] = set()
        self.report = EmulatorReport(schedule.messages)
        #: Events this late are skipped (counted), not sent: a stalled emulator would
        #: otherwise send them all at once, a burst the workload does not have.
        self._max_late_ns = None if max_late_s is None else int(max_late_s * 1e9)
        self._stop_ns: int | None = None
        self.route(routes)

    def stop_at(self, t_ns: int) -> None:
        """Send nothing due at or after ``t_ns`` (wall clock ns); ``run`` then returns once
        what was sent is acknowledged."""
        self._stop_ns = t_ns

    def route(self, routes: Mapping[str, str]) -> None:
        """Send each listed publisher's next messages to its new address; publishers not
        listed stop sending (their messages are counted as unrouted)."""
        unknown = set(routes) - set(self._index)
        if unknown:
            raise ValueError(f"routes name publishers not in the schedule: {sorted(unknown)[:5]}")
        self._route = [routes.get(p.id) for p in self.schedule.publishers]

    async def run(
        self, start_ns: int | None = None, on_tick: Callable[[int], None] | None = None
    ) -> EmulatorReport:
        """Send the whole schedule (time 0 = ``start_ns``, default now) and wait for every
        acknowledgement; ``on_tick`` gets the count of messages handled so far."""
        sched = self.schedule
        t0 = time.time_ns() if start_ns is None else start_ns
        rep = self.report
        rep.started_ns = t0
        rep.lateness_ns = np.full(sched.messages, -1, np.int64)
        # Where each event's messages start in the per-message arrays.
        first = np.concatenate([[0], np.cumsum(sched.batch)[:-1]]).astype(np.int64)
        due_all = sched.t_ns + t0
        n, i = len(due_all), 0
        while i < n:
            if self._stop_ns is not None and due_all[i] >= self._stop_ns:
                break
            wait = int(due_all[i]) - time.time_ns()
            if wait > 0:
                await asyncio.sleep(min(wait / 1e9, 0.05))  # stays responsive to stop_at
                continue
            now = time.time_ns()
            j = int(np.searchsorted(due_all, now, side="right"))
            if self._stop_ns is not None:
                j = min(j, int(np.searchsorted(due_all, self._stop_ns, side="left")))
            self._send_events(i, max(j, i + 1), first, due_all)
            i = max(j, i + 1)
            if on_tick is not None:
                on_tick(int(first[i - 1] + sched.batch[i - 1]))
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        rep.finished_ns = time.time_ns()
        rep.per_publisher = {p.id: s for p, s in zip(sched.publishers, self._seq, strict=True)}
        return rep

    def _send_events(
        self, i: int, j: int, first: npt.NDArray[np.int64], due: npt.NDArray[np.int64]
    ) -> None:
        """Events i..j-1 (all due): one MPUB per broker, stamped now."""
        sched, rep = self.schedule, self.report
        out: dict[str, list[bytes]] = {}
        late = rep.lateness_ns
        for k in range(i, j):
            p = int(sched.publisher[k])
            address = self._route[p]
            count = int(sched.batch[k])
            if address is None:
                rep.unrouted += count
                continue
            now = time.time_ns()
            if self._max_late_ns is not None and now - int(due[k]) > self._max_late_ns:
                rep.skipped_late += count
                continue
            bodies = out.setdefault(address, [])
            template = self._templates[p]
            for _ in range(count):
                body = bytearray(template)
                _SEQ_TIME.pack_into(body, _SEQ_AT, self._seq[p], now)
                self._seq[p] += 1
                bodies.append(bytes(body))
            at = int(first[k])
            late[at : at + count] = now - int(due[k])
        for address, bodies in out.items():
            self._publish(address, bodies)

    def _publish(self, address: str, bodies: list[bytes]) -> None:
        self.report.sent += len(bodies)
        conn = self._conns.get(address)
        if conn is None or conn.closed.is_set():
            # Not connected yet: connect, then send (in order, behind earlier ones).
            task = self._opening.get(address)
            if task is None:
                task = self._opening[address] = asyncio.ensure_future(self._open(address))
            fut: asyncio.Future[bytes] = asyncio.ensure_future(self._later(task, bodies))
        else:
            fut = conn.request(Mpub(self.topic, bodies))
        self._pending.add(fut)
        fut.add_done_callback(functools.partial(self._answered, n=len(bodies)))

    async def _later(self, opening: asyncio.Task[Connection], bodies: list[bytes]) -> bytes:
        conn = await opening
        return await conn.request(Mpub(self.topic, bodies))

    async def _open(self, address: str) -> Connection:
        identity = {"client_id": self.name, "srtm_publisher": self.name,
                    "srtm_header_publisher": True,
                    "user_agent": f"srtm-emulator/{__version__}"}  # fmt: skip
        try:
            conn = await Connection.open(address, identity)
        finally:
            # A failed attempt is not kept: the next send to this address tries again.
            self._opening.pop(address, None)
        self._conns[address] = conn
        return conn

    def _answered(self, fut: asyncio.Future[bytes], n: int) -> None:
        self._pending.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            self.report.failed += n
            exc = None if fut.cancelled() else fut.exception()
            log.warning("%d messages not accepted: %s", n, exc)
        else:
            self.report.acknowledged += n

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for conn in list(self._conns.values()):
            await conn.close()
        self._conns.clear()


def routes_of(plan: Mapping[str, Any]) -> dict[str, str]:
    """Publisher id -> TCP address, from the controller's ``/plan`` document."""
    return {p: b["tcp_address"] for b in plan.get("brokers", []) for p in b.get("publishers", [])}


async def follow_plan(
    emulator: Emulator, controller: str | Sequence[str], topic: str, interval_s: float = 0.2
) -> None:
    """Keep ``emulator``'s routes on the controller's plan (polled, from the first of the
    controllers ``URL[,URL...]`` that answers; runs until cancelled).
    A version is followed once it is in place: publishers sent to a broker before it has
    its new share would wait there for it (a live despawn: 115 ms)."""
    version = None
    controllers = Controllers(controller, log=log, switch_level=logging.INFO)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while True:
            with contextlib.suppress(
                aiohttp.ClientError, TimeoutError, BrokerError, ControllerUnreachable
            ):
                r = await controllers.request(session, "GET", "/plan", params={"topic": topic})
                if r.status == 200:
                    plan = r.json()
                    if plan.get("version") != version and plan.get("in_place", True):
                        version = plan.get("version")
                        emulator.route(routes_of(plan))
            await asyncio.sleep(interval_s)


class AckLedger(Emulator):
    """An emulator that keeps the send time of each message a broker acknowledged, by
    (publisher, seq)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acked: dict[tuple[str, int], int] = {}

    def _publish(self, address: str, bodies: list[bytes]) -> None:
        before = set(self._pending)
        super()._publish(address, bodies)
        for fut in set(self._pending) - before:
            fut.add_done_callback(functools.partial(self._record, bodies=bodies))

    def _record(self, fut: asyncio.Future[bytes], bodies: list[bytes]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        for body in bodies:
            h = header.decode(body)
            if h is not None:
                self.acked[(h.publisher, h.seq)] = h.send_ns
