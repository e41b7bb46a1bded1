"""``srtm calibrate``: measure the real broker on this machine and fit a broker model.

A broker is started as a child process (``srtm.launch.start_broker``) and driven from a
load generator in a second process, one subscriber and one publishing connection, 100-
byte messages carrying their send time:

1. saturation: PUB (100 in flight) and MPUB of 10 (10 in flight) as fast as the broker
   takes them while the subscriber drains, and PUB spread over 16 connections. The
   delivered rates give the cost of a message (``per_message_s``), of a publish command
   (``per_event_s``: the read, parse and wake-up of a connection per command), and, from
   the 16-connection run, what another connection costs (kept in ``notes``);
2. paced Poisson load (PUB per message) at a trickle and at fractions of the PUB
   saturation rate, end-to-end latency per message. The trickle's latencies, less one
   message's cost, are the ``base`` distribution; the p99 at each rate gives the measured
   capacity at the SLO (interpolated where the p99 crosses it); the cost of a read event
   (a message arriving on its own: ``per_event_s``) and the service-time spread
   (``service_cv``) are the grid point whose simulated p50s and p99s are closest to the
   measured ones.

The broker is one asyncio thread, so the model has one core. ``mcap`` is the measured
capacity at the SLO (what the Load Distributor should assume for this broker).

A calibration shares the machine like a live run: the machine's figures over the measured
span (``srtm.experiments.host``) give it a verdict, ``disturbed`` or ``not disturbed``,
kept in the model's ``notes["validity"]`` with the revision and the machine measured on.
A disturbed calibration measured the machine's queue, not the broker.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import platform
import select
import socket
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from srtm.experiments import host
from srtm.experiments.validity import machine_reasons
from srtm.launch import start_broker
from srtm.protocol import MAGIC_V2, FrameReader, FrameType, Mpub, Pub, encode_command
from srtm.protocol.frames import BODY_AT, HEARTBEAT, ID_AT
from srtm.quantiles import quantiles
from srtm.sim.model import BrokerModel, Dist
from srtm.sim.probe import capacity_at_slo, probe

TOPIC = "srtm_calibrate"
CHANNEL = "c"
BODY = 100
RDY = 2_500
_STAMP = struct.Struct(">qq")
CV_GRID = (0.0, 0.5, 1.0, 2.0, 3.0)
#: Candidate costs of a read event, in halves of a message's cost.
EVENT_GRID = tuple(range(0, 13))
#: Seconds each candidate model is simulated per paced step while fitting.
FIT_PROBE_S = 1.5
IO_TIMEOUT_S = 10.0
#: Share of the machine's CPU time other processes may use while calibrating: saturation
#: runs keep the broker and the load generator each on a CPU of the two, so a quarter of
#: the machine used by others means one of them shared its CPU much of the time.
FOREIGN_CPU_SHARE = 0.25

#: (what, done, total) for a progress bar.
OnProgress = Callable[[str, float, float], None]


@dataclass(frozen=True)
class CalibrationPlan:
    """What to measure and for how long (the defaults take about 30 s)."""

    slo_p99_ms: float = 1.0
    step_s: float = 2.5
    trickle_rate: float = 500.0
    fractions: tuple[float, ...] = (0.1, 0.25, 0.4, 0.55, 0.7)
    saturation_s: float = 2.0
    connections: int = 16
    broker_args: tuple[str, ...] = ()
    #: Saturation keeps at most this many messages published and not yet delivered (0:
    #: no bound); needed for a broker with ``--capacity`` (``saturate``).
    max_undelivered: int = 0

    def steps(self) -> int:
        return 1 + 3 + 1 + len(self.fractions) + 1  # start, saturation, trickle, paced, fit

    def command(self) -> str:
        """The ``srtm calibrate`` command line that measures this plan (the flags it
        differs from the defaults by; ``fractions`` and ``connections`` have none)."""
        default = CalibrationPlan()
        flags = [
            f"--{name.replace('_', '-')} {value:g}"
            for name, flag in (("slo_ms", "slo_p99_ms"), ("step_s", "step_s"),
                               ("saturation_s", "saturation_s"), ("trickle_rate", "trickle_rate"))
            if (value := getattr(self, flag)) != getattr(default, flag)
        ]  # fmt: skip
        flags += [f"--broker-arg={arg}" for arg in self.broker_args]
        return " ".join(["srtm calibrate", *flags])


# == the load generator (its own process) ===============================================
def _connect(addr: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(addr, timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    return sock


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(1 << 20)
    if not data:
        raise ConnectionError("the broker closed the connection")
    return data


def _subscribe(addr: tuple[str, int], topic: str) -> socket.socket:
    sock = _connect(addr)
    sock.sendall(f"SUB {topic} {CHANNEL}\n".encode())
    frames = _Frames(sock)
    while not frames.oks:
        frames.feed(0, stamps=False)
    sock.sendall(f"RDY {RDY}\n".encode())
    return sock


class _Frames:
    """Frames from one connection: counts OKs, FINs messages, reads send stamps."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.frames = sock, FrameReader()
        self.oks = self.messages = 0
        self.latency_ns: list[int] = []

    def feed(self, now_ns: int, stamps: bool) -> None:
        reply = []
        buf = self.frames.buffer
        for kind, start, end in self.frames.spans(_recv(self.sock)):
            if kind == FrameType.MESSAGE:
                self.messages += 1
                reply.append(b"FIN " + bytes(buf[start + ID_AT : start + BODY_AT]) + b"\n")
                if stamps:
                    sent_ns = _STAMP.unpack_from(buf, start + BODY_AT)[0]
                    self.latency_ns.append(now_ns - sent_ns)
            elif kind == FrameType.RESPONSE:
                if buf[start:end] == HEARTBEAT:
                    reply.append(b"NOP\n")
                else:
                    self.oks += 1
            else:
                raise ConnectionError(bytes(buf[start:end]).decode(errors="replace"))
        if reply:
            self.sock.sendall(b"".join(reply))


