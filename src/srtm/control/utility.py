"""The utility optimizer and rate control in the controller, without I/O: the problem
built from the controller's state (topics with a ``utility`` spec, their plans, what
brokers report), an allocation turned into rates and admission counts, and the rate
control step between runs. The service (``srtm.control.service``) runs ``optimize`` off
the event loop, carries the actions out and posts the admission counts.

What runs when (docs/utility.md, "In the controller"): every ``--utility-interval-s``
an optimizer run sets every such topic's rate and admitted counts; every
``--rate-control-interval-s`` in between, rate control moves the rates by the brokers'
congestion (``congestion``); the next run snaps them back to its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from srtm.control.actions import Action
from srtm.control.model import AllocationState, BrokerInfo
from srtm.control.state import Controller
from srtm.utility import cost
from srtm.utility.cluster import (
    FlowCosts,
    TopicInput,
    build_problem,
    flow_doc,
    run_doc,
    shares_of,
)
from srtm.utility.cost import CostModel
from srtm.utility.optimizer import Allocation, FlowKind, FlowSpec, Problem
from srtm.utility.ratecontrol import (
    RateControlSettings,
    broker_use,
    control_step,
    pressure,
)
from srtm.utility.storage import LatencyEstimate, rate_bound

#: The message size assumed for a topic no broker has reported bytes of yet.
DEFAULT_MESSAGE_BYTES = 100
#: The cost model until ``--cost-model`` gives a calibrated one: A and B as
#: ``srtm calibrate --cost`` measured them at d898776 (docs/utility.md; a disturbed,
#: shared machine: an order of magnitude, which the online correction refines).
DEFAULT_COST_MODEL = CostModel(a_cpu_s=23.7e-6, b_cpu_s=6.4e-6)


@dataclass(frozen=True)
class UtilitySettings:
    """``--cpu-capacity`` (a fraction of one core per broker, less the cost model's idle
    CPU) and ``--egress-max`` (bytes/s), the brokers' capacities in the problem."""

    cpu_capacity: float = 0.8
    egress_max: float = 125e6
    rate_control: RateControlSettings = field(default_factory=RateControlSettings)


def topic_costs(model: CostModel, message_bytes: float, topic: str) -> FlowCosts:
    """A topic's costs from ``model`` (``srtm.utility.cost``) at its mean message size:
    CPU, and ``network`` = the egress (``network_out``) the brokers' capacity counts."""
    per_message = cost.flow_costs(model, message_bytes, topic=topic)
    per_delivery = cost.class_costs(model, message_bytes)
    return FlowCosts(
        {"cpu": per_message[cost.CPU], "network": per_message[cost.NETWORK_OUT]},
        {"cpu": per_delivery[cost.CPU], "network": per_delivery[cost.NETWORK_OUT]},
    )


def message_bytes(ctrl: Controller, topic: str) -> float:
    """The topic's mean message size over what its brokers report."""
    n = b = 0
    for info in ctrl.up():
        n += info.arrived.get(topic, 0)
        b += info.arrived_bytes.get(topic, 0)
    return b / n if n and b else DEFAULT_MESSAGE_BYTES


def flagged(ctrl: Controller) -> dict[str, frozenset[str]]:
    """Per broker up, the resources its last report says are congested (over the
    broker's own ``--cpu-congested`` and ``--egress-max``)."""
    out = {}
    for info in ctrl.up():
        hot = frozenset() if info.resources is None else info.resources.congested
        if hot:
            out[info.id] = hot
    return out


def carried_rates(ctrl: Controller, flows: Iterable[FlowSpec]) -> dict[str, dict[str, float]]:
    """Per flow, per broker up: the rate the broker carries, as its last report measured
    it (the topic's ten-second window there), at most its sub-bucket's rate (what it may
    release; a report still counting before a cut would otherwise hold the cut back);
    the sub-bucket's rate until the broker reports the topic."""
    up = {info.id: info for info in ctrl.up()}
    out: dict[str, dict[str, float]] = {}
    for f in flows:
        topic = ctrl.topics.get(f.name)
        if topic is None:
            continue
        per = out[f.name] = {}
        for b, params in topic.buckets.items():
            if b not in up:
                continue
            report = up[b].reports.get(f.name)
            per[b] = params.rate if report is None else min(params.rate, report.rate)
    return out


