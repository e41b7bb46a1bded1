"""The utility model, MVA, and the greedy optimizer against the paper's numbers
(Bhola et al., seed 002) and against properties every allocation must have."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from srtm.cli import app
from srtm.utility import (
    ConsumerClass,
    FlowKind,
    FlowSpec,
    Problem,
    RequestResponse,
    Utility,
    mva_response_time,
    optimize,
    parse_problem,
    total_utility,
    usage,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "utility-trading-day.json"
PAPER_RR = RequestResponse(clients=20, think_s=0.1, exec_s=0.008, deadline_s=0.5, c=6000)
runner = CliRunner()


def closed_form_rt(clients: int, think_s: float, exec_s: float, servers: int) -> float:
    """The same closed network solved directly (the machine-repairman chain, product form):
    p(k) ∝ N!/(N−k)! · (S/Z)^k / Π_{i≤k} min(i, m); X = (N − E[k]) / Z; T_rt = N/X − Z."""
    logs = [
        math.lgamma(clients + 1) - math.lgamma(clients - k + 1) + k * math.log(exec_s / think_s)
        - sum(math.log(min(i, servers)) for i in range(1, k + 1))
        for k in range(clients + 1)
    ]  # fmt: skip
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    busy = sum(k * w for k, w in enumerate(weights)) / sum(weights)
    return clients / ((clients - busy) / think_s) - think_s


# --- the paper's numbers -------------------------------------------------------------


def test_the_papers_request_response_example() -> None:
    assert PAPER_RR.r_min == pytest.approx(33.33, abs=0.005)
    assert PAPER_RR.r_max == pytest.approx(203.70, abs=0.005)
    assert [PAPER_RR.mva(m).rate for m in (1, 2, 3)] == [125.0, 250.0, 375.0]
    u = PAPER_RR.utility()
    assert u.value(PAPER_RR.r_max) == pytest.approx(5904.0)  # C·(1 − T_exec/D)
    assert u.value(PAPER_RR.r_min) == 0.0
    assert u.value(1e6) == pytest.approx(5904.0)  # flat above r_max


def test_request_response_curve_is_monotone_and_interpolates_t_rt() -> None:
    pts = PAPER_RR.points()
    assert [round(p.rate, 2) for p in pts] == [33.33, 125.0, 203.7]
    assert all(a.t_rt_s > b.t_rt_s and a.utility < b.utility for a, b in itertools.pairwise(pts))
    mid = (pts[0].rate + pts[1].rate) / 2
    assert PAPER_RR.t_rt(mid) == pytest.approx((pts[0].t_rt_s + pts[1].t_rt_s) / 2)


def test_a_deadline_below_the_execution_time_is_refused() -> None:
    with pytest.raises(ValueError, match="deadline must exceed"):
        RequestResponse(20, 0.1, 0.008, 0.005, 6000)


# --- MVA -----------------------------------------------------------------------------


def test_one_client_never_queues() -> None:
    assert mva_response_time(1, 0.1, 0.008, 1) == pytest.approx(0.008)
    assert mva_response_time(1, 0.0, 0.5, 3) == pytest.approx(0.5)


def test_as_many_servers_as_clients_never_queue() -> None:
    assert mva_response_time(7, 0.05, 0.01, 7) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("clients", "servers"), [(2, 1), (5, 2), (20, 1), (20, 2), (20, 3), (40, 4)]
)
def test_mva_equals_the_closed_form(clients: int, servers: int) -> None:
    got = mva_response_time(clients, 0.1, 0.008, servers)
    assert got == pytest.approx(closed_form_rt(clients, 0.1, 0.008, servers), rel=1e-9)


def test_mva_stays_close_to_the_closed_form_at_a_thousand_clients() -> None:
    # The recursion's p(0 | n) = 1 − Σ loses digits deep in saturation: documented bound.
    got = mva_response_time(1000, 0.1, 0.008, 30)
    assert got == pytest.approx(closed_form_rt(1000, 0.1, 0.008, 30), rel=1e-3)


def test_saturated_single_server_approaches_n_over_r_minus_think() -> None:
    assert mva_response_time(20, 0.1, 0.008, 1) == pytest.approx(20 / 125 - 0.1, rel=0.05)


# --- piecewise-linear utility ----------------------------------------------------------


def test_piecewise_linear_value_and_slope() -> None:
    u = Utility(((10.0, 0.0), (20.0, 100.0), (40.0, 150.0)))
    assert (u.r_min, u.r_max) == (10.0, 40.0)
    assert u.value(5) == 0.0 and u.value(15) == 50.0 and u.value(30) == 125.0
    assert u.value(99) == 150.0
    assert u.slope(10) == 10.0 and u.slope(20) == 2.5 and u.slope(40) == 0.0


@pytest.mark.parametrize(
    "points", [(), ((10.0, 5.0), (10.0, 6.0)), ((10.0, 5.0), (20.0, 4.0)), ((-1.0, 0.0),)]
)
def test_bad_utilities_are_refused(points: tuple[tuple[float, float], ...]) -> None:
    with pytest.raises(ValueError):
        Utility(points)


# --- the optimizer: the paper's trading day ----------------------------------------------

A_BE, B_BE = 0.00146092, 0.00103146  # the paper's best-effort one-to-many constants


def trading_day(gold: int, silver: int, bronze: int, cpu: float = 100.0) -> Problem:
    flows = []
    for i in range(4):
        classes = tuple(
            ConsumerClass(name, Utility.linear(slope, 10, 200), count, {"cpu": B_BE})
            for name, slope, count in (("gold", 100, gold), ("silver", 10, silver),
                                       ("bronze", 1, bronze))
        )  # fmt: skip
        flows.append(
            FlowSpec(f"f{i}", FlowKind.ONE_TO_MANY, 10, 200, {"cpu": A_BE}, {"b": 1.0},
                     None, classes)
        )  # fmt: skip
    return Problem(tuple(flows), {"b": {"cpu": cpu}})


def admitted(problem: Problem, cls: str) -> int:
    alloc = optimize(problem)
    return sum(n for (_, c), n in alloc.admitted.items() if c == cls)


def test_trading_day_admits_gold_then_silver_then_bronze_at_full_rate() -> None:
    start = optimize(trading_day(50, 100, 200))
    gold = sum(n for (_, c), n in start.admitted.items() if c == "gold")
    silver = sum(n for (_, c), n in start.admitted.items() if c == "silver")
    bronze = sum(n for (_, c), n in start.admitted.items() if c == "bronze")
    assert gold == 200  # always admitted
    assert 0 < silver < 400 and bronze == 0  # capacity runs out within silver
    assert all(r == 200 for r in start.rates.values())  # rate stays at r_max
    coffee = optimize(trading_day(5, 25, 200))  # higher classes all in, then bronze
    assert sum(n for (_, c), n in coffee.admitted.items() if c != "bronze") == 120
    assert 0 < sum(n for (_, c), n in coffee.admitted.items() if c == "bronze") < 800
    assert all(r == 200 for r in coffee.rates.values())


def test_trading_day_lowers_the_rate_when_only_bronze_is_left() -> None:
    end = optimize(trading_day(0, 0, 200))
    assert sum(end.admitted.values()) == 800
    rates = list(end.rates.values())
    assert 10 < rates[0] < 200 and rates == [rates[0]] * 4  # lowered, and fair among equals


def test_excess_capacity_goes_to_every_flow_equally() -> None:
    flows = tuple(
        FlowSpec(f"f{i}", FlowKind.ONE_TO_ONE, 10, 200, {"cpu": 1.0}, {"b": 1.0},
                 Utility.linear(1, 10, 200))
        for i in range(4)
    )  # fmt: skip
    alloc = optimize(Problem(flows, {"b": {"cpu": 560.0}}))
    assert list(alloc.rates.values()) == pytest.approx([140.0] * 4)


def test_minimum_rates_over_capacity_are_reported_infeasible() -> None:
    alloc = optimize(trading_day(50, 100, 200, cpu=0.01))
    assert not alloc.feasible
    assert all(r == 10 for r in alloc.rates.values()) and not any(alloc.admitted.values())


def test_the_request_response_flow_gives_way_to_many_gold_consumers() -> None:
    def problem(consumers: int) -> Problem:
        gold = ConsumerClass("gold", Utility.linear(100, 10, 200), consumers, {"cpu": B_BE})
        be = FlowSpec("be", FlowKind.ONE_TO_MANY, 10, 200, {"cpu": A_BE}, {"b": 1.0}, None,
                      (gold,))  # fmt: skip
        rr = FlowSpec("rr", FlowKind.REQUEST_RESPONSE, PAPER_RR.r_min, PAPER_RR.r_max,
                      {"cpu": 0.1347943}, {"b": 1.0}, PAPER_RR.utility())  # fmt: skip
        return Problem((be, rr), {"b": {"cpu": 200.0}})

    few, many = optimize(problem(200)), optimize(problem(1000))
    assert few.rates["rr"] == pytest.approx(PAPER_RR.r_max)
    assert many.rates["rr"] < few.rates["rr"]
    assert many.admitted[("be", "gold")] > few.admitted[("be", "gold")]


# --- the optimizer: properties ---------------------------------------------------------


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    brokers = [f"b{i}" for i in range(draw(st.integers(1, 2)))]
    resources = ["cpu", "net"][: draw(st.integers(1, 2))]
    capacity = {b: {r: draw(st.floats(1.0, 500.0)) for r in resources} for b in brokers}
    coef = st.floats(0.0, 0.05)
    flows = []
    for i in range(draw(st.integers(1, 3))):
        r_min = draw(st.floats(0.0, 20.0))
        r_max = r_min + draw(st.floats(1.0, 200.0))
        on = draw(st.sampled_from([[b] for b in brokers] + [brokers]))
        shares = {b: 1.0 / len(on) for b in on}
        cost = {r: draw(coef) for r in resources}
        kind = draw(st.sampled_from([FlowKind.ONE_TO_ONE, FlowKind.ONE_TO_MANY]))
        if kind is FlowKind.ONE_TO_ONE:
            mid = r_min + draw(st.floats(0.1, 0.9)) * (r_max - r_min)
            u0 = draw(st.floats(0.0, 10.0))
            u1 = u0 + draw(st.floats(0.0, 100.0))
            u = Utility(((r_min, u0), (mid, u1), (r_max, u1 + draw(st.floats(0.0, 100.0)))))
            flows.append(FlowSpec(f"f{i}", kind, r_min, r_max, cost, shares, u))
        else:
            classes = tuple(
                ConsumerClass(
                    f"c{j}",
                    Utility.linear(draw(st.floats(0.0, 100.0)), r_min, r_max),
                    draw(st.integers(0, 50)),
                    {r: draw(coef) for r in resources},
                )
                for j in range(draw(st.integers(1, 3)))
            )
            flows.append(FlowSpec(f"f{i}", kind, r_min, r_max, cost, shares, None, classes))
    return Problem(tuple(flows), capacity)


def scaled(problem: Problem, factor: float) -> Problem:
    caps = {b: {r: c * factor for r, c in rs.items()} for b, rs in problem.capacity.items()}
    return Problem(problem.flows, caps)


@settings(max_examples=300, deadline=None)
@given(problems())
def test_an_allocation_keeps_every_constraint(problem: Problem) -> None:
    alloc = optimize(problem)
    for flow in problem.flows:
        assert flow.r_min <= alloc.rates[flow.name] <= flow.r_max
        for c in flow.classes:
            assert 0 <= alloc.admitted[(flow.name, c.name)] <= c.available
    if alloc.feasible:
        for (b, r), used in usage(problem, alloc.rates, alloc.admitted).items():
            assert used <= problem.capacity[b][r] * (1 + 1e-6) + 1e-9, (b, r)
    assert alloc.utility == pytest.approx(total_utility(problem, alloc.rates, alloc.admitted))


@settings(max_examples=100, deadline=None)
@given(problems())
def test_the_optimizer_is_deterministic(problem: Problem) -> None:
    assert optimize(problem) == optimize(problem)


# The greedy is not monotone in capacity (the problem below), so this is a check on a
# fixed sample of 300 problems, the same in every run: a random search would sooner or
# later draw a problem like that one and fail a run for what is known and documented.
@settings(max_examples=300, deadline=None, derandomize=True)
@given(problems(), st.floats(1.0, 4.0))
def test_more_capacity_seldom_lowers_utility(problem: Problem, factor: float) -> None:
    small, large = optimize(problem), optimize(scaled(problem, factor))
    if small.feasible:
        assert large.utility >= small.utility * (1 - 1e-9) - 1e-9


def test_more_capacity_can_lower_the_greedys_utility() -> None:
    """The greedy's myopia (docs/utility.md): with room to spare it admits two more
    consumers of ``paid`` (benefit/cost 3.11) before raising ``alerts`` through its flat
    first segment (3.05); its steep second segment (85) then no longer fits. With less
    room ``paid`` stops at 5 and ``alerts`` gets to 21."""

    def problem(cpu: float) -> Problem:
        free = ConsumerClass("free", Utility(((1.0, 1.0), (129.0, 129.0))), 1, {"cpu": 0.0})
        paid = ConsumerClass(
            "paid", Utility(((1.0, 0.109375), (129.0, 14.109375))), 7, {"cpu": 0.03515625}
        )
        sensors = FlowSpec(
            "sensors", FlowKind.ONE_TO_MANY, 1.0, 129.0, {"cpu": 0.0}, {"b0": 1.0}, None,
            (free, paid),
        )  # fmt: skip
        alerts = FlowSpec(
            "alerts", FlowKind.ONE_TO_ONE, 0.0, 21.0, {"cpu": 0.03125}, {"b0": 1.0},
            Utility(((0.0, 0.0), (10.5, 1.0), (21.0, 29.0))),
        )  # fmt: skip
        return Problem((sensors, alerts), {"b0": {"cpu": cpu}})

    small, large = optimize(problem(25.5)), optimize(problem(25.5 * 1.25))
    assert (small.admitted[("sensors", "paid")], small.rates["alerts"]) == (5, 21.0)
    assert large.admitted[("sensors", "paid")] == 7 and large.rates["alerts"] < 5
    assert large.utility < small.utility


# --- the document ------------------------------------------------------------------------


def test_the_example_parses() -> None:
    problem = parse_problem(json.loads(EXAMPLE.read_text()))
    assert [f.kind for f in problem.flows].count(FlowKind.ONE_TO_MANY) == 4


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["flows"][0].pop("r_max"), "flows[0]: a one-to-many flow needs r_min"),
        (lambda d: d["flows"][0]["classes"][1].update(available=-1), "classes[1].available"),
        (lambda d: d["flows"][4]["rr"].update(exec_ms="x"), "flows[4].rr.exec_ms must be a"),
        (lambda d: d["flows"][1]["cost"].update(disk=1), "flows[1].cost.disk: no broker has"),
        (lambda d: d["flows"][2].update(kind="many"), "flows[2].kind must be one of"),
        (lambda d: d["brokers"].append({"id": "b2"}), "flows[0].brokers is required"),
    ],
)  # fmt: skip
def test_bad_documents_name_the_field(mutate: object, message: str) -> None:
    doc = json.loads(EXAMPLE.read_text())
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(ValueError) as info:
        parse_problem(doc)
    assert message in str(info.value)


# --- the command line --------------------------------------------------------------------

RR_ARGS = ["utility", "rr", "--clients", "20", "--think-ms", "100", "--exec-ms", "8",
           "--deadline-ms", "500", "--c", "6000"]  # fmt: skip


def test_cli_rr_json_gives_the_papers_range() -> None:
    result = runner.invoke(app, [*RR_ARGS, "--servers", "3", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert round(doc["r_min"], 2) == 33.33 and round(doc["r_max"], 2) == 203.70
    assert set(doc["points"][0]) == {"rate", "t_rt_ms", "utility"}
    assert doc["points"][-1]["utility"] == pytest.approx(5904.0)
    assert [m["rate"] for m in doc["mva"]] == [125.0, 250.0, 375.0]


def test_cli_rr_table() -> None:
    result = runner.invoke(app, RR_ARGS)
    assert result.exit_code == 0, result.output
    assert "r_min 33.33" in " ".join(result.output.split())


def test_cli_rr_bad_input_names_the_option() -> None:
    result = runner.invoke(app, [*RR_ARGS[:-2], "--c", "6000", "--deadline-ms", "4"])
    assert result.exit_code == 2
    assert "--deadline-ms" in result.output


def test_cli_optimize_json_on_the_example() -> None:
    result = runner.invoke(app, ["utility", "optimize", "--flows", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["feasible"] and doc["total_utility"] > 0
    gold = [c for f in doc["flows"] for c in f.get("classes", []) if c["name"] == "gold"]
    assert all(c["admitted"] == c["available"] for c in gold)
    assert all(u["used"] <= u["capacity"] * (1 + 1e-6) for u in doc["usage"])


def test_cli_optimize_table_and_help() -> None:
    result = runner.invoke(app, ["utility", "optimize", "--flows", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "total utility" in result.output and "gold" in result.output
    help_text = runner.invoke(app, ["utility", "optimize", "--help"], env={"COLUMNS": "200"})
    for option in ("--flows", "--rate-step", "--consumer-step", "--json"):
        assert option in help_text.output


def test_cli_optimize_bad_document_names_the_field(tmp_path: Path) -> None:
    doc = json.loads(EXAMPLE.read_text())
    doc["flows"][0]["classes"][0]["available"] = "many"
    path = tmp_path / "flows.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["utility", "optimize", "--flows", str(path)])
    assert result.exit_code == 2
    assert "flows[0].classes[0].available" in " ".join(result.output.split())


def test_cli_optimize_infeasible_exits_1(tmp_path: Path) -> None:
    doc = json.loads(EXAMPLE.read_text())
    doc["brokers"][0]["capacity"]["cpu"] = 0.01
    path = tmp_path / "flows.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["utility", "optimize", "--flows", str(path)])
    assert result.exit_code == 1
    assert "infeasible" in result.output
