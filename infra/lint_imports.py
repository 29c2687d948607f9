"""The import rules: no circle among the product's modules, and the layers one way.

    python -m infra.lint_imports    # exit 1 naming every circle and every import across a layer

Every import counts: at the top, inside a function, under ``TYPE_CHECKING``. A loop that
only a function-level or a type-only import closes still says that a type or a call sits
in the wrong module. The layers: the domain (``artemis``) imports neither the dev stack
(``infra``) nor a worker, an activity or a workflow; the starter (API, CLI) imports
neither a worker nor the dev stack."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("artemis", "workflows", "activities", "starter", "workers", "infra", "artemis_samples")
# package → the packages it must never import
FORBIDDEN = {
    "artemis": ("infra", "workers", "activities", "workflows", "starter"),
    "starter": ("infra", "workers"),
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages, by its dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the product modules it imports (a name imported from a package is that
    package's module when it is one, else the package's ``__init__``)."""
    mods = modules(root)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imported(ast.parse(path.read_text(encoding="utf-8")), package):
            found = known(target)
            if found and found != name:
                edges[name].add(found)
    return edges


def _imported(tree: ast.AST, package: str) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # a module of that name, else the module (or package) it is a name of
            yield from (f"{base}.{a.name}" for a in node.names)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def crossings(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each import across a layer it must not cross (``FORBIDDEN``)."""
    out = []
    for name, targets in sorted(edges.items()):
        banned = FORBIDDEN.get(name.split(".")[0], ())
        out += [f"{name} -> {t}" for t in sorted(targets) if t.split(".")[0] in banned]
    return out


def main() -> int:
    edges = graph()
    problems = [f"circle: {' <-> '.join(c)}" for c in circles(edges)] + [
        f"layer: {x}" for x in crossings(edges)
    ]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
