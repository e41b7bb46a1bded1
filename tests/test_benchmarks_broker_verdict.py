"""``benchmarks/broker.py``'s verdict on a sitting: disturbed where the machine woke a
sleeping thread late (its timer row, ¹¹), quiet where it did not, and not known where
that row was not measured."""

from __future__ import annotations

from types import ModuleType

from srtm.experiments import host


def test_a_run_whose_timer_woke_late_is_disturbed(broker_bench: ModuleType) -> None:
    d = broker_bench.Disturbance({0: 387.0, 1: 1280.4, 2: 150.0}, 0.0012)
    assert d.disturbed_runs == [0, 1]
    assert d.text().startswith("disturbed: run 1, 2 of 3")
    assert "387, 1,280 µs late at p99, over 200 µs" in d.text()
    assert d.text().endswith("0.12% of the CPU time stolen")
    assert d.doc()["disturbed_runs"] == [0, 1]


def test_runs_under_the_limit_are_quiet(broker_bench: ModuleType) -> None:
    d = broker_bench.Disturbance({0: 99.2, 1: 133.1, 2: broker_bench.DISTURBED_TIMER_P99_US}, None)
    assert d.disturbed_runs == []
    assert d.text() == (
        "quiet: the machine woke a sleeping thread at most 200 µs late at p99 in every run "
        "(99–200 µs)"
    )


def test_without_the_timer_row_it_is_not_known(broker_bench: ModuleType) -> None:
    assert broker_bench.Disturbance({}, 0.0).text().startswith("not known if disturbed")


def test_the_verdict_reads_the_timer_row_and_the_steal(broker_bench: ModuleType) -> None:
    row = broker_bench.Row("timer_p99", "p99", "µs")
    row.add("srtm", 0, 250.0)
    row.add("srtm", 1, 80.0)
    d = broker_bench.disturbance({"timer_p99": row}, host.take([]))
    assert d.timer_p99_us == {0: 250.0, 1: 80.0} and d.disturbed_runs == [0]
    assert d.steal_share is None or 0.0 <= d.steal_share <= 1.0
    assert broker_bench.disturbance({}, host.take([])).timer_p99_us == {}
