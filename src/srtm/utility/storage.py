"""Storage latency and the rate bound it puts on a persisted (reliable) flow (Bhola et al.,
§III-C), pure.

A reliable producer sends its next message only once the last one is logged and
acknowledged. The time from a message's arrival to its acknowledgement, less the time it
waited in the scheduler's queue (the rate allocation's own wait), is the flow's
*inherent latency*: the disk's, set by the load on the logger, not by the allocation. It
bounds what the flow can produce: ``producers · messages_per_transaction / latency``. The
paper estimates it continuously and gives no formula; ours:

- ``inherent_latency``: one message's, from its three instants;
- ``LatencyEstimate``: the running estimate, an EWMA of the samples of each interval's
  mean (the same smoothing as the cost model's correction, ``srtm.utility.cost``);
- ``rate_bound``: ``min(r_max, producers · per_transaction / latency)``, never under
  ``r_min`` (a bound below the flow's minimum would make the problem infeasible; the
  flow then gets ``r_min`` and its producers send what they can);
- ``reachable_rate``: the same bound where the logger's load is known: the flow's own
  messages load the disk too, so the rate its producers reach is where ``r = producers /
  latency(other load + r · bytes per message)``; with the logger below, solved in closed
  form. Measured latency alone (``rate_bound``) understates the bound of a flow held
  below it (its own load is then missing from the latency), and a bound that rises
  whenever the allocation is cut makes the allocation oscillate;
- ``Logger``: the simulator's disk, a single queue of synchronous writes: ``write_s / (1
  − ρ)`` at ρ = bytes/s over its bandwidth (the M/M/1 mean response; ours, the paper
  says only that messages "queue waiting for access to disk");
- ``closed_loop_rates``: the rates that reliable flows' producers reach against that
  logger, each at most its allowance: every producer waits for its acknowledgement, so
  a flow's rate is ``min(allowed, producers / latency)`` at the load all of them make.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

#: Weight of one interval's mean latency in the running estimate.
LATENCY_ALPHA = 0.2


def inherent_latency(received_ns: int, acked_ns: int, scheduler_wait_ns: int = 0) -> float:
    """One message's inherent latency in seconds: acknowledgement − arrival − the time it
    waited for its rate allocation (never below 0)."""
    if acked_ns < received_ns:
        raise ValueError(f"acknowledged ({acked_ns}) before received ({received_ns})")
    return max(0, acked_ns - received_ns - max(0, scheduler_wait_ns)) / 1e9


def rate_bound(
    r_min: float,
    r_max: float,
    producers: int,
    latency_s: float | None,
    per_transaction: int = 1,
) -> float:
    """The highest rate a reliable flow can produce: ``producers · per_transaction /
    latency``, within ``[r_min, r_max]``. No estimate yet (``None``) or a latency of 0:
    ``r_max``."""
    if producers < 0 or per_transaction < 1:
        raise ValueError("producers must be >= 0 and per_transaction >= 1")
    if latency_s is None or latency_s <= 0 or not math.isfinite(r_max):
        return r_max
    reach = producers * per_transaction / latency_s
    return max(r_min, min(r_max, reach))


def reachable_rate(
    producers: int,
    write_s: float,
    bandwidth_bps: float,
    bytes_per_message: float,
    other_bps: float = 0.0,
    per_transaction: int = 1,
) -> float:
    """The rate ``producers`` reach when each waits for its acknowledgement from a disk of
    ``Logger(bandwidth_bps, write_s)`` that other flows load with ``other_bps``: the
    solution of ``r = P / (write_s / (1 − (other + r·k) / bandwidth))``, i.e. ``P·(1 −
    ρ_other) / (write_s + P·k / bandwidth)`` (0 when the others fill the disk)."""
    if producers < 0 or per_transaction < 1 or write_s <= 0 or bandwidth_bps <= 0:
        raise ValueError("producers >= 0, per_transaction >= 1, write_s and bandwidth > 0")
    p = producers * per_transaction
    free = max(0.0, 1.0 - max(0.0, other_bps) / bandwidth_bps)
    return p * free / (write_s + p * max(0.0, bytes_per_message) / bandwidth_bps)


def unloaded_write_s(latency_s: float, load_bps: float, bandwidth_bps: float) -> float | None:
    """The logger's write time without load inferred from a latency measured at a load
    (``latency · (1 − ρ)``: the paper's correction "from queuing delay versus observed
    logger bandwidth"); None where the measurement says nothing (no latency, ρ ≥ 1)."""
    rho = max(0.0, load_bps) / bandwidth_bps
    if not (math.isfinite(latency_s) and latency_s > 0) or rho >= 1:
        return None
    return latency_s * (1.0 - rho)


@dataclass
class LatencyEstimate:
    """A flow's running inherent latency (s): each interval's mean sample moves it
    ``alpha`` of the way (the first sets it)."""

    alpha: float = LATENCY_ALPHA
    value_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    def update(self, mean_s: float) -> float | None:
        """Fold in one interval's mean latency (a negative or non-finite one is skipped)."""
        if math.isfinite(mean_s) and mean_s >= 0:
            old = self.value_s
            self.value_s = mean_s if old is None else old + self.alpha * (mean_s - old)
        return self.value_s


@dataclass(frozen=True)
class Logger:
    """A disk that logs messages one synchronous write at a time: ``write_s`` per write
    unloaded, ``bandwidth_bps`` bytes/s at most."""

    bandwidth_bps: float
    write_s: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_bps > 0 and self.write_s > 0):
            raise ValueError("bandwidth_bps and write_s must be > 0")

    def utilisation(self, load_bps: float) -> float:
        return max(0.0, load_bps) / self.bandwidth_bps

    def latency(self, load_bps: float) -> float:
        """The mean time a write waits and takes at ``load_bps`` (inf at or past the
        bandwidth)."""
        rho = self.utilisation(load_bps)
        return math.inf if rho >= 1 else self.write_s / (1.0 - rho)


def closed_loop_rates(
    logger: Logger,
    allowed: Mapping[str, float],
    producers: Mapping[str, int],
    bytes_per_message: Mapping[str, float],
    background_bps: float = 0.0,
) -> tuple[dict[str, float], float]:
    """The rates reliable flows reach, and the logger's latency there.

    Each flow sends ``min(allowed, producers / latency)``; its messages cost
    ``bytes_per_message`` of the logger (its own record and its channels'). The load
    the rates make and the latency it causes are solved together by bisection on the
    load (the flows' total is a decreasing function of it, so there is one crossing)."""

    def rates_at(load: float) -> dict[str, float]:
        lat = logger.latency(load + background_bps)
        out = {}
        for f, r in allowed.items():
            reach = 0.0 if math.isinf(lat) else producers.get(f, 0) / lat
            out[f] = max(0.0, min(r, reach))
        return out

    def made(load: float) -> float:
        return math.fsum(r * bytes_per_message.get(f, 0.0) for f, r in rates_at(load).items())

    lo, hi = 0.0, max(0.0, logger.bandwidth_bps - background_bps)
    if made(lo) <= lo:
        rates = rates_at(lo)
    else:
        for _ in range(100):
            mid = (lo + hi) / 2
            if made(mid) > mid:
                lo = mid
            else:
                hi = mid
        rates = rates_at(hi)
    load = math.fsum(r * bytes_per_message.get(f, 0.0) for f, r in rates.items())
    return rates, logger.latency(load + background_bps)
