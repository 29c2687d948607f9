"""The stored-history corpus (SPEC §4 "Versioning"): every history recorded by an earlier
build replays on the current workflow code, and the corpus covers every workflow type.

Record a release's set with ``make histories LABEL=<version>`` (bench/record_histories.py).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from artemis.temporal.client import data_converter
from tests.helpers import ending
from workers.main import WORKFLOWS

CORPUS = Path(__file__).resolve().parents[1] / "histories"
FILES = sorted(CORPUS.glob("*/*.json"))


def _history(path: Path) -> WorkflowHistory:
    text = path.read_text()
    workflow_id = f"replay/{path.parent.name}/{path.stem}"
    return WorkflowHistory.from_json(workflow_id, json.loads(text))


def _name(path: Path) -> tuple[str, str, str]:
    """(workflow type, scenario, ending) as bench/record_histories.py names a file:
    ``<workflow type>-<scenario>-<status>[-<n>].json``, the status being Temporal's
    execution status in lower case (completed, failed, canceled, continued_as_new, …)."""
    parts = path.stem.split("-")
    if parts[-1].isdigit():
        parts.pop()
    return parts[0], "-".join(parts[1:-1]), f"WORKFLOW_EXECUTION_{parts[-1].upper()}"


def test_corpus_covers_every_workflow_type_and_every_ending():
    names = [_name(f) for f in FILES]
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
        ("cancel-temporal", "CANCELED"),
        ("timeout", "COMPLETED"),  # the run's deadline: reported as "timeout"
        ("backfill", "COMPLETED"),
        ("split", "COMPLETED"),
        ("crawl", "COMPLETED"),
        ("pubmed", "COMPLETED"),
        ("crossref", "COMPLETED"),
        # 0.5.0: outages waited out, a run that gave up and was finished by a retry
        ("sink-waited", "COMPLETED"),
        ("source-waited", "COMPLETED"),
        ("gave-up", "FAILED"),
        ("gave-up", "COMPLETED"),
        # 0.6.0: paused mid-fetch (the fetch in flight cancelled at its next page), resumed
        ("paused", "COMPLETED"),
    ):
        assert (scenario, f"WORKFLOW_EXECUTION_{end}") in runs, (scenario, end)
    # The housekeeping workflows: one pass (started by a schedule, up to 0.5.0) and, from
    # 0.6.0, the loop that continues as new and the loop a `configure` signal stopped.
    for kind in ("CleanupOldTasks", "ReclaimStaleLocks", "EvaluateAlerts"):
        shapes = {(s, e) for t, s, e in names if t == kind}
        assert any(s != "loop" for s, _ in shapes), f"no one-pass history of {kind}"
        for end in ("CONTINUED_AS_NEW", "COMPLETED"):
            assert ("loop", f"WORKFLOW_EXECUTION_{end}") in shapes, (kind, end)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_stored_history_replays_on_current_code(path: Path):
    history = _history(path)
    # A history that ended otherwise than its name says (or never closed) proves nothing.
    assert ending(history) == _name(path)[2], path.name
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"


async def test_a_command_change_without_its_patch_guard_fails_replay(monkeypatch):
    """What the corpus is for: the same change to TaskRunWorkflow made unguarded (every
    `workflow.patched` answering True, as if the new path had no guard) breaks the
    histories of the earlier build; guarded (the real code, above) they replay."""
    from temporalio import workflow

    olds = [p for p in FILES if p.name == "TaskRunWorkflow-completed-completed.json"]
    assert olds and olds[0].parent.name == "0.1.0"
    monkeypatch.setattr(workflow, "patched", lambda patch_id: True)
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())
    result = await replayer.replay_workflow(_history(olds[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


async def test_removing_a_patch_that_a_kept_history_needs_fails_replay(monkeypatch):
    """The other half of the rule: a history recorded on the patched path (0.2.0 took
    every patch) breaks when the patch is removed the wrong way (its code path dropped)."""
    from temporalio import workflow

    new = [
        p
        for p in FILES
        if p.parent.name == "0.2.0" and p.name.startswith("TaskRunWorkflow-completed-completed")
    ]
    assert new, "no 0.2.0 histories"
    monkeypatch.setattr(workflow, "patched", lambda patch_id: False)
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())
    result = await replayer.replay_workflow(_history(new[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None


async def test_the_housekeeping_loop_is_behind_its_patch(monkeypatch):
    """A loop history (0.6.0) breaks when its patch answers False (the one-pass path of
    earlier builds taken instead), and the one-pass histories of earlier builds never ask
    for it: both shapes replay on the current code (above)."""
    from temporalio import workflow

    # the earliest build's (labels in version order: 0.10.0 after 0.9.0)
    loops = sorted(
        (p for p in FILES if p.name == "ReclaimStaleLocks-loop-continued_as_new.json"),
        key=lambda p: _version(p.parent.name),
    )
    assert loops and loops[0].parent.name == "0.6.0"
    monkeypatch.setattr(workflow, "patched", lambda patch_id: False)
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())
    result = await replayer.replay_workflow(_history(loops[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    old = sorted(
        (p for p in FILES if p.name == "ReclaimStaleLocks-reclaimstalelocks-completed.json"),
        key=lambda p: _version(p.parent.name),
    )
    assert old and old[0].parent.name == "0.1.0"
    result = await replayer.replay_workflow(_history(old[0]), raise_on_replay_failure=False)
    assert result.replay_failure is None


def _version(label: str) -> tuple[int, ...]:
    return tuple(int(x) for x in label.split("."))


def _input(doc: dict) -> dict:
    return doc["events"][0]["workflowExecutionStartedEventAttributes"]["input"]["payloads"][0]


def _request(path: Path) -> dict:
    """The run's input (RunRequest, as JSON) of a stored history."""
    return json.loads(base64.b64decode(_input(json.loads(path.read_text()))["data"]))


