"""A live scenario, simulated: the same workload schedule (``srtm.workload.build``, same
seed), the same topic bucket, brokers emulating ``srtm broker --capacity`` (a
deterministic server of 1/capacity s per message after the sub-bucket) on top of the
calibrated broker's base latency. The placement is either given (a live run's final
assignment and sub-buckets, to check the latency model alone) or made here by the policy,
with online fitting played by the simulator (to check the whole prediction)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from srtm.placement import BrokerCapacity, Fitting, Placement, Policy, TopicSpec, place
from srtm.placement.fitting import FitOutcome
from srtm.ratelimit import BucketParams, split_floored
from srtm.sim.arrivals import Trace, from_schedule
from srtm.sim.engine import Background, Share, SimResult, simulate
from srtm.sim.model import BrokerModel
from srtm.sim.placing import topic_of
from srtm.sim.predict import SimRounds, run_fitting
from srtm.workload import PublisherSpec, build


@dataclass(frozen=True)
class LiveSetup:
    """What a live scenario run fixes (``srtm.experiments.scenarios.Scenario`` in plain
    data): workload, topic bucket and SLO, brokers."""

    specs: Sequence[PublisherSpec]
    bucket: BucketParams
    slo_p99_ms: float
    brokers: int
    capacity: float
    mcap: float
    spread_s: float = 0.0
    seed: int = 1
    duration_s: float = 30.0
    #: Msg/s of Poisson background per broker id ("1".."n").
    preload: Mapping[str, float] = field(default_factory=dict)
    #: Online fitting's measurement window (s) for policies other than LB; None: no fit.
    fit_window_s: float | None = 2.0

    def broker_ids(self) -> list[str]:
        return [str(i + 1) for i in range(self.brokers)]

    def topic(self) -> TopicSpec:
        return topic_of(self.specs, self.bucket, self.slo_p99_ms, "sensors")


@dataclass(frozen=True)
class LivePrediction:
    policy: Policy
    assignment: Mapping[str, tuple[str, ...]]
    result: SimResult
    fitting_rounds: tuple[int, ...] = ()
    #: Publishers fitting left without a broker, and how it ended (None: not fitted).
    unplaced: tuple[str, ...] = ()
    fitting_outcome: FitOutcome | None = None

    @property
    def p99_ms(self) -> float:
        return self.result.topic.p99_ms


def trace_of(setup: LiveSetup) -> Trace:
    """The run's own schedule (the live emulator builds it from the same seed)."""
    return from_schedule(
        build(setup.specs, setup.duration_s, spread_s=setup.spread_s, seed=setup.seed)
    )


def _shares(
    trace: Trace,
    topic: TopicSpec,
    assignment: Mapping[str, Sequence[str]],
    buckets: Mapping[str, BucketParams] | None,
) -> list[Share]:
    index = trace.index()
    used = {b: list(ps) for b, ps in assignment.items() if ps}
    rates = {b: math.fsum(trace.publishers[index[p]].rate for p in ps) for b, ps in used.items()}
    if buckets is None:  # the controller's split: in proportion to rate
        try:
            parts = split_floored(topic.rate, topic.burst, list(rates.values()))
        except ValueError:  # not one token per broker: the controller leaves it unshaped
            return [Share(b, [index[p] for p in ps], None) for b, ps in used.items()]
        buckets = dict(zip(rates, parts, strict=True))
    return [Share(b, [index[p] for p in ps], buckets[b]) for b, ps in used.items()]


def predict(
    setup: LiveSetup,
    model: BrokerModel,
    policy: Policy,
    *,
    assignment: Mapping[str, Sequence[str]] | None = None,
    buckets: Mapping[str, BucketParams] | None = None,
    warmup_s: float = 1.0,
) -> LivePrediction:
    """Predicted latency of ``setup`` under ``policy``: on ``assignment`` (and its
    ``buckets``) when given, else on the policy's placement after simulated fitting."""
    trace = trace_of(setup)
    topic = setup.topic()
    emulated = model.emulated(setup.capacity)
    ids = setup.broker_ids()
    models = dict.fromkeys(ids, emulated)
    background = {b: Background(setup.preload.get(b, 0.0)) for b in ids}
    rounds: tuple[int, ...] = ()
    unplaced: tuple[str, ...] = ()
    outcome: FitOutcome | None = None
    if assignment is None:
        fleet = [BrokerCapacity(b, setup.mcap, setup.preload.get(b, 0.0)) for b in ids]
        if policy == "lb" or setup.fit_window_s is None:
            placement: Placement = place(policy, fleet, topic)
            assignment = {a.broker: a.publishers for a in placement.assignments}
        else:
            fitting = Fitting(fleet, topic, policy, window_s=setup.fit_window_s, min_samples=1)
            oracle = SimRounds(setup.specs, topic, models, background, setup.fit_window_s,
                               setup.spread_s, seed=setup.seed, fresh=False)  # fmt: skip
            done = run_fitting(fitting, oracle)
            assignment, rounds = dict(done.assignment), done.rounds
            unplaced, outcome = done.unassigned, done.outcome
        buckets = None
    result = simulate(
        trace,
        _shares(trace, topic, assignment, buckets),
        models,
        background,
        seed=setup.seed,
        warmup_s=warmup_s,
    )
    placed = {b: tuple(ps) for b, ps in assignment.items()}
    return LivePrediction(policy, placed, result, rounds, unplaced, outcome)


def replay(
    arrivals: Mapping[str, npt.ArrayLike],
    buckets: Mapping[str, BucketParams | None],
    model: BrokerModel,
    capacity: float,
    window_ns: tuple[int, int],
    *,
    lead_s: float = 2.0,
    preload: Mapping[str, float] | None = None,
) -> SimResult:
    """Latency of recorded arrivals (ns, per broker, as a live run's broker traces have
    them) through each broker's sub-bucket and emulated server: the live run's own
    traffic, stalls and catch-up bursts of its publishers included. Messages arriving
    in ``window_ns`` are measured; the ``lead_s`` before it warm the queues up.
    ``preload``: msg/s of other topics' (Poisson) traffic per broker id."""
    start, end = window_ns
    origin = start - int(lead_s * 1e9)
    ids = sorted(arrivals)
    times, owner = [], []
    for i, b in enumerate(ids):
        t = np.sort(np.asarray(arrivals[b], dtype=np.int64))
        t = t[(t >= origin) & (t < end)] - origin
        times.append(t)
        owner.append(np.full(t.size, i, dtype=np.int32))
    t_all = np.concatenate(times) if times else np.zeros(0, np.int64)
    order = np.argsort(t_all, kind="stable")
    duration = (end - origin) / 1e9
    specs = tuple(
        PublisherSpec(f"broker-{b}", max(1.0, len(times[i]) / duration)) for i, b in enumerate(ids)
    )
    trace = Trace(
        t_all[order],
        np.concatenate(owner)[order] if owner else np.zeros(0, np.int32),
        np.ones(t_all.size, dtype=bool),
        specs,
        duration,
    )
    emulated = model.emulated(capacity)
    shares = [Share(b, [i], buckets.get(b)) for i, b in enumerate(ids)]
    background = {b: Background((preload or {}).get(b, 0.0)) for b in ids}
    return simulate(trace, shares, emulated, background, seed=0, warmup_s=lead_s)
