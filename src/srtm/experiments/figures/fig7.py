"""Fig. 7: correlation-aware allocation, SRTM against Max-Min with groups in lockstep."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import FigureResult, claim
from srtm.experiments.figures.groups import by_group_size, panel_points
from srtm.sim.model import BrokerModel


def fig7(
    out_dir: Path, *, seed: int = 0, quick: bool = False, model: BrokerModel | None = None
) -> FigureResult:
    """SRTM against Max-Min, perfectly correlated groups of 5–30 publishers."""
    title = "Fig. 7: correlation-aware allocation (groups in lockstep)"
    return by_group_size(
        "fig7", title, out_dir, _claims, model=model, forced=False, seed=seed, quick=quick
    )


def _claims(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    pts = panel_points(data)
    more = sum(s["k"] >= m["k"] for s, m in pts)
    better = sum(s["p99_ms"] <= m["p99_ms"] for s, m in pts)
    grows = [[p["k"] for p in panel["srtm"]] for panel in data["panels"].values()]
    return [
        claim(
            "SRTM uses at least as many brokers as Max-Min (it can split bursts)",
            f"in {more} of {len(pts)} points",
            more == len(pts),
        ),
        claim(
            "SRTM's p99 is no worse than Max-Min's",
            f"in {better} of {len(pts)} points",
            better == len(pts),
        ),
        claim(
            "burstier topics (larger groups) need more brokers",
            "SRTM brokers by group size: " + "; ".join(map(str, grows)),
            all(ks == sorted(ks) and ks[-1] > ks[0] for ks in grows),
        ),
    ]
