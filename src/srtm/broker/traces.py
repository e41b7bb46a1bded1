"""Broker-side trace rows (DESIGN.md, Data) to rolling Parquet files, off the hot path.

The hot path appends to column lists; a roll hands the batch to a worker thread that
writes one Parquet file ``<trace_dir>/broker/run=<run>/part-<broker>-<n>.parquet``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from srtm.broker.message import Message

SCHEMA = pa.schema(
    [
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("msg_id", pa.string()),
        ("publisher", pa.string()),
        ("t_arrive_ns", pa.int64()),
        ("t_release_ns", pa.int64()),
        ("t_dispatch_ns", pa.int64()),
    ]
)


class TraceWriter:
    """Collects rows; ``maybe_roll`` writes a file every ``roll_seconds`` or ``roll_rows``."""

    def __init__(
        self,
        trace_dir: Path,
        run: str,
        broker: str,
        sample: float = 1.0,
        *,
        roll_rows: int = 200_000,
        roll_seconds: float = 5.0,
        seed: int = 0,
    ) -> None:
        if not 0.0 < sample <= 1.0:
            raise ValueError(f"trace sample must be in (0, 1], got {sample!r}")
        self.directory = trace_dir / "broker" / f"run={run}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.broker = broker
        self.sample = sample
        self.roll_rows = roll_rows
        self.roll_seconds = roll_seconds
        self.rows_written = 0
        self._rng = random.Random(seed)
        self._cols: dict[str, list[object]] = {name: [] for name in SCHEMA.names}
        self._last_roll = time.monotonic()
        self._seq = 0
        self._writes: set[asyncio.Task[None]] = set()
        # pyarrow imports pandas on its first array, about 250 ms holding the GIL. On the
        # writer thread's first roll that stalled the event loop: a traced broker's first
        # dispatches waited 10-45 ms (the "first move" hold in docs/results/dynamoth.md).
        # Here, at start, nothing waits on it.
        pa.array([0], type=pa.int64())

    def __len__(self) -> int:
        return len(self._cols["msg_id"])

    def add(self, topic: str, msg: Message, dispatch_ns: int) -> None:
        if self.sample < 1.0 and self._rng.random() >= self.sample:
            return
        c = self._cols
        c["topic"].append(topic)
        c["msg_id"].append(msg.id.decode())
        c["publisher"].append(msg.publisher)
        c["t_arrive_ns"].append(msg.arrival_ns)
        c["t_release_ns"].append(msg.release_ns)
        c["t_dispatch_ns"].append(dispatch_ns)
        if len(c["msg_id"]) >= self.roll_rows:
            self.roll()

    def maybe_roll(self) -> None:
        if len(self) and time.monotonic() - self._last_roll >= self.roll_seconds:
            self.roll()

    def roll(self) -> None:
        """Hand the rows collected so far to a worker thread as one Parquet file."""
        self._last_roll = time.monotonic()
        n = len(self)
        if not n:
            return
        cols, self._cols = self._cols, {name: [] for name in SCHEMA.names}
        cols["broker"] = [self.broker] * n
        path = self.directory / f"part-{self.broker}-{int(time.time())}-{self._seq:05d}.parquet"
        self._seq += 1
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._write, path, cols))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def _write(self, path: Path, cols: dict[str, list[object]]) -> None:
        table = pa.table(cols, schema=SCHEMA)
        tmp = path.with_name(f".{path.name}.tmp")  # hidden from Parquet readers
        pq.write_table(table, tmp)
        tmp.replace(path)  # readers never see a half-written file
        self.rows_written += table.num_rows

    async def close(self) -> None:
        self.roll()
        if self._writes:
            await asyncio.gather(*self._writes)
