"""Fig. 6: max-min. Conc against Max-Min on brokers preloaded with 10–80 kmsg/s."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import (
    PANELS,
    PRELOAD_BATCH,
    PRELOADS,
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


def fig6(
    out_dir: Path, *, seed: int = 0, quick: bool = False, model: BrokerModel | None = None
) -> FigureResult:
    """Conc against MaxMin on brokers preloaded with 10–80 kmsg/s of Poisson traffic."""
    t0 = time.perf_counter()
    counts = (2_000, 8_000) if quick else (2_000, 4_000, 6_000, 8_000, 10_000)
    panels = PANELS[:1] if quick else PANELS
    data: dict[str, Any] = {"preload": list(PRELOADS), "panels": {}}
    rows = []
    fig, grid = axes(
        len(panels),
        "Fig. 6: max-min, brokers preloaded 10, 40, 50, 60, 70, 80 kmsg/s (Poisson, batch 10)",
    )
    at8k: dict[str, dict[str, Any]] = {}
    for ax, (process, batch) in zip(grid, panels, strict=True):
        panel: dict[str, Any] = {}
        for policy in ("conc", "maxmin"):
            series: list[dict[str, Any]] = []
            for n in counts:
                setup = Setup(
                    homogeneous(n, process=process, batch=batch),
                    PRELOADS,
                    PRELOAD_BATCH,
                    duration_s=duration_for(n, quick),
                    seed=seed,
                    model=figure_model(model),
                )
                o = run(setup, policy)
                per_broker = {b: r.stats.p99_ms for b, r in o.result.brokers.items()}
                worst = max(per_broker.values())
                series.append(
                    {
                        "publishers": n,
                        "p99_ms": o.p99_ms,
                        "worst_broker_p99_ms": worst,
                        "k": o.k,
                        "brokers": per_broker,
                        "rates": {a.broker: a.rate for a in o.choice.placement.assignments},
                    }
                )
                rows.append(
                    [
                        panel_name(process, batch),
                        policy,
                        n,
                        o.p99_ms,
                        worst,
                        o.k,
                        " ".join(f"{b}:{v:.2f}" for b, v in per_broker.items()),
                    ]
                )
                if n == 8_000 and (process, batch) == ("poisson", 1):
                    at8k[policy] = series[-1]
            panel[policy] = series
            xs = [s["publishers"] for s in series]
            ys = [s["worst_broker_p99_ms"] for s in series]
            ax.plot(xs, ys, marker="o", label="Conc" if policy == "conc" else "Max-Min")
            label_points(ax, xs, ys, [s["k"] for s in series])
        data["panels"][panel_name(process, batch)] = panel
        slo_axis(ax)
        ax.set_ylabel("p99 of the worst broker (ms)")
        ax.set_title(panel_name(process, batch), fontsize=9)
        ax.set_xlabel("publishers")
        ax.legend(fontsize=8)
    claims = []
    small = {p: data["panels"][panel_name(*PANELS[0])][p][0] for p in ("conc", "maxmin")}
    claims.append(
        claim(
            "a small topic fits the least-loaded broker; Conc and Max-Min are identical",
            f"{counts[0]:,} publishers: k = {small['conc']['k']} / {small['maxmin']['k']}, p99 "
            f"{small['conc']['p99_ms']:.2f} / {small['maxmin']['p99_ms']:.2f} ms",
            small["conc"]["k"] == small["maxmin"]["k"] == 1
            and math.isclose(small["conc"]["p99_ms"], small["maxmin"]["p99_ms"]),
        )
    )
    if len(at8k) == 2:
        c, m = at8k["conc"], at8k["maxmin"]
        claims.append(
            claim(
                "8k publishers go to brokers 1–3; the most loaded of them gets 1.50 ms under "
                "Conc, 0.87 ms under Max-Min",
                f"k = {c['k']} / {m['k']}; worst broker {c['worst_broker_p99_ms']:.2f} ms (Conc) "
                f"vs {m['worst_broker_p99_ms']:.2f} ms (Max-Min)",
                c["k"] == m["k"] == 3
                and c["worst_broker_p99_ms"] > SLO_MS >= m["worst_broker_p99_ms"],
            )
        )
    claims += _burst_claims(data["panels"], counts)
    data["claims"] = claims
    data["at_8k"] = at8k
    res = FigureResult(
        "fig6",
        "Fig. 6: impact of max-min on p99 latency",
        data,
        [
            "workload",
            "policy",
            "publishers",
            "topic p99 ms",
            "worst broker ms",
            "brokers",
            "p99 per broker (ms)",
        ],
        rows,
    )
    return write(res, out_dir, fig, t0)


def _burst_claims(panels: Mapping[str, Any], counts: Sequence[int]) -> list[dict[str, Any]]:
    """Figs. 6b/6d: batch 10 against batch 1, and Conc from 8k to 10k publishers."""
    claims = []
    for process in ("poisson", "periodic"):
        b1, b10 = panels.get(panel_name(process, 1)), panels.get(panel_name(process, 10))
        if b1 is None or b10 is None:
            continue
        pairs = [
            (x["worst_broker_p99_ms"], y["worst_broker_p99_ms"])
            for policy in ("conc", "maxmin")
            for x, y in zip(b1[policy], b10[policy], strict=True)
        ]
        better = sum(y <= x for x, y in pairs)
        claims.append(
            claim(
                f"{process}: with batch 10 both do as well as or better than with batch 1 "
                "(fewer connection wake-ups per message)",
                f"batch 10 no worse in {better} of {len(pairs)} points",
                better == len(pairs),
            )
        )
        if 8_000 in counts and 10_000 in counts:
            conc = {s["publishers"]: s for s in b10["conc"]}
            a, b = conc[8_000], conc[10_000]
            claims.append(
                claim(
                    f"{process}, batch 10: Conc improves from 8k to 10k publishers (a small "
                    "residual share on the last broker costs a large DRL penalty at 8k)",
                    f"worst broker {a['worst_broker_p99_ms']:.2f} → "
                    f"{b['worst_broker_p99_ms']:.2f} ms on k = {a['k']} → {b['k']}",
                    b["worst_broker_p99_ms"] < a["worst_broker_p99_ms"],
                )
            )
    return claims
