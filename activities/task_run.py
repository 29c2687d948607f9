"""The activities of the task-run workflow, one class for the worker to register and
the workflow to name (``TaskRunActivities.fetch_pages``, ...); each step's activities
live in their own module:

- ``prepare``: prepare_params, split_run, plan_child_slice
- ``fetch``: fetch_pages
- ``batches``: process_batch, emit_batch
- ``ending``: finalize_run, retain_run, cleanup_run, note_outage, mirror_state
- ``quarantine``: replay_quarantined (the replay workflow's)

The clean-up loop's activity is not a run's: ``activities/housekeeping.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.batches import BatchActivities
from activities.ending import EndingActivities
from activities.fetch import FetchActivities
from activities.prepare import PrepareActivities
from activities.quarantine import QuarantineActivities
from activities.run_base import run_key

__all__ = ["TaskRunActivities", "run_key"]


class TaskRunActivities(
    PrepareActivities, FetchActivities, BatchActivities, EndingActivities, QuarantineActivities
):
    """Every activity of a run, sharing one set of clients (``RunActivityBase``)."""

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.cleanup_run,
            self.retain_run,
            self.prepare_params,
            self.split_run,
            self.plan_child_slice,
            self.mirror_state,
            self.fetch_pages,
            self.process_batch,
            self.emit_batch,
            self.note_outage,
            self.finalize_run,
            self.replay_quarantined,
        ]
