"""The trace dataset (DESIGN.md, Data): schema checks, run metadata, Spark readers, outputs.

Layout::

    TRACES/runs/<run>.json                 {"run", "policy", "scenario", "slo_p99_ms", …}
                                           optional: window_start_ns, window_end_ns
    TRACES/broker/run=<run>/*.parquet      broker, topic, msg_id, publisher, t_*_ns
    TRACES/subscriber/run=<run>/*.parquet  broker, topic, msg_id, publisher, group, seq, t_*_ns

Files whose names start with ``.`` or ``_`` are temporary or bookkeeping files (the trace
writers write ``.part-….tmp`` first) and are never read, as Spark itself skips them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

Side = Literal["broker", "subscriber"]

#: Column → Arrow type of each side, as the writers in srtm.broker/srtm.client write them.
COLUMNS: dict[Side, dict[str, pa.DataType]] = {
    "broker": {
        "broker": pa.string(),
        "topic": pa.string(),
        "msg_id": pa.string(),
        "publisher": pa.string(),
        "t_arrive_ns": pa.int64(),
        "t_release_ns": pa.int64(),
        "t_dispatch_ns": pa.int64(),
    },
    "subscriber": {
        "broker": pa.string(),
        "topic": pa.string(),
        "msg_id": pa.string(),
        "publisher": pa.string(),
        "group": pa.string(),
        "seq": pa.int64(),
        "t_send_ns": pa.int64(),
        "t_recv_ns": pa.int64(),
    },
}

#: Keys every ``runs/<run>.json`` must have, with the JSON types they must hold.
METADATA_KEYS: dict[str, tuple[type, ...]] = {
    "run": (str,),
    "policy": (str,),
    "scenario": (str,),
    "slo_p99_ms": (int, float),
}


class SchemaError(ValueError):
    """The trace dataset does not have the documented layout, columns or types."""


@dataclass(frozen=True)
class RunInfo:
    """One run's metadata; ``policy`` and ``slo_p99_ms`` are None without a runs/ file."""

    run: str
    policy: str | None = None
    scenario: str | None = None
    slo_p99_ms: float | None = None
    #: (topic, broker) → (rate, burst) of the sub-bucket, when the metadata says.
    buckets: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    #: The measured window [start_ns, end_ns) of the run, when the metadata says: the
    #: latency job counts only the messages sent in it (warm-up and fitting excluded).
    window_ns: tuple[int, int] | None = None

    @property
    def slo_ns(self) -> int | None:
        return None if self.slo_p99_ms is None else round(self.slo_p99_ms * 1e6)


@dataclass(frozen=True)
class Traces:
    """A checked trace dataset: where it is, which runs it has, their files and bytes."""

    root: Path
    runs: tuple[RunInfo, ...]
    files: Mapping[Side, tuple[Path, ...]]

    def run(self, name: str) -> RunInfo:
        for info in self.runs:
            if info.run == name:
                return info
        raise KeyError(name)

    def bytes(self, side: Side) -> int:
        return sum(p.stat().st_size for p in self.files[side])

    def rows(self, side: Side) -> int:
        """Rows of one side, from the Parquet footers."""
        return sum(pq.read_metadata(p).num_rows for p in self.files[side])


def _visible(path: Path) -> bool:
    return not path.name.startswith((".", "_"))


def _side_files(root: Path, side: Side, runs: Iterable[str] | None) -> dict[str, list[Path]]:
    """Parquet files of ``side`` by run name (only the ``runs`` asked for, if given)."""
    base = root / side
    wanted = None if runs is None else set(runs)
    found: dict[str, list[Path]] = {}
    if not base.is_dir():
        return found
    for part in sorted(base.iterdir()):
        if not (part.is_dir() and _visible(part)):
            continue
        key, sep, name = part.name.partition("=")
        if key != "run" or not sep:
            raise SchemaError(f"{part}: expected a partition directory named run=<run>")
        if wanted is not None and name not in wanted:
            continue
        files = sorted(p for p in part.rglob("*.parquet") if p.is_file() and _visible(p))
        found.setdefault(name, []).extend(files)
    return found


