"""The cost model (srtm.utility.cost): the fit recovers known A and B, the online
correction stays positive and bounded, the framing constants are the wire's and disk's,
and the costs feed the optimizer."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker.disk.codec import RECORD_OVERHEAD
from srtm.protocol import Fin, Mpub, Pub, encode_command
from srtm.protocol.frames import message, response
from srtm.utility import (
    ConsumerClass,
    CostModel,
    CostSample,
    FlowKind,
    FlowSpec,
    Problem,
    Utility,
    class_costs,
    correct,
    cost,
    fit_cost,
    flow_costs,
    optimize,
    usage,
)

RATES = (2_000.0, 5_000.0, 10_000.0)
CONSUMERS = (1, 4, 16)


def grid(model: CostModel, repeat: int = 1) -> list[CostSample]:
    pts = [CostSample(0.0, 0, model.idle_cpu)]
    for _ in range(repeat):
        pts += [CostSample(r, n, model.predict([(r, n)])) for r in RATES for n in CONSUMERS]
    return pts


models = st.builds(
    CostModel,
    a_cpu_s=st.floats(1e-7, 1e-4),
    b_cpu_s=st.floats(1e-8, 1e-5),
    idle_cpu=st.floats(0.0, 0.05),
)


@settings(max_examples=200, deadline=None)
@given(models)
def test_the_fit_recovers_a_and_b_from_noiseless_samples(model: CostModel) -> None:
    fit = fit_cost(grid(model))
    assert fit.model.a_cpu_s == pytest.approx(model.a_cpu_s, rel=1e-6)
    assert fit.model.b_cpu_s == pytest.approx(model.b_cpu_s, rel=1e-6, abs=1e-14)
    assert fit.model.idle_cpu == pytest.approx(model.idle_cpu, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.rms_residual < 1e-9


@settings(max_examples=100, deadline=None)
@given(
    st.floats(5e-6, 5e-5),
    st.floats(0.05, 0.5),
    st.floats(0.0, 0.05),
    st.integers(0, 2**32 - 1),
)
def test_the_fit_recovers_a_and_b_from_noisy_samples(
    a: float, b_over_a: float, idle: float, seed: int
) -> None:
    """2 % multiplicative noise on CPU, each grid point measured 5 times: A and B within
    15 % (B between 1/20 and 1/2 of A, so that both terms show in the CPU; over 1,500
    seeds the worst errors were 9 % for A and 7 % for B)."""
    model = CostModel(a, a * b_over_a, idle)
    rng = random.Random(seed)
    noisy = [
        CostSample(s.rate, s.consumers, s.cpu * (1 + rng.gauss(0, 0.02)))
        for s in grid(model, repeat=5)
    ]
    fit = fit_cost(noisy)
    assert fit.model.a_cpu_s == pytest.approx(a, rel=0.15)
    assert fit.model.b_cpu_s == pytest.approx(model.b_cpu_s, rel=0.15)
    assert 0.9 < fit.r2 <= 1.0
    assert fit.residuals(noisy) == pytest.approx(
        [s.cpu - fit.model.predict([(s.rate, s.consumers)]) for s in noisy]
    )


def test_one_consumer_count_cannot_separate_a_from_b() -> None:
    """The paper's warning: at one consumer count r and r·n are collinear."""
    model = CostModel(2e-5, 5e-6)
    one = [CostSample(r, 4, model.predict([(r, 4)])) for r in RATES]
    with pytest.raises(ValueError, match="two consumer counts"):
        fit_cost(one)
    with pytest.raises(ValueError, match="two rates"):
        fit_cost([CostSample(1000, n, model.predict([(1000, n)])) for n in CONSUMERS])


