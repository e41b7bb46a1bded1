"""Rate limiting: the GCRA token bucket, an rtlim-compatible pacer, splits, conformance."""

from srtm.ratelimit.bucket import (
    DEFAULT_ASYNC_SPIN_NS,
    DEFAULT_SPIN_NS,
    BucketCounters,
    Clock,
    Reservation,
    TokenBucket,
)
from srtm.ratelimit.conformance import Violation, check_conformance
from srtm.ratelimit.params import (
    MAX_BURST,
    MAX_RATE,
    MAX_TOLERANCE_NS,
    MIN_RATE,
    NS_PER_S,
    BucketParams,
    Grid,
    check_bucket,
    check_burst,
    check_rate,
    grid,
)
from srtm.ratelimit.rtlim import INSUFFICIENT, OK, OVER_REFILL, Rtlim, RtlimMode
from srtm.ratelimit.split import merge, split, split_amount, split_floored

__all__ = [
    "DEFAULT_ASYNC_SPIN_NS",
    "DEFAULT_SPIN_NS",
    "INSUFFICIENT",
    "MAX_BURST",
    "MAX_RATE",
    "MAX_TOLERANCE_NS",
    "MIN_RATE",
    "NS_PER_S",
    "OK",
    "OVER_REFILL",
    "BucketCounters",
    "BucketParams",
    "Clock",
    "Grid",
    "Reservation",
    "Rtlim",
    "RtlimMode",
    "TokenBucket",
    "Violation",
    "check_bucket",
    "check_burst",
    "check_conformance",
    "check_rate",
    "grid",
    "merge",
    "split",
    "split_amount",
    "split_floored",
]
