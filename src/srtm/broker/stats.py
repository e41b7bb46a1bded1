"""What the broker measures: latency histograms (HDR), 1 s rates, the adaptor's window.

The hot path only appends to an array; values reach the HDR histograms in batches
(``Recorder.flush``), grouped at the histogram's own precision first, because one
``record_value`` call costs about 0.7 µs in pure Python.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from hdrh.histogram import HdrHistogram

NS_PER_S = 1_000_000_000
PERCENTILES = (50.0, 95.0, 99.0, 99.9)
_MAX_NS = 3_600 * NS_PER_S
_SIG_BITS = 11  # 2,048 sub-buckets: the resolution of 3 significant digits


class Recorder:
    """An HDR histogram of nanosecond values (1 ns .. 1 h, 3 significant digits)."""

    __slots__ = ("hist", "pending")

    def __init__(self) -> None:
        self.hist = HdrHistogram(1, _MAX_NS, 3)
        self.pending: array[int] = array("q")

    def add(self, value_ns: int) -> None:
        self.pending.append(value_ns)

    def flush(self) -> None:
        if not self.pending:
            return
        values = np.clip(np.frombuffer(self.pending, dtype=np.int64), 1, _MAX_NS)
        self.pending = array("q")
        # Round down to the histogram's resolution so equal buckets can be recorded once.
        shift = np.maximum(np.floor(np.log2(values)).astype(np.int64) - _SIG_BITS + 1, 0)
        values = (values >> shift) << shift
        uniq, counts = np.unique(values, return_counts=True)
        for v, c in zip(uniq.tolist(), counts.tolist(), strict=True):
            self.hist.record_value(v, c)

    @property
    def count(self) -> int:
        self.flush()
        return int(self.hist.get_total_count())

    def summary(self) -> dict[str, float]:
        """count, mean and p50/p95/p99/p99.9 in ns (0 when empty)."""
        self.flush()
        h = self.hist
        out: dict[str, float] = {"count": h.get_total_count(), "mean": h.get_mean_value()}
        for p in PERCENTILES:
            out[f"p{p:g}"] = h.get_value_at_percentile(p)
        return out

    def reset(self) -> None:
        self.pending = array("q")
        self.hist.reset()


@dataclass
class Window:
    """Arrivals per second and the largest virtual backlog seen in each second,
    over the last ``seconds`` complete seconds: the TB Adaptor's inputs."""

    seconds: int = 10
    _bins: deque[tuple[int, int, float]] = field(default_factory=deque)
    _sec: int = -1
    _count: int = 0
    _backlog: float = 0.0

    def add(self, now_ns: int, n: int, backlog: float) -> None:
        sec = now_ns // NS_PER_S
        if sec != self._sec:
            self._roll(sec)
        self._count += n
        if backlog > self._backlog:
            self._backlog = backlog

    def _roll(self, sec: int) -> None:
        if self._sec >= 0:
            self._bins.append((self._sec, self._count, self._backlog))
        self._sec, self._count, self._backlog = sec, 0, 0.0
        while self._bins and self._bins[0][0] < sec - self.seconds:
            self._bins.popleft()

    def _complete(self, now_ns: int) -> list[tuple[int, int, float]]:
        sec = now_ns // NS_PER_S
        if sec != self._sec:
            self._roll(sec)
        return [b for b in self._bins if b[0] >= sec - self.seconds]

    def rate_1s(self, now_ns: int) -> float:
        """Arrivals in the last complete second."""
        last = now_ns // NS_PER_S - 1
        return float(sum(c for s, c, _ in self._complete(now_ns) if s == last))

    def average_rate(self, now_ns: int) -> float:
        """Mean arrivals per second over the window (seconds without arrivals count as 0)."""
        return sum(c for _, c, _ in self._complete(now_ns)) / self.seconds

    def max_backlog(self, now_ns: int) -> float:
        """Largest virtual backlog (tokens owed) in the window, the current second included."""
        bins = self._complete(now_ns)
        return max([b for _, _, b in bins] + [self._backlog])


@dataclass
class ChannelStats:
    #: first dispatches per second
    window: Window = field(default_factory=Window)
    token_wait: Recorder = field(default_factory=Recorder)
    #: dispatch − arrival, first attempts only
    latency: Recorder = field(default_factory=Recorder)


@dataclass
class TopicStats:
    window: Window
    token_wait: Recorder = field(default_factory=Recorder)
    latency: Recorder = field(default_factory=Recorder)
    #: dispatch − GCRA release time, first attempts of shaped messages
    lateness: Recorder = field(default_factory=Recorder)
    channels: dict[str, ChannelStats] = field(default_factory=dict)

    def channel(self, name: str) -> ChannelStats:
        cs = self.channels.get(name)
        if cs is None:
            cs = self.channels[name] = ChannelStats()
        return cs

    def recorders(self) -> list[Recorder]:
        out = [self.token_wait, self.latency, self.lateness]
        for cs in self.channels.values():
            out += [cs.token_wait, cs.latency]
        return out


@dataclass
class BrokerStats:
    window_seconds: int = 10
    topics: dict[str, TopicStats] = field(default_factory=dict)
    #: user-space read time − kernel receive stamp, per read
    stamp_gaps: Recorder = field(default_factory=Recorder)

    def topic(self, name: str) -> TopicStats:
        ts = self.topics.get(name)
        if ts is None:
            ts = self.topics[name] = TopicStats(Window(self.window_seconds))
        return ts

    def drop_topic(self, name: str) -> None:
        self.topics.pop(name, None)

    def drop_channel(self, topic: str, channel: str) -> None:
        ts = self.topics.get(topic)
        if ts is not None:
            ts.channels.pop(channel, None)

    def flush(self) -> None:
        self.stamp_gaps.flush()
        for ts in self.topics.values():
            for rec in ts.recorders():
                rec.flush()
