"""One configuration source per server: an options dataclass whose fields are its settings.

Each field declared with :func:`setting` is one setting under one name: field
``max_output_buffer_bytes`` is the flag ``--max-output-buffer-bytes``, the environment
variable ``SRTM_MAX_OUTPUT_BUFFER_BYTES`` (the server's prefix and the name) and the TOML key
``max_output_buffer_bytes``. Two fields ``X_host``/``X_port`` declared with
``address="X_address"`` are one setting, ``--X-address HOST:PORT``, as nsqd spells it.

:func:`resolve` fills the dataclass from the command line, the environment and a TOML table,
in that order of precedence, then the field's default; a bad value is a
:class:`SettingError` naming the setting where it was given. Pure: the caller reads the
environment and the file.
"""

from __future__ import annotations

import enum
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class SettingError(ValueError):
    """A bad value or an unknown key; ``where`` names it as the user wrote it (a flag, a
    variable, or FILE: key)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True, slots=True)
class Spec:
    """What a field's metadata says about its setting."""

    help: str
    #: Older names still accepted, as a flag and as a TOML key.
    aliases: tuple[str, ...] = ()
    #: The variable when it is not the server's prefix and the name (a cluster-wide one).
    env: str | None = None
    #: Older variable names still read.
    env_aliases: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    #: This field is the host or the port of this HOST:PORT setting.
    address: str | None = None


def setting(
    default: Any,
    help: str = "",
    *,
    aliases: tuple[str, ...] = (),
    env: str | None = None,
    env_aliases: tuple[str, ...] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    address: str | None = None,
) -> Any:
    """A dataclass field that is a setting. An address is two of them, the host field (with
    the help) then the port field, both given the address setting's name."""
    spec = Spec(help, aliases, env, env_aliases, minimum, maximum, address)
    return field(default=default, metadata={"setting": spec})


class Address:
    """The kind of a HOST:PORT setting (a host field and a port field)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of an options type, as every source names it."""

    name: str
    #: The option fields it fills: one, or an address's host and port.
    fields: tuple[str, ...]
    #: int, float, str, bool, Path, a StrEnum, tuple (of str) or Address.
    kind: type
    #: The field's default (an address's as HOST:PORT; None: none).
    default: Any
    spec: Spec
    #: Its variables, the current one first.
    env: tuple[str, ...]

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple("--" + n.replace("_", "-") for n in (self.name, *self.spec.aliases))

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.name, *self.spec.aliases)

    def parse(self, value: Any) -> dict[str, Any]:
        """The field values for ``value`` (a string from a flag or a variable, or a TOML
        value); ValueError says what is wrong with it."""
        if self.kind is Address:
            host, port = _address(value)
            return dict(zip(self.fields, (host, port), strict=True))
        parsed = _PARSERS.get(self.kind, _enum)(value, self.kind)
        if isinstance(parsed, int | float) and not isinstance(parsed, bool):
            _check_range(parsed, self.spec)
        return {self.fields[0]: parsed}


def settings(options_type: type, env_prefix: str) -> tuple[Setting, ...]:
    """The settings of ``options_type``, in field order. Every field it takes in its
    constructor must be a :func:`setting` (TypeError otherwise)."""
    hints = typing.get_type_hints(options_type)
    out: list[Setting] = []
    halves: dict[str, list[Field[Any]]] = {}
    for f in fields(options_type):
        if not f.init:
            continue  # derived from the settings
        spec = f.metadata.get("setting")
        if not isinstance(spec, Spec):
            raise TypeError(f"{options_type.__name__}.{f.name} is not declared with setting()")
        if spec.address:
            halves.setdefault(spec.address, []).append(f)
            if len(halves[spec.address]) == 2:
                out.append(_address_setting(spec.address, halves[spec.address], env_prefix))
            continue
        kind = _kind(hints[f.name])
        default = None if f.default is MISSING else f.default
        env = (spec.env or env_prefix + f.name.upper(), *spec.env_aliases)
        out.append(Setting(f.name, (f.name,), kind, default, spec, env))
    return tuple(out)


