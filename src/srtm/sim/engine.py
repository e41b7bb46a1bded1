"""The simulator: a topic's arrivals → each broker's sub-bucket → its processing queue.

For each broker carrying part of the topic: its messages wait for tokens in the
sub-bucket (``srtm.analysis.token_delays``, exactly the broker's GCRA), then join the
broker's FIFO processing queue together with the other topics it already carries
(``background``: Poisson events, unshaped, since they conform to their own buckets); the
queue is ``srtm.sim.queue.pooled`` over the model's cores. A message's end-to-end latency
is ``base + token wait + queueing + service``. Brokers are independent given the
assignment, so each is simulated on its own, with its own random stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from srtm.analysis import token_delays
from srtm.quantiles import quantiles
from srtm.ratelimit import BucketParams
from srtm.sim.arrivals import NS_PER_S, IntArray, Trace
from srtm.sim.model import BrokerModel
from srtm.sim.queue import pooled


@dataclass(frozen=True, slots=True)
class Background:
    """Load a broker already carries: ``rate`` msg/s in Poisson events of ``batch``."""

    rate: float = 0.0
    batch: int = 1

    def __post_init__(self) -> None:
        if not (np.isfinite(self.rate) and self.rate >= 0):
            raise ValueError(f"background rate must be >= 0, got {self.rate!r}")
        if not (isinstance(self.batch, int) and self.batch >= 1):
            raise ValueError(f"background batch must be an integer >= 1, got {self.batch!r}")


@dataclass(frozen=True, slots=True)
class Share:
    """What one broker carries of the topic: publishers (indices into the trace's
    publishers) and its sub-bucket (None: not shaped)."""

    broker: str
    publishers: Sequence[int] | npt.NDArray[np.int64]
    bucket: BucketParams | None


@dataclass(frozen=True, slots=True)
class Stats:
    """Latency of a set of messages, in milliseconds."""

    messages: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    #: The p99 of the token wait alone (the DRL penalty's tail).
    token_p99_ms: float
    #: Share of messages that waited for a token.
    delayed: float

    @classmethod
    def of(cls, latency_ns: IntArray, token_ns: IntArray) -> Stats:
        if latency_ns.size == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan, nan, nan)
        q = quantiles(latency_ns, (0.5, 0.95, 0.99), scale=1e6)
        return cls(
            int(latency_ns.size),
            q["p50"],
            q["p95"],
            q["p99"],
            float(latency_ns.mean()) / 1e6,
            float(latency_ns.max()) / 1e6,
            quantiles(token_ns, (0.99,), scale=1e6)["p99"],
            float(np.count_nonzero(token_ns)) / token_ns.size,
        )


@dataclass(frozen=True)
class BrokerRun:
    broker: str
    stats: Stats
    #: Busy share of the processing queue's capacity over the window (all topics).
    utilisation: float
    publishers: int
    bucket: BucketParams | None
    latency_ns: IntArray = field(repr=False)
    token_ns: IntArray = field(repr=False)


@dataclass(frozen=True)
class SimResult:
    brokers: Mapping[str, BrokerRun]
    topic: Stats

    @property
    def p99_ms(self) -> float:
        return self.topic.p99_ms

    def to_json(self) -> dict[str, object]:
        from dataclasses import asdict

        return {
            "topic": asdict(self.topic),
            "brokers": {
                b: asdict(r.stats)
                | {"utilisation": r.utilisation, "publishers": r.publishers}
                | {"bucket": None if r.bucket is None else [r.bucket.rate, r.bucket.burst]}
                for b, r in self.brokers.items()
            },
        }


def _service_ns(
    model: BrokerModel,
    first: npt.NDArray[np.bool_],
    messages: npt.NDArray[np.int64],
    rng: np.random.Generator,
) -> IntArray:
    """Service time per job; a job is one message, or a background event of ``messages``."""
    if model.capacity > 0:
        return np.round(messages * (NS_PER_S / model.capacity)).astype(np.int64)
    cv = model.service_cv
    if cv > 0:
        # The sum of m gamma(k, 1/k) multipliers is gamma(m·k, 1/k): one draw per job.
        k = 1.0 / (cv * cv)
        work = rng.gamma(messages * k, 1.0 / k)
    else:
        work = messages.astype(np.float64)
    s = work * model.per_message_s + first * model.per_event_s
    return np.round(s * NS_PER_S).astype(np.int64)


def _background(
    bg: Background, duration_s: float, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """Event times (ns) and messages per event of the background load."""
    if bg.rate <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    n = rng.poisson(bg.rate / bg.batch * duration_s)
    t = np.sort(rng.uniform(0, duration_s * NS_PER_S, n)).astype(np.int64)
    return t, np.full(n, bg.batch, dtype=np.int64)


def simulate_broker(
    trace: Trace,
    rows: IntArray,
    bucket: BucketParams | None,
    model: BrokerModel,
    background: Background,
    rng: np.random.Generator,
) -> tuple[IntArray, IntArray, float]:
    """(latency, token wait) per message of ``rows``, and the queue's utilisation."""
    arrive = trace.t_ns[rows]
    token = (
        token_delays(arrive, bucket.rate, bucket.burst)
        if bucket is not None and arrive.size
        else np.zeros(arrive.size, np.int64)
    )
    release = arrive + token
    mine = _service_ns(model, trace.first[rows], np.ones(rows.size, np.int64), rng)
    bg_t, bg_m = _background(background, trace.duration_s, rng)
    bg_s = _service_ns(model, np.ones(bg_t.size, bool), bg_m, rng)
    # Merge two sorted streams; on equal times the topic's message goes first.
    pos = np.searchsorted(bg_t, release, side="left") + np.arange(release.size)
    total = release.size + bg_t.size
    at = np.empty(total, np.int64)
    s = np.empty(total, np.int64)
    is_mine = np.zeros(total, bool)
    is_mine[pos] = True
    at[pos], s[pos] = release, mine
    at[~is_mine], s[~is_mine] = bg_t, bg_s
    sojourn = pooled(at, s, model.cores)[pos]
    base = np.round(model.base.sample(rng, rows.size) * NS_PER_S).astype(np.int64)
    util = float(s.sum()) / (model.cores * trace.duration_s * NS_PER_S)
    return base + token + sojourn, token, util


