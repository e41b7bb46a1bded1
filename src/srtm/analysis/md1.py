"""The M/D/1 model behind Eq. (1) of the SRTM paper, for Poisson arrivals.

A ``(r, b)`` bucket fed by Poisson arrivals at ``λ`` is an M/D/1 queue with
service time ``1/r``; a message waits only when the unfinished work ``U`` (in
tokens) it finds exceeds ``b − 1``, and then waits ``(U − (b − 1))/r``. The work
distribution is Erlang's closed form

    P(U ≤ x) = (1 − ρ) Σ_{k=0}^{⌊x⌋} e^{ρ(x−k)} (−ρ(x−k))^k / k!,

an alternating sum evaluated with mpmath at enough digits to survive cancellation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath

from srtm.ratelimit import check_burst, check_rate


@dataclass(frozen=True, slots=True)
class DelayModel:
    """Predicted token delay of one ``(rate, burst)`` bucket under Poisson load."""

    rate: float
    burst: float
    load: float
    prob_delayed: float
    mean_s: float
    eq1_mean_s: float
    p99_s: float


def _check_load(load: float) -> float:
    rho = float(load)
    if not math.isfinite(rho) or not 0 < rho < 1:
        raise ValueError(f"load (λ/r) must be in (0, 1) for a stable queue, got {load!r}")
    return rho


def _digits(x: float, rho: float) -> int:
    # Terms grow to about e^{2ρx}; keep 25 significant digits beyond that.
    return 25 + int(2 * rho * x / math.log(10))


def work_cdf(x: float, load: float) -> float:
    """``P(U ≤ x)`` for unfinished work ``U`` in tokens (service times) at load ``ρ``."""
    rho = _check_load(load)
    if x < 0:
        return 0.0
    with mpmath.workdps(_digits(x, rho)):
        return float(_cdf_mp(mpmath.mpf(x), mpmath.mpf(rho)))


def _cdf_mp(x: mpmath.mpf, rho: mpmath.mpf) -> mpmath.mpf:
    total = mpmath.mpf(0)
    for k in range(int(mpmath.floor(x)) + 1):
        y = rho * (x - k)
        total += mpmath.exp(y) * (-y) ** k / mpmath.factorial(k)
    return (1 - rho) * total


def prob_delayed(load: float, burst: float) -> float:
    """``P(U > b − 1)``: the chance that a message finds no token."""
    return 1.0 - work_cdf(check_burst(burst) - 1, load)


def mean_excess(load: float, c: float) -> float:
    """``E[(U − c)^+]`` in tokens, from ``E[U] − c + ∫_0^c P(U ≤ x) dx``.

    The integral is closed-form: term ``k`` integrates to
    ``(1/ρ)(e^{Z} Σ_{j≤k} (−Z)^j/j! − 1)`` with ``Z = ρ(c − k)``.
    """
    rho_f = _check_load(load)
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c!r}")
    with mpmath.workdps(_digits(c, rho_f) + 10):
        rho = mpmath.mpf(rho_f)
        cm = mpmath.mpf(c)
        integral = mpmath.mpf(0)
        for k in range(int(mpmath.floor(cm)) + 1):
            z = rho * (cm - k)
            term, partial = mpmath.mpf(1), mpmath.mpf(1)
            for j in range(1, k + 1):
                term *= -z / j
                partial += term
            integral += mpmath.exp(z) * partial - 1
        integral *= (1 - rho) / rho
        mean_work = rho / (2 * (1 - rho))
        return float(max(mpmath.mpf(0), mean_work - cm + integral))


def delay_quantile(load: float, rate: float, burst: float, q: float = 0.99) -> float:
    """The ``q`` quantile of the token delay, in seconds."""
    rate = check_rate(rate)
    c = check_burst(burst) - 1
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    if work_cdf(c, load) >= q:
        return 0.0
    lo, hi = c, c + 1.0
    while work_cdf(hi, load) < q:
        lo, hi = hi, c + 2 * (hi - c)
    for _ in range(60):
        mid = (lo + hi) / 2
        if work_cdf(mid, load) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return (hi - c) / rate


def bucket_model(load: float, rate: float, burst: float) -> DelayModel:
    """Token delay of an ``(rate, burst)`` bucket fed Poisson arrivals at ``load·rate``."""
    rho = _check_load(load)
    rate = check_rate(rate)
    burst = check_burst(burst)
    p = prob_delayed(rho, burst)
    return DelayModel(
        rate=rate,
        burst=burst,
        load=rho,
        prob_delayed=p,
        mean_s=mean_excess(rho, burst - 1) / rate,
        eq1_mean_s=p / (2 * rate * (1 - rho)),
        p99_s=delay_quantile(rho, rate, burst, 0.99),
    )


def split_model(load: float, rate: float, burst: float, k: int) -> DelayModel:
    """A ``k``-way equal split: each sub-bucket ``(r/k, b/k)`` gets ``λ/k`` (Poisson thinning).

    ValueError when ``b/k < 1``: a sub-bucket must hold at least one token.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    burst = check_burst(burst)
    if burst / k < 1:
        raise ValueError(f"burst {burst!r} split {k} ways gives {burst / k:.6g} < 1 token")
    return bucket_model(load, check_rate(rate) / k, burst / k)
