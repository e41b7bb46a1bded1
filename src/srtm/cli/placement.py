"""``srtm place`` and ``srtm rebalance``: placement and rebalancing what-ifs (no cluster),
computed by ``srtm.placement.whatif``, printed as tables or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from srtm.cli.common import fail, read_json, wide_console

if TYPE_CHECKING:
    from srtm.placement import LedgerEntry, Placement, TopicSpec


def place_command(
    policy: Annotated[
        str,
        typer.Option(
            help="lb (all brokers, equal total load), conc (fewest brokers, equal total "
            "load), maxmin (fewest brokers, water-filling from the smallest residual "
            "capacity) or srtm (maxmin's quotas, every correlation group split in proportion)."
        ),
    ] = "srtm",
    brokers: Annotated[
        Path,
        typer.Option(
            help='JSON array of brokers: [{"id": "b1", "mcap": 110000, "load": 10000}, ...] '
            "(msg/s; load defaults to 0)."
        ),
    ] = Path("brokers.json"),
    topic: Annotated[
        list[Path],
        typer.Option(
            help='JSON topic: {"name": "t", "slo_p99_ms": 1.0, "burst": 200, "publishers": '
            '[{"id": "p1", "rate": 10, "group": "g1"}, ...]} ("group" and "rate" optional; '
            "the topic rate defaults to 1.1 × the publishers' total), or a JSON array of "
            "topics. Repeat --topic for more: topics are placed in order, each on what the "
            "ones before it left (the capacity ledger)."
        ),
    ] = [Path("topic.json")],  # noqa: B006 (typer reads the default, never mutates it)
    seed: Annotated[int, typer.Option(help="Seed for srtm's choice among a group's members.")] = 0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON: per topic its placement and the ledger after it (one object "
            "for one topic, an array for several).",
        ),
    ] = False,
) -> None:
    """Place topics' publishers on brokers under a policy, without a cluster (what-if).

    For each topic, in order, prints each broker used with its publishers, their rate and
    its sub-bucket (or the shortfall when the brokers' residual capacity cannot carry it),
    then the capacity ledger: per broker mcap, allocated (the sub-bucket rates promised so
    far), measured (the brokers file's load) and rcap = mcap - max(allocated, measured).
    """
    from srtm.placement import parse_brokers, parse_policy, parse_topic
    from srtm.placement.whatif import place_in_order

    try:
        chosen = parse_policy(policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from None
    try:
        fleet = parse_brokers(read_json(brokers, "--brokers"))
        specs = [parse_topic(doc) for path in topic for doc in _topic_docs(path)]
    except ValueError as exc:
        raise fail(str(exc)) from exc
    placed = place_in_order(chosen, fleet, specs, seed)
    if as_json:
        docs = [p.to_json() for p in placed]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
        return
    console = wide_console(120)
    for p in placed:
        _print_placement(console, p.spec, policy, p.placement, p.before)
        _print_ledger(console, p.spec.name, p.after)


def _topic_docs(path: Path) -> list[Any]:
    doc = read_json(path, "--topic")
    return doc if isinstance(doc, list) else [doc]


def _print_placement(
    console: Console,
    spec: TopicSpec,
    policy: str,
    result: Placement,
    before: Sequence[LedgerEntry],
) -> None:
    table = Table(
        title=f"{spec.name}: {len(spec.publishers)} publishers, {spec.load:,.6g} msg/s, "
        f"bucket ({spec.rate:,.6g}/s, {spec.burst:,.6g}) — policy {policy}"
    )
    for name in ("broker", "mcap", "load before", "publishers", "rate msg/s", "r_l", "b_l"):
        table.add_column(name, justify="left" if name == "broker" else "right")
    by_id = {b.id: b for b in before}
    for a in result.assignments:
        b = by_id[a.broker]
        table.add_row(
            a.broker,
            f"{b.mcap:,.6g}",
            f"{b.load:,.6g}",
            f"{len(a.publishers):,}",
            f"{a.rate:,.6g}",
            "—" if a.bucket is None else f"{a.bucket.rate:,.6g}",
            "—" if a.bucket is None else f"{a.bucket.burst:,.6g}",
        )
    console.print(table)
    if result.problem:
        console.print(f"[yellow]{result.problem}[/yellow]")
    if result.shortfall:
        console.print(
            f"[red]shortfall: {result.shortfall:,.6g} msg/s[/red] — {len(result.unassigned):,} "
            f"publishers unassigned; {result.brokers_needed} more broker(s) of the largest "
            "mcap here would cover it"
        )


def _print_ledger(console: Console, name: str, entries: Sequence[LedgerEntry]) -> None:
    table = Table(title=f"ledger after {name} (msg/s)")
    for column in ("broker", "mcap", "allocated", "measured", "rcap"):
        table.add_column(column, justify="left" if column == "broker" else "right")
    for e in entries:
        table.add_row(
            e.id, f"{e.mcap:,.6g}", f"{e.allocated:,.6g}", f"{e.measured:,.6g}", f"{e.rcap:,.6g}"
        )
    console.print(table)


_STATE_HELP = """JSON state: {"now_s": 100, "spawning": 0, "brokers": [{"id": "b1", "mcap": 1000,
"ingress": 880, "egress": 352000, "cpu": 0.3, "slo_streak": 0, "egress_max": 125000000},
...], "topics": [{"name": "hot", "slo_p99_ms": 20, "burst": 100, "rate": 880,
"subscribers": 2, "message_bytes": 200, "publishers": [{"id": "h1", "rate": 200, "group":
"a"}, ...], "plan": {"b1": ["h1", ...]}, "replicas": [], "last_change_s": 90}, ...]}.
Rates in msg/s (averaged over 10 s), egress in bytes/s, cpu a fraction. A broker's
ingress and egress default to what the plans send it, cpu and slo_streak to 0,
egress_max to --egress-max, stoppable to true (false: never despawned); a topic's rate
to 1.1 x its publishers' total, subscribers to 1, message_bytes to 100, replicas
(ALL_PUBLISHERS brokers besides the plan's one) to none, last_change_s to long ago."""


def rebalance_command(
    state: Annotated[Path, typer.Option(help=_STATE_HELP)] = Path("state.json"),
    now: Annotated[
        float | None, typer.Option(help="The time (s) to decide at; default: the state's now_s.")
    ] = None,
    overload: Annotated[float, typer.Option(help="Overload above this load ratio.")] = 0.80,
    target: Annotated[
        float, typer.Option(help="Shed to below this load ratio; fill no broker past it.")
    ] = 0.60,
    egress_max: Annotated[float, typer.Option(help="A broker's maximum egress, bytes/s.")] = 125e6,
    min_plan_interval_s: Annotated[
        float, typer.Option(help="At most one plan change per topic in this many seconds.")
    ] = 20.0,
    slo_windows: Annotated[
        int, typer.Option(help="Consecutive windows with an SLO violated that overload a broker.")
    ] = 2,
    min_slice_share: Annotated[
        float, typer.Option(help="No move leaves a broker less than this share of a topic.")
    ] = 0.2,
    despawn_below: Annotated[
        float, typer.Option(help="Despawn when the average LR without a broker stays below.")
    ] = 0.60,
    min_brokers: Annotated[int, typer.Option(help="Never fewer brokers than this.")] = 1,
    max_brokers: Annotated[int, typer.Option(help="Never more brokers than this.")] = 64,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON document: {"now_s", "decisions": [{"action": "move", "topic", '
            '"publishers", "from", "to"} | {"action": "replicate", "topic", "to", "kind"} | '
            '{"action": "unreplicate", "topic", "from"} | {"action": "spawn", "n"} | '
            '{"action": "despawn", "broker"}], "brokers": [{"id", "before", "after"}]} '
            "(load ratios before and after the decisions).",
        ),
    ] = False,
) -> None:
    """What the rebalancer would decide for a cluster state (what-if, no cluster).

    Dynamoth's loop on SRTM's placement: a broker over --overload (or with an SLO violated
    --slo-windows windows running) sheds its busiest topics, whole or in correlation-aware
    slices, to the brokers with room until it is under --target; a spawn when none has room;
    a despawn when the average load ratio stays under --despawn-below without a broker.
    Prints the decisions and each broker's load ratio before and after them.
    """
    from srtm.placement.rebalance import RebalanceSettings
    from srtm.placement.whatif import rebalance_what_if

    doc = read_json(state, "--state")
    try:
        settings = RebalanceSettings(
            overload=overload, target=target, egress_max=egress_max,
            min_plan_interval_s=min_plan_interval_s, slo_windows=slo_windows,
            min_slice_share=min_slice_share, despawn_below=despawn_below,
            min_brokers=min_brokers, max_brokers=max_brokers,
        )  # fmt: skip
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        result = rebalance_what_if(doc, settings, now)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    console = wide_console(120)
    table = Table(title=f"decisions at t = {result.now_s:g} s")
    for column in ("#", "action", "topic", "publishers", "from", "to / n"):
        table.add_column(column)
    for i, d in enumerate(result.decisions, 1):
        j = d.to_json()
        pubs = j.get("publishers")
        shown = "" if pubs is None else ", ".join(pubs[:6]) + (" …" if len(pubs) > 6 else "")
        target_cell = j.get("to", j.get("n", j.get("broker", "")))
        extra = f" ({j['kind']})" if "kind" in j else ""
        table.add_row(
            str(i), j["action"] + extra, j.get("topic", ""), shown, j.get("from", ""),
            escape(str(target_cell)),
        )  # fmt: skip
    console.print(table if result.decisions else "[green]no decisions: nothing to do[/green]")
    ratios = Table(title=f"load ratio (overload > {overload:g}, target < {target:g})")
    for column in ("broker", "before", "after"):
        ratios.add_column(column, justify="left" if column == "broker" else "right")
    for b in result.brokers:
        after = "despawned" if b.after is None else f"{b.after:.3f}"
        ratios.add_row(b.broker, f"{b.before:.3f}", after)
    console.print(ratios)
