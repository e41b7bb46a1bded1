"""The diurnal scenario simulated at the paper's scale: the rebalancer's loop on and off.

A day of sensor traffic compressed into ``windows`` windows of ``window_s`` seconds: every
sensor's rate follows ``low + (1 - low) · sin(π t / T)`` (20 % → 100 % → 20 %), many
topics of 10 msg/s sensors (at 100 %) in correlation groups and one hot topic, on brokers
of the ``paper`` model (``mcap`` 110 kmsg/s), starting on 2 brokers, one broker killed
midway. Both runs start from the same SRTM placement of the first window's rates.

- **loop on**: after every window, each broker's loads go to a ``LoadAverager`` and the
  pure rebalancer (``srtm.placement.rebalance.rebalance``) decides; its ``Relocate`` and
  ``Despawn`` are applied to the plans at once (moves are make-before-break: lossless),
  a ``Spawn`` adds brokers ``spawn_delay_s`` later.
- **loop off**: the plans never change but for failover.
- **failover** (both): a killed broker's publishers are re-placed as the controller does
  (``srtm.control.brokers.broker_down``: SRTM ``place`` on the surviving brokers' ledger); what
  finds no room stays unassigned and its messages are lost.

Per window the fleet is simulated for ``sim_s`` seconds (``srtm.sim.fleet``) with every
(topic, broker) share its own entry; the window's ``p99_ms`` is the worst share's p99 plus
the wait a fluid backlog adds on a broker offered more than it can process (the short
simulation cannot build a 5-second backlog by itself). ``published``: messages offered
over the run; ``delivered``: those that left a broker within the run (published less the
unassigned publishers' messages, a killed broker's backlog and the backlog left at the
end). Pure but for the PNG/JSON/Markdown the entry point writes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from srtm.experiments.diurnal import RUNS, report
from srtm.experiments.figures.common import (
    FigureResult,
    claim,
    profiled_bucket,
    scaled,
    write,
)
from srtm.placement import BrokerCapacity, PublisherLoad, TopicSpec, for_topic, place
from srtm.placement.rebalance import (
    Decision,
    Despawn,
    LoadAverager,
    RebalanceSettings,
    RebalanceState,
    Relocate,
    Spawn,
    TopicLoad,
)
from srtm.placement.rebalance import rebalance as rebalance_fn
from srtm.ratelimit import BucketParams
from srtm.sim.arrivals import generate
from srtm.sim.engine import Share
from srtm.sim.fleet import simulate_fleet
from srtm.sim.model import BrokerModel, paper
from srtm.workload import PublisherSpec

__all__ = ["DiurnalSettings", "diurnal_sim", "offered_fraction", "run", "verdicts"]

NAME = "diurnal"
#: The topic's r over its publishers' rate, and its bucket depth in seconds of r.
R_MARGIN = 1.2
BURST_S = 0.02


@dataclass(frozen=True)
class DiurnalSettings:
    windows: int = 48
    window_s: float = 5.0
    #: Seconds of traffic simulated per window (the first ``warmup_s`` left out).
    sim_s: float = 0.4
    warmup_s: float = 0.1
    low: float = 0.2
    topics: int = 36
    sensors: int = 600
    hot_sensors: int = 4_000
    group: int = 5
    batch: int = 10
    rate: float = 10.0
    slo_ms: float = 5.0
    start_brokers: int = 2
    spawn_delay_s: float = 10.0
    #: Window index at whose start a broker is killed (None: the middle one).
    kill_window: int | None = None
    #: 1: the paper's broker; k: brokers at 1/k the speed and mcap, topics 1/k the sensors.
    scale: int = 1
    seed: int = 0
    rebalance: RebalanceSettings = field(default_factory=lambda: RebalanceSettings(min_brokers=2))

    @property
    def kill_at(self) -> int:
        return self.windows // 2 if self.kill_window is None else self.kill_window

    def model(self) -> BrokerModel:
        return paper() if self.scale == 1 else scaled(self.scale)


def offered_fraction(s: DiurnalSettings, i: int) -> float:
    """The share of the peak rate offered in window ``i`` (its middle)."""
    x = (i + 0.5) / s.windows
    return s.low + (1.0 - s.low) * math.sin(math.pi * x)


def _sensors(s: DiurnalSettings) -> dict[str, list[PublisherSpec]]:
    out = {}
    for k in range(s.topics + 1):
        name, n = ("hot", s.hot_sensors) if k == s.topics else (f"t{k:02d}", s.sensors)
        n = max(s.group, n // s.scale)
        out[name] = [
            PublisherSpec(f"{name}-s{i}", s.rate, "poisson", s.batch, f"g{i // s.group}")
            for i in range(n)
        ]
    return out


def _spec(name: str, pubs: list[PublisherSpec], f: float, slo_ms: float) -> TopicSpec:
    loads = tuple(PublisherLoad(p.id, p.rate * f, p.group) for p in pubs)
    r = R_MARGIN * sum(p.rate for p in loads)
    return TopicSpec(name, loads, max(BURST_S * r, 1.0), slo_ms, r)


@dataclass
class _Fleet:
    """One run's service: plans, brokers, backlog, and what was lost."""

    mcap: float
    brokers: list[str]
    plans: dict[str, dict[str, list[str]]]
    changed: dict[str, float] = field(default_factory=dict)
    unassigned: dict[str, list[str]] = field(default_factory=dict)
    backlog: dict[str, float] = field(default_factory=dict)
    pending: list[tuple[float, str]] = field(default_factory=list)
    next_id: int = 1
    lost: float = 0.0

    def load_of(self, specs: Mapping[str, TopicSpec], broker: str) -> float:
        """The ledger's allocated on ``broker``: each topic's r in proportion to its part."""
        total = 0.0
        for name, plan in self.plans.items():
            spec = specs[name]
            rates = {p.id: p.rate for p in spec.publishers}
            part = sum(rates[p] for p in plan.get(broker, ()))
            total += part * (spec.rate / spec.load if spec.load else 1.0)
        return total

    def place(self, spec: TopicSpec, specs: Mapping[str, TopicSpec], pubs: list[str]) -> None:
        """SRTM placement of ``pubs`` of ``spec`` on the ledger (as the controller's)."""
        fleet = [BrokerCapacity(b, self.mcap, self.load_of(specs, b)) for b in self.brokers]
        by_id = {p.id: p for p in spec.publishers}
        topic = spec.with_publishers([by_id[p] for p in pubs])
        placement = place("srtm", for_topic(topic, fleet), topic)
        plan = self.plans.setdefault(spec.name, {})
        for a in placement.assignments:
            plan.setdefault(a.broker, []).extend(a.publishers)
        if placement.unassigned:
            self.unassigned.setdefault(spec.name, []).extend(placement.unassigned)


