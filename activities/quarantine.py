"""The replay of a run's quarantined records: each row judged again by the task and the
record model in force now, and, when it fits, sent to the run's sinks under a key of its
own (``{run}:{sink}:quarantine:{row}``) and marked replayed. A row sent and not yet
marked (a worker lost between the two) is sent again under the same key: each sink's
ledger takes it once."""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.run_base import RunStep, heartbeating, log, secrets_key
from artemis.calls import work
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.quarantine import store as quarantine
from artemis.quarantine.judging import BadRecord, Rules, judge
from artemis.quarantine.policy import Stage
from artemis.redact import redact_text
from artemis.run_models import ReplayBatchInput, ReplayResult, RunRef
from artemis.sinks import EmitContext
from artemis.sinks.sealing import operator_secret, register_sink_secret, unseal_output
from artemis.tasks import TaskContext, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, new_span_id, new_trace_id


class QuarantineActivities(RunStep):
    @activity.defn(name="replay_quarantined")
    async def replay_quarantined(self, inp: ReplayBatchInput) -> ReplayResult:
        try:
            async with heartbeating():
                return await self._replay(inp)
        except ArtemisError as e:
            # A replay carries no run reference, so no run boundary types its errors: a
            # permanent one (a table the records do not fit) ends the replay at once,
            # naming the cause; a transient one is retried by the workflow's policy.
            log.warning("quarantine_replay_failed", task_id=inp.task_id, code=e.code.value)
            raise ApplicationError(
                redact_text(e.message), type=e.code.value, non_retryable=not e.retryable
            ) from None

    async def _replay(self, inp: ReplayBatchInput) -> ReplayResult:
        db = self.settings.database.url
        run = await work(quarantine.run_of, db, inp.task_id)
        if run is None:
            raise ArtemisError(
                ErrorCode.NOT_FOUND,
                f"run {inp.task_id!r} has no quarantined records",
                retryable=False,
            )
        task = get_task(run["task_code"])
        ref = RunRef(
            task_code=run["task_code"],
            task_id=run["task_id"],
            workflow_id=activity.info().workflow_id or "",
            trace_id=inp.trace_id,
            request_id=inp.request_id,
        )
        ctx = await self._replay_context(task, ref, run, inp)
        sinks = await work(task.decide_sinks, ctx)
        # Each row on its own: a replay lands what fits and leaves the rest, whatever the
        # run's bound; a field the model does not name is dropped, as the run did.
        policy = dataclasses.replace(
            task.record_policy(ctx),
            on_bad_record="quarantine",
            max_bad_records=2**62,
            schema_contract="discard",
        )
        judging = Rules(policy, task.record_spec(ctx.params))
        which = quarantine.RowPage(
            task_id=inp.task_id,
            status=quarantine.QuarantineStatus.QUARANTINED.value,
            ids=inp.ids,
            after_id=inp.after_id,
            limit=inp.limit,
        )
        rows = await work(
            quarantine.list_rows,
            db,
            which,
            with_record=True,
            key_file=self.settings.vault.master_key_file,  # (a record sealed: opened)
        )
        result = ReplayResult(next_after=inp.after_id, done=len(rows) < inp.limit)
        for row in rows:
            result.next_after = row["id"]
            if row["record"] is None:  # kept without its body (over the size bound)
                continue
            if await self._replay_row(task, ctx, sinks, ref, row, judging):
                result.landed += 1
                activity.heartbeat(result.next_after)
            else:
                result.still_bad += 1
        log.info(
            "quarantine_replayed",
            task_id=inp.task_id,
            landed=result.landed,
            still_bad=result.still_bad,
            after=result.next_after,
        )
        return result

    async def _replay_context(
        self, task: TaskUnit, ref: RunRef, run: dict[str, Any], inp: ReplayBatchInput
    ) -> TaskContext:
        """The task's context as the replay runs it: the params and the run's output (its
        sink secrets) as they are now."""
        params = await work(task.replay_params, run["params"], self.settings)
        output, opened = await work(self._output, ref, run["output"])
        for name, value in opened:  # redacted in this activity's text
            register_sink_secret(name, value)
        return TaskContext(
            task_code=ref.task_code,
            task_id=ref.task_id,
            params=task.Params.model_validate(params),
            settings=self.settings,
            trace=TraceContext(inp.trace_id or new_trace_id(), new_span_id()),
            request_id=inp.request_id,
            output=output,
            replaying=True,
        )

    async def _replay_row(
        self,
        task: TaskUnit,
        ctx: TaskContext,
        sinks: list[Any],
        ref: RunRef,
        row: dict[str, Any],
        judging: Rules,
    ) -> bool:
        """One row judged by the model and task in force now (``judging``: the policy and
        the record model): sent under its own key and marked replayed (True), or kept with
        the new reason (False)."""
        rules = dataclasses.replace(judging, process=row["replay_from"] == Stage.PROCESS.value)
        judged = await work(judge, task, ctx, row["page_seq"], [row["record"]], rules)
        if judged.bad:
            await work(self._still_bad, row["id"], judged.bad[0])
            return False
        page = EmitContext(
            run_key=f"{ref.task_code}/{ref.task_id}",
            seq=row["page_seq"],
            trace=ctx.trace,
            request_id=ctx.request_id,
            task_code=ref.task_code,
            task_id=ref.task_id,
            replay_row=row["id"],
        )
        if judged.records:
            await task.emit(self.client, sinks, judged.records, page)
        await work(self._replayed, row["id"], ref.workflow_id)
        return True

    def _output(
        self, ref: RunRef, output: dict[str, Any]
    ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The run's output with its sink secrets: the run's own while they are kept, else
        the operator's configuration's (a request's own secret gone: the replay fails
        naming it)."""
        defaults = self.settings.output_defaults.get(ref.task_code, {})
        key = secrets_key(ref)

        def get(name: str) -> str | None:
            value = self.secrets.get(key, name)
            return value if value is not None else operator_secret(name, output, defaults)

        opened: list[tuple[str, str]] = []
        return unseal_output(output, get, opened), opened

    def _replayed(self, row_id: int, by: str) -> None:
        with get_engine(self.settings.database.url).begin() as conn:
            quarantine.mark_replayed(conn, row_id, by)

    def _still_bad(self, row_id: int, bad: BadRecord) -> None:
        with get_engine(self.settings.database.url).begin() as conn:
            quarantine.mark_still_bad(conn, row_id, bad)
