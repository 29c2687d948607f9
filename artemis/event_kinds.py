"""The kinds of a run's stream events that its readers name (docs/architecture.md): an operator's
controls, the terminal events and a waiting run's outage events.

Kept apart from ``artemis.events`` (the event log and its tables) so that a reader of the
stream — the CLI's ``watch`` — needs neither SQLAlchemy nor the log to know them.
"""

from __future__ import annotations

from enum import StrEnum


class Control(StrEnum):
    """An operator's control of a run (POST /tasks/{id}/pause|resume|rate-limit), as its
    event kind (and the control answer's action)."""

    PAUSED = "paused"
    RESUMED = "resumed"
    RATE_CHANGED = "rate_changed"


CONTROL_EVENTS = tuple(Control)


class Ending(StrEnum):
    """The stream's terminal event: one per run."""

    COMPLETE = "complete"
    ERROR = "error"
    CANCELLED = "cancelled"


TERMINAL_EVENTS = tuple(Ending)
# A run waiting out an outage, and its recovery (recorded by the workflow's note_outage).
OUTAGE_EVENTS = ("waiting", "recovered")
# A page's records set aside, and a field the source added or stopped sending
# (artemis/quarantine/).
RECORD_EVENTS = ("quarantined", "schema_drift")
