"""control-plane-faults' report: the checks against issue 31's numbers (pure), a table
per fault in the terminal, and the same table in Markdown for docs/results."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Any

from rich.console import Console
from rich.table import Table

from srtm.experiments.control_plane.measure import SHARE_TOLERANCE, FaultRow
from srtm.experiments.control_plane.scenario import FAULT_TEXT, FaultKind

#: Issue 31's numbers.
MAX_TAKEOVER_S = 3.0
#: With every controller down, delivery keeps up with publishing: received over published
#: in the outage at least this (the edges of the span shift a few messages either way).
MIN_DELIVERY_RATIO = 0.95

#: How a broker is partitioned here, for the report and the document.
PARTITION = (
    "made without namespaces (so that it runs without root): each broker reaches etcd "
    "and the controllers through cuttable links started by the run (TCP to etcd; HTTP "
    "to the controllers, a 307's "
    "Location rewritten to the leader's link); the broker with the largest live shares "
    "has its links cut (they stall silently). Its clients reach it directly, and the "
    "controllers' pushes to it are not cut."
)


def checks(
    rows: Sequence[FaultRow], published: int, delivered: int, max_share_ratio: float
) -> list[dict[str, Any]]:
    """Each of issue 31's numbers: what it asks, what the run measured, met or not."""
    by = {r.fault: r for r in rows}
    kill = by.get(FaultKind.kill_leader)
    took = None if kill is None else kill.takeover_s
    control = [r for r in rows if r.control]
    lost = sum(r.windows - r.windows_met for r in control)
    total = sum(r.windows for r in control)
    down = by.get(FaultKind.controllers_down)
    ratio = None if down is None else down.delivery_ratio
    return [
        _check(f"takeover after kill -9 of the leader ≤ {MAX_TAKEOVER_S:g} s",
               "no takeover" if took is None else f"{took:.2f} s",
               took is not None and took <= MAX_TAKEOVER_S),
        _check("no SLO window lost to a controller fault",
               f"{lost} of {total} (topic, window)s missed, over "
               f"{', '.join(r.fault.value for r in control)}", bool(control) and lost == 0),
        _check("no acknowledged message lost",
               f"{published:,} acknowledged, {delivered:,} of them delivered",
               published > 0 and published == delivered),
        _check("no poll with Σ live shares over r",
               f"largest Σ shares / r seen: {max_share_ratio:.4f}",
               max_share_ratio <= 1.0 + SHARE_TOLERANCE),
        _check("every controller down: delivery goes on at the published rate",
               "not run" if ratio is None else f"received / published while down: {ratio:.3f}",
               ratio is not None and ratio >= MIN_DELIVERY_RATIO),
    ]  # fmt: skip


def _check(what: str, measured: str, ok: bool) -> dict[str, Any]:
    return {"check": what, "measured": measured, "ok": bool(ok)}


#: The fault table's columns.
COLUMNS = (
    "fault", "on", "takeover s", "SLO windows met", "plan versions", "published",
    "delivered", "max Σ shares / r", "leaders at once",
)  # fmt: skip


def cells(row: dict[str, Any]) -> tuple[str, ...]:
    """One fault row (its JSON form) as the table's cells."""
    took = row["takeover_s"]
    before, after = row["plan_before"], row["plan_after"]
    versions = ", ".join(f"{t.removeprefix('tenant-')} {before.get(t, '?')}→{after.get(t, '?')}"
                         for t in sorted(set(before) | set(after)))  # fmt: skip
    delivered = f"{row['delivered']:,}"
    if row.get("delivery_ratio") is not None:
        delivered += f" (rate while down {row['delivery_ratio']:.0%})"
    return (
        FAULT_TEXT[FaultKind(row["fault"])], row["target"],
        "none" if took is None else f"{took:.2f}",
        f"{row['windows_met']} of {row['windows']}", versions, f"{row['published']:,}",
        delivered, f"{row['max_share_ratio']:.4f}", str(row["leaders_at_once"]),
    )  # fmt: skip


def print_live(data: dict[str, Any], out: Console) -> None:
    table = Table(title="control-plane-faults: a row per fault (from the fault to its settling)")
    for col in COLUMNS:
        table.add_column(col)
    for row in data["faults"]:
        table.add_row(*cells(row))
    out.print(table)
    verdicts = Table(title="issue 31's numbers")
    for col in ("check", "measured", "ok"):
        verdicts.add_column(col)
    for c in data["checks"]:
        verdicts.add_row(c["check"], c["measured"], "yes" if c["ok"] else "NO")
    out.print(verdicts)
    out.print(f"partition: {data['partition']}", highlight=False)
    why = data.get("disturbed")
    out.print(f"disturbed: {why}" if why else "not disturbed", highlight=False)


def markdown(data: dict[str, Any]) -> str:
    """The fault table and the checks as Markdown (docs/results)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in data["faults"]]
    lines += ["", "| check | measured | met |", "|---|---|---|"]
    lines += [f"| {c['check']} | {c['measured']} | {'yes' if c['ok'] else 'no'} |"
              for c in data["checks"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def plain(x: Any) -> Any:
    """JSON for what json does not know: NaN as null, enums by value."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, Enum):
        return x.value
    return str(x)
