"""The simulator's core: arrivals, queues, the engine, broker models, placements."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.analysis import profile_bucket, token_delays
from srtm.placement import BrokerCapacity, Policy
from srtm.ratelimit import BucketParams, split
from srtm.sim.arrivals import NS_PER_S, from_schedule, generate, homogeneous
from srtm.sim.engine import Background, Share, simulate
from srtm.sim.model import BrokerModel, Dist, load, paper, save
from srtm.sim.placing import on_brokers, topic_of, validated
from srtm.sim.probe import capacity_at_slo, poisson_trace, probe
from srtm.sim.queue import departures, exact, pooled
from srtm.workload import PublisherSpec, build


def model(**changes: object) -> BrokerModel:
    base = BrokerModel("t", 100_000, 1, 10e-6, 0.0, 0.0, Dist("constant", 100e-6))
    return replace(base, **changes)  # type: ignore[arg-type]


# -- arrivals --------------------------------------------------------------------------
def test_counts_follow_the_rates() -> None:
    specs = [PublisherSpec(f"p{i}", 5.0 + i) for i in range(50)]
    tr = generate(specs, 200.0, seed=1)
    counts = np.bincount(tr.publisher, minlength=50)
    expected = np.array([s.rate for s in specs]) * 200.0
    assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected))
    assert np.all(np.diff(tr.t_ns) >= 0) and tr.t_ns.max() < 200 * NS_PER_S


def test_batches_share_a_time_and_one_first_flag() -> None:
    tr = generate(homogeneous(20, batch=10, process="periodic"), 5.0, seed=2)
    assert tr.messages == tr.first.sum() * 10
    starts = np.flatnonzero(tr.first)
    for s in starts[:50]:
        assert np.all(tr.t_ns[s : s + 10] == tr.t_ns[s])
        assert np.all(tr.publisher[s : s + 10] == tr.publisher[s])


def test_periodic_events_are_one_period_apart() -> None:
    tr = generate(homogeneous(5, rate=20.0, process="periodic"), 3.0, seed=3)
    for p in range(5):
        gaps = np.diff(tr.t_ns[tr.publisher == p])
        assert np.all(np.abs(gaps - NS_PER_S // 20) <= 1)


def test_group_members_fire_spread_over_the_interval() -> None:
    specs = homogeneous(4, rate=10.0, group_size=4)
    tr = generate(specs, 10.0, spread_s=0.003, seed=4)
    per = [tr.t_ns[tr.publisher == p] for p in range(4)]
    n = min(len(x) for x in per)
    offsets = np.stack([x[:n] - per[0][:n] for x in per])
    assert np.allclose(offsets.mean(axis=1), [0, 1e6, 2e6, 3e6], atol=1)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    specs = homogeneous(30, group_size=5)
    a, b, c = (
        generate(specs, 5.0, seed=7),
        generate(specs, 5.0, seed=7),
        generate(specs, 5.0, seed=8),
    )
    assert np.array_equal(a.t_ns, b.t_ns) and not np.array_equal(a.t_ns, c.t_ns)


def test_a_workload_schedule_converts_exactly() -> None:
    specs = homogeneous(40, batch=3, group_size=4, process="periodic")
    sched = build(specs, 4.0, spread_s=0.002, seed=5)
    tr = from_schedule(sched)
    assert np.array_equal(tr.t_ns, sched.arrivals_ns())
    assert np.array_equal(tr.publisher, np.repeat(sched.publisher, sched.batch))


def test_mismatched_group_members_are_refused() -> None:
    specs = [PublisherSpec("a", 10.0, group="g"), PublisherSpec("b", 20.0, group="g")]
    with pytest.raises(ValueError, match="must share"):
        generate(specs, 1.0)


# -- queues ----------------------------------------------------------------------------
def lindley(a: list[int], s: list[int]) -> list[int]:
    d, out = -(10**18), []
    for ai, si in zip(a, s, strict=True):
        d = max(d, ai) + si
        out.append(d)
    return out


@given(st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 500)), min_size=1, max_size=200))
def test_vectorised_departures_equal_the_recursion(pairs: list[tuple[int, int]]) -> None:
    gaps, s = zip(*pairs, strict=True)
    a = np.cumsum(np.array(gaps, dtype=np.int64))
    sv = np.array(s, dtype=np.int64)
    assert departures(a, sv).tolist() == lindley(a.tolist(), list(s))
    assert pooled(a, sv, 1).tolist() == exact(a, sv, 1).tolist()


def test_pooled_cores_are_pessimistic_and_tight_in_heavy_traffic() -> None:
    rng = np.random.default_rng(0)
    s = rng.exponential(1_000, 200_000).astype(np.int64)
    for rho, tight in ((0.5, False), (0.97, True)):
        a = np.cumsum(rng.exponential(1_000 / (2 * rho), s.size)).astype(np.int64)
        approx, ref = pooled(a, s, 2).mean(), exact(a, s, 2).mean()
        assert approx >= ref
        if tight:
            assert approx <= 1.1 * ref


# -- engine ----------------------------------------------------------------------------
def test_token_waits_are_the_brokers_gcra() -> None:
    specs = homogeneous(200, batch=5)
    tr = generate(specs, 10.0, seed=1)
    bucket = BucketParams(1_500.0, 40.0)
    r = simulate(tr, [Share("b", np.arange(0, 200, 2), bucket)], model(), seed=0)
    rows = tr.rows_of(np.arange(0, 200, 2))
    assert np.array_equal(r.brokers["b"].token_ns, token_delays(tr.t_ns[rows], 1_500.0, 40.0))


def test_an_idle_broker_adds_base_and_service_only() -> None:
    m = model(per_message_s=20e-6, capacity=0.0)
    tr = poisson_trace(10.0, 50.0, seed=1)  # 10 msg/s: nothing ever queues
    r = simulate(tr, [Share("b", [0], None)], m)
    assert np.allclose(r.brokers["b"].latency_ns, 120_000)


def test_emulated_capacity_is_a_deterministic_server() -> None:
    m = model().emulated(1_000.0)
    t = np.arange(0, 2 * NS_PER_S, 1_000_000, dtype=np.int64)  # exactly 1,000/s
    spec = PublisherSpec("x", 1_000.0)
    from srtm.sim.arrivals import Trace

    tr = Trace(t, np.zeros(t.size, np.int32), np.ones(t.size, bool), (spec,), 2.0)
    lat = simulate(tr, [Share("b", [0], None)], m).brokers["b"].latency_ns
    assert np.all(lat == 100_000 + 1_000_000)
    fast = simulate(replace(tr, t_ns=t // 2), [Share("b", [0], None)], m).brokers["b"]
    assert fast.latency_ns[-1] > 0.4 * NS_PER_S  # twice the capacity offered: it queues


def test_utilisation_and_background_load() -> None:
    m = model()
    tr = poisson_trace(20_000.0, 10.0, seed=2)
    alone = simulate(tr, [Share("b", [0], None)], m, seed=1).brokers["b"]
    assert alone.utilisation == pytest.approx(0.2, rel=0.03)
    busy = simulate(tr, [Share("b", [0], None)], m, {"b": Background(60_000.0)}, seed=1)
    assert busy.brokers["b"].utilisation == pytest.approx(0.8, rel=0.03)
    base_ms = 0.1
    assert busy.topic.p99_ms - base_ms > 2 * (alone.stats.p99_ms - base_ms)


def test_per_event_cost_makes_batches_cheaper() -> None:
    m = model(per_message_s=5e-6, per_event_s=15e-6)
    one = probe(m, 40_000.0, 5.0, seed=1, batch=1)
    ten = probe(m, 40_000.0, 5.0, seed=1, batch=10)
    assert one.p99_ms > 2 * m.base.value * 1e3  # 80 % busy: it queues
    assert ten.p99_ms < one.p99_ms and ten.mean_ms < one.mean_ms


def test_splitting_the_bucket_never_lowers_total_token_wait() -> None:
    """Proposition 1, on the simulator's own path."""
    specs = homogeneous(600)
    tr = generate(specs, 20.0, seed=3)
    b = profile_bucket(tr.t_ns)
    totals = []
    for k in (1, 2, 3, 6):
        subs = split(b.rate, b.burst, [1.0] * k)
        shares = [Share(f"b{i}", np.arange(i, 600, k), subs[i]) for i in range(k)]
        r = simulate(tr, shares, model(), seed=0)
        totals.append(sum(int(x.token_ns.sum()) for x in r.brokers.values()))
    assert totals == sorted(totals) and totals[-1] > totals[0]


