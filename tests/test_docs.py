"""The documentation holds together: a short front door, links that resolve, and an
architecture page whose module table covers every module in the source tree and whose
dependency rule the imports obey."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support import parse

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
SRC = ROOT / "src" / "srtm"

# 150 until the quick start showed what it prints and how to stop what it starts (issue 34).
MAX_README_LINES = 165
SETUP_COMMANDS = ("make demo", "make test")

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_MODULE = re.compile(r"`(srtm(?:\.\w+)*)`")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked (links there are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = _CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file's headings define, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for match in _HEADING.finditer(_FENCE.sub("", path.read_text())):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(path: Path) -> list[str]:
    targets = _LINK.findall(without_code(path.read_text()))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def broken_link(source: Path, target: str) -> str | None:
    """Why ``target`` (as written in ``source``) does not resolve, or None if it does."""
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / file_part).resolve() if file_part else source
    if not dest.exists():
        return f"{target}: {shown(dest)} does not exist"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading in {shown(dest)} has the anchor #{anchor}"
    return None


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def source_modules() -> set[str]:
    """Dotted names of every module and package under src/srtm, from the file system."""
    names = set()
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.add(".".join(parts))
    return names


def module_table_names() -> set[str]:
    """Module names in the first column of the tables of architecture.md's module section."""
    text = ARCHITECTURE.read_text()
    start = text.index("## Modules and their dependencies")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    names = set()
    for line in section.splitlines():
        if line.startswith("|"):
            first_cell = line.split("|")[1]
            names.update(_MODULE.findall(first_cell))
    return names


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; at most {MAX_README_LINES}: move reference "
        "material to docs/"
    )


