"""``srtm broker`` and ``srtm controller``: the servers, one flag per setting of their
options type (``srtm.config`` resolves flags, variables and the file)."""

from __future__ import annotations

import enum
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from srtm.broker.options import ENV_PREFIX as BROKER_ENV
from srtm.broker.options import BrokerOptions
from srtm.cli.common import fail
from srtm.config import Address, Setting, SettingError, read_table, resolve, settings
from srtm.control.options import ENV_PREFIX as CONTROLLER_ENV
from srtm.control.options import ControllerOptions
from srtm.security import is_loopback

T = TypeVar("T")

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
) -> Callable[..., None]:
    """The command ``srtm NAME``: one option per setting of ``options_type``, and
    ``--config``; its help is ``doc`` and how the settings are read."""

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
            raise fail(escape(str(exc))) from exc

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
    command.__doc__ = f"{inspect.cleandoc(doc)}\n\n{_PRECEDENCE.format(prefix=env_prefix)}"
    return command


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


broker = _server_command(
    "broker",
    BrokerOptions,
    BROKER_ENV,
    _serve_broker,
    """Run a broker: NSQ's TCP protocol V2 and nsqd's HTTP API, with per-topic shaping.

    Stops on SIGTERM or Ctrl-C, writing queued, deferred and in-flight messages to
    --data-dir for the next start.""",
)


def _serve_controller(options: ControllerOptions) -> None:
    import asyncio

    from srtm.control.service import ControllerService, serve
    from srtm.security import require_auth_choice

    require_auth_choice(options.token, options.insecure_loopback, [options.http_host])

    def ready(service: ControllerService) -> None:
        assert service.http_address is not None
        h = service.http_address
        lead = service.leadership
        role = lead.role.value + ("" if lead.epoch is None else f" epoch={lead.epoch}")
        print(f"srtm controller http={h[0]}:{h[1]} role={role}", flush=True)

    asyncio.run(serve(options, ready))


controller = _server_command(
    "controller",
    ControllerOptions,
    CONTROLLER_ENV,
    _serve_controller,
    """Run the controller: broker registry, topics with SLOs, placement, plans, the TB
    Adaptor, nsqlookupd's /lookup; its state lives in --db (SQLite) or, with
    --etcd-endpoints, in etcd. Stops on SIGTERM or Ctrl-C.""",
)


def _address(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise typer.BadParameter(f"must be HOST:PORT, got {value!r}", param_hint=flag)
    return host, int(port)


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` among broker options passed through (``--flag V`` or
    ``--flag=V``; the last one given), or None."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _node_cpus() -> list[int]:
    """The CPUs this process may run on, to pin a node's processes to (none where the OS
    cannot say: not Linux)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return sorted(getaffinity(0)) if getaffinity is not None else []


def node(
    ctx: typer.Context,
    brokers: Annotated[
        int | None,
        typer.Option(help="Broker processes to run (default: the machine's cores).", min=1),
    ] = None,
    controller: Annotated[
        str | None, typer.Option(help="Controller URLs, URL[,URL...]; each process registers.")
    ] = None,
    data_dir: Annotated[
        Path, typer.Option(help="Each process keeps its data in DIR/b0, DIR/b1, …")
    ] = Path("srtm-data"),
    broker_id: Annotated[
        int, typer.Option(help="The first process's id; the others follow (0..4095).")
    ] = 0,
    tcp_address: Annotated[
        str, typer.Option(help="HOST:PORT of the first process's TCP; the others follow.")
    ] = "127.0.0.1:4150",
    http_address: Annotated[
        str | None,
        typer.Option(help="HOST:PORT of the first process's HTTP (default: after the TCP ports)."),
    ] = None,
    host_id: Annotated[
        str | None, typer.Option(help="The host id they register under (default: hostname).")
    ] = None,
    stop_timeout_s: Annotated[
        float, typer.Option(help="How long a stop waits for the processes before killing them.")
    ] = 30.0,
    max_brokers: Annotated[
        int | None,
        typer.Option(
            help="Processes the node may run: the controller's elastic loop adds one to a "
            "node below it before it asks for a new host (default: the machine's cores, "
            "at least --brokers).",
            min=1,
        ),
    ] = None,
    node_address: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of the node's HTTP API (GET /node; POST and DELETE "
            "/node/brokers?id=ID, with the token): give it to the controller's --nodes. "
            "Default: none.",
        ),
    ] = None,
    shared_address: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT where plain NSQ publishers reach every process: the node deals "
            "each connection to its processes in turn (SUB is refused there: consumers "
            "find each process through /lookup). Default: none.",
        ),
    ] = None,
    cpu_affinity: Annotated[
        bool,
        typer.Option(
            help="Pin each process to one of the CPUs this command may run on, in turn "
            "(GET /node shows which). Off: the OS places them, better where other busy "
            "programs share the host's cores.",
        ),
    ] = True,
) -> None:
    """Run N broker processes on this host, one per core: each its own broker (id, ports,
    data directory) registered under one host id. Options not listed here are broker
    options (srtm broker --help), given to every process. A process that dies is started
    again (its data directory keeps what it acknowledged); SIGTERM or Ctrl-C stops them all.
    """
    import asyncio
    import socket

    from srtm.broker.accept import LISTEN_BACKLOG
    from srtm.broker.node import NodeSupervisor, extra_flags_refused, layout
    from srtm.broker.node_http import serve_node
    from srtm.broker.shared import Dealer

    if (why := extra_flags_refused(ctx.args)) is not None:
        raise typer.BadParameter(why)
    n = brokers if brokers is not None else os.cpu_count() or 1
    tcp = _address(tcp_address, "--tcp-address")
    http = None if http_address is None else _address(http_address, "--http-address")
    extra = [*(["--controller", controller] if controller else []), *ctx.args]
    try:
        plans = layout(n, broker_id, data_dir, tcp, http)
    except ValueError as exc:
        raise fail(escape(str(exc))) from exc
    api = None if node_address is None else _address(node_address, "--node-address")
    token = os.environ.get("SRTM_TOKEN") or _flag_value(ctx.args, "--token")
    if api is not None and token is None and not is_loopback(api[0]):
        raise typer.BadParameter(
            "without a token (SRTM_TOKEN or --token) the node's API binds loopback only",
            param_hint="--node-address",
        )
    dealer = None
    if shared_address is not None:
        shared = _address(shared_address, "--shared-address")
        try:
            dealer = Dealer(socket.create_server(shared, backlog=LISTEN_BACKLOG))
        except OSError as exc:
            raise fail(escape(f"--shared-address {shared_address}: {exc}")) from exc
    supervisor = NodeSupervisor(
        plans, host_id or socket.gethostname(), extra, stop_timeout_s=stop_timeout_s,
        max_processes=max(n, max_brokers or os.cpu_count() or 1), data_dir=data_dir,
        dealer=dealer, cpus=_node_cpus() if cpu_affinity else (),
    )  # fmt: skip
    try:
        asyncio.run(serve_node(supervisor, lambda s: print(s.ready_line(), flush=True), api, token))
    except (RuntimeError, OSError) as exc:
        raise fail(escape(str(exc))) from exc
