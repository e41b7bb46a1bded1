"""Utility functions of a flow's admitted rate, and the request-response flow's latency
utility turned into a rate utility by mean value analysis (Bhola et al., §II).

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

#: The paper's heuristic: r_max is 10 % above the peak rate N / (T_exec + T_think),
#: because MVA overestimates T_rt at high rates.
RMAX_MARGIN = 1.1


@dataclass(frozen=True)
class Utility:
    """A piecewise-linear utility of rate through ``points`` ``(rate, utility)``, rates
    strictly increasing, utilities non-decreasing. The first rate is ``r_min``, the last
    ``r_max``; the function is flat beyond both ends."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a utility needs at least one point")
        for i, (rate, value) in enumerate(self.points):
            if not (math.isfinite(rate) and math.isfinite(value)) or rate < 0:
                raise ValueError(f"point {i} must be finite with rate >= 0, got {(rate, value)}")
            if i and rate <= self.points[i - 1][0]:
                raise ValueError(f"point {i}: rates must strictly increase")
            if i and value < self.points[i - 1][1]:
                raise ValueError(f"point {i}: utility must not decrease with rate")

    @classmethod
    def linear(cls, slope: float, r_min: float, r_max: float) -> Utility:
        """``slope · r`` on ``[r_min, r_max]`` (the paper's classes: gold 100·r, …)."""
        if r_max == r_min:
            return cls(((r_min, slope * r_min),))
        return cls(((r_min, slope * r_min), (r_max, slope * r_max)))

    @property
    def r_min(self) -> float:
        return self.points[0][0]

    @property
    def r_max(self) -> float:
        return self.points[-1][0]

    def rates(self) -> tuple[float, ...]:
        """The breakpoints: where the slope may change."""
        return tuple(p[0] for p in self.points)

    def value(self, rate: float) -> float:
        pts = self.points
        if rate <= pts[0][0]:
            return pts[0][1]
        if rate >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right([p[0] for p in pts], rate)
        (r0, u0), (r1, u1) = pts[i - 1], pts[i]
        return u0 + (u1 - u0) * (rate - r0) / (r1 - r0)

    def slope(self, rate: float) -> float:
        """The right derivative at ``rate`` (0 at and above ``r_max``)."""
        pts = self.points
        if rate >= pts[-1][0]:
            return 0.0
        i = max(1, bisect.bisect_right([p[0] for p in pts], rate))
        (r0, u0), (r1, u1) = pts[i - 1], pts[i]
        return (u1 - u0) / (r1 - r0)


def mva_response_time(clients: int, think_s: float, exec_s: float, servers: int) -> float:
    """Mean round-trip time T_rt of the paper's closed network (Fig. 1): ``clients``
    customers alternate a think (delay) station of mean ``think_s`` and a station of
    ``servers`` servers of service time ``exec_s``. Exact load-dependent MVA (Lazowska
    et al., ch. 20): R(n) = Σ_k k·S/min(k, m) · p(k−1 | n−1), X(n) = n / (Z + R(n)),
    p(k | n) = X(n)·S/min(k, m) · p(k−1 | n−1)."""
    if clients < 1 or servers < 1:
        raise ValueError("clients and servers must be >= 1")
    if not (exec_s > 0 and think_s >= 0):
        raise ValueError("exec_s must be > 0 and think_s >= 0")
    p = [1.0]  # p(k | 0): the station is empty
    response = exec_s
    for n in range(1, clients + 1):
        response = sum(k * exec_s / min(k, servers) * p[k - 1] for k in range(1, n + 1))
        throughput = n / (think_s + response)
        nxt = [0.0] * (n + 1)
        for k in range(1, n + 1):
            nxt[k] = throughput * exec_s / min(k, servers) * p[k - 1]
        # Subtraction loses precision deep in saturation; p(0) only feeds R through the
        # k = 1 term, so clamping a rounding error below zero changes nothing else.
        nxt[0] = max(0.0, 1.0 - math.fsum(nxt[1:]))
        p = nxt
    return response


