"""Fig. 8: as Fig. 7, with Max-Min held to the number of brokers SRTM uses."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from srtm.experiments.figures.common import FigureResult, claim
from srtm.experiments.figures.groups import by_group_size, panel_points
from srtm.sim.model import BrokerModel


def fig8(
    out_dir: Path, *, seed: int = 0, quick: bool = False, model: BrokerModel | None = None
) -> FigureResult:
    """As Fig. 7, with Max-Min held to the number of brokers SRTM uses."""
    title = "Fig. 8: Max-Min on as many brokers as SRTM"
    return by_group_size(
        "fig8", title, out_dir, _claims, model=model, forced=True, seed=seed, quick=quick
    )


def _claims(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    pts = panel_points(data)
    worse = sum(m["p99_ms"] >= s["p99_ms"] for s, m in pts if s["k"] > 1)
    multi = sum(1 for s, _ in pts if s["k"] > 1)
    return [
        claim(
            "held to SRTM's brokers, Max-Min does even worse than SRTM",
            f"Max-Min's p99 higher in {worse} of {multi} points where SRTM splits",
            multi > 0 and worse == multi,
        ),
    ]
