"""The ``srtm`` command line."""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from srtm.analysis import DrlRow, drl_table
from srtm.version import package_version

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
            _fmt(m and m.prob_delayed, ".4f"),
            _fmt(s and s.prob_delayed, ".4f"),
            _fmt(m and m.mean_s, ".4f", 1e3),
            _fmt(s and s.mean_s, ".4f", 1e3),
            _fmt(m and m.p99_s, ".3f", 1e3),
            _fmt(s and s.p99_s, ".3f", 1e3),
            _fmt(m and m.eq1_mean_s, ".4f", 1e3),
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


def _load_config(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> None:
    """``--config FILE``: defaults from a TOML file (its ``[broker]`` table, or the top level),
    keyed like the flags; flags and environment variables still win."""
    if value is None:
        return
    try:
        doc = tomllib.loads(value.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise typer.BadParameter(f"{value}: {exc}", param_hint="--config") from exc
    section = doc.get(ctx.info_name or "", doc)
    names = {
        opt.lstrip("-").replace("-", "_"): p.name
        for p in ctx.command.params
        for opt in p.opts
        if p.name and p.name != "config"
    }
    unknown = sorted(k for k in section if k.replace("-", "_") not in names)
    if unknown:
        raise typer.BadParameter(f"{value}: unknown keys {unknown}", param_hint="--config")
    defaults = {names[k.replace("-", "_")]: v for k, v in section.items()}
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _address(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT", param_hint=flag)
    return host or "127.0.0.1", int(port)


@app.command("broker")
def broker(
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML file with defaults for these options ([broker] table, keys named "
            "like the flags); flags and SRTM_* environment variables override it.",
            callback=_load_config,
            is_eager=True,
            expose_value=False,
        ),
    ] = None,
    tcp_address: Annotated[
        str,
        typer.Option(
            envvar="SRTM_TCP_ADDRESS",
            help="HOST:PORT for NSQ's TCP protocol (port 0: any free port, printed at start).",
        ),
    ] = "127.0.0.1:4150",
    http_address: Annotated[
        str,
        typer.Option(envvar="SRTM_HTTP_ADDRESS", help="HOST:PORT for the HTTP API (0: any)."),
    ] = "127.0.0.1:4151",
    broker_id: Annotated[
        int,
        typer.Option(
            envvar="SRTM_BROKER_ID", help="0..4095; the first 3 hex digits of message ids."
        ),
    ] = 0,
    data_dir: Annotated[
        Path,
        typer.Option(
            envvar="SRTM_DATA_DIR",
            help="Where queues overflow to disk and where a graceful stop (SIGTERM) leaves "
            "every message still owed; the next start delivers them.",
        ),
    ] = Path("srtm-data"),
    trace_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="SRTM_TRACE_DIR",
            help="Write broker-side trace rows as Parquet under DIR/broker/run=RUN/.",
        ),
    ] = None,
    run_name: Annotated[
        str, typer.Option("--run", envvar="SRTM_RUN", help="Trace partition (run) name.")
    ] = "default",
    trace_sample: Annotated[
        float, typer.Option(help="Share of messages traced, in (0, 1].", min=0.0, max=1.0)
    ] = 1.0,
    mem_queue_size: Annotated[
        int,
        typer.Option(
            envvar="SRTM_MEM_QUEUE_SIZE",
            help="Messages each queue keeps in memory before overflowing to disk "
            "(ephemeral queues drop beyond it, counted in /stats).",
            min=0,
        ),
    ] = 10_000,
    msg_timeout_ms: Annotated[
        int, typer.Option(help="Default in-flight timeout before a message is requeued (ms).")
    ] = 60_000,
    heartbeat_ms: Annotated[
        int, typer.Option(help="Default heartbeat interval (ms); clients may negotiate theirs.")
    ] = 30_000,
    arrival_stamps: Annotated[
        str,
        typer.Option(
            help="'kernel': SO_TIMESTAMPNS receive stamps (falls back where unsupported); "
            "'user': a clock read after each read."
        ),
    ] = "kernel",
    release_timer: Annotated[
        str,
        typer.Option(
            help="What ends the wait for a shaped release: 'timerfd' (Linux, ns-precise) or "
            "'asyncio' (~1 ms coarse; the spin is then at least 1.5 ms)."
        ),
    ] = "timerfd",
    release_spin_us: Annotated[
        int,
        typer.Option(
            help="Yield to the loop for this long (µs) before each shaped release instead "
            "of sleeping, to absorb the timer's wake-up latency.",
            min=0,
        ),
    ] = 200,
    window_s: Annotated[
        int, typer.Option(help="TB Adaptor window: average rate and max backlog over N s.", min=1)
    ] = 10,
    controller: Annotated[
        str | None,
        typer.Option(
            envvar="SRTM_CONTROLLER",
            help="Controller URL (http://HOST:PORT): register there and report load and "
            "each topic's window every second.",
        ),
    ] = None,
    mcap: Annotated[
        float,
        typer.Option(help="Messages/s this broker can process, told to the controller.", min=1),
    ] = 110_000.0,
    capacity: Annotated[
        float,
        typer.Option(
            envvar="SRTM_CAPACITY",
            help="Emulate a smaller instance: process at most this many messages/s, each "
            "taking 1/CAPACITY s of one broker-wide server after its topic's bucket "
            "releases it (0: no limit).",
            min=0,
        ),
    ] = 0.0,
    max_output_buffer: Annotated[
        int,
        typer.Option(
            envvar="SRTM_MAX_OUTPUT_BUFFER",
            help="Bytes queued for one client beyond which its socket is not read and it "
            "gets no messages until half of that has drained (0: no limit).",
            min=0,
        ),
    ] = 4 * 1024 * 1024,
    write_timeout_ms: Annotated[
        int,
        typer.Option(
            envvar="SRTM_WRITE_TIMEOUT_MS",
            help="Close a client whose pending output made no progress for this long "
            "(ms; 0: never).",
            min=0,
        ),
    ] = 30_000,
    read_timeout_ms: Annotated[
        int,
        typer.Option(
            envvar="SRTM_READ_TIMEOUT_MS",
            help="A command must arrive whole within this long of its first byte, else "
            "E_INVALID and the connection is closed (ms; 0: no limit).",
            min=0,
        ),
    ] = 30_000,
    max_connections: Annotated[
        int,
        typer.Option(
            envvar="SRTM_MAX_CONNECTIONS",
            help="Client connections beyond this many get E_TOO_MANY_CONNECTIONS and are "
            "closed (0: no limit but the open-files limit).",
            min=0,
        ),
    ] = 10_000,
    max_bytes_per_file: Annotated[
        int,
        typer.Option(
            envvar="SRTM_MAX_BYTES_PER_FILE",
            help="Size of each disk queue segment file (bytes).",
            min=1024,
        ),
    ] = 16 << 20,
    disk_reserve_bytes: Annotated[
        int,
        typer.Option(
            envvar="SRTM_DISK_RESERVE_BYTES",
            help="Disk space (bytes) claimed at start and given back at a graceful stop, so "
            "that what memory holds is saved even when the disk is full (0: none).",
            min=0,
        ),
    ] = 32 << 20,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            envvar="SRTM_TLS_CERT",
            help="PEM certificate (chain): clients may upgrade with IDENTIFY tls_v1 (nsqd's).",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(envvar="SRTM_TLS_KEY", help="PEM private key of --tls-cert.")
    ] = None,
    tls_root_ca_file: Annotated[
        Path | None,
        typer.Option(help="PEM CA bundle that client certificates must chain to."),
    ] = None,
    tls_required: Annotated[
        str,
        typer.Option(
            help="'true': TCP commands only after the TLS upgrade, plain HTTP refused "
            "(TLS_REQUIRED); 'tcp-https': TCP only; 'false': optional."
        ),
    ] = "false",
    tls_client_auth_policy: Annotated[
        str,
        typer.Option(
            help="'require' or 'require-verify': clients must present a certificate "
            "that verifies against --tls-root-ca-file (implies --tls-required)."
        ),
    ] = "",
    https_address: Annotated[
        str | None,
        typer.Option(help="HOST:PORT for the HTTP API over TLS, with --tls-cert (0: any)."),
    ] = None,
    auth_http_address: Annotated[
        list[str] | None,
        typer.Option(
            envvar="SRTM_AUTH_HTTP_ADDRESS",
            help="nsqd's AUTH: auth server (HOST:PORT or http(s)://HOST:PORT) asked "
            "GET /auth for each AUTH secret; repeat for fallbacks.",
        ),
    ] = None,
    max_topics: Annotated[
        int,
        typer.Option(
            envvar="SRTM_MAX_TOPICS",
            help="Topics this broker holds at most; creating one more fails (PUB: "
            "E_PUB_FAILED, SUB: E_SUB_FAILED, HTTP: 403 TOO_MANY_TOPICS).",
            min=1,
        ),
    ] = 10_000,
    max_channels_per_topic: Annotated[
        int,
        typer.Option(
            envvar="SRTM_MAX_CHANNELS_PER_TOPIC",
            help="Channels per topic at most (SUB: E_SUB_FAILED, HTTP: 403 TOO_MANY_CHANNELS).",
            min=1,
        ),
    ] = 100,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SRTM_TOKEN",
            help="Cluster token: mutating /srtm/* HTTP requests must carry "
            "'Authorization: Bearer TOKEN' (nsqd's own endpoints stay open). Required "
            "unless --insecure-loopback.",
        ),
    ] = None,
    insecure_loopback: Annotated[
        bool,
        typer.Option(
            "--insecure-loopback",
            envvar="SRTM_INSECURE_LOOPBACK",
            help="Run without a token: allowed only when every bind address is loopback.",
        ),
    ] = False,
) -> None:
    """Run a broker: NSQ's TCP protocol V2 and nsqd's HTTP API, with per-topic shaping.

    Stops on SIGTERM or Ctrl-C, writing queued, deferred and in-flight messages to
    --data-dir for the next start.
    """
    from srtm.broker import BrokerOptions
    from srtm.broker.server import run

    if release_timer not in ("timerfd", "asyncio"):
        raise typer.BadParameter("must be 'timerfd' or 'asyncio'", param_hint="--release-timer")
    if arrival_stamps not in ("kernel", "user"):
        raise typer.BadParameter("must be 'kernel' or 'user'", param_hint="--arrival-stamps")
    tcp_host, tcp_port = _address(tcp_address, "--tcp-address")
    http_host, http_port = _address(http_address, "--http-address")
    https_host, https_port = (
        _address(https_address, "--https-address") if https_address else ("127.0.0.1", None)
    )
    try:
        from srtm.security import require_auth_choice

        require_auth_choice(token, insecure_loopback, [tcp_host, http_host])
        options = BrokerOptions(
            tcp_host=tcp_host,
            tcp_port=tcp_port,
            http_host=http_host,
            http_port=http_port,
            broker_id=broker_id,
            data_dir=data_dir,
            trace_dir=trace_dir,
            run=run_name,
            trace_sample=trace_sample,
            mem_queue_size=mem_queue_size,
            msg_timeout_ms=msg_timeout_ms,
            heartbeat_interval_ms=heartbeat_ms,
            kernel_timestamps=arrival_stamps == "kernel",
            release_timer=release_timer,
            release_spin_ns=release_spin_us * 1000,
            window_seconds=window_s,
            controller=controller,
            mcap=mcap,
            capacity=capacity,
            max_output_buffer_bytes=max_output_buffer,
            write_timeout_ms=write_timeout_ms,
            read_timeout_ms=read_timeout_ms,
            max_connections=max_connections,
            max_bytes_per_file=max_bytes_per_file,
            disk_reserve_bytes=disk_reserve_bytes,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_root_ca_file=tls_root_ca_file,
            tls_required=tls_required,
            tls_client_auth_policy=tls_client_auth_policy,
            https_host=https_host,
            https_port=https_port,
            auth_http_address=tuple(auth_http_address or ()),
            max_topics=max_topics,
            max_channels_per_topic=max_channels_per_topic,
            token=token,
        )

        def ready(b: object) -> None:
            from srtm.broker import Broker

            assert isinstance(b, Broker) and b.tcp_address and b.http_address
            t, h = b.tcp_address, b.http_address
            s = f" https={b.https_address[0]}:{b.https_address[1]}" if b.https_address else ""
            print(f"srtm broker {broker_id} tcp={t[0]}:{t[1]} http={h[0]}:{h[1]}{s}", flush=True)

        run(options, ready)
    except (ValueError, OSError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


def _read_json(path: Path, flag: str) -> object:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=flag) from exc
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"{path} is not JSON: {exc}", param_hint=flag) from exc


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
        Path,
        typer.Option(
            help='JSON topic: {"name": "t", "slo_p99_ms": 1.0, "burst": 200, "publishers": '
            '[{"id": "p1", "rate": 10, "group": "g1"}, ...]} ("group" and "rate" optional; '
            "the topic rate defaults to 1.1 × the publishers' total)."
        ),
    ] = Path("topic.json"),
    seed: Annotated[int, typer.Option(help="Seed for srtm's choice among a group's members.")] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the placement as one JSON document.")
    ] = False,
) -> None:
    """Place a topic's publishers on brokers under a policy, without a cluster (what-if).

    Prints each broker used with its publishers, their rate and its sub-bucket, or the
    shortfall when the brokers' residual capacity cannot carry the topic.
    """
    from srtm.placement import parse_brokers, parse_policy, parse_topic, place

    try:
        chosen = parse_policy(policy)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from None
    try:
        fleet = parse_brokers(_read_json(brokers, "--brokers"))
        spec = parse_topic(_read_json(topic, "--topic"))
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    result = place(chosen, fleet, spec, seed)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    console = Console(width=None if Console().is_terminal else 120)
    table = Table(
        title=f"{spec.name}: {len(spec.publishers)} publishers, {spec.load:,.6g} msg/s, "
        f"bucket ({spec.rate:,.6g}/s, {spec.burst:,.6g}) — policy {policy}"
    )
    for name in ("broker", "mcap", "load before", "publishers", "rate msg/s", "r_l", "b_l"):
        table.add_column(name, justify="left" if name == "broker" else "right")
    by_id = {b.id: b for b in fleet}
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


