"""What the broker measures: latency histograms (HDR), 1 s rates, the adaptor's window.

The hot path only appends to an array; values reach the HDR histogram in batches
(``Recorder.flush``), indexed exactly as ``HdrHistogram.record_value`` indexes one value
(in C, ``_histogram.c``, where built; else with numpy), because that call costs about
0.7 µs in pure Python and a per-value loop once a second stalls the loop for
milliseconds.
"""

from __future__ import annotations

import functools
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# numpy loads ctypeslib on first use, which may be the first histogram flush while the broker
# is out of fds (EMFILE on the import killed its housekeeping): loaded at start instead.
import numpy.ctypeslib
from hdrh.histogram import HdrHistogram

from srtm.broker.queue import Record
from srtm.quantiles import REPORTED

NS_PER_S = 1_000_000_000
_MAX_NS = 3_600 * NS_PER_S
#: Values a recorder gathers before the housekeeping loop flushes it (a read of its
#: summary flushes it whatever it holds). A flush holds the loop, and shaped releases,
#: for about as long whether it has a thousand values or a few: at 10,000 msg/s every
#: 100 ms, six recorders of a shaped topic made 60 flushes a second; at this size 15.
FLUSH_AT = 4_096


def record_many(hist: HdrHistogram, values: np.ndarray) -> None:
    """``hist.record_value(v)`` for every ``v`` in ``values`` (int64 within range), at once."""
    if not len(values):
        return
    # bit_length(v | sub_bucket_mask), exact through frexp for values below 2**53
    pow2ceiling = np.frexp((values | hist.sub_bucket_mask).astype(np.float64))[1]
    bucket = pow2ceiling - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub_bucket = values >> (bucket + hist.unit_magnitude)
    index = ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + sub_bucket
    index -= hist.sub_bucket_half_count
    counts = np.ctypeslib.as_array(hist.counts)
    # Counted over the span of indices hit only: a bincount over all 33,792 counts (and
    # its copies, 270 KB each) cost ~150 µs per flush alone whatever the number of
    # values, and every flush holds shaped releases back. (np.unique, whose temporaries
    # do not grow with the span, measured slower inside the broker.)
    lo = int(index.min())
    hits = np.bincount(index - lo)
    counts[lo : lo + len(hits)] += hits.astype(counts.dtype)
    hist.total_count += len(values)
    hist.min_value = min(hist.min_value, int(values.min()))
    hist.max_value = max(hist.max_value, int(values.max()))


_c_record: Callable[..., tuple[int, int]] | None
try:
    from srtm.broker._histogram import record as _c_record
except ImportError:  # not built (no compiler at install): numpy's ``record_many``
    _c_record = None


def record_pending(hist: HdrHistogram, pending: array[int]) -> None:
    """``record_many`` of ``pending`` clipped to the histogram's range (1 ns .. 1 h), in
    C where ``srtm.broker._histogram`` was built."""
    if _c_record is None:
        record_many(hist, np.clip(np.frombuffer(pending, dtype=np.int64), 1, _MAX_NS))
        return
    low, high = _c_record(
        hist.counts,
        pending,
        1,
        _MAX_NS,
        hist.unit_magnitude,
        hist.sub_bucket_half_count_magnitude,
        hist.sub_bucket_mask,
    )
    hist.total_count += len(pending)
    hist.min_value = min(hist.min_value, low)
    hist.max_value = max(hist.max_value, high)