def test_a_negative_coefficient_is_held_at_zero_and_said() -> None:
    """Samples whose least-squares A is negative (the paper's low-rate-only fit): the fit
    keeps A at 0, says so, and is the best non-negative one."""
    samples = [
        CostSample(1000, 1, 0.010),
        CostSample(2000, 1, 0.018),
        CostSample(1000, 8, 0.080),
        CostSample(2000, 8, 0.170),
    ]
    fit = fit_cost(samples, idle=False)
    assert "a_cpu_s" in fit.held_at_zero
    assert fit.model.a_cpu_s == 0.0
    assert fit.model.b_cpu_s > 0

    # No non-negative (A, B) nearby does better.
    def ss(a: float, b: float) -> float:
        return math.fsum((s.cpu - a * s.rate - b * s.rate * s.consumers) ** 2 for s in samples)

    best = ss(0.0, fit.model.b_cpu_s)
    for da in (0.0, 1e-7, 1e-6):
        for db in (-1e-7, 0.0, 1e-7):
            assert ss(da, fit.model.b_cpu_s + db) >= best - 1e-15


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        fit_cost([CostSample(1, 1, math.nan), CostSample(2, 2, 1), CostSample(3, 1, 1)])
    with pytest.raises(ValueError, match=">= 0"):
        fit_cost([CostSample(-1, 1, 0.1), CostSample(2, 2, 1), CostSample(3, 1, 1)])


# == correction =========================================================================
anything = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=500, deadline=None)
@given(models, st.floats(0.25, 4.0), anything, anything, st.floats(0.01, 1.0))
def test_a_correction_is_never_negative_nor_beyond_its_bounds(
    model: CostModel, scale: float, measured: float, predicted: float, alpha: float
) -> None:
    start = CostModel(model.a_cpu_s, model.b_cpu_s, model.idle_cpu, scale=scale)
    out = correct(start, measured, predicted, alpha=alpha)
    lo, hi = cost.SCALE_BOUNDS
    assert lo <= out.scale <= hi
    assert out.a >= 0 and out.b() >= 0
    assert all(v >= 0 for v in flow_costs(out, 100, deliveries=3).values())
    assert (out.a_cpu_s, out.b_cpu_s, out.idle_cpu) == (
        model.a_cpu_s,
        model.b_cpu_s,
        model.idle_cpu,
    )


@settings(max_examples=200, deadline=None)
@given(models, st.floats(0.3, 3.5))
def test_repeated_corrections_converge_to_the_measured_ratio(
    model: CostModel, true_ratio: float
) -> None:
    """A broker that really costs ``true_ratio`` times the model: predicting with the
    corrected model each time, the scale converges to ``true_ratio`` (within bounds)."""
    loads = [(5_000.0, 4)]
    truth = CostModel(model.a_cpu_s * true_ratio, model.b_cpu_s * true_ratio, model.idle_cpu)
    m = model
    for _ in range(200):
        m = correct(m, truth.predict(loads), m.predict(loads), min_load=0.0)
    assert m.scale == pytest.approx(true_ratio, rel=1e-6)
    assert m.predict(loads) == pytest.approx(truth.predict(loads), rel=1e-6)


def test_a_correction_is_smoothed_clamped_and_skipped_at_low_load() -> None:
    m = CostModel(1e-5, 1e-6, idle_cpu=0.01)
    # Measured twice the load above idle: one step moves alpha of the way.
    assert correct(m, 0.01 + 0.2, 0.01 + 0.1).scale == pytest.approx(1.2)
    assert correct(m, 0.01 + 0.2, 0.01 + 0.1, alpha=1.0).scale == pytest.approx(2.0)
    # A measurement of 0 (a broker that stopped reporting CPU) cannot zero the model.
    m0 = m
    for _ in range(100):
        m0 = correct(m0, 0.0, m0.predict([(50_000, 4)]))
    assert m0.scale == cost.SCALE_BOUNDS[0]
    assert m0.a > 0
    # Too little load for the ratio to mean anything: unchanged.
    assert correct(m, 0.5, 0.01 + 0.001) is m
    assert correct(m, math.nan, 0.5) is m
    assert correct(m, -1.0, 0.5) is m
    with pytest.raises(ValueError, match="bounds"):
        correct(m, 0.5, 0.5, bounds=(0.0, 2.0))
    with pytest.raises(ValueError, match="alpha"):
        correct(m, 0.5, 0.5, alpha=0.0)


def test_a_model_refuses_negative_or_non_finite_coefficients() -> None:
    with pytest.raises(ValueError, match="a_cpu_s"):
        CostModel(-1e-6, 1e-6)
    with pytest.raises(ValueError, match="class_b"):
        CostModel(1e-6, 1e-6, class_b={"gold": math.inf})
    with pytest.raises(ValueError, match="scale"):
        CostModel(1e-6, 1e-6, scale=0.0)


