"""A channel's messages in flight: a dispatch put in flight (``fly``) and a consumer's run
of FINs taken off them (``fin_flights``). The C functions (where built) do what the Python
references do, to the dict's order."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srtm.broker import flights
from srtm.broker.flights import FinsTaken, fin_flights, fin_flights_py, fly, fly_py

Fin = Callable[[dict[bytes, Any], list[bytes], object], FinsTaken]

Fly = Callable[[dict[bytes, Any], list[Any], object, int], list[bytes]]

#: The references, and what the broker calls (C where it was built).
FINS: list[Fin] = [fin_flights_py, fin_flights]
FLIES: list[Fly] = [fly_py, fly]


class Origin:
    """A disk segment's stand-in: counts what was settled."""

    def __init__(self) -> None:
        self.settled = 0

    def settle(self, k: int = 1) -> None:
        self.settled += k

    def share(self, n: int) -> None:
        pass


ME, OTHER = object(), object()


def record(mid: bytes, origin: object = None) -> tuple[Any, ...]:
    return (mid, b"body", 1, 2, 3, 0, "pub", origin)


def in_flight(*owned: tuple[bytes, object, object]) -> dict[bytes, Any]:
    """(id, consumer, origin) each: the channel's dict of flights, in that order."""
    return {mid: (record(mid, origin), consumer, 99) for mid, consumer, origin in owned}


def test_the_c_function_was_built() -> None:
    """Optional at install (no compiler: the Python loop is used); said here when missing."""
    if flights._c is None:
        pytest.skip("srtm.broker._flights not built: the Python reference is used")
    assert fin_flights(in_flight((b"a", ME, None)), [b"a"], ME) == (1, [], [])
    assert fly is flights._c.fly  # the broker calls it with no Python frame between


@pytest.mark.parametrize("put", FLIES)
def test_a_dispatch_is_put_in_flight_after_what_was_there(put: Fly) -> None:
    f = in_flight((b"a", OTHER, None))
    recs = [record(b"b"), record(b"c")]
    assert put(f, recs, ME, 7) == [b"b", b"c"]
    assert list(f.items()) == [
        (b"a", (record(b"a"), OTHER, 99)),
        (b"b", (recs[0], ME, 7)),
        (b"c", (recs[1], ME, 7)),
    ]
    assert f[b"b"][0] is recs[0]  # the record itself, not a copy
    assert put(f, [], ME, 8) == [] and len(f) == 3


@pytest.mark.parametrize("put", FLIES)
def test_a_bad_record_puts_nothing_in_flight(put: Fly) -> None:
    f = in_flight((b"a", ME, None))
    with pytest.raises((TypeError, IndexError)):
        put(f, [record(b"b"), ()], ME, 7)
    with pytest.raises(TypeError):
        put(f, [record(b"c"), 5], ME, 7)
    assert list(f) == [b"a"]


def test_c_says_which_record_is_bad() -> None:
    if flights._c is None:
        pytest.skip("srtm.broker._flights not built")
    with pytest.raises(TypeError, match="record 1 is not a tuple with an id"):
        flights._c.fly({}, [record(b"a"), [b"b"]], ME, 1)
    with pytest.raises(TypeError):
        flights._c.fly({}, (record(b"a"),), ME, 1)  # a tuple of records, not a list


@pytest.mark.parametrize("fin", FINS)
def test_this_consumers_flights_go_and_the_rest_stay_in_order(fin: Fin) -> None:
    f = in_flight((b"a", ME, None), (b"b", OTHER, None), (b"c", ME, None), (b"d", ME, None))
    done = fin(f, [b"c", b"b", b"x", b"a", b"c"], ME)
    assert done == FinsTaken(2, [b"b", b"x", b"c"], [])
    assert list(f) == [b"b", b"d"]  # another consumer's kept where it was
    assert f[b"b"][1] is OTHER


@pytest.mark.parametrize("fin", FINS)
def test_origins_are_settled_per_run(fin: Fin) -> None:
    a, b = Origin(), Origin()
    owned = [(b"1", a), (b"2", a), (b"3", b), (b"4", None), (b"5", a), (b"6", b)]
    f = in_flight(*((mid, ME, o) for mid, o in owned))
    done = fin(f, [b"1", b"2", b"3", b"4", b"5", b"9", b"6"], ME)
    assert done.done == 6 and done.failed == [b"9"] and not f
    assert done.settles == [(a, 2), (b, 1), (a, 1), (b, 1)]


