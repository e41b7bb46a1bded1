"""The optimizer's problem built from a live cluster (what the controller knows), and its
answer as the controller shows it. Pure: numbers and specs in, a ``Problem`` out.

A managed topic with a ``utility`` spec is a flow: its spec is one flow of
``srtm utility optimize``'s document without ``name`` and ``brokers``
(``srtm.utility.document.parse_flow``). Here it gets

- its brokers' shares from the topic's plan (its sub-buckets' rates, as a split topic);
- per class, ``available`` = the consumers that asked for it (the most any one of its
  brokers reports: a subscriber reads from every broker of its topic), at most the spec's;
- the costs the spec leaves out from the cost model (CPU in core-seconds per message and
  per delivery, network egress in bytes per delivery).

Brokers' capacities: ``cpu`` a fraction of one core, ``network`` egress bytes/s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from srtm.utility.document import parse_flow
from srtm.utility.optimizer import Allocation, FlowKind, FlowSpec, Problem, flow_utility

#: The resources a topic's utility spec may cost, and a broker's capacity names.
RESOURCES = ("cpu", "network")


def parse_topic_utility(doc: Any, name: str) -> FlowSpec:
    """A topic's ``utility`` spec, checked (ValueError naming ``utility.…``); its shares
    come later, from the plan."""
    if isinstance(doc, dict) and ("name" in doc or "brokers" in doc):
        raise ValueError("utility: name and brokers come from the topic, not the spec")
    return parse_flow(doc, "utility", name, {}, set(RESOURCES))


@dataclass(frozen=True)
class FlowCosts:
    """What one message of a flow costs (``per_message``: the paper's A_i per resource)
    and what one delivery to one consumer costs (``per_delivery``: its B_j)."""

    per_message: Mapping[str, float]
    per_delivery: Mapping[str, float]


def with_costs(flow: FlowSpec, costs: FlowCosts) -> FlowSpec:
    """``flow`` with every cost its spec leaves out taken from ``costs`` (per resource:
    a cost the spec gives is the operator's and kept)."""
    classes = tuple(
        dataclasses.replace(c, cost={**costs.per_delivery, **c.cost}) for c in flow.classes
    )
    per_message = dict(costs.per_message)
    if flow.kind is not FlowKind.ONE_TO_MANY:
        # One consumer (a one-to-one flow's reader, a request-response flow's server):
        # its delivery is part of each message's cost.
        per_message = {
            r: per_message.get(r, 0.0) + costs.per_delivery.get(r, 0.0)
            for r in {*per_message, *costs.per_delivery}
        }
    return dataclasses.replace(flow, cost={**per_message, **flow.cost}, classes=classes)


def shares_of(bucket_rates: Mapping[str, float]) -> dict[str, float]:
    """A topic's load per broker, by its sub-buckets' rates (equal when all are 0)."""
    total = math.fsum(bucket_rates.values())
    if not bucket_rates:
        return {}
    if total <= 0:
        return {b: 1.0 / len(bucket_rates) for b in bucket_rates}
    return {b: r / total for b, r in bucket_rates.items()}


@dataclass(frozen=True)
class TopicInput:
    """One topic as the controller sees it: its parsed spec, its sub-buckets' rates per
    broker, the consumers per class each of its brokers reports (connected and refused
    ones waiting), and its costs from the cost model."""

    flow: FlowSpec
    buckets: Mapping[str, float]
    demand: Mapping[str, Mapping[str, int]]
    costs: FlowCosts


def build_problem(topics: list[TopicInput], capacity: Mapping[str, Mapping[str, float]]) -> Problem:
    """The flows of the topics placed on brokers in ``capacity`` (a topic with no share
    on any of them is left out), sorted by name so that the answer is deterministic."""
    flows = []
    for t in sorted(topics, key=lambda t: t.flow.name):
        shares = shares_of({b: r for b, r in t.buckets.items() if b in capacity})
        if not shares:
            continue
        classes = tuple(
            dataclasses.replace(c, available=min(c.available, asked(t.demand, c.name)))
            for c in t.flow.classes
        )
        flow = dataclasses.replace(t.flow, shares=shares, classes=classes)
        flows.append(with_costs(flow, t.costs))
    return Problem(tuple(flows), {b: dict(c) for b, c in capacity.items()})


def asked(demand: Mapping[str, Mapping[str, int]], klass: str) -> int:
    """Consumers of ``klass`` that asked: the most any one broker reports."""
    return max((per.get(klass, 0) for per in demand.values()), default=0)


def run_doc(problem: Problem, alloc: Allocation, t_s: float) -> dict[str, Any]:
    """``GET /utility``: ``{"t_s", "feasible", "total_utility", "flows": [{"name",
    "rate", "admitted": {class: n}, "utility", "r_max"}]}`` (``r_max``: the one the run
    used, a persisted topic's capped by its storage latency)."""
    return {
        "t_s": t_s,
        "feasible": alloc.feasible,
        "total_utility": alloc.utility,
        "flows": [
            {**flow_doc(f, alloc.rates[f.name], alloc.admitted), "r_max": f.r_max}
            for f in problem.flows
        ],
    }


def flow_doc(
    flow: FlowSpec, rate: float, admitted: Mapping[tuple[str, str], int]
) -> dict[str, Any]:
    return {
        "name": flow.name,
        "rate": rate,
        "admitted": {c.name: admitted.get((flow.name, c.name), 0) for c in flow.classes},
        "utility": flow_utility(flow, rate, admitted),
    }