@app.command("controller")
def controller_command(
    http_address: Annotated[
        str,
        typer.Option(
            envvar="SRTM_CONTROLLER_ADDRESS",
            help="HOST:PORT of its HTTP API (port 0: any free port, printed at start).",
        ),
    ] = "127.0.0.1:4161",
    db: Annotated[
        Path,
        typer.Option(
            envvar="SRTM_DB",
            help="SQLite file with brokers, topics, plans and sub-buckets; a restarted "
            "controller resumes from it.",
        ),
    ] = Path("srtm-controller.db"),
    broker_timeout_s: Annotated[
        float,
        typer.Option(help="A broker silent this long is down; its publishers move.", min=0.1),
    ] = 5.0,
    tick_s: Annotated[
        float, typer.Option(help="How often it checks brokers and runs the TB Adaptor (s).")
    ] = 1.0,
    stale_after_s: Annotated[
        float, typer.Option(help="TB Adaptor: a report older than this keeps its share.")
    ] = 3.0,
    hysteresis: Annotated[
        float,
        typer.Option(help="TB Adaptor: ignore changes smaller than this fraction of a share."),
    ] = 0.1,
    adapt_settle_s: Annotated[
        float,
        typer.Option(
            help="TB Adaptor: after a plan change, wait this long (s) before adapting, until "
            "the brokers' windows hold only traffic placed by the new plan.",
            min=0,
        ),
    ] = 11.0,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SRTM_TOKEN",
            help="Cluster token: brokers' registrations and reports and every mutating "
            "request need 'Authorization: Bearer TOKEN'; sent to brokers too.",
        ),
    ] = None,
    insecure_loopback: Annotated[
        bool,
        typer.Option(
            "--insecure-loopback",
            envvar="SRTM_INSECURE_LOOPBACK",
            help="Run without a token (anyone who reaches the port may change plans); "
            "only with a loopback --http-address.",
        ),
    ] = False,
    tls_cert: Annotated[
        Path | None, typer.Option(help="HTTPS: PEM certificate chain (with --tls-key).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="HTTPS: PEM private key.")] = None,
    models_dir: Annotated[
        Path | None,
        typer.Option(
            help="fit.model may name a model file under this directory (else built-in models only)."
        ),
    ] = None,
    max_publishers: Annotated[
        int, typer.Option(help="Publishers one topic may have (413 beyond).", min=1)
    ] = 100_000,
) -> None:
    """Run the controller: broker registry, topics with SLOs, placement, plans, the TB
    Adaptor, nsqlookupd's /lookup; its state lives in --db. Stops on SIGTERM or Ctrl-C."""
    import asyncio

    from srtm.control.service import ControllerOptions, ControllerService, serve
    from srtm.placement import AdaptorSettings
    from srtm.security import require_auth_choice

    host, port = _address(http_address, "--http-address")
    try:
        require_auth_choice(token or None, insecure_loopback, [host])
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    options = ControllerOptions(
        http_host=host,
        http_port=port,
        db=db,
        broker_timeout_s=broker_timeout_s,
        tick_s=tick_s,
        adaptor=AdaptorSettings(
            stale_after_s=stale_after_s, hysteresis=hysteresis, settle_s=adapt_settle_s
        ),
        token=token or None,
        tls_cert=tls_cert,
        tls_key=tls_key,
        models_dir=models_dir,
        max_publishers=max_publishers,
    )

    def ready(service: ControllerService) -> None:
        assert service.http_address is not None
        h = service.http_address
        print(f"srtm controller http={h[0]}:{h[1]}", flush=True)

    try:
        asyncio.run(serve(options, ready))
    except (ValueError, OSError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


from srtm.experiments.cli import app as experiment_app  # noqa: E402
from srtm.experiments.cli import demo  # noqa: E402

app.add_typer(experiment_app, name="experiment")
app.command("demo")(demo)

from srtm.experiments.calibrate_cli import calibrate  # noqa: E402

app.command("calibrate")(calibrate)

from srtm.pipeline.cli import app as pipeline_app  # noqa: E402

app.add_typer(pipeline_app, name="pipeline")
