"""Synthetic trace datasets in the DESIGN.md layout, for tests, benchmarks and demos.

Given when each message was sent, by whom and to which broker, it plays the messages
through a model of the broker: a network hop, a FIFO token-bucket shaper per
(topic, broker) evaluated with ``srtm.analysis.token_delays``, processing, a second hop.
Every time is whole nanoseconds on one clock, as real traces are. The full per-message
frame comes back too, so that tests can compute reference numbers without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from srtm.analysis import token_delays
from srtm.ratelimit import NS_PER_S

#: Where synthetic clocks start (a CLOCK_REALTIME-like epoch, 2024-01-01).
EPOCH_NS = 1_704_067_200 * NS_PER_S

BROKER_COLUMNS = (
    "broker",
    "topic",
    "msg_id",
    "publisher",
    "t_arrive_ns",
    "t_release_ns",
    "t_dispatch_ns",
)
SUBSCRIBER_COLUMNS = (
    "broker",
    "topic",
    "msg_id",
    "publisher",
    "group",
    "seq",
    "t_send_ns",
    "t_recv_ns",
)


@dataclass(frozen=True)
class Sends:
    """What was sent: one entry per message (arrays of equal length)."""

    topic: npt.NDArray[np.str_] | npt.NDArray[np.object_]
    broker: npt.NDArray[np.str_] | npt.NDArray[np.object_]
    publisher: npt.NDArray[np.str_] | npt.NDArray[np.object_]
    group: npt.NDArray[np.object_]
    #: Send times, ns from the start of the run.
    t_send_ns: npt.NDArray[np.int64]


@dataclass(frozen=True)
class NetModel:
    """Delays of the model, in ns: a fixed part plus an exponential part."""

    hop_ns: int = 20_000
    hop_jitter_ns: float = 10_000.0
    processing_ns: int = 5_000
    processing_jitter_ns: float = 5_000.0


@dataclass(frozen=True)
class RunSpec:
    """A run's metadata (``runs/<run>.json``) and how its messages are shaped."""

    run: str
    policy: str
    scenario: str = "synthetic"
    slo_p99_ms: float = 1.0
    #: Each (topic, broker) sub-bucket gets ``rate_margin`` × its measured rate ...
    rate_margin: float = 1.1
    #: ... and this depth (tokens), unless ``buckets`` names its (rate, burst).
    burst: float = 4.0
    buckets: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    net: NetModel = field(default_factory=NetModel)


@dataclass(frozen=True)
class SyntheticRun:
    """A simulated run: every message's row (both sides' columns plus ``run`` and
    ``group``), and the (rate, burst) each (topic, broker) sub-bucket had."""

    spec: RunSpec
    frame: pd.DataFrame
    buckets: Mapping[tuple[str, str], tuple[float, float]]


def simulate(spec: RunSpec, sends: Sends, seed: int = 0) -> SyntheticRun:
    """Play ``sends`` through the broker model."""
    rng = np.random.default_rng(seed)
    n = len(sends.t_send_ns)
    frame = pd.DataFrame(
        {
            "run": spec.run,
            # Categoricals: cheap to sort and group at 10⁷ rows; plain strings on disk.
            "broker": pd.Categorical(sends.broker),
            "topic": pd.Categorical(sends.topic),
            "publisher": pd.Categorical(sends.publisher),
            "group": pd.Categorical(sends.group),
            "t_send_ns": EPOCH_NS + np.asarray(sends.t_send_ns, dtype=np.int64),
        }
    )
    net = spec.net
    frame["t_arrive_ns"] = frame["t_send_ns"] + _delays(rng, n, net.hop_ns, net.hop_jitter_ns)
    # The shaper is FIFO per (topic, broker) in arrival order.
    frame = frame.sort_values(["topic", "broker", "t_arrive_ns"], kind="stable")
    wait = np.zeros(n, dtype=np.int64)
    buckets = dict(spec.buckets)
    start = 0
    for (topic, broker), part in frame.groupby(["topic", "broker"], sort=False, observed=True):
        arrivals = part["t_arrive_ns"].to_numpy()
        rate, burst = buckets.setdefault((str(topic), str(broker)), _bucket(spec, arrivals))
        wait[start : start + len(part)] = token_delays(arrivals, rate, burst)
        start += len(part)
    frame["t_release_ns"] = frame["t_arrive_ns"] + wait
    proc = _delays(rng, n, net.processing_ns, net.processing_jitter_ns)
    frame["t_dispatch_ns"] = frame["t_release_ns"] + proc
    frame["t_recv_ns"] = frame["t_dispatch_ns"] + _delays(rng, n, net.hop_ns, net.hop_jitter_ns)
    frame["seq"] = frame.groupby("publisher", observed=True).cumcount().astype(np.int64)
    frame["msg_id"] = pd.Series(
        pd.arrays.ArrowExtensionArray(_message_ids(frame["broker"])), index=frame.index
    )
    return SyntheticRun(spec, frame.reset_index(drop=True), buckets)