def simulate(
    trace: Trace,
    shares: Sequence[Share],
    models: Mapping[str, BrokerModel] | BrokerModel,
    background: Mapping[str, Background] | None = None,
    *,
    seed: int = 0,
    warmup_s: float = 0.0,
    keep_latencies: bool = True,
) -> SimResult:
    """End-to-end latency of every message of the topic; ``warmup_s`` leaves out the
    messages of the first seconds (queues start empty, buckets full)."""
    background = background or {}
    runs: dict[str, BrokerRun] = {}
    all_lat: list[IntArray] = []
    all_tok: list[IntArray] = []
    cut = int(warmup_s * NS_PER_S)
    for i, share in enumerate(shares):
        model = models if isinstance(models, BrokerModel) else models[share.broker]
        rows = trace.rows_of(share.publishers)
        rng = np.random.default_rng([seed, i])
        lat, tok, util = simulate_broker(
            trace, rows, share.bucket, model, background.get(share.broker, Background()), rng
        )
        measured = trace.t_ns[rows] >= cut
        lat, tok = lat[measured], tok[measured]
        all_lat.append(lat)
        all_tok.append(tok)
        empty = np.zeros(0, np.int64)
        runs[share.broker] = BrokerRun(
            share.broker,
            Stats.of(lat, tok),
            util,
            len(share.publishers),
            share.bucket,
            lat if keep_latencies else empty,
            tok if keep_latencies else empty,
        )
    lat = np.concatenate(all_lat) if all_lat else np.zeros(0, np.int64)
    tok = np.concatenate(all_tok) if all_tok else np.zeros(0, np.int64)
    return SimResult(runs, Stats.of(lat, tok))