def declares_cpu(ctrl: Controller, flow: str) -> bool:
    """Whether the topic's utility spec declares a CPU cost (per message or for a class):
    the operator's contract, which plans and judges it (deviation 27)."""
    topic = ctrl.topics.get(flow)
    spec = None if topic is None or topic.utility is None else topic.utility.flow
    if spec is None:
        return False
    return "cpu" in spec.cost or any("cpu" in c.cost for c in spec.classes)


def congestion(
    ctrl: Controller,
    problem: Problem,
    admitted: Mapping[tuple[str, str], int],
    measured: Mapping[str, float] | None = None,
    budget: float = math.inf,
) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """``(congested, full)`` per broker, what rate control moves the rates by.

    Congested: the broker flags it (its real resources are short), or its use is over
    its capacity; full: within ``FULL_BAND`` of it. Per broker:

    - a broker in ``measured`` (its CPU as its last report measured it, cores): its
      utility topics all leave their CPU cost to the cost model, so its real CPU is
      judged, against ``budget`` (``--cpu-capacity``), whatever else loads it: rate
      control reacts to measured congestion (``UtilityControl.measured_cpu``);
    - otherwise its flows' costs at the rates it carries, against the optimizer's
      capacity: a topic whose spec declares its costs is planned by them (the
      operator's contract, never corrected), and rate control must judge by the model
      the plan was made with, or it undoes the plan each second. Where declared costs
      and the broker's real CPU disagree (the live experiments' fixed costs: about half
      of what this broker measures), the broker's own flag still guards its real
      capacity (docs/utility.md, "Rate control")."""
    measured = measured or {}
    use = broker_use(problem.flows, carried_rates(ctrl, problem.flows), admitted)
    for broker in measured:
        use.get(broker, {}).pop("cpu", None)
    over, full = pressure(use, problem.capacity)
    real_over, real_full = pressure(
        {b: {"cpu": cpu} for b, cpu in measured.items()},
        {b: {"cpu": budget} for b in measured},
    )
    for b, hot in real_over.items():
        over[b] = over.get(b, frozenset()) | hot
    for b, near in real_full.items():
        full[b] = full.get(b, frozenset()) | near
    for broker, hot in flagged(ctrl).items():
        over[broker] = over.get(broker, frozenset()) | hot
    full = {b: r - over.get(b, frozenset()) for b, r in full.items()}
    return over, {b: r for b, r in full.items() if r}


def _managed(ctrl: Controller, name: str) -> bool:
    """Whether the optimizer allocates the topic (it has a readable utility spec)."""
    topic = ctrl.topics.get(name)
    return topic is not None and topic.utility is not None and topic.utility.flow is not None


def reported_topics(ctrl: Controller, info: BrokerInfo) -> list[tuple[float, float]]:
    """``(rate, deliveries per message)`` per topic in a broker's last report: what its
    CPU is predicted from. Deliveries are the topic's channels there (each gets every
    message), not its ``demand``: demand counts consumers refused and waiting, which cost
    nothing, and predicting from it would make the measured/predicted correction think
    the broker cheaper than it is."""
    carried = ctrl.registry.carried.get(info.id, {})
    return [(w.rate, float(len(carried.get(name, ())))) for name, w in info.reports.items()]


