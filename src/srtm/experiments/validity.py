"""Whether a live run measured the brokers or the machine: checks of a run's own figures.

A live run shares the machine's CPUs with everything else on it. When those are short,
the emulator sends late (or skips), the brokers release late and their event loops wait
for a CPU; the latencies then show the machine's queue rather than the placement, and on
a starved machine they have shown the opposite of the truth (SRTM slower than LB). So
each run records figures taken during its own measured window, and ``check`` compares
them with the thresholds below: any one over its threshold marks the run ``disturbed``,
with one reason per figure, and no conclusion is drawn from it.

The thresholds (constants below, each with its reason) were set from runs of the demo on
a calm and on a loaded two-CPU machine (docs/measurement-validity.md): a calm run passes
every one with room, the loaded runs that reported nonsense fail several.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

#: Emulator send lateness p99 (real send time − intended), as a share of the lateness at
#: which it skips an event instead (10 ms in live runs): half of that means the emulator
#: was behind for much of the window, and the brokers got bursts merged and gaps shifted.
#: (A share of the emulator's limit, not of the SLO: the workload's shape is at stake.)
SEND_LATE_P99_SHARE = 0.5
#: Send lateness p99.9, as a share of the same limit: the tail near it means stalls.
SEND_LATE_P999_SHARE = 0.8
#: Events the emulator skipped as too late (share of those due in the window): the
#: schedule's correlated bursts are what placement is about; losing more than 0.5 %
#: of them changes the workload. (A calm run skips under 0.1 %.)
SKIPPED_SHARE = 0.005
#: Worst broker's release lateness p99 (time the broker's loop got to a message − time
#: it was due), as a share of the SLO: the brokers' own CPU starvation, added to every
#: latency it touches; at half the SLO it can decide whether the p99 meets it.
BROKER_LATE_P99_SLO_SHARE = 0.5
#: Worst run process's (brokers, controller, subscriber, emulator) share of the window
#: spent runnable but waiting for a CPU (``/proc/<pid>/schedstat``). The run's own nine
#: processes make each other wait on two CPUs (about a fifth of the window for the
#: busiest broker on a calm machine), so only twice that counts as starvation.
RUN_QUEUE_WAIT_SHARE = 0.4
#: CPU time stolen by the hypervisor, as a share of the machine's CPU time in the window.
STEAL_SHARE = 0.05


@dataclass(frozen=True)
class RunFigures:
    """What a run measured about its own conditions in its measured window; None where
    a figure could not be taken (no /proc, a broker that did not answer)."""

    slo_p99_ms: float
    #: The emulator skips events it could only send this late (ms).
    max_late_ms: float
    send_late_p99_ms: float
    send_late_p999_ms: float
    #: Events due in the window: sent plus skipped.
    due: int
    skipped_late: int
    #: The worst broker's release lateness p99 (ms), from the brokers' /stats.
    broker_late_p99_ms: float | None = None
    #: The worst run process's share of the window waiting for a CPU.
    run_queue_wait: float | None = None
    #: Which process that was (``emulator``, ``broker-3``, ...).
    waited_most: str | None = None
    #: Share of the machine's CPU time stolen (virtual machines).
    steal: float | None = None
    #: Share of the machine's CPU time used by processes outside the run (context only).
    foreign_cpu: float | None = None
    #: Highest 1-minute load average seen during the window, per CPU (context only).
    load_per_cpu: float | None = None
    cpus: int | None = None
    #: CPUs the run's own processes used on average (context only).
    run_cpus: float | None = None


@dataclass(frozen=True)
class Validity:
    disturbed: bool
    reasons: tuple[str, ...]
    figures: RunFigures
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "disturbed" if self.disturbed else "valid"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reasons": list(self.reasons),
            "figures": asdict(self.figures),
            "thresholds": self.thresholds,
        }


def thresholds(slo_p99_ms: float, max_late_ms: float) -> dict[str, float]:
    """The limits for a run with this SLO and emulator (ms or shares), as the JSON
    reports them."""
    return {
        "send_late_p99_ms": SEND_LATE_P99_SHARE * max_late_ms,
        "send_late_p999_ms": SEND_LATE_P999_SHARE * max_late_ms,
        "skipped_share": SKIPPED_SHARE,
        "broker_late_p99_ms": BROKER_LATE_P99_SLO_SHARE * slo_p99_ms,
        "run_queue_wait_share": RUN_QUEUE_WAIT_SHARE,
        "steal_share": STEAL_SHARE,
    }


def check(f: RunFigures) -> Validity:
    """``f`` against the thresholds: disturbed, with a reason per figure over its limit
    (a figure that is NaN counts as over: it was measured and is not a number)."""
    lim = thresholds(f.slo_p99_ms, f.max_late_ms)
    reasons: list[str] = []

    def over(value: float | None, limit: float) -> bool:
        return value is not None and (math.isnan(value) or value > limit)

    if over(f.send_late_p99_ms, lim["send_late_p99_ms"]):
        reasons.append(
            f"the emulator sent late: p99 {f.send_late_p99_ms:.1f} ms > "
            f"{lim['send_late_p99_ms']:g} ms"
        )
    if over(f.send_late_p999_ms, lim["send_late_p999_ms"]):
        reasons.append(
            f"the emulator sent late: p99.9 {f.send_late_p999_ms:.1f} ms > "
            f"{lim['send_late_p999_ms']:g} ms"
        )
    skipped = f.skipped_late / f.due if f.due > 0 else 0.0
    if over(skipped, SKIPPED_SHARE):
        reasons.append(
            f"the emulator skipped {f.skipped_late:,} of {f.due:,} events as too late "
            f"({skipped:.1%} > {SKIPPED_SHARE:.1%})"
        )
    if over(f.broker_late_p99_ms, lim["broker_late_p99_ms"]):
        reasons.append(
            f"a broker released late: p99 {f.broker_late_p99_ms:.1f} ms > "
            f"{lim['broker_late_p99_ms']:g} ms"
        )
    if over(f.run_queue_wait, RUN_QUEUE_WAIT_SHARE):
        reasons.append(
            f"{f.waited_most or 'a run process'} waited for a CPU {f.run_queue_wait:.0%} "
            f"of the window "
            f"(> {RUN_QUEUE_WAIT_SHARE:.0%})"
        )
    if over(f.steal, STEAL_SHARE):
        reasons.append(f"the hypervisor stole {f.steal:.0%} of the CPU (> {STEAL_SHARE:.0%})")
    if reasons and f.foreign_cpu is not None and f.cpus:
        # Context, not a reason: it says where the CPU went.
        reasons.append(
            f"(other processes used {f.foreign_cpu:.0%} of the {f.cpus} CPUs; "
            f"load average up to {(f.load_per_cpu or 0) * f.cpus:.1f})"
        )
    return Validity(bool(reasons), tuple(reasons), f, lim)


def from_summary(summary: dict[str, Any]) -> Validity | None:
    """A summary's stored validity (None for runs recorded before runs checked it)."""
    doc = summary.get("validity")
    if not doc:
        return None
    figures = RunFigures(**doc["figures"])
    return Validity(doc["status"] == "disturbed", tuple(doc["reasons"]), figures,
                    dict(doc["thresholds"]))  # fmt: skip


def disturbed(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summaries whose run was disturbed."""
    return [s for s in summaries if (s.get("validity") or {}).get("status") == "disturbed"]
