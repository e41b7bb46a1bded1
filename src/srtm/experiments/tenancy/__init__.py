"""The multi-tenant scenario: tenants with different SLOs, rates and correlation arriving
over time on capacity-limited brokers, one deleted midway, sensors joining one by one.
``scenario`` defines it at two scales (pure), ``sim`` runs it at the paper's (SRTM
against LB), ``live`` on local brokers under one policy, ``report`` shows either."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from srtm.experiments.experiment import (
    Mode,
    Option,
    RunSettings,
    RunVerdict,
    Summary,
    Terminal,
    progress,
    sizing_of,
)

if TYPE_CHECKING:
    from srtm.experiments.sizing import Sizing
    from srtm.experiments.tenancy.scenario import TenancyScenario
    from srtm.placement import Policy

NAME = "multi-tenant"
DESCRIPTION = (
    "six tenants (live; 54 with --sim at the paper's scale) with different SLOs, rates and "
    "correlation arriving over time, one deleted midway, sensors joining one by one"
)


@dataclass(frozen=True)
class MultiTenant:
    """``multi-tenant``: simulated (SRTM against LB), or live under each policy, sized to
    this machine (``--scale``); its verdict fails when a live run fails a check."""

    name: str = NAME
    description: str = DESCRIPTION
    sim_options: ClassVar[frozenset[Option]] = frozenset()
    live_options: ClassVar[frozenset[Option]] = frozenset(
        {Option.policy, Option.strict, Option.scale}
    )

    def sim(self, run: RunSettings) -> Summary:
        from srtm.experiments.tenancy import report
        from srtm.experiments.tenancy.sim import multi_tenant_sim

        with progress(run.term, f"{NAME} --sim") as update:
            result = multi_tenant_sim(run.out, on_progress=update)
        report.print_sim(result, run.term.out)
        for f in result.files:
            run.term.err.print(f"wrote {f}")
        ok = all(c["ok"] for c in result.data["claims"])
        document = json.dumps(result.data)
        return Summary(NAME, Mode.sim, (document,), _verdict(ok), tuple(result.files))

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.tenancy import report, scenario

        how = sizing_of(run.scale, run.term)
        sc = scenario.scaled(scenario.live_scale(), how.scale)
        run.term.err.print(report.sized_line(how, sc), highlight=False)
        runs = [run_policy(run.out, policy, run.term, sc=sc, sizing=how) for policy in run.policies]
        summaries = [summary for summary, _ in runs]
        ok = all(c["ok"] for s in summaries for c in s["checks"])
        documents = tuple(
            json.dumps({k: v for k, v in s.items() if k != "ledger"}) for s in summaries
        )
        written = tuple(f for _, files in runs for f in files)
        return Summary(NAME, Mode.live, documents, _verdict(ok), written)


def _verdict(ok: bool) -> RunVerdict:
    # --strict exits 1 when a check fails; a disturbed run is printed as such, and only
    # its checks decide the exit.
    return RunVerdict.ok if ok else RunVerdict.failed


def run_policy(
    out: Path, policy: Policy, term: Terminal, *, sc: TenancyScenario, sizing: Sizing
) -> tuple[dict[str, Any], tuple[Path, ...]]:
    """The live scenario ``sc`` on local brokers under ``policy``: run, shown, its plot
    and page written; returns its summary and the files written in ``out`` (the
    summary's JSON, the plot, the page)."""
    from srtm.experiments.tenancy import live, report

    with progress(term, f"{NAME} / {policy}") as update:
        summary = live.run(out, policy, sc=sc, on_progress=update, sizing=sizing)
    report.print_live(summary, term.out)
    png = report.plot(summary, out)
    page = report.write_html(summary, png, out)
    term.err.print(f"report: {page}")
    return summary, (live.summary_path(out, summary["run"]), png, page)


EXPERIMENT = MultiTenant()
