"""The housekeeping loop flushes a histogram once FLUSH_AT values wait; a read flushes
whatever waits."""

from __future__ import annotations

from array import array

from srtm.broker.stats import FLUSH_AT, BrokerStats

RECORD = (b"%016x" % 1, b"b", 0, 0, 0, 0, "", None)


def test_few_values_wait_for_a_read_and_many_are_flushed_by_the_loop() -> None:
    stats = BrokerStats()
    ts = stats.topic("t")
    ts.dispatched("c", [RECORD] * 10, 1_000, False, True, False)
    assert stats.pending_recorders() == []  # ten values: not worth a flush yet
    assert ts.latency.summary()["count"] == 10  # a read flushes them anyway
    stats.stamp_gaps.extend(array("q", [5] * FLUSH_AT))
    ts = stats.topic("t")
    ts.dispatched("c", [RECORD] * FLUSH_AT, 1_000, False, True, False)
    due = stats.pending_recorders()
    assert stats.stamp_gaps in due and ts.latency in due
    assert ts.channels["c"].latency in due and ts.token_wait not in due
    for rec in due:
        rec.flush()
    assert ts.latency.count == FLUSH_AT + 10 and stats.stamp_gaps.count == FLUSH_AT
