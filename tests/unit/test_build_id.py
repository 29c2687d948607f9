"""The default build id follows the code the workflows execute, and nothing else."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from artemis.errors import ArtemisError
from artemis.temporal.versioning import ROOT, build_of, code_build_id, workflow_modules


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages a worker runs."""
    for package in ("workflows", "artemis", "activities"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def edit(path: Path, text: str = "\n# edited\n") -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_a_copy_of_the_code_has_the_same_build_id(tree: Path) -> None:
    assert code_build_id(tree) == code_build_id()


def test_the_workflows_and_what_they_import_are_in_it_and_activities_are_not() -> None:
    modules = workflow_modules()
    assert {"workflows.task_run", "artemis.run_models", "artemis.run_state"} <= modules.keys()
    assert not any(name.startswith("activities") for name in modules)
    assert "artemis.quarantine" not in modules  # the activities' domain code


# What the workflows execute of the domain, all of it: a module joining this list changes
# the build id with its every edit (and a worker-side one, a log format say, would strand
# pinned runs on the build before): a change here is a decision, made in this list.
WORKFLOW_SIDE = {
    "artemis",
    "artemis.completeness",
    "artemis.errors",
    "artemis.jsonio",
    "artemis.ledger",
    "artemis.outage",
    "artemis.owners",
    "artemis.redact",
    "artemis.run_models",
    "artemis.run_state",
    "artemis.temporal",
    "artemis.temporal.failures",
}
WORKER_SIDE = ("artemis.http", "artemis.config", "artemis.logsetup", "artemis.tracing")


def test_the_build_id_covers_exactly_the_domain_modules_the_workflows_execute() -> None:
    modules = workflow_modules()
    assert {n for n in modules if not n.startswith("workflows")} == WORKFLOW_SIDE
    assert not any(n.startswith(WORKER_SIDE) for n in modules)


def test_builds_id_explain_lists_the_modules_in_the_build_id() -> None:
    import io

    from rich.console import Console

    from starter.cli.builds import explain

    buf = io.StringIO()
    explain(Console(file=buf, width=200))
    out = buf.getvalue()
    for name in workflow_modules():
        assert name in out
    assert "artemis.http" not in out and code_build_id() in out


@pytest.mark.parametrize("changed", ["workflows/task_run.py", "artemis/run_models.py"])
def test_a_change_to_what_workflows_execute_changes_the_build_id(tree: Path, changed: str) -> None:
    before = code_build_id(tree)
    edit(tree / changed)
    code_build_id.cache_clear()
    assert code_build_id(tree) != before


@pytest.mark.parametrize("changed", ["activities/fetch.py", "artemis/quarantine/store.py"])
def test_a_change_outside_them_keeps_the_build_id(tree: Path, changed: str) -> None:
    before = code_build_id(tree)
    edit(tree / changed)
    code_build_id.cache_clear()
    assert code_build_id(tree) == before


def test_a_build_id_or_deployment_with_a_dot_is_refused() -> None:
    with pytest.raises(ArtemisError, match=r"worker.build_id '1\.2' must .*no '\.'"):
        build_of("artemis", "1.2")
    with pytest.raises(ArtemisError, match="temporal.deployment_name"):
        build_of("a.b", None)
    assert build_of("artemis", None).build_id == code_build_id()
