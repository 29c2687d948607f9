"""The function-length rule: no function or method in the product's packages runs past
60 lines (decorators included), so that each reads in one screen.

    python -m infra.lint_length            # exit 1 listing every function over the limit
    python -m infra.lint_length --top 10   # the longest ones, whatever their length

Migrations (generated, append-only) and the sample servers are not product code."""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("artemis", "workflows", "activities", "starter", "workers")
SKIPPED = ("artemis/migrations/",)
LIMIT = 60


def functions(root: Path = ROOT) -> Iterator[tuple[int, str, str]]:
    """(lines, file:line, qualified name) of every function in the packages."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(SKIPPED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            yield from _walk(tree, rel, "")


def _walk(node: ast.AST, rel: str, prefix: str) -> Iterator[tuple[int, str, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
            end = child.end_lineno or child.lineno
            yield end - start + 1, f"{rel}:{child.lineno}", prefix + child.name
            yield from _walk(child, rel, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _walk(child, rel, f"{prefix}{child.name}.")
        else:
            yield from _walk(child, rel, prefix)


def too_long(root: Path = ROOT, limit: int = LIMIT) -> list[tuple[int, str, str]]:
    return sorted((f for f in functions(root) if f[0] > limit), reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, help="print the N longest functions and exit 0")
    args = ap.parse_args()
    if args.top:
        for lines, where, name in sorted(functions(), reverse=True)[: args.top]:
            print(f"{lines:4d}  {where}  {name}")
        return 0
    over = too_long()
    for lines, where, name in over:
        print(f"{where}: {name} is {lines} lines (limit {LIMIT})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
