"""Online fitting as a state machine with no I/O (the paper's Step 3, Table I).

``start()`` and ``on_round(results)`` return commands; whoever drives it (the controller,
a simulator, a test) carries them out and reports each round's p99 per broker. An
iteration places the publishers still to be placed with a policy; every broker that
violates the SLO binary-searches how many of its new publishers it keeps (the accept band
is [0.8, 1.0] × SLO), sheds the rest and is marked full; what was shed starts the next
iteration, on brokers not full. Each iteration either ends the fitting or marks a broker
full, and each search halves its interval every round, so it always terminates.

Model-assisted fitting (``predict``): before measuring, an iteration asks the model how
many of its new publishers each broker keeps within the SLO, sheds the rest at once and
plans them onto further brokers the same way, so one measured round covers the whole
placement; the measurement only confirms. A broker that still violates searches down from
its planned count in steps that double (1/10 of it first), not from zero, since the model
is expected to be close. Searches step in whole slices of every group when groups are
equal (``search_quantum``). The model's answer is plain data (a count), so this module needs
no simulator; ``Predict`` is whatever computes it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from srtm.placement.model import BrokerCapacity, PublisherLoad, TopicSpec
from srtm.placement.policies import Policy, place

#: A round's p99 between these fractions of the SLO ends a search (the paper's band).
ACCEPT_BAND = (0.8, 1.0)
#: A model-assisted search that violates first steps down by this share of its trial.
FIRST_STEP = 0.1
#: A round whose broker's event loop woke later than this share of the SLO (p99) measured
#: the machine, not the placement: it is repeated, never acted on. (The verdict band is
#: 0.2 × SLO wide; a lag of a quarter of the SLO added to every latency can move a p99
#: across it.)
MAX_LAG_SLO_SHARE = 0.25
#: A round is made long enough to expect this many times the samples it needs.
SAMPLE_MARGIN = 1.25
#: The longest a round may be (the broker's own limit is 60 s).
MAX_WINDOW_S = 30.0

#: ``(broker, publishers it keeps already, candidates in search order)`` -> how many of
#: the candidates (a prefix) it is predicted to keep within the SLO; None: no prediction.
Predict = Callable[[str, Sequence[PublisherLoad], Sequence[PublisherLoad]], int | None]


class Verdict(enum.Enum):
    VIOLATE = "violate"  # p99 > SLO
    BELOW = "below"  # p99 < 0.8 × SLO: room for more
    OK = "ok"  # in the band: stop here
    UNKNOWN = "unknown"  # too few samples to tell
    DISTURBED = "disturbed"  # the broker's loop lagged: the round measured the machine


def judge(
    p99_ms: float, samples: int, slo_ms: float, min_samples: int, lag_ms: float = 0.0
) -> Verdict:
    if lag_ms > MAX_LAG_SLO_SHARE * slo_ms:
        return Verdict.DISTURBED
    if samples < min_samples or math.isnan(p99_ms):
        return Verdict.UNKNOWN
    if p99_ms > ACCEPT_BAND[1] * slo_ms:
        return Verdict.VIOLATE
    if p99_ms < ACCEPT_BAND[0] * slo_ms:
        return Verdict.BELOW
    return Verdict.OK


@dataclass(frozen=True, slots=True)
class RoundResult:
    """One broker's measurement over a round: p99 latency, how many messages it saw, and
    the p99 of how late its event loop woke meanwhile."""

    p99_ms: float
    samples: int
    loop_lag_p99_ms: float = 0.0


# -- commands --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UseBrokers:
    """An iteration starts on these brokers (the first, or one with more brokers)."""

    iteration: int
    brokers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Profile:
    """Put exactly these publishers of the topic on ``broker`` and measure for ``window_s``."""

    broker: str
    publishers: tuple[str, ...]
    window_s: float


@dataclass(frozen=True, slots=True)
class Keep:
    broker: str
    publishers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Shed:
    """Take these publishers off ``broker``: they go to the next iteration."""

    broker: str
    publishers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MarkFull:
    broker: str


class FitOutcome(enum.Enum):
    """How fitting ended."""

    FITTED = "fitted"  # the searches settled; their plan was the best measured
    BEST = "best"  # the searches settled on a plan worse than one measured earlier
    TAKEN_BACK = "taken back"  # adding brokers did not lower the p99: the step is undone
    DISTURBED = "disturbed"  # rounds kept measuring the machine: stopped at the best plan


@dataclass(frozen=True, slots=True)
class Finished:
    """Fitting is over: where everyone ended up, who could not be placed, the rounds each
    iteration took (a row of the paper's Table I), how it ended and why (``note``)."""

    assignment: Mapping[str, tuple[str, ...]]
    unassigned: tuple[str, ...]
    rounds: tuple[int, ...]
    outcome: FitOutcome = FitOutcome.FITTED
    note: str = ""


@dataclass(frozen=True, slots=True)
class MeasuredPlan:
    """A whole plan fitting measured: every publisher placed somewhere, and the worst
    p99 of its brokers (each broker's latest round with exactly its publishers)."""

    assignment: Mapping[str, tuple[str, ...]]
    unassigned: tuple[str, ...]
    p99_ms: float
    iteration: int


Command = UseBrokers | Profile | Keep | Shed | MarkFull | Finished


@dataclass(frozen=True, slots=True)
class Step:
    """One broker's measurement, for progress reports."""

    iteration: int
    round: int
    broker: str
    publishers: int
    p99_ms: float
    samples: int
    verdict: Verdict


@dataclass
class _Search:
    """How many of ``candidates`` a broker keeps, on top of ``fixed``."""

    broker: str
    fixed: list[PublisherLoad]
    candidates: list[PublisherLoad]
    lo: int = 0  # most candidates known to fit
    hi: int = 0  # fewest known to violate (set on the first violation)
    trial: int = 0
    unknowns: int = 0
    disturbed: int = 0
    #: p99 measured at each trial (judged rounds only).
    measured: dict[int, float] = field(default_factory=dict)
    violated: bool = False
    done: bool = False
    #: Search down from a violating trial in doubling steps (model-assisted) instead of
    #: halving the interval from zero.
    gallop: bool = False
    step: int = 0
    #: Trials are multiples of this (see ``search_quantum``).
    quantum: int = 1

    def publishers(self) -> tuple[str, ...]:
        return tuple(p.id for p in self.fixed + self.candidates[: self.trial])


def balanced_order(publishers: Sequence[PublisherLoad]) -> list[PublisherLoad]:
    """Interleave correlation groups so that every prefix takes from each group in
    proportion to its size (a search that keeps the first n keeps a slice of each)."""
    groups: dict[str | None, list[PublisherLoad]] = {}
    for p in publishers:
        groups.setdefault(p.group, []).append(p)
    keyed = [
        ((j + 0.5) / len(members), gi, p)
        for gi, members in enumerate(groups.values())
        for j, p in enumerate(members)
    ]
    return [p for _, _, p in sorted(keyed, key=lambda k: (k[0], k[1]))]


def search_quantum(candidates: Sequence[PublisherLoad]) -> int:
    """The step of a search over ``candidates`` in ``balanced_order``: the number of
    correlation groups when they are all the same size (every trial then keeps the same
    number of each group, so every broker's share of each burst matches its share of the
    bucket; a prefix that takes 7 of one group and 8 of another does not, and pays a DRL
    penalty that has nothing to do with load), else 1."""
    sizes: dict[str | None, int] = {}
    for p in candidates:
        sizes[p.group] = sizes.get(p.group, 0) + 1
    if len(sizes) > 1 and len(set(sizes.values())) == 1:
        return len(sizes)
    return 1


@dataclass
class Fitting:
    brokers: Sequence[BrokerCapacity]
    topic: TopicSpec
    policy: Policy = "srtm"
    window_s: float = 60.0
    #: Fewer samples than this in a round cannot be judged; the round is repeated.
    min_samples: int = 100
    #: Rounds a broker may repeat for want of samples before its trial is taken as fitting.
    max_unknown: int = 2
    #: Disturbed rounds a broker may repeat in a row before fitting stops at its best plan.
    max_disturbed: int = 3
    seed: int = 0
    #: Model-assisted fitting (see the module docstring); None: measure only.
    predict: Predict | None = None
    kept: dict[str, list[PublisherLoad]] = field(default_factory=dict)
    full: set[str] = field(default_factory=set)
    unassigned: list[PublisherLoad] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    history: list[Step] = field(default_factory=list)
    done: bool = False
    _searches: dict[str, _Search] = field(default_factory=dict)
    _shed: list[PublisherLoad] = field(default_factory=list)
    #: The p99 each broker that settled was measured at with what it keeps.
    _settled_p99: dict[str, float] = field(default_factory=dict)
    #: The whole plan each iteration starts with, until its first round is judged.
    _opening: MeasuredPlan | None = None
    #: The best whole plan measured so far, and the policy's placement fitting began with.
    best: MeasuredPlan | None = None
    start_plan: MeasuredPlan | None = None

    def start(self) -> list[Command]:
        return self._iterate(list(self.topic.publishers))

    # -- iterations ----------------------------------------------------------------------
    def _eligible(
        self, planned: Mapping[str, Sequence[PublisherLoad]], skip: set[str]
    ) -> list[BrokerCapacity]:
        """Brokers not full (nor in ``skip``), their load counting what they keep and
        what this iteration has planned for them."""
        out = []
        for b in self.brokers:
            if b.id in self.full or b.id in skip:
                continue
            held = [*self.kept.get(b.id, []), *planned.get(b.id, [])]
            out.append(replace(b, load=b.load + math.fsum(p.rate for p in held)))
        return out

    def _place(
        self,
        pool: list[PublisherLoad],
        planned: Mapping[str, Sequence[PublisherLoad]],
        skip: set[str],
    ) -> tuple[list[tuple[str, list[PublisherLoad]]], list[PublisherLoad]]:
        """The policy's placement of ``pool``: (broker, candidates in search order) pairs
        and the publishers that fit nowhere."""
        eligible = self._eligible(planned, skip)
        placement = place(self.policy, eligible, self.topic.with_publishers(pool), self.seed)
        by_id = {p.id: p for p in pool}
        pairs = [
            (a.broker, balanced_order([by_id[i] for i in a.publishers]))
            for a in placement.assignments
        ]
        return pairs, [by_id[i] for i in placement.unassigned]

    def _plan(
        self, pool: list[PublisherLoad]
    ) -> tuple[dict[str, list[PublisherLoad]], list[PublisherLoad]]:
        """Candidates per broker for one iteration, and what fits nowhere. With a model,
        what a broker is predicted to shed is planned onto other brokers before anything
        is measured; what the model fits nowhere is placed as without it, to be measured."""
        planned: dict[str, list[PublisherLoad]] = {}
        if self.predict is not None:
            predicted_full: set[str] = set()
            while pool:
                pairs, nowhere = self._place(pool, planned, predicted_full)
                if not pairs:
                    break
                pool, kept_any = nowhere, False
                for broker, candidates in pairs:
                    held = [*self.kept.get(broker, []), *planned.get(broker, [])]
                    n = self.predict(broker, held, candidates)
                    n = len(candidates) if n is None else max(0, min(int(n), len(candidates)))
                    planned.setdefault(broker, []).extend(candidates[:n])
                    pool += candidates[n:]
                    kept_any = kept_any or n > 0
                    if n < len(candidates):
                        predicted_full.add(broker)
                if not kept_any:
                    break
        if not pool:
            return planned, []
        pairs, nowhere = self._place(pool, planned, set())
        for broker, candidates in pairs:
            planned.setdefault(broker, []).extend(candidates)
        return planned, nowhere

    def _iterate(self, pool: list[PublisherLoad]) -> list[Command]:
        planned, nowhere = self._plan(pool)
        self.unassigned += nowhere
        planned = {b: ps for b, ps in planned.items() if ps}
        if not planned:
            return [self._finish()]
        self.rounds.append(0)
        self._shed = []
        self._searches = {}
        cmds: list[Command] = [UseBrokers(len(self.rounds), tuple(planned))]
        for broker, candidates in planned.items():
            s = _Search(broker, list(self.kept.get(broker, [])), candidates)
            s.trial = len(candidates)
            s.gallop = self.predict is not None
            s.quantum = search_quantum(candidates)
            self._searches[broker] = s
            cmds.append(self._profile(s))
        whole = {b: tuple(p.id for p in ps) for b, ps in self.kept.items() if ps}
        for b, ps in planned.items():
            whole[b] = (*whole.get(b, ()), *(p.id for p in ps))
        self._opening = MeasuredPlan(
            whole, tuple(p.id for p in self.unassigned), math.nan, len(self.rounds)
        )
        if self.start_plan is None:
            self.start_plan = self._opening
        return cmds

    def _profile(self, s: _Search) -> Profile:
        """Measure ``s``'s trial, for long enough to expect the samples a verdict needs."""
        rate = math.fsum(p.rate for p in s.fixed + s.candidates[: s.trial])
        needed = SAMPLE_MARGIN * self.min_samples / rate if rate > 0 else 0.0
        return Profile(s.broker, s.publishers(), max(self.window_s, min(needed, MAX_WINDOW_S)))

    def on_round(self, results: Mapping[str, RoundResult]) -> list[Command]:
        """The measurements of the round just run; returns what to do next.

        A broker under test that is missing from ``results`` is measured again."""
        if self.done:
            raise RuntimeError("fitting is finished")
        self.rounds[-1] += 1
        cmds: list[Command] = []
        for s in self._searches.values():
            if s.done:
                continue
            r = results.get(s.broker)
            if r is None:
                cmds.append(self._profile(s))
                continue
            v = judge(
                r.p99_ms, r.samples, self.topic.slo_p99_ms, self.min_samples, r.loop_lag_p99_ms
            )
            self.history.append(
                Step(len(self.rounds), self.rounds[-1], s.broker, s.trial, r.p99_ms, r.samples, v)
            )
            if v is Verdict.DISTURBED:
                s.disturbed += 1
                if s.disturbed > self.max_disturbed:
                    note = (f"broker {s.broker}'s loop lagged {r.loop_lag_p99_ms:.1f} ms (p99) "
                            f"in {s.disturbed} rounds in a row: the machine is too busy to "
                            "measure on")  # fmt: skip
                    return [self._stop(FitOutcome.DISTURBED, note)]
                cmds.append(self._profile(s))
                continue
            s.disturbed = 0
            if v is not Verdict.UNKNOWN:
                s.measured[s.trial] = r.p99_ms
            cmds += self._advance(s, v)
        taken_back = self._judge_opening()
        if taken_back is not None:
            return [taken_back]
        if all(s.done for s in self._searches.values()):
            pool, self._shed = self._shed, []
            cmds += self._iterate(pool) if pool else [self._finish()]
        return cmds

    def _judge_opening(self) -> Finished | None:
        """Once every broker of an iteration's opening plan has a judged first round, that
        plan is measured: it becomes the best if it is, and an iteration that added
        brokers without lowering the best p99 is taken back (None: go on)."""
        opening = self._opening
        if opening is None:
            return None
        firsts: dict[str, float] = {}
        for s in self._searches.values():
            first = s.measured.get(len(s.candidates))
            if first is None:
                if not s.done:
                    return None  # not judged yet
                continue  # settled without a judged round (too few samples): unknown
            firsts[s.broker] = first
        self._opening = None
        known = [*firsts.values(), *(self._settled_p99.get(b, math.nan) for b in opening.assignment
                                     if b not in firsts)]  # fmt: skip
        known = [x for x in known if not math.isnan(x)]
        if not known:
            return None
        measured = replace(opening, p99_ms=max(known))
        best = self.best
        if best is None or measured.p99_ms < best.p99_ms:
            self.best = measured
            return None
        if measured.iteration > 1:
            new = sorted(set(measured.assignment) - set(best.assignment))
            note = (
                f"adding broker{'s' if len(new) != 1 else ''} {', '.join(new) or '(none)'} "
                f"did not lower the p99 ({measured.p99_ms:.1f} ms against "
                f"{best.p99_ms:.1f} ms): back to iteration {best.iteration}'s plan"
            )
            return self._stop(FitOutcome.TAKEN_BACK, note)
        return None

    def _advance(self, s: _Search, v: Verdict) -> list[Command]:
        if v is Verdict.UNKNOWN:
            s.unknowns += 1
            if s.unknowns <= self.max_unknown:
                return [self._profile(s)]
            v = Verdict.OK  # never enough traffic to tell: it does not overload the broker
        s.unknowns = 0
        if v is Verdict.OK:
            return self._settle(s, s.trial)
        if v is Verdict.BELOW:
            s.lo = s.trial
            if not s.violated:  # everything it was given fits with room to spare
                return self._settle(s, s.trial)
        else:
            s.violated = True
            s.hi = s.trial
        q = s.quantum
        if s.hi - s.lo <= q:
            return self._settle(s, s.lo)
        if s.gallop and v is Verdict.VIOLATE and s.lo == 0:
            s.step = q * max(1, math.ceil(s.hi * FIRST_STEP / q)) if s.step == 0 else 2 * s.step
            s.trial = max(s.lo + q, s.hi - s.step)
        else:
            s.trial = s.lo + (s.hi - s.lo) // (2 * q) * q
        return [self._profile(s)]

    def _settle(self, s: _Search, n: int) -> list[Command]:
        s.done = True
        s.trial = n
        keep, shed = s.candidates[:n], s.candidates[n:]
        self.kept[s.broker] = s.fixed + keep
        if n in s.measured:
            self._settled_p99[s.broker] = s.measured[n]
        cmds: list[Command] = [Keep(s.broker, s.publishers())]
        if shed:
            self._shed += shed
            cmds.append(Shed(s.broker, tuple(p.id for p in shed)))
        if s.violated:
            self.full.add(s.broker)
            cmds.append(MarkFull(s.broker))
        return cmds

    def _finish(self) -> Finished:
        """The searches settled: their plan, unless a whole plan measured earlier had a
        lower p99 than every settled broker's (fitting never ends worse than it was)."""
        self.done = True
        assignment = {b: tuple(p.id for p in ps) for b, ps in self.kept.items() if ps}
        unassigned = tuple(p.id for p in self.unassigned)
        settled = [self._settled_p99[b] for b in assignment if b in self._settled_p99]
        worst = max(settled, default=math.nan)
        best = self.best
        if best is not None and not math.isnan(worst) and best.p99_ms < worst:
            note = (
                f"the settled plan's worst broker measured {worst:.1f} ms, iteration "
                f"{best.iteration}'s whole plan {best.p99_ms:.1f} ms: that one is kept"
            )
            return self._stop(FitOutcome.BEST, note)
        return Finished(assignment, unassigned, tuple(self.rounds))

    def _stop(self, outcome: FitOutcome, note: str) -> Finished:
        """End now with the best whole plan measured (else the placement it began with)."""
        self.done = True
        plan = self.best or self.start_plan
        assert plan is not None  # start() made the first plan
        return Finished(plan.assignment, plan.unassigned, tuple(self.rounds), outcome, note)
