"""The execution lock of a task that allows one run at a time (a crawl's workflow name:
``TaskUnit.lock_name``, artemis/tasks/base.py). The lock is a workflow of its own, id
``artemis/lock/{name}``: Temporal keeps one open workflow per id, and that is the lock.
The run keeps its own id, ``artemis/{code}/{task_id}``, so the list of task runs shows
task runs, and the lock shows who holds it (its search attribute ``ArtemisTaskId``).

The API's start path takes the lock before it starts the run (starter/locks.py) and
then tells the lock the run's run id (the ``bind`` signal); the lock waits for that run's
end in a heartbeating activity (following its continue-as-new chain) and ends, which
frees the name. Not told within ``BIND_WITHIN`` (the starter stopped between the two
starts, or the signal was lost), it holds for the latest run of the run's workflow id, if
there is one, and ends at once if there is none."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from activities.locks import LockActivities
    from artemis.run_models import LOCK_BIND_SIGNAL, LOCK_WORKFLOW, LockedRun, LockHold

# How long a lock waits to be told its run started: a start takes well under a second; a
# starter that stopped in between leaves the name free again after this.
BIND_WITHIN = timedelta(minutes=5)
# The wait for the run's end heartbeats; a worker lost meanwhile is noticed in a minute.
HOLD_HEARTBEAT = timedelta(seconds=60)


# Auto-upgrade, as the housekeeping loops are: a lock started by an API updated before its
# workers' build is current moves to that build once it is promoted (pinned, it would wait
# on a build that has no such workflow). So each release's code must replay the lock
# histories of the release before (tests/histories), as the loops' do.
@workflow.defn(name=LOCK_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class ExecutionLockWorkflow:
    def __init__(self) -> None:
        self._run_id: str | None = None

    @workflow.signal(name=LOCK_BIND_SIGNAL)
    def bind(self, run_id: str) -> None:
        """The run this lock was taken for started: its run id."""
        self._run_id = self._run_id or run_id

    @workflow.run
    async def run(self, hold: LockHold) -> str:
        try:
            await workflow.wait_condition(lambda: self._run_id is not None, timeout=BIND_WITHIN)
        except TimeoutError:
            pass  # held for the workflow id's latest run ("": none told)
        return await workflow.execute_activity_method(
            LockActivities.hold,
            LockedRun(hold.run_workflow_id, self._run_id or ""),
            start_to_close_timeout=timedelta(seconds=hold.timeout_s + 3600),
            heartbeat_timeout=HOLD_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
            summary=f"held by task {hold.task_id}",
        )
