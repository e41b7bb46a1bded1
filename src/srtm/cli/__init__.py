"""The ``srtm`` command line."""

from __future__ import annotations

import enum
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.analysis import DrlRow, drl_table
from srtm.broker.options import ENV_PREFIX as BROKER_ENV
from srtm.broker.options import BrokerOptions
from srtm.config import Address, Setting, SettingError, read_table, resolve, settings
from srtm.control.options import ENV_PREFIX as CONTROLLER_ENV
from srtm.control.options import ControllerOptions
from srtm.jsondoc import parse as parse_json
from srtm.version import package_version

if TYPE_CHECKING:
    from srtm.placement import LedgerEntry, Placement, TopicSpec
    from srtm.ratelimit import BucketParams

T = TypeVar("T")

app = typer.Typer(
    help="SRTM: scalable real-time pub/sub messaging with DRL-aware load distribution.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        print(package_version())
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """SRTM command line; see each command's --help."""


def _fmt(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(value * scale, fmt)


def _render(rows: list[DrlRow], console: Console) -> None:
    table = Table(
        title="DRL penalty of a k-way equal split: token delay, M/D/1 model then simulation",
        caption="delays in ms; each model column is followed by its simulated 'sim'; Eq.1 = "
        "the paper's closed form of the mean; penalty = model mean / model mean at k=1",
    )
    headers = ("k", "r/k", "b/k", "P(wait)", "sim", "mean", "sim", "p99", "sim", "Eq.1", "penalty")
    for name in headers:
        table.add_column(name, justify="right")
    if any(row.note for row in rows):
        table.add_column("note", no_wrap=True)
    base = rows[0].model.mean_s if rows and rows[0].model else None
    for row in rows:
        m, s = row.model, row.sim
        cells = [
            str(row.k),
            f"{row.sub_rate:.6g}",
            f"{row.sub_burst:.4g}",
            _fmt(None if m is None else m.prob_delayed, ".4f"),
            _fmt(None if s is None else s.prob_delayed, ".4f"),
            _fmt(None if m is None else m.mean_s, ".4f", 1e3),
            _fmt(None if s is None else s.mean_s, ".4f", 1e3),
            _fmt(None if m is None else m.p99_s, ".3f", 1e3),
            _fmt(None if s is None else s.p99_s, ".3f", 1e3),
            _fmt(None if m is None else m.eq1_mean_s, ".4f", 1e3),
            "—" if m is None or not base else f"{m.mean_s / base:.0f}×",
        ]
        table.add_row(*cells, *([row.note] if len(table.columns) > len(cells) else []))
    console.print(table)


@app.command("drl-penalty")
def drl_penalty(
    rate: Annotated[float, typer.Option(help="Topic token rate r (tokens/s).")] = 10_000.0,
    burst: Annotated[float, typer.Option(help="Topic bucket depth b (tokens, >= 1).")] = 20.0,
    load: Annotated[
        float, typer.Option(help="Utilisation ρ = λ/r of the Poisson arrivals, in (0, 1).")
    ] = 0.8,
    k_max: Annotated[int, typer.Option(help="Largest split width k to evaluate.")] = 6,
    batch: Annotated[
        int,
        typer.Option(
            help="Messages per arrival event (batch Poisson). Above 1 the model counts in "
            "batches and describes the last message of each batch."
        ),
    ] = 1,
    messages: Annotated[
        int, typer.Option(help="Messages in the simulated trace behind the 'sim' columns.")
    ] = 1_000_000,
    seed: Annotated[int, typer.Option(help="Seed of the simulated trace.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the rows as one JSON document instead.")
    ] = False,
) -> None:
    """Predicted (M/D/1, Eq. 1) and simulated token delay of k-way splits, k = 1..K.

    Each sub-bucket of a k-way split gets (r/k, b/k) and a random 1/k of the
    publishers' Poisson traffic; its delays grow with k: the DRL penalty.
    """
    # Rich falls back to 80 columns when piped; the table needs more.
    console = Console(width=None if Console().is_terminal else 132)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("k={task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=as_json,
        ) as progress:
            task = progress.add_task("model and simulation", total=k_max)
            rows = drl_table(
                rate,
                burst,
                load,
                k_max,
                batch,
                messages,
                seed,
                progress=lambda k: progress.update(task, completed=k),
            )
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        print(json.dumps({"rows": [asdict(r) for r in rows]}, indent=2))
    else:
        _render(rows, console)


# -- the servers: one flag per setting of their options type ---------------------------------
_PRECEDENCE = (
    "Each setting is a flag, an environment variable ({prefix}NAME unless shown otherwise) "
    "and a key of the --config file; a flag wins over the variable, the variable over the "
    "file, the file over the default."
)


def _parameters(s: Setting) -> list[inspect.Parameter]:
    """The typer options of setting ``s``, its older names hidden: each value as typed (None:
    not given), parsed with the environment's and the file's by ``srtm.config.resolve``."""
    annotation: Any = str | None
    if s.kind is bool:
        annotation = bool | None
    elif s.kind is tuple:
        annotation = list[str] | None
    default = s.default.value if isinstance(s.default, enum.Enum) else s.default
    notes = [f"env var: {', '.join(s.env)}"]
    if default is not None and default is not False and default not in ((), ""):
        notes.append(f"default: {default}")
    if s.spec.aliases:
        notes.append(f"formerly {', '.join(s.flags[1:])}")
    flag = s.flags[0]
    if s.kind is bool and s.default is True:  # on unless turned off
        flag = f"{flag}/--no-{flag[2:]}"
    shown = typer.Option(
        flag,
        help=escape(f"{s.spec.help} " + " ".join(f"[{n}]" for n in notes)),
        metavar=_metavar(s),
        show_default=False,
    )
    aliases = [typer.Option(flag, hidden=True) for flag in s.flags[1:]]
    return [
        inspect.Parameter(
            key, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[annotation, o]
        )
        for key, o in zip(s.keys, [shown, *aliases], strict=True)
    ]


def _metavar(s: Setting) -> str | None:
    if issubclass(s.kind, enum.Enum):
        return "CHOICE"  # each setting's help explains its choices; a list here is too wide
    names = {Address: "HOST:PORT", int: "INTEGER", float: "NUMBER", Path: "PATH"}
    return names.get(s.kind, None if s.kind is bool else "TEXT")


def _server_command(
    name: str, options_type: type[T], env_prefix: str, serve: Callable[[T], None], doc: str
) -> None:
    """Adds ``srtm NAME``: one option per setting of ``options_type``, and ``--config``."""

    def command(config: Path | None = None, **cli: Any) -> None:
        try:
            file = read_table(config, name, options_type, env_prefix) if config else {}
            options = resolve(
                options_type, env_prefix, cli=cli, environ=os.environ, file=file,
                file_name=str(config),
            )  # fmt: skip
        except SettingError as exc:
            flag = exc.where.startswith("--")  # quoted as click quotes flags
            hint = f"'{exc.where}'" if flag else exc.where
            raise typer.BadParameter(exc.message, param_hint=hint) from None
        try:
            serve(options)
        except (ValueError, OSError) as exc:
            Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(2) from exc

    config = typer.Option(
        metavar="FILE",
        help=escape(
            f"TOML file of settings: its [{name}] table, or its top level; keys named like "
            "the flags (without --). Unknown keys are an error."
        ),
    )
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "config",
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[Path | None, config],
            ),
            *(p for s in settings(options_type, env_prefix) for p in _parameters(s)),
        ]
    )
    text = f"{inspect.cleandoc(doc)}\n\n{_PRECEDENCE.format(prefix=env_prefix)}"
    app.command(name, help=text)(command)


