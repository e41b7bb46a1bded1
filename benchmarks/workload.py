"""How many messages per second one emulator process sends on time.

A broker runs as its own process (``srtm.launch``); the emulator runs here, sending a
schedule of many periodic and Poisson publishers multiplexed on one connection. For each
offered rate the table shows the rate achieved (the anchor is the offered rate of the same
run: the ratio should be 1.00) and the send lateness against the schedule.

    .venv/bin/python benchmarks/workload.py [--runs 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from srtm.launch import start_broker
from srtm.workload import PublisherSpec, build
from srtm.workload.emulator import Emulator

#: (publishers, msg/s each, process, batch): offered = publishers x rate.
CASES = [
    (2_000, 10.0, "periodic", 1),  # 20,000 msg/s from 2,000 sensors (the floor)
    (4_000, 10.0, "poisson", 1),  # 40,000 msg/s
    (2_000, 20.0, "poisson", 10),  # 40,000 msg/s in batches of 10
    (6_000, 10.0, "periodic", 1),  # 60,000 msg/s: where one process runs out
]


async def one(address: str, case: tuple[int, float, str, int], seconds: float) -> dict[str, float]:
    n, rate, process, batch = case
    specs = [PublisherSpec(f"p{i}", rate, process, batch) for i in range(n)]  # type: ignore[arg-type]
    schedule = build(specs, seconds, seed=1)
    emulator = Emulator(schedule, "bench", {p.id: address for p in specs})
    report = await emulator.run()
    await emulator.close()
    late = report.lateness_summary()
    return {
        "offered": schedule.messages / seconds,
        "achieved": report.rate,
        "acked": report.acknowledged / schedule.messages,
        "p50_us": late["p50_us"],
        "p99_us": late["p99_us"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per case (median shown)")
    parser.add_argument("--seconds", type=float, default=5.0, help="schedule length per run")
    args = parser.parse_args()
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    table = Table(title=f"workload emulator, one process, median of {args.runs} runs")
    for col in ("publishers", "process", "batch", "offered msg/s", "achieved msg/s",
                "achieved/offered", "acked", "lateness p50 µs", "lateness p99 µs"):  # fmt: skip
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp) / "broker", ["--mem-queue-size", "10000000"])
        try:
            for case in CASES:
                runs = [
                    runner(one(broker.tcp_address, case, args.seconds)) for _ in range(args.runs)
                ]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                broker.post("/topic/empty?topic=bench")
                table.add_row(
                    f"{case[0]:,}", case[2], str(case[3]), f"{med['offered']:,.0f}",
                    f"{med['achieved']:,.0f}", f"{med['achieved'] / med['offered']:.3f}",
                    f"{med['acked']:.3f}", f"{med['p50_us']:,.0f}", f"{med['p99_us']:,.0f}",
                )  # fmt: skip
        finally:
            broker.stop()
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
