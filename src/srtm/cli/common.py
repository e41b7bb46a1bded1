"""What the command groups share: consoles, the error line, JSON files named by a flag."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from srtm.jsondoc import parse as parse_json


def wide_console(width: int) -> Console:
    """stdout's console; ``width`` columns when piped, where rich would fall back to 80,
    too narrow for the tables."""
    return Console(width=None if Console().is_terminal else width)


def fail(message: str) -> typer.Exit:
    """Prints ``error: message`` (rich markup) on stderr; the exit (status 2) to raise."""
    Console(stderr=True).print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


def read_json(path: Path, flag: str) -> object:
    """The JSON document in ``path``; a usage error naming ``flag`` when it cannot be read
    or is not JSON."""
    try:
        return parse_json(path.read_bytes(), str(path))
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=flag) from exc
    except ValueError as exc:  # "PATH is not JSON: … at line L column C"
        raise typer.BadParameter(str(exc), param_hint=flag) from exc
