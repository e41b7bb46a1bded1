"""The TB Adaptor's rule: re-split a topic's bucket to follow where its traffic arrives.

Each broker reports, per topic, its average arrival rate and its maximum virtual backlog
over a sliding window. Rates are split in proportion to the reported rates, depths in
proportion to the backlogs (every depth at least one token), both summing exactly to the
topic's (r, b). A broker whose report is stale keeps its last share: the others share
what is left, so one slow broker holds nobody up (no barrier). Small changes are ignored
(hysteresis), so the brokers are not retuned every second for noise.
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


def adapt(
    total: BucketParams,
    current: Mapping[str, BucketParams],
    reports: Mapping[str, WindowReport],
    now_s: float,
    settings: AdaptorSettings | None = None,
) -> dict[str, BucketParams]:
    """The topic's new sub-buckets per broker (``current`` itself when nothing should move)."""
    cfg = settings or AdaptorSettings()
    fresh = [b for b in current if b in reports and now_s - reports[b].at_s <= cfg.stale_after_s]
    if not fresh:
        return dict(current)
    stale = [b for b in current if b not in fresh]
    rate_left = total.rate - math.fsum(current[b].rate for b in stale)
    burst_left = total.burst - math.fsum(current[b].burst for b in stale)
    if rate_left <= 0 or burst_left < len(fresh):
        return dict(current)  # the stale shares leave too little to move: wait for them
    rates = [reports[b].rate for b in fresh]
    floor = cfg.min_rate_fraction * max(math.fsum(rates), 1.0) / len(fresh)
    new_rates = split_amount(rate_left, [max(r, floor) for r in rates])
    backlogs = [reports[b].backlog for b in fresh]
    # Without any backlog, depths follow the rates.
    weights = backlogs if any(x > 0 for x in backlogs) else new_rates
    new_bursts = split_amount(burst_left, weights, minimum=1.0)
    proposal = {b: BucketParams(r, d) for b, r, d in zip(fresh, new_rates, new_bursts, strict=True)}
    if all(_close(current[b], proposal[b], cfg.hysteresis) for b in fresh):
        return dict(current)
    return {b: proposal.get(b, current[b]) for b in current}


def _close(a: BucketParams, b: BucketParams, tolerance: float) -> bool:
    return abs(b.rate - a.rate) <= tolerance * a.rate and abs(b.burst - a.burst) <= max(
        tolerance * a.burst, 0.5
    )