def _type_ok(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_dictionary(actual):  # dictionary-encoded strings read as strings
        actual = actual.value_type
    if pa.types.is_string(expected):
        return bool(pa.types.is_string(actual) or pa.types.is_large_string(actual))
    return bool(actual == expected)


def check_file(path: Path, side: Side) -> None:
    """Raise SchemaError naming every missing or mistyped column of one Parquet file."""
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise SchemaError(f"{path}: not a readable Parquet file ({exc})") from exc
    problems = []
    for name, expected in COLUMNS[side].items():
        index = schema.get_field_index(name)
        if index < 0:
            problems.append(f"missing column {name!r} ({expected})")
        elif not _type_ok(schema.field(index).type, expected):
            actual = schema.field(index).type
            problems.append(f"column {name!r} is {actual}, expected {expected}")
    if problems:
        raise SchemaError(f"{path} ({side} trace): " + "; ".join(problems))


def read_metadata(path: Path) -> RunInfo:
    """Parse and check one ``runs/<run>.json``."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{path}: cannot read run metadata ({exc})") from exc
    if not isinstance(doc, dict):
        raise SchemaError(f"{path}: run metadata must be a JSON object")
    problems = []
    for key, types in METADATA_KEYS.items():
        if key not in doc:
            problems.append(f"missing key {key!r}")
        elif not isinstance(doc[key], types) or isinstance(doc[key], bool):
            problems.append(
                f"key {key!r} is {type(doc[key]).__name__}, expected {types[0].__name__}"
            )
    if problems:
        raise SchemaError(f"{path}: " + "; ".join(problems))
    if doc["run"] != path.stem:
        raise SchemaError(f"{path}: its 'run' is {doc['run']!r}, the file name says {path.stem!r}")
    slo = float(doc["slo_p99_ms"])
    if not (math.isfinite(slo) and slo > 0):
        raise SchemaError(f"{path}: slo_p99_ms must be a number > 0, got {slo!r}")
    return RunInfo(
        doc["run"], doc["policy"], doc["scenario"], slo, _buckets(path, doc), _window(path, doc)
    )


def _window(path: Path, doc: Mapping[str, object]) -> tuple[int, int] | None:
    """The optional ``window_start_ns`` and ``window_end_ns`` (both or neither)."""
    keys = ("window_start_ns", "window_end_ns")
    present = [k for k in keys if k in doc]
    if not present:
        return None
    if len(present) == 1:
        raise SchemaError(f"{path}: {present[0]!r} without its pair; give both of {keys}")
    start, end = doc["window_start_ns"], doc["window_end_ns"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        raise SchemaError(f"{path}: window_start_ns and window_end_ns must be integers (ns)")
    assert isinstance(start, int) and isinstance(end, int)
    if end <= start:
        raise SchemaError(f"{path}: the window is empty ({start} .. {end} ns)")
    return start, end


def _bucket(value: object) -> tuple[float, float] | None:
    """``{"rate": r, "burst": b}`` as a pair, or None if ``value`` is not one."""
    if isinstance(value, dict) and {"rate", "burst"} <= value.keys():
        return float(value["rate"]), float(value["burst"])
    return None


def _buckets(path: Path, doc: Mapping[str, object]) -> dict[tuple[str, str], tuple[float, float]]:
    """The optional ``buckets`` key, in either form:

    - one topic (what ``srtm experiment`` writes): ``"topic": t`` and
      ``"buckets": {broker: {"rate": r, "burst": b}}``;
    - several topics: ``"buckets": {topic: {broker: {"rate": r, "burst": b}}}``.
    """
    raw = doc.get("buckets") or {}
    topic = doc.get("topic")
    out: dict[tuple[str, str], tuple[float, float]] = {}
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"got {type(raw).__name__}")
        for key, value in raw.items():
            pair = _bucket(value)
            if pair is not None and isinstance(topic, str):
                out[(topic, str(key))] = pair
                continue
            if not isinstance(value, dict):
                raise TypeError(f"entry {key!r} is {type(value).__name__}")
            for broker, bucket in value.items():
                inner = _bucket(bucket)
                if inner is None:
                    raise TypeError(f"entry {key!r}/{broker!r} has no rate and burst")
                out[(str(key), str(broker))] = inner
    except (TypeError, ValueError) as exc:
        raise SchemaError(
            f"{path}: 'buckets' must map broker → {{rate, burst}} (with a 'topic' key) or "
            f"topic → broker → {{rate, burst}} ({exc})"
        ) from exc
    return out


def open_traces(root: Path, runs: Sequence[str] | None = None) -> Traces:
    """Find and check a trace dataset: every Parquet file's columns and every run's metadata.

    Only footers are read, so this is cheap next to the jobs. ``runs`` restricts it to
    those runs (a named run that has neither metadata nor files is an error).
    """
    if not root.is_dir():
        raise SchemaError(f"{root}: no such trace directory")
    files = {side: _side_files(root, side, runs) for side in COLUMNS}
    for side, by_run in files.items():
        for paths in by_run.values():
            for path in paths:
                check_file(path, side)
    infos: dict[str, RunInfo] = {}
    meta_dir = root / "runs"
    if meta_dir.is_dir():
        for path in sorted(meta_dir.glob("*.json")):
            if _visible(path) and (runs is None or path.stem in runs):
                infos[path.stem] = read_metadata(path)
    names = set(infos) | {r for by_run in files.values() for r in by_run}
    missing = sorted(set(runs or ()) - names)
    if missing:
        raise SchemaError(f"{root}: no metadata or trace files for run(s) {missing}")
    ordered = tuple(infos.get(name, RunInfo(name)) for name in sorted(names))
    flat = {
        side: tuple(p for r in sorted(by_run) for p in by_run[r]) for side, by_run in files.items()
    }
    return Traces(root, ordered, flat)


def spark_schema(side: Side) -> object:
    """The Spark schema of one side, with ``run`` (the partition column) first."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    fields = [StructField("run", StringType(), False)]
    for name, kind in COLUMNS[side].items():
        spark_type = StringType() if pa.types.is_string(kind) else LongType()
        fields.append(StructField(name, spark_type, True))
    return StructType(fields)


def read_side(spark: SparkSession, traces: Traces, side: Side, columns: Sequence[str]) -> DataFrame:
    """One side as a DataFrame of ``columns`` (``run`` included), empty when it has no files.

    The schema is given, not inferred: no footer scan, and a run named like a date stays
    a string. Exactly the checked files are read, not whatever appeared since.
    """
    from pyspark.sql.types import StructType

    schema = spark_schema(side)
    assert isinstance(schema, StructType)
    paths = traces.files[side]
    if not paths:
        return spark.createDataFrame([], schema).select(*columns)
    frame = (
        spark.read.schema(schema)
        .option("basePath", str(traces.root / side))
        .parquet(*[str(p) for p in paths])
    )
    return frame.select(*columns)


def in_window(traces: Traces, time_column: str) -> Column:
    """True for rows whose ``time_column`` lies in their run's measured window, and for
    every row of a run without one (a CASE on the partition column: no join)."""
    from pyspark.sql import functions as F

    t = F.col(time_column)
    keep = F.lit(True)
    for info in traces.runs:
        if info.window_ns is not None:
            start, end = info.window_ns
            keep = F.when(F.col("run") == info.run, (t >= start) & (t < end)).otherwise(keep)
    return keep


def runs_frame(spark: SparkSession, traces: Traces) -> DataFrame:
    """One row per run: run, policy, scenario, slo_ns (for joins in the jobs)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("run", StringType(), False),
            StructField("policy", StringType(), True),
            StructField("scenario", StringType(), True),
            StructField("slo_ns", LongType(), True),
        ]
    )
    rows = [(r.run, r.policy, r.scenario, r.slo_ns) for r in traces.runs]
    return spark.createDataFrame(rows, schema)


def write_output(frame: DataFrame, out: Path, partitions: int = 1) -> Path:
    """Write a job's result as a Parquet dataset at ``out``, replacing what was there."""
    frame.coalesce(partitions).write.mode("overwrite").parquet(str(out))
    return out
