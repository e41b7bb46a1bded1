"""The README and the docs run as written.

Every fenced block of README.md and docs/**/*.md is tagged: ``sh`` and ``python`` blocks
are run, in order, each document's in one shell as a user pasting them into one terminal
would (``python`` blocks by ``.venv/bin/python``); ``text`` and ``json`` blocks are never
run. A run block preceded by ``<!-- not run: REASON -->`` is not run; a ``text`` block
preceded by ``<!-- output -->`` is what the run block before it prints, checked (``...``
alone on a line stands for any lines, inside a line for any text). The convention is
described in docs/development.md.

Each document runs in a scratch directory where ``.venv`` (the virtualenv running pytest)
and ``examples`` resolve as in the repository's root, with ``TMPDIR`` inside the test's
own directory. The fixed ports the text gives are waited for until free; whatever a
document starts it must stop, and the only thing it may write into the directory it runs
from is ``out/`` (ignored by git)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import eventually

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)

#: Fences that run, and fences that never do (data, synopses, diagrams, output).
RUN_LANGS = ("sh", "python")
QUIET_LANGS = ("text", "json")

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"^<!--\s*(not run|output)\s*(?::\s*(.*?))?\s*-->$")
_SENTINEL = "@@srtm-docs-block-{}@@"
_PORT = re.compile(r"\b127\.0\.0\.1:(\d{2,5})\b")

#: Documents whose blocks take over ~5 s: clusters started and stopped, simulations.
SLOW = {
    "README.md": "a cluster, two simulations",
    "docs/clients.md": "a cluster of two brokers, 2 s of publishing",
}
#: What a document's blocks may leave in the directory they run from (besides the links).
MAY_WRITE = {"out"}
#: Patience for one document's blocks together, and for its ports to be free: under
#: pytest-timeout's 300 s, so that a session that hangs fails with its own output.
SESSION_TIMEOUT_S = 230.0
PORTS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its tag and text, and the marker before it."""

    doc: str
    line: int
    lang: str
    body: str
    #: "not run" or "output" (the HTML comment right before the fence), or None.
    marker: str | None = None
    reason: str = ""

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and self.marker != "not run"

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Step:
    """A block that runs, and the output the text shows for it (None: none shown)."""

    block: Block
    expected: str | None


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT))


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse_blocks(text: str, doc: str) -> list[Block]:
    blocks = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rpartition("\n")[2].strip()
        marker = _MARKER.match(before)
        blocks.append(
            Block(
                doc=doc,
                line=text.count("\n", 0, m.start()) + 1,
                lang=m.group(1).strip().split(" ")[0],
                body=m.group(2),
                marker=marker.group(1) if marker else None,
                reason=(marker.group(2) or "") if marker else "",
            )
        )
    return blocks


def convention_problems(blocks: list[Block]) -> list[str]:
    """What in a document's fences breaks the convention (module docstring)."""
    problems = []
    last_run: Block | None = None
    for b in blocks:
        if b.lang not in RUN_LANGS + QUIET_LANGS:
            tags = ", ".join(RUN_LANGS + QUIET_LANGS)
            problems.append(
                f"{b.where}: a fence tagged {b.lang!r}: tag it one of {tags} (sh and python "
                "blocks run; a synopsis or a diagram is text)"
            )
        if b.marker == "not run" and (b.lang not in RUN_LANGS or not b.reason):
            problems.append(
                f"{b.where}: <!-- not run: REASON --> goes before an sh or python fence and "
                "gives its reason"
            )
        if b.marker == "output":
            if b.lang != "text":
                problems.append(f"{b.where}: <!-- output --> goes before a text fence")
            elif last_run is None or not last_run.runs:
                problems.append(f"{b.where}: output shown for no block that runs")
        if b.lang in RUN_LANGS:
            last_run = b
        elif b.marker == "output":
            last_run = None  # one output block per run block
    return problems


def steps_of(blocks: list[Block]) -> list[Step]:
    """The blocks that run, in order, each with the output shown right after it."""
    steps: list[Step] = []
    for b in blocks:
        if b.runs:
            steps.append(Step(b, None))
        elif b.marker == "output" and steps and steps[-1].expected is None:
            steps[-1] = Step(steps[-1].block, b.body)
    return steps


def document(path: Path) -> list[Block]:
    return parse_blocks(path.read_text(), shown(path))


def documents_that_run() -> list[str]:
    return [shown(p) for p in markdown_files() if steps_of(document(p))]


# -- comparing output --------------------------------------------------------------------------
def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def output_pattern(expected: str) -> re.Pattern[str]:
    """``expected`` as a pattern: a line ``...`` matches any lines (none too), ``...`` in
    a line any text; trailing spaces and blank lines at either end do not count."""
    parts = []
    for line in _lines(expected):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def output_matches(expected: str, actual: str) -> bool:
    text = "".join(line + "\n" for line in _lines(actual))
    return output_pattern(expected).fullmatch(text) is not None


