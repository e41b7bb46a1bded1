"""Dynamoth's evaluation (seed 004), live on 127.0.0.1: channel-level scalability with
and without replication (``replication``), response time against the number of clients
(``clients``), and a move traced hop by hop before and after the subscribers' wait
(``move``). ``bench`` and ``fanout`` are what they share, ``report`` their tables and
plots. Not sized to the machine: small loads on brokers that emulate their capacity."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from srtm.experiments.experiment import Mode, Option, RunSettings, Summary, unsized, verdict

NOT_SIZED = (
    "small loads (at most 1,200 msg/s in, 8,000 msg/s out); its tables are measured, "
    "not judged against an SLO"
)


def _replication(out: Path, quick: bool) -> dict[str, Any]:
    from srtm.experiments.dynamoth import replication

    s = replication.ReplicationSettings()
    if quick:
        s = replication.ReplicationSettings(subscribers=(1, 5), settle_s=1.0, measure_s=1.5)
    return replication.run(out, s)


def _clients(out: Path, quick: bool) -> dict[str, Any]:
    from srtm.experiments.dynamoth import clients

    s = clients.ClientsSettings()
    if quick:
        s = clients.ClientsSettings(clients=(10, 40), settle_s=1.0, measure_s=1.5)
    return clients.run(out, s)


def _move(out: Path, quick: bool) -> dict[str, Any]:
    from srtm.experiments.dynamoth import move

    s = move.MoveSettings(moves=2, gap_s=2.0) if quick else move.MoveSettings()
    return move.run(out, s)


@dataclass(frozen=True)
class DynamothExperiment:
    """One of Dynamoth's analogues, live only (``--quick``: fewer, shorter steps). Its
    verdict: disturbed when any of its runs was, else ok (the tables are the result)."""

    name: str
    description: str
    runner: Callable[[Path, bool], dict[str, Any]]
    live_options: ClassVar[frozenset[Option]] = frozenset({Option.quick, Option.scale})

    def live(self, run: RunSettings) -> Summary:
        from srtm.experiments.dynamoth import report

        unsized(run.scale, self.name, NOT_SIZED, run.term)
        run.out.mkdir(parents=True, exist_ok=True)
        with run.term.err.status(f"{self.name} live"):
            doc = self.runner(run.out, run.quick)
        kind = self.name.removeprefix("dynamoth-")
        columns, rows, plot = {
            "replication": (
                report.REPLICATION_COLUMNS,
                report.replication_rows,
                report.plot_replication,
            ),
            "clients": (report.CLIENTS_COLUMNS, report.clients_rows, report.plot_clients),
            "move": (report.MOVE_COLUMNS, report.move_rows, report.plot_move),
        }[kind]
        table = rows(doc)
        if not run.as_json:
            report.show(self.description, columns, table, doc, run.term.out)
        png = plot(doc, run.out)
        page = run.out / f"{self.name}.md"
        page.write_text(report.markdown(columns, table))
        data = run.out / f"{self.name}.json"
        data.write_text(json.dumps(doc, indent=1))
        run.term.err.print(f"report: {png}, {page}, {data}", highlight=False)
        bad = any(why is not None for why in report.verdicts(doc).values())
        done = verdict(disturbed=bad, ok=True)
        return Summary(self.name, Mode.live, (json.dumps(doc),), done, (data, page, png))


EXPERIMENTS = (
    DynamothExperiment(
        "dynamoth-replication",
        "egress and latency against subscribers, with and without replication",
        _replication,
    ),
    DynamothExperiment(
        "dynamoth-clients",
        "response time against the number of clients, on 1 and 3 brokers",
        _clients,
    ),
    DynamothExperiment(
        "dynamoth-move", "a move traced hop by hop, before and after the subscribers' wait", _move
    ),
)
