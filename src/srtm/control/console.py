"""The SRTM console (``GET /ui``): one JSON document with everything the page shows,
built by a pure function (``console_state``) from the controller's state and what its
brokers' ``/stats`` say of latency (``LatencyReader``, the only I/O here).

A topic's SLO is judged on its brokers' *delivery* latency: time in broker of the messages
that arrived while their channel had a subscriber, over the brokers' recent window (the
last 50 to 60 s). Time spent waiting for a subscriber is shown apart, as backlog, and
never judged against the SLO.

The page itself is static (``srtm/control/ui/``: HTML, CSS, plain JS, no build step)
and polls ``GET /ui/state``."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field
from yarl import URL

from srtm.analysis.md1 import prob_delayed
from srtm.control.documents import BrokerLoad
from srtm.control.validate import ControlError
from srtm.ratelimit import BucketParams

if TYPE_CHECKING:
    from srtm.control.model import BrokerInfo, TopicState
    from srtm.control.state import Controller

#: The page's files (package data), by the name ``GET /ui/{asset}`` serves them under.
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
#: Events of each topic the document carries (its newest).
EVENTS_PER_TOPIC = 20
#: The DRL model is evaluated exactly up to this many tokens of burst: its cost grows with
#: the burst (mpmath, ~6 ms at 200 tokens, seconds at 2000). A larger burst is evaluated
#: at this one, which over-states the delay of that bucket; at any load below ~0.99 a
#: bucket this deep delays a vanishing fraction of messages anyway.
MODEL_MAX_BURST = 200.0
#: The model needs a stable queue: a bucket fed at or above its rate is *saturated*.
MAX_LOAD = 0.995


@dataclass(frozen=True, slots=True)
class Latency:
    """One broker's reading of one topic (its ``/stats``, ``srtm`` section), over the
    broker's window: the p99 of dispatch − arrival of deliveries to subscribers that were
    there (``delivery_ns``) and of those that waited for one (``subscriber_wait_ns``),
    with their counts, and the age of the oldest message waiting (``backlog_age_ns``)."""

    delivery_p99_ms: float | None
    deliveries: int
    wait_p99_ms: float | None = None
    waits: int = 0
    backlog_age_ms: float = 0.0
    #: Its bound says a message arriving now would wait longer than allowed, and who
    #: sends it most (the broker names them only then).
    over_bound: bool = False
    senders: tuple[str, ...] = ()


# -- the document ----------------------------------------------------------------------------
_DELIVERY = (
    "p99 of time in broker (dispatch − arrival, token wait included) of first deliveries "
    "to subscribers that were there: the message arrived while its channel had a "
    "subscriber, and it kept one until the delivery; over the broker's last 50 to 60 s"
)
_WAIT = (
    "p99 of time in broker of the other first deliveries, those that waited for a "
    "subscriber, over the same window"
)
_AGE = "age of the oldest message the broker holds undelivered for the topic (0: none)"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConsoleBroker(BrokerLoad):
    """A broker, its capacity ledger (msg/s, as ``GET /brokers``) and how many topics it
    carries."""

    topics: int = Field(description="topics whose plan gives it a sub-bucket")


_OVER = (
    "over its envelope: it arrives faster than its sub-bucket's rate (by the broker's "
    "report, over 5 % more), or the broker's bound says a message would wait longer than "
    "max_wait_ms"
)
#: Arrivals over a sub-bucket's rate by more than this fraction are over the envelope.
OVER_MARGIN = 0.05


class ConsoleShare(_Doc):
    """A topic on one broker of its plan (or draining there)."""

    id: str
    publishers: int
    bucket: dict[str, float] | None = Field(description="its sub-bucket: rate, burst")
    draining: bool
    rate: float | None = Field(description="msg/s it last reported for the topic (window)")
    backlog: float | None = Field(description="tokens owed, largest in its window")
    delivery_p99_ms: float | None = Field(description=_DELIVERY)
    deliveries: int = Field(description="deliveries delivery_p99_ms is taken over")
    wait_p99_ms: float | None = Field(description=_WAIT)
    waits: int = Field(description="deliveries wait_p99_ms is taken over")
    backlog_age_ms: float | None = Field(description=_AGE)
    over_envelope: bool = Field(description=_OVER)
    senders: list[str] = Field(description="who sends it most there, while over its bound")


class Drl(_Doc):
    """The DRL penalty: mean token delay (Eq. 1, M/D/1) of the split, each sub-bucket fed
    what its broker reports, less that of one ``(r, b)`` bucket fed the topic's total."""

    split_ms: float | None
    whole_ms: float | None
    penalty_ms: float | None
    note: str


