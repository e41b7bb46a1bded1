"""Live runs sized to the machine they run on.

A live scenario's latencies are meant to come from its emulated brokers (``--capacity``)
queueing for tokens and service, not from the machine. Its own processes (controller,
brokers, emulator, subscriber) cost real CPU in proportion to the message rate: on the
development machine the correlated-sensors demo uses about one of its two CPUs. On a
machine half as fast the same run needs both, the brokers' loops fall behind, fitting
reads the machine's lateness as a lack of capacity, and the result depends on the
machine instead of the placement.

So a live run first measures what this machine can compute (``measure``: a fixed piece of
Python work on every usable CPU at once for about a second, so a CPU quota, a smaller
affinity mask and a slower CPU all show) and scales the scenario in time by the ratio to
the development machine (``scale_for``), never up: message rates (publishers, brokers'
capacity and ``mcap``) are multiplied by it, and every duration the queueing depends on
(the SLO, the correlation spread, fitting's measurement window and settling time, the
emulator's lateness limit) divided by it. In units of the brokers' service time the run
is the same experiment: the same publishers, groups, bucket in tokens, broker count and
SLO relative to service time, at a rate this machine carries with the headroom the
reference machine has.

``choose`` is the measurement every live family starts from; each slows its own
scenario: ``scaled`` here, ``tenancy.scenario.scaled`` the multi-tenant one. The diurnal day and
the utility paper's live experiments are not CPU-bound and run as written (why:
``diurnal.live.NOT_SIZED``, ``utility.live.NOT_SIZED``).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import struct
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from srtm.experiments.scenarios.scenario import Fit, Preload, PublisherClass, Scenario

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

#: Work units a second the development machine (2 CPUs, where every shipped live scenario
#: was sized and its results were measured) computes on all its CPUs together: the median
#: of 10 ``measure()`` runs there, quiet, was 275,000 (267,600-282,300; one CPU alone
#: about 141,000), taken 10 % lower so that its own run-to-run noise never scales it down.
REFERENCE_UNITS_PER_S = 248_000.0
#: Scales are rounded down to this step, so that runs on similar machines are comparable.
STEP = 0.05
#: Below this a run would have too few messages per measured window to judge a p99.
MIN_SCALE = 0.1
MEASURE_S = 1.0
#: Under a cgroup CPU quota below its CPUs a run keeps this share of the scale its speed
#: alone calls for. A quota is spent in bursts: when the run's processes use it up early
#: in a period (100 ms under systemd and most container runtimes) all of them wait for the
#: next, 25-30 ms here, whatever the load. Under a quota of 1 CPU of 2 (speed 0.6 of the
#: reference) LB's brokers released 26-33 ms late (p99) at scales 0.6, 0.55 and 0.45,
#: over the run check's half-SLO limit; at 0.4 and below the stalls fall under it. One CPU
#: pinned with taskset, the same speed, ran 0.55 cleanly.
QUOTA_HEADROOM = 0.6


@dataclass(frozen=True)
class MachineSpeed:
    """What ``measure`` found: work units a second over all usable CPUs together."""

    units_per_s: float
    #: CPUs this process may run on (its affinity mask).
    cpus: int
    #: The CPU quota of its cgroup in CPUs, None without one.
    quota_cpus: float | None
    seconds: float

    @property
    def relative(self) -> float:
        """This machine's speed as a share of the reference machine's."""
        return self.units_per_s / REFERENCE_UNITS_PER_S

    @property
    def throttled(self) -> bool:
        """Whether a CPU quota allows less than the CPUs it may run on."""
        return self.quota_cpus is not None and self.quota_cpus < self.cpus


@dataclass(frozen=True)
class Sizing:
    """How a live run was sized: the machine measured (None when a scale was given) and
    the scale applied to its scenario."""

    scale: float
    machine: MachineSpeed | None = None

    def describe(self, sc: Scenario) -> str:
        return self.explain(
            f"brokers process {sc.capacity:,.0f} msg/s, the topic offers {sc.rate:,.0f} "
            f"msg/s, SLO p99 ≤ {sc.slo_p99_ms:.3g} ms"
        )

    def explain(self, slowed: str) -> str:
        """What was measured and chosen; ``slowed``: what the slowed run's rates and SLO
        are (said only when it is slowed)."""
        where = (
            "scale given"
            if self.machine is None
            else f"this machine computes {self.machine.relative:.2f}× the reference "
            f"({self.machine.cpus} CPUs"
            + (f", quota {self.machine.quota_cpus:g}" if self.machine.quota_cpus else "")
            + ")"
        )
        if self.scale == 1.0:
            return f"{where}: the scenario runs at full scale."
        return f"{where}: the scenario runs {self.scale:g}× slower in time: {slowed}."

    def to_json(self) -> dict[str, object]:
        m = self.machine
        return {
            "scale": self.scale,
            "reference_units_per_s": REFERENCE_UNITS_PER_S,
            "units_per_s": None if m is None else m.units_per_s,
            "relative_speed": None if m is None else m.relative,
            "cpus": None if m is None else m.cpus,
            "quota_cpus": None if m is None else m.quota_cpus,
        }


def scale_for(units_per_s: float, throttled: bool = False) -> float:
    """The time scale for a machine computing ``units_per_s``: its speed relative to the
    reference (times ``QUOTA_HEADROOM`` when a CPU quota ``throttled`` it), rounded down to
    ``STEP``, at most 1 and at least ``MIN_SCALE``."""
    if not (math.isfinite(units_per_s) and units_per_s > 0):
        raise ValueError(f"units_per_s must be a positive number, got {units_per_s!r}")
    ratio = units_per_s / REFERENCE_UNITS_PER_S * (QUOTA_HEADROOM if throttled else 1.0)
    stepped = math.floor(ratio / STEP + 1e-9) * STEP
    return round(min(1.0, max(MIN_SCALE, stepped)), 4)


def scaled(sc: Scenario, s: float) -> Scenario:
    """``sc`` slowed in time by ``s`` (0 < s <= 1): rates × s, queueing durations ÷ s."""
    if not (0 < s <= 1):
        raise ValueError(f"scale must be in (0, 1], got {s!r}")
    if s == 1:
        return sc
    fit: Fit | None = None
    if sc.fit is not None:
        fit = replace(sc.fit, window_s=sc.fit.window_s / s, settle_s=sc.fit.settle_s / s)
    return replace(
        sc,
        capacity=sc.capacity * s,
        mcap=sc.mcap * s,
        slo_p99_ms=float(f"{sc.slo_p99_ms / s:.3g}"),  # 33.3 ms, not 33.3333
        spread_ms=sc.spread_ms / s,
        publishers=tuple(_class(c, s) for c in sc.publishers),
        preload=tuple(Preload(p.broker, p.rate * s) for p in sc.preload),
        fit=fit,
        time_scale=sc.time_scale * s,
    )


def _class(c: PublisherClass, s: float) -> PublisherClass:
    return replace(c, rate=c.rate * s)


def choose(scale: float | None) -> Sizing:
    """``scale`` as given, or (None) the scale this machine's speed calls for: the one
    measurement every live family's sizing starts from (each slows its own scenario by
    ``Sizing.scale``: ``scaled`` here, ``tenancy.scaled``)."""
    if scale is not None:
        if not (0 < scale <= 1):
            raise ValueError(f"scale must be in (0, 1], got {scale!r}")
        return Sizing(scale)
    machine = measure()
    return Sizing(scale_for(machine.units_per_s, machine.throttled), machine)


# -- the measurement -------------------------------------------------------------------
_PACK = struct.Struct(">qHq")


def work_unit() -> int:
    """A fixed piece of the Python a broker and the emulator run per message: packing a
    header, a dict of small tuples, a join."""
    d: dict[bytes, tuple[int, bytes]] = {}
    for i in range(40):
        b = _PACK.pack(i, i & 0xFFFF, -i)
        d[b] = (i, b)
    return len(b"".join(d))


def _worker(start: float, seconds: float, out: Queue[int]) -> None:
    # Every worker waits for the same start and ends at the same wall-clock time, so that
    # they run at once: a quota or a shared core then shows as fewer units each.
    while time.monotonic() < start:
        time.sleep(0.001)
    end, n = start + seconds, 0
    while time.monotonic() < end:
        work_unit()
        n += 1
    out.put(n)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def quota_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 ``cpu.max`` or v1
    ``cpu.cfs_quota_us``), None where there is none or it cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            q = _read(root / rel / "cpu.max")
            if q is not None and not q.startswith("max"):
                quota, period = q.split()[:2]
                return int(quota) / int(period)
        elif "cpu" in controllers.split(","):
            base = root / "cpu" / rel
            quota_s, period_s = _read(base / "cpu.cfs_quota_us"), _read(base / "cpu.cfs_period_us")
            if quota_s and period_s and int(quota_s) > 0:
                return int(quota_s) / int(period_s)
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None


def measure(seconds: float = MEASURE_S) -> MachineSpeed:
    """Work units a second this machine computes on every CPU it lets this process use,
    measured with one process per CPU running at once for ``seconds``."""
    cpus = usable_cpus()
    ctx = multiprocessing.get_context()
    out: Queue[int] = ctx.Queue()
    start = time.monotonic() + 0.2  # time for every worker to start
    procs = [ctx.Process(target=_worker, args=(start, seconds, out)) for _ in range(cpus)]
    for p in procs:
        p.start()
    try:
        total = sum(out.get(timeout=seconds + 30) for _ in procs)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return MachineSpeed(total / seconds, cpus, quota_cpus(), seconds)
