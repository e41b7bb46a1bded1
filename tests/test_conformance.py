from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srtm.ratelimit import Violation, check_conformance


def brute_force(releases: list[int], rate: float, burst: float) -> tuple[int, int] | None:
    """O(n²) reference: the first end index j, and its earliest violating start i."""
    r, b = Fraction(rate), Fraction(burst)
    for j in range(len(releases)):
        for i in range(j + 1):
            if j - i + 1 > b + r * Fraction(releases[j] - releases[i], 10**9):
                return i, j
    return None


@given(
    gaps=st.lists(st.integers(min_value=0, max_value=3_000_000), min_size=0, max_size=60),
    rate=st.sampled_from([100.0, 1000.0, 1234.5, 5e5]),
    burst=st.sampled_from([1.0, 1.5, 2.0, 3.0, 7.25]),
)
def test_first_violation_matches_brute_force(gaps: list[int], rate: float, burst: float) -> None:
    releases = []
    t = 10**18  # CLOCK_REALTIME-sized stamps must not lose precision
    for g in gaps:
        t += g
        releases.append(t)
    found = check_conformance(releases, rate, burst)
    expected = brute_force(releases, rate, burst)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found.end_index == expected[1]
        # The reported interval itself must violate the envelope.
        assert found.count > found.allowed
        assert found.count == found.end_index - found.start_index + 1


def test_reports_the_interval() -> None:
    ms = 1_000_000
    # 1000/s, b = 2: three releases within 0.5 ms break the envelope (allowed 2.5).
    v = check_conformance([0, 10 * ms, 10 * ms + 100_000, 10 * ms + 500_000], 1000.0, 2.0)
    assert v == Violation(1, 3, 10 * ms, 10 * ms + 500_000, 3, 2.5)


def test_exact_boundary_conforms() -> None:
    ms = 1_000_000
    assert check_conformance([0, ms, 2 * ms, 3 * ms], 1000.0, 1.0) is None
    assert check_conformance([0, ms, 2 * ms - 1], 1000.0, 1.0) is not None


def test_unsorted_releases_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"releases_ns\[2\]=5 < releases_ns\[1\]=9"):
        check_conformance([1, 9, 5], 10.0, 1.0)
