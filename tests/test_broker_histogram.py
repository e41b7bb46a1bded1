"""Histogram values counted in bulk, in C where ``srtm.broker._histogram`` was built at
install: the same counts, total, min and max as numpy's ``record_many`` (the reference)
and as ``HdrHistogram.record_value`` one value at a time, clipped the same way."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import given
from hypothesis import strategies as st

from srtm.broker import stats
from srtm.broker.stats import _MAX_NS, Recorder, StepRecorder, record_many, record_pending

c_record = stats._c_record


def test_the_c_histogram_module_was_built() -> None:
    """Optional at install (no compiler: numpy's path is used); said here when missing."""
    if c_record is None:
        pytest.skip("srtm.broker._histogram not built: numpy's record_many is used")


def _state(h: HdrHistogram) -> tuple[list[int], int, int, int]:
    return list(h.counts), h.total_count, h.min_value, h.max_value


@given(
    values=st.lists(st.integers(-(2**40), 2 * _MAX_NS), min_size=1, max_size=300),
    kind=st.sampled_from([Recorder, StepRecorder]),
)
def test_recorded_in_c_as_numpy_and_record_value_count(
    values: list[int], kind: type[Recorder]
) -> None:
    fast, ref, one = kind().hist, kind().hist, kind().hist
    record_pending(fast, array("q", values))
    clipped = np.clip(np.array(values, dtype=np.int64), 1, _MAX_NS)
    record_many(ref, clipped)
    for v in clipped.tolist():
        one.record_value(v)
    assert _state(fast) == _state(ref) == _state(one)


def test_a_recorder_flushes_into_what_it_already_holds() -> None:
    rec, ref = Recorder(), HdrHistogram(1, _MAX_NS, 3)
    for batch in ([5, 10**6, 7], [3, 2 * 10**9, 0]):
        for v in batch:
            rec.add(v)
            ref.record_value(max(v, 1))
        rec.flush()
        assert not rec.pending
    assert _state(rec.hist) == _state(ref)


@pytest.mark.skipif(c_record is None, reason="srtm.broker._histogram not built")
def test_c_refuses_what_it_cannot_count_and_leaves_the_counts_alone() -> None:
    assert c_record is not None
    hist = Recorder().hist
    shape = (hist.unit_magnitude, hist.sub_bucket_half_count_magnitude, hist.sub_bucket_mask)
    before = list(hist.counts)
    # A highest value past the histogram's range: the last value has no count.
    with pytest.raises(IndexError, match="past the histogram's counts"):
        c_record(hist.counts, array("q", [5, 2**62]), 1, 2**62, *shape)
    with pytest.raises(TypeError, match="values of 8"):
        c_record(hist.counts, array("i", [5]), 1, _MAX_NS, *shape)
    with pytest.raises(ValueError, match="no values"):
        c_record(hist.counts, array("q"), 1, _MAX_NS, *shape)
    with pytest.raises(ValueError, match="shape"):
        c_record(hist.counts, array("q", [5]), 0, _MAX_NS, *shape)
    with pytest.raises(BufferError):
        c_record(bytes(8), array("q", [5]), 1, _MAX_NS, *shape)  # read-only counts
    assert list(hist.counts) == before
