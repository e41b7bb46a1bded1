"""The cost model of Bhola et al. (§III): what a topic costs a broker, per resource. Pure.

CPU (in cores, CPU-seconds per second) of a topic at rate ``r`` with ``n_j`` consumers
of class ``j``: ``A·r + Σ_j B_j·r·n_j``. ``A`` is the cost of taking a message in (the
publish, the topic's queue), ``B`` the cost of one delivery (the channel's copy, the
frame sent, its FIN). In NSQ terms a consumer that receives every message is a channel:
a message is delivered once per channel, to one of that channel's subscribers.

Network (bytes/s), in and out, from the message size and the protocol's framing;
storage (bytes/s) for a disk-backed (reliable) topic, whose every durable queue writes
the message once. Both are exact counts of the wire and disk formats, not fits.

``fit_cost`` fits ``A`` and ``B`` (and the idle broker's CPU) by non-negative least
squares on samples at several rates *and* consumer counts (the paper: fitting at high
rates only made B six times too large, at low rates only made A negative; at a single
consumer count A and B cannot be told apart at all). ``correct`` is the paper's online
proportional error correction, smoothed and clamped. ``flow_costs`` and ``class_costs``
give the optimizer's ``FlowSpec.cost`` and ``ConsumerClass.cost``.

One ``CostModel`` describes one broker (its correction is its own): a controller keeps
one per broker, all starting from the same calibration.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

#: Resource names in the optimizer's cost and capacity dicts.
CPU = "cpu"
NETWORK_IN = "network_in"
NETWORK_OUT = "network_out"
STORAGE = "storage"

# Wire and disk framing (checked against srtm.protocol and srtm.broker.disk.codec by the
# tests; this module may not import them).
#: A message frame around the body: size 4, frame type 4, timestamp 8, attempts 2, id 16.
MESSAGE_FRAME_BYTES = 34
#: ``FIN <16-byte id>\n``: what a consumer sends back per delivery.
FIN_BYTES = 21
#: ``PUB <topic>\n`` + body size 4: the publish command around the body (plus the topic).
PUB_OVERHEAD_BYTES = 9
#: ``MPUB <topic>\n`` + body size 4 + count 4 (per command), + 4 per message.
MPUB_OVERHEAD_BYTES = 14
MPUB_PER_MESSAGE_BYTES = 4
#: The ``OK`` response frame a publish command gets: size 4, frame type 4, ``OK``.
OK_RESPONSE_BYTES = 10
#: A disk queue's record around the body (CRC and length 8, fixed fields 56), plus the
#: publisher's name.
DISK_RECORD_BYTES = 64

#: Default bounds of the correction factor relative to the calibrated model.
SCALE_BOUNDS = (0.25, 4.0)
#: Default weight of one measurement in the smoothed correction (EWMA).
CORRECTION_ALPHA = 0.2
#: Default least load (cores, idle excluded) that a correction is made at.
CORRECTION_MIN_LOAD = 0.02


@dataclass(frozen=True)
class CostModel:
    """One broker's CPU model: ``a_cpu_s`` CPU-seconds per message taken in (A),
    ``b_cpu_s`` per message delivered to one consumer (B; ``class_b`` overrides it per
    consumer class, the paper's B_j), ``idle_cpu`` cores used with no traffic, and
    ``scale``, the online correction applied to A and B (1: as calibrated)."""

    a_cpu_s: float
    b_cpu_s: float
    idle_cpu: float = 0.0
    class_b: Mapping[str, float] = field(default_factory=dict)
    scale: float = 1.0

    def __post_init__(self) -> None:
        values = {"a_cpu_s": self.a_cpu_s, "b_cpu_s": self.b_cpu_s, "idle_cpu": self.idle_cpu}
        values |= {f"class_b[{k!r}]": v for k, v in self.class_b.items()}
        for name, value in values.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be finite and > 0, got {self.scale}")

    @property
    def a(self) -> float:
        """A as corrected: CPU-seconds per message taken in."""
        return self.a_cpu_s * self.scale

    def b(self, cls: str | None = None) -> float:
        """B (or class ``cls``'s B_j) as corrected: CPU-seconds per delivery."""
        fitted = self.b_cpu_s if cls is None else self.class_b.get(cls, self.b_cpu_s)
        return fitted * self.scale

    def topic_cpu(self, rate: float, consumers: float | Mapping[str, float] = 0) -> float:
        """Cores a topic uses at ``rate`` msg/s delivered to ``consumers`` (a count, or a
        count per class): ``A·r + Σ_j B_j·r·n_j``; the idle CPU is the broker's, not here."""
        if isinstance(consumers, Mapping):
            per_message = self.a + math.fsum(self.b(c) * n for c, n in consumers.items())
        else:
            per_message = self.a + self.b() * consumers
        return per_message * rate

    def predict(self, topics: Iterable[tuple[float, float | Mapping[str, float]]]) -> float:
        """The broker's CPU (cores) with ``topics`` as ``(rate, consumers)``: idle + Σ."""
        return self.idle_cpu + math.fsum(self.topic_cpu(r, n) for r, n in topics)

    def available_cpu(self, threshold: float) -> float:
        """The optimizer's CPU capacity for a broker allowed ``threshold`` cores in all:
        what the idle broker uses is not there to give."""
        return max(0.0, threshold - self.idle_cpu)


# == fitting ==============================================================================
@dataclass(frozen=True)
class CostSample:
    """One measurement: ``rate`` msg/s published, ``consumers`` deliveries per message
    (channels; may be fractional where deliveries fell behind), ``cpu`` cores used."""

    rate: float
    consumers: float
    cpu: float


@dataclass(frozen=True)
class CostFit:
    """A least-squares fit: the model, ``r2`` (1 − SS_res/SS_tot, around the mean CPU;
    1.0 when every sample has the same CPU and the fit is exact), the RMS residual in
    cores, and the coefficients the non-negativity held at 0 (a sign the samples do not
    span the workload: the paper's negative A)."""

    model: CostModel
    r2: float
    rms_residual: float
    samples: int
    held_at_zero: tuple[str, ...] = ()

    def residuals(self, samples: Iterable[CostSample]) -> list[float]:
        """Measured minus predicted CPU per sample."""
        return [s.cpu - self.model.predict([(s.rate, s.consumers)]) for s in samples]


_TERMS = ("idle_cpu", "a_cpu_s", "b_cpu_s")


def _columns(s: CostSample) -> tuple[float, float, float]:
    return (1.0, s.rate, s.rate * s.consumers)


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None if (nearly) singular."""
    n = len(rhs)
    m = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-10:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - math.fsum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _least_squares(
    samples: list[CostSample], free: tuple[int, ...]
) -> tuple[list[float], float] | None:
    """Least squares over the ``free`` terms (the others 0): coefficients, SS_res."""
    cols = [[_columns(s)[t] for t in free] for s in samples]
    # Columns scaled to unit norm: rates (1e4) and deliveries (1e5) beside the idle
    # column's 1 would otherwise make the normal equations ill-conditioned.
    norms = [math.sqrt(math.fsum(row[k] ** 2 for row in cols)) for k in range(len(free))]
    if any(nm == 0 for nm in norms):
        return None
    scaled = [[row[k] / norms[k] for k in range(len(free))] for row in cols]
    k = len(free)
    ata = [[math.fsum(row[i] * row[j] for row in scaled) for j in range(k)] for i in range(k)]
    aty = [
        math.fsum(row[i] * s.cpu for row, s in zip(scaled, samples, strict=True)) for i in range(k)
    ]
    x = _solve(ata, aty)
    if x is None:
        return None
    coef = [0.0, 0.0, 0.0]
    for t, xi, nm in zip(free, x, norms, strict=True):
        coef[t] = xi / nm
    ss = math.fsum(
        (s.cpu - math.fsum(c * v for c, v in zip(coef, _columns(s), strict=True))) ** 2
        for s in samples
    )
    return coef, ss


def fit_cost(
    samples: Iterable[CostSample | tuple[float, float, float]], *, idle: bool = True
) -> CostFit:
    """Fit ``cpu = idle_cpu + A·rate + B·rate·consumers`` by non-negative least squares
    (every subset of the terms solved, the best with no negative coefficient kept).

    ``idle=False`` fits through the origin (the paper's form). Raises ValueError when
    the samples cannot separate A from B: they need at least two rates and two consumer
    counts (the paper's warning; at one consumer count ``r`` and ``r·n`` are collinear).
    """
    pts = [s if isinstance(s, CostSample) else CostSample(*s) for s in samples]
    for i, s in enumerate(pts):
        if not all(math.isfinite(v) for v in (s.rate, s.consumers, s.cpu)):
            raise ValueError(f"sample {i} is not finite: {s}")
        if s.rate < 0 or s.consumers < 0:
            raise ValueError(f"sample {i}: rate and consumers must be >= 0: {s}")
    loaded = [s for s in pts if s.rate > 0]
    if len({s.rate for s in loaded}) < 2 or len({s.consumers for s in loaded}) < 2:
        raise ValueError(
            "the samples need at least two rates and two consumer counts to separate A "
            "(per message) from B (per delivery)"
        )
    candidates = (0, 1, 2) if idle else (1, 2)
    best: tuple[float, list[float], tuple[int, ...]] | None = None
    full = None
    for size in range(len(candidates), 0, -1):
        for free in itertools.combinations(candidates, size):
            solved = _least_squares(pts, free)
            if solved is None:
                continue
            coef, ss = solved
            if free == candidates:
                full = solved
            if min(coef) < 0:
                continue
            if best is None or ss < best[0] * (1 - 1e-12):
                best = (ss, coef, free)
    if full is None:
        raise ValueError("the samples do not determine A and B (the fit is singular)")
    if best is None:
        best = (math.fsum(s.cpu**2 for s in pts), [0.0, 0.0, 0.0], ())
    ss, coef, free = best
    mean = math.fsum(s.cpu for s in pts) / len(pts)
    ss_tot = math.fsum((s.cpu - mean) ** 2 for s in pts)
    r2 = 1.0 - ss / ss_tot if ss_tot > 0 else (1.0 if ss == 0 else 0.0)
    held = tuple(_TERMS[t] for t in candidates if t not in free)
    model = CostModel(a_cpu_s=coef[1], b_cpu_s=coef[2], idle_cpu=coef[0])
    return CostFit(model, r2, math.sqrt(ss / len(pts)), len(pts), held)


# == online correction ====================================================================
def correct(
    model: CostModel,
    measured_cpu: float,
    predicted_cpu: float,
    *,
    alpha: float = CORRECTION_ALPHA,
    bounds: tuple[float, float] = SCALE_BOUNDS,
    min_load: float = CORRECTION_MIN_LOAD,
) -> CostModel:
    """The paper's proportional error correction: scale A and B by measured ÷ predicted
    CPU, smoothed and clamped.

    ``predicted_cpu`` is ``model.predict(...)`` for the interval ``measured_cpu`` covers
    (both in cores, idle included); the ratio is taken on the load above the idle CPU,
    which A and B model. So the correction's fixed point is a model that predicts what
    is measured.

    - Smoothed (``alpha``, an EWMA per call): one second's CPU is noisy (a collection, the
      disk thread, consumers connecting, which the paper notes its model ignores), and
      the optimizer should not chase it. At a 1 s tick, 0.2 is a time constant of ~5 s.
    - Clamped to ``bounds`` times the calibration: a scale near 0 would make every
      topic look free and the optimizer admit everything (an overload); a huge one
      would starve every topic to r_min. A model off by more than the bounds needs a
      new ``srtm calibrate --cost``, not a correction.
    - Skipped (the model returned as it is) below ``min_load`` cores of predicted load,
      where the ratio is mostly noise, and on a measurement that is not finite or < 0.
      Never negative: the scale only moves between its bounds, which are > 0.
    """
    lo, hi = bounds
    if not (0 < lo <= 1 <= hi and math.isfinite(hi)):
        raise ValueError(f"bounds must satisfy 0 < low <= 1 <= high, got {bounds}")
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    load = predicted_cpu - model.idle_cpu
    if not (math.isfinite(measured_cpu) and math.isfinite(predicted_cpu)) or measured_cpu < 0:
        return model
    if load < min_load:
        return model
    ratio = max(0.0, measured_cpu - model.idle_cpu) / load
    scale = model.scale * (1 + alpha * (ratio - 1))
    return replace(model, scale=min(hi, max(lo, scale)))


# == the optimizer's costs ================================================================
def _publish_in(message_bytes: float, topic: str, batch: int) -> float:
    if batch <= 1:
        return message_bytes + PUB_OVERHEAD_BYTES + len(topic)
    per_command = MPUB_OVERHEAD_BYTES + len(topic)
    return message_bytes + MPUB_PER_MESSAGE_BYTES + per_command / batch


def flow_costs(
    model: CostModel,
    message_bytes: float,
    *,
    topic: str = "",
    deliveries: float = 0,
    batch: int = 1,
    reliable: bool = False,
) -> dict[str, float]:
    """A flow's cost per msg/s, per resource: ``FlowSpec.cost``.

    ``cpu`` is A, plus B per delivery in ``deliveries``: the fan-out not counted in a
    consumer class (a one-to-one flow's single channel: 1; a one-to-many flow's classes
    carry their own through ``class_costs``). ``network_in`` is the publish command
    (``batch`` messages per MPUB; 1: PUB) and ``network_out`` its OK response, plus the
    frames and FINs of ``deliveries``. A ``reliable`` (disk-backed) flow writes each
    message to the topic's durable queue, ``storage`` bytes.
    """
    if message_bytes < 0 or deliveries < 0 or batch < 1:
        raise ValueError("message_bytes and deliveries must be >= 0, batch >= 1")
    per_delivery = class_costs(model, message_bytes, reliable=reliable)
    out = {
        CPU: model.a + deliveries * per_delivery[CPU],
        NETWORK_IN: _publish_in(message_bytes, topic, batch)
        + deliveries * per_delivery[NETWORK_IN],
        NETWORK_OUT: OK_RESPONSE_BYTES / batch + deliveries * per_delivery[NETWORK_OUT],
    }
    if reliable:
        out[STORAGE] = DISK_RECORD_BYTES + message_bytes + deliveries * per_delivery[STORAGE]
    return out


def class_costs(
    model: CostModel, message_bytes: float, cls: str | None = None, *, reliable: bool = False
) -> dict[str, float]:
    """One consumer's cost per msg/s (``ConsumerClass.cost``): B (class ``cls``'s B_j),
    the message frame out and the FIN in, and for a ``reliable`` flow its channel's
    durable queue writing the message."""
    out = {
        CPU: model.b(cls),
        NETWORK_IN: float(FIN_BYTES),
        NETWORK_OUT: MESSAGE_FRAME_BYTES + message_bytes,
    }
    if reliable:
        out[STORAGE] = DISK_RECORD_BYTES + message_bytes
    return out


# == the calibration document ============================================================
def cost_doc(fit: CostFit) -> dict[str, Any]:
    """The fit's part of ``srtm calibrate --cost --json``'s document (the command adds
    its ``samples``)."""
    m = fit.model
    return {
        "a_cpu_s_per_msg": m.a_cpu_s,
        "b_cpu_s_per_delivery": m.b_cpu_s,
        "idle_cpu": m.idle_cpu,
        "r2": fit.r2,
        "rms_residual": fit.rms_residual,
        "held_at_zero": list(fit.held_at_zero),
    }


def model_from_doc(doc: Mapping[str, Any]) -> CostModel:
    """The model in a ``srtm calibrate --cost --json`` document (ValueError naming the
    field when one is missing or wrong)."""
    values = {}
    for key in ("a_cpu_s_per_msg", "b_cpu_s_per_delivery"):
        v = doc.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{key} must be a number, got {v!r}")
        values[key] = float(v)
    idle = doc.get("idle_cpu", 0.0)
    if isinstance(idle, bool) or not isinstance(idle, int | float):
        raise ValueError(f"idle_cpu must be a number, got {idle!r}")
    return CostModel(values["a_cpu_s_per_msg"], values["b_cpu_s_per_delivery"], float(idle))
