"""Trace evaluation and queueing models of token buckets (pure, numpy/mpmath)."""

from srtm.analysis.delays import (
    as_arrivals,
    grid_delays,
    profile_bucket,
    required_burst,
    token_delays,
    virtual_backlog,
)
from srtm.analysis.drl import DrlRow, SimDelay, drl_table, poisson_batches, simulate_split
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
    "DrlRow",
    "SimDelay",
    "as_arrivals",
    "bucket_model",
    "delay_quantile",
    "drl_table",
    "grid_delays",
    "mean_excess",
    "poisson_batches",
    "prob_delayed",
    "profile_bucket",
    "required_burst",
    "simulate_split",
    "split_model",
    "token_delays",
    "virtual_backlog",
    "work_cdf",
]
