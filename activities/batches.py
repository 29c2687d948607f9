"""Steps 3 and 4 of a run: process a staged batch (the task's record shaping) and emit
it to the run's sinks, pages ``emit_concurrency`` at a time, each under its own
idempotency key; the heartbeat resumes after the pages delivered without a gap, and a
sink's transient failure ends the call with what it delivered (``EmitResult.outage``)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from activities.run_base import (
    Heartbeat,
    RunActivityBase,
    all_or_first_error,
    heartbeating,
    log,
    require_every_page,
    run_key,
    run_place,
    run_sinks,
)
from artemis.calls import work
from artemis.errors import ArtemisError
from artemis.fetch_state import EmitState
from artemis.metrics import RECORDS_EMITTED
from artemis.outage import outage_of
from artemis.quarantine.pages import Judge, Outcome, page_judge
from artemis.run_models import BatchInput, EmitResult, Outage, ProcessResult
from artemis.sinks import EmitContext
from artemis.tasks import TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import current_trace


class BatchActivities(RunActivityBase):
    @activity.defn(name="process_batch")
    async def process_batch(self, inp: BatchInput) -> ProcessResult:
        async with heartbeating():
            return await self._process_batch(inp)

    async def _process_batch(self, inp: BatchInput) -> ProcessResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = await self._context(task, inp.run, inp.params, trace, inp.output)
        key = run_key(inp.run)
        raw = await work(self.staging.get_pages, key, "raw", inp.first_seq, inp.last_seq)
        require_every_page(raw, inp.first_seq, inp.last_seq, "fetched")
        # The task's process and the record model's check (its own code: it may be slow,
        # or read a database) and the batch's staging reads and writes: batch-sized work.
        judge = page_judge(
            task,
            ctx,
            run_place(inp.run, inp.params, inp.output, ctx),
            inp.fetched,
            inp.stated,
            counts_pages=False,
        )
        out, outcomes = await work(_processed, judge, raw)
        await self.keep_judged(judge, [o for _, o in outcomes])
        await work(self.staging.put_pages, key, "processed", out)
        for seq, outcome in outcomes:
            await self.report_judged(inp.run, seq, outcome)
        n_in = sum(len(records) for _, records in raw)
        n_out = sum(len(records) for _, records in out)
        n_bad = sum(o.quarantined for _, o in outcomes)
        n_filtered = sum(o.filtered for _, o in outcomes)
        if n_out + n_bad + n_filtered != n_in:
            log.info("process_dropped_records", dropped=n_in - n_out - n_bad - n_filtered)
        return ProcessResult(
            records_in=n_in,
            records_out=n_out,
            records_quarantined=n_bad,
            fields_dropped=sum(o.dropped for _, o in outcomes),
            records_filtered=n_filtered,
        )

    @activity.defn(name="emit_batch")
    async def emit_batch(self, inp: BatchInput) -> EmitResult:
        beat = Heartbeat(self.settings.worker.heartbeat_throttle_s, EmitState.to_json)
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = await self._context(task, inp.run, inp.params, trace, inp.output)
        sinks = await run_sinks(task, ctx)
        key = run_key(inp.run)
        state = _emit_state(inp)
        pages = await self._pages_to_emit(inp, key, state.next_seq)
        skip = set(inp.skip_seqs)
        # Pages go out ``emit_concurrency`` at a time, each under its own key. One
        # delivered above a gap waits in ``delivered`` with its counts until the pages
        # below it are delivered too: the heartbeat resumes after the gapless ones, so a
        # retry sends it again (same key: the sink takes it once) and must not count it
        # twice. Pages an earlier call delivered (``skip_seqs``) count nothing here.
        delivered: dict[int, tuple[int, dict[str, int]]] = {}
        gate = asyncio.Semaphore(task.emit_concurrency(ctx))
        # Set at a sink's first transient failure (report_outages): no new page starts.
        halted: list[Outage] = []

        async def deliver(seq: int, records: list[dict[str, Any]]) -> None:
            page = EmitContext(
                run_key=key,
                seq=seq,
                trace=trace,
                request_id=inp.run.request_id,
                task_code=inp.run.task_code,
                task_id=inp.run.task_id,
            )
            if records and seq not in skip:
                async with gate:
                    if halted:
                        return
                    outage = await self._send(task, sinks, records, page, inp.report_outages)
                    if outage is not None:
                        halted.append(outage)
                        return
            delivered[seq] = (0 if seq in skip else len(records), page.counts)
            state.count(delivered)
            beat(state)

        try:
            await all_or_first_error(deliver(seq, records) for seq, records in pages)
        except asyncio.CancelledError:
            log.info("emit_cancelled", next_seq=state.next_seq)
            raise
        if halted:
            return self._emit_halted(inp, state, delivered, halted[0], skip)
        log.info(
            "emit_batch_done",
            first_seq=inp.first_seq,
            last_seq=inp.last_seq,
            records=state.records,
        )
        RECORDS_EMITTED.labels(inp.run.task_code).inc(state.records)
        return EmitResult(records_emitted=state.records, batches=state.batches, sinks=state.sinks)

    async def _pages_to_emit(
        self, inp: BatchInput, key: str, from_seq: int
    ) -> list[tuple[int, list[dict[str, Any]]]]:
        """The batch's processed pages from ``from_seq`` on (every one must be there)."""
        if inp.prune_below is not None:
            # The batches before this one were delivered (emits run in order): staging
            # keeps only what is not, so a long sink outage stages no more than the
            # batches the fetch side may be ahead (runs.max_batches_ahead).
            await work(self.staging.prune_below, key, inp.prune_below)
        pages = await work(self.staging.get_pages, key, "processed", from_seq, inp.last_seq)
        require_every_page(pages, from_seq, inp.last_seq, "processed")
        return pages

    async def _send(
        self,
        task: TaskUnit,
        sinks: list[Any],
        records: list[dict[str, Any]],
        page: EmitContext,
        report_outages: bool,
    ) -> Outage | None:
        """One page to every sink; a sink failing transiently (when the workflow waits
        outages out) is the outage returned, anything else raises."""
        try:
            await task.emit(self.client, sinks, records, page)
        except ArtemisError as e:
            names = ",".join(s.name for s in sinks)
            outage = outage_of(e, "sink", names) if report_outages else None
            if outage is None:
                raise
            return outage
        return None

    def _emit_halted(
        self,
        inp: BatchInput,
        state: EmitState,
        above: dict[int, tuple[int, dict[str, int]]],
        outage: Outage,
        skip: set[int],
    ) -> EmitResult:
        """A sink is down: what this call delivered (every page of it, below the gap and
        above), for the workflow to count once and skip when it sends the rest."""
        records, batches, sinks = state.records, state.batches, dict(state.sinks)
        for n, counts in above.values():
            records += n
            batches += 1 if n else 0
            for name, taken in counts.items():
                sinks[name] = sinks.get(name, 0) + taken
        seqs = [s for s in range(inp.first_seq, state.next_seq) if s not in skip]
        seqs += [s for s in above if s not in skip]
        RECORDS_EMITTED.labels(inp.run.task_code).inc(records)
        return EmitResult(
            records_emitted=records,
            batches=batches,
            sinks=sinks,
            outage=outage,
            delivered_seqs=sorted(seqs),
        )


def _processed(
    judge: Judge, raw: list[tuple[int, Any]]
) -> tuple[list[tuple[int, list[dict[str, Any]]]], list[tuple[int, Outcome]]]:
    """The batch's pages judged (the task's ``process``, then the record model's check):
    the records that go on, page by page, and each page's outcome."""
    out: list[tuple[int, list[dict[str, Any]]]] = []
    outcomes: list[tuple[int, Outcome]] = []
    for seq, records in raw:
        outcome = judge.page(seq, records)
        out.append((seq, outcome.records))
        outcomes.append((seq, outcome))
    return out, outcomes


def _emit_state(inp: BatchInput) -> EmitState:
    """Where an emit attempt starts: the batch's first page, or a retried attempt's last
    heartbeat (per sink, the records of the pages delivered without a gap: a page above
    its next_seq may count again on a retry, as it may be sent again)."""
    details = activity.info().heartbeat_details
    if not details:
        return EmitState(inp.first_seq)
    state = EmitState.from_json(details[0])
    log.info("emit_resumed", next_seq=state.next_seq)
    return state
