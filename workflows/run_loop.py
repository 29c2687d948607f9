"""The batch loop of a task run: prepare, then (fetch a batch of pages → process → emit)*.

The next fetch runs while the previous batch is processed and emitted, so Temporal's
per-activity cost hides behind network time; at most ``runs.max_batches_ahead`` batches
are fetched but not emitted. Records never enter history (claim check): activities stage
pages by sequence number and hand back counts, sequence numbers and checkpoints.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import retry_policies
from workflows.run_core import RunContext, quietly
from workflows.run_fanout import FanOut
from workflows.run_outages import OutageWaits

with workflow.unsafe.imports_passed_through():
    from activities.task_run import TaskRunActivities
    from artemis.errors import ErrorCode
    from artemis.ledger import Ledger
    from artemis.run_models import (
        SA_PROVENANCE,
        SA_TASK_TYPE,
        BatchInput,
        EmitResult,
        FetchInput,
        FetchResult,
        PrepareInput,
        provenance_queue,
    )
    from artemis.run_state import LOOP_STEPS, PrepareResult
    from artemis.temporal.failures import code_of, was_cancelled

KEY_PROVENANCE = SearchAttributeKey.for_keyword(SA_PROVENANCE)
KEY_TASK_TYPE = SearchAttributeKey.for_keyword(SA_TASK_TYPE)


class BatchLoop:
    """Prepare, then the pages: fetch, process and emit, in batches."""

    def __init__(self, run: RunContext, outages: OutageWaits, fanout: FanOut) -> None:
        self.run = run
        self.outages = outages
        self.fanout = fanout

    async def _prepare(self) -> None:
        """Step 1: validated params, the run's size and its source's settings; how many
        child runs (and how many at a time) when the run fans out."""
        req = self.run.req
        self.run.enter("step_prepare")
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=60),
            "retry_policy": retry_policies.PREPARE,
            "summary": f"Validate params of {req.task_code}",
        }
        inp = PrepareInput(run=self.run.ref, params=req.params)
        # A local activity (a validation, perhaps a registry read), decided in the run's
        # first workflow task: no task-queue round trip.
        prepared: PrepareResult = await workflow.execute_local_activity_method(
            TaskRunActivities.prepare_params, inp, **options
        )
        self.run.state.prepared(prepared)
        known = {SA_PROVENANCE: KEY_PROVENANCE, SA_TASK_TYPE: KEY_TASK_TYPE}
        updates = [known[k].value_set(v) for k, v in prepared.search.items() if k in known]
        if updates:
            workflow.upsert_search_attributes(updates)
        self.run.state.complete("step_prepare")

    async def main(self) -> None:
        if self.run.params is None:
            await self._prepare()
        if self.run.state.fan_out is not None:
            # Its child runs fetch, emit and finish their own sinks.
            self.run.state.parent = True
            if not await self.fanout.run_planned():
                self._continue_as_new()
            return
        line = EmitLine(self, max(1, self.run.req.tuning.max_batches_ahead))
        evicted = False
        try:
            await self._deliver_kept(line)
            if not await self._fetch_all(line):
                return  # split into child runs: they finish the window
            await line.drain(0)
        except GeneratorExit:
            # The run was evicted from the worker's cache mid-await and its coroutine is
            # being closed: nothing may be awaited now (the run resumes by replay).
            evicted = True
            raise
        finally:
            await line.close(evicted)
        self.run.state.complete(*LOOP_STEPS)

    async def _deliver_kept(self, line: EmitLine) -> None:
        """A run finished by POST /tasks/{id}/retry first delivers what its failed
        attempt had staged and not delivered (skipping the pages it had)."""
        state = self.run.state
        done_to = state.processed_through
        for first, last in state.undelivered:
            # what was processed then is processed again, not counted again
            for lo, hi, again in (
                (first, min(last, done_to), True),
                (max(first, done_to + 1), last, False),
            ):
                if lo <= hi:
                    await line.drain(max(line.ahead - 2, 0))
                    line.hand_over(lo, hi, beside_fetch=not state.fetch_done, again=again)
        state.undelivered = []

    async def _fetch_all(self, line: EmitLine) -> bool:
        """Fetch batch after batch to the source's end, each handed to the emit line;
        False when the window was split into child runs instead."""
        state = self.run.state
        batches_here = 0
        while not state.fetch_done:
            await self._wait_while_paused()
            await line.drain(line.ahead - 1)
            await line.pop_done()  # (a batch that failed fails the run here)
            # Emit while fetching once every earlier batch is delivered (in order).
            stream = self.run.req.tuning.emit_while_fetching and not line.pending
            self.run.enter("step_fetch")
            if stream:
                state.working("step_process")
                state.working("step_emit")
            try:
                fetched = await self._fetched(self._start_fetch(stream))
            except ActivityError as e:
                if state.paused and was_cancelled(e):
                    # Paused before it staged a page it could report: fetch afresh.
                    state.resume_fetch = True
                    continue
                if code_of(e) == ErrorCode.RESULT_CAP_EXCEEDED and not state.stats["pages"]:
                    # The window holds more hits than the source can list: split it.
                    await self.fanout.split(e)
                    return False
                if await self._waited_out(e):
                    continue
                raise
            await self._take(line, fetched)
            if fetched.outage is not None:
                # The source is down: what it gave goes on to the sinks meanwhile.
                await self.outages.wait_out(fetched.outage)
                state.resume_fetch = True
                continue
            batches_here += 1
            if not state.fetch_done and (
                batches_here >= self.run.req.tuning.max_batches_per_run
                or workflow.info().is_continue_as_new_suggested()
            ):
                await line.drain(0)
                self._continue_as_new()
        return True

    async def _wait_while_paused(self) -> None:
        if self.run.state.paused:
            self.run.state.stopped_fetching()
            self.run.details()
            # A durable wait: no worker is held while the run is paused.
            await workflow.wait_condition(
                lambda: not self.run.state.paused or self.run.state.stopping
            )
            self.run.stop_point()

    async def _waited_out(self, e: ActivityError) -> bool:
        """The fetch failed on an outage of the staging store, or often enough for the
        circuit breaker: waited out, the next fetch goes on from the same checkpoint.
        False: neither case (the failure is the run's)."""
        store = self.outages.store_outage(e)
        if store is not None:
            await self.outages.wait_out(store)
        elif not await self.outages.rest_after_failures(e):
            return False
        self.run.state.resume_fetch = True
        return True

    async def _take(self, line: EmitLine, fetched: FetchResult) -> None:
        """A batch fetched: counted, the run standing after it, and its pages not yet
        delivered handed to the emit line. A sink that refused a page for good, or a
        source that ended short of its own count, fails the run (what came is delivered
        first)."""
        state = self.run.state
        state.fetched(fetched)
        state.resume_fetch = False
        first, last = fetched.first_seq, fetched.next_seq - 1
        if fetched.streamed is not None:
            # Pages already delivered: counted before a stop can end the loop here, the
            # run standing after them (a run kept for a retry does not count them again).
            state.checkpoint, state.next_seq = fetched.checkpoint, fetched.next_seq
            first = self._streamed(fetched.streamed, first)
        self.run.stop_point()
        state.progress_last_ms = fetched.progress_last_ms
        state.checkpoint, state.next_seq = fetched.checkpoint, fetched.next_seq
        if fetched.done:
            state.fetch_done = True
        if fetched.pages or fetched.outage is None:
            self.outages.recovered("source")  # pages came: a new outage counts afresh
        self.run.details()
        if fetched.streamed is not None and fetched.streamed.error is not None:
            # a sink refused a page for good: the run fails as emit_batch would
            await line.drain(0)
            raise ApplicationError(
                str(fetched.streamed.error.get("message")),
                type=str(fetched.streamed.error.get("code")),
                non_retryable=True,
            )
        await line.drain(max(line.ahead - 2, 0))
        if last >= first:
            line.hand_over(first, last, beside_fetch=not state.fetch_done)
        if fetched.incomplete is not None:
            # A source ended short of its own count: what it gave is delivered, then the
            # run fails visibly (never `completed`).
            await line.drain(0)
            raise ApplicationError(
                str(fetched.incomplete.get("message")),
                fetched.incomplete,
                type=ErrorCode.INCOMPLETE,
                non_retryable=True,
            )

    def _continue_as_new(self) -> None:
        """The next generation of the run, from where this one stands (long runs keep
        their histories short)."""
        self.run.log(
            "continue_as_new",
            next_seq=self.run.state.next_seq,
            generation=self.run.state.generation + 1,
        )
        workflow.continue_as_new(
            dataclasses.replace(self.run.req, carry=self.run.state.next_generation())
        )

    def _streamed(self, streamed: Ledger, first: int) -> int:
        """A fetch's pages processed and emitted concurrently with it: its ledger counted, the run
        standing after it; the first page of the batch it did not deliver (the rest go
        through process and emit)."""
        self.run.state.count(streamed)
        self.run.state.stand_after(streamed)
        if streamed.next_seq > first:
            self.outages.recovered("sink")  # pages went through: a new outage counts afresh
        return streamed.next_seq

    def _start_fetch(self, stream: bool = False) -> workflow.ActivityHandle[FetchResult]:
        """The next batch's fetch, from the checkpoint (on the provenance's own queue);
        ``stream``: its pages processed and emitted concurrently with it."""
        req, tuning, state = self.run.req, self.run.req.tuning, self.run.state
        return workflow.start_activity_method(
            TaskRunActivities.fetch_pages,
            FetchInput(
                run=self.run.ref,
                params=self.run.params or {},
                checkpoint=state.checkpoint,
                first_seq=state.next_seq,
                max_pages=state.pages_per_fetch or tuning.pages_per_fetch,
                max_seconds=tuning.fetch_max_seconds,
                total=self.run.state.total,
                units_done=self.run.state.current,
                callback=req.callback,
                progress_last_ms=state.progress_last_ms,
                qps=self.run.state.qps,
                resumed=self.run.state.resume_fetch,
                report_outages=self.outages.reports_outages(),
                stream=stream,
                output=req.output if stream else {},
                records_before=int(self.run.state.stats.get("records_fetched") or 0),
            ),
            start_to_close_timeout=timedelta(seconds=tuning.fetch_start_to_close_s),
            heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
            retry_policy=retry_policies.fetch(state.fetch_retry, state.breaker, tuning),
            task_queue=provenance_queue(workflow.info().task_queue, state.rate_key)
            if state.rate_key
            else None,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"Fetch pages from #{state.next_seq}"
            + (", process and emit them concurrently" if stream else ""),
        )

    async def _fetched(self, fetch: workflow.ActivityHandle[FetchResult]) -> FetchResult:
        """The fetch's result; a pause meanwhile cancels it, and the fetch (learning of
        it through its heartbeat) returns the pages it has staged so far."""

        async def pause_it() -> None:
            await workflow.wait_condition(lambda: self.run.state.paused)
            self.run.state.stopping_fetch()
            self.run.details()
            fetch.cancel()

        watcher = asyncio.create_task(pause_it())
        try:
            return await fetch
        finally:
            watcher.cancel()

    async def _process_and_emit(
        self,
        first: int,
        last: int,
        beside_fetch: bool = False,
        after: asyncio.Task[None] | None = None,
        again: bool = False,
    ) -> None:
        """Process a staged batch, then emit it once the batch before it is emitted.
        ``again``: the batch of a failed attempt (a retried run), processed and counted
        then; it is processed again, not counted again."""
        state = self.run.state
        batch = BatchInput(
            run=self.run.ref,
            params=self.run.params or {},
            first_seq=first,
            last_seq=last,
            output=self.run.req.output,
            fetched=int(state.stats.get("records_fetched") or 0),
            stated=state.stats.get("expected_total"),
        )
        state.working("step_process")
        processed = await self._process(batch, beside_fetch)
        self.outages.recovered("store")
        self.run.stop_point()
        if not again:
            state.count(processed)
            state.stand_after(processed)
        if after is not None:
            await after  # emitted in order: the batch before this one first
        state.working("step_emit")
        await self._emit_all(batch, first, last)
        self.outages.recovered("sink")
        state.delivered_above = []
        self.run.details()

    async def _process(self, batch: BatchInput, beside_fetch: bool) -> Ledger:
        """The batch processed (an outage of the staging store waited out)."""
        tuning = self.run.req.tuning
        options: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=120),
            "retry_policy": retry_policies.process(tuning),
            "summary": f"Process pages #{batch.first_seq}-#{batch.last_seq}",
        }
        while True:
            try:
                if beside_fetch:
                    # A heartbeat timeout: a batch lost with its worker runs again in seconds.
                    return await workflow.execute_activity_method(
                        TaskRunActivities.process_batch,
                        batch,
                        heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
                        **options,
                    )
                # The last batch (nothing to overlap): one round trip fewer as a local
                # activity.
                return await workflow.execute_local_activity_method(
                    TaskRunActivities.process_batch, batch, **options
                )
            except ActivityError as e:
                store = self.outages.store_outage(e)
                if store is None:
                    raise
                await self.outages.wait_out(store)

    async def _emit_all(self, batch: BatchInput, first: int, last: int) -> None:
        """Emit the batch's pages until every sink took them: an outage of the staging
        store or of a sink is waited out, and the pages a sink took meanwhile are not sent
        again."""
        state = self.run.state
        skip = [s for s in state.delivered_above if first <= s <= last]
        while True:
            try:
                emitted = await self._emit(batch, first, last, skip)
            except ActivityError as e:
                store = self.outages.store_outage(e)
                if store is None:
                    raise
                await self.outages.wait_out(store)
                continue
            self.outages.recovered("store")
            state.count(emitted.ledger)
            state.stand_after(emitted.ledger)
            if emitted.outage is None:
                return
            # A sink is down: the pages it took count now and are not sent again.
            skip = sorted({*skip, *emitted.delivered_seqs})
            state.delivered_above = skip
            if emitted.delivered_seqs:
                self.outages.recovered("sink")  # pages went through: a new outage counts afresh
            self.run.details()
            await self.outages.wait_out(emitted.outage)

    async def _emit(self, batch: BatchInput, first: int, last: int, skip: list[int]) -> EmitResult:
        """One emit of the batch's pages (but ``skip``, delivered by an earlier one)."""
        tuning = self.run.req.tuning
        return await workflow.execute_activity_method(
            TaskRunActivities.emit_batch,
            dataclasses.replace(
                batch,
                skip_seqs=skip,
                report_outages=self.outages.reports_outages(),
                prune_below=first,
            ),
            start_to_close_timeout=timedelta(seconds=tuning.emit_start_to_close_s),
            heartbeat_timeout=timedelta(seconds=tuning.heartbeat_timeout_s),
            retry_policy=retry_policies.emit(tuning),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"Emit pages #{first}-#{last}"
            + (f" (again, {len(skip)} delivered)" if skip else ""),
        )


