"""The simulator in the fitting loop: predictions for model-assisted fitting, and a
simulated stand-in for measurement rounds.

``Predictor`` answers the Load Distributor's question (how many of these candidates can
this broker keep within the SLO?) from simulated p99s over the topic's profiled trace,
searching down from all of them (small shares of a bursty topic can miss the SLO for
token waits alone, so p99 need not fall monotonically with the count).

With ``adaptor``, a broker's sub-bucket depth is what the TB Adaptor settles on while the
round runs (``srtm.placement.adaptor``: depths in proportion to each side's maximum
virtual backlog per 10 s window, averaged over the windows), the rest of the topic
counted as one other broker; without, depths follow rates (the static split).

``SimRounds`` plays the cluster: each round simulates every broker under test for the
round's window, on new traffic or on a replay of the profiled trace. ``run_fitting``
drives ``srtm.placement.Fitting`` with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from srtm.analysis import required_burst, virtual_backlog
from srtm.placement import (
    BrokerCapacity,
    Finished,
    Fitting,
    PublisherLoad,
    RoundResult,
    TopicSpec,
    search_quantum,
)
from srtm.placement.fitting import Command, Profile
from srtm.ratelimit import BucketParams, split_amount
from srtm.sim.arrivals import Trace, generate
from srtm.sim.engine import Background, Share, simulate
from srtm.sim.model import BrokerModel, load
from srtm.workload import PublisherSpec

#: Predictions aim at the middle of the accept band, so that a measurement that differs
#: a little from the model still lands in it.
TARGET_SHARE = 0.9
#: The TB Adaptor's window (s): it follows the maximum backlog per window.
ADAPTOR_WINDOW_S = 10.0


def share_bucket(topic: TopicSpec, rate: float) -> BucketParams:
    """The sub-bucket that goes with ``rate`` msg/s of the topic (split in proportion)."""
    share = rate / topic.load if topic.load else 0.0
    return BucketParams(topic.rate * share, max(1.0, topic.burst * share))


def max_backlog(trace: Trace, rows: np.ndarray, rate: float) -> float:
    """The TB Adaptor's statistic: maximum virtual backlog (tokens) at ``rate`` per
    window, averaged over the windows of the trace."""
    if rows.size == 0 or rate <= 0:
        return 0.0
    t = trace.t_ns[rows]
    backlog = virtual_backlog(t, rate) * (rate / 1e9)
    window = (t // int(ADAPTOR_WINDOW_S * 1e9)).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, window[1:] != window[:-1]])
    return float(np.maximum.reduceat(backlog, starts).mean())


def adaptor_bucket(trace: Trace, topic: TopicSpec, mine: np.ndarray, rate: float) -> BucketParams:
    """The sub-bucket the TB Adaptor gives ``mine`` (publisher indices, ``rate`` msg/s),
    the topic's other publishers being one other broker."""
    share = rate / topic.load if topic.load else 0.0
    if share >= 1.0:
        return BucketParams(topic.rate, topic.burst)
    rest = np.setdiff1d(np.arange(len(trace.publishers)), mine)
    r_mine, r_rest = topic.rate * share, topic.rate * (1 - share)
    weights = [
        max_backlog(trace, trace.rows_of(mine), r_mine),
        max_backlog(trace, trace.rows_of(rest), r_rest),
    ]
    if not any(w > 0 for w in weights):
        return share_bucket(topic, rate)
    return BucketParams(r_mine, split_amount(topic.burst, weights, minimum=1.0)[0])


@dataclass
class BrokerSim:
    """One broker's p99 for any set of the topic's publishers, on one trace."""

    trace: Trace
    topic: TopicSpec
    model: BrokerModel
    background: Background = field(default_factory=Background)
    seed: int = 0
    warmup_s: float = 1.0
    adaptor: bool = False

    def __post_init__(self) -> None:
        self._index = self.trace.index()
        self._rate = {p.id: p.rate for p in self.topic.publishers}

    def p99(self, publishers: Sequence[str]) -> tuple[float, int]:
        """(p99 in ms, messages measured) with exactly ``publishers`` on the broker."""
        if not publishers:
            return float("nan"), 0
        rate = math.fsum(self._rate[p] for p in publishers)
        mine = np.array([self._index[p] for p in publishers], dtype=np.int64)
        bucket = (
            adaptor_bucket(self.trace, self.topic, mine, rate)
            if self.adaptor
            else share_bucket(self.topic, rate)
        )
        share = Share("b", mine, bucket)
        bg = {"b": self.background}
        r = simulate(
            self.trace,
            [share],
            self.model,
            bg,
            seed=self.seed,
            warmup_s=self.warmup_s,
            keep_latencies=False,
        )
        return r.topic.p99_ms, r.topic.messages


