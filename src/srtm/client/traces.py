"""Subscriber-side trace rows (DESIGN.md, Data) to Parquet files under
``<trace_dir>/subscriber/run=<run>/``, written by a worker thread."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("msg_id", pa.string()),
        ("publisher", pa.string()),
        ("group", pa.string()),
        ("seq", pa.int64()),
        ("t_send_ns", pa.int64()),
        ("t_recv_ns", pa.int64()),
    ]
)


class SubscriberTraces:
    """Collects rows; a file every ``roll_rows`` rows and at ``close``."""

    def __init__(self, trace_dir: Path, run: str, roll_rows: int = 200_000) -> None:
        self.directory = trace_dir / "subscriber" / f"run={run}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.roll_rows = roll_rows
        self.rows_written = 0
        self._rows: list[tuple[str, str, str, str, str | None, int, int, int]] = []
        self._seq = 0
        self._writes: set[asyncio.Task[None]] = set()
        # pyarrow's first array imports pandas (~250 ms holding the GIL): now, not on the
        # first roll's thread while the client's loop runs (srtm.broker.traces).
        pa.array([0], type=pa.int64())

    def add(
        self, broker: str, topic: str, msg_id: str, publisher: str, group: str | None,
        seq: int, send_ns: int, recv_ns: int,
    ) -> None:  # fmt: skip
        self._rows.append((broker, topic, msg_id, publisher, group, seq, send_ns, recv_ns))
        if len(self._rows) >= self.roll_rows:
            self.roll()

    def roll(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        name = f"part-{os.getpid()}-{int(time.time())}-{self._seq:05d}.parquet"
        self._seq += 1
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self._write, self.directory / name, rows)
        )
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def _write(self, path: Path, rows: Sequence[tuple[object, ...]]) -> None:
        columns = list(zip(*rows, strict=True))
        table = pa.table(dict(zip(SCHEMA.names, columns, strict=True)), schema=SCHEMA)
        tmp = path.with_name(f".{path.name}.tmp")  # hidden from Parquet readers
        pq.write_table(table, tmp)
        tmp.replace(path)
        self.rows_written += table.num_rows

    async def close(self) -> None:
        self.roll()
        if self._writes:
            await asyncio.gather(*self._writes)
