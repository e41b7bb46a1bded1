"""What the Dynamoth analogues share on 127.0.0.1: a cluster (controller and brokers as
child processes), its topic API, paced publishers and recording subscribers in this
process, the run's own validity (``srtm.experiments.validity``'s machine thresholds and the
publishers' lateness)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from srtm.client import Publisher, Received, Subscriber
from srtm.experiments import host, validity
from srtm.launch import LocalCluster, start_cluster

#: A paced send more than this late is skipped and counted (the emulator's rule, deviation
#: 21): sent at once, overdue sends would be bursts the run never meant.
MAX_LATE_S = 0.01
#: The subscribers' lookup refresh, as the live runs' sink (``srtm.experiments.sink``).
REFRESH_S = 0.2


@dataclass
class Delivery:
    """One message a subscriber received."""

    topic: str
    channel: str
    broker: str
    msg_id: str
    publisher: str
    seq: int
    send_ns: int
    recv_ns: int


@dataclass
class MoveRecorder:
    """Everything the run's subscribers received, and when each first read a broker."""

    got: list[Delivery] = field(default_factory=list)
    #: (topic, channel, broker address) -> when its subscriber was first subscribed there.
    joined_ns: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def on(self, topic: str, channel: str) -> Any:
        def record(m: Received) -> None:
            h = m.header
            if h is not None:
                self.got.append(
                    Delivery(
                        topic,
                        channel,
                        m.broker,
                        m.message.id.decode(),
                        h.publisher,
                        h.seq,
                        h.send_ns,
                        m.recv_ns,
                    )
                )

        return record


@dataclass
class Pacing:
    """What paced sending did: sends made, skipped as too late, and each send's lateness."""

    sent: int = 0
    skipped: int = 0
    late_ns: list[int] = field(default_factory=list)
    #: When each send was made.
    sent_ns: list[int] = field(default_factory=list)

    def sent_in(self, t0_ns: int, t1_ns: int) -> int:
        return sum(1 for t in self.sent_ns if t0_ns <= t < t1_ns)

    def late_p99_ms(self) -> float:
        return float(np.percentile(self.late_ns, 99) / 1e6) if self.late_ns else 0.0