@dataclass(frozen=True)
class RrPoint:
    """One breakpoint of a request-response flow's curve."""

    rate: float
    t_rt_s: float
    utility: float


@dataclass(frozen=True)
class MvaPoint:
    """MVA at an integer number of 'servers' m, i.e. at rate m / T_exec."""

    servers: int
    rate: float
    t_rt_s: float


@dataclass(frozen=True)
class RequestResponse:
    """A request-response flow as the paper models it (§II-B): ``clients`` senders with
    mean think time, the admit-to-response time ``exec_s``, and latency utility
    A(T_rt) = C·(1 − T_rt / D)."""

    clients: int
    think_s: float
    exec_s: float
    deadline_s: float
    c: float

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"clients must be >= 1, got {self.clients}")
        if not (math.isfinite(self.think_s) and self.think_s >= 0):
            raise ValueError(f"think time must be >= 0, got {self.think_s}")
        if not (math.isfinite(self.exec_s) and self.exec_s > 0):
            raise ValueError(f"execution time must be > 0, got {self.exec_s}")
        if not (math.isfinite(self.deadline_s) and self.deadline_s > self.exec_s):
            raise ValueError(
                f"deadline must exceed the execution time ({self.exec_s * 1e3:g} ms), "
                f"got {self.deadline_s * 1e3:g} ms"
            )
        if not (math.isfinite(self.c) and self.c > 0):
            raise ValueError(f"c (the maximum utility) must be > 0, got {self.c}")

    @property
    def r_min(self) -> float:
        """N / (T_think + D): the rate at which T_rt reaches the threshold D; utility 0."""
        return self.clients / (self.think_s + self.deadline_s)

    @property
    def r_max(self) -> float:
        """10 % above the peak rate N / (T_exec + T_think)."""
        return RMAX_MARGIN * self.clients / (self.exec_s + self.think_s)

    def latency_utility(self, t_rt_s: float) -> float:
        """A(T_rt) = C·(1 − T_rt/D)."""
        return self.c * (1.0 - t_rt_s / self.deadline_s)

    def mva(self, servers: int) -> MvaPoint:
        t = mva_response_time(self.clients, self.think_s, self.exec_s, servers)
        return MvaPoint(servers, servers / self.exec_s, t)

    def points(self) -> tuple[RrPoint, ...]:
        """The curve's breakpoints: (r_min, D, 0), MVA at every integer server count whose
        rate lies strictly between r_min and r_max, then (r_max, T_exec, C·(1 − T_exec/D)).
        T_rt is linear between them, so utility is too. An MVA point slower than D (or
        slower than the point before) is clamped, so utility never falls with rate."""
        r_min, r_max = self.r_min, self.r_max
        out = [RrPoint(r_min, self.deadline_s, 0.0)]
        m = math.floor(r_min * self.exec_s) + 1
        while m / self.exec_s < r_max:
            point = self.mva(m)
            t = min(point.t_rt_s, out[-1].t_rt_s)
            out.append(RrPoint(point.rate, t, self.latency_utility(t)))
            m += 1
        out.append(RrPoint(r_max, self.exec_s, self.latency_utility(self.exec_s)))
        return tuple(out)

    def t_rt(self, rate: float) -> float:
        """Interpolated T_rt at ``rate`` (D below r_min, T_exec above r_max)."""
        pts = self.points()
        if rate <= pts[0].rate:
            return pts[0].t_rt_s
        for a, b in itertools.pairwise(pts):
            if rate <= b.rate:
                return a.t_rt_s + (b.t_rt_s - a.t_rt_s) * (rate - a.rate) / (b.rate - a.rate)
        return pts[-1].t_rt_s

    def utility(self) -> Utility:
        """U(r) = A(B(r)): the rate utility the optimizer uses."""
        return Utility(tuple((p.rate, p.utility) for p in self.points()))
