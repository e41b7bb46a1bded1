"""The what-if input of ``srtm utility optimize`` (a JSON document, parsed here with errors
that name the field), the allocation as JSON, and a request-response flow's curve as JSON
(``srtm utility rr``). Pure: dicts in, dicts out."""

from __future__ import annotations

import math
from typing import Any

from srtm.utility.model import RequestResponse, Utility
from srtm.utility.optimizer import Allocation, ConsumerClass, FlowKind, FlowSpec, Problem


def _num(doc: dict[str, Any], key: str, where: str, *, minimum: float = 0.0) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}.{key} must be a finite number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{where}.{key} must be >= {minimum:g}, got {value!r}")
    return float(value)


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object, got {value!r}")
    return value


def _costs(doc: dict[str, Any], where: str, known: set[str]) -> dict[str, float]:
    costs = _obj(doc.get("cost", {}), f"{where}.cost")
    for name in costs:
        if name not in known:
            raise ValueError(
                f"{where}.cost.{name}: no broker has a capacity for resource {name!r} "
                f"(known: {sorted(known)})"
            )
    return {name: _num(costs, name, f"{where}.cost") for name in costs}


def _utility(doc: Any, where: str, r_min: float | None, r_max: float | None) -> Utility:
    spec = _obj(doc, where)
    if "slope" in spec:
        if r_min is None or r_max is None:
            raise ValueError(f"{where}: a slope utility needs the flow's r_min and r_max")
        return Utility.linear(_num(spec, "slope", where), r_min, r_max)
    points = spec.get("points")
    if not isinstance(points, list) or not points:
        raise ValueError(f'{where} needs "slope" or "points": [[rate, utility], ...]')
    pairs = []
    for i, p in enumerate(points):
        if not (isinstance(p, list) and len(p) == 2):
            raise ValueError(f"{where}.points[{i}] must be [rate, utility], got {p!r}")
        pairs.append(
            (_num({"rate": p[0]}, "rate", f"{where}.points[{i}]"),
             _num({"utility": p[1]}, "utility", f"{where}.points[{i}]", minimum=-math.inf))
        )  # fmt: skip
    try:
        return Utility(tuple(pairs))
    except ValueError as exc:
        raise ValueError(f"{where}.points: {exc}") from None