def _serve_broker(options: BrokerOptions) -> None:
    from srtm.broker.server import run
    from srtm.security import require_auth_choice

    require_auth_choice(
        options.token, options.insecure_loopback, [options.tcp_host, options.http_host]
    )

    def ready(b: object) -> None:
        from srtm.broker import Broker

        assert isinstance(b, Broker) and b.tcp_address and b.http_address
        t, h = b.tcp_address, b.http_address
        s = f" https={b.https_address[0]}:{b.https_address[1]}" if b.https_address else ""
        print(
            f"srtm broker {options.broker_id} tcp={t[0]}:{t[1]} http={h[0]}:{h[1]}{s}", flush=True
        )

    run(options, ready)


_server_command(
    "broker",
    BrokerOptions,
    BROKER_ENV,
    _serve_broker,
    """Run a broker: NSQ's TCP protocol V2 and nsqd's HTTP API, with per-topic shaping.

    Stops on SIGTERM or Ctrl-C, writing queued, deferred and in-flight messages to
    --data-dir for the next start.""",
)


def _read_json(path: Path, flag: str) -> object:
    try:
        return parse_json(path.read_bytes(), str(path))
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=flag) from exc
    except ValueError as exc:  # "PATH is not JSON: … at line L column C"
        raise typer.BadParameter(str(exc), param_hint=flag) from exc


