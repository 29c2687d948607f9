"""The loop the housekeeping workflows share (CleanupOldTasks, ReclaimStaleLocks,
EvaluateAlerts).

Each worker start makes sure one execution per job and task queue is running (signal-with-
start on a fixed id: a second worker, or a restart, signals the running one instead of
starting another). The execution sleeps on a Temporal timer until the next tick, runs
its activity, and so on; it continues as new after ``run_for_s`` (a day) or when
Temporal suggests it. A worker that stops leaves it sleeping on its timer; the next
worker carries on.

The worker's start-up signal (``configure``) carries the settings it was started with,
so a config change applies at the next worker start: a new interval re-plans the current
wait at once (the next tick is the last one plus the new interval), other fields apply
from the next tick. ``every_s: None`` in the signal ends the loop (alerts turned off).

An input without ``every_s`` runs one pass and completes.

The loops move to the current worker build at their next step (auto-upgrade), so a
loop's history must replay on the next build: tests/unit/test_history_corpus.py replays
the loops recorded by the release before."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

# Loops started before the loop was unconditional hold this marker: accepted, no longer
# written.
LOOP_PATCH = "housekeeping-loop-v1"


class LoopInput(Protocol):
    every_s: float | None
    run_for_s: float


C = TypeVar("C", bound=LoopInput)
R = TypeVar("R")


def span(seconds: float) -> str:
    """``3600`` -> ``1 h``, ``900`` -> ``15 min``, ``1.5`` -> ``1.5 s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


class HousekeepingLoop(Generic[C, R]):
    """``job`` names the work in the UI (its timer summary and current details)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.cfg: C | None = None
        self._replan = False

    def configure(self, cfg: C) -> None:
        """The ``configure`` signal: newer settings (sync: nothing to wait for)."""
        if self.cfg is None or cfg.every_s != self.cfg.every_s:
            self._replan = True  # the wait under way is re-planned, or the loop ends
        self.cfg = cfg

    @staticmethod
    def wanted(inp: LoopInput) -> bool:
        """Loop (True) or one pass (False)?"""
        workflow.deprecate_patch(LOOP_PATCH)
        return inp.every_s is not None

    async def run(
        self,
        inp: C,
        once: Callable[[C], Awaitable[R]],
        describe: Callable[[R], str],
        empty: R,
    ) -> R:
        """Loop until a ``configure`` signal turns it off (returns the last result).
        The first pass comes one interval after the start, as a schedule's first tick
        did (a worker start does not set off a clean-up); after a pass, once the run has
        lasted ``run_for_s`` (or Temporal suggests it), it continues as new with the
        newest settings, and the new run's first pass is one interval later."""
        if self.cfg is None:  # a signal that came with the start is as new as ``inp``
            self.cfg = inp
        began = ran_at = workflow.now()
        outcome, last = "", empty
        while True:
            if not await self._until_next(ran_at, outcome):
                return last
            cfg = self.cfg
            ran_at = workflow.now()
            try:
                last = await once(cfg)
                outcome = describe(last)
            except ActivityError as e:
                # A pass that failed (its retries spent) does not end the loop: the next
                # tick tries again, as the next schedule tick did.
                cause = e.cause or e
                outcome = f"failed: {cause}"
                workflow.logger.warning("%s failed: %s", self.job, cause)
            ran_for = (workflow.now() - began).total_seconds()
            if workflow.info().is_continue_as_new_suggested() or ran_for >= cfg.run_for_s:
                workflow.continue_as_new(self.cfg)

    async def _until_next(self, ran_at: datetime, outcome: str) -> bool:
        """Sleep until ``ran_at + every_s`` (re-planned when the interval changes);
        False when the loop was turned off. ``outcome`` of the pass at ``ran_at`` ("":
        none yet in this run) goes to the current details."""
        last = f"last {self.job} {ran_at:%Y-%m-%d %H:%M:%S} UTC: {outcome}" if outcome else ""
        while True:
            cfg = self.cfg
            assert cfg is not None
            if cfg.every_s is None:
                workflow.set_current_details(" · ".join(x for x in ("**stopped**", last) if x))
                return False
            due = ran_at + timedelta(seconds=cfg.every_s)
            left = (due - workflow.now()).total_seconds()
            if left <= 0:
                return True
            workflow.set_current_details(
                " · ".join(
                    x
                    for x in (f"**every {span(cfg.every_s)}**", last, f"next {due:%H:%M:%S} UTC")
                    if x
                )
            )
            self._replan = False
            try:
                await workflow.wait_condition(
                    lambda: self._replan,
                    timeout=left,
                    timeout_summary=f"Next {self.job} (every {span(cfg.every_s)})",
                )
            except TimeoutError:
                return True
