"""Online fitting carried out on a live cluster: the pure ``Fitting`` state machine's
commands turned into plans, migrations and broker measurement rounds.

Each round, a broker under test carries exactly the publishers its Profile names; the
topic's other publishers not yet kept anywhere (a search's excluded candidates, the next
iteration's pool) are parked on the eligible broker with the most residual capacity
that is not under test, or stay where they are if there is none, so they keep
publishing throughout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from srtm.control.actions import Action
from srtm.control.model import FitState, FittingProgress
from srtm.control.state import Controller
from srtm.placement import Finished, Fitting, Predict, RoundResult
from srtm.placement.fitting import Command, FitOutcome, Profile, UseBrokers

#: Carries out actions (pushes, orders) and returns when they are done.
Execute = Callable[[list[Action]], Awaitable[None]]
#: Runs one measurement round on a broker: (broker id, publishers, window s) -> result.
Measure = Callable[[str, Sequence[str], float], Awaitable[RoundResult]]


def round_assignment(
    ctrl: Controller, topic: str, fitting: Fitting, profiles: Sequence[Profile]
) -> dict[str, list[str]]:
    """Who publishes where during a round (see the module docstring)."""
    state = ctrl.topics[topic]
    testing = {p.broker: list(p.publishers) for p in profiles}
    assignment: dict[str, list[str]] = dict(testing)
    for b, kept in fitting.kept.items():
        if b not in testing:
            assignment[b] = [p.id for p in kept]
    placed = {p for ps in assignment.values() for p in ps}
    rest = [p.id for p in state.spec.publishers if p.id not in placed]
    if rest:
        parking = [b for b in ctrl.up() if b.id not in testing and b.id not in fitting.full]
        if parking:
            spot = max(parking, key=lambda b: (b.mcap - b.load, b.id)).id
            assignment.setdefault(spot, []).extend(rest)
        else:
            where = {p: b for b, ps in state.assignment.items() for p in ps}
            for p in rest:
                b = where.get(p) or profiles[0].broker
                assignment.setdefault(b, []).append(p)
    return assignment


async def fit_topic(
    ctrl: Controller,
    topic: str,
    execute: Execute,
    measure: Measure,
    *,
    window_s: float,
    min_samples: int,
    settle_s: float,
    predict: Predict | None = None,
) -> Finished:
    """Run online fitting for ``topic`` to the end; progress goes to its ``fitting`` doc.
    With ``predict`` (model-assisted fitting) rounds confirm the model's placement."""
    state = ctrl.topics[topic]
    fleet = ctrl.fleet(exclude=topic)  # the topic is placed again whole: not its own plan
    progress = FittingProgress(started=True)
    state.fitting = progress

    def setup() -> tuple[Fitting, list[Command]]:
        fitting = Fitting(
            fleet, state.spec, state.policy, window_s=window_s, min_samples=min_samples,
            seed=ctrl.seed, predict=predict,
        )  # fmt: skip
        return fitting, fitting.start()

    # The search's setup and steps are CPU work (placement, a simulator with ``predict``):
    # on a thread, so the controller's loop keeps serving and ticking meanwhile.
    fitting, cmds = await asyncio.to_thread(setup)
    while True:
        _note(progress, fitting, cmds)
        done = next((c for c in cmds if isinstance(c, Finished)), None)
        if done is not None:
            await execute(
                ctrl.set_assignment(
                    topic,
                    {b: list(ps) for b, ps in done.assignment.items()},
                    list(done.unassigned),
                    f"fitted in {sum(done.rounds)} rounds over {len(done.rounds)} iterations"
                    + ("" if done.outcome is FitOutcome.FITTED else f" ({done.outcome.value})"),
                )
            )
            progress.state = FitState.DONE
            progress.outcome = done.outcome
            progress.note = done.note
            if done.note:
                ctrl.topics[topic].events.append(f"fitting {done.outcome.value}: {done.note}")
            return done
        profiles = [c for c in cmds if isinstance(c, Profile)]
        assignment = round_assignment(ctrl, topic, fitting, profiles)
        await execute(ctrl.set_assignment(topic, assignment, [], _round_note(fitting)))
        await asyncio.sleep(settle_s)  # publishers follow their orders
        results = await asyncio.gather(
            *(measure(p.broker, p.publishers, p.window_s) for p in profiles)
        )
        outcome = dict(zip((p.broker for p in profiles), results, strict=True))
        cmds = await asyncio.to_thread(fitting.on_round, outcome)


def _round_note(fitting: Fitting) -> str:
    return f"fitting: iteration {len(fitting.rounds)}, round {fitting.rounds[-1] + 1}"


def _note(progress: FittingProgress, fitting: Fitting, cmds: Sequence[Command]) -> None:
    progress.iteration = len(fitting.rounds)
    progress.round = fitting.rounds[-1] if fitting.rounds else 0
    progress.rounds = list(fitting.rounds)
    progress.full = sorted(fitting.full)
    progress.steps = list(fitting.history)
    for c in cmds:
        if isinstance(c, UseBrokers):
            progress.iteration_brokers = list(c.brokers)


def as_result(doc: Mapping[str, Any]) -> RoundResult:
    p99, lag = doc.get("p99_ms"), doc.get("loop_lag_p99_ms")
    return RoundResult(
        float("nan") if p99 is None else float(p99),
        int(doc.get("samples", 0)),
        0.0 if lag is None else float(lag),
    )