@pytest.mark.parametrize("fin", FINS)
def test_an_origin_held_only_by_its_flight_outlives_it(fin: Fin) -> None:
    f = in_flight((b"a", ME, Origin()), (b"b", ME, Origin()))
    gone = weakref.ref(f[b"a"][0][7])
    done = fin(f, [b"a", b"b"], ME)
    gc.collect()
    assert gone() is not None  # the settles hold it
    for origin, run in done.settles:
        origin.settle(run)
    assert [o.settled for o, _ in done.settles] == [1, 1]


@pytest.mark.parametrize("fin", FINS)
def test_nothing_to_finish(fin: Fin) -> None:
    f = in_flight((b"a", ME, None))
    assert fin(f, [], ME) == (0, [], [])
    assert fin({}, [b"a"], ME) == (0, [b"a"], [])
    assert list(f) == [b"a"]


def test_c_stops_before_a_flight_it_does_not_take_and_python_goes_on() -> None:
    if flights._c is None:
        pytest.skip("srtm.broker._flights not built")
    odd: dict[bytes, Any] = {
        b"a": (record(b"a"), ME, 1),
        b"b": [record(b"b"), ME, 1],  # a list, not a tuple
        b"c": ((b"c", b"short"), ME, 1),  # a record of 2 fields
        b"d": (record(b"d"), ME, 1),
    }
    done, failed, settles, stopped = flights._c.fin_flights(dict(odd), [b"a", b"b"], ME)
    assert (done, failed, settles, stopped) == (1, [], [], 1)
    c_stop = dict(odd)
    assert flights._c.fin_flights(c_stop, [b"c", b"d"], ME)[3] == 0
    assert list(c_stop) == list(odd)  # untouched where it stopped
    # A short record is the reference's IndexError too; a list flight it takes.
    mixed, ref = dict(odd), dict(odd)
    assert fin_flights(mixed, [b"a", b"b", b"d"], ME) == fin_flights_py(ref, [b"a", b"b", b"d"], ME)
    assert list(mixed) == list(ref) == [b"c"]
    with pytest.raises(IndexError):
        fin_flights(dict(odd), [b"c"], ME)


def test_c_refuses_what_is_not_a_dict_and_a_list() -> None:
    if flights._c is None:
        pytest.skip("srtm.broker._flights not built")
    with pytest.raises(TypeError):
        flights._c.fin_flights([], [b"a"], ME)
    with pytest.raises(TypeError):
        flights._c.fin_flights({}, (b"a",), ME)


_ids = st.sampled_from([b"%02d" % i for i in range(12)])
_owned = st.lists(
    st.tuples(_ids, st.sampled_from([0, 1]), st.sampled_from([None, 0, 1, 2])), max_size=12
)


@settings(max_examples=400, deadline=None)
@given(_owned, st.lists(_ids, max_size=16))
def test_c_and_python_agree(owned: list[tuple[bytes, int, int | None]], mids: list[bytes]) -> None:
    consumers, origins = [ME, OTHER], [Origin(), Origin(), Origin()]
    flown = [(m, consumers[c], None if o is None else origins[o]) for m, c, o in owned]
    ref, got = in_flight(*flown), in_flight(*flown)
    assert fin_flights(got, list(mids), ME) == fin_flights_py(ref, list(mids), ME)
    assert list(got.items()) == list(ref.items())


@settings(max_examples=200, deadline=None)
@given(_owned, st.lists(_ids, max_size=16), st.integers(0, 2**40))
def test_c_and_python_put_alike(
    owned: list[tuple[bytes, int, int | None]], mids: list[bytes], deadline: int
) -> None:
    flown = [(m, [ME, OTHER][c], None) for m, c, _ in owned]
    ref, got = in_flight(*flown), in_flight(*flown)
    recs = [record(m) for m in mids]  # an id twice: the later flight stands, as in a dict
    assert fly(got, list(recs), ME, deadline) == fly_py(ref, list(recs), ME, deadline)
    assert list(got.items()) == list(ref.items())