def _with_flow(path: Path, flow: int) -> WorkflowHistory:
    """A stored history whose run's input (RunRequest) says ``flow``."""
    doc = json.loads(path.read_text())
    payload = _input(doc)
    request = json.loads(base64.b64decode(payload["data"]))
    request["flow"] = flow
    payload["data"] = base64.b64encode(json.dumps(request).encode()).decode()
    return WorkflowHistory.from_json(f"replay/{path.parent.name}/{path.stem}/flow", doc)


async def test_a_run_of_this_flow_begun_by_the_build_before_replays():
    """A run the API of this build started (``RunRequest.flow``), picked up by a worker
    of the build before it (the API deployed first): that worker ignored the field and
    wrote its patch markers. The 0.8.0 runs are such histories once their input says the
    flow; this build's worker matches the markers while replaying and goes on."""
    from artemis.run_models import CURRENT_FLOW

    olds = [p for p in FILES if p.parent.name == "0.8.0" and p.name.startswith("TaskRunWorkflow")]
    assert len(olds) >= 20
    assert all(b"core_patch" in p.read_bytes() for p in olds), "0.8.0 runs wrote patch markers"
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())
    for path in olds:
        result = await replayer.replay_workflow(
            _with_flow(path, CURRENT_FLOW), raise_on_replay_failure=False
        )
        assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"


async def test_runs_of_this_flow_write_no_patch_marker(monkeypatch):
    """The newest corpus (recorded on this flow) has no run patch marker, and replays with
    every `workflow.patched` answering False: its path comes from its input, not from
    markers. The same histories read as flow 0 (no field: an earlier build's run) fail."""
    from temporalio import workflow

    label = max((p.parent.name for p in FILES), key=_version)
    runs = [p for p in FILES if p.parent.name == label and p.name.startswith("TaskRunWorkflow")]
    assert runs and _version(label) >= (0, 9, 0), label
    for path in runs:
        assert b"core_patch" not in path.read_bytes(), path.name
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=data_converter())
    monkeypatch.setattr(workflow, "patched", lambda patch_id: False)
    for path in runs:
        result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
    monkeypatch.undo()
    # A run's first generation: prepare, finalize and clean-up as local activities, the
    # search attributes not written again — none of it without the flow or a marker. (A
    # later generation of a continued run that ended by continuing again took nothing on
    # its own: the behaviours it carries came in its input's carry.)
    firsts = [p for p in runs if _request(p)["carry"] is None]
    assert len(firsts) >= 20
    for path in firsts:
        result = await replayer.replay_workflow(_with_flow(path, 0), raise_on_replay_failure=False)
        assert result.replay_failure is not None, path.name
