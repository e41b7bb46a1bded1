"""nsqd's delivery semantics and SRTM's shaping, on the pure topic/channel state."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from srtm.broker.message import Message
from srtm.broker.state import (
    STALE_DEADLINES,
    UNBOOKED,
    Channel,
    DeliveryError,
    Topic,
    memory_queues,
)
from srtm.broker.stats import RateWindow, Recorder
from srtm.quantiles import REPORTED
from srtm.ratelimit import check_conformance

MS = 1_000_000


@dataclass(eq=False)
class FakeConsumer:
    rdy: int = 0
    in_flight: int = 0
    msg_timeout_ns: int = 1_000 * MS


def new_topic(name: str = "t") -> Topic:
    return Topic(name, memory_queues())


def message(i: int, arrival: int = 0) -> Message:
    return Message(b"%016x" % i, b"body%d" % i, arrival, arrival)


def publish(topic: Topic, n: int, arrival: int = 0) -> None:
    for i in range(n):
        topic.put(message(i, arrival))
    topic.release(arrival)


def test_every_channel_gets_a_copy() -> None:
    topic = new_topic()
    a, b = topic.channel("a"), topic.channel("b")
    publish(topic, 3)
    assert a.depth == b.depth == 3
    assert [m.body for m in a.queue.memory()] == [m.body for m in b.queue.memory()]
    ca, cb = FakeConsumer(rdy=1), FakeConsumer(rdy=1)
    a.add_consumer(ca, 0)
    b.add_consumer(cb, 0)
    ((_, ma),) = a.dispatch(0)
    ((_, mb),) = b.dispatch(0)
    assert ma is not mb and ma.attempts == mb.attempts == 1  # own attempts, own deadlines


def test_each_message_goes_to_one_consumer_within_rdy() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    c1, c2 = FakeConsumer(rdy=2), FakeConsumer(rdy=1)
    ch.add_consumer(c1, 0)
    ch.add_consumer(c2, 0)
    publish(topic, 5)
    out = ch.dispatch(0)
    assert len(out) == 3  # RDY 2 + RDY 1
    assert len({m.id for _, m in out}) == 3
    assert (c1.in_flight, c2.in_flight) == (2, 1)
    assert ch.depth == 2
    assert ch.dispatch(0) == []  # nobody has room
    ch.fin(out[0][1].id, out[0][0])
    assert len(ch.dispatch(0)) == 1


def test_messages_wait_for_the_first_channel() -> None:
    topic = new_topic()
    publish(topic, 4)
    topic.defer(message(9), 5 * MS)
    assert topic.depth == 4 and topic.deferred_count == 1
    assert not topic.tick(5 * MS - 1)
    assert topic.tick(5 * MS)  # due: it joins the topic's queue, then waits too
    topic.release(5 * MS)
    assert topic.depth == 5 and topic.deferred_count == 0
    ch = topic.channel("late")
    assert ch.depth == 5
    assert topic.depth == 0
    assert topic.channel("later").depth == 0  # only the first channel gets what was held


def test_fin_req_touch_only_for_the_holder() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    holder, other = FakeConsumer(rdy=5), FakeConsumer(rdy=5)
    ch.add_consumer(holder, 0)
    publish(topic, 1)
    ((_, m),) = ch.dispatch(0)
    ch.add_consumer(other, 0)
    for op in (lambda: ch.fin(m.id, other), lambda: ch.touch(m.id, other, 0)):
        with pytest.raises(DeliveryError):
            op()
    with pytest.raises(DeliveryError):
        ch.fin(b"f" * 16, holder)  # never given out
    ch.fin(m.id, holder)
    with pytest.raises(DeliveryError):
        ch.fin(m.id, holder)  # already finished


def test_req_with_delay_comes_back_later_with_one_more_attempt() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    c = FakeConsumer(rdy=5)
    ch.add_consumer(c, 0)
    publish(topic, 1)
    ((_, m),) = ch.dispatch(0)
    ch.req(m.id, c, 100 * MS, now=0)
    assert c.in_flight == 0 and ch.deferred_count == 1 and ch.requeue_count == 1
    assert not ch.tick(99 * MS)
    assert ch.tick(100 * MS)
    ((_, again),) = ch.dispatch(100 * MS)
    assert again.id == m.id and again.attempts == 2


def test_timeouts_requeue_with_attempts_plus_one_and_touch_extends() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    c = FakeConsumer(rdy=5, msg_timeout_ns=1_000 * MS)
    ch.add_consumer(c, 0)
    publish(topic, 2)
    (_, m1), (_, m2) = ch.dispatch(0)
    ch.touch(m2.id, c, 600 * MS)  # m2's deadline moves to 1,600 ms
    assert ch.tick(1_000 * MS)
    assert ch.timeout_count == 1 and c.in_flight == 1
    ((_, again),) = ch.dispatch(1_000 * MS)
    assert again.id == m1.id and again.attempts == 2
    assert ch.tick(1_600 * MS) and ch.timeout_count == 2


def test_a_disconnect_leaves_in_flight_until_its_timeout() -> None:
    """As nsqd: a gone consumer's messages stay in flight (no one else may settle them),
    then time out, are counted as timeouts and are queued again."""
    topic = new_topic()
    ch = topic.channel("c")
    gone, stays = FakeConsumer(rdy=2), FakeConsumer(rdy=0)
    ch.add_consumer(gone, 0)
    ch.add_consumer(stays, 0)
    publish(topic, 3)
    taken = [m.id for _, m in ch.dispatch(0)]
    ch.remove_consumer(gone)
    assert ch.consumers == [stays] and set(ch.in_flight) == set(taken)
    assert [m.id for m in ch.queue.memory()] == [b"%016x" % 2]
    with pytest.raises(DeliveryError):
        ch.fin(taken[0], stays)
    assert not ch.tick(999 * MS) and ch.timeout_count == 0
    assert ch.tick(1_000 * MS) and ch.in_flight == {}
    assert ch.timeout_count == 2 and ch.requeue_count == 0
    assert [m.id for m in ch.queue.memory()] == [b"%016x" % 2, *taken]


def test_paused_topic_and_channel_hold_messages() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    c = FakeConsumer(rdy=5)
    ch.add_consumer(c, 0)
    topic.paused = True
    topic.put(message(0))
    assert topic.release(0) == [] and topic.depth == 1
    topic.paused = False
    topic.release(0)
    ch.paused = True
    assert ch.dispatch(0) == []
    ch.paused = False
    assert len(ch.dispatch(0)) == 1


def test_shaped_burst_is_released_in_conformance_none_dropped() -> None:
    topic = new_topic()
    topic.shape(1_000, 10, clock=lambda: 0)
    ch = topic.channel("c")
    for i in range(200):
        topic.put(message(i, arrival=0))  # a 200-message burst at t = 0
    releases = []
    now = 0
    while topic.shaping:
        nxt = topic.next_release_ns()
        assert nxt is not None
        now = max(now, nxt)
        releases += [r.due_ns for r in topic.release(now)]
    assert len(releases) == 200 and ch.depth == 200
    assert check_conformance(releases, 1_000, 10) is None
    assert releases[9] == 0 and releases[10] > 0  # the burst's first b go at once
    # ... and the 200th waits (200 − 10) token times: 190 ms at 1,000/s
    assert releases[-1] == pytest.approx(190 * MS, abs=1_000)


def test_a_release_leaves_the_next_head_to_be_booked_after_it_is_sent() -> None:
    """What has no token by the release is not booked in it (its booking would hold up
    what was released, which the caller sends first); asked next, it is booked as ever."""
    topic = new_topic()
    topic.shape(1_000, 2, clock=lambda: 0)
    for i in range(4):
        topic.put(message(i, arrival=0))
    assert [r.due_ns for r in topic.release(0)] == [0, 0]  # the burst, at once
    assert topic.shaping.peek_release_ns() == UNBOOKED
    assert topic.next_release_ns() == MS  # the third, one token time on
    assert [r.due_ns for r in topic.release(2 * MS)] == [MS, 2 * MS]
    assert not topic.shaping


def test_virtual_backlog_counts_tokens_owed() -> None:
    topic = new_topic()
    topic.shape(1_000, 10, clock=lambda: 0)
    backlogs = [topic.put(message(i, arrival=0)) for i in range(20)]
    assert backlogs[0] == pytest.approx(1)
    assert backlogs[-1] == pytest.approx(20)
    assert new_topic().put(message(0)) == 0.0


def test_window_reports_average_rate_and_max_backlog() -> None:
    w = RateWindow(seconds=10)
    s = 1_000_000_000
    for sec in range(20):
        w.add(sec * s, 100 if sec < 15 else 10, float(sec))
    now = 20 * s
    assert w.rate_1s(now) == 10
    assert w.average_rate(now) == pytest.approx((5 * 100 + 5 * 10) / 10)
    assert w.max_backlog(now) == 19
    assert w.average_rate(100 * s) == 0  # everything aged out


def test_recorder_batches_equal_recording_one_by_one() -> None:
    import numpy as np
    from hdrh.histogram import HdrHistogram

    rng = np.random.default_rng(1)
    values = rng.lognormal(11, 1.5, 50_000).astype(np.int64) + 1
    rec = Recorder()
    direct = HdrHistogram(1, 3_600_000_000_000, 3)
    for v in values.tolist():
        rec.add(v)
        direct.record_value(v)
    s = rec.summary()
    assert s["count"] == len(values)
    for key, q in REPORTED:
        assert s[key] == direct.get_value_at_percentile(q * 100)
        exact = float(np.quantile(values, q, method="inverted_cdf"))
        assert s[key] == pytest.approx(exact, rel=0.01)
    assert s["mean"] == pytest.approx(direct.get_mean_value(), rel=1e-9)
    assert s["mean"] == pytest.approx(values.mean(), rel=2e-3)


@pytest.mark.parametrize(("digits", "word"), [(3, 8), (2, 4)])
def test_a_summary_of_several_histograms_is_hdrhs_of_their_values(digits: int, word: int) -> None:
    """``summarise_many`` (the counts with a value only, between the smallest and the
    largest recorded) gives what hdrh gives for one histogram of all the values: spans
    apart, overlapping, an empty one, and the ends of the range (1 ns, 1 h)."""
    import numpy as np
    from hdrh.histogram import HdrHistogram

    from srtm.broker.stats import summarise, summarise_many

    rng = np.random.default_rng(7)
    top = 3_600_000_000_000
    spans = [
        rng.integers(900, 2_000, 300),
        rng.integers(1_500, 80_000_000, 700),
        np.array([], dtype=np.int64),
        np.array([1, 1, top, top - 1]),
        rng.lognormal(15, 2, 2_000).astype(np.int64) + 1,
    ]
    hists, everything = [], HdrHistogram(1, top, digits, word_size=word)
    for values in spans:
        h = HdrHistogram(1, top, digits, word_size=word)
        for v in values.tolist():
            h.record_value(v)
            everything.record_value(v)
        hists.append(h)
    for chosen in (hists, hists[:2], hists[1:2], hists[3:4], hists[4:]):
        reference = HdrHistogram(1, top, digits, word_size=word)
        for h in chosen:
            reference.add(h)
        got = summarise_many(chosen)
        assert got["count"] == reference.get_total_count()
        for key, q in REPORTED:
            assert got[key] == reference.get_value_at_percentile(q * 100), (key, len(chosen))
        assert got["mean"] == pytest.approx(reference.get_mean_value(), rel=1e-9)
    assert summarise(everything) == pytest.approx(summarise_many(hists), rel=1e-12)
    assert summarise_many([hists[2]])["count"] == 0 and summarise_many([])["p99"] == 0


def test_channel_head_lists_in_flight_then_queue_then_deferred() -> None:
    topic = new_topic()
    ch: Channel = topic.channel("c")
    c = FakeConsumer(rdy=1)
    ch.add_consumer(c, 0)
    publish(topic, 3)
    ((_, first),) = ch.dispatch(0)
    ch.defer(message(7), 42)
    head = ch.head()
    assert [(m.id, due) for m, due in head] == [
        (first.id, None),
        (b"%016x" % 1, None),
        (b"%016x" % 2, None),
        (b"%016x" % 7, 42),
    ]


def test_finished_messages_do_not_pile_up_deadlines() -> None:
    topic = new_topic()
    ch = topic.channel("c")
    c = FakeConsumer(rdy=10)
    ch.add_consumer(c, 0)
    for i in range(5_000):
        topic.put(message(i))
        topic.release(0)
        for _, m in ch.dispatch(0):
            ch.fin(m.id, c)
    assert ch._timeout_ids <= 4 * len(ch.in_flight) + STALE_DEADLINES
    # ... and timeouts still fire for what is in flight.
    publish(topic, 1)
    ((_, m),) = ch.dispatch(0)
    assert ch.tick(c.msg_timeout_ns) and ch.timeout_count == 1


def test_retuning_paces_what_already_waits() -> None:
    now = [0]
    topic = new_topic()
    topic.shape(10, 1, clock=lambda: now[0])
    topic.channel("c")
    for i in range(20):
        topic.put(message(i, arrival=0))
    assert len(topic.release(0)) == 1
    assert topic.next_release_ns() == 100 * MS  # the next token at 10/s
    topic.shape(1_000, 1, clock=lambda: now[0])  # the TB Adaptor gives this broker more
    releases = []
    while topic.shaping:
        nxt = topic.next_release_ns()
        assert nxt is not None
        now[0] = max(now[0], nxt)
        releases += [r.due_ns for r in topic.release(now[0])]
    assert len(releases) == 19
    assert releases[0] == 1 * MS and releases[-1] == 19 * MS  # not 100 ms, not 1.9 s
    assert check_conformance([0, *releases], 1_000, 1) is None


def test_meter_measures_the_backlog_booking_does_not_wait_for() -> None:
    topic = new_topic()
    topic.shape(1_000, 10, clock=lambda: 0)
    assert [topic.put(message(i)) for i in range(3)] == pytest.approx([1, 2, 3])
    assert topic.bucket is not None and topic.bucket.counters.admitted == 0  # none booked yet