@app.command("place")
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
    from srtm.placement import for_topic, ledger, parse_brokers, parse_policy, parse_topic, place

    try:
        chosen = parse_policy(policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from None
    try:
        fleet = parse_brokers(_read_json(brokers, "--brokers"))
        specs = [parse_topic(doc) for path in topic for doc in _topic_docs(path)]
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    measured = [(b.id, b.mcap, b.load) for b in fleet]
    plans: list[dict[str, BucketParams]] = []
    docs = []
    console = Console(width=None if Console().is_terminal else 120)
    for spec in specs:
        before = ledger(measured, plans)
        result = place(chosen, for_topic(spec, [e.capacity() for e in before]), spec, seed)
        plans.append({a.broker: a.bucket for a in result.assignments if a.bucket is not None})
        after = ledger(measured, plans)
        docs.append(result.to_json() | {"topic": spec.name, "ledger": _ledger_doc(after)})
        if not as_json:
            _print_placement(console, spec, policy, result, before)
            _print_ledger(console, spec.name, after)
    if as_json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))


def _topic_docs(path: Path) -> list[Any]:
    doc = _read_json(path, "--topic")
    return doc if isinstance(doc, list) else [doc]


def _ledger_doc(entries: list[LedgerEntry]) -> list[dict[str, Any]]:
    return [
        {"id": e.id, "mcap": e.mcap, "allocated": e.allocated, "measured": e.measured,
         "rcap": e.rcap}
        for e in entries
    ]  # fmt: skip


