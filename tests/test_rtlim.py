from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clocks import FakeClock
from srtm.ratelimit import INSUFFICIENT, OK, OVER_REFILL, Rtlim, RtlimMode, check_conformance

US, MS, S = 1_000, 1_000_000, 1_000_000_000


def test_readme_example_51st_take_waits_for_the_refill() -> None:
    # 50 tokens per ms; each call costs 2 µs, as in rtlim's own example.
    clock = FakeClock(step=2 * US)
    lim = Rtlim(MS, 50, clock=clock, sleep=clock.sleep)
    returns = []
    for _ in range(51):
        assert lim.take(1, RtlimMode.BLOCK_SPIN) == OK
        returns.append(clock.now)
    assert returns[49] - returns[0] < 100 * US  # the first 50 run at full speed
    assert MS <= returns[50] <= MS + 10 * US


def test_return_codes() -> None:
    clock = FakeClock()
    lim = Rtlim(500 * MS, 100, clock=clock, sleep=clock.sleep)
    assert lim.take(200, RtlimMode.NON_BLOCK) == OVER_REFILL
    assert lim.tokens == 100  # a refused take changes nothing
    assert lim.take(80, RtlimMode.NON_BLOCK) == OK
    assert lim.take(30, RtlimMode.NON_BLOCK) == INSUFFICIENT
    assert lim.tokens == 20
    clock.advance(500 * MS)
    assert lim.take(100, RtlimMode.NON_BLOCK) == OK
    assert lim.tokens == 0


def test_refill_resets_rather_than_accumulates() -> None:
    clock = FakeClock()
    lim = Rtlim(MS, 10, clock=clock)
    assert lim.take(10, RtlimMode.NON_BLOCK) == OK
    clock.advance(50 * MS)  # fifty intervals idle still give one amount
    assert lim.take(10, RtlimMode.NON_BLOCK) == OK
    assert lim.take(1, RtlimMode.NON_BLOCK) == INSUFFICIENT


def test_refill_is_reanchored_to_when_it_is_noticed() -> None:
    clock = FakeClock()
    lim = Rtlim(MS, 1, clock=clock)
    assert lim.take(1, RtlimMode.NON_BLOCK) == OK
    clock.advance(MS + 900 * US)  # noticed 0.9 ms late: that time is lost
    assert lim.take(1, RtlimMode.NON_BLOCK) == OK
    clock.advance(200 * US)  # 2.1 ms: GCRA would have a token, rtlim waits until 2.9 ms
    assert lim.take(1, RtlimMode.NON_BLOCK) == INSUFFICIENT


def test_blocking_take_larger_than_the_amount_drains_interval_by_interval() -> None:
    clock = FakeClock(step=US)
    lim = Rtlim(500 * MS, 100, clock=clock, sleep=clock.sleep)
    assert lim.take(250, RtlimMode.BLOCK_SPIN) == OK  # 100 now, 100 at 0.5 s, 50 at 1 s
    assert S <= clock.now <= S + 10 * US
    assert lim.tokens == 50


def test_block_sleep_sleeps_until_the_next_refill() -> None:
    clock = FakeClock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.sleep(seconds)

    lim = Rtlim(10 * MS, 5, clock=clock, sleep=sleep)
    assert lim.take(5, RtlimMode.BLOCK_SLEEP) == OK
    clock.advance(3 * MS)
    assert lim.take(2, RtlimMode.BLOCK_SLEEP) == OK
    assert slept == [pytest.approx(0.007)]
    assert clock.now == 10 * MS
    assert lim.tokens == 3


@pytest.mark.parametrize(
    ("interval", "amount", "message"),
    [
        (0, 1, "refill_interval_ns must be an integer > 0, got 0"),
        (1.5, 1, "refill_interval_ns must be an integer > 0, got 1.5"),
        (MS, 0, "refill_token_amount must be an integer > 0, got 0"),
    ],
)
def test_bad_parameters(interval: int, amount: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Rtlim(interval, amount)


def test_bad_take() -> None:
    lim = Rtlim(MS, 5, clock=FakeClock())
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        lim.take(0, RtlimMode.NON_BLOCK)
    with pytest.raises(ValueError, match=r"7 is not a valid RtlimMode"):
        lim.take(1, 7)


@given(
    steps=st.lists(
        st.tuples(st.integers(0, 3 * MS), st.integers(1, 5), st.sampled_from(list(RtlimMode))),
        min_size=1,
        max_size=60,
    )
)
def test_releases_stay_within_twice_the_amount(steps: list[tuple[int, int, RtlimMode]]) -> None:
    """Around a refill rtlim can pass 2A back to back, never more: envelope (A/I, 2A)."""
    amount, interval = 5, MS
    clock = FakeClock(step=US)
    lim = Rtlim(interval, amount, clock=clock, sleep=clock.sleep)
    releases: list[int] = []
    for gap, n, mode in steps:
        clock.advance(gap)
        if lim.take(n, mode) == OK:
            releases += [clock.now] * n
    assert check_conformance(releases, amount * 1e9 / interval, 2 * amount) is None


def test_rtlim_is_not_a_gcra_bucket_of_the_same_depth() -> None:
    clock = FakeClock()
    lim = Rtlim(MS, 5, clock=clock)
    releases = []
    clock.advance(MS - 1)
    assert lim.take(5, RtlimMode.NON_BLOCK) == OK
    releases += [clock.now] * 5
    clock.advance(1)
    assert lim.take(5, RtlimMode.NON_BLOCK) == OK  # refilled in full 1 ns later
    releases += [clock.now] * 5
    assert check_conformance(releases, 5000.0, 5) is not None
