"""Live runs against the simulator: the p99 each prediction gives for a run, next to the
measured one (issue 7's validation)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srtm.experiments.figures.common import FigureResult, axes, claim, write
from srtm.placement import POLICIES
from srtm.ratelimit import BucketParams
from srtm.sim.model import BrokerModel

if TYPE_CHECKING:
    from srtm.experiments.scenarios.scenario import Scenario
    from srtm.sim.scenario import LiveSetup

#: Predicted p99 within this factor of the measured one counts as a match (issue 7).
TOLERANCE = 0.3


def validate_live(
    out_dir: Path,
    runs: Sequence[Path],
    model: BrokerModel | str | Path,
    scenario: str = "correlated-sensors",
) -> FigureResult:
    """Live runs of ``scenario`` (each directory as ``srtm experiment run`` leaves it:
    ``<scenario>-<policy>.json`` and ``traces/``) against the simulator with ``model``.

    Three predictions per run: **schedule** (the workload's nominal schedule on the run's
    final assignment and sub-buckets), **replay** (the arrivals the brokers recorded, so
    the publishers' real timing, stalls included, on the same buckets) and **own** (the
    simulator places and fits by itself from the schedule)."""
    from srtm.experiments import analysis, scenarios
    from srtm.sim.model import load
    from srtm.sim.scenario import predict, replay

    t0 = time.perf_counter()
    m = model if isinstance(model, BrokerModel) else load(model)
    sc = scenarios.load(scenario)
    setups: dict[float, tuple[LiveSetup, dict[str, float]]] = {}
    rows, entries = [], []
    for run_dir in runs:
        for policy in POLICIES:
            summary_path = run_dir / f"{sc.name}-{policy}.json"
            meta_path = run_dir / "traces" / "runs" / f"{sc.name}-{policy}.json"
            if not (summary_path.exists() and meta_path.exists()):
                continue
            summary = json.loads(summary_path.read_text())
            meta = json.loads(meta_path.read_text())
            # a run on a slow machine ran its scenario slowed in time: simulate that one
            scale = float((summary.get("sizing") or {}).get("scale") or 1.0)
            if scale not in setups:
                setups[scale] = live_setup(sc, scale)
            setup, preload = setups[scale]
            docs = meta.get("buckets") or {}
            if not docs or any(v is None for v in docs.values()):
                continue  # a run without sub-buckets cannot be replayed
            buckets = {b: BucketParams(v["rate"], v["burst"]) for b, v in docs.items()}
            measured = float(summary["e2e_ms"]["p99"])
            sched = predict(setup, m, policy, assignment=meta["assignment"], buckets=buckets)
            brokers, _ = analysis.load(run_dir / "traces", meta["run"])
            brokers = brokers[brokers["topic"] == meta.get("topic", sc.topic)]  # not preloads
            arrivals = {str(b): g["t_arrive_ns"].to_numpy() for b, g in brokers.groupby("broker")}
            window = (int(meta["window_start_ns"]), int(meta["window_end_ns"]))
            rep = replay(arrivals, buckets, m, float(meta["capacity"]), window, preload=preload)
            own = predict(setup, m, policy)
            entry = {
                "run": str(run_dir),
                "policy": policy,
                "measured_p99_ms": measured,
                "measured_token_p99_ms": float(summary["token_wait_ms"]["p99"]),
                "send_lateness_p999_us": summary.get("emulator", {})
                .get("send_lateness", {})
                .get("p999_us"),
                "schedule_p99_ms": sched.p99_ms,
                "replay_p99_ms": rep.p99_ms,
                "replay_token_p99_ms": rep.topic.token_p99_ms,
                "own_p99_ms": own.p99_ms,
                "own_brokers": len(own.assignment),
                "live_brokers": len(meta["assignment"]),
            }
            for key in ("schedule", "replay", "own"):
                entry[f"{key}_ok"] = abs(entry[f"{key}_p99_ms"] / measured - 1) <= TOLERANCE
            entries.append(entry)
            rows.append(
                [
                    run_dir.name,
                    policy,
                    measured,
                    entry["measured_token_p99_ms"],
                    sched.p99_ms,
                    rep.p99_ms,
                    own.p99_ms,
                    f"{rep.p99_ms / measured:.2f}",
                    "yes" if entry["replay_ok"] else "no",
                ]
            )
    n = len(entries)
    data: dict[str, Any] = {
        "scenario": sc.name,
        "model": m.name,
        "tolerance": TOLERANCE,
        "runs": entries,
        "claims": [
            claim(
                f"(issue 7 target) predicted p99 within ±{TOLERANCE:.0%} of the measured one",
                f"replay: {sum(e['replay_ok'] for e in entries)} of {n}; schedule: "
                f"{sum(e['schedule_ok'] for e in entries)} of {n}; own placement: "
                f"{sum(e['own_ok'] for e in entries)} of {n}",
                n > 0 and all(e["replay_ok"] for e in entries),
            ),
        ],
    }
    fig, (ax,) = axes(1, f"Validation: {sc.name}, measured vs simulated p99")
    xs = list(range(n))
    for i, (key, label) in enumerate(
        (
            ("measured_p99_ms", "measured"),
            ("replay_p99_ms", "replay"),
            ("schedule_p99_ms", "schedule"),
            ("own_p99_ms", "own"),
        )
    ):
        ax.bar([x + (i - 1.5) * 0.2 for x in xs], [e[key] for e in entries], 0.2, label=label)
    ax.set_xticks(xs, [f"{Path(e['run']).name}\n{e['policy']}" for e in entries], fontsize=7)
    ax.set_ylabel("p99 latency (ms)")
    ax.axhline(sc.slo_p99_ms, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=8)
    res = FigureResult(
        "validation",
        f"Validation: {sc.name}",
        data,
        [
            "run",
            "policy",
            "measured p99 ms",
            "measured token p99 ms",
            "schedule ms",
            "replay ms",
            "own ms",
            "replay / measured",
            f"replay within ±{TOLERANCE:.0%}",
        ],
        rows,
    )
    return write(res, out_dir, fig, t0)


def live_setup(sc: Scenario, scale: float = 1.0) -> tuple[LiveSetup, dict[str, float]]:
    """The simulator's view of ``sc`` as a live run at ``scale`` ran it (the run's
    ``sizing.scale``: rates, capacities and the SLO slowed in time, as
    ``srtm.experiments.sizing.scaled`` slows them), and the preloads by broker."""
    from srtm.experiments.scenarios.live import profile
    from srtm.experiments.sizing import scaled
    from srtm.sim.scenario import LiveSetup

    sc = scaled(sc, scale)
    rate, burst = profile(sc)
    setup = LiveSetup(
        sc.specs(),
        BucketParams(rate, burst),
        sc.slo_p99_ms,
        sc.brokers,
        sc.capacity,
        sc.mcap,
        sc.spread_ms / 1e3,
        sc.seed,
        sc.duration_s,
        {str(p.broker): p.rate for p in sc.preload},
        sc.fit.window_s if sc.fit else None,
    )
    return setup, {str(p.broker): p.rate for p in sc.preload}
