"""Fig. 5: concentration. LB against Conc on idle brokers, by number of publishers."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import (
    PANELS,
    SLO_MS,
    FigureResult,
    Setup,
    axes,
    claim,
    duration_for,
    figure_model,
    label_points,
    panel_name,
    run,
    slo_axis,
    write,
)
from srtm.sim.arrivals import homogeneous
from srtm.sim.model import BrokerModel


def fig5(
    out_dir: Path,
    *,
    seed: int = 0,
    quick: bool = False,
    reps: int = 3,
    model: BrokerModel | None = None,
) -> FigureResult:
    """LB against Conc on idle brokers, by number of publishers."""
    t0 = time.perf_counter()
    counts = (1_000, 4_000) if quick else (1_000, 2_000, 4_000, 6_000, 8_000, 10_000)
    reps = 1 if quick else reps
    panels = PANELS[:2] if quick else PANELS
    data: dict[str, Any] = {"panels": {}}
    rows = []
    fig, grid = axes(len(panels), "Fig. 5: concentration (mean ± sd of p99 over runs)")
    lb_fails = conc_meets = total = 0
    drl_falls: list[bool] = []
    for ax, (process, batch) in zip(grid, panels, strict=True):
        panel: dict[str, Any] = {}
        for policy in ("lb", "conc"):
            series = []
            for n in counts:
                p99s, ks = [], []
                for r in range(reps):
                    setup = Setup(
                        homogeneous(n, process=process, batch=batch),
                        duration_s=duration_for(n, quick),
                        seed=seed + r,
                        model=figure_model(model),
                    )
                    o = run(setup, policy)
                    p99s.append(o.p99_ms)
                    ks.append(o.k)
                mean = statistics.fmean(p99s)
                sd = statistics.pstdev(p99s) if len(p99s) > 1 else 0.0
                k = max(set(ks), key=ks.count)
                series.append({"publishers": n, "p99_ms": mean, "sd_ms": sd, "k": k})
                rows.append([panel_name(process, batch), policy, n, mean, sd, k])
                total += policy == "lb"
                lb_fails += policy == "lb" and mean > SLO_MS
                conc_meets += policy == "conc" and mean <= SLO_MS
            panel[policy] = series
            xs = [s["publishers"] for s in series]
            ys = [s["p99_ms"] for s in series]
            ax.errorbar(
                xs,
                ys,
                yerr=[s["sd_ms"] for s in series],
                marker="o",
                capsize=3,
                label=policy.upper() if policy == "lb" else "Conc",
            )
            label_points(ax, xs, ys, [s["k"] for s in series])
        lb = [s["p99_ms"] for s in panel["lb"]]
        drl_falls.append(lb[-1] < lb[0])
        data["panels"][panel_name(process, batch)] = panel
        slo_axis(ax)
        ax.set_title(panel_name(process, batch), fontsize=9)
        ax.set_xlabel("publishers")
        ax.legend(fontsize=8)
    b1 = {p: data["panels"][panel_name(p, 1)]["lb"][0]["p99_ms"] for p, _ in panels}
    b10 = {
        p: data["panels"].get(panel_name(p, 10), {}).get("lb", [{}])[0].get("p99_ms")
        for p, _ in panels
    }
    burst_worse = [b10[p] > b1[p] for p in b1 if b10.get(p) is not None]
    data["claims"] = [
        claim(
            "LB fails the SLO in every configuration",
            f"LB misses it in {lb_fails} of {total} points",
            lb_fails == total,
        ),
        claim(
            "Conc meets the SLO in every configuration",
            f"Conc meets it in {conc_meets} of {total} points",
            conc_meets == total,
        ),
        claim(
            "the DRL penalty falls as the topic's rate grows",
            f"LB p99 lower at {counts[-1]:,} than at {counts[0]:,} publishers in "
            f"{sum(drl_falls)} of {len(drl_falls)} panels",
            all(drl_falls),
        ),
        claim(
            "burstiness (batch 10) amplifies the DRL penalty",
            f"LB p99 at {counts[0]:,} publishers higher with batch 10 in "
            f"{sum(burst_worse)} of {len(burst_worse)} processes",
            bool(burst_worse) and all(burst_worse),
        ),
    ]
    res = FigureResult(
        "fig5",
        "Fig. 5: impact of concentration on p99 latency",
        data,
        ["workload", "policy", "publishers", "p99 ms (mean)", "sd ms", "brokers"],
        rows,
    )
    return write(res, out_dir, fig, t0)
