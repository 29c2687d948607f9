"""`make demo` installs only what runs; `make test` adds the dev extras — read
from what make would run (`make -n -B`), not from the Makefile's text."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


def _sync_line(target: str) -> str:
    out = subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if " sync " in x]
    return line


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_demo_installs_the_runtime_alone_and_test_adds_the_dev_extras():
    demo = _sync_line("install")  # what `make demo` depends on
    assert "--frozen" in demo and "--extra" not in demo and "--all-extras" not in demo, demo
    assert "--inexact" in demo  # a demo after a test keeps the dev extras installed
    dev = _sync_line("install-dev")  # what `make test` depends on
    assert "--extra dev" in dev, dev
    demo_deps = subprocess.run(
        ["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    assert "--extra dev" not in demo_deps and "artemis demo" in demo_deps