def run(
    s: DiurnalSettings, loop: bool, on_window: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """One run of the scenario (``loop``: the rebalancer on), window by window."""
    model = s.model()
    sensors = _sensors(s)
    index = {name: {p.id: i for i, p in enumerate(pubs)} for name, pubs in sensors.items()}
    fleet = _Fleet(model.mcap, [f"b{i + 1}" for i in range(s.start_brokers)], {})
    specs0 = {n: _spec(n, p, offered_fraction(s, 0), s.slo_ms) for n, p in sensors.items()}
    for name in sensors:  # topics created one by one, each on what the previous left
        fleet.place(specs0[name], specs0, [p.id for p in specs0[name].publishers])
    averager = LoadAverager(s.rebalance.window_s)
    windows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    published = 0.0
    for i in range(s.windows):
        t0 = i * s.window_s
        f = offered_fraction(s, i)
        specs = {n: _spec(n, p, f, s.slo_ms) for n, p in sensors.items()}
        for ready, b in [x for x in fleet.pending if x[0] <= t0]:
            fleet.pending.remove((ready, b))
            fleet.brokers.append(b)
            events.append({"t_s": t0, "kind": "up", "broker": b})
        if i == s.kill_at:
            _kill(fleet, specs, t0, events)
        offered = sum(sp.load for sp in specs.values()) * s.window_s
        published += offered
        w = _window(s, model, fleet, specs, sensors, index, i, f)
        w["offered_msgs"] = round(offered)
        windows.append(w)
        t1 = t0 + s.window_s
        for b in fleet.brokers:
            averager.add(b, t1, w["ingress"][b], w["ingress"][b] * 100.0, w["cpu"][b],
                         w["p99_by_broker"][b] > s.slo_ms)  # fmt: skip
        if loop:
            _control(s, fleet, specs, averager, t1, events)
        w["load_ratio"] = {b: fleet.load_of(specs, b) / fleet.mcap for b in fleet.brokers}
    lost_end = sum(fleet.backlog.values())
    delivered = published - fleet.lost - lost_end
    return {
        "loop": loop,
        "windows": windows,
        "events": events,
        "spawned": sum(1 for e in events if e["kind"] == "spawn"),
        "despawned": sum(1 for e in events if e["kind"] == "despawn"),
        "moves": sum(1 for e in events if e["kind"] == "move"),
        "published": round(published),
        "delivered": round(delivered),
        "lost": round(fleet.lost),
        "backlog_at_end": round(lost_end),
        "slo_windows_met": sum(w["slo_met"] for w in windows),
    }


def _kill(fleet: _Fleet, specs: Mapping[str, TopicSpec], t: float, events: list[Any]) -> None:
    """The busiest broker dies: its backlog is lost, its publishers failed over."""
    victim = max(fleet.brokers, key=lambda b: (fleet.load_of(specs, b), b))
    fleet.brokers.remove(victim)
    fleet.lost += fleet.backlog.pop(victim, 0.0)
    events.append({"t_s": t, "kind": "kill", "broker": victim})
    for name, plan in fleet.plans.items():
        orphans = plan.pop(victim, None)
        if orphans:
            fleet.place(specs[name], specs, orphans)
            fleet.changed[name] = t


def _window(
    s: DiurnalSettings,
    model: BrokerModel,
    fleet: _Fleet,
    specs: Mapping[str, TopicSpec],
    sensors: Mapping[str, list[PublisherSpec]],
    index: Mapping[str, Mapping[str, int]],
    i: int,
    f: float,
) -> dict[str, Any]:
    """Simulate window ``i``: latency per broker, the fluid backlog, and its summary."""
    traces, shares = {}, {}
    for k, (name, pubs) in enumerate(sensors.items()):
        trace = generate([replace(p, rate=p.rate * f) for p in pubs], s.sim_s,
                         seed=(s.seed * 1_000 + i) * 1_000 + k)  # fmt: skip
        spec = specs[name]
        # the envelope profiled on the window's traffic (too few messages: the declared one)
        spread = trace.messages >= 2 and trace.t_ns[-1] > trace.t_ns[0]
        env = profiled_bucket(trace) if spread else BucketParams(spec.rate, spec.burst)
        rates = {p.id: p.rate for p in spec.publishers}
        for b, ps in fleet.plans[name].items():
            part = sum(rates[p] for p in ps)
            if not ps or part <= 0:
                continue
            key = f"{name}@{b}"
            share = part / spec.load
            bucket = BucketParams(env.rate * share, max(env.burst * share, s.batch * s.group))
            traces[key] = trace
            shares[key] = [Share(b, [index[name][p] for p in ps], bucket)]
    result = simulate_fleet(traces, shares, model, seed=s.seed * 10_000 + i, warmup_s=s.warmup_s)
    ingress = {b: 0.0 for b in fleet.brokers}
    for key in shares:
        name, b = key.split("@")
        rates = {p.id: p.rate for p in specs[name].publishers}
        ingress[b] += sum(rates[p] for p in fleet.plans[name][b])
    p99_by = {b: 0.0 for b in fleet.brokers}
    for key, st in result.topics.items():
        b = key.split("@")[1]
        if not math.isnan(st.p99_ms):
            p99_by[b] = max(p99_by[b], st.p99_ms)
    cpu = {b: result.utilisation.get(b, 0.0) for b in fleet.brokers}
    for b in fleet.brokers:  # the fluid backlog: what a busy share above 1 cannot process
        cap = ingress[b] / cpu[b] if cpu[b] > 0 else math.inf
        left = max(0.0, fleet.backlog.get(b, 0.0) + (ingress[b] - cap) * s.window_s)
        fleet.backlog[b] = left
        if left > 0:
            p99_by[b] += left / cap * 1e3
    unassigned = sum(len(v) for v in fleet.unassigned.values())
    lost = sum(
        p.rate for n, ids in fleet.unassigned.items() for p in specs[n].publishers
        if p.id in set(ids)
    ) * s.window_s  # fmt: skip
    fleet.lost += lost
    p99 = max(p99_by.values(), default=0.0)
    return {
        "t_s": i * s.window_s,
        "fraction": f,
        "brokers": len(fleet.brokers),
        "p99_ms": p99,
        "slo_met": p99 <= s.slo_ms and unassigned == 0,
        "unassigned": unassigned,
        "lost_msgs": round(lost),
        "ingress": ingress,
        "cpu": cpu,
        "p99_by_broker": p99_by,
    }


def _control(
    s: DiurnalSettings,
    fleet: _Fleet,
    specs: Mapping[str, TopicSpec],
    averager: LoadAverager,
    now: float,
    events: list[dict[str, Any]],
) -> list[Decision]:
    """One pass of the rebalancer on the averaged loads; its decisions applied."""
    state = RebalanceState(
        tuple(averager.window(b, fleet.mcap, now) for b in fleet.brokers),
        tuple(
            TopicLoad(
                specs[n],
                {b: tuple(ps) for b, ps in plan.items() if ps},
                last_change_s=fleet.changed.get(n),
            )
            for n, plan in fleet.plans.items()
        ),
        spawning=len(fleet.pending),
    )
    decisions = rebalance_fn(state, s.rebalance, now)
    for d in decisions:
        if isinstance(d, Relocate):
            plan = fleet.plans[d.topic]
            gone = set(d.publishers)
            plan[d.source] = [p for p in plan[d.source] if p not in gone]
            if not plan[d.source]:
                del plan[d.source]
            plan.setdefault(d.to, []).extend(d.publishers)
            fleet.changed[d.topic] = now
            events.append({"t_s": now, "kind": "move", "topic": d.topic, "from": d.source,
                           "to": d.to, "publishers": len(d.publishers)})  # fmt: skip
        elif isinstance(d, Spawn):
            for _ in range(d.n):
                b = f"n{fleet.next_id}"
                fleet.next_id += 1
                fleet.pending.append((now + s.spawn_delay_s, b))
                events.append({"t_s": now, "kind": "spawn", "broker": b})
        elif isinstance(d, Despawn):
            fleet.brokers.remove(d.broker)
            averager.forget(d.broker)
            fleet.lost += fleet.backlog.pop(d.broker, 0.0)
            events.append({"t_s": now, "kind": "despawn", "broker": d.broker})
        else:  # replication: not expected here (one subscriber per topic)
            events.append({"t_s": now, "kind": type(d).__name__.lower(), **d.to_json()})
    return decisions


# -- verdicts and output --------------------------------------------------------------------
def verdicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The scenario's checks, computed from the two runs."""
    on, off = data["runs"]["on"], data["runs"]["off"]
    n = len(on["windows"])
    b = [w["brokers"] for w in on["windows"]]
    peak_at = max(range(n), key=lambda i: (b[i], -abs(i - n / 2)))
    up = max(b) > b[0]
    down = b[-1] < max(b)
    share_on = on["slo_windows_met"] / n
    share_off = off["slo_windows_met"] / n
    return [
        claim("loop on: the broker count follows the load up",
              f"{b[0]} brokers at the start, {max(b)} at most (window {peak_at})", up),
        claim("loop on: and back down",
              f"{max(b)} at most, {b[-1]} at the end; {on['despawned']} despawned",
              down and on["despawned"] > 0),
        claim("loop on: SLO held in ≥ 95 % of windows",
              f"{on['slo_windows_met']} of {n} ({share_on:.0%})", share_on >= 0.95),
        claim("loop on: published = delivered",
              f"{on['published']:,} published, {on['delivered']:,} delivered",
              on["published"] == on["delivered"]),
        claim("loop off does worse on the SLO",
              f"loop off: {off['slo_windows_met']} of {n} ({share_off:.0%}); "
              f"lost {off['published'] - off['delivered']:,}",
              share_off < share_on),
    ]  # fmt: skip


def diurnal_sim(
    out_dir: Path,
    settings: DiurnalSettings | None = None,
    on_progress: Callable[[str, float, float], None] | None = None,
) -> FigureResult:
    """Both runs; writes ``diurnal.{png,md,json}``."""
    t0 = time.perf_counter()
    s = settings or DiurnalSettings()
    progress = on_progress or (lambda *_: None)
    runs = {}
    for k, name in enumerate(RUNS):
        progress(f"loop {name}", k, len(RUNS))
        runs[name] = run(s, name == "on")
    progress("writing", len(RUNS), len(RUNS))
    model = s.model()
    data: dict[str, Any] = {
        "scenario": {
            "windows": s.windows, "window_s": s.window_s, "sim_s": s.sim_s, "low": s.low,
            "topics": s.topics + 1, "sensors": s.sensors // s.scale,
            "hot_sensors": s.hot_sensors // s.scale, "group": s.group, "batch": s.batch,
            "rate": s.rate, "slo_ms": s.slo_ms, "start_brokers": s.start_brokers,
            "mcap": model.mcap, "model": model.name, "spawn_delay_s": s.spawn_delay_s,
            "kill_window": s.kill_at, "seed": s.seed,
            "peak_msgs_per_s": sum(len(p) for p in _sensors(s).values()) * s.rate,
        },
        "runs": runs,
        # The document: the loop-on run at the top level.
        "windows": [{k: w[k] for k in ("t_s", "offered_msgs", "brokers", "p99_ms", "slo_met")}
                    for w in runs["on"]["windows"]],
        "spawned": runs["on"]["spawned"], "despawned": runs["on"]["despawned"],
        "published": runs["on"]["published"], "delivered": runs["on"]["delivered"],
        "meaning": {
            "published": "messages offered by the sensors over the run",
            "delivered": "messages that left a broker within the run: published less those "
                         "of unassigned publishers, a killed broker's backlog and the backlog "
                         "left at the end",
            "p99_ms": "the worst (topic, broker) share's simulated p99 in the window, plus "
                      "the wait of a fluid backlog on an overloaded broker",
        },
    }  # fmt: skip
    data["claims"] = verdicts(data)
    rows = []
    for w_on, w_off in zip(runs["on"]["windows"], runs["off"]["windows"], strict=True):
        rows.append([
            w_on["t_s"], w_on["offered_msgs"], w_on["brokers"], round(w_on["p99_ms"], 3),
            "yes" if w_on["slo_met"] else "no", w_off["brokers"], round(w_off["p99_ms"], 3),
            "yes" if w_off["slo_met"] else "no",
        ])  # fmt: skip
    title = (
        f"Diurnal day, simulated: {s.topics + 1} topics, {data['scenario']['peak_msgs_per_s']:,.0f}"
        f" msg/s at the peak, brokers of {model.mcap / 1e3:g} kmsg/s, loop on against off"
    )
    res = FigureResult(
        NAME, title, data,
        ["t s", "offered msgs", "on: brokers", "on: p99 ms", "on: SLO", "off: brokers",
         "off: p99 ms", "off: SLO"], rows,
    )  # fmt: skip
    return write(res, out_dir, report.plot(data), t0)
