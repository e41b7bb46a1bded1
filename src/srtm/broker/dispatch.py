"""A channel's dispatch: what it takes for its consumers, sent to them, and what that
records (stats, traces, measurement rounds); at once, or once at the end of the loop
turn however often it was asked for. Either way what it takes is sent then, not from a
loop callback, which would run in the next turn after that turn's reads and their
answers (a consumer's FIN, RDY and TOUCH have none that could share its send)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from srtm.broker.measurement import Measurements
from srtm.broker.message import Message
from srtm.broker.queue import Record, attempted
from srtm.broker.state import Channel, Topic
from srtm.broker.stats import BrokerStats
from srtm.broker.tcp import Client
from srtm.broker.traces import TraceWriter


class Dispatcher:
    """Dispatches channels, and records each dispatch. ``emulated_server``: the lateness
    of a shaped message is measured once the emulated server processed it (see
    ``release.Releaser``), not here."""

    def __init__(
        self,
        topics: dict[str, Topic],
        stats: BrokerStats,
        measurements: Measurements,
        emulated_server: bool,
    ) -> None:
        self._topics = topics
        self._stats = stats
        self._measurements = measurements
        self._emulated_server = emulated_server
        #: Broker-side traces (``--trace-dir``), from start; None: none.
        self.traces: TraceWriter | None = None
        #: Channels to dispatch at the end of this loop turn (``mark_ready``).
        self._dirty: set[Channel] = set()
        self._flush_scheduled = False

    def mark_ready(self, channel: Channel) -> None:
        """Dispatch this channel soon (once per loop turn, however many calls). One with
        no consumer has nothing to dispatch (a single PUB into it would cost a loop turn
        more); a consumer has RDY 0 until its RDY, which marks the channel again. Nor has
        one with nothing queued: a consumer that keeps up FINs into an empty queue, a
        read of FINs at a time, and each would cost a loop callback; what is queued later
        marks the channel again."""
        if not channel.consumers or not len(channel.queue):
            return
        self._dirty.add(channel)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for ch in dirty:
            self.dispatch(ch)

    def dispatch(self, ch: Channel) -> None:
        """What ``ch`` has for its consumers with room, taken and sent now, then recorded
        (as of ``now``, the take): a sensor's message at a low rate finds every step
        cold, and the record, some 16 µs of it here, need not stand before its send."""
        now = time.time_ns()
        out = ch.take(now)
        if not out:
            return
        for consumer, records in out:
            assert isinstance(consumer, Client)
            consumer.send_records(records)
            consumer.send_now()
        self._account(ch, out, now)

    def _account(self, ch: Channel, out: Sequence[tuple[object, list[Record]]], now: int) -> None:
        """What a dispatch records: stats, traces and measurement rounds. The topic's own
        figures come from its first channel (each channel gets a copy of every message)."""
        topic = self._topics.get(ch.topic)
        if topic is None:
            return
        shaped = topic.bucket is not None
        first_channel = next(iter(topic.channels.values()), None) is ch
        # with an emulated server, the lateness is measured when it has processed one
        lateness = shaped and not self._emulated_server
        records = out[0][1] if len(out) == 1 else [r for _, rs in out for r in rs]
        stats = self._stats.topic(ch.topic)
        unserved = ch.unserved_before_ns
        stats.dispatched(ch.name, records, now, shaped, first_channel, lateness, unserved)
        if unserved and not topic.may_hold_before(ch, unserved):
            ch.unserved_before_ns = 0  # nothing from before its subscriber is left
        if not first_channel or (self.traces is None and not self._measurements.running):
            return
        # Traces and measurement rounds take messages (as sent: attempts counted).
        sent = [(c, Message(*attempted(r))) for c, rs in out for r in rs]
        if (traces := self.traces) is not None:
            for _, msg in sent:
                if msg.attempts == 1:
                    traces.add(ch.topic, msg, now)
        if self._measurements.running:
            self._measurements.record(ch.topic, sent, now)
