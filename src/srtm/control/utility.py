"""The utility optimizer and rate control in the controller, without I/O: the problem
built from the controller's state (topics with a ``utility`` spec, their plans, what
brokers report), an allocation turned into rates and admission counts, and the rate
control step between runs. The service (``srtm.control.service``) runs ``optimize`` off
the event loop, carries the actions out and posts the admission counts.

What runs when (docs/utility.md, "In the controller"): every ``--utility-interval-s``
an optimizer run sets every such topic's rate and admitted counts; every
``--rate-control-interval-s`` in between, rate control moves the rates by the brokers'
congestion; the next run snaps them back to its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from srtm.control.actions import Action
from srtm.control.state import Controller
from srtm.utility.cluster import (
    FlowCosts,
    TopicInput,
    build_problem,
    capacities,
    flow_doc,
    parse_topic_utility,
    run_doc,
)
from srtm.utility.optimizer import Allocation, FlowKind, Problem
from srtm.utility.ratecontrol import RateControlSettings, control_step

#: The message size assumed for a topic no broker has reported bytes of yet.
DEFAULT_MESSAGE_BYTES = 100
#: Bytes a delivery adds to the body on the wire: NSQ's frame (size, type) and message
#: header (timestamp, attempts, id).
FRAME_OVERHEAD_BYTES = 4 + 4 + 8 + 2 + 16
#: Until a cost model is fitted (``srtm calibrate``): core-seconds per message accepted
#: and per delivery on an SRTM broker (about 50,000 msg/s in and 100,000 deliveries/s
#: out per core; ours, from the broker benchmarks' order of magnitude).
DEFAULT_CPU_PER_MESSAGE = 2e-5
DEFAULT_CPU_PER_DELIVERY = 1e-5


@dataclass(frozen=True)
class UtilitySettings:
    """``--cpu-capacity`` (a fraction of one core per broker) and ``--egress-max``
    (bytes/s), the brokers' capacities in the problem."""

    cpu_capacity: float = 0.8
    egress_max: float = 125e6
    rate_control: RateControlSettings = field(default_factory=RateControlSettings)


def flow_costs(message_bytes: float, cpu_scale: float = 1.0) -> FlowCosts:
    """A topic's costs from the cost model at its mean message size; ``cpu_scale``: the
    online correction, measured / predicted CPU."""
    return FlowCosts(
        {"cpu": DEFAULT_CPU_PER_MESSAGE * cpu_scale},
        {
            "cpu": DEFAULT_CPU_PER_DELIVERY * cpu_scale,
            "network": message_bytes + FRAME_OVERHEAD_BYTES,
        },
    )


def message_bytes(ctrl: Controller, topic: str) -> float:
    """The topic's mean message size over what its brokers report."""
    n = b = 0
    for info in ctrl.up():
        n += info.arrived.get(topic, 0)
        b += info.arrived_bytes.get(topic, 0)
    return b / n if n and b else DEFAULT_MESSAGE_BYTES


def congested(ctrl: Controller) -> dict[str, frozenset[str]]:
    """Per broker up, the resources its last report says are congested."""
    out = {}
    for info in ctrl.up():
        flags = (info.resources or {}).get("congested") or {}
        hot = frozenset(r for r, on in flags.items() if on is True)
        if hot:
            out[info.id] = hot
    return out


#: The smallest predicted CPU (a fraction of a core) the correction divides by: below
#: it the ratio is mostly the broker's idle overhead.
MIN_PREDICTED_CPU = 0.02
#: Weight of a new measured/predicted ratio in the correction (an EWMA over runs).
CORRECTION_WEIGHT = 0.5


def predicted_cpu(ctrl: Controller) -> tuple[float, float]:
    """Measured and predicted CPU summed over the brokers up that tell their resources:
    each topic's reported rate times the default cost model's A + B·consumers."""
    measured = predicted = 0.0
    for info in ctrl.up():
        if info.resources is None:
            continue
        measured += float(info.resources.get("cpu", 0.0))
        for name, w in info.reports.items():
            consumers = sum(info.demand.get(name, {}).values())
            per = DEFAULT_CPU_PER_MESSAGE + DEFAULT_CPU_PER_DELIVERY * consumers
            predicted += w.rate * per
    return measured, predicted


def corrected(scale: float, measured: float, predicted: float) -> float:
    """The CPU costs' correction after one reading (kept while the prediction is too
    small to say anything), within [0.1, 10]."""
    if predicted < MIN_PREDICTED_CPU:
        return scale
    ratio = min(10.0, max(0.1, measured / predicted))
    return (1 - CORRECTION_WEIGHT) * scale + CORRECTION_WEIGHT * ratio


@dataclass
class UtilityControl:
    """The last optimizer run and the state rate control works on."""

    settings: UtilitySettings = field(default_factory=UtilitySettings)
    #: measured / predicted CPU over the brokers (1: no correction yet).
    cpu_scale: float = 1.0
    problem: Problem | None = None
    allocation: Allocation | None = None
    t_s: float | None = None
    runs: int = 0

    def build(self, ctrl: Controller) -> Problem:
        """The problem for the managed topics with a utility spec, on the brokers up."""
        up = [b.id for b in ctrl.up()]
        inputs = []
        for name, topic in ctrl.topics.items():
            if topic.utility is None:
                continue
            try:
                flow = parse_topic_utility(topic.utility, name)
            except ValueError:
                continue  # checked when set; a saved spec from another version
            demand = {b: ctrl.brokers[b].demand.get(name, {}) for b in topic.buckets}
            inputs.append(
                TopicInput(
                    flow,
                    {b: p.rate for b, p in topic.buckets.items()},
                    demand,
                    flow_costs(message_bytes(ctrl, name), self.cpu_scale),
                )
            )
        caps = capacities(up, self.settings.cpu_capacity, self.settings.egress_max)
        return build_problem(inputs, caps)

    def apply(
        self, ctrl: Controller, problem: Problem, alloc: Allocation, t_s: float
    ) -> tuple[list[Action], list[tuple[str, str, dict[str, Any]]]]:
        """The run's rates as share changes, and the admission orders: (broker, topic,
        ``{"classes", "order"}``) for every broker of every one-to-many flow."""
        self.problem, self.allocation, self.t_s = problem, alloc, t_s
        self.runs += 1
        actions: list[Action] = []
        orders = []
        for f in problem.flows:
            topic = ctrl.topics.get(f.name)
            if topic is None:
                continue
            rate = alloc.rates[f.name]
            topic.allocation = flow_doc(f, rate, alloc.admitted) | {
                "t_s": t_s, "feasible": alloc.feasible,
            }  # fmt: skip
            actions += ctrl.set_rate(f.name, rate)
            if f.kind is FlowKind.ONE_TO_MANY:
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
        flows = [f for f in self.problem.flows if ctrl.topics.get(f.name) is not None]
        problem = Problem(tuple(flows), self.problem.capacity)
        rates = {f.name: ctrl.topics[f.name].spec.rate for f in flows}
        new = control_step(
            problem, rates, self.allocation.admitted, congested(ctrl),
            self.settings.rate_control,
        )  # fmt: skip
        actions: list[Action] = []
        for name, rate in new.items():
            if not math.isclose(rate, rates[name], rel_tol=1e-9):
                actions += ctrl.set_rate(name, rate)
        return actions

    def doc(self) -> dict[str, Any]:
        """``GET /utility``."""
        if self.problem is None or self.allocation is None:
            return {"t_s": None, "feasible": True, "total_utility": 0.0, "flows": []}
        return run_doc(self.problem, self.allocation, self.t_s or 0.0)
