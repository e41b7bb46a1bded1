"""Whether a live run measured the brokers or the machine, and what the policy did with the
workload: checks of a run's own figures.

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

A run that was not disturbed can still show a policy that failed: publishers it left
without a broker, one broker starved far behind the others, a fitting that never
finished. Those are the policy's outcomes, not the machine's: ``findings`` states each
one, and the ones in ``FAILS_SLO`` keep the policy from being called within the SLO (and
out of the comparison of p99s).
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from srtm.experiments.host import HostFigures

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


def machine_reasons(
    figures: HostFigures | None, why: list[str], waiter: str | None = None, span: str = "the run"
) -> list[str]:
    """``why`` with the machine's own reasons added by the thresholds above: a run process
    that waited for a CPU (``waiter`` names it; None: its pid), stolen CPU time; and, beside
    any reason at all, how much of the machine other processes used."""
    if figures is None:
        return why
    wait = figures.run_queue_wait
    if wait is not None and wait > RUN_QUEUE_WAIT_SHARE:
        who = waiter if waiter is not None else str(figures.waited_most)
        why.append(f"{who} waited for a CPU {wait:.0%} of {span}")
    if figures.steal is not None and figures.steal > STEAL_SHARE:
        why.append(f"{figures.steal:.0%} of the CPU time stolen")
    if why and figures.foreign_cpu is not None:
        why.append(f"other processes used {figures.foreign_cpu:.0%} of the {figures.cpus} CPUs")
    return why


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


# -- what the policy did with the workload ----------------------------------------------
#: A broker is starved when its p99 is over the SLO and at least this many times the median
#: of the other brokers' p99. LB spreads the topic evenly and fitting holds each broker it
#: keeps to the SLO, so the brokers of a working placement sit within a few times of each
#: other (LB 21–40 ms, SRTM 6.6–7.4 ms on a slow machine); the starved sub-buckets seen
#: were 39× (275 ms against 6.6–7.4 ms) and over 70× (1,158 ms against 11–16 ms) the others.
STARVED_BROKER_RATIO = 10.0

#: States of a fitting that never produced the policy's placement (``running``: the run
#: stopped waiting for it).
FITTING_UNFINISHED_STATES = ("failed", "interrupted", "running")


class Kind(enum.Enum):
    """What a finding is about."""

    #: Fitting placed the topic on every broker the run had.
    ALL_BROKERS = "all_brokers"
    #: One broker's p99 far above the others' and over the SLO (``STARVED_BROKER_RATIO``).
    STARVED_BROKER = "starved_broker"
    #: The worst broker's p99 is over the SLO while the topic's is within it.
    BROKER_OVER_SLO = "broker_over_slo"
    #: Publishers the final plan left without a broker (their messages are never sent).
    UNPLACED = "unplaced"
    #: Messages the emulator never sent: their publisher had no broker when they were due.
    UNROUTED = "unrouted"
    #: The fitting failed, was interrupted or had not finished: the placement measured is
    #: its last round's, not the policy's answer.
    FITTING_UNFINISHED = "fitting_unfinished"


#: Findings that keep the policy from being called within the SLO, and its p99 out of the
#: comparison (a policy that served part of the workload, or starved part of it, is not
#: ranked against one that served all of it): all but ``ALL_BROKERS``, which is a fact
#: about the placement, not a failure.
FAILS_SLO = frozenset(Kind) - {Kind.ALL_BROKERS}


@dataclass(frozen=True)
class Finding:
    kind: Kind
    text: str

    @property
    def fails_slo(self) -> bool:
        return self.kind in FAILS_SLO

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "text": self.text, "fails_slo": self.fails_slo}


@dataclass(frozen=True)
class BrokerP99:
    broker: str
    messages: int
    p99_ms: float


@dataclass(frozen=True)
class PolicyFigures:
    """What a run's summary says about its placement; None where an older summary does not
    say (no finding is drawn from it)."""

    slo_p99_ms: float
    p99_ms: float
    per_broker: tuple[BrokerP99, ...] = ()
    #: Whether the topic was fitted online (LB is not).
    fitted: bool = False
    fitting_state: str | None = None
    fitting_rounds: int = 0
    #: Brokers in the final plan, and in the run's cluster.
    brokers_assigned: int | None = None
    brokers_available: int | None = None
    #: The topic's publishers, and how many the final plan left without a broker.
    publishers: int | None = None
    unplaced_publishers: int | None = None
    #: Messages never sent over the whole run (warm-up included): no route.
    unrouted_messages: int = 0

    @property
    def worst_broker(self) -> BrokerP99 | None:
        known = [b for b in self.per_broker if not math.isnan(b.p99_ms)]
        return max(known, key=lambda b: b.p99_ms) if known else None


def policy_figures(summary: Mapping[str, Any]) -> PolicyFigures:
    """The figures ``findings`` needs from a run's summary (``live._summarize``'s shape,
    after the Spark figures replaced the in-process ones, if they did)."""
    per_broker = tuple(
        BrokerP99(str(b), int(v.get("messages", 0)), float(v["p99"]))
        for b, v in sorted((summary.get("per_broker") or {}).items())
    )
    rounds = summary.get("fitting_rounds") or []
    state = summary.get("fitting_state")
    return PolicyFigures(
        slo_p99_ms=float(summary["slo_p99_ms"]),
        p99_ms=float(summary["e2e_ms"]["p99"]),
        per_broker=per_broker,
        fitted=state is not None or bool(rounds),
        fitting_state=state,
        fitting_rounds=int(sum(rounds)),
        brokers_assigned=summary.get("brokers_assigned"),
        brokers_available=summary.get("brokers_available"),
        publishers=summary.get("publishers"),
        unplaced_publishers=summary.get("unplaced_publishers"),
        unrouted_messages=int((summary.get("emulator") or {}).get("unrouted", 0)),
    )


def findings(f: PolicyFigures) -> tuple[Finding, ...]:
    """What the policy did that a reader of the p99 must know, each said plainly."""
    out: list[Finding] = []
    rounds = f"after {f.fitting_rounds} round{'s' if f.fitting_rounds != 1 else ''}"
    if f.fitted and f.brokers_available and f.brokers_assigned == f.brokers_available:
        out.append(
            Finding(Kind.ALL_BROKERS, f"fitting used all {f.brokers_available} brokers {rounds}")
        )
    worst = f.worst_broker
    if worst is not None and worst.p99_ms > f.slo_p99_ms:
        others = sorted(
            b.p99_ms for b in f.per_broker if b is not worst and not math.isnan(b.p99_ms)
        )
        if others and worst.p99_ms >= STARVED_BROKER_RATIO * statistics.median(others):
            spread = _ms(others[0]) + (f"–{_ms(others[-1])}" if len(others) > 1 else "")
            out.append(Finding(
                Kind.STARVED_BROKER,
                f"broker {worst.broker} starved: p99 {_ms(worst.p99_ms)} ms on its "
                f"{worst.messages:,} messages against {spread} ms on the others",
            ))  # fmt: skip
        elif f.p99_ms <= f.slo_p99_ms:
            out.append(Finding(
                Kind.BROKER_OVER_SLO,
                f"broker {worst.broker}'s p99 is over the SLO: {_ms(worst.p99_ms)} ms on its "
                f"{worst.messages:,} messages, the topic's {_ms(f.p99_ms)} ms",
            ))  # fmt: skip
    if f.unplaced_publishers:
        of = f" of {f.publishers}" if f.publishers else ""
        sent = f": {f.unrouted_messages:,} messages never sent" if f.unrouted_messages else ""
        out.append(Finding(
            Kind.UNPLACED, f"{f.unplaced_publishers}{of} publishers were left unplaced{sent}"
        ))  # fmt: skip
    elif f.unrouted_messages:
        out.append(Finding(
            Kind.UNROUTED,
            f"{f.unrouted_messages:,} messages were never sent: their publishers had no "
            "broker when they were due",
        ))  # fmt: skip
    if f.fitted and f.fitting_state in FITTING_UNFINISHED_STATES:
        how = {"failed": "failed", "interrupted": "was interrupted"}.get(
            f.fitting_state, "had not finished when the run stopped waiting for it"
        )
        out.append(Finding(
            Kind.FITTING_UNFINISHED,
            f"fitting {how} {rounds}: the placement measured is its last round's, "
            "not a fitted one",
        ))  # fmt: skip
    return tuple(out)


def _ms(value: float) -> str:
    """Milliseconds as the findings print them: 1,158, 16.3, 7.4."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
