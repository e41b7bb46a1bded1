"""``eventually``: the one way tests wait, awaited or blocking."""

from __future__ import annotations

import itertools

import pytest

from support import eventually


async def test_returns_the_first_truthy_value() -> None:
    count = itertools.count()
    assert await eventually(lambda: next(count) >= 3 and "three", "three polls") == "three"


async def test_until_judges_a_probed_value_and_awaitables_are_awaited() -> None:
    count = itertools.count()

    async def probe() -> int:
        return next(count)

    assert await eventually(probe, "a count of 5", until=lambda n: n == 5, interval=0) == 5


async def test_a_timeout_names_what_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"in 0.02 s: the answer \(last value: 41\)"):
        await eventually(lambda: 41, "the answer", until=lambda n: n == 42, timeout=0.02)


def test_blocking_polls_with_the_sleep_given() -> None:
    slept: list[float] = []
    count = itertools.count()
    got = eventually.blocking(
        lambda: next(count), "2", until=lambda n: n == 2, interval=0.5, sleep=slept.append
    )
    assert got == 2 and slept == [0.5, 0.5]
    with pytest.raises(AssertionError, match=r"never \(last value: False\)"):
        eventually.blocking(lambda: False, "never", timeout=0, sleep=slept.append)