def request_response(doc: Any, where: str) -> RequestResponse:
    spec = _obj(doc, where)
    clients = spec.get("clients")
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise ValueError(f"{where}.clients must be an integer >= 1, got {clients!r}")
    try:
        return RequestResponse(
            clients,
            _num(spec, "think_ms", where) / 1e3,
            _num(spec, "exec_ms", where) / 1e3,
            _num(spec, "deadline_ms", where) / 1e3,
            _num(spec, "c", where),
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _shares(doc: dict[str, Any], where: str, brokers: list[str]) -> dict[str, float]:
    given = doc.get("brokers")
    if given is None:
        if len(brokers) != 1:
            raise ValueError(f"{where}.brokers is required when there are several brokers")
        return {brokers[0]: 1.0}
    if isinstance(given, list) and given and all(isinstance(b, str) for b in given):
        given = {b: 1.0 / len(given) for b in given}
    shares = _obj(given, f"{where}.brokers")
    for b in shares:
        if b not in brokers:
            raise ValueError(f"{where}.brokers: unknown broker {b!r}")
    out = {b: _num(shares, b, f"{where}.brokers") for b in shares}
    if not out or abs(math.fsum(out.values()) - 1.0) > 1e-9:
        raise ValueError(f"{where}.brokers: shares must sum to 1, got {out}")
    return out


def _flow(doc: Any, where: str, brokers: list[str], known: set[str]) -> FlowSpec:
    spec = _obj(doc, where)
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name must be a non-empty string, got {name!r}")
    return parse_flow(spec, where, name, _shares(spec, where, brokers), known)


def parse_flow(
    doc: Any, where: str, name: str, shares: dict[str, float], known: set[str]
) -> FlowSpec:
    """One flow of the document without its ``name`` and ``brokers`` (given here): what
    a controller's topic carries as its ``utility`` (``known``: the resources a cost may
    name)."""
    spec = _obj(doc, where)
    try:
        kind = FlowKind(str(spec.get("kind")))
    except ValueError:
        kinds = ", ".join(k.value for k in FlowKind)
        raise ValueError(f"{where}.kind must be one of {kinds}, got {spec.get('kind')!r}") from None
    r_min = _num(spec, "r_min", where) if "r_min" in spec else None
    r_max = _num(spec, "r_max", where) if "r_max" in spec else None
    utility: Utility | None = None
    classes: list[ConsumerClass] = []
    if kind is FlowKind.REQUEST_RESPONSE:
        utility = request_response(spec.get("rr"), f"{where}.rr").utility()
    elif kind is FlowKind.ONE_TO_ONE:
        utility = _utility(spec.get("utility"), f"{where}.utility", r_min, r_max)
    else:
        if r_min is None or r_max is None:
            raise ValueError(f"{where}: a one-to-many flow needs r_min and r_max")
        items = spec.get("classes")
        if not isinstance(items, list) or not items:
            raise ValueError(f"{where}.classes must be a non-empty array")
        for j, item in enumerate(items):
            cw = f"{where}.classes[{j}]"
            c = _obj(item, cw)
            cname = c.get("name")
            if not isinstance(cname, str) or not cname:
                raise ValueError(f"{cw}.name must be a non-empty string, got {cname!r}")
            available = c.get("available")
            if isinstance(available, bool) or not isinstance(available, int) or available < 0:
                raise ValueError(f"{cw}.available must be an integer >= 0, got {available!r}")
            u = _utility(c.get("utility"), f"{cw}.utility", r_min, r_max)
            classes.append(ConsumerClass(cname, u, available, _costs(c, cw, known)))
        if len({c.name for c in classes}) != len(classes):
            raise ValueError(f"{where}.classes: duplicate class names")
    if utility is not None:
        r_min = utility.r_min if r_min is None else r_min
        r_max = utility.r_max if r_max is None else r_max
    assert r_min is not None and r_max is not None
    if r_max < r_min:
        raise ValueError(f"{where}: r_max ({r_max:g}) is below r_min ({r_min:g})")
    return FlowSpec(
        name, kind, r_min, r_max, _costs(spec, where, known), shares, utility, tuple(classes)
    )


def parse_problem(doc: Any) -> Problem:
    """``{"brokers": [{"id", "capacity": {RESOURCE: number}}], "flows": [...]}``; see
    docs/utility.md for the flows."""
    top = _obj(doc, "the document")
    items = top.get("brokers")
    if not isinstance(items, list) or not items:
        raise ValueError("brokers must be a non-empty array")
    capacity: dict[str, dict[str, float]] = {}
    for i, item in enumerate(items):
        b = _obj(item, f"brokers[{i}]")
        bid = b.get("id")
        if not isinstance(bid, str) or not bid or bid in capacity:
            raise ValueError(f"brokers[{i}].id must be a new non-empty string, got {bid!r}")
        caps = _obj(b.get("capacity", {}), f"brokers[{i}].capacity")
        capacity[bid] = {r: _num(caps, r, f"brokers[{i}].capacity") for r in caps}
    known = {r for caps in capacity.values() for r in caps}
    flows_doc = top.get("flows")
    if not isinstance(flows_doc, list) or not flows_doc:
        raise ValueError("flows must be a non-empty array")
    flows = tuple(_flow(f, f"flows[{i}]", list(capacity), known) for i, f in enumerate(flows_doc))
    if len({f.name for f in flows}) != len(flows):
        raise ValueError("flows: duplicate flow names")
    return Problem(flows, capacity)


def allocation_doc(problem: Problem, alloc: Allocation) -> dict[str, Any]:
    used = alloc.usage(problem)
    flows = []
    for f in problem.flows:
        rate = alloc.rates[f.name]
        entry: dict[str, Any] = {
            "name": f.name, "kind": f.kind.value, "rate": rate, "r_min": f.r_min,
            "r_max": f.r_max,
        }  # fmt: skip
        if f.kind is FlowKind.ONE_TO_MANY:
            entry["classes"] = [
                {"name": c.name, "available": c.available,
                 "admitted": alloc.admitted[(f.name, c.name)],
                 "utility": alloc.admitted[(f.name, c.name)] * c.utility.value(rate)}
                for c in f.classes
            ]  # fmt: skip
            entry["utility"] = math.fsum(c["utility"] for c in entry["classes"])
        else:
            assert f.utility is not None
            entry["utility"] = f.utility.value(rate)
        flows.append(entry)
    return {
        "feasible": alloc.feasible,
        "total_utility": alloc.utility,
        "primary": alloc.primary,
        "runs": [{"primary": name, "utility": value} for name, value in alloc.runs],
        "flows": flows,
        "usage": [
            {"broker": b, "resource": r, "used": u, "capacity": problem.capacity[b][r]}
            for (b, r), u in used.items()
        ],
    }


def rr_doc(rr: RequestResponse, servers: int | None = None) -> dict[str, Any]:
    """``rr``'s curve: ``r_min``, ``r_max``, its breakpoints, and MVA at 1..``servers``
    servers (default: up to the first at or above ``r_max``); times in ms."""
    count = servers or max(1, -int(-rr.r_max * rr.exec_s // 1))
    mva = [rr.mva(m) for m in range(1, count + 1)]
    return {
        "r_min": rr.r_min,
        "r_max": rr.r_max,
        "points": [
            {"rate": p.rate, "t_rt_ms": p.t_rt_s * 1e3, "utility": p.utility} for p in rr.points()
        ],
        "mva": [{"servers": p.servers, "rate": p.rate, "t_rt_ms": p.t_rt_s * 1e3} for p in mva],
    }
