"""Broker-side trace files: schema, rolling, sampling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from srtm.broker.message import Message
from srtm.broker.traces import SCHEMA, TraceWriter


def message(i: int) -> Message:
    return Message(b"%016x" % i, b"x", 0, 1_000 + i, 2_000 + i, 1, publisher=f"p{i % 2}")


async def test_rows_roll_into_parquet_files_with_the_design_schema(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, "r1", "b7", roll_rows=100)
    for i in range(250):
        w.add("t", message(i), 3_000 + i)
    await w.close()
    files = sorted((tmp_path / "broker" / "run=r1").glob("*.parquet"))
    assert len(files) == 3  # 100 + 100 + the 50 left at close
    table = pa.concat_tables([pq.ParquetFile(f).read() for f in files])
    assert table.schema.equals(SCHEMA)
    rows = sorted(table.to_pylist(), key=lambda r: r["msg_id"])
    assert len(rows) == 250 and w.rows_written == 250
    assert rows[7] == {
        "broker": "b7",
        "topic": "t",
        "msg_id": f"{7:016x}",
        "publisher": "p1",
        "t_arrive_ns": 1_007,
        "t_release_ns": 2_007,
        "t_dispatch_ns": 3_007,
    }
    # Hive-style partition: any Parquet reader sees `run` as a column.
    assert pq.read_table(tmp_path / "broker").column("run").to_pylist()[0] == "r1"


async def test_sampling_keeps_about_that_share(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, "s", "b", sample=0.25, seed=3)
    for i in range(4_000):
        w.add("t", message(i), 0)
    await w.close()
    assert 850 <= w.rows_written <= 1_150


def test_sample_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sample"):
        TraceWriter(tmp_path, "r", "b", sample=0.0)


def test_pyarrows_first_array_costs_nothing_once_a_writer_exists(tmp_path: Path) -> None:
    """pyarrow's first array imports pandas (hundreds of ms holding the GIL): a writer
    pays it when it is made, at the broker's start, not on its first roll's thread while
    the event loop serves. Checked in a fresh interpreter: whether pandas is loaded."""
    code = (
        "import sys; from pathlib import Path; from srtm.broker.traces import TraceWriter; "
        "assert 'pandas' not in sys.modules, 'pandas already loaded by the import'; "
        f"TraceWriter(Path({str(tmp_path)!r}), 'r', 'b'); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "True"
