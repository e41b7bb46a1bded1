"""Live scenarios sized to the machine: the scale from a measured speed, the scenario
slowed in time with its shape kept, and the measurement itself."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from srtm.experiments import scenarios, sizing
from srtm.experiments.live import max_late_s, profile


def test_a_machine_as_fast_as_the_reference_runs_the_scenario_as_written() -> None:
    ref = sizing.REFERENCE_UNITS_PER_S
    assert sizing.scale_for(ref) == 1.0
    assert sizing.scale_for(3 * ref) == 1.0  # never scaled up
    assert sizing.scale_for(0.5 * ref) == 0.5
    assert sizing.scale_for(0.64 * ref) == 0.6  # rounded down to a step
    assert sizing.scale_for(0.01 * ref) == sizing.MIN_SCALE
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="units_per_s"):
            sizing.scale_for(bad)


def test_a_slowed_scenario_is_the_same_experiment_in_units_of_its_service_time() -> None:
    sc = scenarios.load("correlated-sensors")
    slow = sizing.scaled(sc, 0.5)
    assert slow.capacity == sc.capacity / 2 and slow.mcap == sc.mcap / 2
    assert slow.rate == pytest.approx(sc.rate / 2)
    # Durations that shape the queueing are longer in proportion ...
    assert slow.slo_p99_ms == pytest.approx(2 * sc.slo_p99_ms)
    assert slow.spread_ms == pytest.approx(2 * sc.spread_ms)
    assert sc.fit is not None and slow.fit is not None
    assert slow.fit.window_s == pytest.approx(2 * sc.fit.window_s)
    assert slow.fit.min_samples == sc.fit.min_samples
    assert max_late_s(slow) == pytest.approx(2 * max_late_s(sc))
    # ... so the SLO in service times, the publishers, groups and brokers are unchanged,
    assert slow.slo_p99_ms * slow.capacity == pytest.approx(sc.slo_p99_ms * sc.capacity, 1e-3)
    assert sizing.scaled(sc, 0.6).slo_p99_ms == 33.3  # three significant digits
    assert slow.brokers == sc.brokers
    assert [(p.id, p.group) for p in slow.specs()] == [(p.id, p.group) for p in sc.specs()]
    # and the profiled bucket holds the same bursts in tokens at half the rate.
    (r, b), (r2, b2) = profile(sc), profile(slow)
    assert r2 == pytest.approx(r / 2, rel=0.01) and b2 == b
    assert slow.time_scale == 0.5 and sizing.scaled(slow, 0.5).time_scale == 0.25
    assert sizing.scaled(sc, 1.0) is sc
    with pytest.raises(ValueError, match="scale"):
        sizing.scaled(sc, 1.5)


def test_a_given_scale_measures_nothing() -> None:
    sc = scenarios.load("correlated-sensors")
    slow, how = sizing.size(sc, 0.25)
    assert how.machine is None and how.scale == 0.25 and slow.capacity == sc.capacity / 4
    assert "0.25× slower" in how.describe(slow)
    assert how.to_json()["scale"] == 0.25


def test_the_measurement_counts_work_on_every_usable_cpu() -> None:
    m = sizing.measure(0.2)
    assert m.units_per_s > 0 and m.cpus == sizing.usable_cpus() >= 1
    # One unit of work is fixed: the same result every time.
    assert sizing.work_unit() == sizing.work_unit() == 40 * sizing._PACK.size


@pytest.mark.parametrize(
    ("cgroup", "files", "quota"),
    [
        ("0::/slice\n", {"slice/cpu.max": "150000 100000\n"}, 1.5),
        ("0::/slice\n", {"slice/cpu.max": "max 100000\n"}, None),
        ("4:cpu,cpuacct:/slow\n", {"cpu/slow/cpu.cfs_quota_us": "100000",
                                   "cpu/slow/cpu.cfs_period_us": "100000"}, 1.0),
        ("4:cpu,cpuacct:/free\n", {"cpu/free/cpu.cfs_quota_us": "-1",
                                   "cpu/free/cpu.cfs_period_us": "100000"}, None),
    ],
)  # fmt: skip
def test_a_cpu_quota_is_read_from_either_cgroup_version(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cgroup: str,
    files: dict[str, str],
    quota: float | None,
) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    real_read = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if str(self) == "/proc/self/cgroup":
            return cgroup
        return real_read(self)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert sizing.quota_cpus(tmp_path) == quota
