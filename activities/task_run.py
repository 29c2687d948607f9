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
from activities.run_base import RunServices, run_key
from artemis.config import Settings

__all__ = ["TaskRunActivities", "run_key"]


class TaskRunActivities:
    """Every activity of a run: one object per step, composed over the worker's one set
    of clients (``RunServices``). The class attributes name each activity for the
    workflow (``TaskRunActivities.fetch_pages``: the step's method, whose name the
    workflow schedules); the worker registers the steps' bound methods (``all``)."""

    prepare_params = PrepareActivities.prepare_params
    split_run = PrepareActivities.split_run
    plan_child_slice = PrepareActivities.plan_child_slice
    fetch_pages = FetchActivities.fetch_pages
    process_batch = BatchActivities.process_batch
    emit_batch = BatchActivities.emit_batch
    finalize_run = EndingActivities.finalize_run
    retain_run = EndingActivities.retain_run
    cleanup_run = EndingActivities.cleanup_run
    note_outage = EndingActivities.note_outage
    mirror_state = EndingActivities.mirror_state
    replay_quarantined = QuarantineActivities.replay_quarantined

    def __init__(self, settings: Settings) -> None:
        self.services = services = RunServices(settings)
        self.prepare = PrepareActivities(services)
        self.fetch = FetchActivities(services)
        self.batches = BatchActivities(services)
        self.ending = EndingActivities(services)
        self.quarantine = QuarantineActivities(services)

    def all(self) -> list[Callable[..., Any]]:
        """The activities, bound to their steps, for the worker to register."""
        return [
            self.ending.cleanup_run,
            self.ending.retain_run,
            self.prepare.prepare_params,
            self.prepare.split_run,
            self.prepare.plan_child_slice,
            self.ending.mirror_state,
            self.fetch.fetch_pages,
            self.batches.process_batch,
            self.batches.emit_batch,
            self.ending.note_outage,
            self.ending.finalize_run,
            self.quarantine.replay_quarantined,
        ]

    async def aclose(self) -> None:
        await self.services.aclose()
