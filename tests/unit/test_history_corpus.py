"""The stored-history corpus (tests/histories/<release>/): what the current workflow code
must still replay.

Task runs, note details and quarantine replays are pinned to the worker build they
started on (artemis/temporal/versioning.py): no other build ever replays them, so a
release keeps only its own set of them. The housekeeping loops auto-upgrade: a loop of
an earlier release moves onto this release's build at its next step, so the loop
histories of the releases before are kept and replayed here. Record a release's set
with ``make histories LABEL=<version>`` (bench/record_histories.py);
``--housekeeping-only`` records the loops alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from artemis.temporal.client import data_converter
from tests.helpers import ending
from workers.main import WORKFLOWS

CORPUS = Path(__file__).resolve().parents[1] / "histories"
FILES = sorted(CORPUS.glob("*/*.json"))
LOOPS = ("CleanupOldTasks", "ReclaimStaleLocks", "EvaluateAlerts")
# The releases before this one, whose loops this one adopts (the first of them took the
# housekeeping-loop-v1 patch); and this release's own set.
BEFORE = ("0.12.0", "1.0.0")
PATCHED = "0.12.0"


def _version(label: str) -> tuple[int, ...]:
    return tuple(int(x) for x in label.split("."))


OWN = max((p.parent.name for p in FILES), key=_version)


def _history(path: Path) -> WorkflowHistory:
    workflow_id = f"replay/{path.parent.name}/{path.stem}"
    return WorkflowHistory.from_json(workflow_id, json.loads(path.read_text()))


def _name(path: Path) -> tuple[str, str, str]:
    """(workflow type, scenario, ending) as bench/record_histories.py names a file:
    ``<workflow type>-<scenario>-<status>[-<n>].json``, the status being Temporal's
    execution status in lower case (completed, failed, canceled, continued_as_new, …)."""
    parts = path.stem.split("-")
    if parts[-1].isdigit():
        parts.pop()
    return parts[0], "-".join(parts[1:-1]), f"WORKFLOW_EXECUTION_{parts[-1].upper()}"


def _replayer() -> Replayer:
    return Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())


def test_the_corpus_is_this_release_and_the_loops_of_the_ones_before():
    labels = {p.parent.name for p in FILES}
    assert labels == {*BEFORE, OWN}, labels
    assert all(_version(OWN) > _version(b) for b in BEFORE), labels
    for before in BEFORE:
        kept = {_name(p)[0] for p in FILES if p.parent.name == before}
        assert kept == set(LOOPS), f"{before} keeps {sorted(kept)}: pinned types need none"
        for kind in LOOPS:
            shapes = {
                (s, e)
                for path in FILES
                if path.parent.name == before
                for t, s, e in [_name(path)]
                if t == kind and s == "loop"
            }
            for end in ("CONTINUED_AS_NEW", "COMPLETED"):
                assert ("loop", f"WORKFLOW_EXECUTION_{end}") in shapes, (before, kind, end)


def test_this_releases_set_covers_every_workflow_type_and_every_ending():
    names = [_name(f) for f in FILES if f.parent.name == OWN]
    types = {t for t, _, _ in names}
    registered = {w.__temporal_workflow_definition.name for w in WORKFLOWS}  # type: ignore[attr-defined]
    assert registered <= types, f"no stored history of {sorted(registered - types)}"
    # Each scenario a TaskRunWorkflow was driven through, and the ending its last run had.
    runs = {(s, e) for t, s, e in names if t == "TaskRunWorkflow"}
    for scenario, end in (
        ("completed", "COMPLETED"),
        ("completed", "CONTINUED_AS_NEW"),
        ("failed", "FAILED"),
        ("cancel-signal", "COMPLETED"),  # the workflow reports "cancelled" and completes
        ("cancel-api", "CANCELED"),  # Temporal's cancellation, with the reason
        ("cancel-temporal", "CANCELED"),
        ("timeout", "COMPLETED"),  # the run's deadline: reported as "timeout"
        ("backfill", "COMPLETED"),
        ("backfill", "CONTINUED_AS_NEW"),  # a fan-out's generation of children
        ("split", "COMPLETED"),
        ("crawl", "COMPLETED"),
        ("pubmed", "COMPLETED"),
        ("crossref", "COMPLETED"),
        ("sink-waited", "COMPLETED"),
        ("source-waited", "COMPLETED"),
        ("gave-up", "FAILED"),
        ("gave-up", "COMPLETED"),
        ("paused", "COMPLETED"),
    ):
        assert (scenario, f"WORKFLOW_EXECUTION_{end}") in runs, (scenario, end)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_stored_history_replays_on_current_code(path: Path):
    history = _history(path)
    # A history that ended otherwise than its name says (or never closed) proves nothing.
    assert ending(history) == _name(path)[2], path.name
    result = await _replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"


def test_the_loops_of_the_release_before_hold_the_deprecated_patch_marker():
    """0.12.0's loops took the ``housekeeping-loop-v1`` patch: their histories hold its
    marker, which this release accepts through ``workflow.deprecate_patch`` (they replay,
    above). A release after this one may drop that call, once no loop of 0.12.0 is
    kept."""
    loops = [p for p in FILES if p.parent.name == PATCHED]
    assert loops and all(b"core_patch" in p.read_bytes() for p in loops)


async def test_a_changed_loop_does_not_replay_the_loops_of_the_release_before(monkeypatch):
    """What the kept loops are for: a loop whose next step changed (a timer where a pass
    ran) fails their replay, so a change to a loop must stay replay-safe."""
    from workflows import housekeeping

    # Outside the sandbox, so that the change reaches the replayed workflow's module.
    monkeypatch.setattr(housekeeping.HousekeepingLoop, "wanted", staticmethod(lambda inp: False))
    (path,) = [
        p
        for p in FILES
        if p.parent.name == PATCHED and p.name == "ReclaimStaleLocks-loop-continued_as_new.json"
    ]
    replayer = Replayer(
        workflows=list(WORKFLOWS),
        data_converter=data_converter(),
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()
    monkeypatch.undo()
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is None  # unchanged, the same replayer replays it
