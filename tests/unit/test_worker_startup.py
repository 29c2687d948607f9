"""What a worker does for itself at start-up."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import workflows.task_run
from workers.main import cache_workflow_bytecode

ROOT = Path(__file__).resolve().parents[2]


def test_the_workflow_modules_bytecode_is_cached_for_the_sandbox():
    # The sandbox imports the workflow module afresh for every run: its bytecode must be
    # on disk even where PYTHONDONTWRITEBYTECODE keeps Python from writing it.
    source = Path(workflows.task_run.__file__)
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.unlink(missing_ok=True)
    assert cache_workflow_bytecode() is True
    assert cached.is_file()
    assert cached.stat().st_mtime >= source.stat().st_mtime
    # Loadable: a valid code object for the current interpreter.
    assert importlib.util.MAGIC_NUMBER == cached.read_bytes()[:4]


@pytest.mark.processes
def test_the_heap_is_settled_once_start_up_is_done():
    # In a process of its own: freezing is for the life of the process.
    code = """
import gc
import workers.main  # what a worker imports
from artemis.heap import YOUNG_THRESHOLD, settle_after_startup
before = len(gc.get_objects())
frozen = settle_after_startup()
assert frozen == gc.get_freeze_count() and frozen > 50_000, frozen
assert len(gc.get_objects()) < before / 10, (before, len(gc.get_objects()))
assert gc.get_threshold()[0] == YOUNG_THRESHOLD
# a cycle made after start-up is still collected
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
import weakref
ref = weakref.ref(a)
del a, b
gc.collect()
assert ref() is None
print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
