"""A simulated figure (``FigureResult``) in the terminal: its table, the paper's claims
checked, and the files it wrote."""

from __future__ import annotations

from srtm.experiments.experiment import Terminal
from srtm.experiments.figures.common import FigureResult


def print_figure(result: FigureResult, term: Terminal) -> None:
    from rich.table import Table

    table = Table(title=f"{result.title} (simulated in {result.elapsed_s:.1f} s)")
    for col in result.columns:
        table.add_column(str(col))
    for row in result.rows:
        table.add_row(*(f"{x:.4g}" if isinstance(x, float) else str(x) for x in row))
    term.out.print(table)
    for claim in result.data.get("claims", []):
        mark = "[green]✓[/green]" if claim["ok"] else "[red]✗[/red]"
        term.err.print(f"{mark} {claim['paper']}: {claim['sim']}")
    for f in result.files:
        term.err.print(f"wrote {f}")
