"""The code points only at what a clone of the repository holds, and tells no release
history: no comment or docstring cites a specification section or a design document from
outside the repository (the docs/ files are the place for that), names an issue number,
or says which build a piece of code came from — it says why the code is as it is.

Pointers to documents outside the repository are refused on every line, strings
included. History and issue numbers are refused in comments, docstrings and other bare
string statements, and issue numbers in function and class names: a message the code
prints about "this build" (the running one) or test data shaped like an issue tracker's
is not a comment.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("artemis", "workflows", "activities", "starter", "workers", "infra", "bench", "tests")
SELF = Path(__file__).resolve()

# Documents a clone does not have, wherever they are named.
OUTSIDE = re.compile(r"SPEC §|SPEC\.md|seed 00|seeds/|/work/shared")
# Release history and issue numbers, in what a reader takes for prose about the code.
HISTORY = re.compile(r"(?i:this build|earlier build)|\b[Ii]ssue\s*#?\d+")
NAMED_ISSUE = re.compile(r"[Ii]ssue_?\d+")


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.resolve() != SELF and ".venv" not in path.parts:
                yield path


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """Each line of a comment, a docstring or another bare string statement."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            end = node.end_lineno or node.lineno
            for n in range(node.lineno, end + 1):
                yield n, lines[n - 1]


def named_issues(text: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if NAMED_ISSUE.search(node.name):
                yield node.lineno, node.name


def scan(text: str) -> list[tuple[int, str]]:
    """The offending lines of one file's text: (line number, stripped line or name)."""
    found = {
        (n, line.strip())
        for n, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE.search(line)
    }
    # Prose and names are lines of the text: a text with no match anywhere has none in
    # them, and needs no parse (the parse is most of the scan's time).
    if HISTORY.search(text):
        found |= {(n, line.strip()) for n, line in prose_lines(text) if HISTORY.search(line)}
    if NAMED_ISSUE.search(text):
        found |= set(named_issues(text))
    return sorted(found)


def hits(path: Path) -> list[str]:
    rel = path.relative_to(ROOT)
    return [f"{rel}:{n}: {line}" for n, line in scan(path.read_text(encoding="utf-8"))]


def test_the_scan_sees_every_package() -> None:
    for package in PACKAGES:
        assert any((ROOT / package).rglob("*.py")), package


def test_the_patterns_catch_what_they_are_for() -> None:
    text = (
        '"""Retries (SPEC §4 "Outages"), as seed 004 says."""\n'
        "x = 1  # a checkpoint of an earlier build\n"
        "y = 'runs wait for a worker of this build'  # a message, not prose\n"
        "def test_issue_37_is_fixed():\n"
        '    """Fixed for Issue #35."""\n'
    )
    assert [n for n, _ in scan(text)] == [1, 2, 4, 5]


# Files besides the code: configuration, build, manifests and docs.
TEXTS = ("Makefile", "pyproject.toml", "mkdocs.yml", "README.md", "CHANGELOG.md")
TEXT_GLOBS = (("infra", "*.yaml"), ("infra", "*.yml"), ("docs", "*.md"), (".ci", "*"))


def texts() -> Iterator[Path]:
    yield from (ROOT / name for name in TEXTS if (ROOT / name).exists())
    for folder, pattern in TEXT_GLOBS:
        yield from (p for p in sorted((ROOT / folder).rglob(pattern)) if p.is_file())


def test_no_outside_documents_or_build_history_in_the_other_files() -> None:
    """Configuration, build files, manifests and docs: no document outside the repo on
    any line, and no release history in a ``#`` comment."""
    found = []
    for path in texts():
        rel = path.relative_to(ROOT)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            comment = line.partition("#")[2] if path.suffix != ".md" else ""
            if OUTSIDE.search(line) or HISTORY.search(comment):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n" + "\n".join(found)


def test_no_outside_documents_issue_numbers_or_build_history_in_the_code() -> None:
    found = [hit for path in sources() for hit in hits(path)]
    assert not found, "\n" + "\n".join(found)
