"""The subscribers of a Dynamoth analogue, as their own process so that receiving does
not share the load generator's interpreter.

``python -m srtm.experiments.dynamoth.fanout CONTROLLER OUT.npz`` reads commands on
stdin, one a line: ``sub TOPIC CHANNEL`` subscribes (following the controller's lookup,
refreshed every 0.2 s) and answers ``ok``; ``stop`` closes every subscriber, writes what
they received to OUT.npz (per message: topic, channel and broker as indices into the
names saved beside them, send and receipt times in ns) and answers ``done N``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from srtm.client import Received, Subscriber

#: As the live runs' sink (``srtm.experiments.sink``).
REFRESH_S = 0.2


class Names:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def of(self, name: str) -> int:
        return self.index.setdefault(name, len(self.index))

    def names(self) -> list[str]:
        return list(self.index)


async def fanout(controller: str, out: Path) -> int:
    topics, channels, brokers = Names(), Names(), Names()
    rows: list[tuple[int, int, int, int, int]] = []
    subs: list[Subscriber] = []
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def on(topic: str, channel: str) -> Callable[[Received], None]:
        t, c = topics.of(topic), channels.of(channel)

        def record(m: Received) -> None:
            if m.header is not None:
                rows.append((t, c, brokers.of(m.broker), m.header.send_ns, m.recv_ns))

        return record

    while line := (await reader.readline()).decode().split():
        if line[0] == "sub" and len(line) == 3:
            sub = Subscriber(
                line[1],
                line[2],
                controller=controller,
                refresh_s=REFRESH_S,
                on_message=on(line[1], line[2]),
                max_in_flight=2_000,
            )
            await sub.start()
            subs.append(sub)
            print("ok", flush=True)
        elif line[0] == "stop":
            break
        else:
            print(f"error: unknown command {' '.join(line)!r}", flush=True)
    for sub in subs:
        await sub.close()
    a = np.array(rows, dtype=np.int64).reshape(-1, 5)
    np.savez(
        out,
        rows=a,
        topics=np.array(topics.names()),
        channels=np.array(channels.names()),
        brokers=np.array(brokers.names()),
    )
    print(f"done {len(rows)}", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import uvloop

        return uvloop.run(fanout(sys.argv[1], Path(sys.argv[2])))
    except ImportError:
        return asyncio.run(fanout(sys.argv[1], Path(sys.argv[2])))


if __name__ == "__main__":
    sys.exit(main())
