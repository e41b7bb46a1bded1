"""What a control-plane-faults run measured, computed without I/O: the sum of a topic's
live shares over its rate from the brokers' ``/stats``, takeover time from the write
probes, the SLO per (topic, window), and one row per fault.

Times are seconds since the run's time 0 (the load's start), on the wall clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from srtm.experiments.control_plane.scenario import CONTROL_FAULTS, FaultKind

Floats = npt.NDArray[np.float64]

#: Σ live shares / r above 1 by more than this is a hole in the topic's bucket (the
#: shares are floats summed over brokers: rounding is not a violation).
SHARE_TOLERANCE = 1e-6


def live_rate(topic_doc: Mapping[str, Any]) -> float:
    """A broker's live share of a topic from its ``/stats`` ``srtm.topics`` entry: the
    sub-bucket's rate while the topic is shaped by it, 0 when held or unmanaged (a broker
    past its lease shows every shaped topic held)."""
    bucket = topic_doc.get("bucket")
    if not bucket or topic_doc.get("held"):
        return 0.0
    return float(bucket.get("rate", 0.0))


@dataclass(frozen=True)
class ShareSample:
    """One poll of a topic's shares: each broker that answered, its live rate."""

    t_s: float
    topic: str
    rate: float
    live: dict[str, float]

    @property
    def ratio(self) -> float:
        """Σ live shares / r."""
        return sum(self.live.values()) / self.rate if self.rate > 0 else 0.0


def share_samples(
    t_s: float, stats: Mapping[str, Mapping[str, Any]], rates: Mapping[str, float]
) -> list[ShareSample]:
    """One poll's samples, a topic each (``rates``: topic -> r), from each answering
    broker's ``/stats?format=json`` document (``stats``: broker id -> document)."""
    live: dict[str, dict[str, float]] = {t: {} for t in rates}
    for broker, doc in stats.items():
        for t in (doc.get("srtm") or {}).get("topics", []):
            if t.get("topic") in live:
                live[t["topic"]][broker] = live_rate(t)
    return [ShareSample(t_s, topic, rates[topic], live[topic]) for topic in rates]


def max_ratio(samples: Sequence[ShareSample], lo: float = -np.inf, hi: float = np.inf) -> float:
    """The largest Σ live shares / r among samples taken in [lo, hi)."""
    return max((s.ratio for s in samples if lo <= s.t_s < hi), default=0.0)


def busiest(samples: Sequence[ShareSample]) -> str:
    """The broker with the largest live shares (msg/s, all topics) in the last poll of
    ``samples`` ("1" before any)."""
    if not samples:
        return "1"
    last = samples[-1].t_s
    load: dict[str, float] = {}
    for s in samples:
        if s.t_s == last:
            for broker, rate in s.live.items():
                load[broker] = load.get(broker, 0.0) + rate
    return max(sorted(load), key=lambda b: load[b], default="1")


@dataclass(frozen=True)
class Probe:
    """A write sent to one controller (``PATCH`` of the probe topic): when sent, when
    answered, and whether a leader took it (2xx; a standby's 307, 503 or no answer: not)."""

    sent_s: float
    answered_s: float
    ok: bool
    controller: str


def takeover_s(from_s: float, probes: Sequence[Probe]) -> float | None:
    """From ``from_s`` until a controller leading answered a write sent at or after it;
    None if none did."""
    done = [p.answered_s for p in probes if p.ok and p.sent_s >= from_s]
    return min(done) - from_s if done else None


@dataclass(frozen=True)
class LeaderSample:
    """One controller's ``GET /info`` in one poll round (``leader`` None: no answer)."""

    t_s: float
    controller: str
    leader: bool | None
    epoch: int | None


def leaders_at_once(samples: Sequence[LeaderSample], lo: float, hi: float) -> int:
    """The most controllers that said ``leader: true`` in one poll round in [lo, hi)."""
    rounds: dict[float, int] = {}
    for s in samples:
        if lo <= s.t_s < hi:
            rounds[s.t_s] = rounds.get(s.t_s, 0) + bool(s.leader)
    return max(rounds.values(), default=0)


@dataclass(frozen=True)
class TopicMessages:
    """A topic's acknowledged messages (their send times) and, of those, the delivered
    ones (send times, end-to-end latency, receipt times)."""

    acked_s: Floats
    sent_s: Floats
    latency_ms: Floats
    recv_s: Floats


@dataclass(frozen=True)
class WindowRow:
    """One (topic, window): acknowledged messages sent in it, how many were delivered,
    their p99 and whether it met the topic's SLO (every one delivered, p99 ≤ SLO)."""

    topic: str
    t_s: float
    acked: int
    delivered: int
    p99_ms: float | None
    slo_ms: float

    @property
    def met(self) -> bool:
        return self.delivered >= self.acked and (self.p99_ms is None or self.p99_ms <= self.slo_ms)


