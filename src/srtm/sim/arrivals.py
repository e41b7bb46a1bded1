"""A topic's message arrivals, generated in bulk with numpy.

``generate`` draws from the same processes as ``srtm.workload.build`` (Poisson or
periodic events at ``rate / batch``, ``batch`` messages per event, members of a group
firing together at offsets evenly spread over ``[0, spread]``) but for all units of a
kind at once: a Poisson process's event count over the window is Poisson and, given the
count, its times are independent uniforms; so no per-publisher loop. The samples differ
from ``build``'s for the same seed; ``from_schedule`` converts a ``build`` schedule when
the exact trace of a live run is wanted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from srtm.workload import PublisherSpec, Schedule
from srtm.workload.schedule import check_inputs

NS_PER_S = 1_000_000_000
IntArray = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Trace:
    """One row per message, in arrival order: time (ns), publisher index, and whether it
    is the first message of its event (one read on the publisher's connection)."""

    t_ns: IntArray
    publisher: I32Array
    first: BoolArray
    publishers: tuple[PublisherSpec, ...]
    duration_s: float

    @property
    def messages(self) -> int:
        return int(self.t_ns.size)

    def index(self) -> dict[str, int]:
        return {p.id: i for i, p in enumerate(self.publishers)}

    def rows_of(self, publishers: npt.ArrayLike) -> IntArray:
        """Row numbers (in arrival order) of the messages of ``publishers`` (indices)."""
        keep = np.zeros(len(self.publishers), dtype=bool)
        keep[np.asarray(publishers, dtype=np.int64)] = True
        return np.flatnonzero(keep[self.publisher])


def _units(publishers: Sequence[PublisherSpec]) -> list[list[int]]:
    """Groups fire as one unit, others on their own (as ``srtm.workload.build``)."""
    units: dict[str, list[int]] = {}
    for i, p in enumerate(publishers):
        units.setdefault(f"g:{p.group}" if p.group is not None else f"p:{p.id}", []).append(i)
    for members in units.values():
        first = publishers[members[0]]
        for i in members[1:]:
            p = publishers[i]
            if (p.rate, p.process, p.batch) != (first.rate, first.process, first.batch):
                raise ValueError(
                    f"group {first.group!r}: members fire together, so they must share rate, "
                    f"process and batch ({p.id!r} differs from {first.id!r})"
                )
    return list(units.values())


def _unit_events(
    process: str, rate: float, count: int, duration_s: float, rng: np.random.Generator
) -> tuple[npt.NDArray[np.float64], IntArray]:
    """Event times (s) and unit numbers 0..count-1 of ``count`` units of ``rate`` events/s."""
    if process == "periodic":
        period = 1.0 / rate
        phase = rng.uniform(0.0, period, count)
        n = np.maximum(0, np.ceil((duration_s - phase) * rate)).astype(np.int64)
        unit = np.repeat(np.arange(count, dtype=np.int64), n)
        k = np.arange(unit.size, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        return phase[unit] + period * k, unit
    n = rng.poisson(rate * duration_s, count)
    unit = np.repeat(np.arange(count, dtype=np.int64), n)
    return rng.uniform(0.0, duration_s, unit.size), unit


def generate(
    publishers: Sequence[PublisherSpec],
    duration_s: float,
    *,
    spread_s: float = 0.0,
    seed: int = 0,
) -> Trace:
    """The arrivals of ``publishers`` over ``duration_s`` (see the module docstring)."""
    check_inputs(publishers, duration_s, spread_s)
    rng = np.random.default_rng(seed)
    units = _units(publishers)
    kinds: dict[tuple[str, float, int], list[int]] = {}
    for u, members in enumerate(units):
        p = publishers[members[0]]
        kinds.setdefault((p.process, p.rate, p.batch), []).append(u)
    # Members of every unit, flattened (CSR): unit u's members are flat[start[u]:start[u]+size[u]].
    size = np.array([len(m) for m in units], dtype=np.int64)
    start = np.cumsum(size) - size
    flat = np.array([i for m in units for i in m], dtype=np.int64)
    times: list[npt.NDArray[np.float64]] = []
    who: list[IntArray] = []
    for (process, rate, batch), us in kinds.items():
        t, local = _unit_events(process, rate / batch, len(us), duration_s, rng)
        unit = np.asarray(us, dtype=np.int64)[local]
        # One row per member firing: event e of unit u becomes size[u] rows.
        reps = size[unit]
        ev = np.repeat(np.arange(unit.size, dtype=np.int64), reps)
        j = np.arange(ev.size, dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
        m = size[unit][ev]
        offset = np.where(m > 1, spread_s * j / np.maximum(m - 1, 1), 0.0)
        times.append(t[ev] + offset)
        who.append(flat[start[unit][ev] + j])
    t_all = np.concatenate(times) if times else np.zeros(0)
    p_all = np.concatenate(who) if who else np.zeros(0, np.int64)
    keep = t_all < duration_s
    t_ns = np.round(t_all[keep] * NS_PER_S).astype(np.int64)
    return _messages(t_ns, p_all[keep], publishers, duration_s)


def _messages(
    event_ns: IntArray,
    event_pub: npt.ArrayLike,
    publishers: Sequence[PublisherSpec],
    duration_s: float,
) -> Trace:
    """Events (unsorted) to one row per message, sorted by time (stable within an event)."""
    order = np.argsort(event_ns, kind="stable")
    ev_t = event_ns[order]
    ev_p = np.asarray(event_pub, dtype=np.int32)[order]
    batch = np.array([p.batch for p in publishers], dtype=np.int64)[ev_p]
    first = np.zeros(int(batch.sum()), dtype=bool)
    first[np.cumsum(batch) - batch] = True
    return Trace(
        np.repeat(ev_t, batch), np.repeat(ev_p, batch), first, tuple(publishers), duration_s
    )


def from_schedule(schedule: Schedule) -> Trace:
    """The exact trace of a ``srtm.workload`` schedule (what a live run sends)."""
    return _messages(schedule.t_ns, schedule.publisher, schedule.publishers, schedule.duration_s)


def homogeneous(
    n: int,
    rate: float = 10.0,
    *,
    process: str = "poisson",
    batch: int = 1,
    group_size: int = 0,
    prefix: str = "p",
) -> list[PublisherSpec]:
    """``n`` identical publishers; with ``group_size``, consecutive ones share a group."""
    if process not in ("poisson", "periodic"):
        raise ValueError(f"process must be poisson or periodic, got {process!r}")
    return [
        PublisherSpec(
            f"{prefix}{i}",
            rate,
            "periodic" if process == "periodic" else "poisson",
            batch,
            f"g{i // group_size}" if group_size > 0 else None,
        )
        for i in range(n)
    ]
