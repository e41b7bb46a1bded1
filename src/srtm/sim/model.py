"""What the simulator knows about a broker: a service-time model and latency outside it.

A broker is modelled as a FIFO processing queue behind each topic's sub-bucket. A message
costs ``per_message_s`` of one core (times a gamma multiplier of mean 1 and coefficient of
variation ``service_cv``); the first message of each read event (a batch, or a message on
its own) also costs ``per_event_s``: the work of waking the publisher's connection, which
is why bursty publishers let a broker carry more (the paper's Sec. VI-C). ``base`` is the
latency a message sees outside the queue (network both ways, the path through the broker
when idle, the subscriber). Models are JSON files; two ship with the package:
``calibrated`` (``srtm calibrate`` on the development machine, as measured: the file says
by which command, at which revision, on which machine and whether it was disturbed) and
``paper`` (service times chosen so that the paper's thresholds hold: kept for comparison).
``at_paper_speed`` puts a measured model on the paper's brokers (``PAPER_MCAP`` over
``PAPER_CORES``), the simulated figures' default broker.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from srtm.jsondoc import parse as parse_json

FloatArray = npt.NDArray[np.float64]
DistKind = Literal["constant", "quantiles"]
#: Models shipped with the package, by name.
BUILTIN = ("calibrated", "paper")
#: The paper's brokers (Sec. VI): 2 dedicated cores, 110 kmsg/s each.
PAPER_CORES = 2
PAPER_MCAP = 110_000.0


@dataclass(frozen=True, slots=True)
class Dist:
    """A non-negative distribution in seconds: a constant, or an inverse CDF given by
    points ``(q, value)`` with linear interpolation between them."""

    kind: DistKind = "constant"
    value: float = 0.0
    q: tuple[float, ...] = ()
    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "constant":
            if not (math.isfinite(self.value) and self.value >= 0):
                raise ValueError(f"constant must be a finite number >= 0, got {self.value!r}")
            return
        if self.kind != "quantiles":
            raise ValueError(f"kind must be constant or quantiles, got {self.kind!r}")
        q, v = np.asarray(self.q, float), np.asarray(self.values, float)
        if q.size < 2 or q.size != v.size:
            raise ValueError("quantiles need at least two q and as many values")
        if q[0] != 0 or q[-1] != 1 or np.any(np.diff(q) <= 0):
            raise ValueError("q must rise strictly from 0 to 1")
        if np.any(np.diff(v) < 0) or v[0] < 0 or not np.all(np.isfinite(v)):
            raise ValueError("values must be finite, >= 0 and non-decreasing")

    @property
    def mean(self) -> float:
        if self.kind == "constant":
            return self.value
        return float(np.trapezoid(self.values, self.q))

    def quantile(self, p: float) -> float:
        if self.kind == "constant":
            return self.value
        return float(np.interp(p, self.q, self.values))

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        if self.kind == "constant":
            return np.full(n, self.value)
        return np.interp(rng.random(n), self.q, self.values)

    @classmethod
    def from_samples(cls, samples: npt.ArrayLike, points: int = 101) -> Dist:
        """The empirical distribution of ``samples`` on ``points`` evenly spaced quantiles,
        plus the tail (99.9 %, 99.99 %) where it matters for a p99."""
        x = np.asarray(samples, float)
        if x.size == 0:
            raise ValueError("no samples")
        q = np.unique(np.concatenate([np.linspace(0, 1, points), [0.995, 0.999, 0.9999]]))
        v = np.maximum.accumulate(np.maximum(np.quantile(x, q), 0.0))
        return cls("quantiles", q=tuple(float(a) for a in q), values=tuple(float(b) for b in v))

    def to_json(self) -> dict[str, Any]:
        if self.kind == "constant":
            return {"kind": "constant", "value": self.value}
        return {"kind": "quantiles", "q": list(self.q), "values": list(self.values)}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Dist:
        if isinstance(doc, int | float) and not isinstance(doc, bool):
            return cls("constant", float(doc))
        if not isinstance(doc, dict):
            raise ValueError(f"{where} must be a number or an object")
        try:
            if doc.get("kind", "constant") == "constant":
                return cls("constant", float(doc["value"]))
            return cls(
                "quantiles", q=tuple(map(float, doc["q"])), values=tuple(map(float, doc["values"]))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class BrokerModel:
    """A broker as the simulator sees it (see the module docstring)."""

    name: str
    #: Capacity the Load Distributor assumes (msg/s): what ``rcap`` is computed from.
    mcap: float
    cores: int
    per_message_s: float
    per_event_s: float
    service_cv: float
    base: Dist
    #: Emulated capacity (msg/s, ``srtm broker --capacity``): a deterministic server of
    #: 1/capacity s per message replaces the CPU model (0: off).
    capacity: float = 0.0
    #: Poisson, batch-1 load (msg/s) at which p99 reaches ``slo_p99_ms`` (None: unknown).
    capacity_at_slo: float | None = None
    slo_p99_ms: float = 1.0
    source: str = ""
    #: Raw measurements and fit details, for people (the simulator ignores them).
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("mcap", "per_message_s", "per_event_s", "service_cv", "capacity"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"model {self.name!r}: {key} must be >= 0, got {value!r}")
        if self.mcap <= 0:
            raise ValueError(f"model {self.name!r}: mcap must be > 0")
        if not (isinstance(self.cores, int) and self.cores >= 1):
            raise ValueError(f"model {self.name!r}: cores must be an integer >= 1")
        if self.per_message_s <= 0 and self.capacity <= 0:
            raise ValueError(f"model {self.name!r}: per_message_s must be > 0")

    @property
    def throughput(self) -> float:
        """Messages/s the processing queue can take at most with batch-1 events."""
        if self.capacity > 0:
            return self.capacity
        return self.cores / (self.per_message_s + self.per_event_s)

    def emulated(self, capacity: float) -> BrokerModel:
        """This broker with ``srtm broker --capacity`` in front of its processing."""
        if not (math.isfinite(capacity) and capacity > 0):
            raise ValueError(f"capacity must be > 0, got {capacity!r}")
        return replace(self, name=f"{self.name}@{capacity:g}", capacity=capacity, cores=1)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["base"] = self.base.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> BrokerModel:
        if not isinstance(doc, dict):
            raise ValueError("a broker model must be a JSON object")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(doc) - known)
        if extra:
            raise ValueError(f"unknown model fields {extra}")
        missing = sorted(
            {"name", "mcap", "cores", "per_message_s", "per_event_s", "base"} - set(doc)
        )
        if missing:
            raise ValueError(f"missing model fields {missing}")
        kwargs = dict(doc)
        kwargs["base"] = Dist.from_json(doc["base"], "base")
        kwargs.setdefault("service_cv", 0.0)
        for key in ("mcap", "per_message_s", "per_event_s", "service_cv", "capacity"):
            if key in kwargs:
                kwargs[key] = float(kwargs[key])
        return cls(**kwargs)


def load(path_or_name: str | Path) -> BrokerModel:
    """A model from a JSON file, or a built-in one by name (``paper``)."""
    text: str | bytes
    if str(path_or_name) in BUILTIN:
        text = resources.files("srtm.sim").joinpath(f"models/{path_or_name}.json").read_text()
    else:
        text = Path(path_or_name).read_bytes()  # not decoded here: parse_json names bad bytes
    doc = parse_json(text, str(path_or_name))  # "PATH is not JSON: … at line L column C"
    try:
        return BrokerModel.from_json(doc)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path_or_name}: {exc}") from None


def save(model: BrokerModel, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_json(), indent=2) + "\n")


def paper() -> BrokerModel:
    """The model whose service times were chosen to make the paper's thresholds hold."""
    return load("paper")


