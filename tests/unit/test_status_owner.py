"""Run state has one owner: no status string literal outside
``artemis/run_state.py``, which holds every status vocabulary as an enum. The few
literals below spell the same word for something that is not a status; each says what."""

from __future__ import annotations

import re
from pathlib import Path

from artemis.run_state import CandidateStatus, CookieStatus, RunStatus, StepStatus

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "artemis",
    "activities",
    "workflows",
    "workers",
    "starter",
    "bench",
)
WORDS = sorted(
    # (an alert's "ok" and "resolved" are common words: "firing" stands for its states)
    {
        *(s.value for s in (*RunStatus, *StepStatus, *CandidateStatus, *CookieStatus)),
        "firing",
        "success",
    }
)
LITERAL = re.compile(r"""(?<![\w.])(["'])(""" + "|".join(map(re.escape, WORDS)) + r")\1")

# (path, the line's text contains, why it is not a status)
NOT_STATUSES = [
    ("artemis/literature/pubmed.py", '"pending"', "the checkpoint's queue of ids not yet fetched"),
    ("artemis/db.py", '"timeout"', "SQLite's connect argument"),
    ("artemis/config.py", '"ERROR"', "a log level"),
    ("artemis/literature/normalize.py", "ERROR", "PubMed's own error element"),
    ("artemis/literature/pubmed.py", '"ERROR"', "PubMed's own error key"),
    ("artemis_samples/literature.py", '"ERROR"', "PubMed's own error key (the sample)"),
    ("artemis/events.py", '"cancelled": True', "the SSE payload's flag"),
    (
        "artemis/event_kinds.py",
        'PAUSED = "paused"',
        "the stream's event kind (Control), defined once",
    ),
    (
        "artemis/event_kinds.py",
        'CANCELLED = "cancelled"',
        "the stream's end event (Ending), defined once",
    ),
    ("artemis_samples/literature.py", '"status": "failed"', "Crossref's own refusal body"),
    ("starter/api/envelope.py", '"success"', "the response envelope's key"),
    ("starter/api/schemas.py", '{"success"', "the envelope's keys, in a docstring"),
    ("starter/api/routes/notes.py", '"success"', "a note batch's per-item key"),
    ("starter/api/routes/notes.py", '"failed": len(failed)', "a count of failed items"),
    ("starter/cli/_common.py", '"success"', "the envelope's key"),
    ("starter/cli/tasks.py", '"completed", "error"', "a table's column headers"),
    ("starter/cli/watch.py", '"failed" if ev.get("error")', "an activity line's word"),
    ("workers/boundary.py", 'outcome = "cancelled"', "an activity's outcome (metric label)"),
    ("workflows/task_run.py", 'info("paused"', "a log event name"),
    ("starter/run_reads.py", 'progress.get("paused")', "the progress query's key"),
    ("artemis/temporal/schedules.py", '"paused": sched.state.paused', "a schedule's own flag"),
    (
        "artemis/temporal/schedules.py",
        'out["outcome"] = "running"',
        "a scheduled start's outcome: its starter workflow still runs",
    ),
    ("starter/cli/schedules.py", '"paused": paused', "a schedule's flag in a request body"),
    ("starter/cli/schedules.py", '"paused" if s["paused"]', "a schedule's state, shown"),
    ("starter/cli/schedules.py", '"overlap", "paused", "note"', "a schedule's keys, shown"),
    ("infra/devstack/stack.py", 'resp["success"]', "the envelope's key"),
    ("artemis_samples/app.py", '"active": mode', "a sample's fault switch"),
    ("bench/record_histories.py", "await d.start(", "a recorded scenario's name"),
    ("bench/record_histories.py", '            "completed",', "a recorded scenario's name"),
    ("bench/record_histories.py", '"timeout", "pull_stock_quotes"', "a recorded scenario's name"),
]


def _offending() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "artemis/run_state.py" or "/migrations/" in rel:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if not LITERAL.search(line):
                    continue
                if any(rel == p and text in line for p, text, _ in NOT_STATUSES):
                    continue
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_status_literal_outside_run_state() -> None:
    offending = _offending()
    assert not offending, "status literals outside artemis/run_state.py:\n" + "\n".join(offending)


def test_the_check_finds_a_literal(tmp_path: Path) -> None:
    """The pattern catches what it must (and not a word inside another string)."""
    assert LITERAL.search('if status == "completed":')
    assert LITERAL.search("x = 'running'")
    assert not LITERAL.search('"not completed"')
    assert not LITERAL.search("RunStatus.COMPLETED")
