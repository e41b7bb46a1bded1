"""The utility optimizer and rate control in the controller, pure: a topic's utility spec,
the problem built from the controller's state, a run's rates and admission orders, and
rate control (hypothesis: bounded, monotone in congestion)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.control.actions import SetBucket, phases
from srtm.control.documents import NewTopic, TopicChange, parse
from srtm.control.model import Resources
from srtm.control.state import ControlError, Controller
from srtm.control.utility import (
    DEFAULT_COST_MODEL,
    UtilityControl,
    UtilitySettings,
    congestion,
    topic_costs,
)
from srtm.utility import ConsumerClass, FlowKind, FlowSpec, Problem, Utility, optimize
from srtm.utility.cluster import (
    FlowCosts,
    TopicInput,
    build_problem,
    parse_topic_utility,
    with_costs,
)
from srtm.utility.ratecontrol import (
    RateControlSettings,
    broker_use,
    control_step,
    pressure,
    step_rate,
)
from support import registered, topic_of

GOLD_SILVER: dict[str, Any] = {
    "kind": "one-to-many", "r_min": 10, "r_max": 200,
    "classes": [
        {"name": "gold", "available": 50, "utility": {"slope": 100}},
        {"name": "silver", "available": 100, "utility": {"slope": 10}},
    ],
}  # fmt: skip


def _controller(spec: dict[str, Any] | None = GOLD_SILVER, brokers: int = 2) -> Controller:
    c = registered(brokers)
    c.create_topic(topic_of(2 * brokers, rate=50.0), "lb", 0, utility=spec)
    return c


# -- the spec ----------------------------------------------------------------------------
def test_a_spec_is_a_flow_without_name_and_brokers() -> None:
    flow = parse_topic_utility(GOLD_SILVER, "t")
    assert flow.name == "t" and flow.kind is FlowKind.ONE_TO_MANY
    assert [c.name for c in flow.classes] == ["gold", "silver"]
    with pytest.raises(ValueError, match="name and brokers come from the topic"):
        parse_topic_utility({**GOLD_SILVER, "brokers": ["b0"]}, "t")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({**GOLD_SILVER, "kind": "many"}, "utility.kind must be one of"),
        ({**GOLD_SILVER, "cost": {"disk": 1}}, "utility.cost.disk: no broker has a capacity"),
        (
            {**GOLD_SILVER, "classes": [{"name": "g", "available": -1, "utility": {"slope": 1}}]},
            "utility.classes[0].available must be an integer >= 0",
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    doc = {"name": "t", "slo_p99_ms": 5, "burst": 10, "publishers": [{"id": "p", "rate": 1}]}
    with pytest.raises(ControlError, match=message.replace("[", r"\[")):
        parse(NewTopic, doc | {"utility": spec})
    with pytest.raises(ControlError, match=message.replace("[", r"\[")):
        parse(TopicChange, {"utility": spec})
    assert parse(TopicChange, {"utility": None}).model_fields_set == {"utility"}


def test_the_spec_is_saved_with_the_topic_and_shown() -> None:
    c = _controller()
    doc = c.to_json()
    back = Controller()
    back.restore(doc, 0)
    assert back.topics["t"].utility.doc == GOLD_SILVER
    assert back.topic_doc("t")["utility"] == GOLD_SILVER
    c.set_utility("t", None)
    assert c.topic_doc("t")["utility"] is None


def test_the_spec_is_parsed_once_where_it_enters() -> None:
    c = _controller()
    flow = c.topics["t"].utility.flow
    assert flow == parse_topic_utility(GOLD_SILVER, "t")
    assert UtilityControl().build(c).flows[0].classes[0].name == "gold"
    # A caller past the API gets the API's refusal; the spec it had stays.
    with pytest.raises(ControlError, match=r"utility\.kind must be one of") as refused:
        c.set_utility("t", {**GOLD_SILVER, "kind": "many"})
    assert refused.value.status == 400 and c.topics["t"].utility.flow is flow


def test_a_saved_spec_this_version_cannot_read_is_kept_but_not_optimized() -> None:
    doc = _controller().to_json()
    odd = {**GOLD_SILVER, "kind": "many"}
    doc["topics"][0]["utility"] = odd
    back = Controller()
    back.restore(doc, 0)
    assert back.topics["t"].utility.flow is None
    assert back.topic_doc("t")["utility"] == odd
    assert back.to_json()["topics"][0]["utility"] == odd
    assert UtilityControl().build(back).flows == ()


# -- the problem -------------------------------------------------------------------------
def test_costs_the_spec_leaves_out_come_from_the_cost_model() -> None:
    flow = parse_topic_utility({**GOLD_SILVER, "cost": {"cpu": 0.5}}, "t")
    costs = FlowCosts({"cpu": 1e-5, "network": 0.0}, {"cpu": 2e-6, "network": 134.0})
    out = with_costs(flow, costs)
    assert out.cost == {"cpu": 0.5, "network": 0.0}  # the operator's cpu kept
    assert all(c.cost == {"cpu": 2e-6, "network": 134.0} for c in out.classes)
    reader = {"kind": "one-to-one", "utility": {"points": [[1, 0], [5, 4]]}}
    one = with_costs(parse_topic_utility(reader, "o"), costs)
    assert one.cost == pytest.approx({"cpu": 1.2e-5, "network": 134.0})  # its one reader


def test_the_problem_takes_shares_from_the_plan_and_available_from_demand() -> None:
    flow = parse_topic_utility(GOLD_SILVER, "t")
    costs = topic_costs(DEFAULT_COST_MODEL, 100, "t")
    demand = {"b0": {"gold": 70, "silver": 3}, "b1": {"gold": 20}}
    inputs = [
        TopicInput(flow, {"b0": 30.0, "b1": 10.0}, demand, costs),
        TopicInput(parse_topic_utility(GOLD_SILVER, "gone"), {"b9": 5.0}, {}, costs),
    ]
    p = build_problem(inputs, {"b0": {"cpu": 0.8}, "b1": {"cpu": 0.8}})
    assert [f.name for f in p.flows] == ["t"]  # a topic on no broker up is left out
    (f,) = p.flows
    assert f.shares == pytest.approx({"b0": 0.75, "b1": 0.25})
    # The most any broker reports (a subscriber reads every broker), capped by the spec.
    assert {c.name: c.available for c in f.classes} == {"gold": 50, "silver": 3}


def test_a_run_sets_the_rate_and_the_admitted_counts_on_every_broker() -> None:
    c = _controller()
    for b in ("b0", "b1"):
        c.brokers[b].demand = {"t": {"gold": 60, "silver": 200}}
    u = UtilityControl(UtilitySettings(cpu_capacity=0.8, egress_max=125e6))
    problem = u.build(c)
    alloc = optimize(problem)
    actions, orders = u.apply(c, problem, alloc, 7.0)
    rate = alloc.rates["t"]
    assert c.topics["t"].spec.rate == pytest.approx(rate)
    assert math.fsum(p.rate for p in c.topics["t"].buckets.values()) == pytest.approx(rate)
    assert {a.broker for a in actions if isinstance(a, SetBucket)} <= {"b0", "b1"}
    assert sorted(b for b, _, _ in orders) == ["b0", "b1"]
    body = orders[0][2]
    assert body["order"] == ["gold", "silver"]
    assert body["classes"]["gold"] == alloc.admitted[("t", "gold")] == 50
    doc = u.doc()
    assert doc["t_s"] == 7.0 and doc["flows"][0]["name"] == "t"
    assert c.topic_doc("t")["allocation"]["admitted"] == body["classes"]
    # Rate control moves it from there; not once its spec is removed.
    assert u.control(c) == []  # uncongested at r_max: nowhere to go
    c.brokers["b0"].resources = Resources.from_json({"congested": {"cpu": True, "network": False}})
    assert u.control(c) and c.topics["t"].spec.rate < rate
    c.set_utility("t", None)
    assert u.control(c) == []


def test_an_empty_run_is_shown() -> None:
    c = registered(1)
    u = UtilityControl()
    problem = u.build(c)
    assert problem.flows == ()
    assert u.apply(c, problem, optimize(problem), 3.0) == ([], [])
    assert u.doc() == {"t_s": 3.0, "feasible": True, "total_utility": 0.0, "flows": []}
    assert UtilityControl().doc()["t_s"] is None


def test_set_rate_scales_the_shares_and_shrinks_before_it_grows() -> None:
    c = _controller(brokers=2)
    before = dict(c.topics["t"].buckets)
    actions = c.set_rate("t", c.topics["t"].spec.rate / 2)
    down, up = phases(actions)
    assert len(down) == 2 and not up
    for b, p in c.topics["t"].buckets.items():
        assert p.rate == pytest.approx(before[b].rate / 2)
        assert p.burst == pytest.approx(before[b].burst)
    assert c.set_rate("t", c.topics["t"].spec.rate) == []


def test_each_brokers_cost_model_is_corrected_by_its_measured_cpu() -> None:
    c = _controller()
    u = UtilityControl()
    for b, cpu in (("b0", 0.5), ("b1", 0.05)):
        channels = frozenset(f"c{i}" for i in range(10))
        c.report(b, 100.0, {"t": (1000.0, 0.0)}, 1.0, resources={"cpu": cpu},
                 demand={"t": {"gold": 40}}, carried={"t": channels})  # fmt: skip
    u.observe(c)
    u.observe(c)  # the same reports: no second correction
    # Predicted from the 10 channels (the 30 refused consumers in demand cost nothing):
    # 1000 · (23.7 + 10 · 6.4) µs = 0.0877 cores on each broker.
    assert u.broker_model("b0").scale == pytest.approx(1 + 0.2 * (0.5 / 0.0877 - 1))
    assert u.broker_model("b1").scale == pytest.approx(1 + 0.2 * (0.05 / 0.0877 - 1))
    shares = {"b0": 1.0, "b1": 3.0}
    scale = (u.broker_model("b0").scale + 3 * u.broker_model("b1").scale) / 4
    assert u.costs(c, "t", shares).per_message["cpu"] == pytest.approx(23.7e-6 * scale)


#: Costs the spec declares (the operator's: never corrected by measured CPU).
DECLARED: dict[str, Any] = {
    "kind": "one-to-many", "r_min": 10, "r_max": 200, "cost": {"cpu": 1e-3},
    "classes": [{"name": "gold", "available": 10, "utility": {"slope": 1},
                 "cost": {"cpu": 1e-4}}],
}  # fmt: skip


def _report(c: Controller, per_broker: float, cpu: float, hot: bool = False) -> None:
    for b in ("b0", "b1"):
        c.report(b, per_broker, {"t": (per_broker, 0.0)}, 1.0, demand={"t": {"gold": 10}},
                 resources={"cpu": cpu, "congested": {"cpu": hot, "network": False}})  # fmt: skip


def test_rate_control_judges_declared_costs_by_the_rates_carried_not_by_measured_cpu() -> None:
    c = _controller(DECLARED)
    u = UtilityControl(UtilitySettings(cpu_capacity=0.1, egress_max=125e6))
    _report(c, 25.0, cpu=0.01)
    problem = u.build(c)
    alloc = optimize(problem)
    u.apply(c, problem, alloc, 1.0)
    # Each broker carries half at (1e-3 + 10 · 1e-4) CPU-s a message: 0.1 at 100 msg/s.
    assert alloc.rates["t"] == pytest.approx(100)
    # From the topic's 220 the cut is paced, a quarter a step: 165, 123.75, then 100.
    assert c.topics["t"].spec.rate == pytest.approx(165)
    u.control(c)
    assert c.topics["t"].spec.rate == pytest.approx(123.75)
    u.control(c)
    assert c.topics["t"].spec.rate == pytest.approx(100) and not u.targets
    # At the plan, measuring 8 times the declared CPU but not over its own threshold:
    # full by the declared costs, so it holds; the model is not corrected.
    _report(c, 50.0, cpu=0.8)
    u.observe(c)
    assert congestion(c, problem, alloc.admitted) == ({}, {"b0": {"cpu"}, "b1": {"cpu"}})
    assert u.control(c) == [] and c.topics["t"].spec.rate == pytest.approx(100)
    assert u.build(c).flows[0].cost["cpu"] == 1e-3
    # Its producers send half their allowance: room by the declared costs, it rises.
    _report(c, 25.0, cpu=0.8)
    assert congestion(c, problem, alloc.admitted) == ({}, {})
    assert u.control(c) and c.topics["t"].spec.rate > 100
    # A broker flagging its real CPU is congested whatever the model says: it falls.
    rate = c.topics["t"].spec.rate
    _report(c, 25.0, cpu=0.9, hot=True)
    assert congestion(c, problem, alloc.admitted)[0] == {"b0": {"cpu"}, "b1": {"cpu"}}
    assert u.control(c) and c.topics["t"].spec.rate < rate


#: No cost declared: the cost model plans it, and its brokers' measured CPU judges it.
MODELLED: dict[str, Any] = {
    "kind": "one-to-many", "r_min": 10, "r_max": 200,
    "classes": [{"name": "gold", "available": 10, "utility": {"slope": 1}}],
}  # fmt: skip


def _load(c: Controller, cpu: float, background: float = 0.0) -> None:
    """Both brokers report the topic at 50 msg/s to 10 channels, ``cpu`` measured, and a
    topic without a utility spec at ``background`` msg/s to one channel."""
    for b in ("b0", "b1"):
        topics = {"t": (50.0, 0.0)} | ({"load": (background, 0.0)} if background else {})
        carried = {"t": frozenset(f"c{i}" for i in range(10))}
        if background:
            carried["load"] = frozenset({"c"})
        c.report(b, 50.0 + background, topics, 1.0, demand={"t": {"gold": 10}},
                 resources={"cpu": cpu}, carried=carried)  # fmt: skip


def test_rate_control_reacts_to_measured_cpu_when_no_cost_is_declared() -> None:
    c = _controller(MODELLED)
    u = UtilityControl(UtilitySettings(cpu_capacity=0.5, egress_max=125e6))
    _load(c, cpu=0.05)
    problem = u.build(c)
    alloc = optimize(problem)
    u.apply(c, problem, alloc, 1.0)
    assert alloc.rates["t"] == 200  # the model's cost is far below the capacity
    # The broker's real CPU over --cpu-capacity (not over its own 0.85 flag): congested
    # by its measurement, though the model says the topic costs a few per cent of it.
    _load(c, cpu=0.6)
    assert u.measured_cpu(c) == {"b0": 0.6, "b1": 0.6}
    over, _ = congestion(c, problem, alloc.admitted, u.measured_cpu(c), 0.5)
    assert over == {"b0": {"cpu"}, "b1": {"cpu"}}
    assert congestion(c, problem, alloc.admitted) == ({}, {})  # by the model: free
    assert u.control(c) and c.topics["t"].spec.rate < 200
    # Within 5 % of the capacity: full, it holds; well under it: it rises again.
    rate = c.topics["t"].spec.rate
    _load(c, cpu=0.49)
    assert u.control(c) == [] and c.topics["t"].spec.rate == rate
    _load(c, cpu=0.1)
    assert u.control(c) and c.topics["t"].spec.rate > rate


def test_a_declared_cpu_cost_keeps_a_broker_judged_by_the_plan() -> None:
    c = _controller(DECLARED)
    u = UtilityControl(UtilitySettings(cpu_capacity=0.5, egress_max=125e6))
    _load(c, cpu=0.6)
    assert u.measured_cpu(c) == {}
    assert not u.judged_by_measurement(c, "b0")


def test_cpu_spent_outside_the_optimizer_is_not_there_to_give() -> None:
    # Judged by the plan (declared costs): the unmanaged topic by the cost model.
    c = _controller(DECLARED)
    c.create_topic(topic_of(2, rate=50.0, name="load"), "lb", 0)
    u = UtilityControl(UtilitySettings(cpu_capacity=0.5, egress_max=125e6))
    _load(c, cpu=0.3, background=5000.0)
    # 5000 · (23.7 + 6.4) µs = 0.1505 cores a broker.
    background = 5000.0 * (23.7e-6 + 6.4e-6)
    assert u.background(c, c.brokers["b0"]) == pytest.approx(background)
    assert u.build(c).capacity["b0"]["cpu"] == pytest.approx(0.5 - background)
    # Judged by measurement: all the measured CPU the managed topics do not explain.
    c = _controller(MODELLED)
    _load(c, cpu=0.3, background=5000.0)
    managed = 50.0 * (23.7e-6 + 10 * 6.4e-6)
    assert u.background(c, c.brokers["b0"]) == pytest.approx(0.3 - managed)
    assert u.build(c).capacity["b0"]["cpu"] == pytest.approx(0.5 - 0.3 + managed)


def test_an_optimizer_cut_is_paced_and_a_rise_is_not() -> None:
    u = UtilityControl()
    assert u.paced("t", 400, 20) == 300 and u.targets == {"t": 20}
    assert u.paced("t", 300, 350) == 350 and u.targets == {}
    assert u.paced("t", 100, 90) == 90 and u.targets == {}


# -- rate control ------------------------------------------------------------------------
def _flow(name: str, r_min: float, r_max: float, shares: dict[str, float]) -> FlowSpec:
    gold = ConsumerClass("gold", Utility.linear(10, r_min, r_max), 10, {"cpu": 1e-4})
    return FlowSpec(
        name, FlowKind.ONE_TO_MANY, r_min, r_max, {"cpu": 1e-3}, shares, classes=(gold,)
    )


CAP = {"b0": {"cpu": 1.0}, "b1": {"cpu": 1.0}}


def test_uncongested_flows_rise_and_congested_ones_fall() -> None:
    f = _flow("t", 10, 110, {"b0": 1.0})
    admitted = {("t", "gold"): 10}
    assert step_rate(f, 50, admitted, CAP, {}) == pytest.approx(55)  # 5 % of the range
    assert step_rate(f, 50, {}, CAP, {}) == 50  # no consumer admitted: no marginal utility
    assert step_rate(f, 110, admitted, CAP, {}) == 110  # at r_max
    # load = (1e-3 + 10·1e-4)·50 / 1 = 0.1 of the CPU: 10 % down.
    assert step_rate(f, 50, admitted, CAP, {"b0": frozenset({"cpu"})}) == pytest.approx(45)
    assert step_rate(f, 50, admitted, CAP, {"b1": frozenset({"cpu"})}) > 50  # not its broker
    small = {"b0": {"cpu": 0.01}}  # load > 1: a step takes the most, a quarter
    assert step_rate(f, 20, admitted, small, {"b0": frozenset({"cpu"})}) == 15
    assert step_rate(f, 12, admitted, small, {"b0": frozenset({"cpu"})}) == 10  # not below r_min


def test_use_by_the_costs_and_the_band_around_the_capacity() -> None:
    flows = (_flow("a", 10, 110, {"b0": 1.0}), _flow("b", 10, 110, {"b0": 0.5, "b1": 0.5}))
    n = {("a", "gold"): 10, ("b", "gold"): 0}
    use = broker_use(flows, {"a": {"b0": 300.0}, "b": {"b0": 100.0, "b1": 100.0}}, n)
    # a: (1e-3 + 10·1e-4)·300 = 0.6; b, no consumer admitted: 1e-3·100 = 0.1 on each.
    assert use == {"b0": {"cpu": pytest.approx(0.7)}, "b1": {"cpu": pytest.approx(0.1)}}
    caps = {"b0": {"cpu": 0.7}, "b1": {"cpu": 0.1}}
    assert pressure(use, caps) == ({}, {"b0": {"cpu"}, "b1": {"cpu"}})  # at capacity: full
    assert pressure({"b0": {"cpu": 0.67}}, caps) == ({}, {"b0": {"cpu"}})  # within 5 %
    assert pressure({"b0": {"cpu": 0.67}}, caps, band=0.01) == ({}, {})
    assert pressure({"b0": {"cpu": 0.74}}, caps) == ({"b0": {"cpu"}}, {})
    assert pressure({"b0": {"cpu": 9.0, "disk": 9.0}}, {"b0": {}}) == ({}, {})  # no capacity


def test_a_flow_on_a_full_broker_holds() -> None:
    f = _flow("t", 10, 110, {"b0": 0.5, "b1": 0.5})
    admitted = {("t", "gold"): 10}
    full = {"b1": frozenset({"cpu"})}
    assert step_rate(f, 50, admitted, CAP, {}, full=full) == 50
    assert step_rate(f, 50, admitted, CAP, {}, full={"b2": frozenset({"cpu"})}) > 50
    # Congested wins over full: it falls.
    assert step_rate(f, 50, admitted, CAP, {"b0": frozenset({"cpu"})}, full=full) < 50


_rates = st.floats(0, 500, allow_nan=False)
_congestion = st.dictionaries(
    st.sampled_from(["b0", "b1"]), st.frozensets(st.sampled_from(["cpu", "network"]))
)


@settings(max_examples=300, deadline=None)
@given(
    r_min=st.floats(0, 100), span=st.floats(0, 400), rate=_rates, share=st.floats(0, 1),
    admitted=st.integers(0, 10), hot=_congestion, more=_congestion,
    up=st.floats(0, 1), down=st.floats(0, 5), cap=st.floats(0, 1),
)  # fmt: skip
def test_rate_control_is_bounded_and_monotone_in_congestion(
    r_min: float, span: float, rate: float, share: float, admitted: int,
    hot: dict[str, frozenset[str]], more: dict[str, frozenset[str]],
    up: float, down: float, cap: float,
) -> None:  # fmt: skip
    f = _flow("t", r_min, r_min + span, {"b0": share, "b1": 1 - share})
    s = RateControlSettings(up, down, cap)
    n = {("t", "gold"): admitted}
    caps = {"b0": {"cpu": 0.8, "network": 1e6}, "b1": {"cpu": 0.5, "network": 1e6}}
    worse = {b: hot.get(b, frozenset()) | more.get(b, frozenset()) for b in {*hot, *more}}
    now = min(max(rate, f.r_min), f.r_max)
    calm = step_rate(f, rate, n, caps, {}, s)
    some = step_rate(f, rate, n, caps, hot, s)
    most = step_rate(f, rate, n, caps, worse, s)
    held = step_rate(f, rate, n, caps, {}, s, full=hot)
    for r in (calm, some, most, held):
        assert f.r_min <= r <= f.r_max
    assert calm >= now  # never falls uncongested
    assert held == (now if any(hot.get(b) for b, x in f.shares.items() if x > 0) else calm)
    if any(worse.get(b) for b, x in f.shares.items() if x > 0):
        assert most <= now  # never rises on a congested broker
    assert calm >= some >= most  # more congestion never gives a higher rate


def test_control_step_moves_every_flow_of_the_last_run() -> None:
    flows = (_flow("a", 10, 110, {"b0": 1.0}), _flow("b", 10, 110, {"b1": 1.0}))
    p = Problem(flows, CAP)
    n = {("a", "gold"): 10, ("b", "gold"): 10}
    out = control_step(p, {"a": 50, "b": 50}, n, {"b1": frozenset({"cpu"})})
    assert out["a"] > 50 > out["b"]


def test_an_infeasible_run_sets_r_min_and_leaves_admission_alone() -> None:
    c = _controller(MODELLED)
    u = UtilityControl(UtilitySettings(cpu_capacity=0.2, egress_max=125e6))
    # Judged by measurement, a broker pushed past its budget by what the optimizer does
    # not allocate has no capacity left: even r_min does not fit.
    _load(c, cpu=0.5)
    problem = u.build(c)
    assert problem.capacity["b0"]["cpu"] == 0
    alloc = optimize(problem)
    assert not alloc.feasible
    _, orders = u.apply(c, problem, alloc, 1.0)
    assert orders == []
    assert u.targets == {"t": 10.0}  # on its way to r_min, a quarter a step
