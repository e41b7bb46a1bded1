"""Utility-aware allocation (Bhola et al.): utility functions of rate, consumer classes,
request-response flows through MVA, the greedy benefit/cost optimizer, and the cost model
(CPU, network, storage per topic; fitted and corrected online). Pure."""

from srtm.utility.cost import (
    CostFit,
    CostModel,
    CostSample,
    class_costs,
    correct,
    fit_cost,
    flow_costs,
)
from srtm.utility.document import (
    allocation_doc,
    parse_flow,
    parse_problem,
    request_response,
    rr_doc,
)
from srtm.utility.model import (
    MvaPoint,
    RequestResponse,
    RrPoint,
    Utility,
    mva_response_time,
)
from srtm.utility.optimizer import (
    Allocation,
    ConsumerClass,
    FlowKind,
    FlowSpec,
    Problem,
    optimize,
    total_utility,
    usage,
)

__all__ = [
    "Allocation",
    "ConsumerClass",
    "CostFit",
    "CostModel",
    "CostSample",
    "FlowKind",
    "FlowSpec",
    "MvaPoint",
    "Problem",
    "RequestResponse",
    "RrPoint",
    "Utility",
    "allocation_doc",
    "class_costs",
    "correct",
    "fit_cost",
    "flow_costs",
    "mva_response_time",
    "optimize",
    "parse_flow",
    "parse_problem",
    "request_response",
    "rr_doc",
    "total_utility",
    "usage",
]