def _print_placement(
    console: Console, spec: TopicSpec, policy: str, result: Placement, before: list[LedgerEntry]
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


def _print_ledger(console: Console, name: str, entries: list[LedgerEntry]) -> None:
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


@app.command("rebalance")
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
    from srtm.placement.rebalance import RebalanceSettings, apply, load_ratios, parse_state
    from srtm.placement.rebalance import rebalance as decide

    doc = _read_json(state, "--state")
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
        parsed = parse_state(doc)
        when = now
        if when is None:
            raw = doc.get("now_s", 0.0) if isinstance(doc, dict) else 0.0
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise ValueError(f"now_s must be a number, got {raw!r}")
            when = float(raw)
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    decisions = decide(parsed, settings, when)
    before = load_ratios(parsed, settings)
    after = load_ratios(apply(parsed, decisions, settings, when), settings)
    rows = [{"id": b, "before": lr, "after": after.get(b)} for b, lr in before.items()]
    if as_json:
        out = {"now_s": when, "decisions": [d.to_json() for d in decisions], "brokers": rows}
        print(json.dumps(out, indent=2))
        return
    console = Console(width=None if Console().is_terminal else 120)
    table = Table(title=f"decisions at t = {when:g} s")
    for column in ("#", "action", "topic", "publishers", "from", "to / n"):
        table.add_column(column)
    for i, d in enumerate(decisions, 1):
        j = d.to_json()
        pubs = j.get("publishers")
        shown = "" if pubs is None else ", ".join(pubs[:6]) + (" …" if len(pubs) > 6 else "")
        target_cell = j.get("to", j.get("n", j.get("broker", "")))
        extra = f" ({j['kind']})" if "kind" in j else ""
        table.add_row(
            str(i), j["action"] + extra, j.get("topic", ""), shown, j.get("from", ""),
            escape(str(target_cell)),
        )  # fmt: skip
    console.print(table if decisions else "[green]no decisions: nothing to do[/green]")
    ratios = Table(title=f"load ratio (overload > {overload:g}, target < {target:g})")
    for column in ("broker", "before", "after"):
        ratios.add_column(column, justify="left" if column == "broker" else "right")
    for row in rows:
        lr = row["after"]
        ratios.add_row(
            str(row["id"]), f"{row['before']:.3f}", "despawned" if lr is None else f"{lr:.3f}"
        )
    console.print(ratios)


def _serve_controller(options: ControllerOptions) -> None:
    import asyncio

    from srtm.control.service import ControllerService, serve
    from srtm.security import require_auth_choice

    require_auth_choice(options.token, options.insecure_loopback, [options.http_host])

    def ready(service: ControllerService) -> None:
        assert service.http_address is not None
        h = service.http_address
        print(f"srtm controller http={h[0]}:{h[1]}", flush=True)

    asyncio.run(serve(options, ready))


_server_command(
    "controller",
    ControllerOptions,
    CONTROLLER_ENV,
    _serve_controller,
    """Run the controller: broker registry, topics with SLOs, placement, plans, the TB
    Adaptor, nsqlookupd's /lookup; its state lives in --db. Stops on SIGTERM or Ctrl-C.""",
)


from srtm.cli.demo import demo  # noqa: E402
from srtm.cli.experiment import app as experiment_app  # noqa: E402

app.add_typer(experiment_app, name="experiment")
app.command("demo")(demo)

from srtm.cli.calibrate import calibrate  # noqa: E402

app.command("calibrate")(calibrate)

from srtm.pipeline.cli import app as pipeline_app  # noqa: E402

app.add_typer(pipeline_app, name="pipeline")

from srtm.utility_cli import app as utility_app  # noqa: E402

app.add_typer(utility_app, name="utility")


# -- how typer's rich help shows the commands above ------------------------------------------
def _unwrapped(text: str) -> str:
    """``text`` with each paragraph on one line (blank lines part paragraphs; a paragraph
    that starts with click's ``\\b`` keeps its lines)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def _unwrap_help(group: typer.Typer) -> None:
    """Typer's rich help keeps the single line breaks of a command's help (its docstring,
    wrapped at the source's width), in the command's description and in its group's list
    of commands, so that they showed as ragged lines at any other width. Each paragraph is
    made one line here, once, for rich to wrap to the terminal. Options need nothing:
    typer joins an option help's lines itself."""
    if isinstance(group.info.help, str):
        group.info.help = _unwrapped(group.info.help)
    for command in group.registered_commands:
        text = command.help if command.help is not None else inspect.getdoc(command.callback)
        if text:
            command.help = _unwrapped(text)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _unwrap_help(sub.typer_instance)


def _plain_flags() -> None:
    """Show a flag as ``--json``, not ``--json <bool>``: typer's rich help (0.29) gives
    every option a type in its help, a flag too, as if it took a value; its plain help
    (click's) leaves a flag's out. Every other option keeps its type."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # an older typer, whose rich help shows no type for a flag
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag or self.count else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_unwrap_help(app)
_plain_flags()
