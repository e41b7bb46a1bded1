"""Table I: measurement rounds of online fitting, the paper's against the simulated ones
(measured rounds only, and model-assisted)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import (
    BROKERS,
    SLO_MS,
    FigureResult,
    claim,
    figure_model,
    profiled_bucket,
    pyplot,
    write,
)
from srtm.experiments.figures.groups import GROUP_BATCH, GROUP_PUBLISHERS, GROUP_SIZES
from srtm.placement import BrokerCapacity, Finished, Fitting
from srtm.sim.arrivals import generate, homogeneous
from srtm.sim.model import BrokerModel
from srtm.sim.placing import topic_of
from srtm.sim.predict import BrokerSim, Predictor, SimRounds, run_fitting

#: Table I as published: measurement rounds per iteration, per group size.
PAPER_TABLE1: dict[int, tuple[int, ...]] = {
    5: (1,),
    10: (2, 1),
    15: (5, 3, 1),
    20: (5, 4, 2, 1),
    25: (3, 4, 4, 2, 1),
    30: (3, 5, 3, 2, 3, 1),
}


def fit_topic(
    group: int,
    *,
    assisted: bool,
    process: str = "periodic",
    window_s: float = 60.0,
    profile_s: float = 20.0,
    seed: int = 0,
    model: BrokerModel | None = None,
    publishers: int = GROUP_PUBLISHERS,
    adaptor: bool = False,
) -> tuple[Finished, Fitting, int]:
    """Online fitting of the Table I topic (groups of ``group``, batch 10) on 6 idle
    brokers, SRTM policy; measurement rounds are simulated (``SimRounds``). With
    ``assisted`` the predictor simulates the profiled trace first. Returns the result,
    the state machine, and how many simulations the predictor ran."""
    m = figure_model(model)
    specs = homogeneous(publishers, process=process, batch=GROUP_BATCH, group_size=group)
    profiled = generate(specs, profile_s, seed=seed)
    topic = topic_of(specs, profiled_bucket(profiled), SLO_MS)
    brokers = [BrokerCapacity(f"b{i + 1}", m.mcap) for i in range(BROKERS)]
    models = {b.id: m for b in brokers}
    predictor = (
        Predictor(
            {b.id: BrokerSim(profiled, topic, m, seed=seed + 1, adaptor=adaptor) for b in brokers}
        )
        if assisted
        else None
    )
    fitting = Fitting(brokers, topic, "srtm", window_s=window_s, seed=seed, predict=predictor)
    # Periodic publishers repeat the profiled pattern exactly (the same phases), so the
    # rounds replay the profiled trace's seed; Poisson traffic is new every round.
    rounds = SimRounds(
        specs,
        topic,
        models,
        {},
        window_s=window_s,
        seed=seed,
        fresh=process != "periodic",
        adaptor=True,
    )
    done = run_fitting(fitting, rounds)
    return done, fitting, predictor.calls if predictor else 0


def table1(
    out_dir: Path, *, seed: int = 0, quick: bool = False, model: BrokerModel | None = None
) -> FigureResult:
    """Measurement rounds of online fitting: the paper's, measured-only, model-assisted."""
    t0 = time.perf_counter()
    sizes = (5, 20) if quick else GROUP_SIZES
    window = 10.0 if quick else 60.0
    data: dict[str, Any] = {"window_s": window, "groups": {}}
    rows = []
    for g in sizes:
        entry: dict[str, Any] = {
            "paper": {
                "rounds": list(PAPER_TABLE1[g]),
                "total": sum(PAPER_TABLE1[g]),
                "brokers": len(PAPER_TABLE1[g]),
            }
        }
        for method, assisted in (("measured", False), ("model_assisted", True)):
            t = time.perf_counter()
            done, _, sims = fit_topic(g, assisted=assisted, window_s=window, seed=seed, model=model)
            entry[method] = {
                "rounds": list(done.rounds),
                "total": sum(done.rounds),
                "brokers": len(done.assignment),
                "unassigned": len(done.unassigned),
                "kept": {b: len(ps) for b, ps in done.assignment.items()},
                "time_s": sum(done.rounds) * window,
                "predictor_sims": sims,
                "compute_s": time.perf_counter() - t,
            }
        data["groups"][str(g)] = entry
        p, me, ma = entry["paper"], entry["measured"], entry["model_assisted"]
        rows.append(
            [
                g,
                " ".join(map(str, p["rounds"])),
                p["total"],
                p["brokers"],
                " ".join(map(str, me["rounds"])),
                me["total"],
                me["brokers"],
                " ".join(map(str, ma["rounds"])),
                ma["total"],
                ma["brokers"],
            ]
        )
    groups = data["groups"].values()
    worst = max(e["model_assisted"]["total"] for e in groups)
    totals = [e["measured"]["total"] for e in groups]
    brokers = [e["measured"]["brokers"] for e in groups]
    data["claims"] = [
        claim(
            "fitting takes 1–17 rounds of 60 s, the fewest for the least bursty topic and "
            "the most for the burstiest",
            "measured-only: " + ", ".join(map(str, totals)) + " rounds",
            all(1 <= t <= 17 for t in totals)
            and totals[0] == min(totals)
            and totals[-1] == max(totals),
        ),
        claim(
            "groups of 5, 10, …, 30 need 1, 2, …, 6 brokers",
            "measured-only: " + ", ".join(map(str, brokers)) + " brokers",
            brokers == [len(PAPER_TABLE1[g]) for g in sizes],
        ),
        claim(
            "(issue 7 target) model-assisted fitting converges in ≤ 2 rounds",
            f"at most {worst} rounds",
            worst <= 2,
        ),
    ]
    fig, ax = pyplot().subplots(figsize=(6.4, 3.6))
    xs = list(range(len(sizes)))
    width = 0.27
    for i, (key, label) in enumerate(
        (
            ("paper", "paper (live)"),
            ("measured", "measured only (sim)"),
            ("model_assisted", "model-assisted (sim)"),
        )
    ):
        ax.bar(
            [x + (i - 1) * width for x in xs],
            [data["groups"][str(g)][key]["total"] for g in sizes],
            width,
            label=label,
        )
    ax.set_xticks(xs, [str(g) for g in sizes])
    ax.set_xlabel("group size")
    ax.set_ylabel(f"measurement rounds ({window:g} s each)")
    ax.set_title("Table I: load distribution latency", fontsize=10)
    ax.legend(fontsize=8)
    res = FigureResult(
        "table1",
        "Table I: measurement rounds of online fitting",
        data,
        [
            "group",
            "paper rounds",
            "paper total",
            "paper brokers",
            "measured rounds",
            "measured total",
            "measured brokers",
            "assisted rounds",
            "assisted total",
            "assisted brokers",
        ],
        rows,
    )
    return write(res, out_dir, fig, t0)
