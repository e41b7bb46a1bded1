"""The subscriber of a live run, as its own process so that consuming does not compete
with the emulator's scheduler for one interpreter.

``python -m srtm.experiments.sink CONTROLLER TOPIC TRACE_DIR RUN`` subscribes to every
broker of TOPIC (following the controller's lookup), writes subscriber-side trace rows,
prints ``received N brokers M`` every 0.2 s, and on SIGTERM flushes its traces, prints ``done N``
and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from srtm.client import Subscriber


async def sink(controller: str, topic: str, trace_dir: Path, run: str) -> int:
    sub = Subscriber(
        topic, "srtm-sink", controller=controller, refresh_s=0.2, trace_dir=trace_dir, run=run,
        max_in_flight=2_000,
    )  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await sub.start()
    print("ready", flush=True)
    try:
        while not stop.is_set():
            print(f"received {sub.received} brokers {len(sub.brokers)}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    finally:
        await sub.close()
    print(f"done {sub.received}", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    controller, topic, trace_dir, run = sys.argv[1:]
    try:
        import uvloop

        return uvloop.run(sink(controller, topic, Path(trace_dir), run))
    except ImportError:
        return asyncio.run(sink(controller, topic, Path(trace_dir), run))


if __name__ == "__main__":
    sys.exit(main())