# -- running a document ------------------------------------------------------------------------
def script(steps: list[Step]) -> str:
    """One shell script: each block after a sentinel line, stopping at the first failure."""
    parts = ["set -e"]
    for i, step in enumerate(steps):
        parts.append(f"printf '\\n%s\\n' '{_SENTINEL.format(i)}'")
        if step.block.lang == "python":
            parts.append(
                f".venv/bin/python - <<'SRTM_DOCS_PYTHON'\n{step.block.body}SRTM_DOCS_PYTHON"
            )
        else:
            parts.append(step.block.body.rstrip("\n"))
    parts.append(f"printf '\\n%s\\n' '{_SENTINEL.format('end')}'")
    return "\n".join(parts) + "\n"


def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A directory to run from, where ``.venv`` and ``examples`` resolve as in the
    repository's root, and the environment: TMPDIR inside the test's directory, no SRTM_
    settings or forced colours from the caller's."""
    srtm = VENV / "bin" / "srtm"
    if not os.access(srtm, os.X_OK):
        pytest.fail(f"the docs run .venv/bin/srtm: {srtm} is missing (pip install -e .)")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(VENV)
    (cwd / "examples").symlink_to(ROOT / "examples")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    drop = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRTM_") and k not in drop}
    env["TMPDIR"] = str(tmp)
    return cwd, env


