"""Elasticity glue: what the controller does with the rebalancer's decisions. Pure: no
I/O, time injected; the service (``srtm.control.service``) carries out the ``ElasticStep`` it
returns (controller actions pushed to brokers, brokers started and stopped).

Each ``step``: for ``grace_s`` after the first one, nothing is started to reach
``min_brokers`` (the brokers that exist register again within a report interval of a
controller's start: a restarted controller must not start brokers it does not need);
brokers being started that registered stop counting as spawning, but until one carries
something (or ``window_s`` has passed since it registered) no further broker is started:
its load window is still filling, and its first report's CPU includes its start (a loaded
CI machine saw a second spawn decided the moment the first registered); a broker
being despawned is stopped once it carries nothing (no publisher, no share, no draining
membership); while one is being despawned nothing else is decided (one change of the
fleet at a time). Else the rebalancer runs on the state built from the controller
(``state``) and its decisions become: ``Relocate`` -> ``Controller.move`` (the lossless
move: shrink-before-grow shares, migration orders, draining); ``Spawn`` -> broker ids to
start (``1001``, ``1002``, ...: broker ids are integers), within ``max_brokers``;
``Despawn`` -> its moves, then the broker waits to drain, within ``min_brokers`` (else
the despawn and its moves are dropped). The rebalancer picks only among brokers the
provisioner can stop (``BrokerWindow.stoppable``), so a broker started some other way
never blocks giving back one that was spawned; ``Replicate``/``Unreplicate`` ->
``Controller.replicate``/``unreplicate`` (ALL_PUBLISHERS: full ``(r, b)`` on each replica,
broker-to-broker copies, channels homed on one replica each).
A topic's ``last_change_s`` (the rebalancer's one plan per ``min_plan_interval_s``) is
when this loop last moved it: a publisher joining or leaving, a failover or an operator's
move is not the rebalancer changing its mind, and counting them would lock a topic whose
sensors keep joining for as long as they join.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from srtm.control.actions import Action
from srtm.control.state import ControlError, Controller
from srtm.placement.rebalance import (
    Decision,
    Despawn,
    LoadAverager,
    RebalanceSettings,
    RebalanceState,
    Relocate,
    Replicate,
    Spawn,
    TopicLoad,
    Unreplicate,
    rebalance,
)

__all__ = ["SPAWN_BASE", "Elastic", "ElasticStep", "carries", "slo_violated"]

#: Spawned brokers are ``SPAWN_BASE + 1``, ``+ 2``, ... (broker ids are integers).
SPAWN_BASE = 1000


@dataclass
class ElasticStep:
    """What one ``Elastic.step`` wants done."""

    #: Controller actions from the moves, to be carried out as any plan change's.
    actions: list[Action] = field(default_factory=list)
    #: Broker ids to start, and to stop.
    start: list[str] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    #: The decisions the rebalancer returned this step.
    decisions: list[Decision] = field(default_factory=list)


def slo_violated(ctrl: Controller, broker: str) -> bool:
    """Does a topic's shaping queue on ``broker`` (its last report's messages waiting for
    tokens) take longer than the topic's SLO to drain at its sub-bucket's rate? Brokers
    report no latency quantile; a queue that alone outlasts the SLO breaks the p99."""
    info = ctrl.brokers.get(broker)
    if info is None:
        return False
    for name, waiting in info.waiting.items():
        topic = ctrl.topics.get(name)
        bucket = topic.buckets.get(broker) if topic is not None else None
        if topic is None or bucket is None or bucket.rate <= 0:
            continue
        if waiting / bucket.rate * 1e3 > topic.spec.slo_p99_ms:
            return True
    return False


def carries(ctrl: Controller, broker: str) -> bool:
    """Does ``broker`` carry anything: a publisher, a share or a draining membership?"""
    return any(
        t.assignment.get(broker) or broker in t.buckets or broker in t.draining
        for t in ctrl.topics.values()
    )


@dataclass
class Elastic:
    settings: RebalanceSettings = field(default_factory=RebalanceSettings)
    #: A broker being started that has not registered in this long is given up (s).
    spawn_timeout_s: float = 60.0
    #: A broker being despawned that still carries something after this long is kept (s).
    drain_timeout_s: float = 120.0
    #: Nothing is started to reach ``min_brokers`` this soon after the first step (s).
    grace_s: float = 0.0
    averager: LoadAverager = field(init=False)
    #: Brokers being started -> when; being despawned -> when.
    spawning: dict[str, float] = field(default_factory=dict)
    despawning: dict[str, float] = field(default_factory=dict)
    #: Brokers started here that registered but carry nothing yet -> when they registered.
    settling: dict[str, float] = field(default_factory=dict)
    #: Brokers handed to the provisioner to stop, until they are down (not counted).
    stopping: set[str] = field(default_factory=set)
    #: Ids handed out so far (``SPAWN_BASE + N``).
    spawned: int = 0
    despawned: int = 0
    failures: int = 0
    events: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    #: Per topic: when this loop last moved it (``last_change_s``).
    _moved: dict[str, float] = field(default_factory=dict)
    #: When the first step ran.
    _first: float | None = None

    def __post_init__(self) -> None:
        self.averager = LoadAverager(self.settings.window_s)

    def note(self, now: float, text: str) -> None:
        self.events.append(f"{now:.3f} {text}")

    # -- inputs ----------------------------------------------------------------------------
    def observe(self, ctrl: Controller, now: float) -> None:
        """Sample every broker up (its reported ``load`` is ingress; egress and CPU as its
        report's ``resources`` tell them, 0 if not; an SLO violated as ``slo_violated``
        says); forget deleted topics."""
        for b in ctrl.up():
            cpu, egress = b.usage()
            self.averager.add(b.id, now, b.load, egress, cpu, slo_violated(ctrl, b.id))
        for name in set(self._moved) - set(ctrl.topics):
            del self._moved[name]

    def state(
        self, ctrl: Controller, now: float, can_stop: Callable[[str], bool] | None = None
    ) -> RebalanceState:
        """The rebalancer's view: brokers up with their averaged loads (stoppable as
        ``can_stop`` says; None: all), every topic with its plan (a topic being fitted
        counts as just changed: fitting owns its plan)."""
        up = {b.id: b for b in ctrl.up() if b.id not in self.stopping}
        brokers = tuple(
            replace(
                self.averager.window(b, info.mcap, now),
                stoppable=can_stop is None or can_stop(b),
            )
            for b, info in up.items()
        )
        topics = []
        for name, t in ctrl.topics.items():
            plan = {b: tuple(ps) for b, ps in t.assignment.items() if ps and b in up}
            last = now if t.status == "fitting" else self._moved.get(name)
            replicas = tuple(b for b in t.routing.replicas[1:] if b in up)
            fan_out = max(1, len(ctrl.registry.channels(name)))  # each channel gets a copy
            topics.append(TopicLoad(t.spec, plan, fan_out, replicas=replicas, last_change_s=last))
        return RebalanceState(brokers, tuple(topics), len(self.spawning))

    # -- the step --------------------------------------------------------------------------
    def step(self, ctrl: Controller, now: float, can_stop: Callable[[str], bool]) -> ElasticStep:
        """One rebalancing step (see the module's docstring); ``can_stop``: whether the
        provisioner can stop that broker."""
        out = ElasticStep()
        if self._first is None:
            self._first = now
        short = len(ctrl.up()) - len(self.stopping) + len(self.spawning) < self.settings.min_brokers
        if short and now - self._first < self.grace_s:
            return out  # the brokers that exist may not have registered again yet
        self._settle_spawning(ctrl, now)
        self.settling = {
            b: t for b, t in self.settling.items()
            if now - t <= self.settings.window_s and b in ctrl.brokers
            and not ctrl.brokers[b].down and not carries(ctrl, b)
        }  # fmt: skip
        self.stopping = {b for b in self.stopping if b in ctrl.brokers and not ctrl.brokers[b].down}
        self._settle_despawning(ctrl, now, out)
        if self.despawning or out.stop:
            return out
        out.decisions = decisions = rebalance(self.state(ctrl, now, can_stop), self.settings, now)
        refused = {d.broker for d in decisions if isinstance(d, Despawn)} - {
            d.broker
            for d in decisions
            if isinstance(d, Despawn) and self._may_despawn(ctrl, d, now, can_stop)
        }
        for d in decisions:
            if isinstance(d, Relocate) and d.source not in refused:
                self._move(ctrl, d, now, out)
            elif isinstance(d, Spawn) and self.settling:
                why = f"deferred: {', '.join(sorted(self.settling))} carries nothing yet"
                if not self.events or not self.events[-1].endswith(why):  # once, not per step
                    self.note(now, f"spawn of {d.n} {why}")
            elif isinstance(d, Spawn):
                self._spawn(ctrl, d.n, now, out)
            elif isinstance(d, Despawn) and d.broker not in refused:
                self.despawning[d.broker] = now
                self.note(now, f"despawn {d.broker}: draining it")
            elif isinstance(d, Replicate | Unreplicate):
                self._replicate(ctrl, d, now, out)
        self._settle_despawning(ctrl, now, out)  # one with nothing to move stops now
        return out

    def _may_despawn(
        self, ctrl: Controller, d: Despawn, now: float, can_stop: Callable[[str], bool]
    ) -> bool:
        if len(ctrl.up()) - len(self.stopping) - 1 < self.settings.min_brokers:
            self.note(now, f"despawn {d.broker} refused: --min-brokers {self.settings.min_brokers}")
            return False
        if not can_stop(d.broker):  # the rebalancer was told; this is a safety net
            self.note(now, f"despawn {d.broker} refused: the provisioner did not start it")
            return False
        return True

    def _move(self, ctrl: Controller, d: Relocate, now: float, out: ElasticStep) -> None:
        try:
            out.actions += ctrl.move(d.topic, list(d.publishers), d.to)
        except ControlError as exc:
            self.note(now, f"move of {d.topic} from {d.source} to {d.to} failed: {exc}")
            return
        self._moved[d.topic] = now
        self.note(now, f"moved {len(d.publishers)} publishers of {d.topic}: {d.source} -> {d.to}")

    def _replicate(
        self, ctrl: Controller, d: Replicate | Unreplicate, now: float, out: ElasticStep
    ) -> None:
        try:
            if isinstance(d, Replicate):
                out.actions += ctrl.replicate(d.topic, d.to)
            else:
                out.actions += ctrl.unreplicate(d.topic, d.source)
        except ControlError as exc:
            self.note(now, f"{d.to_json()} failed: {exc}")
            return
        self._moved[d.topic] = now
        self.note(
            now, f"{d.to_json()['action']} {d.topic}: {ctrl.topics[d.topic].routing.replicas}"
        )

    def _spawn(self, ctrl: Controller, n: int, now: float, out: ElasticStep) -> None:
        up = len(ctrl.up()) - len(self.stopping)
        room = self.settings.max_brokers - up - len(self.spawning)
        for _ in range(max(0, min(n, room))):
            self.spawned += 1
            bid = str(SPAWN_BASE + self.spawned)
            while bid in ctrl.brokers and not ctrl.brokers[bid].down:  # a resumed controller
                self.spawned += 1
                bid = str(SPAWN_BASE + self.spawned)
            self.spawning[bid] = now
            out.start.append(bid)
            self.note(now, f"spawn {bid}")
        if n > room:
            self.note(
                now,
                f"spawn of {n - max(room, 0)} refused: --max-brokers {self.settings.max_brokers}",
            )

    def _settle_spawning(self, ctrl: Controller, now: float) -> None:
        for bid, since in list(self.spawning.items()):
            info = ctrl.brokers.get(bid)
            if info is not None and not info.down:
                del self.spawning[bid]
                self.settling[bid] = now
                self.note(now, f"{bid} registered")
            elif now - since > self.spawn_timeout_s:
                del self.spawning[bid]
                self.failures += 1
                self.note(now, f"{bid} did not register in {self.spawn_timeout_s:g} s")

    def _settle_despawning(self, ctrl: Controller, now: float, out: ElasticStep) -> None:
        for bid, since in list(self.despawning.items()):
            info = ctrl.brokers.get(bid)
            if info is None or info.down or not carries(ctrl, bid):
                del self.despawning[bid]
                self.despawned += 1
                self.averager.forget(bid)
                out.stop.append(bid)
                self.stopping.add(bid)
                self.note(now, f"stop {bid}: it carries nothing")
            elif now - since > self.drain_timeout_s:
                del self.despawning[bid]
                self.note(
                    now, f"despawn {bid} given up: still carrying after {self.drain_timeout_s:g} s"
                )

    def start_failed(self, broker: str, now: float, why: str) -> None:
        """The provisioner could not start ``broker``."""
        self.spawning.pop(broker, None)
        self.failures += 1
        self.note(now, f"start of {broker} failed: {why}")

    def stop_failed(self, broker: str, now: float, why: str) -> None:
        self.stopping.discard(broker)
        self.failures += 1
        self.note(now, f"stop of {broker} failed: {why}")

    def to_json(self) -> dict[str, object]:
        """For /info: counts, what is under way, the last events."""
        return {
            "spawning": sorted(self.spawning), "settling": sorted(self.settling),
            "despawning": sorted(self.despawning),
            "spawned": self.spawned, "despawned": self.despawned, "failures": self.failures,
            "events": list(self.events)[-20:],
        }  # fmt: skip
