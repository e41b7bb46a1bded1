"""The workload as a schedule of send events, generated from a seed (no I/O, numpy).

Publishers fire as Poisson or periodic processes (periodic with a uniformly random
phase) at their message rate; an event sends ``batch`` messages back to back, so events
come at ``rate / batch`` per second. Members of a correlation group fire together: the
group has one event process, and its members fire at offsets evenly spread over
``[0, spread]`` after each group event (the paper's imprecise correlation; 0 = in
lockstep).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

Process = Literal["poisson", "periodic"]
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    id: str
    #: Messages per second.
    rate: float
    process: Process = "poisson"
    #: Messages sent back to back per event.
    batch: int = 1
    group: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"publisher {self.id!r}: rate must be > 0, got {self.rate!r}")
        if self.process not in ("poisson", "periodic"):
            raise ValueError(f"publisher {self.id!r}: process must be poisson or periodic")
        if not (isinstance(self.batch, int) and self.batch >= 1):
            raise ValueError(f"publisher {self.id!r}: batch must be an integer >= 1")


@dataclass(frozen=True)
class Schedule:
    """Send events in time order: when (ns from the start), who, how many messages."""

    t_ns: npt.NDArray[np.int64]
    publisher: npt.NDArray[np.int32]
    batch: npt.NDArray[np.int32]
    publishers: tuple[PublisherSpec, ...]
    duration_s: float
    seed: int

    @property
    def messages(self) -> int:
        return int(self.batch.sum())

    def arrivals_ns(self) -> npt.NDArray[np.int64]:
        """One timestamp per message (a batch's messages share their event's time)."""
        return np.repeat(self.t_ns, self.batch)

    def write_trace(self, path: Path) -> None:
        """The schedule as an arrival trace (Parquet): one row per message."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        ids = np.array([p.id for p in self.publishers], dtype=object)
        groups = np.array([p.group for p in self.publishers], dtype=object)
        who = np.repeat(self.publisher, self.batch)
        table = pa.table(
            {
                "publisher": pa.array(ids[who], pa.string()),
                "group": pa.array(groups[who], pa.string()),
                "t_arrive_ns": pa.array(self.arrivals_ns(), pa.int64()),
            }
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)


def _events(
    process: Process, rate: float, duration_s: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Event times in seconds within [0, duration) for one process of ``rate`` events/s."""
    if process == "periodic":
        period = 1.0 / rate
        phase = rng.uniform(0.0, period)
        count = max(0, math.ceil((duration_s - phase) * rate))
        return (phase + period * np.arange(count, dtype=np.float64)).astype(np.float64)
    expected = rate * duration_s
    n = int(expected + 6 * math.sqrt(expected) + 10)  # enough with overwhelming probability
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    while t[-1] < duration_s:  # top up in the rare case it was not
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, n))])
    return t[t < duration_s]


def check_inputs(publishers: Sequence[PublisherSpec], duration_s: float, spread_s: float) -> None:
    """What every generator of a workload refuses, named."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    if not (math.isfinite(spread_s) and spread_s >= 0):
        raise ValueError(f"spread_s must be >= 0, got {spread_s!r}")
    if len({p.id for p in publishers}) != len(publishers):
        raise ValueError("publisher ids must be unique")


def build(
    publishers: Sequence[PublisherSpec],
    duration_s: float,
    *,
    spread_s: float = 0.0,
    seed: int = 0,
) -> Schedule:
    """The schedule of ``publishers`` over ``duration_s``; the same seed gives the same one."""
    check_inputs(publishers, duration_s, spread_s)
    units: dict[str, list[int]] = {}  # a group, or a publisher on its own, fires as one
    for i, p in enumerate(publishers):
        units.setdefault(f"g:{p.group}" if p.group is not None else f"p:{p.id}", []).append(i)
    times, who, sizes = [], [], []
    for u, members in enumerate(units.values()):
        first = publishers[members[0]]
        for i in members[1:]:
            p = publishers[i]
            if (p.rate, p.process, p.batch) != (first.rate, first.process, first.batch):
                raise ValueError(
                    f"group {first.group!r}: members fire together, so they must share rate, "
                    f"process and batch ({p.id!r} differs from {first.id!r})"
                )
        rng = np.random.default_rng([seed, u])
        events = _events(first.process, first.rate / first.batch, duration_s, rng)
        m = len(members)
        offsets = np.linspace(0.0, spread_s, m) if m > 1 else np.zeros(1)
        for j, i in enumerate(members):
            t = events + offsets[j]
            t = t[t < duration_s]
            times.append(np.round(t * NS_PER_S).astype(np.int64))
            who.append(np.full(len(t), i, dtype=np.int32))
            sizes.append(np.full(len(t), publishers[i].batch, dtype=np.int32))
    t_all = np.concatenate(times) if times else np.zeros(0, np.int64)
    order = np.argsort(t_all, kind="stable")
    return Schedule(
        t_all[order],
        np.concatenate(who)[order] if who else np.zeros(0, np.int32),
        np.concatenate(sizes)[order] if sizes else np.zeros(0, np.int32),
        tuple(publishers),
        duration_s,
        seed,
    )
