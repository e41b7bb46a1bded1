"""Queue records made and timed in bulk, in C where ``srtm.broker._records`` was built at
install: the same results as the Python references, and what C does not take done in
Python."""

from __future__ import annotations

import gc
import weakref
from array import array
from collections import deque
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.broker import message, queue, stats
from srtm.broker.message import MessageIds, hex_ids_py
from srtm.broker.queue import (
    DeferredQueue,
    MessageQueue,
    Record,
    fresh_records,
    fresh_records_py,
    run_records,
    run_records_py,
    untrack_py,
)
from srtm.broker.stats import (
    RateWindow,
    TopicStats,
    first_attempt_times,
    first_attempt_times_py,
)

c_fresh = queue._c_fresh_records
c_times = stats._c_first_attempt_times
c_run = queue._c_run_records
c_ids = message._c_hex_ids
c_untrack = queue._c_untrack

_TIME = st.integers(0, 2**62)
records = st.builds(
    lambda arrival, wait, late, attempts: (
        b"%016x" % arrival, b"b", arrival, arrival, arrival + wait, attempts, "", None
    ),
    _TIME,
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.integers(0, 3),
)  # fmt: skip


def test_the_c_records_module_was_built() -> None:
    """Optional at install (no compiler: Python's is used); said here when missing."""
    if None in (c_fresh, c_times, c_run, c_ids, c_untrack):
        pytest.skip("srtm.broker._records not built: the pure-Python versions are used")


@given(bodies=st.lists(st.binary(max_size=20), max_size=30), now=_TIME, arrival=_TIME)
def test_fresh_records_equal_pythons(bodies: list[bytes], now: int, arrival: int) -> None:
    ids = [b"%016x" % i for i in range(len(bodies))]
    want = fresh_records_py(ids, bodies, now, arrival, "pub")
    assert want == [
        (i, b, now, arrival, arrival, 0, "pub", None) for i, b in zip(ids, bodies, strict=True)
    ]
    assert fresh_records(ids, bodies, now, arrival, "pub") == want
    if c_fresh is not None:
        assert c_fresh(ids, bodies, now, arrival, "pub") == want


@given(
    bodies=st.lists(st.binary(max_size=20), max_size=30),
    times=st.tuples(_TIME, _TIME, _TIME, st.integers(0, 65534)),
    origin=st.sampled_from([None, object()]),
)
def test_run_records_equal_pythons(
    bodies: list[bytes], times: tuple[int, int, int, int], origin: object
) -> None:
    ids = [b"%016x" % i for i in range(len(bodies))]
    run = (len(bodies), *times, "pub", origin)
    want = run_records_py(ids, bodies, run)  # type: ignore[arg-type]
    assert want == [(i, b, *run[1:]) for i, b in zip(ids, bodies, strict=True)]
    assert run_records(ids, bodies, run) == want  # type: ignore[arg-type]
    if c_run is not None:
        assert c_run(ids, bodies, run) == want  # type: ignore[arg-type]


def test_run_records_need_an_id_each_and_a_whole_run() -> None:
    if c_run is None:
        pytest.skip("srtm.broker._records not built")
    with pytest.raises(ValueError):
        c_run([b"%016x" % 1], [b"a", b"b"], (2, 1, 2, 3, 0, "", None))
    with pytest.raises(ValueError):
        c_run([b"%016x" % 1], [b"a"], (1, 1, 2, 3, 0, ""))  # type: ignore[arg-type]


def test_fresh_records_need_an_id_each() -> None:
    with pytest.raises(ValueError):
        fresh_records([b"%016x" % 1], [b"a", b"b"], 1, 2, "")


@given(batch=st.lists(records, max_size=30), ahead=st.integers(0, 10**12))
def test_first_attempt_times_equal_pythons(batch: list[Record], ahead: int) -> None:
    now = max([r[4] for r in batch], default=0) + ahead
    first = [r for r in batch if r[5] == 0]
    want = first_attempt_times_py(batch, now)
    assert want == (
        len(first),
        array("q", [now - r[3] for r in first]),
        array("q", [r[4] - r[3] for r in first]),
        array("q", [now - r[4] for r in first]),
    )
    assert first_attempt_times(batch, now) == want
    if c_times is not None:
        n, lat, wait, late = c_times(batch, now)
        assert (n, array("q", lat), array("q", wait), array("q", late)) == want


def test_what_c_does_not_take_is_timed_in_python() -> None:
    odd = [b"%016x" % 1, b"b", 0, 4, 6, 0, "", None]  # a list, not a tuple: Python takes it
    if c_times is not None:
        with pytest.raises(TypeError):
            c_times([odd], 10)  # type: ignore[list-item]
    want = (1, array("q", [6]), array("q", [2]), array("q", [4]))
    assert first_attempt_times([odd], 10) == want  # type: ignore[list-item]


def test_a_time_past_int64_fails_as_in_python() -> None:
    odd = (b"%016x" % 1, b"b", 0, -(2**63), 2**62, 0, "", None)
    if c_times is not None:
        with pytest.raises(OverflowError):
            c_times([odd], 10)
    with pytest.raises(OverflowError):
        first_attempt_times([odd], 10)


