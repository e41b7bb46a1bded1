"""``srtm utility …``: the utility model and the optimizer as what-ifs (no cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from srtm.cli.common import fail, wide_console
from srtm.jsondoc import parse as parse_json

app = typer.Typer(
    help="Utility-aware allocation (Bhola et al.): a request-response flow's rate utility "
    "from MVA, and the greedy benefit/cost optimizer on a given set of flows.",
    no_args_is_help=True,
    add_completion=False,
)

_H_CLIENTS = "N: request senders (the closed network's customers)."
_H_THINK = "T_think: mean think time between a response and the next request, ms."
_H_EXEC = "T_exec: mean time from admitting a request to its response, ms."
_H_DEADLINE = "D: the latency threshold; utility C·(1 − T_rt/D) is 0 there (r_min)."
_H_SERVERS = (
    "Also list MVA at 1..SERVERS 'servers' (rate m / T_exec); default: up to the first "
    "at or above r_max."
)
_H_RR_JSON = 'Print {"r_min", "r_max", "points": [{"rate", "t_rt_ms", "utility"}], "mva": [...]}.'


@app.command("rr")
def rr_command(
    clients: Annotated[int, typer.Option(help=_H_CLIENTS)] = 20,
    think_ms: Annotated[float, typer.Option(help=_H_THINK)] = 100.0,
    exec_ms: Annotated[float, typer.Option(help=_H_EXEC)] = 8.0,
    deadline_ms: Annotated[float, typer.Option(help=_H_DEADLINE)] = 500.0,
    c: Annotated[float, typer.Option("--c", help="C: the utility at zero latency.")] = 6000.0,
    servers: Annotated[int | None, typer.Option(help=_H_SERVERS)] = None,
    as_json: Annotated[bool, typer.Option("--json", help=_H_RR_JSON)] = False,
) -> None:
    """A request-response flow's utility as a function of its admitted rate.

    T_rt comes from exact MVA of the paper's closed network (N clients, a think station,
    m = r·T_exec servers of service time T_exec) at integer m, linear in between;
    r_min = N/(T_think + D) (utility 0), r_max = 1.1·N/(T_exec + T_think) (utility
    C·(1 − T_exec/D)). The points are the utility's breakpoints.
    """
    from srtm.utility import RequestResponse, rr_doc

    if clients < 1:
        raise fail(f"--clients must be >= 1, got {clients}")
    if servers is not None and servers < 1:
        raise fail(f"--servers must be >= 1, got {servers}")
    try:
        rr = RequestResponse(clients, think_ms / 1e3, exec_ms / 1e3, deadline_ms / 1e3, c)
    except ValueError as exc:
        starts = {"think": "--think-ms", "execution": "--exec-ms", "deadline": "--deadline-ms",
                  "c ": "--c"}  # fmt: skip
        hint = next((f for w, f in starts.items() if str(exc).startswith(w)), "input")
        raise fail(f"{hint}: {exc}") from None
    doc = rr_doc(rr, servers)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    console = wide_console(120)
    table = Table(
        title=f"request-response: N={clients}, think {think_ms:g} ms, exec {exec_ms:g} ms, "
        f"D={deadline_ms:g} ms, C={c:g} — r_min {rr.r_min:.2f}, r_max {rr.r_max:.2f} msg/s"
    )
    for name in ("rate msg/s", "T_rt ms", "utility"):
        table.add_column(name, justify="right")
    for p in doc["points"]:
        table.add_row(f"{p['rate']:.2f}", f"{p['t_rt_ms']:.3f}", f"{p['utility']:.1f}")
    console.print(table)
    mt = Table(title="MVA at integer servers (rate = m / T_exec)")
    for name in ("servers", "rate msg/s", "T_rt ms"):
        mt.add_column(name, justify="right")
    for m in doc["mva"]:
        mt.add_row(str(m["servers"]), f"{m['rate']:.2f}", f"{m['t_rt_ms']:.3f}")
    console.print(mt)


FLOWS_HELP = (
    'JSON what-if: {"brokers": [{"id": "b1", "capacity": {"cpu": 100, "network": 1.25e8}}], '
    '"flows": [{"name", "kind": "one-to-many", "r_min", "r_max", "cost": {"cpu": A}, '
    '"classes": [{"name": "gold", "available": 50, "utility": {"slope": 100}, '
    '"cost": {"cpu": B}}]}, {"name", "kind": "one-to-one", "utility": {"points": [[r, u], '
    '...]}, "cost": {...}}, {"name", "kind": "request-response", "rr": {"clients", '
    '"think_ms", "exec_ms", "deadline_ms", "c"}, "cost": {...}}]}. A flow\'s use of a '
    "resource is cost·r + Σ class cost·r·admitted; with several brokers each flow names its "
    '"brokers": {"b1": 0.5, "b2": 0.5} (shares of its load) or a list (equal shares). '
    "See docs/utility.md and examples/utility-trading-day.json."
)

_H_RATE_STEP = (
    "Raise a rate by at most this much per step (msg/s); default: to the next utility breakpoint."
)
_H_CONSUMER_STEP = "Admit at most this many consumers of a class per step; default: as many as fit."


@app.command("optimize")
def optimize_command(
    flows: Annotated[Path, typer.Option(help=FLOWS_HELP)] = Path("flows.json"),
    rate_step: Annotated[float | None, typer.Option(help=_H_RATE_STEP)] = None,
    consumer_step: Annotated[int | None, typer.Option(help=_H_CONSUMER_STEP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the allocation as JSON.")] = False,
) -> None:
    """Run the greedy benefit/cost optimizer once on FLOWS (what-if, no cluster).

    Starts at every flow's r_min with no consumers, raises the variable with the best
    benefit per unit of the primary resource while every capacity holds, once per resource
    taken as primary, and keeps the best run. Prints each flow's rate, each class's admitted
    consumers, the total utility and each resource's use. Exit 1 when even the minimum
    rates exceed a capacity.
    """
    from srtm.utility import allocation_doc, optimize, parse_problem

    try:
        doc = parse_json(flows.read_bytes(), str(flows))
    except OSError as exc:
        raise fail(f"--flows: cannot read {flows}: {exc.strerror}") from None
    except ValueError as exc:  # "FLOWS is not JSON: … at line L column C"
        raise fail(f"--flows: {exc}") from None
    if rate_step is not None and not rate_step > 0:
        raise fail(f"--rate-step must be > 0, got {rate_step}")
    if consumer_step is not None and consumer_step < 1:
        raise fail(f"--consumer-step must be >= 1, got {consumer_step}")
    try:
        problem = parse_problem(doc)
    except ValueError as exc:
        raise fail(f"{flows}: {exc}") from None
    alloc = optimize(problem, rate_step=rate_step, consumer_step=consumer_step)
    out = allocation_doc(problem, alloc)
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        _print_allocation(out)
    if not alloc.feasible:
        raise typer.Exit(1)


def _print_allocation(doc: dict[str, Any]) -> None:
    console = wide_console(120)
    table = Table(
        title=f"allocation — total utility {doc['total_utility']:,.6g} (primary {doc['primary']})"
    )
    for name in ("flow", "kind", "class", "rate msg/s", "r_min", "r_max", "admitted", "utility"):
        table.add_column(name, justify="left" if name in ("flow", "kind", "class") else "right")
    for f in doc["flows"]:
        table.add_row(
            f["name"], f["kind"], "", f"{f['rate']:,.2f}", f"{f['r_min']:,.6g}",
            f"{f['r_max']:,.6g}", "", f"{f['utility']:,.6g}",
        )  # fmt: skip
        for c in f.get("classes", []):
            table.add_row(
                "", "", c["name"], "", "", "", f"{c['admitted']:,} of {c['available']:,}",
                f"{c['utility']:,.6g}",
            )  # fmt: skip
    console.print(table)
    usage = Table(title="resources")
    for name in ("broker", "resource", "used", "capacity", "use %"):
        usage.add_column(name, justify="left" if name in ("broker", "resource") else "right")
    for u in doc["usage"]:
        pct = "—" if not u["capacity"] else f"{100 * u['used'] / u['capacity']:.1f}"
        usage.add_row(u["broker"], u["resource"], f"{u['used']:,.6g}", f"{u['capacity']:,.6g}", pct)
    console.print(usage)
    runs = ", ".join(f"{r['primary']}: {r['utility']:,.6g}" for r in doc["runs"])
    console.print(f"runs by primary resource: {runs}")
    if not doc["feasible"]:
        console.print(
            "[red]infeasible: the flows' minimum rates alone exceed a capacity; nothing was "
            "raised (the paper leaves this to flow admission control)[/red]"
        )
