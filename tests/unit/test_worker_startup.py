"""What a worker does for itself at start-up."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import workflows.task_run
from workers.main import cache_workflow_bytecode


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
