"""How typer's rich help shows the commands: paragraphs unwrapped, flags without a type."""

from __future__ import annotations

import inspect
from typing import Any

import typer


def _unwrapped(text: str) -> str:
    """``text`` with each paragraph on one line (blank lines part paragraphs; a paragraph
    that starts with click's ``\\b`` keeps its lines)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def unwrap_help(group: typer.Typer) -> None:
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
            unwrap_help(sub.typer_instance)


def plain_flags() -> None:
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
