"""What one join of an open topic costs the controller, against the topic's size.

An open topic takes unknown publishers by ``GET /assign``; each join runs on the
controller's event loop, so its cost is time no other request is served. This measures
the controller's own work per join (``Controller.join_open``: placement, the plan, the
sub-buckets and routes; no HTTP, no disk) on a pure ``Controller`` with three brokers,
as the topic grows: ``--per-size`` joins at each size, timed together. The anchor, in the
same run, is the first row: joins into an empty topic. The target (issue 29, item 5):
the cost does not grow with the topic's publishers.

    .venv/bin/python benchmarks/joins.py [--runs 3] [--sizes 0,1000,10000,20000]
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from srtm.control import Controller
from srtm.placement import TopicSpec

BROKERS = 3


def _controller() -> Controller:
    c = Controller(broker_timeout_s=5)
    for i in range(BROKERS):
        c.register(f"b{i}", f"127.0.0.1:{4150 + i}", f"127.0.0.1:{5150 + i}", 1e12, now=0)
    c.create_topic(TopicSpec("o", (), 10.0, 100.0, 0.0), "srtm", now=0.0, open=True,
                   rate_auto=True)  # fmt: skip
    return c


def one_run(sizes: list[int], per_size: int) -> dict[int, float]:
    """ms per join at each size (the topic grown to it by joins first)."""
    c, n, out = _controller(), 0, {}
    for size in sizes:
        while n < size:
            c.join_open("o", f"p{n}", 1.0, None)
            n += 1
        start = time.perf_counter()
        for _ in range(per_size):
            c.join_open("o", f"p{n}", 1.0, None)
            n += 1
        out[size] = (time.perf_counter() - start) / per_size * 1e3
    return out


def main(
    runs: Annotated[int, typer.Option(help="Runs, each on a fresh controller")] = 3,
    sizes: Annotated[str, typer.Option(help="Topic sizes (publishers), comma-separated")] = (
        "0,1000,10000,20000"
    ),
    per_size: Annotated[int, typer.Option(help="Joins timed at each size")] = 200,
) -> None:
    wanted = sorted({int(s) for s in sizes.split(",")})
    results = [one_run(wanted, per_size) for _ in range(runs)]
    table = Table(title=f"ms per join of an open topic, {BROKERS} brokers; medians of {runs}")
    for col in ("publishers before", "ms per join (range)", "× the empty topic's"):
        table.add_column(col, justify="right")
    base = statistics.median(r[wanted[0]] for r in results)
    for size in wanted:
        ms = [r[size] for r in results]
        med = statistics.median(ms)
        table.add_row(f"{size:,}", f"{med:.3f} ({min(ms):.3f}–{max(ms):.3f})", f"{med / base:.2f}")
    Console().print(table)


if __name__ == "__main__":
    typer.run(main)
