"""The diurnal day: the rebalancer's loop on against off over a compressed day of sensor
traffic. ``sim`` runs it at the paper's scale, ``live`` on local brokers, ``report`` shows
either (terminal tables, the plot, the live run's HTML page)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import ClassVar

from srtm.experiments.experiment import (
    Mode,
    Option,
    RunSettings,
    Summary,
    UsageError,
    unsized,
    verdict,
)

NAME = "diurnal"
#: The two runs of the day: the rebalancer's loop on, then off.
RUNS = ("on", "off")


@dataclass(frozen=True)
class Diurnal:
    """``diurnal``: simulated, or live (``--duration``: the day's length in s; ``--only
    on|off``: one of the two live runs; not sized to the machine, ``--scale``)."""

    name: str = NAME
    description: str = "a compressed day, the rebalancer's loop on against off"
    sim_options: ClassVar[frozenset[Option]] = frozenset()
    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.duration, Option.only, Option.scale}
    )

    def sim(self, run: RunSettings) -> Summary:
        from srtm.experiments.diurnal import report, sim

        with run.term.err.status("diurnal --sim: loop on, then off"):
            result = sim.diurnal_sim(run.out)
        report.print_sim(result, run.term.err, run.term.out, run.as_json)
        ok = all(c["ok"] for c in result.data["claims"])
        document = json.dumps(result.data)
        done = verdict(disturbed=False, ok=ok)
        return Summary(NAME, Mode.sim, (document,), done, tuple(result.files))

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.diurnal import live, report

        if run.only is not None and run.only not in RUNS:
            raise UsageError("--only", f"one of {', '.join(RUNS)}, got {run.only!r}")
        unsized(run.scale, NAME, live.NOT_SIZED, run.term)
        s = live.LiveDiurnal()
        if run.duration_s is not None:
            s = replace(s, day_s=run.duration_s)
        loops = RUNS if run.only is None else (run.only,)
        which = ", then ".join(f"loop {x}" for x in loops)
        with run.term.err.status(f"diurnal live: a {s.day_s:g}-s day, {which}") as status:

            def progress(phase: str, done: float, total: float) -> None:
                status.update(f"diurnal live: {phase} ({done:.0f} of {total:.0f} s)")

            data = live.diurnal_live(run.out, s, loops=loops, on_progress=progress)
        report.print_live(data, s.mcap, s.slo_ms, run.term.err, run.term.out, run.as_json)
        ok = all(c["ok"] for c in data.get("claims", []))
        bad = any(data["disturbed"].values())
        document = json.dumps(data, default=report.plain)
        written = live.report_files(run.out, loops)
        return Summary(NAME, Mode.live, (document,), verdict(disturbed=bad, ok=ok), written)


EXPERIMENT = Diurnal()