def _bucket(spec: RunSpec, arrivals: npt.NDArray[np.int64]) -> tuple[float, float]:
    span = int(arrivals[-1] - arrivals[0]) if arrivals.size > 1 else 0
    rate = (arrivals.size - 1) * NS_PER_S / span if span > 0 else 1.0
    return spec.rate_margin * rate, spec.burst


def _delays(rng: np.random.Generator, n: int, fixed: int, jitter: float) -> npt.NDArray[np.int64]:
    return fixed + np.round(rng.exponential(jitter, n)).astype(np.int64)


def _message_ids(brokers: pd.Series) -> pa.Array:
    """NSQ-style ids: 16 hex digits, a 12-bit broker number then a per-broker counter."""
    index = brokers.cat.codes.to_numpy().astype(np.uint64)
    counter = brokers.groupby(brokers, observed=True).cumcount().to_numpy().astype(np.uint64)
    ids = (index << np.uint64(52)) | counter
    return _hex16(ids)


def _hex16(values: npt.NDArray[np.uint64]) -> pa.Array:
    """Fixed-width lowercase hex strings built in bulk (10⁷ Python strings would be slow)."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(60, -1, -4, dtype=np.uint64)
    nibbles = (values[:, None] >> shifts[None, :]) & np.uint64(15)
    chars = digits[nibbles.astype(np.intp)].reshape(-1)
    offsets = np.arange(0, 16 * len(values) + 1, 16, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())]
    )


def write(traces: Path, sim: SyntheticRun, files: int = 2) -> None:
    """Write a simulated run into a trace dataset: ``files`` Parquet parts per side and
    its ``runs/<run>.json``."""
    spec = sim.spec
    write_metadata(traces, spec, sim.buckets)
    table = pa.Table.from_pandas(sim.frame, preserve_index=False).replace_schema_metadata(None)
    # Dictionary-encoded columns are written as plain strings, as the real writers do.
    table = table.cast(
        pa.schema(
            [
                pa.field(f.name, pa.string() if pa.types.is_dictionary(f.type) else f.type)
                for f in table.schema
            ]
        )
    )
    sides = {"broker": BROKER_COLUMNS, "subscriber": SUBSCRIBER_COLUMNS}
    for side, columns in sides.items():
        directory = traces / side / f"run={spec.run}"
        directory.mkdir(parents=True, exist_ok=True)
        part = table.select(list(columns))
        for i, chunk in enumerate(_chunks(part, files)):
            pq.write_table(chunk, directory / f"part-{i:05d}.parquet")


def _chunks(table: pa.Table, files: int) -> list[pa.Table]:
    size = max(1, -(-table.num_rows // max(files, 1)))
    return [table.slice(s, size) for s in range(0, max(table.num_rows, 1), size)]


def write_metadata(
    traces: Path, spec: RunSpec, buckets: Mapping[tuple[str, str], tuple[float, float]]
) -> Path:
    """``runs/<run>.json`` with the keys the pipeline reads and the sub-buckets used."""
    nested: dict[str, dict[str, dict[str, float]]] = {}
    for (topic, broker), (rate, burst) in buckets.items():
        nested.setdefault(topic, {})[broker] = {"rate": rate, "burst": burst}
    doc = {
        "run": spec.run,
        "policy": spec.policy,
        "scenario": spec.scenario,
        "slo_p99_ms": spec.slo_p99_ms,
        "buckets": nested,
    }
    path = traces / "runs" / f"{spec.run}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path