def window_rows(
    messages: Mapping[str, TopicMessages], slo_ms: Mapping[str, float], window_s: float,
    windows: int,
) -> list[WindowRow]:  # fmt: skip
    """Every (topic, window) of the run, windows of ``window_s`` from time 0."""
    rows = []
    for topic, m in messages.items():
        for i in range(windows):
            lo, hi = i * window_s, (i + 1) * window_s
            sent = (m.sent_s >= lo) & (m.sent_s < hi)
            acked = int(((m.acked_s >= lo) & (m.acked_s < hi)).sum())
            p99 = float(np.percentile(m.latency_ms[sent], 99)) if sent.any() else None
            rows.append(WindowRow(topic, lo, acked, int(sent.sum()), p99, slo_ms[topic]))
    return rows


def in_span(rows: Sequence[WindowRow], lo: float, hi: float, window_s: float) -> list[WindowRow]:
    """The windows that overlap [lo, hi)."""
    return [w for w in rows if w.t_s < hi and w.t_s + window_s > lo]


def delivery_ratio(messages: Mapping[str, TopicMessages], lo: float, hi: float) -> float | None:
    """Messages received in [lo, hi) over acknowledged messages sent in it, all topics: 1
    when delivery kept up with publishing (None: nothing was sent)."""
    sent = sum(int(((m.acked_s >= lo) & (m.acked_s < hi)).sum()) for m in messages.values())
    got = sum(int(((m.recv_s >= lo) & (m.recv_s < hi)).sum()) for m in messages.values())
    return got / sent if sent else None


@dataclass
class FaultRecord:
    """What the driver did for one fault: when it began, was healed and had settled, on
    what (``target``), and the takeover clock's start."""

    kind: FaultKind
    target: str
    start_s: float
    heal_s: float = 0.0
    settled_s: float = 0.0
    #: The write probes sent after the fault (``takeover_s``).
    probes: list[Probe] = field(default_factory=list)

    @property
    def takeover_from_s(self) -> float:
        return self.heal_s if self.kind is FaultKind.controllers_down else self.start_s


@dataclass(frozen=True)
class FaultRow:
    """The report's row for one fault."""

    fault: FaultKind
    target: str
    start_s: float
    heal_s: float
    settled_s: float
    takeover_s: float | None
    windows_met: int
    windows: int
    plan_before: dict[str, int]
    plan_after: dict[str, int]
    published: int
    delivered: int
    max_share_ratio: float
    leaders_at_once: int
    #: Received over published while the fault lasted (every controller down only).
    delivery_ratio: float | None

    @property
    def control(self) -> bool:
        return self.fault in CONTROL_FAULTS


def version_at(
    versions: Sequence[tuple[float, str, int]], topic: str, t_s: float, after: bool
) -> int | None:
    """A topic's plan version as last polled before ``t_s`` (``after``: first polled at or
    after it); ``versions`` are (t_s, topic, version) in time order."""
    mine = [(t, v) for t, name, v in versions if name == topic]
    if after:
        return next((v for t, v in mine if t >= t_s), mine[-1][1] if mine else None)
    before = [v for t, v in mine if t < t_s]
    return before[-1] if before else None


@dataclass(frozen=True)
class Observed:
    """Everything the poller and the probes saw, and the messages from the traces."""

    shares: Sequence[ShareSample]
    leaders: Sequence[LeaderSample]
    versions: Sequence[tuple[float, str, int]]
    messages: Mapping[str, TopicMessages]
    rows: Sequence[WindowRow]
    window_s: float


def fault_row(rec: FaultRecord, seen: Observed) -> FaultRow:
    """One fault's row over its span, from the fault to the end of its settling."""
    lo, hi = rec.start_s, rec.settled_s
    span = in_span(seen.rows, lo, hi, seen.window_s)
    topics = list(seen.messages)
    before = {t: v for t in topics if (v := version_at(seen.versions, t, lo, False)) is not None}
    after = {t: v for t in topics if (v := version_at(seen.versions, t, hi, False)) is not None}
    return FaultRow(
        fault=rec.kind, target=rec.target, start_s=lo, heal_s=rec.heal_s, settled_s=hi,
        takeover_s=takeover_s(rec.takeover_from_s, rec.probes),
        windows_met=sum(w.met for w in span), windows=len(span),
        plan_before=before, plan_after=after,
        published=sum(w.acked for w in span),
        delivered=sum(min(w.delivered, w.acked) for w in span),
        max_share_ratio=max_ratio(seen.shares, lo, hi),
        leaders_at_once=leaders_at_once(seen.leaders, lo, hi),
        delivery_ratio=(
            delivery_ratio(seen.messages, rec.start_s, rec.heal_s)
            if rec.kind is FaultKind.controllers_down else None
        ),
    )  # fmt: skip
