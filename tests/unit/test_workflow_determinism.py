"""What the workflow sandbox would guard, checked on the source (workers run the
workflows outside the sandbox by default: ``worker.sandboxed_workflows``).

Workflow code — workflows/ and the domain modules it calls into — makes no call whose
answer differs between a run and its replay (wall clock, randomness, the environment,
I/O, threads) and keeps no state at module level (a worker runs many workflows in one
interpreter: outside the sandbox, module state would be shared between them). Every replay
test still runs the workflows inside the sandbox (the history corpus, test_replay.py), so
a non-deterministic call that slipped past this scan fails there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The code that runs inside workflows: the workflow modules and the domain modules whose
# functions they call (run state, models, outage waits, completeness, failure reading).
SCANNED = [
    *sorted((ROOT / "workflows").glob("*.py")),
    *(
        ROOT / "artemis" / name
        for name in ("run_state.py", "run_models.py", "outage.py", "completeness.py")
    ),
    ROOT / "artemis" / "temporal" / "failures.py",
]
# module.attribute calls whose answer is not the history's
FORBIDDEN_CALLS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "sleep"),
    ("uuid", "uuid1"),
    ("uuid", "uuid4"),
    ("os", "getenv"),
    ("os", "urandom"),
    ("asyncio", "to_thread"),
    ("asyncio", "get_event_loop"),
}
FORBIDDEN_NAMES = {"open", "input", "print", "exec", "eval"}
FORBIDDEN_MODULES = {
    "random",
    "secrets",
    "threading",
    "subprocess",
    "socket",
    "httpx",
    "aiohttp",
    "sqlalchemy",
    "requests",
}
# Module-level names that may hold a mutable value: none.
MUTABLE = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def problems(source: str, name: str) -> list[str]:
    """What in ``source`` a replay could not reproduce (each naming its line)."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if (f.value.id, f.attr) in FORBIDDEN_CALLS:
                    found.append(f"{where}: {f.value.id}.{f.attr}()")
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_NAMES:
                found.append(f"{where}: {f.id}()")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr == "environ":
                found.append(f"{where}: os.environ")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for mod in mods:
                if mod.split(".")[0] in FORBIDDEN_MODULES:
                    found.append(f"{where}: import {mod}")
        elif isinstance(node, ast.Global):
            found.append(f"{where}: global {', '.join(node.names)}")
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, MUTABLE) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in ("list", "dict", "set", "defaultdict", "deque")
        ):
            found.append(f"{name}:{stmt.lineno}: module-level mutable value")
    return found


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(ROOT)))
def test_workflow_code_makes_no_call_a_replay_could_not_reproduce(path: Path) -> None:
    assert problems(path.read_text(), str(path.relative_to(ROOT))) == []


def test_the_scan_catches_what_the_sandbox_would() -> None:
    bad = (
        "import random\n"
        "from datetime import datetime\n"
        "import os\n"
        "SEEN = {}\n"
        "CACHE = dict()\n"
        "def f():\n"
        "    global SEEN\n"
        "    return datetime.now(), os.environ['X'], open('f'), random.random()\n"
    )
    found = problems(bad, "bad.py")
    assert any("import random" in p for p in found)
    assert any("datetime.now()" in p for p in found)
    assert any("os.environ" in p for p in found)
    assert any("open()" in p for p in found)
    assert any("global SEEN" in p for p in found)
    assert sum("module-level mutable value" in p for p in found) == 2
