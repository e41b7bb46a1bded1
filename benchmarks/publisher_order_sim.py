"""A live scenario's four policies in the simulator, with the publishers handed over in
block and in shuffled order: what the order does to the blind policies, without a
machine quiet enough for a live run.

The simulator places (and, except for LB, fits) by itself from the scenario's workload,
as `srtm experiment validate` does for its "own" prediction. In shuffled order the
workload is built from the shuffled list, so the groups' phases are drawn in another
order: the same workload in distribution, not message for message.

    .venv/bin/python benchmarks/publisher_order_sim.py [--scenario correlated-sensors]
        [--model paper|model.json] [--json]
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from srtm.experiments import scenarios
from srtm.experiments.scenarios.live import profile
from srtm.experiments.scenarios.scenario import PublisherOrder, groups_per_broker
from srtm.placement import POLICIES
from srtm.ratelimit import BucketParams
from srtm.sim.model import load
from srtm.sim.scenario import LiveSetup, predict


def main(
    scenario: Annotated[str, typer.Option(help="A live scenario, or its TOML file.")] = (
        "correlated-sensors"
    ),
    model: Annotated[
        str, typer.Option(help="Broker model: 'paper' or a file from `srtm calibrate`.")
    ] = "paper",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON row per line.")] = False,
) -> None:
    m = load(model)
    base = scenarios.load(scenario)
    rate, burst = profile(base)
    table = Table(title=f"{base.name} simulated (model {model}): SLO p99 ≤ {base.slo_p99_ms:g} ms")
    for col in ("order", "policy", "p99 ms", "brokers", "groups per broker", "rounds"):
        table.add_column(col, justify="left" if col in ("order", "policy") else "right")
    for order in PublisherOrder:
        sc = base.with_order(order)
        setup = LiveSetup(
            sc.placement_specs(), BucketParams(rate, burst), sc.slo_p99_ms, sc.brokers,
            sc.capacity, sc.mcap, sc.spread_ms / 1e3, sc.seed, sc.duration_s,
            {str(p.broker): p.rate for p in sc.preload}, sc.fit.window_s if sc.fit else None,
        )  # fmt: skip
        for policy in POLICIES:
            p = predict(setup, m, policy)
            groups = sorted(groups_per_broker(p.assignment, sc.specs()).values())
            row = {"order": str(order), "policy": policy, "p99_ms": round(p.p99_ms, 2),
                   "brokers": len(p.assignment), "groups_per_broker": groups,
                   "fitting_rounds": list(p.fitting_rounds)}  # fmt: skip
            if as_json:
                print(json.dumps(row))
            rounds = str(sum(p.fitting_rounds)) if p.fitting_rounds else "-"
            table.add_row(str(order), policy, f"{p.p99_ms:.1f}", str(len(p.assignment)),
                          ", ".join(map(str, groups)), rounds)  # fmt: skip
    if not as_json:
        Console().print(table)


if __name__ == "__main__":
    typer.run(main)