class Bench:
    """A running cluster and an HTTP session to its controller."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.url = cluster.url
        self.http = aiohttp.ClientSession(headers=cluster.headers)
        self.pacing = Pacing()
        self.recorder = MoveRecorder()
        self.subscribers: list[tuple[Subscriber, str, str]] = []
        #: Other processes of the run (the fan-out subscribers).
        self.more_pids: list[int] = []
        self._watch = host.take(self.pids())

    def pids(self) -> list[int]:
        return [
            os.getpid(),
            self.cluster.controller.proc.pid,
            *(b.proc.pid for b in self.cluster.brokers),
            *self.more_pids,
        ]

    async def call(self, method: str, path: str, body: Any = None, ok: int = 200) -> Any:
        async with self.http.request(method, f"{self.url}{path}", json=body) as r:
            text = await r.text()
            if r.status != ok:
                raise RuntimeError(f"{method} {path}: {r.status} {text}")
            return await r.json() if text else None

    async def topic(
        self,
        name: str,
        rate: float,
        burst: float,
        publishers: Sequence[str],
        each: float,
        slo_ms: float = 50.0,
    ) -> None:
        doc = {
            "name": name,
            "slo_p99_ms": slo_ms,
            "burst": burst,
            "rate": rate,
            "policy": "lb",
            "publishers": [{"id": p, "rate": each} for p in publishers],
        }
        await self.call("POST", "/topics", doc, ok=201)

    async def move(self, name: str, publishers: Sequence[str], to: str) -> None:
        await self.call("POST", f"/topics/{name}/move", {"publishers": list(publishers), "to": to})

    async def lookup(self, name: str) -> list[str]:
        doc = await self.call("GET", f"/lookup?topic={name}")
        return sorted(f"{p['broadcast_address']}:{p['tcp_port']}" for p in doc["producers"])

    async def subscribe(self, topic: str, channel: str) -> Subscriber:
        sub = Subscriber(
            topic,
            channel,
            controller=self.url,
            refresh_s=REFRESH_S,
            on_message=self.recorder.on(topic, channel),
            max_in_flight=2_000,
        )
        await sub.start()
        self.subscribers.append((sub, topic, channel))
        return sub

    def note_joins(self) -> None:
        now = time.time_ns()
        for sub, topic, channel in self.subscribers:
            for address in sub.brokers:
                self.recorder.joined_ns.setdefault((topic, channel, address), now)

    async def watch_joins(self, stop: asyncio.Event) -> None:
        """When each subscriber first read each broker, to 5 ms."""
        while not stop.is_set():
            self.note_joins()
            await asyncio.sleep(0.005)

    async def pace(
        self,
        pubs: Sequence[Publisher],
        each: float,
        until_ns: int,
        acks: list[asyncio.Future[None]],
        stop: asyncio.Event | None = None,
    ) -> None:
        """Each publisher sends ``each`` msg/s, evenly spaced and staggered, until
        ``until_ns`` or ``stop``; a send over ``MAX_LATE_S`` late is skipped and counted."""
        period_ns = int(1e9 / each)
        start = time.time_ns()
        due = [start + i * period_ns // len(pubs) for i in range(len(pubs))]
        while stop is None or not stop.is_set():
            i = int(np.argmin(due))
            t = due[i]
            if t >= until_ns:
                return
            wait = (t - time.time_ns()) / 1e9
            if wait > 0:
                await asyncio.sleep(wait)
            late = time.time_ns() - t
            due[i] = t + period_ns
            if late > MAX_LATE_S * 1e9:
                self.pacing.skipped += 1
                continue
            self.pacing.late_ns.append(max(0, late))
            self.pacing.sent_ns.append(t + late)
            acks.append(await pubs[i].publish())
            self.pacing.sent += 1

    def disturbed(self) -> str | None:
        """Why the run measured the machine, if it did."""
        figures = host.between(self._watch, host.take(self.pids()), os.cpu_count() or 1)
        why: list[str] = []
        p = self.pacing
        if p.skipped > validity.SKIPPED_SHARE * max(p.sent + p.skipped, 1):
            why.append(f"{p.skipped:,} sends skipped as over {MAX_LATE_S * 1e3:g} ms late")
        if p.late_p99_ms() > validity.SEND_LATE_P99_SHARE * MAX_LATE_S * 1e3:
            why.append(f"sends late by {p.late_p99_ms():.1f} ms at p99")
        validity.machine_reasons(figures, why)
        return "; ".join(why) or None

    async def close(self) -> None:
        for sub, _, _ in self.subscribers:
            await sub.close()
        await self.http.close()


def cluster(
    directory: Path,
    brokers: int,
    broker_args: Sequence[str] = (),
    controller_args: Sequence[str] = (),
) -> LocalCluster:
    """A controller and ``brokers`` brokers reporting every 0.2 s, tied to this process."""
    args = ["--mcap", "100000", "--report-interval-s", "0.2", *broker_args]
    return start_cluster(
        directory,
        brokers,
        broker_args=args,
        controller_args=["--tick-s", "0.2", *controller_args],
        tie_to_parent=True,
    )


async def drain(bench: Bench, expected: int, timeout_s: float = 20.0) -> None:
    """Wait until the subscribers received ``expected`` messages (each channel counted),
    or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while len(bench.recorder.got) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def quantile_ms(values_ns: Sequence[int] | np.ndarray, q: float) -> float:
    """Nearest-rank quantile in ms (0 for none)."""
    a = np.sort(np.asarray(values_ns, dtype=np.int64))
    if not len(a):
        return 0.0
    return float(a[min(len(a) - 1, max(0, int(np.ceil(q * len(a))) - 1))] / 1e6)


class Fanout:
    """The subscribers' own process (``srtm.experiments.dynamoth.fanout``)."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self.proc = proc
        self.out = out

    @classmethod
    async def start(cls, controller: str, out: Path) -> Fanout:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "srtm.experiments.dynamoth.fanout",
            controller,
            str(out),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc, out)

    async def _say(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{line}\n".encode())
        await self.proc.stdin.drain()
        answer = (await self.proc.stdout.readline()).decode().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"fan-out subscribers: {line!r} answered {answer!r}")
        return answer

    async def sub(self, topic: str, channel: str) -> None:
        await self._say(f"sub {topic} {channel}")

    async def stop(self) -> FanoutRows:
        await self._say("stop")
        await self.proc.wait()
        with np.load(self.out) as f:
            return FanoutRows(
                f["rows"],
                [str(x) for x in f["topics"]],
                [str(x) for x in f["channels"]],
                [str(x) for x in f["brokers"]],
            )

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


@dataclass(frozen=True)
class FanoutRows:
    """What the fan-out subscribers received: per message (topic, channel, broker indices,
    send ns, receipt ns), and the names the indices stand for."""

    rows: np.ndarray
    topics: list[str]
    channels: list[str]
    brokers: list[str]

    def sent_in(self, t0_ns: int, t1_ns: int) -> np.ndarray:
        send = self.rows[:, 3]
        return self.rows[(send >= t0_ns) & (send < t1_ns)]

    def received_in(self, t0_ns: int, t1_ns: int) -> np.ndarray:
        recv = self.rows[:, 4]
        return self.rows[(recv >= t0_ns) & (recv < t1_ns)]
