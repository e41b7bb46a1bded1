"""The demo, run again and again: does it reach the same conclusion every time, here and on
a slowed machine?

Runs ``srtm demo --json`` RUNS times in a row, each in its own output directory, and
prints one row per run: the scale the demo chose for this machine, LB's and SRTM's p99
and brokers with the publishers in block order, their p99s in shuffled order, SRTM's
fitting rounds and outcome, whether each run was valid, and the conclusion.
``--cpu-quota Q`` runs every demo (and so every process it starts) in a cgroup limited to
Q CPUs (cgroup v1 or v2, as root), which stands for a slower machine; ``--cpus
0`` pins them to those CPUs with taskset instead. The anchor in the same run is LB, which
fitting does not touch.

    .venv/bin/python benchmarks/demo_runs.py [--runs 10] [--cpu-quota 1.0] [--out DIR]

A run counts as "as the paper says" when it is valid, SRTM is within the SLO and uses
fewer brokers than LB, and the conclusion names SRTM alone within the SLO (in block
order, the paper's setting; the shuffled order's figures are shown beside it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

SRTM = str(Path(sys.executable).with_name("srtm"))
console = Console()


def _cgroup(quota: float, period_ms: float) -> Path:
    """A cgroup limited to ``quota`` CPUs per ``period_ms`` (v2 if mounted, else v1's cpu
    controller)."""
    root = Path("/sys/fs/cgroup")
    period = int(period_ms * 1000)
    if (root / "cgroup.controllers").exists():  # v2
        group = root / "srtm-demo-runs"
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{int(quota * period)} {period}")
    else:
        group = root / "cpu" / "srtm-demo-runs"
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(quota * period)))
    return group


def _run(i: int, out: Path, quota: Path | None, cpus: str | None, extra: list[str]) -> dict:
    cmd = [SRTM, "demo", "--json", "--out", str(out / f"run-{i}"), *extra]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]

    def enter() -> None:
        if quota is not None:
            (quota / "cgroup.procs").write_text(str(os.getpid()))

    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=enter, check=False)
    took = time.monotonic() - started
    (out / f"run-{i}.log").write_text(done.stdout + done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"run": i, "error": f"exit {done.returncode}", "seconds": took}
    by_order = {d.get("publisher_order", "block"): d for d in map(json.loads, lines)}
    doc: dict[str, Any] = by_order.get("block") or next(iter(by_order.values()))
    doc["shuffled"] = by_order.get("shuffled")
    srtm = json.loads((out / f"run-{i}" / "correlated-sensors-srtm.json").read_text())
    doc |= {"run": i, "seconds": took, "sizing": srtm.get("sizing"),
            "fitting_rounds": srtm.get("fitting_rounds"),
            "fitting_outcome": _outcome(out / f"run-{i}")}  # fmt: skip
    return doc


def _p99(policies: dict[str, Any], policy: str) -> str:
    return f"{policies[policy]['p99_ms']:.1f}" if policy in policies else "-"


def _outcome(run: Path) -> str | None:
    meta = run / "traces" / "runs" / "correlated-sensors-srtm.json"
    fitting = json.loads(meta.read_text()).get("fitting") or {}
    return fitting.get("outcome") or fitting.get("state")


def as_paper(doc: dict[str, Any]) -> bool:
    """Valid, SRTM within the SLO on fewer brokers than LB, and said so."""
    pol = doc.get("policies", {})
    lb, srtm = pol.get("lb", {}), pol.get("srtm", {})
    return (
        not doc.get("disturbed", True)
        and srtm.get("within_slo", srtm.get("p99_ms", 1e9) <= doc.get("slo_p99_ms", 0)) is True
        and srtm.get("brokers_used", 99) < lb.get("brokers_used", 0)
        and (doc.get("conclusion") or "").startswith("Within the SLO")
        and "SRTM" in (doc.get("conclusion") or "").split(";")[0]
    )


def main(
    runs: Annotated[int, typer.Option(min=1, help="Demo runs, one after another.")] = 10,
    cpu_quota: Annotated[
        float | None, typer.Option(help="Run every demo in a cgroup of this many CPUs (root).")
    ] = None,
    cpu_period_ms: Annotated[
        float,
        typer.Option(
            help="The quota's period: a group that spends its quota early in a period waits "
            "for the next, so a long period stalls in bursts (100 ms is systemd's default)."
        ),
    ] = 100.0,
    cpus: Annotated[
        str | None, typer.Option(help="Pin every demo to these CPUs (taskset -c).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where each run's output goes.")] = Path(
        "out/demo-runs"
    ),
    scale: Annotated[str, typer.Option(help="The demo's --scale.")] = "auto",
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    quota = _cgroup(cpu_quota, cpu_period_ms) if cpu_quota is not None else None
    docs = []
    for i in range(1, runs + 1):
        console.print(f"run {i} of {runs} …")
        docs.append(_run(i, out, quota, cpus, ["--scale", scale]))
        (out / "runs.json").write_text(json.dumps(docs, indent=2))
    table = Table(title=f"srtm demo × {runs}"
                  + (f", CPU quota {cpu_quota:g} per {cpu_period_ms:g} ms" if quota else "")
                  + (f", taskset {cpus}" if cpus else ""))  # fmt: skip
    for col in ("run", "scale", "SLO ms", "LB p99", "LB brokers", "SRTM p99", "SRTM brokers",
                "shuffled: LB p99", "SRTM p99", "rounds", "fitting", "valid", "as the paper",
                "s"):  # fmt: skip
        table.add_column(col, justify="right")
    for d in docs:
        if "error" in d:
            table.add_row(str(d["run"]), d["error"], *[""] * 11, f"{d['seconds']:.0f}")
            continue
        lb, sr = d["policies"]["lb"], d["policies"]["srtm"]
        mixed = (d.get("shuffled") or {}).get("policies", {})
        table.add_row(
            str(d["run"]), f"{(d.get('sizing') or {}).get('scale', '')}",
            f"{d['slo_p99_ms']:.3g}", f"{lb['p99_ms']:.1f}", str(lb["brokers_used"]),
            f"{sr['p99_ms']:.1f}", str(sr["brokers_used"]), _p99(mixed, "lb"), _p99(mixed, "srtm"),
            str(sum(d["fitting_rounds"] or [])), str(d["fitting_outcome"]),
            "no" if d["disturbed"] or (d.get("shuffled") or {}).get("disturbed") else "yes",
            "yes" if as_paper(d) else "NO", f"{d['seconds']:.0f}",
        )  # fmt: skip
    console.print(table)
    good = sum(as_paper(d) for d in docs if "error" not in d)
    secs = [d["seconds"] for d in docs]
    console.print(f"as the paper says: {good} of {runs}; seconds per run: median "
                  f"{statistics.median(secs):.0f} ({min(secs):.0f}-{max(secs):.0f})")  # fmt: skip
    for d in docs:
        if "error" not in d:
            console.print(f"run {d['run']}: {d.get('conclusion') or 'no conclusion'}",
                          highlight=False)  # fmt: skip


if __name__ == "__main__":
    typer.run(main)
