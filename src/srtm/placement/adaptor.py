"""The TB Adaptor's rule: re-split a topic's bucket to follow where its traffic arrives.

Each broker reports, per topic, its average arrival rate and its maximum virtual backlog
over a sliding window, and how many messages wait for tokens now. Rates are split in
proportion to the reported rates, depths in proportion to the backlogs (every depth at
least one token), both summing exactly to the topic's (r, b). A broker whose report is
stale keeps its last share: the others share what is left, so one slow broker holds
nobody up (no barrier). Small changes are ignored (hysteresis), so the brokers are not
retuned every second for noise.

A queue behind a sub-bucket drains only at the share's headroom over its traffic (10 % of
it at the usual rate factor of 1.1): a small share that is handed a backlog, say the
old traffic that reached it in the moment its share shrank at a plan change, then
delays its messages for seconds to minutes while the others' headroom idles. So the
topic's headroom goes first to brokers whose queue is deeper than their bucket, enough
to drain it in ``drain_s``; and this also happens while the adaptor otherwise waits for
the windows to refill after a plan change (``settling``), taking at most ``max_take``
of every other share, since the windows cannot yet say what headroom there is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from srtm.ratelimit import BucketParams, split_amount


@dataclass(frozen=True, slots=True)
class WindowReport:
    """One broker's window for one topic, and when it was received (controller clock, s)."""

    rate: float
    backlog: float
    at_s: float
    #: Messages waiting for tokens when it reported.
    waiting: float = 0.0


@dataclass(frozen=True, slots=True)
class AdaptorSettings:
    #: A report older than this is stale: its broker keeps its share.
    stale_after_s: float = 3.0
    #: No change unless some share moves by more than this fraction of itself.
    hysteresis: float = 0.1
    #: Every reporting broker keeps at least this fraction of an even share of the rate,
    #: so a broker whose traffic paused can still release the first message that comes.
    min_rate_fraction: float = 0.01
    #: After a plan change, wait this long before adapting: until the brokers' windows
    #: (10 s) hold only traffic from after it, they under-report a broker that just
    #: gained publishers, and following them would starve its sub-bucket.
    settle_s: float = 11.0
    #: A queue deeper than its bucket is given the rate to drain in this long (s).
    drain_s: float = 1.0
    #: While settling, a drain takes at most this share of every other broker's rate.
    max_take: float = 0.05


def adapt(
    total: BucketParams,
    current: Mapping[str, BucketParams],
    reports: Mapping[str, WindowReport],
    now_s: float,
    settings: AdaptorSettings | None = None,
    *,
    settling: bool = False,
) -> dict[str, BucketParams]:
    """The topic's new sub-buckets per broker (``current`` itself when nothing should move).
    ``settling``: a plan change is recent, so its windows under-report: only a queue
    deeper than its bucket moves rate, from the shares the plan gave (module docstring)."""
    cfg = settings or AdaptorSettings()
    fresh = [b for b in current if b in reports and now_s - reports[b].at_s <= cfg.stale_after_s]
    if not fresh:
        return dict(current)
    stale = [b for b in current if b not in fresh]
    rate_left = total.rate - math.fsum(current[b].rate for b in stale)
    burst_left = total.burst - math.fsum(current[b].burst for b in stale)
    if rate_left <= 0 or burst_left < len(fresh):
        return dict(current)  # the stale shares leave too little to move: wait for them
    drains = [_drain(reports[b], current[b], cfg) for b in fresh]
    if settling:
        if not any(drains):
            return dict(current)
        new_rates = _with_drains(rate_left, [current[b].rate for b in fresh], drains,
                                 cfg.max_take * rate_left)  # fmt: skip
        new_bursts = [current[b].burst for b in fresh]
    else:
        rates = [reports[b].rate for b in fresh]
        floor = cfg.min_rate_fraction * max(math.fsum(rates), 1.0) / len(fresh)
        base = [max(r, floor) for r in rates]
        headroom = rate_left - math.fsum(base)
        if headroom > 0 and any(drains):
            new_rates = _with_drains(rate_left, base, drains, headroom)
        else:
            new_rates = split_amount(rate_left, base)
        backlogs = [reports[b].backlog for b in fresh]
        # Without any backlog, depths follow the rates.
        weights = backlogs if any(x > 0 for x in backlogs) else new_rates
        new_bursts = split_amount(burst_left, weights, minimum=1.0)
    proposal = {b: BucketParams(r, d) for b, r, d in zip(fresh, new_rates, new_bursts, strict=True)}
    if all(_close(current[b], proposal[b], cfg.hysteresis) for b in fresh):
        return dict(current)
    return {b: proposal.get(b, current[b]) for b in current}


def _drain(report: WindowReport, share: BucketParams, cfg: AdaptorSettings) -> float:
    """The rate that drains a queue deeper than its bucket in ``drain_s`` (else 0)."""
    return report.waiting / cfg.drain_s if report.waiting > share.burst else 0.0


def _with_drains(
    rate_left: float, base: list[float], drains: list[float], spare: float
) -> list[float]:
    """``rate_left`` split as ``base`` scaled down to make room, plus up to ``spare`` of it
    given to the drains in proportion (every share stays > 0; sums exact)."""
    give = min(math.fsum(drains), spare)
    scaled = split_amount(rate_left - give, base)
    extra = split_amount(give, drains) if give > 0 else [0.0] * len(base)
    out = [a + e for a, e in zip(scaled, extra, strict=True)]
    out[-1] = rate_left - math.fsum(out[:-1])
    return out


def _close(a: BucketParams, b: BucketParams, tolerance: float) -> bool:
    return abs(b.rate - a.rate) <= tolerance * a.rate and abs(b.burst - a.burst) <= max(
        tolerance * a.burst, 0.5
    )