@functools.cache
def _index_values(hist_shape: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Lowest value and width of every counts index (``get_value_from_index``, vectorised)."""
    counts_len, half_magnitude, half, unit = hist_shape
    idx = np.arange(counts_len, dtype=np.int64)
    bucket = (idx >> half_magnitude) - 1
    sub = (idx & (half - 1)) + half
    low = bucket < 0
    sub[low] -= half
    bucket[low] = 0
    return sub << (bucket + unit), np.left_shift(1, bucket + unit)


def _shape(hist: HdrHistogram) -> tuple[int, int, int, int]:
    return (
        hist.counts_len,
        hist.sub_bucket_half_count_magnitude,
        hist.sub_bucket_half_count,
        hist.unit_magnitude,
    )


def summarise(hist: HdrHistogram) -> dict[str, float]:
    """count, mean and the REPORTED quantiles of ``hist``: the values
    ``get_value_at_percentile`` gives, computed with numpy over the counts (hdrh loops over
    33,792 counts in Python per call)."""
    return summarise_many([hist])


def summarise_many(hists: Sequence[HdrHistogram]) -> dict[str, float]:
    """``summarise`` of the sum of ``hists``, histograms of one shape (none: empty).

    Only the counts that are not zero are summed up and searched: a topic's latencies
    fill a few hundred of a histogram's 33,792, and a cumulative sum over all of them
    (and the copy before it) cost 0.25 ms a summary, 100 ms of /stats, holding shaped
    releases, for 40 shaped topics. A quantile's index is one with a count, so searching
    only those finds the same one, and only those between the smallest and the largest
    value recorded are looked at."""
    total = sum(int(h.total_count) for h in hists)
    out: dict[str, float] = {"count": total, "mean": 0.0}
    if not total:
        return out | _EMPTY_QUANTILES
    lowest, width = _index_values(_shape(hists[0]))
    used = [h for h in hists if h.total_count]
    # hdrh's own index of a value (a private method: the tests compare with its quantiles)
    lo = min(h._counts_index_for(h.min_value) for h in used)
    hi = max(h._counts_index_for(h.max_value) for h in used) + 1
    counts = np.ctypeslib.as_array(used[0].counts)[lo:hi]
    if len(used) > 1:
        counts = counts.astype(np.int64)
        for h in used[1:]:
            # 64-bit counts are unsigned, and uint64 into int64 is no "same kind" cast
            # for numpy: cast as added, not copied first (counts stay far below 2^63)
            np.add(counts, np.ctypeslib.as_array(h.counts)[lo:hi], out=counts, casting="unsafe")
    nonzero = np.flatnonzero(counts)
    at = nonzero + lo
    hits = counts[nonzero].astype(np.int64)
    cum = np.cumsum(hits)
    out["mean"] = float((hits * (lowest[at] + (width[at] >> 1))).sum() / total)
    for name, q in REPORTED:
        # hdrh divides a percentage by 100; so does this, to round exactly as it does
        target = max(int(q * 100 / 100 * total + 0.5), 1)
        i = at[int(np.searchsorted(cum, target))]
        out[name] = int(lowest[i] + width[i] - 1)
    return out


#: Of the records on their first attempt: how many, and their latency (now - arrival),
#: token wait (release - arrival) and lateness (now - release), as int64 arrays.
Times = tuple[int, "array[int]", "array[int]", "array[int]"]


def first_attempt_times_py(records: Sequence[Record], now: int) -> Times:
    """The times a dispatch records, of the first attempts among ``records``."""
    first = [r for r in records if not r[5]]
    return (
        len(first),
        array("q", [now - r[3] for r in first]),
        array("q", [r[4] - r[3] for r in first]),
        array("q", [now - r[4] for r in first]),
    )


_c_first_attempt_times: Callable[[list[Record], int], tuple[int, bytes, bytes, bytes]] | None
try:
    from srtm.broker._records import first_attempt_times as _c_first_attempt_times
except ImportError:  # not built (no compiler at install): in Python
    _c_first_attempt_times = None


def first_attempt_times(records: Sequence[Record], now: int) -> Times:
    """``first_attempt_times_py``, in C where ``srtm.broker._records`` was built."""
    if _c_first_attempt_times is not None and type(records) is list:
        try:
            n, lat, wait, late = _c_first_attempt_times(records, now)
        except (TypeError, OverflowError):  # what C does not take (Python may)
            return first_attempt_times_py(records, now)
        return n, array("q", lat), array("q", wait), array("q", late)
    return first_attempt_times_py(records, now)


class Recorder:
    """An HDR histogram of nanosecond values (1 ns .. 1 h, 3 significant digits).

    The histogram (270 KB of counts) is made on the first flush that has values: most
    recorders of an idle topic or channel never get one, and a broker may hold
    thousands of those.
    """

    __slots__ = ("_hist", "pending")
    #: The histogram's significant digits and bytes per count.
    DIGITS, WORD = 3, 8

    def __init__(self) -> None:
        self._hist: HdrHistogram | None = None
        self.pending: array[int] = array("q")

    @property
    def hist(self) -> HdrHistogram:
        """The histogram (made now if nothing was recorded yet)."""
        if self._hist is None:
            self._hist = HdrHistogram(1, _MAX_NS, self.DIGITS, word_size=self.WORD)
        return self._hist

    def recorded(self) -> HdrHistogram | None:
        """The histogram, flushed (None: nothing was ever recorded)."""
        self.flush()
        return self._hist

    def add(self, value_ns: int) -> None:
        self.pending.append(value_ns)

    def extend(self, values_ns: array[int]) -> None:
        """Values as an int64 array: the copy is a memcpy (an array from a list is made
        once per dispatch, even for two recorders; extending by a list converts each)."""
        self.pending.extend(values_ns)

    def flush(self) -> None:
        if not self.pending:
            return
        pending, self.pending = self.pending, array("q")
        record_pending(self.hist, pending)

    @property
    def count(self) -> int:
        self.flush()
        return 0 if self._hist is None else int(self._hist.get_total_count())

    def summary(self) -> dict[str, float]:
        """count, mean and p50/p95/p99/p999 in ns (0 when empty)."""
        self.flush()
        if self._hist is None:
            return _EMPTY_SUMMARY.copy()
        return summarise(self._hist)


_EMPTY_QUANTILES: dict[str, float] = {name: 0 for name, _ in REPORTED}
_EMPTY_SUMMARY: dict[str, float] = {"count": 0, "mean": 0.0} | _EMPTY_QUANTILES


class StepRecorder(Recorder):
    """A ``Recorder`` of 2 significant digits in 32-bit counts: 18 KB of counts, not 270 KB
    (a window keeps several per topic; 1 % is finer than an SLO is judged at)."""

    __slots__ = ()
    DIGITS, WORD = 2, 4


#: The window SLO latency is judged over: ``WINDOW_STEPS`` steps of ``WINDOW_STEP_NS``, the
#: current one included (the last 50 to 60 s).
WINDOW_STEP_NS = 10 * NS_PER_S
WINDOW_STEPS = 6


class WindowRecorder:
    """A sliding window of recorders: the values of the last ``steps`` steps of
    ``step_ns``, the current step included.

    A value costs what it costs a ``Recorder`` (appended to the current step's pending
    array). The window moves by the clock each call is given, not per value: a call in a
    later step starts a new one, and steps that left the window are dropped unread (a
    step's values are flushed into its histogram once ``FLUSH_AT`` wait, or when read).
    """

    __slots__ = ("_old", "_until", "current", "step_ns", "steps")

    def __init__(self, step_ns: int = WINDOW_STEP_NS, steps: int = WINDOW_STEPS) -> None:
        if step_ns <= 0 or steps <= 0:
            raise ValueError(f"a window of {steps} steps of {step_ns} ns")
        self.step_ns, self.steps = step_ns, steps
        #: The recorder of the current step, where values go.
        self.current = StepRecorder()
        #: When the current step ends (ns; 0: none begun).
        self._until = 0
        #: Earlier steps still in the window, oldest first: (when it ended, its recorder).
        self._old: deque[tuple[int, StepRecorder]] = deque()

    @property
    def seconds(self) -> float:
        """The window's length (s): the current step, however far on, and those before."""
        return self.step_ns * self.steps / NS_PER_S

    def extend(self, values_ns: array[int], now: int) -> None:
        """Values (int64) recorded at ``now``."""
        if now >= self._until:
            self._move(now)
        self.current.pending.extend(values_ns)

    def _move(self, now: int) -> None:
        """Begin the step ``now`` is in, keeping the current one if it has values; drop
        the steps that left the window."""
        cur = self.current
        if cur.pending or cur._hist is not None:
            self._old.append((self._until, cur))
            self.current = StepRecorder()
        self._until = (now // self.step_ns + 1) * self.step_ns
        start = self._until - self.steps * self.step_ns
        while self._old and self._old[0][0] <= start:
            self._old.popleft()

    def recorders(self) -> list[Recorder]:
        return [self.current]

    def summary(self, now: int) -> dict[str, float]:
        """count, mean and p50/p95/p99/p999 in ns of the values in the window at ``now``
        (0 when empty)."""
        if now >= self._until:
            self._move(now)
        steps = [r for _, r in self._old] + [self.current]
        return summarise_many([h for r in steps if (h := r.recorded()) is not None])


@dataclass
class RateWindow:
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
    window: RateWindow = field(default_factory=RateWindow)
    token_wait: Recorder = field(default_factory=Recorder)
    #: dispatch − arrival, first attempts only
    latency: Recorder = field(default_factory=Recorder)


@dataclass
class TopicStats:
    window: RateWindow
    token_wait: Recorder = field(default_factory=Recorder)
    latency: Recorder = field(default_factory=Recorder)
    #: dispatch − GCRA release time, first attempts of shaped messages
    lateness: Recorder = field(default_factory=Recorder)
    #: the same, of those held for a token only (token wait > 0): the release loop's
    #: timing. One due on arrival is as late as the read that took it, from its stamp.
    lateness_held: Recorder = field(default_factory=Recorder)
    channels: dict[str, ChannelStats] = field(default_factory=dict)
    #: dispatch − arrival of first attempts on every channel, over the recent window: of
    #: messages that arrived while their channel had a subscriber, which kept one until
    #: the dispatch (what an SLO is judged on), and of the others, which waited for one
    delivery: WindowRecorder = field(default_factory=WindowRecorder)
    subscriber_wait: WindowRecorder = field(default_factory=WindowRecorder)

    def channel(self, name: str) -> ChannelStats:
        cs = self.channels.get(name)
        if cs is None:
            cs = self.channels[name] = ChannelStats()
        return cs

    def dispatched(
        self,
        channel: str,
        records: Sequence[Record],
        now: int,
        shaped: bool,
        first_channel: bool,
        lateness: bool,
        unserved_before_ns: int = 0,
    ) -> None:
        """Account the first attempts among ``records`` (as queued: attempts 0), dispatched
        by ``channel`` at ``now`` (a redelivery is not a new message): the channel's rate,
        latency and (``shaped``) token wait, and the topic's delivery window (those that
        arrived before ``unserved_before_ns`` waited for a subscriber: see
        ``Channel.unserved_before_ns``; 0: none did); where it is the topic's first
        channel, the topic's latency and (with ``lateness``) its release lateness too, so
        that a message counts once. One array per kind of value, not a call per value."""
        cs = self.channel(channel)
        count, latency, token_wait, late = first_attempt_times(records, now)
        if not count:
            return
        cs.window.add(now, count, 0.0)
        cs.latency.extend(latency)
        # Only while the channel may still hold messages from before its subscriber.
        if unserved_before_ns and max(latency) > now - unserved_before_ns:
            cutoff = now - unserved_before_ns
            self.delivery.extend(array("q", [v for v in latency if v <= cutoff]), now)
            self.subscriber_wait.extend(array("q", [v for v in latency if v > cutoff]), now)
        else:
            self.delivery.extend(latency, now)
        if shaped:
            cs.token_wait.extend(token_wait)
        if first_channel:
            self.latency.extend(latency)
            if lateness:
                self.lateness.extend(late)
                held = array("q", [v for w, v in zip(token_wait, late, strict=True) if w])
                self.lateness_held.extend(held)

    def recorders(self) -> list[Recorder]:
        out = [self.token_wait, self.latency, self.lateness, self.lateness_held]
        out += self.delivery.recorders() + self.subscriber_wait.recorders()
        for cs in self.channels.values():
            out += [cs.token_wait, cs.latency]
        return out


@dataclass
class BrokerStats:
    window_seconds: int = 10
    topics: dict[str, TopicStats] = field(default_factory=dict)
    #: user-space read time − kernel receive stamp, per read
    stamp_gaps: Recorder = field(default_factory=Recorder)
    #: Topics whose stats were handed out since ``pending_recorders`` last looked: only
    #: these can have values to flush (idle topics cost the housekeeping nothing).
    _touched: set[str] = field(default_factory=set)
    #: Called when a topic's stats are handed out and none were since ``pending_recorders``
    #: last looked (the housekeeping's ``wake``: an idle one waits for this).
    on_touch: Callable[[], None] | None = None

    def topic(self, name: str) -> TopicStats:
        ts = self.topics.get(name)
        if ts is None:
            ts = self.topics[name] = TopicStats(RateWindow(self.window_seconds))
        touched = self._touched
        if not touched and self.on_touch is not None:
            self.on_touch()
        touched.add(name)
        return ts

    @property
    def used(self) -> bool:
        """Whether any topic's stats were handed out since ``pending_recorders`` looked."""
        return bool(self._touched)

    def drop_topic(self, name: str) -> None:
        self.topics.pop(name, None)

    def drop_channel(self, topic: str, channel: str) -> None:
        ts = self.topics.get(topic)
        if ts is not None:
            ts.channels.pop(channel, None)

    def recorders(self) -> list[Recorder]:
        """Every histogram it keeps (for flushing them one at a time)."""
        return [self.stamp_gaps, *(r for ts in self.topics.values() for r in ts.recorders())]

    def pending_recorders(self) -> list[Recorder]:
        """The histograms with ``FLUSH_AT`` values or more waiting to be flushed, looking
        only at the topics used since the last call: an idle topic costs the housekeeping
        loop nothing (what fewer values wait for is flushed when read, or once a later
        dispatch brings it to ``FLUSH_AT``)."""
        touched, self._touched = self._touched, set()
        out = [self.stamp_gaps] if len(self.stamp_gaps.pending) >= FLUSH_AT else []
        for name in touched:
            ts = self.topics.get(name)
            if ts is not None:
                out += [r for r in ts.recorders() if len(r.pending) >= FLUSH_AT]
        return out


class StorageLatencyMeter:
    """A topic's storage latency between two reports: the mean time (ns) from a
    publish's arrival to the disk write its acknowledgement waited for, over the
    publishes that waited for one (``srtm.utility.storage``; the controller bounds a
    persisted topic's rate by it)."""

    def __init__(self) -> None:
        self.total_ns = 0
        self.count = 0

    def add(self, latency_ns: int) -> None:
        self.total_ns += max(0, latency_ns)
        self.count += 1

    def take_ms(self) -> float | None:
        """The mean since the last call (ms), and start again; None if none waited."""
        if self.count == 0:
            return None
        mean = self.total_ns / self.count / 1e6
        self.total_ns = self.count = 0
        return mean