def saturate(
    addr: tuple[str, int],
    topic: str,
    batch: int,
    connections: int,
    seconds: float,
    max_undelivered: int = 0,
) -> float:
    """Delivered msg/s with every publishing connection keeping commands in flight; with
    ``max_undelivered``, no more than that many messages published and not yet delivered.
    A broker with ``--capacity`` takes messages far faster than its emulated server
    delivers them: unbounded, the backlog one step leaves would hold the broker-wide
    server through the next steps."""
    sub = _Frames(_subscribe(addr, topic))
    pubs = [_Frames(_connect(addr)) for _ in range(connections)]
    body = b"x" * BODY
    cmd = encode_command(Pub(topic, body) if batch == 1 else Mpub(topic, [body] * batch))
    window = max(1, 100 // (batch * connections))
    credits = {p.sock: 0 for p in pubs}  # commands acknowledged and not yet sent again
    sent = 0
    try:
        for p in pubs:
            p.sock.sendall(cmd * window)
            sent += window * batch
        start = time.perf_counter()
        first = sub.messages
        socks = {p.sock: p for p in pubs} | {sub.sock: sub}
        while time.perf_counter() - start < seconds:
            ready, _, _ = select.select(list(socks), [], [], 0.5)
            for s in ready:
                f = socks[s]
                before = f.oks
                f.feed(0, False)
                if f is not sub:
                    credits[s] += f.oks - before
            for s, n in credits.items():
                if max_undelivered:
                    n = min(n, max(0, max_undelivered - (sent - sub.messages)) // batch)
                if n > 0:
                    s.sendall(cmd * n)
                    credits[s] -= n
                    sent += n * batch
        return (sub.messages - first) / (time.perf_counter() - start)
    finally:
        for f in [*pubs, sub]:
            f.sock.close()


def paced(addr: tuple[str, int], topic: str, rate: float, seconds: float, seed: int) -> list[int]:
    """Poisson PUBs at ``rate`` on one connection; end-to-end latency (ns) per message."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * seconds))
    due = np.sort(rng.uniform(0, seconds * 1e9, n)).astype(np.int64)
    sub = _Frames(_subscribe(addr, topic))
    pub = _Frames(_connect(addr))
    head = f"PUB {topic}\n".encode() + struct.pack(">I", BODY)
    pad = b"p" * (BODY - _STAMP.size)
    clock = time.time_ns
    try:
        t0 = clock() + 20_000_000
        sent = 0
        deadline = t0 + int((seconds + 3) * 1e9)
        socks = {sub.sock: sub, pub.sock: pub}
        while sub.messages < n and clock() < deadline:
            now = clock()
            upto = int(np.searchsorted(due, now - t0, side="right"))
            if upto > sent:
                stamp = clock()
                pub.sock.sendall(
                    b"".join(head + _STAMP.pack(stamp, i) + pad for i in range(sent, upto))
                )
                sent = upto
            wait = (t0 + int(due[sent]) - clock()) / 1e9 if sent < n else 0.05
            ready, _, _ = select.select(list(socks), [], [], max(0.0, wait))
            for s in ready:
                socks[s].feed(clock(), socks[s] is sub)
        return sub.latency_ns
    finally:
        sub.sock.close()
        pub.sock.close()


def serve_steps(conn: Connection, tasks: Mapping[str, Callable[..., Any]]) -> None:
    """A load generator process's loop: run each step the parent names with its keyword
    arguments and send back ``("ok", result)`` or ``("error", text)``, until the parent
    sends None or goes."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        name, kwargs = msg
        try:
            conn.send(("ok", tasks[name](**kwargs)))
        except Exception as exc:  # reported to the parent, which fails the calibration
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


@contextlib.contextmanager
def step_process(
    target: Callable[..., None], args: tuple[Any, ...], what: str, pids: list[int] | None = None
) -> Iterator[Callable[..., Any]]:
    """``target(conn, *args)`` (it calls ``serve_steps``) in a spawned process of its own,
    so that the load it generates does not share the calibrating process's GIL; yields
    ``call(name, timeout_s, **kwargs)``, which runs one step there and returns its
    result. ``what`` names the steps in errors; the process's pid is added to ``pids``
    (the run's own processes, for its validity)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    child.close()
    if pids is not None and proc.pid is not None:
        pids.append(proc.pid)

    def call(name: str, timeout_s: float, **kwargs: Any) -> Any:
        parent.send((name, kwargs))
        if not parent.poll(timeout_s):
            raise RuntimeError(f"{what} step {name} gave no result in {timeout_s:g} s")
        try:
            status, value = parent.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"the load generator died during {name}: {exc}") from None
        if status != "ok":
            raise RuntimeError(f"{what} step {name} failed: {value}")
        return value

    try:
        yield call
    finally:
        with contextlib.suppress(OSError):
            parent.send(None)
        proc.join(3)
        if proc.is_alive():
            proc.terminate()
            proc.join(3)
        parent.close()


def _generator_main(conn: Connection, addr: tuple[str, int]) -> None:
    serve_steps(conn, {"saturate": partial(saturate, addr), "paced": partial(paced, addr)})


@contextlib.contextmanager
def _generator(addr: tuple[str, int], pids: list[int]) -> Iterator[Callable[..., Any]]:
    count = iter(range(1_000_000))
    with step_process(_generator_main, (addr,), "calibration", pids) as step:

        def call(name: str, timeout_s: float, **kwargs: Any) -> Any:
            # A topic of its own per step: what one step left queued never reaches the next.
            return step(name, timeout_s, **kwargs | {"topic": f"{TOPIC}_{next(count)}"})

        yield call


# == measuring and fitting ================================================================
@dataclass
class CalibrationMeasurements:
    saturation: dict[str, float] = field(default_factory=dict)
    trickle_ns: list[int] = field(default_factory=list)
    #: (offered rate, p50 ms, p99 ms, messages) per paced step.
    steps: list[tuple[float, float, float, int]] = field(default_factory=list)
    #: The machine over the measured span (None: not read, e.g. not Linux).
    figures: host.HostFigures | None = None


def measure(
    plan: CalibrationPlan, on_progress: OnProgress | None = None
) -> CalibrationMeasurements:
    """Run the broker and the generator through ``plan`` (see the module docstring)."""
    total = plan.steps()
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        if on_progress is not None:
            on_progress(what, done, total)
        done += 1

    out = CalibrationMeasurements()
    with tempfile.TemporaryDirectory(prefix="srtm-calibrate-") as tmp:
        tick("starting a broker")
        broker = start_broker(Path(tmp) / "data", list(plan.broker_args))
        try:
            addr = broker.tcp
            pids = [broker.proc.pid, os.getpid()]
            with _generator(addr, pids) as call:
                watch = host.take(pids)
                limit = plan.saturation_s + 30
                for key, batch, conns in (
                    ("pub", 1, 1),
                    ("mpub10", 10, 1),
                    (f"pub_{plan.connections}conn", 1, plan.connections),
                ):
                    tick(f"saturation: {key}")
                    out.saturation[key] = call(
                        "saturate", limit, batch=batch, connections=conns,
                        seconds=plan.saturation_s, max_undelivered=plan.max_undelivered,
                    )  # fmt: skip
                tick(f"trickle: {plan.trickle_rate:g} msg/s")
                out.trickle_ns = call(
                    "paced", plan.step_s + 30, rate=plan.trickle_rate,
                    seconds=max(plan.step_s, 2000 / plan.trickle_rate), seed=1,
                )  # fmt: skip
                top = out.saturation["pub"]
                for i, f in enumerate(plan.fractions):
                    rate = f * top
                    tick(f"paced: {rate:,.0f} msg/s ({f:.0%} of saturation)")
                    lat = np.asarray(
                        call("paced", plan.step_s + 30, rate=rate, seconds=plan.step_s, seed=2 + i)
                    )
                    q = quantiles(lat, (0.5, 0.99), scale=1e6)
                    out.steps.append((rate, q["p50"], q["p99"], int(lat.size)))
                out.figures = host.between(watch, host.take(pids), os.cpu_count() or 1)
        finally:
            broker.stop()
    tick("fitting the model")
    return out


def _per_message(saturation: dict[str, float]) -> float:
    """Seconds per message when reads carry many (MPUB of 10, commands in flight)."""
    return 1.0 / saturation["mpub10"]


def measured_capacity(steps: Sequence[tuple[float, float, float, int]], slo_ms: float) -> float:
    """Rate where the measured p99 crosses the SLO (log-linear between the steps around
    it); the highest rate measured if none crosses, 0 if the first already does."""
    pts = [(r, p99) for r, _, p99, n in steps if n > 0 and math.isfinite(p99)]
    prev: tuple[float, float] | None = None
    for rate, p99 in pts:
        if p99 > slo_ms:
            if prev is None:
                return 0.0
            r0, q0 = prev
            x = (math.log(slo_ms) - math.log(q0)) / (math.log(p99) - math.log(q0))
            return r0 + x * (rate - r0)
        prev = (rate, p99)
    return pts[-1][0] if pts else 0.0


def _score(model: BrokerModel, m: CalibrationMeasurements, plan: CalibrationPlan) -> float:
    """Mean absolute log error of the model's p50 and p99 against the paced steps."""
    errors = []
    for rate, p50, p99, n in m.steps:
        if n == 0 or not (p50 > 0 and p99 > 0):
            continue
        s = probe(model, rate, min(plan.step_s, FIT_PROBE_S), seed=3)
        errors += [abs(math.log(s.p50_ms / p50)), abs(math.log(s.p99_ms / p99))]
    return statistics.fmean(errors) if errors else math.inf


def fit(m: CalibrationMeasurements, plan: CalibrationPlan) -> BrokerModel:
    """The broker model that best explains ``m``: the cost of a message from the MPUB
    saturation rate, the base from the trickle, then the cost of a read event (one
    message arriving on its own) and the service spread by a grid search on the paced
    steps' p50 and p99."""
    per_msg = _per_message(m.saturation)
    trickle = np.asarray(m.trickle_ns, dtype=np.float64) / 1e9
    if trickle.size < 50:
        raise RuntimeError(f"the trickle run delivered only {trickle.size} messages")
    model = BrokerModel(
        name="calibrated",
        mcap=1.0,
        cores=1,
        per_message_s=per_msg,
        per_event_s=0.0,
        service_cv=0.0,
        base=Dist.from_samples(np.maximum(trickle - per_msg, 0.0)),
        slo_p99_ms=plan.slo_p99_ms,
        source="srtm calibrate",
    )
    grid = [
        (_score(replace(model, per_event_s=k * per_msg / 2, service_cv=cv), m, plan), k, cv)
        for k in EVENT_GRID
        for cv in CV_GRID
    ]
    err, k, cv = min(grid)
    per_event = k * per_msg / 2
    # The base alone is a message's latency at a trickle: that is why a slow event-loop
    # wake-up can leave the p99 above the SLO at any load.
    base_only = replace(model, per_event_s=per_event, service_cv=cv)
    model_cap = capacity_at_slo(base_only, duration_s=plan.step_s)
    cap = measured_capacity(m.steps, plan.slo_p99_ms)
    conn_key = f"pub_{plan.connections}conn"
    per_conn = (1 / m.saturation[conn_key] - 1 / m.saturation["pub"]) / max(plan.connections - 1, 1)
    predicted = [probe(base_only, r, plan.step_s, seed=3) for r, _, _, _ in m.steps]
    notes = {
        "saturation_msg_per_s": m.saturation,
        "per_extra_connection_s": per_conn,
        "trickle": {"rate": plan.trickle_rate, "messages": int(trickle.size),
                    **quantiles(m.trickle_ns, (0.5, 0.99), scale=1e6, suffix="_ms")},
        "steps": [
            {"rate": r, "p50_ms": p50, "p99_ms": p99, "messages": n,
             "model_p50_ms": pred.p50_ms, "model_p99_ms": pred.p99_ms}
            for (r, p50, p99, n), pred in zip(m.steps, predicted, strict=True)
        ],
        "fit_mean_abs_log_error": err,
        "measured_capacity_at_slo": cap,
        "mcap_from": "measured capacity at the SLO" if cap > 0 else
                     "80 % of the model's throughput (the SLO was missed even at the "
                     "lowest paced rate)",
        "command": plan.command(),
        "machine": {"cpus": _cpus(), "description": machine()},
        "revision": revision(),
        "validity": validity(m.figures),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    return replace(
        base_only,
        mcap=cap if cap > 0 else 0.8 * base_only.throughput,
        capacity_at_slo=model_cap,
        notes=notes,
    )


def validity(figures: host.HostFigures | None) -> dict[str, Any]:
    """The calibration's verdict from the machine's figures over its span: the live runs'
    reasons (``machine_reasons``) and other processes' share of the CPUs."""
    if figures is None:
        return {"verdict": "unknown", "reasons": ["the machine's figures could not be read"]}
    # the live runs' reasons; beside any of them, the share other processes used
    why = machine_reasons(figures, [], span="the calibration")
    foreign = figures.foreign_cpu
    if not why and foreign is not None and foreign > FOREIGN_CPU_SHARE:
        why.append(
            f"other processes used {foreign:.0%} of the {figures.cpus} CPUs "
            f"(at most {FOREIGN_CPU_SHARE:.0%} leaves the broker and the generator theirs)"
        )
    return {
        "verdict": "disturbed" if why else "not disturbed",
        "reasons": why,
        "foreign_cpu": figures.foreign_cpu,
        "run_queue_wait": figures.run_queue_wait,
        "steal": figures.steal,
    }


def revision() -> str:
    """The checkout's ``git rev-parse --short HEAD`` (with ``+dirty`` when files under
    ``src`` differ from it), or ``unknown`` outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        git = ["git", "-C", str(here)]
        rev = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", str(here.parent)],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")  # fmt: skip


def machine() -> str:
    """The CPU model and count, the kernel and Python: where the figures were measured."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    python = platform.python_version()
    return f"{os.cpu_count()} × {model}, Linux {platform.release()}, Python {python}"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def calibrate(
    plan: CalibrationPlan | None = None, on_progress: OnProgress | None = None
) -> BrokerModel:
    plan = plan or CalibrationPlan()
    return fit(measure(plan, on_progress), plan)
