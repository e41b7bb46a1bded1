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

#: ``(broker, publishers it keeps already, candidates in search order)`` -> how many of
#: the candidates (a prefix) it is predicted to keep within the SLO; None: no prediction.
Predict = Callable[[str, Sequence[PublisherLoad], Sequence[PublisherLoad]], int | None]


class Verdict(enum.Enum):
    VIOLATE = "violate"  # p99 > SLO
    BELOW = "below"  # p99 < 0.8 × SLO: room for more
    OK = "ok"  # in the band: stop here
    UNKNOWN = "unknown"  # too few samples to tell


def judge(p99_ms: float, samples: int, slo_ms: float, min_samples: int) -> Verdict:
    if samples < min_samples or math.isnan(p99_ms):
        return Verdict.UNKNOWN
    if p99_ms > ACCEPT_BAND[1] * slo_ms:
        return Verdict.VIOLATE
    if p99_ms < ACCEPT_BAND[0] * slo_ms:
        return Verdict.BELOW
    return Verdict.OK


@dataclass(frozen=True, slots=True)
class RoundResult:
    """One broker's measurement over a round: p99 latency and how many messages it saw."""

    p99_ms: float
    samples: int


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


@dataclass(frozen=True, slots=True)
class Finished:
    """Fitting is over: where everyone ended up, who could not be placed, and the rounds
    each iteration took (a row of the paper's Table I)."""

    assignment: Mapping[str, tuple[str, ...]]
    unassigned: tuple[str, ...]
    rounds: tuple[int, ...]


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
            cmds.append(Profile(broker, s.publishers(), self.window_s))
        return cmds

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
                cmds.append(Profile(s.broker, s.publishers(), self.window_s))
                continue
            v = judge(r.p99_ms, r.samples, self.topic.slo_p99_ms, self.min_samples)
            self.history.append(
                Step(len(self.rounds), self.rounds[-1], s.broker, s.trial, r.p99_ms, r.samples, v)
            )
            cmds += self._advance(s, v)
        if all(s.done for s in self._searches.values()):
            pool, self._shed = self._shed, []
            cmds += self._iterate(pool) if pool else [self._finish()]
        return cmds

    def _advance(self, s: _Search, v: Verdict) -> list[Command]:
        if v is Verdict.UNKNOWN:
            s.unknowns += 1
            if s.unknowns <= self.max_unknown:
                return [Profile(s.broker, s.publishers(), self.window_s)]
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
        return [Profile(s.broker, s.publishers(), self.window_s)]

    def _settle(self, s: _Search, n: int) -> list[Command]:
        s.done = True
        s.trial = n
        keep, shed = s.candidates[:n], s.candidates[n:]
        self.kept[s.broker] = s.fixed + keep
        cmds: list[Command] = [Keep(s.broker, s.publishers())]
        if shed:
            self._shed += shed
            cmds.append(Shed(s.broker, tuple(p.id for p in shed)))
        if s.violated:
            self.full.add(s.broker)
            cmds.append(MarkFull(s.broker))
        return cmds

    def _finish(self) -> Finished:
        self.done = True
        assignment = {b: tuple(p.id for p in ps) for b, ps in self.kept.items() if ps}
        return Finished(assignment, tuple(p.id for p in self.unassigned), tuple(self.rounds))