class ConsoleTopic(_Doc):
    name: str
    status: str
    policy: str
    version: int
    open: bool
    slo_p99_ms: float
    rate: float
    burst: float
    publishers: int
    unassigned: int
    delivery_p99_ms: float | None = Field(
        description="the largest delivery p99 of its brokers' readings: " + _DELIVERY
    )
    deliveries: int = Field(description="deliveries over its brokers' windows")
    slo_met: bool | None = Field(
        description="delivery_p99_ms <= slo_p99_ms; null without deliveries in the window"
    )
    wait_p99_ms: float | None = Field(
        description="the largest of its brokers' (not judged against the SLO): " + _WAIT
    )
    waits: int = Field(description="deliveries that waited for a subscriber, in the window")
    backlog_age_ms: float | None = Field(description="the largest of its brokers': " + _AGE)
    over_envelope: bool = Field(description="on any of its brokers: " + _OVER)
    measured_rate: float | None = Field(
        description="msg/s its brokers last reported (the ledger's measured), against rate"
    )
    senders: list[str] = Field(
        description="who sends it over: the publishers its over brokers name, else the ones "
        "the plan puts there"
    )
    brokers: list[ConsoleShare]
    drl: Drl
    adaptor: str = Field(description="the TB Adaptor: settling after a plan change, or on")
    fitting: dict[str, Any] | None
    events: list[str]


class ConsoleState(_Doc):
    """Everything the console shows, in one document."""

    info: dict[str, Any]
    brokers: list[ConsoleBroker]
    topics: list[ConsoleTopic]


