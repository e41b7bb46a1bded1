"""What every experiment is: the ``Experiment`` protocol (a name, ``sim()`` and/or
``live()``, the options each takes), a run's settings (``RunSettings``) and what it ended
with (``Summary``); and the terminal helpers the families share (a progress bar, Ctrl-C,
``--scale``).

Each family (``scenarios``, ``figures``, ``tenancy``, ``diurnal``, ``utility``,
``control_plane``) defines
its experiments in its package's ``__init__``; ``registry`` finds them by name. A run
prints its own report as it goes (a multi-policy run shows each policy's table when that
policy is done), writes the report's files into ``--out`` and returns its ``Summary``: the
JSON documents ``--json`` prints, the verdict ``--strict`` exits with, and the report's
files.
"""

from __future__ import annotations

import signal
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rich.console import Console

    from srtm.experiments.scenarios.scenario import PublisherOrder
    from srtm.experiments.sizing import Sizing
    from srtm.placement import Policy


class Mode(StrEnum):
    """How an experiment runs: simulated at the paper's scale, or live on local brokers."""

    sim = "sim"
    live = "live"


class Option(StrEnum):
    """An option of ``srtm experiment run`` that only some experiments take, as spelled on
    the command line; the member's name is the command's parameter. ``--out`` and
    ``--json`` every experiment takes."""

    policy = "--policy"
    duration = "--duration"
    warmup = "--warmup"
    analysis = "--analysis"
    spark_master = "--spark-master"
    strict = "--strict"
    scale = "--scale"
    quick = "--quick"
    decide = "--decide"
    only = "--only"
    outage_s = "--outage-s"
    model = "--model"
    publisher_order = "--publisher-order"


class Analysis(StrEnum):
    """Who computes a run's latency figures from its traces."""

    auto = "auto"
    spark = "spark"
    local = "local"


#: The exit code of --strict when a run was disturbed.
EXIT_DISTURBED = 3


class RunVerdict(Enum):
    """How a run ended, as ``--strict`` exits: its value is the exit code."""

    ok = 0
    failed = 1  # a check or one of the paper's claims failed
    disturbed = EXIT_DISTURBED  # the machine was too busy to measure on


@dataclass(frozen=True)
class Terminal:
    """Where a run prints: ``err`` for progress, notes and file names, ``out`` (stdout)
    for results."""

    err: Console
    out: Console


@dataclass(frozen=True)
class RunSettings:
    """One ``srtm experiment run``: where it writes, how it prints, and the options given
    (those an experiment does not take keep their defaults; ``refuse`` sees to it)."""

    out: Path
    term: Terminal
    as_json: bool = False
    policies: tuple[Policy, ...] = ("srtm",)
    duration_s: float | None = None
    warmup_s: float | None = None
    analysis: Analysis = Analysis.auto
    spark_master: str | None = None
    scale: str = "auto"
    quick: bool = False
    decide: str = "controller"
    only: str | None = None
    outage_s: float | None = None
    #: The broker model: for the simulated figures ``calibrated`` (None), ``paper`` or a
    #: file; for table1 live a ``srtm calibrate`` file (None: calibrate in the run).
    model: str | None = None
    #: The order a live scenario's publishers are handed to the controller (None: the
    #: scenario's own, block unless its file says otherwise).
    publisher_order: PublisherOrder | None = None
    #: ``compare --slo-ms``: the live scenario's p99 SLO instead of its own (None: its own).
    slo_ms: float | None = None


@dataclass(frozen=True)
class Summary:
    """What a run ended with: the JSON documents ``--json`` prints (one per run, in
    order), its verdict, and its report: every file the run wrote directly in ``--out``
    (pages, plots, tables, JSON summaries), in the order written. The traces and the
    brokers' files a live run keeps in folders under ``--out`` are not the report."""

    experiment: str
    mode: Mode
    documents: tuple[str, ...] = ()
    verdict: RunVerdict = RunVerdict.ok
    report: tuple[Path, ...] = ()


class UsageError(ValueError):
    """A value or an option the experiment cannot run with; ``option`` names it as
    spelled on the command line."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class Experiment(Protocol):
    """A named experiment. It is ``Simulated``, ``Live`` or both; a run (``sim()``,
    ``live()``) returns its ``Summary``, with the files of the report it wrote."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


@runtime_checkable
class Simulated(Experiment, Protocol):
    """An experiment with a simulation at the paper's scale."""

    @property
    def sim_options(self) -> frozenset[Option]: ...

    def sim(self, run: RunSettings) -> Summary: ...


