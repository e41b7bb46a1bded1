"""The simulator in the fitting loop: predictions, simulated rounds, the Table I topic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from srtm.analysis import profile_bucket, required_burst
from srtm.placement import BrokerCapacity, Fitting, PublisherLoad, RoundResult, search_quantum
from srtm.placement.fitting import balanced_order
from srtm.ratelimit import BucketParams
from srtm.sim.arrivals import generate, homogeneous
from srtm.sim.model import paper
from srtm.sim.placing import topic_of
from srtm.sim.predict import (
    BrokerSim,
    Predictor,
    SimRounds,
    adaptor_bucket,
    envelope_for,
    predictor_for_topic,
    run_fitting,
    share_bucket,
)


def grouped_topic(group: int = 20, n: int = 400, seconds: float = 5.0):  # type: ignore[no-untyped-def]
    specs = homogeneous(n, process="periodic", batch=10, group_size=group)
    trace = generate(specs, seconds, seed=3)
    b = profile_bucket(trace.t_ns)
    return specs, trace, topic_of(specs, BucketParams(b.rate, 1.1 * b.burst), 1.0)


def test_the_prediction_is_the_largest_slice_within_the_target() -> None:
    _, trace, topic = grouped_topic()
    sim = BrokerSim(trace, topic, paper(), seed=1)
    predictor = Predictor({"b": sim})
    cands = balanced_order(topic.publishers)
    n = predictor("b", [], cands)
    assert n is not None and 0 < n < len(cands)
    q = search_quantum(cands)
    ids = [p.id for p in cands]
    assert sim.p99(ids[:n])[0] <= 0.9 * topic.slo_p99_ms < sim.p99(ids[: n + q])[0]
    assert predictor("other", [], cands) is None  # no model of that broker: no prediction


def test_sub_buckets_follow_rate_or_the_adaptors_backlogs() -> None:
    _, trace, topic = grouped_topic()
    half = np.arange(0, 400, 2)
    static = share_bucket(topic, 2_000.0)
    assert static == BucketParams(topic.rate / 2, topic.burst / 2)
    adapted = adaptor_bucket(trace, topic, half, 2_000.0)
    assert adapted.rate == pytest.approx(static.rate) and 1 <= adapted.burst < topic.burst
    # Half of every group is an exact half of every burst: the backlogs split evenly.
    assert adapted.burst == pytest.approx(static.burst, rel=0.05)


def test_model_assisted_fitting_needs_fewer_rounds_than_measuring() -> None:
    specs, trace, topic = grouped_topic(group=20, n=400)
    model = paper()
    brokers = [BrokerCapacity(f"b{i}", model.mcap) for i in range(4)]
    models = {b.id: model for b in brokers}
    totals = []
    for assisted in (False, True):
        predictor = Predictor({b.id: BrokerSim(trace, topic, model, seed=2) for b in brokers})
        fitting = Fitting(brokers, topic, window_s=5.0, predict=predictor if assisted else None)
        rounds = SimRounds(specs, topic, models, {}, window_s=5.0, seed=3, fresh=False)
        done = run_fitting(fitting, rounds)
        placed = sorted(p for ps in done.assignment.values() for p in ps)
        assert placed == sorted(p.id for p in topic.publishers)
        totals.append(sum(done.rounds))
    assert totals[1] <= 2 < totals[0]


def test_fresh_rounds_draw_new_traffic() -> None:
    specs, _, topic = grouped_topic()
    model = paper()
    rounds = SimRounds(specs, topic, {"b": model}, {}, window_s=2.0, seed=1, fresh=True)
    from srtm.placement.fitting import Profile

    prof = [Profile("b", tuple(p.id for p in topic.publishers[:100]), 2.0)]
    a, b = rounds.measure(prof)["b"], rounds.measure(prof)["b"]
    assert a.samples > 0 and (a.p99_ms, a.samples) != (b.p99_ms, b.samples)


# -- the controller, model-assisted ----------------------------------------------------
async def fit_on_controller(predict: object) -> tuple[int, ...]:
    from srtm.control.actions import Action
    from srtm.control.fitting_run import fit_topic
    from srtm.control.state import Controller

    ctrl = Controller()
    for i in range(4):
        ctrl.register(f"b{i}", f"127.0.0.1:{4150 + i}", f"127.0.0.1:{4250 + i}", 110_000, 0.0)
    _, _, topic = grouped_topic(group=20, n=400)
    ctrl.create_topic(topic, "srtm", 0.0)
    capacity = 120  # the oracle's truth: p99 reaches the SLO at 120 publishers

    async def execute(actions: list[Action]) -> None:
        return None

    async def measure(broker: str, publishers: Sequence[str], window: float) -> RoundResult:
        return RoundResult(0.95 * len(publishers) / capacity, 10_000)

    def model(broker: str, held: Sequence[PublisherLoad], cands: Sequence[PublisherLoad]) -> int:
        return max(0, capacity - len(held))

    done = await fit_topic(
        ctrl, topic.name, execute, measure, window_s=1.0, min_samples=10, settle_s=0.0,
        predict=model if predict else None,
    )  # fmt: skip
    assert sorted(p for ps in done.assignment.values() for p in ps) == sorted(
        p.id for p in topic.publishers
    )
    assert ctrl.topics[topic.name].fitting is not None
    return done.rounds


async def test_the_controller_fits_with_a_model_in_one_round() -> None:
    plain = await fit_on_controller(None)
    assisted = await fit_on_controller(True)
    assert assisted == (1,) and sum(plain) > 2


def test_the_controller_builds_a_simulator_predictor() -> None:
    _, _, topic = grouped_topic(group=20, n=400)
    brokers = [BrokerCapacity("a", 110_000), BrokerCapacity("b", 110_000, 60_000.0)]
    predictor = predictor_for_topic(topic, brokers, "paper", duration_s=3.0)
    cands = balanced_order(topic.publishers)
    idle, busy = predictor("a", [], cands), predictor("b", [], cands)
    assert idle is not None and busy is not None and busy <= idle


def test_the_controllers_predictor_simulates_its_draw_within_an_envelope_that_fits_it() -> None:
    """The controller knows a topic by rates and groups and draws Poisson events; a bucket
    profiled on the topic's periodic traffic is too shallow for that draw, and token
    waits alone made every prediction miss (Table I live kept no publisher anywhere).
    The simulated topic gets the burst its own draw needs (``envelope_for``)."""
    specs = homogeneous(300, process="periodic", batch=1, group_size=5, rate=1.0)
    b = profile_bucket(generate(specs, 10.0, seed=3).t_ns)
    topic = topic_of(specs, b, 20.0)
    one = [BrokerCapacity("1", 600.0)]
    model = paper().emulated(1000.0)  # a 1-ms server per message, as Table I live's brokers
    predictor = predictor_for_topic(topic, one, model, duration_s=10.0)
    sim = predictor.sims["1"]
    assert sim.topic.burst > topic.burst  # the Poisson draw needed a deeper bucket
    assert sim.topic.burst == required_burst(sim.trace.t_ns, topic.rate, 0.99)
    cands = balanced_order(topic.publishers)
    assert predictor("1", [], cands) == len(cands)
    # With the profiled burst as it was, the draw's token waits alone break the SLO.
    shallow = BrokerSim(sim.trace, topic, model, seed=1)
    assert shallow.p99([p.id for p in cands])[0] > 2 * topic.slo_p99_ms


def test_an_envelope_deep_enough_already_is_kept() -> None:
    _, trace, topic = grouped_topic()
    need = required_burst(trace.t_ns, topic.rate, 0.99)
    deep = replace(topic, burst=need + 5)
    assert envelope_for(deep, trace) is deep
    assert envelope_for(replace(topic, burst=need / 2), trace).burst == need