def _address_setting(name: str, pair: list[Field[Any]], env_prefix: str) -> Setting:
    host, port = pair
    spec = host.metadata["setting"]
    default = None if port.default is None else f"{host.default}:{port.default}"
    env = (spec.env or env_prefix + name.upper(), *spec.env_aliases)
    return Setting(name, (host.name, port.name), Address, default, spec, env)


def resolve(
    options_type: type[T],
    env_prefix: str,
    *,
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    file: Mapping[str, Any],
    file_name: str = "",
) -> T:
    """``options_type`` filled from ``cli`` (setting name or older name -> value, None: not
    given), then ``environ`` (an empty variable counts as unset), then ``file`` (a table read
    by :func:`read_table`), then the field defaults."""
    values: dict[str, Any] = {}
    for s in settings(options_type, env_prefix):
        value, where = _pick(s, cli, environ, file, file_name)
        if value is None:
            continue
        try:
            values.update(s.parse(value))
        except ValueError as exc:
            raise SettingError(where, str(exc)) from None
    return options_type(**values)


def _pick(
    s: Setting,
    cli: Mapping[str, Any],
    environ: Mapping[str, str],
    file: Mapping[str, Any],
    file_name: str,
) -> tuple[Any, str]:
    for key, flag in zip(s.keys, s.flags, strict=True):
        if cli.get(key) not in (None, [], ()):
            return cli[key], flag
    for var in s.env:
        if environ.get(var):
            return environ[var], var
    if s.name in file:
        return file[s.name], f"{file_name}: {s.name}"
    return None, ""


def read_table(path: Path, table: str, options_type: type, env_prefix: str) -> dict[str, Any]:
    """The settings in TOML file ``path``: its ``[table]`` table if it has one, else its top
    level; keys named like the settings (dashes allowed, older names too). Returns setting
    name -> value; SettingError for an unreadable file or unknown keys, naming them."""
    where = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingError(where, str(exc)) from None
    section = doc.get(table, doc)
    if not isinstance(section, dict):
        raise SettingError(where, f"[{table}] is not a table")
    names = {k: s.name for s in settings(options_type, env_prefix) for k in s.keys}
    unknown = sorted(k for k in section if k.replace("-", "_") not in names)
    if unknown:
        raise SettingError(where, f"unknown keys {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for key, value in section.items():
        name = names[key.replace("-", "_")]
        if name in out:
            raise SettingError(f"{where}: {key}", f"{name} is given twice")
        out[name] = value
    return out


# -- parsing, one function per kind ----------------------------------------------------------
def _kind(hint: Any) -> type:
    """The value type of a field's annotation (``X | None``: X)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is tuple:
        return tuple
    if not isinstance(hint, type):
        raise TypeError(f"no parser for settings of type {hint!r}")
    return hint


def _int(value: Any, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def _float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def _str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _path(value: Any, kind: type) -> Path:
    return Path(_str(value, kind))


_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")


def _bool(value: Any, _: type) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ValueError(f"{value!r} is not a boolean ({'/'.join(_TRUE)} or {'/'.join(_FALSE)})")


def _strings(value: Any, _: type) -> tuple[str, ...]:
    """A list from TOML or repeated flags; a string (a variable) holds them space-separated."""
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
        raise ValueError(f"{value!r} is not a list of strings")
    return tuple(items)


def _enum(value: Any, kind: type) -> Any:
    if not issubclass(kind, enum.Enum):
        raise TypeError(f"no parser for settings of type {kind!r}")
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise ValueError(f"{value!r} is not one of {choices}") from None


_PARSERS: dict[type, Any] = {
    int: _int,
    float: _float,
    str: _str,
    Path: _path,
    bool: _bool,
    tuple: _strings,
}


def _address(value: Any) -> tuple[str, int]:
    """HOST:PORT (an empty host: 127.0.0.1; port 0: any free port)."""
    host, sep, port = _str(value, str).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host or "127.0.0.1", int(port)


def _check_range(value: float, spec: Spec) -> None:
    if spec.minimum is not None and value < spec.minimum:
        raise ValueError(f"{value!r} is below the minimum {spec.minimum:g}")
    if spec.maximum is not None and value > spec.maximum:
        raise ValueError(f"{value!r} is above the maximum {spec.maximum:g}")
