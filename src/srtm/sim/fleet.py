"""Many topics sharing brokers, simulated together.

``srtm.sim.engine`` simulates one topic and stands the brokers' other traffic in as
Poisson background. Here every topic's messages are real: on each broker, each topic's
share waits for tokens in its own sub-bucket (``srtm.analysis.token_delays``), then all
shares' released messages join the broker's one FIFO processing queue
(``srtm.sim.queue.pooled``), costed by the broker model exactly as ``engine`` costs them.
A message's latency is ``base + token wait + queueing + service``, collected per topic
over every broker it was sent to. Pure and vectorised: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from srtm.analysis import token_delays
from srtm.sim.arrivals import NS_PER_S, BoolArray, IntArray, Trace
from srtm.sim.engine import Share, Stats, _service_ns
from srtm.sim.model import BrokerModel
from srtm.sim.queue import pooled

__all__ = ["FleetResult", "simulate_fleet"]


@dataclass(frozen=True)
class FleetResult:
    """Per topic, the latency of its messages; per broker, its processing queue's busy
    share of capacity (all topics together)."""

    topics: Mapping[str, Stats]
    utilisation: Mapping[str, float]


def simulate_fleet(
    traces: Mapping[str, Trace],
    shares: Mapping[str, Sequence[Share]],
    model: BrokerModel,
    *,
    seed: int = 0,
    warmup_s: float = 0.0,
) -> FleetResult:
    """Every topic of ``shares`` (topic -> its brokers' shares of ``traces[topic]``) on
    brokers of ``model``; messages arriving in the first ``warmup_s`` are left out of the
    figures (queues start empty, buckets full)."""
    per_broker: dict[str, list[tuple[str, Share]]] = {}
    for topic, topic_shares in shares.items():
        for share in topic_shares:
            per_broker.setdefault(share.broker, []).append((topic, share))
    lat: dict[str, list[IntArray]] = {t: [] for t in shares}
    tok: dict[str, list[IntArray]] = {t: [] for t in shares}
    util: dict[str, float] = {}
    cut = int(warmup_s * NS_PER_S)
    for i, broker in enumerate(sorted(per_broker)):
        rng = np.random.default_rng([seed, i])
        parts = [_released(traces[t], share) for t, share in per_broker[broker]]
        release = np.concatenate([p[1] for p in parts])
        first = np.concatenate([p[2] for p in parts])
        order = np.argsort(release, kind="stable")
        service = _service_ns(model, first[order], np.ones(order.size, np.int64), rng)
        sojourn = np.empty(order.size, np.int64)
        sojourn[order] = pooled(release[order], service, model.cores)
        base = np.round(model.base.sample(rng, order.size) * NS_PER_S).astype(np.int64)
        duration = max(traces[t].duration_s for t, _ in per_broker[broker])
        util[broker] = float(service.sum()) / (model.cores * duration * NS_PER_S)
        at = 0
        for (topic, _), (arrive, _, _, token) in zip(per_broker[broker], parts, strict=True):
            end = at + arrive.size
            keep = arrive >= cut
            lat[topic].append((base[at:end] + token + sojourn[at:end])[keep])
            tok[topic].append(token[keep])
            at = end
    stats = {t: Stats.of(_joined(lat[t]), _joined(tok[t])) for t in shares}
    return FleetResult(stats, util)


def _released(trace: Trace, share: Share) -> tuple[IntArray, IntArray, BoolArray, IntArray]:
    """(arrival, release, first-of-event, token wait) of ``share``'s messages."""
    rows = trace.rows_of(share.publishers)
    arrive = trace.t_ns[rows]
    if share.bucket is not None and arrive.size:
        token = token_delays(arrive, share.bucket.rate, share.bucket.burst)
    else:
        token = np.zeros(arrive.size, np.int64)
    return arrive, arrive + token, trace.first[rows], token


def _joined(parts: list[IntArray]) -> IntArray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