def busy_ports(ports: set[int]) -> list[int]:
    busy = []
    for port in sorted(ports):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command (state first, then ppid, pgrp, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def end_group(pgid: int) -> None:
    """SIGTERM what is left of the group, then SIGKILL what outlives 10 s of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)


@dataclass
class Session:
    rc: int
    outputs: list[str]
    stderr: str
    #: Processes the blocks left running (killed since).
    left: list[int]


def run_session(steps: list[Step], cwd: Path, env: dict[str, str]) -> Session:
    ports = {int(p) for s in steps for p in _PORT.findall(s.block.body)}
    eventually.blocking(
        lambda: busy_ports(ports),
        f"ports {sorted(ports)} free for the blocks",
        until=lambda busy: not busy,
        timeout=PORTS_TIMEOUT_S,
        interval=0.2,
    )
    path = cwd.parent / "blocks.sh"
    path.write_text(script(steps))
    # Files, not pipes: a process the blocks leave behind would hold a pipe open.
    with (cwd.parent / "stdout").open("w+") as out, (cwd.parent / "stderr").open("w+") as err:
        proc = subprocess.Popen(
            ["bash", str(path)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: what the blocks start is found
        )
        timed_out = False
        try:
            proc.wait(timeout=SESSION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            left = group_members(proc.pid)
            end_group(proc.pid)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        pytest.fail(
            f"the blocks ran over {SESSION_TIMEOUT_S:g} s:\n{stdout[-3000:]}\n{stderr[-3000:]}"
        )
    chunks = re.split(r"\n?" + re.escape(_SENTINEL).replace(r"\{\}", r"(\w+)") + r"\n", stdout)
    # chunks: [before, "0", output 0, "1", output 1, ..., "end", after]
    outputs = [chunks[i + 1] for i in range(1, len(chunks) - 1, 2) if chunks[i] != "end"]
    return Session(proc.returncode, outputs, stderr, left)


def check_session(steps: list[Step], session: Session) -> None:
    ran = len(session.outputs)
    if session.rc != 0:
        step = steps[min(ran, len(steps)) - 1]
        pytest.fail(
            f"{step.block.where}: the block failed (exit {session.rc}); it printed:\n"
            f"{session.outputs[-1] if session.outputs else ''}\nstderr:\n{session.stderr[-4000:]}"
        )
    assert ran == len(steps), f"{ran} of {len(steps)} blocks ran:\n{session.stderr[-4000:]}"
    for step, actual in zip(steps, session.outputs, strict=True):
        if step.expected is not None and not output_matches(step.expected, actual):
            pytest.fail(
                f"{step.block.where}: the output the text shows:\n{step.expected}\n"
                f"is not what the block printed:\n{actual}\nstderr:\n{session.stderr[-2000:]}"
            )
    assert not session.left, (
        f"the blocks left processes running ({session.left}): the text must say how to stop "
        "what it starts, in a block that runs"
    )


def left_in(cwd: Path) -> list[str]:
    return sorted(p.name for p in cwd.iterdir() if p.name not in {".venv", "examples"})


# -- the tests ---------------------------------------------------------------------------------
def test_every_fence_follows_the_convention() -> None:
    problems = []
    for path in markdown_files():
        problems += convention_problems(document(path))
    assert not problems, "fences against the convention (docs/development.md):\n" + "\n".join(
        problems
    )


def test_the_readme_and_docs_have_blocks_that_run() -> None:
    docs = documents_that_run()
    assert {"README.md", "docs/clients.md"} <= set(docs), docs
    assert set(SLOW) <= set(docs), "SLOW names a document with no block that runs"


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(d, marks=[pytest.mark.slow] if d in SLOW else [], id=d)
        for d in documents_that_run()
    ],
)
def test_document_runs_as_written(doc: str, tmp_path: Path) -> None:
    steps = steps_of(document(ROOT / doc))
    cwd, env = scratch(tmp_path)
    check_session(steps, run_session(steps, cwd, env))
    stray = [name for name in left_in(cwd) if name not in MAY_WRITE]
    assert not stray, f"the blocks wrote {stray} where they ran (the repository's root)"


@pytest.mark.slow
def test_quick_start_pasted_twice_in_a_row(tmp_path: Path) -> None:
    """The README's cluster, started, used and stopped, then all of it again in the same
    shell: the second run starts afresh (no 'topic exists', no port in use)."""
    steps = steps_of(document(ROOT / "README.md"))
    start, stop = steps[0], steps[1]
    assert "srtm controller" in start.block.body and "kill" in stop.block.body, (
        "the README's first two blocks that run start and stop its cluster"
    )
    assert start.expected is not None, "the quick start shows its output"
    cwd, env = scratch(tmp_path)
    check_session([start, stop, start, stop], run_session([start, stop, start, stop], cwd, env))
    assert not left_in(cwd)


# -- the harness itself ------------------------------------------------------------------------
def test_blocks_markers_and_outputs_are_parsed() -> None:
    text = (
        "# T\n\n```sh\necho a\n```\n\n<!-- output -->\n```text\na\n```\n\n"
        "<!-- not run: needs a GPU -->\n```sh\nmake gpu\n```\n\n```json\n{}\n```\n"
        "```python\nprint(1)\n```\n"
    )
    blocks = parse_blocks(text, "t.md")
    assert [(b.line, b.lang, b.marker) for b in blocks] == [
        (3, "sh", None), (8, "text", "output"), (13, "sh", "not run"), (17, "json", None),
        (20, "python", None),
    ]  # fmt: skip
    assert blocks[2].reason == "needs a GPU"
    assert convention_problems(blocks) == []
    steps = steps_of(blocks)
    assert [(s.block.line, s.expected) for s in steps] == [(3, "a\n"), (20, None)]


def test_convention_problems_are_named() -> None:
    text = (
        "```bash\nls\n```\n<!-- not run: -->\n```sh\nls\n```\n"
        "<!-- output -->\n```text\nx\n```\n```\ndiagram\n```\n"
    )
    problems = convention_problems(parse_blocks(text, "t.md"))
    assert len(problems) == 4, problems
    assert "t.md:1: a fence tagged 'bash'" in problems[0]
    assert "t.md:5: <!-- not run: REASON -->" in problems[1]
    assert "t.md:9: output shown for no block that runs" in problems[2]
    assert "t.md:12: a fence tagged ''" in problems[3]


def test_output_matching_with_ellipses() -> None:
    assert output_matches("a\nb\n", "\na  \nb\n\n")
    assert not output_matches("a\nb\n", "a\nc\n")
    assert not output_matches("a\n", "a\nb\n")
    assert output_matches("...\nb\n", "x\ny\nb\n")
    assert output_matches("...\nb\n", "b\n")
    assert output_matches('{"id": "1", ...}\n', '{"id": "1", "mcap": 3}\n')
    assert not output_matches('{"id": "1", ...}\n', '{"id": "2", "mcap": 3}\n')
    assert output_matches("a\n...\n", "a\nb\nc\n")
    assert not output_matches("a...\n", "a\nb\n")  # within a line only


def test_a_session_reports_the_failing_block_and_what_was_left(tmp_path: Path) -> None:
    blocks = parse_blocks("```sh\necho one\n```\n```sh\nfalse\necho never\n```\n", "t.md")
    steps = steps_of(blocks)
    cwd, env = scratch(tmp_path)
    session = run_session(steps, cwd, env)
    assert session.rc == 1 and session.outputs == ["one\n", ""]
    with pytest.raises(pytest.fail.Exception, match=r"t\.md:4: the block failed"):
        check_session(steps, session)

    left = run_session(steps_of(parse_blocks("```sh\nsleep 60 &\n```\n", "t.md")), cwd, env)
    assert left.rc == 0 and len(left.left) == 1
    assert not alive(left.left[0]), "the session's leftovers are ended"
