"""The release timer's margin: how long before a release its wait ends, learned from how
late the timer's wake-ups have been."""

from __future__ import annotations

import pytest

from srtm.broker.timer import MAX_SPIN_NS, WakeMargin

US = 1_000


def test_a_timer_on_time_keeps_the_configured_spin() -> None:
    margin = WakeMargin(200 * US)
    for _ in range(50):
        margin.woke(3 * US)
    assert margin.spin_ns == 200 * US


def test_late_wake_ups_lengthen_the_spin_past_how_late_they_were() -> None:
    margin = WakeMargin(200 * US)
    margin.woke(300 * US)
    assert margin.spin_ns == 375 * US  # a quarter more than the latest


def test_the_spin_shrinks_back_once_wake_ups_are_prompt_again() -> None:
    margin = WakeMargin(100 * US)
    margin.woke(800 * US)
    spins = []
    for _ in range(800):
        margin.woke(5 * US)
        spins.append(margin.spin_ns)
    assert spins == sorted(spins, reverse=True)
    assert spins[99] > 600 * US  # a hundred prompt ones later it still covers the late one
    assert spins[199] < 500 * US  # about half after 140
    assert spins[-1] == 100 * US


@pytest.mark.parametrize("late", [2_000 * US, 10**12])
def test_the_spin_is_bounded_however_late_the_timer_was(late: int) -> None:
    margin = WakeMargin(50 * US)
    margin.woke(late)
    assert margin.spin_ns == MAX_SPIN_NS


def test_the_configured_spin_is_a_floor_even_past_the_bound() -> None:
    margin = WakeMargin(3 * MAX_SPIN_NS)
    margin.woke(10 * MAX_SPIN_NS)
    assert margin.spin_ns == 3 * MAX_SPIN_NS


def test_a_floor_of_zero_never_spins() -> None:
    """Brokers that share cores (live experiments) run with ``--release-spin-us 0``."""
    margin = WakeMargin(0)
    margin.woke(500 * US)
    assert margin.spin_ns == 0


def test_a_cap_at_or_below_the_floor_keeps_the_spin_at_the_floor() -> None:
    """``--release-spin-max-us`` no more than ``--release-spin-us``: the spin never grows,
    whatever the timer did (the CPU a long spin costs is not spent)."""
    for cap in (0, 150 * US, 200 * US):
        margin = WakeMargin(200 * US, cap)
        margin.woke(900 * US)
        assert margin.spin_ns == 200 * US
    margin = WakeMargin(200 * US, 500 * US)
    margin.woke(900 * US)
    assert margin.spin_ns == 500 * US
