"""Graceful shutdown: what is queued, deferred or in flight at SIGTERM is delivered after the
restart (a real broker process, stopped by signal, started again on the same --data-dir)."""

from __future__ import annotations

import signal
from pathlib import Path

from nsq_raw import RawClient
from srtm.launch import start_broker
from srtm.protocol import Dpub, Fin, Mpub, Rdy, Sub
from support import eventually


async def test_messages_queued_at_sigterm_are_delivered_after_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_broker(data, ["--mem-queue-size", "20"])
    try:
        # A consumer takes 5 and never finishes them; the rest wait in the queue (and on disk).
        holder = await RawClient.connect(*first.tcp)
        await holder.send(Sub("durable", "c"), Rdy(5))
        assert await holder.response() == b"OK"
        pub = await RawClient.connect(*first.tcp)
        await pub.send(Mpub("durable", [b"%03d" % i for i in range(100)]))
        assert await pub.response() == b"OK"
        await pub.send(Dpub("durable", 200, b"deferred"))
        assert await pub.response() == b"OK"
        # A second topic with no channel yet keeps its messages for the first one.
        await pub.send(Mpub("nochannel", [b"n%d" % i for i in range(3)]))
        assert await pub.response() == b"OK"
        in_flight = [await holder.message() for _ in range(5)]
        assert [m.body for m in in_flight] == [b"%03d" % i for i in range(5)]
        # Shaped topic: a bucket that is still owed tokens at the stop.
        first.post("/srtm/bucket?topic=slow&rate=20&burst=2")
        await pub.send(Mpub("slow", [b"s%d" % i for i in range(10)]))
        assert await pub.response() == b"OK"
    finally:
        assert first.stop() == 0
    await holder.close()
    await pub.close()

    second = start_broker(data, ["--mem-queue-size", "20"])
    try:
        c = await RawClient.connect(*second.tcp)
        await c.send(Sub("durable", "c"), Rdy(200))
        assert await c.response() == b"OK"
        got = []
        while len(got) < 101:
            m = await c.message()
            got.append((m.body, m.attempts))
            await c.send(Fin(m.id))
        bodies = [b for b, _ in got]
        assert sorted(bodies) == sorted([b"%03d" % i for i in range(100)] + [b"deferred"])
        # The 5 that were in flight come first, with the attempt they already used.
        assert got[:5] == [(b"%03d" % i, 2) for i in range(5)]
        n = await RawClient.connect(*second.tcp)
        await n.send(Sub("nochannel", "first"), Rdy(10))
        assert await n.response() == b"OK"
        assert [(await n.message()).body for _ in range(3)] == [b"n0", b"n1", b"n2"]
        s = await RawClient.connect(*second.tcp)
        await s.send(Sub("slow", "c"), Rdy(10))
        assert await s.response() == b"OK"
        assert [(await s.message()).body for _ in range(10)] == [b"s%d" % i for i in range(10)]
        assert second.stats("slow")["srtm"]["topics"][0]["bucket"]["rate"] == 20
        for client in (c, n, s):
            await client.close()
    finally:
        assert second.stop() == 0


async def test_after_a_crash_what_overflowed_to_disk_is_delivered(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_broker(data, ["--mem-queue-size", "10"])
    try:
        first.post("/topic/create?topic=crashy")
        first.post("/channel/create?topic=crashy&channel=c")
        pub = await RawClient.connect(*first.tcp)
        await pub.send(Mpub("crashy", [b"%03d" % i for i in range(100)]))
        assert await pub.response() == b"OK"
        await pub.close()
        segment = data / "queues" / "q-crashy:c" / "000000.dat"
        # Overflow writes reach the OS within a second: wait for all 90 to be there.
        await eventually(
            lambda: segment.stat().st_size if segment.exists() else 0,
            "the 90 overflowed messages on disk",
            until=lambda size: size >= 90 * (56 + 3),  # header+body
        )
    finally:
        first.proc.send_signal(signal.SIGKILL)  # a crash: nothing saved at the stop
        first.stop()
    second = start_broker(data, ["--mem-queue-size", "10"])
    try:
        c = await RawClient.connect(*second.tcp)
        await c.send(Sub("crashy", "c"), Rdy(100))
        assert await c.response() == b"OK"
        got = []
        while len(got) < 90:
            m = await c.message()
            got.append(m.body)
            await c.send(Fin(m.id))
        # The 10 held in memory died with the process (as in nsqd); none of the rest did.
        assert got == [b"%03d" % i for i in range(10, 100)]
        await c.close()
    finally:
        assert second.stop() == 0