def test_a_dispatch_counts_first_attempts_only() -> None:
    ts = TopicStats(RateWindow())
    recs = [(b"%016x" % i, b"b", 0, 100, 150, i % 2, "", None) for i in range(4)]
    ts.dispatched("ch", recs, 1_000, shaped=True, first_channel=True, lateness=True)
    cs = ts.channel("ch")
    assert list(cs.latency.pending) == [900, 900]
    assert list(cs.token_wait.pending) == [50, 50]
    assert list(ts.lateness.pending) == [850, 850]
    assert list(ts.latency.pending) == [900, 900]


def test_a_release_held_for_a_token_is_counted_apart_as_well() -> None:
    """Every release's lateness in ``lateness``; those held for a token (token wait > 0)
    in ``lateness_held`` too, those due on arrival (token wait 0) not."""
    ts = TopicStats(RateWindow())
    held = (b"%016x" % 1, b"b", 0, 100, 150, 0, "", None)
    on_arrival = (b"%016x" % 2, b"b", 0, 300, 300, 0, "", None)
    ts.dispatched("ch", [held, on_arrival], 1_000, shaped=True, first_channel=True, lateness=True)
    assert list(ts.lateness.pending) == [850, 700]
    assert list(ts.lateness_held.pending) == [850]
    assert ts.lateness_held in ts.recorders()  # flushed with the others


@given(first=st.integers(0, 2**64 - 1), n=st.integers(0, 300))
def test_hex_ids_equal_pythons(first: int, n: int) -> None:
    """Message ids in bulk: C and its reference make the same ids, or fail alike past
    64 bits."""
    try:
        want: list[bytes] | type[Exception] = hex_ids_py(first, n)
    except OverflowError:
        want = OverflowError
    if want is not OverflowError:
        assert want == [(b"%016x" % i)[-16:] for i in range(first, first + n)]
        assert all(len(i) == 16 for i in want)  # type: ignore[union-attr]
    if c_ids is None:
        return
    if want is OverflowError:
        with pytest.raises(OverflowError):
            c_ids(first, n)
    else:
        assert c_ids(first, n) == want


def test_hex_ids_refuse_what_they_cannot_make() -> None:
    for ids in filter(None, (c_ids, hex_ids_py)):
        assert ids(2**64 - 1, 1) == [b"f" * 16]
        with pytest.raises(OverflowError):
            ids(2**64 - 1, 2)
        with pytest.raises(OverflowError):
            ids(-1, 1)
        with pytest.raises(ValueError):
            ids(0, -1)


@pytest.mark.parametrize("start", [0, 5, 2**52 - 40])
def test_a_broker_s_ids_are_the_same_in_c_and_in_python(
    start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MessageIds.take`` in C, and in each of its Python paths (one id, a few, many, and
    past the counter's 52 bits), gives the ids ``next`` gives one at a time."""
    sizes = [1, 3, 31, 32, 200, 1, 7]
    one_by_one = MessageIds(0xABD, start=start)  # odd: past 52 bits the counter ORs into it
    want = [[one_by_one.next() for _ in range(k)] for k in sizes]
    if c_ids is not None:
        fast = MessageIds(0xABD, start=start)
        assert [fast.take(k) for k in sizes] == want
    monkeypatch.setattr(message, "_c_hex_ids", None)
    slow = MessageIds(0xABD, start=start)
    assert [slow.take(k) for k in sizes] == want


class _Held:
    """Something a queue's storage holds that a weak reference can watch."""


@pytest.mark.parametrize("make", [list, deque])
def test_an_untracked_container_keeps_what_it_holds(make: type[list[Any]]) -> None:
    """Untracked, a list or deque holds and gives the same as before, what it holds
    outlives full collections, and refcounting frees it once the container lets go."""
    for untrack in filter(None, (untrack_py, c_untrack)):
        held = _Held()
        watch = weakref.ref(held)
        container = make([b"a", held, "s", (1, None)])
        untrack(container)
        assert gc.is_tracked(container) is (untrack is untrack_py)
        del held
        gc.collect()
        assert watch() is not None and container[1] is watch()
        container.append(b"b")
        del container[1]
        assert list(container) == [b"a", "s", (1, None), b"b"]
        del container
        assert watch() is None


def test_only_lists_and_deques_are_untracked() -> None:
    if c_untrack is None:
        return  # the Python reference takes anything and does nothing
    with pytest.raises(TypeError, match="list or deque, not dict"):
        c_untrack({})  # type: ignore[arg-type]


def test_a_queue_s_bulk_storage_is_untracked_where_c_was_built() -> None:
    """What a full collection would visit entry by entry (see ``queue.untrack``)."""
    q = MessageQueue(10)
    for i in range(3):
        q.put_single(b"%016x" % i, b"body", i, i, "p")
    d = DeferredQueue(MessageQueue(10))
    storage = [q._runs, q._ids, q._bodies, q._publishers, d._mem]
    assert [gc.is_tracked(s) for s in storage] == [c_untrack is None] * 5
    assert [r[:2] for r in q.take(5)] == [(b"%016x" % i, b"body") for i in range(3)]