@dataclass
class Predictor:
    """``srtm.placement.fitting.Predict`` backed by the simulator (one ``BrokerSim`` per
    broker, on the topic's profiled trace)."""

    sims: Mapping[str, BrokerSim]
    target_share: float = TARGET_SHARE
    calls: int = 0

    def __call__(
        self, broker: str, held: Sequence[PublisherLoad], candidates: Sequence[PublisherLoad]
    ) -> int | None:
        sim = self.sims.get(broker)
        if sim is None:
            return None
        target = self.target_share * sim.topic.slo_p99_ms
        fixed = [p.id for p in held]
        ids = [p.id for p in candidates]

        def fits(n: int) -> bool:
            self.calls += 1
            p99, samples = sim.p99(fixed + ids[:n])
            return samples == 0 or p99 <= target

        # Down from all of them in doubling steps, then bisect between the last miss and
        # the first fit; on the same grid as the fitting's search.
        q = search_quantum(candidates)
        hi, step = len(ids), q * max(1, math.ceil(len(ids) / 20 / q))
        if fits(hi):
            return hi
        lo = 0
        while hi - step > 0:
            if fits(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, 2 * step
        while hi - lo > q:
            mid = lo + (hi - lo) // (2 * q) * q
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo


@dataclass
class SimRounds:
    """Measurement rounds played by the simulator, ``window_s`` long, with the brokers'
    models. With ``fresh`` every round draws new traffic; without, every round replays
    the trace of ``seed`` (periodic publishers keep their phases: the same pattern)."""

    publishers: Sequence[PublisherSpec]
    topic: TopicSpec
    models: Mapping[str, BrokerModel]
    background: Mapping[str, Background]
    window_s: float = 60.0
    spread_s: float = 0.0
    seed: int = 1
    fresh: bool = True
    adaptor: bool = False
    rounds: int = 0
    _trace: Trace | None = None

    def measure(self, profiles: Sequence[Profile]) -> dict[str, RoundResult]:
        trace = self._trace
        if trace is None or self.fresh:
            seed = self.seed * 1_000_003 + self.rounds if self.fresh else self.seed
            trace = generate(self.publishers, self.window_s, spread_s=self.spread_s, seed=seed)
            self._trace = trace
        self.rounds += 1
        out = {}
        for i, prof in enumerate(profiles):
            sim = BrokerSim(
                trace,
                self.topic,
                self.models[prof.broker],
                self.background.get(prof.broker, Background()),
                seed=self.seed * 7919 + 97 * self.rounds + i,
                adaptor=self.adaptor,
            )
            p99, n = sim.p99(prof.publishers)
            out[prof.broker] = RoundResult(p99, n)
        return out


def run_fitting(fitting: Fitting, rounds: SimRounds, max_rounds: int = 1_000) -> Finished:
    """Drive ``fitting`` to the end with simulated measurement rounds."""
    cmds: list[Command] = fitting.start()
    for _ in range(max_rounds):
        done = next((c for c in cmds if isinstance(c, Finished)), None)
        if done is not None:
            return done
        profiles = [c for c in cmds if isinstance(c, Profile)]
        cmds = fitting.on_round(rounds.measure(profiles))
    raise RuntimeError(f"fitting did not finish in {max_rounds} rounds")


def predictor_for_topic(
    topic: TopicSpec,
    brokers: Sequence[BrokerCapacity],
    model: str | BrokerModel,
    *,
    duration_s: float = 20.0,
    seed: int = 0,
) -> Predictor:
    """A predictor for a topic the controller knows only as publishers with rates and
    groups: its profiled trace is drawn as Poisson events (batch 1), a group's members
    firing together; each broker carries its current load as Poisson background.

    The topic's bucket was profiled on its real traffic, so that traffic fits it (99 %
    of messages wait no token); the drawn events have the same rates and groups but
    not the same times, and may need a deeper bucket to fit as well. The simulated
    topic gets the deeper of the two (``envelope_for``), so that the predictions weigh
    where publishers go, not how the draw differs from the traffic profiled."""
    m = model if isinstance(model, BrokerModel) else load(model)
    specs = [PublisherSpec(p.id, p.rate, "poisson", 1, p.group) for p in topic.publishers]
    trace = generate(specs, duration_s, seed=seed)
    topic = envelope_for(topic, trace)
    return Predictor(
        {
            b.id: BrokerSim(trace, topic, m, Background(b.load), seed=seed + i + 1)
            for i, b in enumerate(brokers)
        }
    )


def envelope_for(topic: TopicSpec, trace: Trace) -> TopicSpec:
    """``topic`` with its burst deepened to what ``trace`` needs at the topic's rate for
    99 % of its messages to wait no token (as the topic's own bucket was profiled)."""
    if trace.messages == 0 or topic.rate <= 0:
        return topic
    need = required_burst(trace.t_ns, topic.rate, 0.99)
    return replace(topic, burst=need) if need > topic.burst else topic