@dataclass
class UtilityControl:
    """The last optimizer run and the state rate control works on."""

    settings: UtilitySettings = field(default_factory=UtilitySettings)
    #: The calibrated cost model every broker's starts from.
    model: CostModel = DEFAULT_COST_MODEL
    #: Per broker: its cost model, corrected online (``observe``).
    models: dict[str, CostModel] = field(default_factory=dict)
    #: Per broker: the report its model was last corrected by (one correction each).
    corrected_at: dict[str, int] = field(default_factory=dict)
    problem: Problem | None = None
    allocation: Allocation | None = None
    t_s: float | None = None
    runs: int = 0
    #: Per topic: the last run's rate where it is below the topic's rate, reached by
    #: paced cuts (``paced``) at the rate control steps.
    targets: dict[str, float] = field(default_factory=dict)
    #: Per persisted topic: its storage latency (s), the worst its brokers report,
    #: smoothed (``storage.LatencyEstimate``): what bounds its rate (``storage_bound``).
    storage: dict[str, LatencyEstimate] = field(default_factory=dict)
    storage_at: dict[str, int] = field(default_factory=dict)

    def paced(self, name: str, current: float, wanted: float) -> float:
        """The rate to set now for a topic at ``current`` that the optimizer puts at
        ``wanted``: a cut goes at most ``down_max`` of the rate a step, the rest at the
        next rate control steps (``targets``), so that publishers following the rate
        leave no more than a step's excess waiting behind the smaller bucket; a rise at
        once."""
        if wanted >= current:
            self.targets.pop(name, None)
            return wanted
        step = max(wanted, current * (1.0 - self.settings.rate_control.down_max))
        if step > wanted:
            self.targets[name] = wanted
        else:
            self.targets.pop(name, None)
        return step

    def broker_model(self, broker: str) -> CostModel:
        return self.models.get(broker, self.model)

    def observe(self, ctrl: Controller) -> None:
        """Correct each broker's model by its last report's measured / predicted CPU
        (``srtm.utility.cost.correct``: smoothed, clamped), once per report; fold each
        persisted topic's reported storage latency into its estimate."""
        self.observe_storage(ctrl)
        for info in ctrl.up():
            if info.resources is None or self.corrected_at.get(info.id) == info.reports_seen:
                continue
            self.corrected_at[info.id] = info.reports_seen
            model = self.broker_model(info.id)
            predicted = model.predict(reported_topics(ctrl, info))
            measured = info.resources.cpu
            self.models[info.id] = cost.correct(model, measured, predicted)

    def _modelled(self, ctrl: Controller, info: BrokerInfo, managed: bool) -> float:
        """Cores the corrected model gives the broker's reported topics that the
        optimizer allocates (``managed``) or not."""
        carried = ctrl.registry.carried.get(info.id, {})
        model = self.broker_model(info.id)
        return math.fsum(
            model.topic_cpu(w.rate, len(carried.get(name, ())))
            for name, w in info.reports.items()
            if _managed(ctrl, name) == managed
        )

    def judged_by_measurement(self, ctrl: Controller, broker: str) -> bool:
        """Whether the broker reports its CPU and carries managed topics, none of which
        declares a CPU cost."""
        info = ctrl.brokers.get(broker)
        if info is None or info.resources is None:
            return False
        names = [n for n, t in ctrl.topics.items() if broker in t.buckets and _managed(ctrl, n)]
        return bool(names) and not any(declares_cpu(ctrl, n) for n in names)

    def background(self, ctrl: Controller, info: BrokerInfo) -> float:
        """Cores the broker spends on what the optimizer does not allocate (topics
        without a utility spec, and, on a broker judged by measurement, whatever else
        its measured CPU holds beyond the model's idle CPU and managed topics). That CPU
        is not there to give: it comes off the broker's capacity in the problem."""
        if self.judged_by_measurement(ctrl, info.id):
            assert info.resources is not None
            idle = self.broker_model(info.id).idle_cpu
            return max(0.0, info.resources.cpu - idle - self._modelled(ctrl, info, True))
        return self._modelled(ctrl, info, False)

    def measured_cpu(self, ctrl: Controller) -> dict[str, float]:
        """Per broker up judged by measurement: the CPU its last report measured."""
        return {
            info.id: info.resources.cpu
            for info in ctrl.up()
            if info.resources is not None and self.judged_by_measurement(ctrl, info.id)
        }

    def observe_storage(self, ctrl: Controller) -> None:
        """Per topic, once per round of reports: the worst storage latency its brokers
        report, folded into the topic's estimate."""
        worst: dict[str, float] = {}
        for info in ctrl.up():
            for name, ms in info.storage_latency_ms.items():
                worst[name] = max(worst.get(name, 0.0), ms / 1e3)
        seen = sum(info.reports_seen for info in ctrl.up())
        for name, latency_s in worst.items():
            if self.storage_at.get(name) == seen:
                continue
            self.storage_at[name] = seen
            self.storage.setdefault(name, LatencyEstimate()).update(latency_s)

    def storage_bound(self, ctrl: Controller, flow: FlowSpec) -> float:
        """The flow's ``r_max``, capped where its topic persists to disk at what its
        producers can send when each waits for its acknowledgement:
        ``producers / storage latency`` (``storage.rate_bound``; the producers are the
        topic's declared publishers)."""
        est = self.storage.get(flow.name)
        topic = ctrl.topics.get(flow.name)
        if est is None or est.value_s is None or topic is None:
            return flow.r_max
        producers = len(topic.spec.publishers)
        return rate_bound(flow.r_min, flow.r_max, producers, est.value_s)

    def costs(self, ctrl: Controller, name: str, buckets: dict[str, float]) -> FlowCosts:
        """The topic's costs: its brokers' corrections weighted by their shares."""
        shares = shares_of(buckets)
        scale = math.fsum(w * self.broker_model(b).scale for b, w in shares.items()) or 1.0
        model = dataclasses.replace(self.model, scale=scale)
        return topic_costs(model, message_bytes(ctrl, name), name)

    def build(self, ctrl: Controller) -> Problem:
        """The problem for the managed topics with a utility spec, on the brokers up."""
        inputs = []
        for name, topic in ctrl.topics.items():
            # No spec, or a saved one this version cannot read (``TopicUtility``).
            if topic.utility is None or (flow := topic.utility.flow) is None:
                continue
            demand = {b: ctrl.brokers[b].demand.get(name, {}) for b in topic.buckets}
            buckets = {b: p.rate for b, p in topic.buckets.items()}
            flow = dataclasses.replace(flow, r_max=self.storage_bound(ctrl, flow))
            inputs.append(TopicInput(flow, buckets, demand, self.costs(ctrl, name, buckets)))
        caps = {
            b.id: {
                "cpu": max(
                    0.0,
                    self.broker_model(b.id).available_cpu(self.settings.cpu_capacity)
                    - self.background(ctrl, b),
                ),
                "network": self.settings.egress_max,
            }
            for b in ctrl.up()
        }
        return build_problem(inputs, caps)

    def apply(
        self, ctrl: Controller, problem: Problem, alloc: Allocation, t_s: float
    ) -> tuple[list[Action], list[tuple[str, str, dict[str, Any]]]]:
        """The run's rates as share changes, and the admission orders: (broker, topic,
        ``{"classes", "order"}``) for every broker of every one-to-many flow (none from
        an infeasible run)."""
        self.problem, self.allocation, self.t_s = problem, alloc, t_s
        self.runs += 1
        actions: list[Action] = []
        orders = []
        for f in problem.flows:
            topic = ctrl.topics.get(f.name)
            if topic is None:
                continue
            rate = alloc.rates[f.name]
            topic.allocation = AllocationState(
                **flow_doc(f, rate, alloc.admitted), t_s=t_s, feasible=alloc.feasible
            )
            self.targets.pop(f.name, None)
            actions += ctrl.set_rate(f.name, self.paced(f.name, topic.spec.rate, rate))
            # An infeasible run (the minimum rates alone do not fit) has no answer for the
            # population: it admits nobody, and evicting every consumer would leave the
            # topic holding what it gets until one is back (seconds of stale messages).
            # The brokers keep the counts they have.
            if f.kind is FlowKind.ONE_TO_MANY and alloc.feasible:
                # Most important first: the paper's order of utility per consumer.
                ranked = sorted(f.classes, key=lambda c: (-c.utility.value(rate), c.name))
                body = {
                    "classes": {c.name: alloc.admitted[(f.name, c.name)] for c in ranked},
                    "order": [c.name for c in ranked],
                }
                orders += [(b, f.name, body) for b in topic.buckets]
        return actions, orders

    def control(self, ctrl: Controller) -> list[Action]:
        """One rate control step on the last run's flows, from the rates they have now."""
        if self.problem is None or self.allocation is None:
            return []
        flows = [
            f
            for f in self.problem.flows
            if (t := ctrl.topics.get(f.name)) is not None and t.utility is not None
        ]
        problem = Problem(tuple(flows), self.problem.capacity)
        rates = {f.name: ctrl.topics[f.name].spec.rate for f in flows}
        measured = self.measured_cpu(ctrl)
        over, full = congestion(
            ctrl, problem, self.allocation.admitted, measured, self.settings.cpu_capacity
        )
        new = control_step(
            problem, rates, self.allocation.admitted, over, self.settings.rate_control, full,
        )  # fmt: skip
        actions: list[Action] = []
        for name, rate in new.items():
            if name in self.targets:  # a cut under way goes on, never back up
                rate = min(rate, self.paced(name, rates[name], self.targets[name]))
            if not math.isclose(rate, rates[name], rel_tol=1e-9):
                actions += ctrl.set_rate(name, rate)
        return actions

    def doc(self) -> dict[str, Any]:
        """``GET /utility``."""
        if self.problem is None or self.allocation is None:
            return {"t_s": None, "feasible": True, "total_utility": 0.0, "flows": []}
        return run_doc(self.problem, self.allocation, self.t_s or 0.0)
