"""How long a broker's /stats holds its event loop, for many topics.

``stats_document`` runs on the event loop; with thousands of topics its cost is time no
client is served. The anchor, in the same run, is ``json.dumps`` of the same document
(what aiohttp then does with it): building should cost about as much as writing it out.

    .venv/bin/python benchmarks/stats_doc.py [--topics 2000] [--repeats 5]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from srtm.broker import Broker, BrokerOptions
from srtm.broker.report import stats_document


async def _measure(topics: int, repeats: int) -> tuple[list[float], list[float], int]:
    broker = Broker(BrokerOptions(tcp_port=0, http_port=0, data_dir=Path(tempfile.mkdtemp())))
    await broker.start()
    try:
        for i in range(topics):
            broker.channel(f"t{i}", "c")
        build, dump, size = [], [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            doc = stats_document(broker)
            t1 = time.perf_counter()
            size = len(json.dumps(doc))
            build.append(t1 - t0)
            dump.append(time.perf_counter() - t1)
        return build, dump, size
    finally:
        await broker.stop()


def main(
    topics: Annotated[int, typer.Option(help="Topics, one channel each.")] = 2000,
    repeats: Annotated[int, typer.Option(help="Documents built; medians over them.")] = 5,
) -> None:
    """Time the /stats document of a broker with many topics, beside json.dumps of it."""
    build, dump, size = asyncio.run(_measure(topics, repeats))
    table = Table(title=f"/stats with {topics:,} topics ({size:,} bytes of JSON)")
    for name in ("step", "median ms", "min–max ms"):
        table.add_column(name, justify="left" if name == "step" else "right")
    for name, xs in (("stats_document (on the loop)", build), ("json.dumps (anchor)", dump)):
        table.add_row(
            name, f"{statistics.median(xs) * 1e3:.1f}", f"{min(xs) * 1e3:.1f}–{max(xs) * 1e3:.1f}"
        )
    Console().print(table)
    print(f"build / anchor: {statistics.median(build) / statistics.median(dump):.2f}×")


if __name__ == "__main__":
    typer.run(main)
