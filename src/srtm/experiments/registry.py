"""Every experiment ``srtm experiment run`` knows, by name: the paper's figures, the
shipped live scenarios, multi-tenant, diurnal, the utility experiments,
control-plane-faults and Dynamoth's analogues; and the live
scenarios ``srtm experiment list`` shows."""

from __future__ import annotations

from pathlib import Path

from srtm.experiments.experiment import Experiment, Mode, UsageError, options, takes


def experiments() -> dict[str, Experiment]:
    """Each experiment by its name."""
    from srtm.experiments import (
        control_plane,
        diurnal,
        dynamoth,
        figures,
        scenarios,
        tenancy,
        utility,
    )

    found: list[Experiment] = [
        *figures.EXPERIMENTS,
        *scenarios.shipped(),
        tenancy.EXPERIMENT,
        diurnal.EXPERIMENT,
        *utility.EXPERIMENTS,
        control_plane.EXPERIMENT,
        *dynamoth.EXPERIMENTS,
    ]
    return {e.name: e for e in found}


def find(name: str) -> Experiment:
    """The experiment called ``name``, else the live scenario in the TOML file ``name``
    (a UsageError naming SCENARIO when it is neither)."""
    from srtm.experiments import scenarios

    known = experiments()
    if name in known:
        return known[name]
    if not Path(name).exists():
        raise UsageError(
            "SCENARIO",
            f"no experiment {name!r}: one of {', '.join(known)}, or a scenario's TOML file",
        )
    return scenarios.find(name)


#: The columns of ``option_rows``.
OPTION_COLUMNS = ("experiment", "simulated (--sim) takes", "live takes")


def option_rows() -> list[tuple[str, str, str]]:
    """Each experiment and the options it takes in either mode ("no": it does not run
    so); the shipped live scenarios share one row."""
    from srtm.experiments.scenarios import ScenarioExperiment

    rows: list[tuple[str, str, str]] = []
    for e in experiments().values():
        if isinstance(e, ScenarioExperiment):
            if any(r[0] == SHIPPED for r in rows):
                continue
            name = SHIPPED
        else:
            name = e.name
        sim, live = (options(e, mode) for mode in (Mode.sim, Mode.live))
        rows.append(
            (name, "no" if sim is None else takes(sim), "no" if live is None else takes(live))
        )
    return rows


#: The row of ``option_rows`` every shipped live scenario shares.
SHIPPED = "a live scenario"


#: The columns of ``live_rows``.
LIVE_COLUMNS = ("name", "brokers", "capacity msg/s", "load msg/s", "SLO p99 ms", "description")


def live_rows() -> list[tuple[str, ...]]:
    """The shipped live scenarios and multi-tenant, one row each (``LIVE_COLUMNS``)."""
    from srtm.experiments import scenarios, tenancy
    from srtm.experiments.tenancy import scenario

    rows: list[tuple[str, ...]] = [
        (sc.name, str(sc.brokers), f"{sc.capacity:,.0f}", f"{sc.rate:,.0f}",
         f"{sc.slo_p99_ms:g}", sc.description)
        for sc in (e.scenario for e in scenarios.shipped())
    ]  # fmt: skip
    mt = scenario.live_scale()
    rows.append((
        tenancy.NAME, str(mt.brokers), f"{mt.capacity:,.0f}",
        f"{sum(t.load for t in mt.tenants):,.0f}",
        "/".join(f"{s:g}" for s in sorted({t.slo_p99_ms for t in mt.tenants})),
        tenancy.DESCRIPTION,
    ))  # fmt: skip
    return rows