# -- the builder (pure) ----------------------------------------------------------------------
def console_state(
    ctrl: Controller,
    latency: Mapping[str, Mapping[str, Latency]],
    info: Mapping[str, Any],
    now: float,
    drl: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The console's document (``ConsoleState``) from the controller's state,
    ``latency[broker][topic]`` and ``info`` (what ``/info`` answers); ``now`` on the
    controller's clock (``time.monotonic``). ``drl``: each topic's DRL penalty, computed
    beforehand from ``drl_inputs`` (off the event loop); None: computed here."""
    if drl is None:
        drl = drl_penalties(drl_inputs(ctrl))
    carried: dict[str, int] = {}
    for t in ctrl.topics.values():
        for b in t.buckets:
            carried[b] = carried.get(b, 0) + 1
    brokers = [
        {"id": e.id, "host": b.host, "tcp_address": b.tcp_address, "http_address": b.http_address,
         "mcap": e.mcap, "allocated": e.allocated, "measured": e.measured, "rcap": e.rcap,
         "down": b.down, "over": e.allocated > e.mcap * (1 + 1e-9),
         "topics": carried.get(e.id, 0)}
        for e in ctrl.ledger()
        for b in (ctrl.brokers[e.id],)
    ]  # fmt: skip
    topics = [_topic(ctrl, t, latency, now, drl) for _, t in sorted(ctrl.topics.items())]
    return {"info": dict(info), "brokers": brokers, "topics": topics}


def drl_inputs(ctrl: Controller) -> dict[str, DrlInput]:
    """Per topic what its DRL penalty is computed from: plain values, a snapshot."""
    return {name: (t.spec.rate, t.spec.burst, _fed(ctrl, t)) for name, t in ctrl.topics.items()}


def drl_penalties(inputs: Mapping[str, DrlInput]) -> dict[str, dict[str, Any]]:
    """``drl_penalty`` of every topic (the model costs up to milliseconds per topic on a
    cache miss: the controller runs this on a thread)."""
    return {name: drl_penalty(*args) for name, args in inputs.items()}


#: A topic's rate, burst and each sub-bucket with the rate its broker last reported.
DrlInput = tuple[float, float, list[tuple[BucketParams, float]]]
#: A topic created after the DRL snapshot was taken: its penalty comes with the next poll.
_NOT_YET = {"split_ms": None, "whole_ms": None, "penalty_ms": None, "note": "computing"}


def _topic(
    ctrl: Controller,
    t: TopicState,
    latency: Mapping[str, Mapping[str, Latency]],
    now: float,
    drl: Mapping[str, dict[str, Any]],
) -> dict[str, Any]:
    name = t.spec.name
    ids = list(t.assignment) + [b for b in t.buckets if b not in t.assignment]
    shares = [_share(ctrl.brokers.get(b), b, t, latency.get(b, {}).get(name)) for b in ids]
    p99 = _largest(shares, "delivery_p99_ms", "deliveries")
    over = [s for s in shares if s["over_envelope"]]
    senders = sorted({p for s in over for p in s["senders"]})
    if over and not senders:  # the brokers named none: the plan says who publishes there
        senders = sorted({p for s in over for p in t.assignment.get(s["id"], [])})
    rates = [s["rate"] for s in shares if s["rate"] is not None]
    return {
        "name": name, "status": t.status, "policy": str(t.policy), "version": t.version,
        "open": t.open, "slo_p99_ms": t.spec.slo_p99_ms, "rate": t.spec.rate,
        "burst": t.spec.burst, "publishers": len(t.spec.publishers),
        "unassigned": len(t.unassigned), "delivery_p99_ms": p99,
        "deliveries": sum(s["deliveries"] for s in shares),
        "slo_met": None if p99 is None else p99 <= t.spec.slo_p99_ms,
        "wait_p99_ms": _largest(shares, "wait_p99_ms", "waits"),
        "waits": sum(s["waits"] for s in shares),
        "backlog_age_ms": max((a for s in shares if (a := s["backlog_age_ms"]) is not None),
                              default=None),
        "over_envelope": bool(over),
        "measured_rate": math.fsum(rates) if rates else None,
        "senders": senders,
        "brokers": shares,
        "drl": drl.get(name, _NOT_YET),
        "adaptor": _adaptor(t, now),
        "fitting": None if t.fitting is None else t.fitting.to_json(),
        "events": t.events[-EVENTS_PER_TOPIC:],
    }  # fmt: skip


def _largest(shares: list[dict[str, Any]], p99: str, count: str) -> float | None:
    """The largest ``p99`` of the shares that have values (``count``); None: none has."""
    return max((s[p99] for s in shares if s[count] and s[p99] is not None), default=None)


def _share(
    info: BrokerInfo | None, broker: str, t: TopicState, reading: Latency | None
) -> dict[str, Any]:
    report = None if info is None else info.reports.get(t.spec.name)
    bucket = t.buckets.get(broker)
    return {
        "id": broker,
        "publishers": len(t.assignment.get(broker, [])),
        "bucket": None if bucket is None else {"rate": bucket.rate, "burst": bucket.burst},
        "draining": broker in t.draining,
        "rate": None if report is None else report.rate,
        "backlog": None if report is None else report.backlog,
        "delivery_p99_ms": None if reading is None else reading.delivery_p99_ms,
        "deliveries": 0 if reading is None else reading.deliveries,
        "wait_p99_ms": None if reading is None else reading.wait_p99_ms,
        "waits": 0 if reading is None else reading.waits,
        "backlog_age_ms": None if reading is None else reading.backlog_age_ms,
        "over_envelope": (reading is not None and reading.over_bound)
        or (
            bucket is not None
            and report is not None
            and report.rate > bucket.rate * (1 + OVER_MARGIN)
        ),
        "senders": [] if reading is None else list(reading.senders),
    }


def _fed(ctrl: Controller, t: TopicState) -> list[tuple[BucketParams, float]]:
    """Each sub-bucket and the rate its broker last reported for the topic (0: none)."""
    out = []
    for b, bucket in t.buckets.items():
        info = ctrl.brokers.get(b)
        report = None if info is None else info.reports.get(t.spec.name)
        out.append((bucket, 0.0 if report is None else report.rate))
    return out


def _adaptor(t: TopicState, now: float) -> str:
    if len(t.buckets) < 2:
        return "off: one sub-bucket"
    if t.adapted_version != t.version or now < t.adapt_after_s:
        left = max(0.0, t.adapt_after_s - now) if t.adapted_version == t.version else None
        return "settling" if left is None else f"settling: {left:.0f} s left"
    return "on"


def drl_penalty(
    rate: float, burst: float, fed: Iterable[tuple[BucketParams, float]]
) -> dict[str, Any]:
    """The DRL penalty of a topic's split (``Drl``): each sub-bucket ``(r_l, b_l)`` fed
    Poisson arrivals at its reported rate ``λ_l``, against one ``(rate, burst)`` bucket fed
    ``Σ λ_l``. Mean token delays by the paper's Eq. 1 (``P(delayed) / (2 r (1 − ρ))``),
    the split's weighted by traffic; ms."""
    fed = [(b, lam) for b, lam in fed if lam > 0]
    total = sum(lam for _, lam in fed)
    if not fed:
        return {"split_ms": None, "whole_ms": None, "penalty_ms": None, "note": "no traffic"}
    saturated = [b for b, lam in fed if lam / b.rate >= MAX_LOAD]
    if saturated or total / rate >= MAX_LOAD:
        return {"split_ms": None, "whole_ms": None, "penalty_ms": None,
                "note": "saturated: fed at or above its rate"}  # fmt: skip
    split = sum(lam * _eq1(lam / b.rate, b.rate, b.burst) for b, lam in fed) / total
    whole = _eq1(total / rate, rate, burst)
    capped = any(b.burst > MODEL_MAX_BURST for b, _ in fed) or burst > MODEL_MAX_BURST
    note = f"bursts over {MODEL_MAX_BURST:.0f} evaluated at {MODEL_MAX_BURST:.0f}" if capped else ""
    return {"split_ms": split * 1e3, "whole_ms": whole * 1e3,
            "penalty_ms": (split - whole) * 1e3, "note": note}  # fmt: skip


def _eq1(load: float, rate: float, burst: float) -> float:
    """Eq. 1's mean token delay (s) of a ``(rate, burst)`` bucket at ``load``."""
    return _prob_delayed(round(load, 3), min(round(burst, 1), MODEL_MAX_BURST)) / (
        2 * rate * (1 - load)
    )


@functools.lru_cache(maxsize=4096)
def _prob_delayed(load: float, burst: float) -> float:
    # Inputs rounded (3 digits of load, 0.1 token) so that a page polling every second
    # mostly hits this cache: the model costs up to milliseconds per call.
    if load <= 0:
        return 0.0
    return prob_delayed(load, max(1.0, burst))


# -- the brokers' latency (I/O) --------------------------------------------------------------
class LatencyReader:
    """Reads every broker's ``/stats`` (JSON, no clients) at most once per ``max_age_s``:
    however many pages poll, the brokers are asked once a second."""

    def __init__(self, max_age_s: float = 1.0, timeout_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._read_at = -math.inf
        self._last: dict[str, dict[str, Latency]] = {}
        self._lock = asyncio.Lock()

    async def read(self, brokers: Iterable[BrokerInfo]) -> dict[str, dict[str, Latency]]:
        """``latency[broker][topic]`` of every broker given; one that does not answer in
        ``timeout_s`` is left out."""
        async with self._lock:
            if time.monotonic() - self._read_at < self.max_age_s:
                return self._last
            if self._session is None:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                self._session = aiohttp.ClientSession(timeout=timeout)
            ids, reads = [], []
            for b in brokers:
                try:
                    host, port = b.http_endpoint()
                except ControlError:  # an address from an old state file: no reading
                    continue
                url = URL.build(scheme="http", host=host, port=port, path="/stats")
                ids.append(b.id)
                reads.append(self._stats(url))
            answers = await asyncio.gather(*reads)
            self._last = {i: a for i, a in zip(ids, answers, strict=True) if a is not None}
            self._read_at = time.monotonic()
            return self._last

    async def _stats(self, url: URL) -> dict[str, Latency] | None:
        assert self._session is not None
        query = {"format": "json", "include_clients": "false"}
        try:
            async with self._session.get(url, params=query) as resp:
                if resp.status != 200:
                    return None
                return latencies(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def latencies(stats: Any) -> dict[str, Latency]:
    """Per topic of a broker's ``/stats`` document (its ``srtm`` section): the delivery
    and subscriber-wait p99s over its window, and its backlog age. A broker that reports
    no delivery window (older than this controller) gives no reading: nsqd's
    e2e_processing_latency counts waits for a subscriber since the broker started."""
    out = {}
    srtm = stats.get("srtm") if isinstance(stats, dict) else None
    for t in srtm.get("topics", []) if isinstance(srtm, dict) else []:
        if not isinstance(t, dict) or not isinstance(t.get("delivery_ns"), dict):
            continue
        served, waited = t["delivery_ns"], t.get("subscriber_wait_ns") or {}
        bound = b if isinstance(b := t.get("bound"), dict) else {}
        senders = [s.get("publisher") or s.get("remote_address") for s in
                   bound.get("senders") or [] if isinstance(s, dict)]  # fmt: skip
        out[str(t.get("topic"))] = Latency(
            _ms(served), int(served.get("count") or 0), _ms(waited),
            int(waited.get("count") or 0), float(t.get("backlog_age_ns") or 0) / 1e6,
            bound.get("over") is True, tuple(str(s) for s in senders if s),
        )  # fmt: skip
    return out


def _ms(summary: dict[str, Any]) -> float | None:
    """The p99 of a latency summary (ns) in ms; None without values."""
    return float(summary["p99"]) / 1e6 if summary.get("count") and "p99" in summary else None


def asset(name: str) -> bytes:
    """A file of the page (``index.html`` or one of ``ASSETS``), from the package."""
    return resources.files("srtm.control").joinpath("ui", name).read_bytes()