# == costs for the optimizer ============================================================
def test_framing_constants_are_the_wire_and_disk_formats() -> None:
    body = b"x" * 100
    topic = "sector-0"
    assert len(encode_command(Pub(topic, body))) == 100 + cost.PUB_OVERHEAD_BYTES + len(topic)
    mpub = len(encode_command(Mpub(topic, [body] * 10)))
    assert mpub == 10 * (100 + cost.MPUB_PER_MESSAGE_BYTES) + cost.MPUB_OVERHEAD_BYTES + len(topic)
    assert len(encode_command(Fin(b"0" * 16))) == cost.FIN_BYTES
    assert len(message(0, 1, b"0" * 16, body)) == 100 + cost.MESSAGE_FRAME_BYTES
    assert len(response()) == cost.OK_RESPONSE_BYTES
    assert RECORD_OVERHEAD == cost.DISK_RECORD_BYTES


def test_flow_costs_count_the_fan_out() -> None:
    m = CostModel(2e-5, 5e-6, class_b={"gold": 8e-6}, scale=1.5)
    one = flow_costs(m, 200, topic="t", deliveries=1)
    assert one["cpu"] == pytest.approx(1.5 * (2e-5 + 5e-6))
    assert one["network_in"] == 200 + 9 + 1 + 21
    assert one["network_out"] == 10 + 200 + 34
    assert "storage" not in one
    batched = flow_costs(m, 200, topic="t", batch=10)
    assert batched["network_in"] == pytest.approx(200 + 4 + (14 + 1) / 10)
    reliable = flow_costs(m, 200, deliveries=2, reliable=True)
    assert reliable["storage"] == 3 * (64 + 200)
    assert class_costs(m, 200, "gold")["cpu"] == pytest.approx(1.5 * 8e-6)
    assert class_costs(m, 200, "bronze")["cpu"] == pytest.approx(1.5 * 5e-6)
    # The topic's CPU is the optimizer's A·r + Σ B_j·r·n_j.
    assert m.topic_cpu(100, {"gold": 2, "bronze": 3}) == pytest.approx(
        100 * (flow_costs(m, 200)["cpu"] + 2 * m.b("gold") + 3 * m.b("bronze"))
    )


def test_the_optimizer_keeps_the_modelled_cpu_within_the_broker() -> None:
    """A calibrated model fed to the optimizer: its CPU use is the model's prediction of
    the allocation, within the capacity the idle broker leaves."""
    m = CostModel(2e-5, 5e-6, idle_cpu=0.05)
    classes = tuple(
        ConsumerClass(name, Utility.linear(slope, 100, 10_000), 50, class_costs(m, 200, name))
        for name, slope in (("gold", 100.0), ("bronze", 1.0))
    )
    flow = FlowSpec(
        "quotes", FlowKind.ONE_TO_MANY, 100, 10_000, flow_costs(m, 200), {"b1": 1.0},
        classes=classes,
    )  # fmt: skip
    problem = Problem((flow,), {"b1": {"cpu": m.available_cpu(0.8)}})
    alloc = optimize(problem)
    admitted = {c.name: alloc.admitted[("quotes", c.name)] for c in classes}
    used = usage(problem, alloc.rates, alloc.admitted)[("b1", "cpu")]
    assert admitted["gold"] == 50
    assert used <= 0.75 * (1 + 1e-9)
    assert m.predict([(alloc.rates["quotes"], admitted)]) == pytest.approx(used + 0.05)


def test_the_calibration_document_round_trips() -> None:
    model = CostModel(2e-5, 5e-6, 0.01)
    fit = fit_cost(grid(model))
    doc = cost.cost_doc(fit)
    back = cost.model_from_doc(doc)
    assert back.a_cpu_s == pytest.approx(model.a_cpu_s)
    assert back.b_cpu_s == pytest.approx(model.b_cpu_s)
    with pytest.raises(ValueError, match="b_cpu_s_per_delivery"):
        cost.model_from_doc({"a_cpu_s_per_msg": 1e-5})
