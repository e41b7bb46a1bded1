"""One vocabulary: no two classes in the source tree share a name, so a name in a
traceback, a review or the docs means one thing (a placement input is a ``TopicSpec``,
the broker's live topic a ``Topic``)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from support import parse

SRC = Path(__file__).resolve().parent.parent / "src" / "srtm"


def class_sites(sources: dict[str, str]) -> dict[str, list[str]]:
    """Class name -> every ``path:line`` defining it (nested classes included)."""
    sites: dict[str, list[str]] = defaultdict(list)
    for path, text in sorted(sources.items()):
        for node in ast.walk(parse(text, filename=path)):
            if isinstance(node, ast.ClassDef):
                sites[node.name].append(f"{path}:{node.lineno}")
    return sites


def shared_names(sources: dict[str, str]) -> dict[str, list[str]]:
    return {name: where for name, where in class_sites(sources).items() if len(where) > 1}


def test_shared_names_are_found() -> None:
    sources = {
        "a.py": "class Topic:\n    class Inner: ...\n",
        "b.py": "class Other: ...\n\n\ndef f():\n    class Topic: ...\n",
        "c.py": "class Inner: ...\n",
    }
    assert shared_names(sources) == {
        "Inner": ["a.py:2", "c.py:1"],
        "Topic": ["a.py:1", "b.py:5"],
    }


def test_no_two_classes_share_a_name() -> None:
    sources = {str(p.relative_to(SRC.parent)): p.read_text() for p in SRC.rglob("*.py")}
    assert len(class_sites(sources)) > 100  # the walk saw the tree
    shared = shared_names(sources)
    listing = "\n".join(f"  {name}: {', '.join(where)}" for name, where in sorted(shared.items()))
    assert not shared, f"class names defined more than once under src/srtm:\n{listing}"