def calibrated() -> BrokerModel:
    """The broker as ``srtm calibrate`` measured it on the development machine."""
    return load("calibrated")


def at_paper_speed(
    measured: BrokerModel, mcap: float = PAPER_MCAP, cores: int = PAPER_CORES
) -> BrokerModel:
    """``measured`` on the paper's brokers: every service time scaled by one factor, so
    that ``cores`` cores carry ``mcap`` msg/s when reads carry many messages (the rate
    ``per_message_s`` is measured at: MPUB saturation), and ``mcap`` as the capacity the
    Load Distributor assumes. The shape stays as measured: the cost of a read event
    relative to a message, the service-time spread and the base latency (the network and
    the subscriber, not the broker's speed). That one factor is the only number taken
    from the paper; none is chosen to make a figure come out."""
    if not (math.isfinite(mcap) and mcap > 0):
        raise ValueError(f"mcap must be > 0, got {mcap!r}")
    if not (isinstance(cores, int) and cores >= 1):
        raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
    if measured.capacity > 0:
        raise ValueError(f"model {measured.name!r} emulates --capacity: it has no CPU to scale")
    per_message = cores / mcap
    factor = per_message / measured.per_message_s
    return replace(
        measured,
        name=f"{measured.name}@paper",
        mcap=mcap,
        cores=cores,
        per_message_s=per_message,
        per_event_s=measured.per_event_s * factor,
        capacity_at_slo=None,
        source=f"{measured.name} (srtm calibrate) at the paper's speed: service times × "
        f"{factor:.4g} so that {cores} cores carry {mcap:,.0f} msg/s of batched reads",
        notes={"measured": measured.name, "service_time_factor": factor},
    )
