"""Live scenarios sized to the machine: the scale from a measured speed, the scenario
slowed in time with its shape kept, and the measurement itself."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from srtm.experiments import scenarios, sizing
from srtm.experiments.scenarios.live import max_late_s, profile


def test_a_machine_as_fast_as_the_reference_runs_the_scenario_as_written() -> None:
    ref = sizing.REFERENCE_UNITS_PER_S
    assert sizing.scale_for(ref) == 1.0
    assert sizing.scale_for(3 * ref) == 1.0  # never scaled up
    assert sizing.scale_for(0.5 * ref) == 0.5
    assert sizing.scale_for(0.64 * ref) == 0.6  # rounded down to a step
    assert sizing.scale_for(0.01 * ref) == sizing.MIN_SCALE
    # A quota throttles in bursts: a quota'd machine of the same speed keeps more headroom.
    assert sizing.scale_for(0.57 * ref) == 0.55
    assert sizing.scale_for(0.61 * ref, throttled=True) == 0.35
    assert sizing.MachineSpeed(1.0, 2, 1.0, 1.0).throttled
    assert not sizing.MachineSpeed(1.0, 2, 2.0, 1.0).throttled
    assert not sizing.MachineSpeed(1.0, 1, None, 1.0).throttled
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
    how = sizing.choose(0.25)
    slow = sizing.scaled(sc, how.scale)
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


# -- the other live families -----------------------------------------------------------
def test_a_slowed_multi_tenant_scenario_is_the_same_in_service_times() -> None:
    from srtm.experiments.tenancy import live as tenancy_live
    from srtm.experiments.tenancy import scenario as tenancy

    sc = tenancy.live_scale()
    slow = tenancy.scaled(sc, 0.5)
    assert slow.capacity == sc.capacity / 2 and slow.mcap == sc.mcap / 2
    assert slow.brokers == sc.brokers and slow.time_scale == 0.5
    assert tenancy_live.max_late_s(slow) == pytest.approx(2 * tenancy_live.max_late_s(sc))
    for t, u in zip(sc.tenants, slow.tenants, strict=True):
        # The same tenant, its sensors and timeline: only its rate and SLO move ...
        assert (u.name, u.publishers, u.process, u.batch, u.group) == (
            t.name, t.publishers, t.process, t.batch, t.group)  # fmt: skip
        assert (u.arrive_s, u.delete_s, u.join_every_s) == (t.arrive_s, t.delete_s, t.join_every_s)
        assert u.load == pytest.approx(t.load / 2)
        # ... so its SLO in service times and its share of a broker are unchanged,
        assert u.slo_p99_ms * slow.capacity == pytest.approx(t.slo_p99_ms * sc.capacity, 1e-2)
        assert u.load / slow.mcap == pytest.approx(t.load / sc.mcap)
        # and its bucket, profiled on its sends slowed, holds the same bursts in tokens.
        (r, b) = tenancy_live.profile(t, 0)
        (r2, b2) = tenancy_live.profile(u, 0, tenancy_live.PROFILE_S / slow.time_scale)
        assert r2 == pytest.approx(r / 2, rel=1e-6) and b2 == b, t.name

    def timeline(x: tenancy.TenancyScenario) -> list[tuple[float, str, str, list[str]]]:
        return [(e.t_s, e.what, e.topic, [p.id for p in e.publishers]) for e in tenancy.events(x)]

    assert timeline(slow) == timeline(sc)
    assert tenancy.scaled(sc, 1.0) is sc
    assert tenancy.scaled(slow, 0.5).time_scale == 0.25
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="scale"):
            tenancy.scaled(sc, bad)


def test_a_slowed_multi_tenant_scenario_is_placed_as_the_full_one() -> None:
    """The controller's decisions replayed (``tenancy.replay``): every topic on the same
    brokers, the ledger at the same share of ``mcap`` after every event."""
    from srtm.experiments.tenancy import live as tenancy_live
    from srtm.experiments.tenancy import scenario as tenancy
    from srtm.placement import PublisherLoad, TopicSpec

    def declared(sc: tenancy.TenancyScenario) -> dict[str, TopicSpec]:
        out = {}
        for i, t in enumerate(sc.tenants):
            r, b = tenancy_live.profile(t, i, tenancy_live.PROFILE_S / sc.time_scale)
            loads = tuple(PublisherLoad(p.id, p.rate, p.group) for p in t.specs())
            out[t.name] = TopicSpec(t.name, loads, b, t.slo_p99_ms, r)
        return out

    sc = tenancy.live_scale()
    slow = tenancy.scaled(sc, 0.5)
    for policy in ("srtm", "lb"):
        full, half = (
            tenancy.replay(sc, policy, declared(sc)),
            tenancy.replay(  # type: ignore[arg-type]
                slow,
                policy,
                declared(slow),  # type: ignore[arg-type]
            ),
        )
        assert {n: sorted(p.assignment) for n, p in full.plans.items()} == {
            n: sorted(p.assignment) for n, p in half.plans.items()
        }, policy
        for a, b in zip(full.samples, half.samples, strict=True):
            assert a.event == b.event
            for broker, x in a.allocated.items():
                assert b.allocated[broker] / slow.mcap == pytest.approx(x / sc.mcap, abs=1e-6)


# -- --scale on the command line -----------------------------------------------------------
def _no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(seconds: float = 1.0) -> sizing.MachineSpeed:
        raise AssertionError("measured the machine")

    monkeypatch.setattr(sizing, "measure", refuse)


def _fake_tenancy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from srtm.experiments import tenancy as tenancy_experiment

    seen: list[dict[str, Any]] = []

    def run_live(
        out: Path, policy: str, *args: object, **kw: Any
    ) -> tuple[dict[str, Any], tuple[Path, ...]]:
        seen.append({"policy": policy, **kw})
        return {"checks": [{"check": "x", "ok": True, "detail": ""}]}, ()

    monkeypatch.setattr(tenancy_experiment, "run_policy", run_live)
    return seen


def test_multi_tenant_live_runs_at_the_scale_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srtm.cli.experiment import app
    from srtm.experiments.tenancy import scenario as tenancy

    _no_measuring(monkeypatch)
    seen = _fake_tenancy(monkeypatch)
    args = ["run", "multi-tenant", "--policy", "srtm,lb", "--scale", "0.5", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert [s["policy"] for s in seen] == ["srtm", "lb"]
    for s in seen:
        assert s["sc"] == tenancy.scaled(tenancy.live_scale(), 0.5)
        assert s["sizing"] == sizing.Sizing(0.5)
    said = " ".join(res.output.split())  # the console wraps at 80 columns
    assert "0.5× slower" in said and "brokers process 1,000 msg/s" in said


def test_multi_tenant_live_measures_the_machine_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srtm.cli.experiment import app

    half = sizing.MachineSpeed(0.52 * sizing.REFERENCE_UNITS_PER_S, 2, None, 1.0)
    monkeypatch.setattr(sizing, "measure", lambda seconds=1.0: half)
    seen = _fake_tenancy(monkeypatch)
    res = CliRunner().invoke(app, ["run", "multi-tenant", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert seen[0]["sizing"] == sizing.Sizing(0.5, half) and seen[0]["sc"].time_scale == 0.5
    assert "computes 0.52× the reference" in " ".join(res.output.split())


@pytest.mark.parametrize("scale", ["fast", "0", "1.5", "nan", "-0.5"])
def test_a_bad_scale_exits_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: str
) -> None:
    from srtm.cli.experiment import app

    _no_measuring(monkeypatch)
    seen = _fake_tenancy(monkeypatch)
    for name in ("multi-tenant", "diurnal", "trading-day", "correlated-sensors"):
        res = CliRunner().invoke(app, ["run", name, "--scale", scale, "--out", str(tmp_path)])
        assert res.exit_code == 2, (name, res.output)
        assert "--scale" in res.output, (name, res.output)
    assert seen == []


@pytest.mark.parametrize("name", ["multi-tenant", "diurnal", "trading-day", "fig4"])
def test_a_scale_with_sim_is_refused(tmp_path: Path, name: str) -> None:
    from srtm.cli.experiment import app

    res = CliRunner().invoke(app, ["run", name, "--sim", "--scale", "0.5", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--scale" in res.output and "--sim" in res.output, res.output
    assert not any(tmp_path.iterdir())  # nothing simulated


class _Reached(Exception):
    """The run itself was reached: the scale was accepted."""


@pytest.mark.parametrize("name", ["diurnal", "trading-day", "excess-capacity", "latency-effects"])
def test_experiments_not_cpu_bound_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    from srtm.cli.experiment import app
    from srtm.experiments.diurnal import live as diurnal_live
    from srtm.experiments.utility import live as utility_live

    def reached(*args: object, **kw: object) -> None:
        raise _Reached

    _no_measuring(monkeypatch)  # 'auto' measures nothing for them
    monkeypatch.setattr(diurnal_live, "diurnal_live", reached)
    monkeypatch.setattr(utility_live, "run", reached)
    for scale in ("auto", "1", "1.0"):
        res = CliRunner().invoke(app, ["run", name, "--scale", scale, "--out", str(tmp_path)])
        assert isinstance(res.exception, _Reached), (scale, res.output)
        said = " ".join(res.output.split())  # the console wraps at 80 columns
        assert "runs as written" in said and "not CPU-bound" in said
    res = CliRunner().invoke(app, ["run", name, "--scale", "0.5", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--scale" in res.output and "not sized" in res.output
