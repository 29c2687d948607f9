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
    RunStep,
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
from artemis.ledger import Ledger, PageDone
from artemis.metrics import RECORDS_EMITTED
from artemis.outage import outage_of
from artemis.quarantine.pages import Judge, Outcome, Tally, keep_judged, page_judge
from artemis.run_models import BatchInput, EmitResult, Outage
from artemis.sinks import EmitContext
from artemis.tasks import TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import current_trace


class BatchActivities(RunStep):
    @activity.defn(name="process_batch")
    async def process_batch(self, inp: BatchInput) -> Ledger:
        async with heartbeating():
            return await self._process_batch(inp)

    async def _process_batch(self, inp: BatchInput) -> Ledger:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = await self.task_context(task, inp.run, inp.params, trace, inp.output)
        key = run_key(inp.run)
        raw = await work(self.staging.get_pages, key, "raw", inp.first_seq, inp.last_seq)
        require_every_page(raw, inp.first_seq, inp.last_seq, "fetched")
        # The task's process and the record model's check (its own code: it may be slow,
        # or read a database) and the batch's staging reads and writes: batch-sized work.
        place = run_place(inp.run, inp.params, inp.output, ctx)
        judge = page_judge(task, ctx, place, Tally(inp.fetched, inp.stated))
        out, outcomes = await work(_processed, judge, raw)
        await keep_judged(self.db, judge, [o for _, o in outcomes])
        await work(self.staging.put_pages, key, "processed", out)
        for seq, outcome in outcomes:
            await self.report_judged(inp.run, seq, outcome)
        ledger = Ledger.starting(inp.first_seq, judges=True, delivers=False)
        ledger.count(
            {
                seq: o.done(len(records))
                for (seq, records), (_, o) in zip(raw, outcomes, strict=True)
            }
        )
        left = ledger.records_in - ledger.records_out
        left -= ledger.records_quarantined + ledger.records_filtered
        if left:
            log.info("process_dropped_records", dropped=left)
        return ledger

    @activity.defn(name="emit_batch")
    async def emit_batch(self, inp: BatchInput) -> EmitResult:
        beat = Heartbeat(self.settings.worker.heartbeat_throttle_s, Ledger.to_json)
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = await self.task_context(task, inp.run, inp.params, trace, inp.output)
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
        delivered: dict[int, PageDone] = {}
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
            delivered[seq] = PageDone(sent=0 if seq in skip else len(records), sinks=page.counts)
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
            records=state.records_emitted,
        )
        RECORDS_EMITTED.labels(inp.run.task_code).inc(state.records_emitted)
        return EmitResult(ledger=state)

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
        state: Ledger,
        above: dict[int, PageDone],
        outage: Outage,
        skip: set[int],
    ) -> EmitResult:
        """A sink is down: what this call delivered (every page of it, below the gap and
        above), for the workflow to count once and skip when it sends the rest."""
        seqs = [s for s in range(inp.first_seq, state.next_seq) if s not in skip]
        seqs += [s for s in above if s not in skip]
        ledger = state.with_above(above)
        RECORDS_EMITTED.labels(inp.run.task_code).inc(ledger.records_emitted)
        return EmitResult(ledger=ledger, outage=outage, delivered_seqs=sorted(seqs))


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


def _emit_state(inp: BatchInput) -> Ledger:
    """Where an emit attempt starts: the batch's first page, or a retried attempt's last
    heartbeat (per sink, the records of the pages delivered without a gap: a page above
    its next_seq may count again on a retry, as it may be sent again)."""
    details = activity.info().heartbeat_details
    if not details:
        return Ledger.starting(inp.first_seq, judges=False, delivers=True)
    state = Ledger.from_json(details[0])
    log.info("emit_resumed", next_seq=state.next_seq)
    return state