def test_readme_starts_with_the_two_setup_commands() -> None:
    text = README.read_text()
    first_block = re.search(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert first_block is not None, "README.md has no code block"
    before = text[: first_block.start()]
    assert not re.search(r"^##", before, re.M), "the setup commands must come before any section"
    assert len(before.splitlines()) <= 3, "the setup commands must come first, under the title"
    commands = [ln.split("#")[0].strip() for ln in first_block.group(1).splitlines()]
    assert [c for c in commands if c] == list(SETUP_COMMANDS)


def test_every_relative_link_resolves() -> None:
    problems = []
    checked = 0
    for path in markdown_files():
        for target in relative_links(path):
            checked += 1
            reason = broken_link(path, target)
            if reason:
                problems.append(f"{shown(path)}: {reason}")
    assert checked > 0, "no relative links found: the link pattern is broken"
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Some `code` heading\n\n[x](missing.md) [y](#some-code-heading)")
    assert relative_links(page) == ["missing.md", "#some-code-heading"]
    assert broken_link(page, "missing.md") is not None
    assert broken_link(page, "#some-code-heading") is None
    assert broken_link(page, "#nowhere") is not None


def test_every_module_is_in_the_architecture_module_table() -> None:
    modules = source_modules()
    assert "srtm.broker" in modules and "srtm.cli" in modules  # the walk found the tree
    missing = sorted(modules - module_table_names())
    assert not missing, (
        "modules without a row in docs/architecture.md's module table (say what each "
        "holds and where it sits in the layers):\n" + "\n".join(missing)
    )


def module_of(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The row of the packages table a module belongs to: ``srtm.X`` (a package or a
    top-level module), or ``srtm`` for the package's own ``__init__``."""
    return ".".join(module.split(".")[:2])


def imports_of(path: Path) -> set[str]:
    """Every ``srtm`` module a file imports, anywhere in it (functions and
    ``TYPE_CHECKING`` blocks included: a dependency for the types is still one)."""
    found = set()
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # a module, perhaps
    return {name for name in found if name.split(".")[0] == "srtm" and is_module(name)}


def is_module(name: str) -> bool:
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def allowed_imports() -> dict[str, set[str] | None]:
    """From the packages table: each row's units → what they may import (None: anything)."""
    text = ARCHITECTURE.read_text()
    start = text.index("### Packages")
    end = text.index("\n### ", start + 1)
    allowed: dict[str, set[str] | None] = {}
    for line in text[start:end].splitlines():
        cells = line.split("|")
        if not line.startswith("|") or len(cells) < 4:
            continue
        units = _MODULE.findall(cells[1])
        may = cells[3]
        targets: set[str] | None = None
        if "everything" not in may:
            names = re.findall(r"`([\w.]+)`", may)
            targets = {n if n.startswith("srtm") else f"srtm.{n}" for n in names}
        for unit in units:
            allowed[unit] = targets
    return allowed


def permitted(target: str, allowed: set[str]) -> bool:
    """``target`` is an allowed module, inside one, or the package that holds one."""
    return any(
        target == a or target.startswith(a + ".") or a.startswith(target + ".") for a in allowed
    )


def test_imports_follow_the_dependency_rule() -> None:
    allowed = allowed_imports()
    assert "srtm.ratelimit" in allowed and allowed["srtm.cli"] is None  # the table parsed
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        module = module_of(path)
        unit = unit_of(module)
        if unit not in allowed:
            problems.append(f"{module}: its package {unit} has no row in the packages table")
            continue
        may = allowed[unit]
        if may is None:
            continue
        for target in sorted(imports_of(path)):
            if unit_of(target) != unit and not permitted(target, may):
                problems.append(f"{module} imports {target}, which {unit} may not import")
    assert not problems, "imports against docs/architecture.md's rule:\n" + "\n".join(problems)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_find_cycle_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles_between_modules() -> None:
    modules = {module_of(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        # A package's __init__ re-exporting its modules is no cycle with them.
        graph[module] = {
            t
            for t in imports_of(path)
            if t in modules and t != module and not module.startswith(t + ".")
        }
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


RESULTS = DOCS / "results"
#: How far into a results page its provenance line may be: the page opens with it.
PROVENANCE_WITHIN_LINES = 12
_PROVENANCE = re.compile(r"^Command: `[^`]+`.*? · revision [0-9a-f]{7,40}\b.*? · machine: \S", re.M)


def provenance_problem(path: Path) -> str | None:
    """Why a results page does not open with its provenance line, or None if it does.

    The line reads ``Command: `...` · revision abc1234 · machine: ...``: the command
    that gives the page's first (current) table, the revision it was measured at and
    the machine. It comes in the page's first lines, before any ``##`` section, so
    the current figures lead and what came before sits below, under ``## History``."""
    lines = path.read_text().splitlines()
    for line in lines[:PROVENANCE_WITHIN_LINES]:
        if line.startswith("## "):
            break
        if _PROVENANCE.match(line):
            return None
    return (
        f"{shown(path)}: no line 'Command: `...` · revision abc1234 · machine: ...' in "
        f"its first {PROVENANCE_WITHIN_LINES} lines, before its first '##' section"
    )


def results_pages() -> list[Path]:
    return [p for p in sorted(RESULTS.glob("*.md")) if p.name != "README.md"]


def test_every_results_page_opens_with_command_revision_and_machine() -> None:
    pages = results_pages()
    assert len(pages) >= 10, "docs/results/ holds fewer pages than it did: the glob is wrong"
    problems = [p for p in map(provenance_problem, pages) if p]
    assert not problems, "results pages without their provenance up front:\n" + "\n".join(problems)


def test_every_results_page_is_in_the_index() -> None:
    linked = {t.partition("#")[0] for t in relative_links(RESULTS / "README.md")}
    missing = [p.name for p in results_pages() if p.name not in linked]
    assert not missing, "docs/results/README.md has no row for: " + ", ".join(missing)


def test_provenance_check_sees_a_page_without_it(tmp_path: Path) -> None:
    good = "Command: `srtm x` · revision b872b6a · machine: 2-core VM (nproc 2)"
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n{good}\n\n| a |\n|---|\n| 1 |\n")
    assert provenance_problem(page) is None
    for bad in (
        "Command: `srtm x` · revision not stated · machine: 2-core VM",  # no revision
        "Command: srtm x · revision b872b6a · machine: 2-core VM",  # no backticks
        "Command: `srtm x` · revision b872b6a",  # no machine
    ):
        page.write_text(f"# Page\n\n{bad}\n")
        assert provenance_problem(page) is not None, bad
    page.write_text(f"# Page\n\n## First run\n\n{good}\n")  # after a section: too late
    assert provenance_problem(page) is not None
    page.write_text("# Page\n" + "\n" * PROVENANCE_WITHIN_LINES + good + "\n")
    assert provenance_problem(page) is not None


def defined_names(module: str) -> set[str]:
    """Top-level names a module defines or imports (what ``module.NAME`` may name)."""
    path = SRC.parent.joinpath(*module.split("."))
    path = path / "__init__.py" if (path / "__init__.py").is_file() else path.with_suffix(".py")
    names: set[str] = set()
    for node in parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def stale_names(text: str) -> list[str]:
    """Every `srtm.…` name in ``text`` that is neither a module nor a name one defines."""
    stale = []
    # Not a JSON path in a document (`srtm.topics[].bound`): those are fields.
    for name in sorted(set(re.findall(r"`(srtm(?:\.\w+)+)(?![\w\[])", text))):
        parts = name.split(".")
        module = next(
            (".".join(parts[:i]) for i in range(len(parts), 0, -1)
             if is_module(".".join(parts[:i]))),
            "",
        )  # fmt: skip
        rest = parts[len(module.split(".")) :] if module else parts
        if not module or (rest and rest[0] not in defined_names(module)):
            stale.append(name)
    return stale


def test_every_srtm_name_in_the_docs_exists() -> None:
    """Modules move (issue 30): a page naming one that is gone sends its reader nowhere."""
    stale = {
        str(p.relative_to(ROOT)): found
        for p in markdown_files()
        if (found := stale_names(p.read_text()))
    }
    assert not stale, f"names in the docs that src/srtm does not have: {stale}"


def test_stale_name_check_sees_a_moved_module() -> None:
    assert stale_names("see `srtm.broker.diskqueue` and `srtm.broker.broker.Nope`") == [
        "srtm.broker.broker.Nope",
        "srtm.broker.diskqueue",
    ]
    assert stale_names("`srtm.broker.broker.Broker` in `srtm.broker`, `srtm.topics[].x`") == []