class EmitLine:
    """Batches being processed and emitted, in order: each waits for the one before it
    to be emitted. At most ``ahead`` batches are fetched but not emitted: a batch is
    handed over once at most ahead - 2 are still on their way, and the next fetch
    starts once at most ahead - 1 are."""

    def __init__(self, loop: BatchLoop, ahead: int) -> None:
        self.loop = loop
        self.ahead = ahead
        self.pending: list[asyncio.Task[None]] = []

    def hand_over(self, first: int, last: int, beside_fetch: bool, again: bool = False) -> None:
        after = self.pending[-1] if self.pending else None
        self.pending.append(
            asyncio.create_task(
                self.loop._process_and_emit(first, last, beside_fetch, after, again)
            )
        )

    async def drain(self, keep: int) -> None:
        """Wait until at most ``keep`` batches are on their way."""
        while len(self.pending) > keep:
            await self.pending.pop(0)

    async def pop_done(self) -> None:
        """Take the batches already delivered off the line (a failed one raises)."""
        while self.pending and self.pending[0].done():
            await self.pending.pop(0)

    async def close(self, evicted: bool) -> None:
        """Cancel what is still on its way (awaiting it, unless the run was evicted)."""
        for task in self.pending:
            if not task.done():
                task.cancel()
                if not evicted:
                    await quietly(task)