# -- models ----------------------------------------------------------------------------
def test_models_round_trip_and_the_paper_model_loads(tmp_path: Path) -> None:
    m = model(base=Dist.from_samples(np.random.default_rng(0).gamma(2, 1e-4, 5_000)))
    save(m, tmp_path / "m.json")
    assert load(tmp_path / "m.json") == m
    p = paper()
    assert p.mcap == 110_000 and p.cores == 2
    doc = json.loads((tmp_path / "m.json").read_text()) | {"bogus": 1}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="bogus"):
        load(tmp_path / "bad.json")


def test_empirical_distribution_keeps_its_quantiles() -> None:
    x = np.random.default_rng(1).lognormal(0, 0.5, 20_000)
    d = Dist.from_samples(x)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert d.quantile(q) == pytest.approx(np.quantile(x, q), rel=0.02)
    s = d.sample(np.random.default_rng(2), 50_000)
    assert np.quantile(s, 0.99) == pytest.approx(np.quantile(x, 0.99), rel=0.05)


def test_capacity_at_slo_brackets_the_slo() -> None:
    m = paper()
    cap = capacity_at_slo(m, duration_s=5.0)
    assert 0 < cap < m.throughput
    assert probe(m, cap, 5.0).p99_ms <= m.slo_p99_ms < probe(m, 1.05 * cap, 5.0).p99_ms
    if m.capacity_at_slo is not None:
        assert m.capacity_at_slo == pytest.approx(cap, rel=0.05)


