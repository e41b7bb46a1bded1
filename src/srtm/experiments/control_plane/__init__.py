"""control-plane-faults (issue 31 item 6): 3 etcd members, 3 controllers electing a leader
and 3 brokers on etcd leases under a multi-tenant load, through the control plane's
faults, one row each. ``scenario`` defines it (pure), ``measure`` computes what a run saw
(pure), ``link`` partitions a broker, ``live`` runs it, ``report`` shows it."""

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

NAME = "control-plane-faults"
#: Why it is not sized to the machine: its load is light (about 350 msg/s sent, a tenth
#: of the demo's), and its figures are times of elections and leases, not of queueing.
NOT_SIZED = "about 350 msg/s on brokers that emulate no capacity: its figures are elections'"


@dataclass(frozen=True)
class ControlPlaneFaults:
    """``control-plane-faults``: live only (``--quick``: short settings; ``--outage-s``:
    how long every controller is down)."""

    name: str = NAME
    description: str = (
        "3 etcd members, 3 controllers, 3 brokers under load: the leader killed and "
        "stopped, an etcd member killed, every controller down, a broker partitioned"
    )
    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.quick, Option.outage_s, Option.strict, Option.scale}
    )

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.control_plane import live, report, scenario

        unsized(run.scale, NAME, NOT_SIZED, run.term)
        s = scenario.quick() if run.quick else scenario.CpScenario()
        if run.outage_s is not None:
            if run.outage_s <= 0:
                raise UsageError("--outage-s", f"seconds > 0, got {run.outage_s:g}")
            s = replace(s, outage_s=run.outage_s)
        with run.term.err.status(f"{NAME}: starting") as status:

            def progress(phase: str, done: float, total: float) -> None:
                status.update(f"{NAME}: {phase} ({done:.0f} of about {total:.0f} s)")

            data = live.run(run.out, s, on_progress=progress)
        report.print_live(data, run.term.out)
        path = live.document_path(run.out)
        run.term.err.print(f"wrote {path}", highlight=False)
        ok = all(c["ok"] for c in data["checks"])
        done = verdict(disturbed=data["disturbed"] is not None, ok=ok)
        document = json.dumps(data, default=report.plain)
        return Summary(NAME, Mode.live, (document,), done, (path,))


EXPERIMENT = ControlPlaneFaults()
