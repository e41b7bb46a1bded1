"""Live scenarios: TOML files in this package, each a scaled-down version of one of the
paper's experiments (the file states the scale and why), loaded into ``Scenario``."""

from __future__ import annotations

import dataclasses
import math
import random
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast

from srtm.protocol import is_valid_name
from srtm.workload import PublisherSpec
from srtm.workload.schedule import Process


class PublisherOrder(StrEnum):
    """The order in which a scenario's publishers are handed to the controller, and so to
    the placement policy. The blind policies (LB, Conc, MaxMin) fill each broker with
    consecutive publishers: in ``block`` order (each group's members one after another, as
    the file lists them) that keeps every group whole on one broker, their worst case; in
    ``shuffled`` order (a permutation seeded by the scenario's seed) each broker gets a
    slice of most groups by chance, as a balancer that sees connections arrive would.
    The groups and the workload are the same in both."""

    block = "block"
    shuffled = "shuffled"


class ProfileTrace(StrEnum):
    """What a scenario's topic bucket is profiled on (``live.profile``): the workload
    drawn again with another seed (``other-draw``: for Poisson publishers a new sample
    of the same traffic), or the run's own schedule (``run``: periodic publishers keep
    their phases, so another draw is other sensors; a deployment profiles its own)."""

    other_draw = "other-draw"
    run = "run"


_E = TypeVar("_E", bound=StrEnum)


def _choice(kind: type[_E], label: str, text: str) -> _E:
    """``text`` as a ``kind``; ValueError naming ``label`` and the choices when it is none."""
    try:
        return kind(text)
    except ValueError:
        choices = ", ".join(c.value for c in kind)
        raise ValueError(f"{label} must be one of {choices}, got {text!r}") from None


def parse_publisher_order(text: str) -> PublisherOrder:
    """``text`` as a ``PublisherOrder``; ValueError naming the choices when it is none."""
    return _choice(PublisherOrder, "publisher order", text)


def ordered(
    specs: Sequence[PublisherSpec], order: PublisherOrder, seed: int
) -> list[PublisherSpec]:
    """``specs`` in ``order``: as given (block), or permuted by ``random.Random(seed)``
    (shuffled; the same seed, the same permutation)."""
    out = list(specs)
    if order is PublisherOrder.shuffled:
        random.Random(seed).shuffle(out)
    return out


def groups_per_broker(
    assignment: Mapping[str, Sequence[str]], specs: Sequence[PublisherSpec]
) -> dict[str, int]:
    """Broker -> how many correlation groups it has members of: 1 where a blind policy
    kept groups whole, every group where the placement sliced them all."""
    group = {p.id: p.group for p in specs if p.group is not None}
    return {b: len({group[p] for p in ps if p in group}) for b, ps in assignment.items()}


@dataclass(frozen=True, slots=True)
class PublisherClass:
    """``count`` alike publishers, ``id`` = ``prefix`` + number; grouped ``group_size`` at
    a time into correlation groups (0: independent)."""

    count: int
    rate: float
    process: str = "periodic"
    batch: int = 1
    group_size: int = 0
    prefix: str = "s"


@dataclass(frozen=True, slots=True)
class Fit:
    """Online fitting's settings (measurement window, samples needed, settle time);
    ``model``: a broker model file from ``srtm calibrate`` that makes fitting
    model-assisted (the run's controller reads it from the file's folder)."""

    window_s: float = 2.0
    min_samples: int = 200
    settle_s: float = 0.5
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Preload:
    """Background load on one broker before the topic comes: an unshaped topic at
    ``rate`` msg/s (Poisson), the paper's preloaded brokers."""

    broker: int
    rate: float


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    #: How it relates to the paper's experiment, and the factor it is scaled by.
    scale: str
    brokers: int
    #: Messages/s one broker processes (``srtm broker --capacity``: a smaller instance).
    capacity: float
    #: Messages/s a broker advertises to the controller: its capacity at the SLO.
    mcap: float
    topic: str
    slo_p99_ms: float
    publishers: tuple[PublisherClass, ...]
    #: Members of a group fire spread evenly over this many ms (imprecise correlation).
    spread_ms: float = 0.0
    #: r = rate_factor × offered rate; b is profiled from a trace of the workload.
    rate_factor: float = 1.1
    duration_s: float = 30.0
    #: Traffic before the measured window: fitting runs in it, the adaptor settles.
    warmup_s: float = 5.0
    seed: int = 1
    message_size: int = 100
    fit: Fit | None = field(default_factory=Fit)
    preload: tuple[Preload, ...] = ()
    #: The emulator skips (and counts) events it could only send this late: a stalled
    #: scheduler would otherwise release them as one burst. Its lateness reshapes the
    #: correlated bursts placement is about, so a scenario with a tighter SLO keeps it
    #: tighter (``live.max_late_s``; the run check's send-lateness limits follow it).
    max_send_late_ms: float = 10.0
    #: How much slower in time than its file this scenario runs (``sizing.scaled``):
    #: rates were multiplied by it and queueing durations divided by it.
    time_scale: float = 1.0
    #: The order publishers are handed to the controller (TOML ``publisher_order``;
    #: ``--publisher-order`` overrides it).
    publisher_order: PublisherOrder = PublisherOrder.block
    #: What the topic's bucket is profiled on (TOML ``profile_trace``).
    profile_trace: ProfileTrace = ProfileTrace.other_draw

    @property
    def rate(self) -> float:
        """Offered messages/s of the topic."""
        return math.fsum(c.count * c.rate for c in self.publishers)

    def specs(self) -> list[PublisherSpec]:
        """The workload's publishers, groups numbered across classes."""
        out: list[PublisherSpec] = []
        group = 0
        for c in self.publishers:
            for i in range(c.count):
                g = None
                if c.group_size:
                    if i % c.group_size == 0:
                        group += 1
                    g = f"g{group}"
                process = cast(Process, c.process)  # PublisherSpec checks it
                out.append(PublisherSpec(f"{c.prefix}{len(out)}", c.rate, process, c.batch, g))
        return out

    def placement_specs(self) -> list[PublisherSpec]:
        """``specs()`` in the order they are handed to the controller (``publisher_order``).
        The workload's schedule is built from ``specs()`` in either order, so that only the
        placement differs between the two."""
        return ordered(self.specs(), self.publisher_order, self.seed)

    def with_order(self, order: PublisherOrder | None) -> Scenario:
        """This scenario with publishers handed over in ``order`` (None: its own)."""
        return self if order is None else dataclasses.replace(self, publisher_order=order)


