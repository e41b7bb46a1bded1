"""Every command's ``--help`` as a terminal shows it, at 80 and 120 columns: flags shown
without a type (they take no value), and prose wrapped by rich to the width, never broken
where the source happened to wrap it."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from srtm.cli import app

runner = CliRunner()
WIDTHS = (80, 120)


def command_paths() -> list[tuple[str, ...]]:
    """Every command and group under ``srtm``, as the words that name it."""

    def walk(command: object, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield path
        names = getattr(command, "commands", {})
        for name in sorted(names):
            yield from walk(names[name], (*path, name))

    return list(walk(typer.main.get_command(app), ()))


def render(path: tuple[str, ...], width: int) -> str:
    result = runner.invoke(
        app, [*path, "--help"], env={"COLUMNS": str(width), "TERM": "dumb", "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.output
    return result.output


def ragged(output: str, width: int) -> list[str]:
    """Where the help's prose (the description above the panels, and each command's text in
    a Commands panel) breaks a line although the next line's first word would have fitted
    on it: a line break that came from the source, not from rich."""
    lines = [line.rstrip() for line in output.splitlines()]
    found = []
    for a, b in itertools.pairwise(lines):
        # The description: " text", one column of padding each side.
        prose = a.startswith(" ") and b.startswith(" ") and bool(a.strip() and b.strip())
        if prose and not a.lstrip().startswith("Usage:"):
            word = b.split()[0]
            if len(a) + 1 + len(word) <= width - 1:
                found.append(f"{a.strip()!r} / {b.strip()!r}")
    found += ragged_commands(lines)
    return found


def ragged_commands(lines: list[str]) -> list[str]:
    """The same, inside a Commands panel: each entry's text is the panel's last column."""
    found = []
    inside = False
    start = 0
    previous: str | None = None
    for line in lines:
        if line.startswith("╭─ Commands"):
            inside, previous = True, None
            continue
        if not inside:
            continue
        if line.startswith("╰"):
            inside = False
            continue
        edge = line.rindex("│") - 1  # one column of padding before the border
        entry = re.match(r"│ (\S+)(\s+)(\S.*?)\s*│$", line)
        if entry:  # an entry's first line: its name, then its text
            start = 2 + len(entry[1]) + len(entry[2])
            previous = entry[3]
            continue
        text = line[start:edge].rstrip()
        if previous is not None and text:
            word = text.split()[0]
            if start + len(previous) + 1 + len(word) <= edge:
                found.append(f"{previous!r} / {text!r}")
        previous = text
    return found


def test_the_walk_finds_every_command() -> None:
    paths = command_paths()
    assert ("place",) in paths and ("experiment", "run") in paths
    assert ("utility", "optimize") in paths and len(paths) > 20


@pytest.mark.parametrize("width", WIDTHS)
def test_flags_show_no_type_and_options_keep_theirs(width: int) -> None:
    for path in command_paths():
        output = render(path, width)
        assert "<bool>" not in output, (path, output)
    place = render(("place",), width)
    assert re.search(r"│ --json\s{3,}Print JSON", place), place
    assert "<int>" in place  # --seed takes a value, and still says of which type


@pytest.mark.parametrize("width", WIDTHS)
def test_help_prose_is_wrapped_by_rich_not_by_the_source(width: int) -> None:
    problems = {}
    for path in command_paths():
        if found := ragged(render(path, width), width):
            problems[" ".join(("srtm", *path))] = found
    assert not problems, problems


def test_the_ragged_check_sees_a_break_from_the_source() -> None:
    """The checker itself: a description wrapped short, and a Commands entry broken early."""
    text = (
        " Usage: srtm x [OPTIONS]\n\n"
        " One paragraph wrapped\n"
        " at thirty columns.\n"
        "╭─ Commands ──────────────────────────────────────╮\n"
        "│ demo   The main job: a short line               │\n"
        "│        that went on here.                       │\n"
        "╰─────────────────────────────────────────────────╯\n"
    )
    assert len(ragged(text, 80)) == 2
    full = (
        " Usage: srtm x [OPTIONS]\n\n"
        " One paragraph wrapped at thirty columns.\n"
        "╭─ Commands ──────────────────────────────────────╮\n"
        "│ demo   The main job: a short line that went on  │\n"
        "│        here.                                    │\n"
        "╰─────────────────────────────────────────────────╯\n"
    )
    assert ragged(full, 80) == []