# -- placements ------------------------------------------------------------------------
def test_a_policy_held_to_k_brokers_uses_them_all() -> None:
    specs = homogeneous(300, group_size=10)
    tr = generate(specs, 5.0, seed=1)
    topic = topic_of(specs, profile_bucket(tr.t_ns), 1.0)
    idle = [BrokerCapacity(f"b{i}", 110_000) for i in range(5)]
    loaded = [BrokerCapacity(f"b{i}", 110_000, 1_000.0 * i) for i in range(5)]
    cases: list[tuple[Policy, list[BrokerCapacity]]] = [
        ("conc", idle),
        ("maxmin", loaded),
        ("srtm", loaded),
    ]
    for policy, brokers in cases:
        p = on_brokers(policy, brokers[:4], topic)
        assert len(p.assignments) == 4 and not p.unassigned
        assert sum(a.bucket.burst for a in p.assignments if a.bucket) == pytest.approx(topic.burst)
    # Conc levels total load: a broker already above the level gets nothing.
    assert len(on_brokers("conc", loaded[:4], topic).assignments) == 2


def test_validation_adds_brokers_until_the_slo_holds() -> None:
    specs = homogeneous(100)
    topic = topic_of(specs, BucketParams(1_100.0, 10.0), 1.0)
    brokers = [BrokerCapacity(f"b{i}", 110_000) for i in range(6)]
    tried: list[int] = []

    def measure(p: object) -> float:
        k = len(p.assignments)  # type: ignore[attr-defined]
        tried.append(k)
        return 3.0 / k  # meets 1 ms from k = 3 on

    choice = validated("conc", brokers, topic, measure)
    assert (choice.k, choice.meets_slo, tried) == (3, True, [1, 2, 3])
    worst = validated("conc", brokers, topic, lambda p: 9.0 - len(p.assignments))
    assert (worst.k, worst.meets_slo) == (6, False)  # none meets it: the best is kept
