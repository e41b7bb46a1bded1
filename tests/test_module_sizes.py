"""The large scale stays readable (issue 30): no file so long, and no class so big, that
it holds several concepts again; the controller stays a facade over its concept modules;
the NSQ magic is written once."""

from __future__ import annotations

import ast
from pathlib import Path

from support import parse

SRC = Path(__file__).resolve().parent.parent / "src" / "srtm"

MAX_FILE_LINES = 800
MAX_CLASS_LINES = 500
#: The controller's package: one concept per module, each small.
MAX_CONTROL_FILE_LINES = 500
MAX_CONTROLLER_LINES = 250


def line_count(text: str) -> int:
    return text.count("\n")


def class_sizes(text: str, path: str) -> dict[str, int]:
    """Class name -> its lines, nested classes included."""
    return {
        node.name: (node.end_lineno or node.lineno) - node.lineno + 1
        for node in ast.walk(parse(text, filename=path))
        if isinstance(node, ast.ClassDef)
    }


def sources() -> dict[str, str]:
    found = {str(p.relative_to(SRC.parent)): p.read_text() for p in SRC.rglob("*.py")}
    assert len(found) > 100  # the walk saw the tree
    return found


def test_no_source_file_is_over_800_lines() -> None:
    long = {p: n for p, t in sources().items() if (n := line_count(t)) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_class_is_over_500_lines() -> None:
    big = {
        f"{p}:{name}": n
        for p, t in sources().items()
        for name, n in class_sizes(t, p).items()
        if n > MAX_CLASS_LINES
    }
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"


def test_the_controller_is_a_facade_over_small_modules() -> None:
    control = {p: t for p, t in sources().items() if p.startswith("srtm/control/")}
    long = {p: n for p, t in control.items() if (n := line_count(t)) > MAX_CONTROL_FILE_LINES}
    assert not long, f"files under control/ over {MAX_CONTROL_FILE_LINES} lines: {long}"
    state = "srtm/control/state.py"
    assert class_sizes(control[state], state)["Controller"] <= MAX_CONTROLLER_LINES


def test_the_nsq_magic_is_written_once() -> None:
    places = [p for p, t in sources().items() for _ in range(t.count('b"  V2"'))]
    assert places == ["srtm/protocol/parser.py"]


def test_sizes_are_measured() -> None:
    text = "class A:\n    x = 1\n\n    class B:\n        y = 2\n"
    assert class_sizes(text, "t.py") == {"A": 5, "B": 2}
    assert line_count(text) == 5