def available() -> list[str]:
    """Names of the scenarios shipped with SRTM."""
    return sorted(
        p.name.removesuffix(".toml")
        for p in resources.files(__package__).iterdir()
        if p.name.endswith(".toml")
    )


def load(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name, or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        text = path.read_text()
        where = str(path)
    else:
        res = resources.files(__package__) / f"{name_or_path}.toml"
        if not res.is_file():
            raise ValueError(
                f"no scenario {str(name_or_path)!r}; shipped: {', '.join(available())}"
            )
        text, where = res.read_text(), f"scenario {name_or_path}"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return parse(doc, where)


def parse(doc: dict[str, Any], where: str = "scenario") -> Scenario:
    """Check every field, naming the first one that is wrong."""
    known = set(Scenario.__dataclass_fields__) - {"publishers", "fit", "preload", "time_scale"}
    unknown = set(doc) - known - {"publishers", "fit", "preload"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    pubs = doc.get("publishers")
    if not isinstance(pubs, list) or not pubs:
        raise ValueError(f"{where}: publishers must be a non-empty array of tables")
    classes = tuple(_publisher_class(p, f"{where}: publishers[{i}]") for i, p in enumerate(pubs))
    fit_doc = doc.get("fit", {})
    fit = None if fit_doc is False else Fit(**_table(fit_doc, Fit, f"{where}: fit"))
    preload = tuple(
        Preload(**_table(p, Preload, f"{where}: preload[{i}]"))
        for i, p in enumerate(doc.get("preload", []))
    )
    fields = {k: v for k, v in doc.items() if k in known}
    choices = (("publisher_order", PublisherOrder, "publisher order"),
               ("profile_trace", ProfileTrace, "profile_trace"))  # fmt: skip
    for key, kind, label in choices:
        if key in fields:
            try:
                fields[key] = _choice(kind, label, fields[key])
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
    try:
        sc = Scenario(publishers=classes, fit=fit, preload=preload, **fields)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None
    _check(sc, where)
    return sc


def _table(doc: Any, cls: type, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be a table")
    unknown = set(doc) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    return doc


def _publisher_class(doc: Any, where: str) -> PublisherClass:
    c = PublisherClass(**_table(doc, PublisherClass, where))
    if not (isinstance(c.count, int) and c.count >= 1):
        raise ValueError(f"{where}.count must be an integer >= 1")
    if not (c.rate > 0 and math.isfinite(c.rate)):
        raise ValueError(f"{where}.rate must be > 0")
    if c.group_size < 0:
        raise ValueError(f"{where}.group_size must be >= 0")
    return c


def _check(sc: Scenario, where: str) -> None:
    if not is_valid_name(sc.topic):
        raise ValueError(f"{where}: topic {sc.topic!r} is not a valid NSQ name")
    positive = {"brokers": sc.brokers, "capacity": sc.capacity, "mcap": sc.mcap,
                "slo_p99_ms": sc.slo_p99_ms, "duration_s": sc.duration_s,
                "rate_factor": sc.rate_factor,
                "max_send_late_ms": sc.max_send_late_ms}  # fmt: skip
    for key, value in positive.items():
        if not (isinstance(value, int | float) and value > 0):
            raise ValueError(f"{where}: {key} must be > 0, got {value!r}")
    if sc.mcap > sc.capacity:
        raise ValueError(f"{where}: mcap ({sc.mcap}) cannot exceed capacity ({sc.capacity})")
    if sc.spread_ms < 0 or sc.warmup_s < 0:
        raise ValueError(f"{where}: spread_ms and warmup_s must be >= 0")
    for p in sc.preload:
        if not 1 <= p.broker <= sc.brokers:
            raise ValueError(f"{where}: preload broker {p.broker} is not in 1..{sc.brokers}")
    sc.specs()  # the publishers themselves (rates, processes, batches)
