"""Trace evaluation and queueing models of token buckets (pure, numpy/mpmath)."""

from srtm.analysis.delays import (
    as_arrivals,
    profile_bucket,
    required_burst,
    token_delays,
    virtual_backlog_ticks,
)
from srtm.analysis.md1 import (
    DelayModel,
    bucket_model,
    delay_quantile,
    mean_excess,
    prob_delayed,
    split_model,
    work_cdf,
)

__all__ = [
    "DelayModel",
    "as_arrivals",
    "bucket_model",
    "delay_quantile",
    "mean_excess",
    "profile_bucket",
    "prob_delayed",
    "required_burst",
    "split_model",
    "token_delays",
    "virtual_backlog_ticks",
    "work_cdf",
]
