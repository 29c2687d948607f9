"""The parameter rule: no function or method in the product's packages takes more than 6
parameters (``self``/``cls`` not counted, keyword-only ones counted): values that travel
together travel as one object (a dataclass).

    python -m infra.lint_params     # exit 1 listing every function over the limit

A command's or a route's handler is its interface, not a call: each of its parameters is
an option of the command line or of the HTTP request (a default of ``typer.Option``,
``typer.Argument``, FastAPI's ``Query``/``Depends``/``Header``/``Body``, or a shared
option such as ``ConfigOpt``), so such a function is not counted."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from infra.lint_length import PACKAGES, ROOT, SKIPPED

LIMIT = 6
_INTERFACE = {"Option", "Argument", "Query", "Depends", "Header", "Body", "Path", "Form"}


def parameters(root: Path = ROOT) -> Iterator[tuple[int, str, str]]:
    """(parameters, file:line, name) of every function in the packages."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(SKIPPED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if not _interface(node.args):
                        yield _count(node.args), f"{rel}:{node.lineno}", node.name


def _count(args: ast.arguments) -> int:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def _interface(args: ast.arguments) -> bool:
    """A command's or a route's handler: a parameter's default names an option."""
    for default in (*args.defaults, *args.kw_defaults):
        target = default.func if isinstance(default, ast.Call) else default
        name = (
            target.attr
            if isinstance(target, ast.Attribute)
            else target.id
            if isinstance(target, ast.Name)
            else ""
        )
        if name in _INTERFACE or name.endswith("Opt"):
            return True
    return False


def too_many(root: Path = ROOT) -> list[str]:
    return [f"{where} {name} takes {n}" for n, where, name in parameters(root) if n > LIMIT]


if __name__ == "__main__":
    found = too_many()
    print("\n".join(found))
    sys.exit(1 if found else 0)
