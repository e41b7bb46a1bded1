"""What every figure writes: ``<name>.png``, ``<name>.md`` (the table and the paper's
claims against the simulation) and ``<name>.json``, and the plotting parts they share."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srtm.experiments.figures.configuration import SLO_MS


@dataclass
class FigureResult:
    name: str
    title: str
    #: JSON-able figure data (``claims``: the paper's conclusions against the simulation).
    data: dict[str, Any]
    columns: list[str]
    rows: list[list[Any]]
    files: list[Path] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "data": self.data,
            "columns": self.columns,
            "rows": self.rows,
            "files": [str(f) for f in self.files],
            "elapsed_s": self.elapsed_s,
        }


def claim(paper_says: str, sim_says: str, ok: bool) -> dict[str, Any]:
    """One of the paper's conclusions, what the simulation shows, and whether they agree."""
    return {"paper": paper_says, "sim": sim_says, "ok": bool(ok)}


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "—" if math.isnan(x) else f"{x:.3g}"
    return str(x)


def write(result: FigureResult, out_dir: Path, fig: Any, started: float) -> FigureResult:
    """Write ``result``'s three files (``fig`` is the plot), timed from ``started``
    (``time.perf_counter``), and return it with its files listed."""
    result.elapsed_s = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{result.name}.png"
    fig.tight_layout()
    fig.savefig(png, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    md = out_dir / f"{result.name}.md"
    lines = [
        f"# {result.title}",
        "",
        "| " + " | ".join(result.columns) + " |",
        "|" + "---|" * len(result.columns),
    ]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in result.rows]
    claims = result.data.get("claims", [])
    if claims:
        lines += ["", "| paper's conclusion | simulation | reproduced |", "|---|---|---|"]
        lines += [f"| {c['paper']} | {c['sim']} | {'yes' if c['ok'] else 'no'} |" for c in claims]
    md.write_text("\n".join(lines) + "\n")
    js = out_dir / f"{result.name}.json"
    js.write_text(json.dumps(result.to_json() | {"files": [str(png), str(md)]}, indent=2))
    result.files = [png, md, js]
    return result


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (imported when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def axes(n: int, title: str) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels, two to a row."""
    cols = min(n, 2)
    rows = -(-n // cols)
    fig, grid = pyplot().subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    fig.suptitle(title, fontsize=10)
    return fig, [a for row in grid for a in row][:n]


def slo_axis(ax: Any) -> None:
    """A log latency axis with the SLO drawn on it."""
    ax.axhline(SLO_MS, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_ylabel("p99 latency (ms)")


def label_points(ax: Any, xs: Sequence[float], ys: Sequence[float], labels: Sequence[Any]) -> None:
    """Each point's label (the brokers used) beside it."""
    for x, y, text in zip(xs, ys, labels, strict=True):
        ax.annotate(str(text), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")


#: The four workloads of Figs. 5 and 6, as (process, batch).
PANELS: tuple[tuple[str, int], ...] = (
    ("poisson", 1),
    ("poisson", 10),
    ("periodic", 1),
    ("periodic", 10),
)


def panel_name(process: str, batch: int) -> str:
    return f"{process}, batch {batch}"
