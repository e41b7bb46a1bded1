"""FIFO processing queues, vectorised.

One server: ``D_n = max(D_{n−1}, A_n) + S_n`` (Lindley) unrolls to
``D_n = C_n + max_{j≤n}(A_j − C_{j−1})`` with ``C`` the cumulative service: a cumulative
sum and a cumulative maximum. ``c`` servers sharing one FIFO queue cannot be unrolled
like that; ``pooled`` approximates them by one server ``c`` times as fast for the wait
and the full service time for the message itself. That is exact in heavy traffic and
pessimistic otherwise (for M/M/2 at ρ = 0.5 the pooled wait is 1.5× the true one; both
are a fraction of one service time there). ``exact`` is the reference, a plain loop.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def departures(arrivals_ns: IntArray, service_ns: IntArray) -> IntArray:
    """Departure times of a FIFO single server (arrivals sorted)."""
    c = np.cumsum(service_ns)
    return c + np.maximum.accumulate(arrivals_ns - (c - service_ns))


def pooled(arrivals_ns: IntArray, service_ns: IntArray, cores: int = 1) -> IntArray:
    """Time in queue plus service per job for ``cores`` servers (see the module docstring)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores!r}")
    fast = service_ns if cores == 1 else -(-service_ns // cores)
    wait = departures(arrivals_ns, fast) - fast - arrivals_ns
    return wait + service_ns


def exact(arrivals_ns: IntArray, service_ns: IntArray, cores: int = 1) -> IntArray:
    """Reference: ``cores`` servers, one FIFO queue, each job to the first free server."""
    free = [0] * cores
    out = np.empty(arrivals_ns.size, dtype=np.int64)
    for n, (a, s) in enumerate(zip(arrivals_ns.tolist(), service_ns.tolist(), strict=True)):
        start = max(a, free[0])
        heapq.heapreplace(free, start + s)
        out[n] = start + s - a
    return out
