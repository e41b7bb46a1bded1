"""What Figs. 7–9 share: SRTM against Max-Min on a topic of correlated groups of
publishers, one panel per arrival process, one point per value of what the figure varies."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import (
    FigureResult,
    Setup,
    axes,
    figure_model,
    label_points,
    run,
    slo_axis,
    write,
)
from srtm.sim.arrivals import homogeneous
from srtm.sim.model import BrokerModel
from srtm.workload import PublisherSpec

GROUP_PUBLISHERS = 1_000
GROUP_BATCH = 10
GROUP_SIZES = (5, 10, 15, 20, 25, 30)

#: A figure's claims from its data (``data["panels"]``: process -> policy -> points).
Claims = Callable[[Mapping[str, Any]], list[dict[str, Any]]]


def grouped(process: str, group: int) -> list[PublisherSpec]:
    return homogeneous(GROUP_PUBLISHERS, process=process, batch=GROUP_BATCH, group_size=group)


def groups_figure(
    name: str,
    title: str,
    out_dir: Path,
    xs: Sequence[float],
    setup_of: Callable[[str, float], Setup],
    xlabel: str,
    claims: Claims,
    *,
    forced: bool,
    quick: bool,
) -> FigureResult:
    """SRTM and Max-Min (held to SRTM's brokers when ``forced``) on ``setup_of(process,
    x)`` for each ``x``; written with ``claims`` of the data."""
    t0 = time.perf_counter()
    processes = ("poisson",) if quick else ("poisson", "periodic")
    data: dict[str, Any] = {"panels": {}}
    rows = []
    fig, grid = axes(len(processes), title)
    for ax, process in zip(grid, processes, strict=True):
        panel: dict[str, list[dict[str, Any]]] = {"srtm": [], "maxmin": []}
        for x in xs:
            setup = setup_of(process, x)
            s = run(setup, "srtm")
            m = run(setup, "maxmin", k=s.k if forced else None)
            for policy, o in (("srtm", s), ("maxmin", m)):
                panel[policy].append(
                    {
                        "x": x,
                        "p99_ms": o.p99_ms,
                        "k": o.k,
                        "token_p99_ms": o.result.topic.token_p99_ms,
                    }
                )
                rows.append([process, policy, x, o.p99_ms, o.result.topic.token_p99_ms, o.k])
        for policy, label in (("srtm", "SRTM"), ("maxmin", "Max-Min")):
            pts = panel[policy]
            px, py = [p["x"] for p in pts], [p["p99_ms"] for p in pts]
            ax.plot(px, py, marker="o", label=label)
            label_points(ax, px, py, [p["k"] for p in pts])
        data["panels"][process] = panel
        slo_axis(ax)
        ax.set_title(f"{process}, batch {GROUP_BATCH}, {GROUP_PUBLISHERS:,} publishers", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=8)
    data["claims"] = claims(data)
    res = FigureResult(
        name, title, data, ["process", "policy", xlabel, "p99 ms", "token p99 ms", "brokers"], rows
    )
    return write(res, out_dir, fig, t0)


def by_group_size(
    name: str,
    title: str,
    out_dir: Path,
    claims: Claims,
    *,
    model: BrokerModel | None,
    forced: bool,
    seed: int,
    quick: bool,
) -> FigureResult:
    """Figs. 7 and 8: groups in lockstep, by group size (5–30)."""
    sizes = (5, 20) if quick else GROUP_SIZES
    dur = 4.0 if quick else 20.0

    def setup_of(process: str, g: float) -> Setup:
        return Setup(grouped(process, int(g)), duration_s=dur, seed=seed, model=figure_model(model))

    return groups_figure(
        name, title, out_dir, sizes, setup_of, "group size", claims, forced=forced, quick=quick
    )


def panel_points(data: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(SRTM's point, Max-Min's point) at every x of every panel."""
    return [
        (s, m)
        for panel in data["panels"].values()
        for s, m in zip(panel["srtm"], panel["maxmin"], strict=True)
    ]