@runtime_checkable
class Live(Experiment, Protocol):
    """An experiment that runs live on local brokers."""

    @property
    def live_options(self) -> frozenset[Option]: ...

    def live(self, run: RunSettings) -> Summary: ...


def options(exp: Experiment, mode: Mode) -> frozenset[Option] | None:
    """The options ``exp`` takes in ``mode``; None when it does not run that way."""
    if mode is Mode.sim:
        return exp.sim_options if isinstance(exp, Simulated) else None
    return exp.live_options if isinstance(exp, Live) else None


def start(exp: Experiment, mode: Mode, given: Collection[Option], run: RunSettings) -> Summary:
    """Run ``exp`` in ``mode``, once ``refuse`` has found every option given taken."""
    refuse(exp, mode, given)
    if mode is Mode.sim:
        assert isinstance(exp, Simulated)
        return exp.sim(run)
    assert isinstance(exp, Live)
    return exp.live(run)


def refuse(exp: Experiment, mode: Mode, given: Collection[Option]) -> None:
    """A UsageError when ``exp`` does not run in ``mode`` or does not take one of the
    options ``given``: an option the run would ignore is refused, never dropped."""
    taken = options(exp, mode)
    if taken is None:
        if mode is Mode.sim:
            raise UsageError("--sim", f"{exp.name} is not simulated; run it live (no --sim)")
        raise UsageError("--sim", f"{exp.name} is only simulated; run it with --sim")
    extra = [o for o in Option if o in given and o not in taken]
    if extra:
        how = f"{exp.name} --sim" if mode is Mode.sim else f"a live {exp.name} run"
        raise UsageError(extra[0].value, f"{how} does not take it (it takes {takes(taken)})")


def takes(taken: Collection[Option]) -> str:
    """The options a run takes, as the command line spells them."""
    return ", ".join([*(o.value for o in Option if o in taken), "--out", "--json"])


def verdict(*, disturbed: bool, ok: bool) -> RunVerdict:
    """Disturbed first: a run on a busy machine says nothing of its checks."""
    return RunVerdict.disturbed if disturbed else RunVerdict.ok if ok else RunVerdict.failed


@contextmanager
def progress(term: Terminal, label: str) -> Iterator[Any]:
    """A rich progress bar for one run, following the phases it reports through the
    ``(phase, done, total)`` callback this yields."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.fields[label]}[/bold] {task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=term.err,
        transient=False,
    ) as bar:
        task = bar.add_task("starting", total=1.0, label=label)

        def update(phase: str, done: float, total: float) -> None:
            share = done / total if total > 0 else 1.0
            bar.update(task, description=phase, completed=min(1.0, max(0.0, share)))

        yield update
        bar.update(task, description="done", completed=1.0)


@contextmanager
def ctrl_c_wins() -> Iterator[None]:
    """Ctrl-C reaches the run's servers too (one process group): one that dies of it
    first can make the run raise its own error (a broker gone, a subscriber that exited)
    before the interrupt does. Once Ctrl-C was pressed, any error is the interrupt
    (typer exits 130), never a traceback about a server that was told to stop."""
    pressed: list[int] = []

    def on_int(signum: int, frame: Any) -> None:
        pressed.append(signum)
        signal.default_int_handler(signum, frame)

    before = signal.signal(signal.SIGINT, on_int)
    try:
        yield
    except Exception:
        if pressed:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, before)


def is_auto(scale: str) -> bool:
    return scale.strip().lower() == "auto"


def sizing_of(scale: str, term: Terminal) -> Sizing:
    """The sizing ``--scale`` asks for: this machine measured for 'auto', else the scale
    given. Each live family slows its own scenario by it."""
    from srtm.experiments import sizing

    if is_auto(scale):
        with term.err.status("measuring this machine's speed (about a second)"):
            return sizing.choose(None)
    try:
        return sizing.choose(float(scale))
    except ValueError as exc:
        raise UsageError("--scale", f"'auto' or a number in (0, 1], got {scale!r}") from exc


def unsized(scale: str, name: str, why: str, term: Terminal) -> None:
    """An experiment not sized to the machine (``why``): it runs as written, which
    ``--scale`` may say ('auto', 1) but not change."""
    try:
        as_written = is_auto(scale) or float(scale) == 1.0
    except ValueError:
        as_written = False
    if not as_written:
        raise UsageError(
            "--scale", f"{name} is not sized to the machine ({why}); 'auto' or 1, got {scale!r}"
        )
    term.err.print(f"{name} runs as written, not sized to this machine: {why}.", highlight=False)
