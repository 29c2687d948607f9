"""The stored-history corpus (SPEC §4 "Versioning"): every history recorded by an earlier
build replays on the current workflow code, and the corpus covers every workflow type.

Record a release's set with ``make histories LABEL=<version>`` (bench/record_histories.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from workers.main import WORKFLOWS

CORPUS = Path(__file__).resolve().parents[1] / "histories"
FILES = sorted(CORPUS.glob("*/*.json"))


def _history(path: Path) -> WorkflowHistory:
    text = path.read_text()
    workflow_id = f"replay/{path.parent.name}/{path.stem}"
    return WorkflowHistory.from_json(workflow_id, json.loads(text))


def test_corpus_covers_every_workflow_type_and_every_ending():
    types = {f.name.split("-")[0] for f in FILES}
    registered = {w.__temporal_workflow_definition.name for w in WORKFLOWS}  # type: ignore[attr-defined]
    assert registered <= types, f"no stored history of {sorted(registered - types)}"
    endings = {f.stem.split("-")[1] for f in FILES if f.name.startswith("TaskRunWorkflow-")}
    for scenario in ("completed", "failed", "cancel-signal", "cancel-temporal", "timeout"):
        assert any(e == scenario.split("-")[0] for e in endings), scenario
    for scenario in ("backfill", "split", "crawl", "pubmed", "crossref"):
        assert scenario in endings, scenario
    last = {json.loads(f.read_text())["events"][-1]["eventType"] for f in FILES}
    assert {
        "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED",
        "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED",
        "EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED",
        "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW",
    } <= last


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
async def test_stored_history_replays_on_current_code(path: Path):
    replayer = Replayer(workflows=list(WORKFLOWS))
    result = await replayer.replay_workflow(_history(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"


async def test_a_command_change_without_its_patch_guard_fails_replay(monkeypatch):
    """What the corpus is for: the same change to TaskRunWorkflow made unguarded (every
    `workflow.patched` answering True, as if the new path had no guard) breaks the
    histories of the earlier build; guarded (the real code, above) they replay."""
    from temporalio import workflow

    olds = [p for p in FILES if p.name == "TaskRunWorkflow-completed-completed.json"]
    assert olds and olds[0].parent.name == "0.1.0"
    monkeypatch.setattr(workflow, "patched", lambda patch_id: True)
    replayer = Replayer(workflows=list(WORKFLOWS))
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
    replayer = Replayer(workflows=list(WORKFLOWS))
    result = await replayer.replay_workflow(_history(new[0]), raise_on_replay_failure=False)
    assert result.replay_failure is not None
