"""Step 2 of a run: fetch a batch of pages from its source and stage them by sequence
number (heartbeated with its resume state: a retried attempt goes on from its last
page; a cancel — a pause, a stop — ends the batch at the next page boundary; a source's
transient failure ends it with ``FetchResult.outage`` for the workflow to wait out)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from temporalio import activity

from activities.run_base import (
    Heartbeat,
    RunActivityBase,
    beating_meanwhile,
    log,
    require_every_page,
    run_key,
    run_place,
    run_sinks,
)
from activities.streaming import PageStream
from artemis.calls import statement, work
from artemis.errors import ArtemisError, ErrorCode
from artemis.fetch_state import FetchState
from artemis.ledger import Ledger
from artemis.metrics import PAGES_FETCHED, RECORDS_EMITTED, RECORDS_FETCHED
from artemis.outage import outage_of
from artemis.quarantine.pages import page_judge
from artemis.run_models import FetchInput, FetchResult, Outage
from artemis.sources import Page
from artemis.tasks import FetchControls, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, current_trace


class FetchActivities(RunActivityBase):
    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        key = run_key(inp.run)
        beat = Heartbeat(self.settings.worker.heartbeat_throttle_s, FetchState.to_json)
        state = _resume_state(inp)
        await self._start_attempt(inp, key, state)
        fetch = BatchFetch(self, inp, key, state, beat)
        await fetch.open(current_trace())
        # Between pages too (and while the last sends finish): the resume state as of the
        # last page, while one is slow.
        stop_beating = beating_meanwhile(lambda: beat(state))
        try:
            done = await fetch.run()
        finally:
            stop_beating()
        return fetch.result(done)

    async def _stream(
        self,
        task: TaskUnit,
        inp: FetchInput,
        key: str,
        trace: TraceContext,
        state: FetchState,
        beat: Heartbeat,
    ) -> PageStream:
        """The fetch's stream to the run's sinks. Every batch before this one is delivered
        (the workflow asks for a stream only then): their staged pages can go. A retried
        attempt first sends the pages its predecessor staged and had not delivered."""
        # The run's sinks, as emit_batch builds them (its output's secrets read back here).
        ctx = await self._context(task, inp.run, inp.params, trace, inp.output)
        sinks = await run_sinks(task, ctx)
        if inp.first_seq:
            await work(self.staging.prune_below, key, inp.first_seq)
        streamed = state.stream
        assert streamed is not None, "a fetch that streams has its stream's state"
        judge = page_judge(
            task,
            ctx,
            run_place(inp.run, inp.params, inp.output, ctx),
            inp.records_before + streamed.records_in,
            state.expected_total,
            counts_pages=True,
        )
        stream = PageStream(
            task,
            ctx,
            self.client,
            sinks,
            inp.run,
            key,
            trace,
            state,
            beat,
            judge,
            lambda outcomes: self.keep_judged(judge, outcomes),
            lambda seq, outcome: self.report_judged(inp.run, seq, outcome),
        )
        below, staged_to = streamed.next_seq, state.next_seq - 1
        try:
            if staged_to >= below:
                staged = await work(self.staging.get_pages, key, "raw", below, staged_to)
                require_every_page(staged, below, staged_to, "fetched")
                log.info("stream_resumed", next_seq=below, staged_to=staged_to)
                for seq, records in staged:
                    await stream.put(seq, records)
        except BaseException:  # the stream started: it never outlives the attempt
            await stream.abort()
            raise
        return stream

    async def _start_attempt(self, inp: FetchInput, key: str, state: FetchState) -> None:
        """Where the attempt starts. A streaming fetch of this batch staged (and may have
        sent) pages its last heartbeat does not know of — a worker killed between the two,
        or an attempt that failed: it goes on after them, so each keeps its sequence number
        (and a page sent again goes with the records it went with, under the same key).
        Nothing staged from there on is counted yet: an earlier attempt's leftovers go."""
        batch = inp.first_seq if inp.stream else None
        cursor = await statement(self.db, self.staging.start_attempt, key, state.next_seq, batch)
        if cursor is not None:
            state.resume(cursor)
            log.info("fetch_resumed", next_seq=state.next_seq, source="staging")

    async def _stage_raw(
        self, key: str, seq: int, page: Page, cursor: dict[str, Any] | None = None
    ) -> None:
        """Stage one fetched page (an overwrite when a retried attempt fetches it again);
        a page seen before in this run is a SOURCE_LOOP naming the request. ``cursor``:
        where the fetch stands after it, staged with it (a streaming fetch)."""
        try:
            await statement(
                self.db,
                self.staging.put_pages,
                key,
                "raw",
                [(seq, page.records)],
                page.info.digest,
                cursor,
            )
        except ArtemisError as e:
            if e.code == ErrorCode.SOURCE_LOOP and page.info.request:
                raise e.with_request(page.info.request) from None
            raise

    async def _record_progress(self, inp: FetchInput, state: FetchState) -> None:
        # Queued, not waited for: committed with the batch's result at the latest.
        await self.record(
            inp.run,
            "progress",
            {
                "pages": state.pages,
                "records": state.records,
                "units_done": state.units_done,
                "total": inp.total,
                "expected_total": state.expected_total,
            },
            "step_fetch",
            soon=True,
        )


class BatchFetch:
    """One attempt of a fetch, in named pieces: the page loop (``_pump``: request,
    stage, count, next page), the batch's end (``_batch_full``), the cancel shield (a
    pause or a stop ends the batch at a page boundary), the stream beside it (its pages
    processed and emitted while fetching) and the progress it reports. ``state`` is the
    resume state, heartbeated after every page."""

    def __init__(
        self,
        acts: FetchActivities,
        inp: FetchInput,
        key: str,
        state: FetchState,
        beat: Heartbeat,
    ) -> None:
        self.acts = acts
        self.inp = inp
        self.key = key
        self.state = state
        self.beat = beat
        self.task: TaskUnit = get_task(inp.run.task_code)
        # No new request from the source: the pages in flight are taken into the batch.
        self.wind_down = asyncio.Event()
        # Set when Temporal cancels the fetch (a pause, a stop; learnt with the answer to
        # a heartbeat): no new request, the page in flight is taken, then the batch ends
        # at that page boundary with its checkpoint.
        self.stop = asyncio.Event()
        self.stream: PageStream | None = None
        self.streamed: Ledger | None = None
        self.callback: Any = None
        self.last_ms = inp.progress_last_ms
        self.outage: Outage | None = None
        self.progress_every = acts.settings.events.progress_min_interval_ms / 1000

    async def open(self, trace: TraceContext) -> None:
        """The task's context and its fetch controls, the CronJob's progress, the stream
        (when asked), and the source's pages from the checkpoint."""
        inp, task, state = self.inp, self.task, self.state
        self.ctx = await self.acts._context(task, inp.run, inp.params, trace)
        self.ctx.controls = FetchControls(
            qps=inp.qps or None,
            # A retried attempt: the source's last request may have been served, its
            # answer lost.
            resumed=activity.info().attempt > 1 or inp.resumed,
            # A task waiting on its source (a 429's Retry-After) keeps the attempt alive
            # without losing the resume state.
            keepalive=lambda: self.beat(state),
            wind_down=self.wind_down,
            max_pages=max(0, inp.max_pages - state.pages),
        )
        try:
            self.callback = await self.acts._callback(inp.run, inp.callback, trace)
        except ArtemisError as e:  # progress is best effort: never fail the fetch over it
            log.warning("callback_progress_disabled", error=str(e))
        if inp.stream:
            try:
                self.stream = await self.acts._stream(task, inp, self.key, trace, state, self.beat)
            except ArtemisError as e:
                # The batch path takes the whole batch over (it waits a sink out, or fails
                # the run); a page an earlier attempt sent goes under its key.
                log.info("stream_unavailable", code=e.code.value, error=str(e)[:300])
        self.started = self.progress_at = time.monotonic()
        client = task.source_client(self.acts.client, self.ctx)
        self.pages = task.fetch(self.ctx, client, state.checkpoint)

    async def run(self) -> bool:
        """Fetch the batch; True when the source is done. A transient failure of the
        source (or staging) ends it with ``outage`` set: the pages so far count, and the
        workflow waits, then fetches on from their checkpoint."""
        done = False
        try:
            done = True if self.state.done else await self._shielded()
        except asyncio.CancelledError:
            log.info("fetch_cancelled", next_seq=self.state.next_seq, pages=self.state.pages)
            await self._abort_stream()
            raise
        except ArtemisError as e:
            if self.inp.report_outages and not self.task.error_budgets:
                self.outage = outage_of(e, "source", self.task.source_name(self.ctx))
            if self.outage is None:
                await self._abort_stream()
                raise
        except BaseException:
            await self._abort_stream()
            raise
        finally:
            await self.pages.aclose()
        await self._close_stream()
        # (with an outage the workflow logs the wait, one line per attempt)
        return done and self.outage is None

    async def _shielded(self) -> bool:
        """The page loop, shielded: Temporal's cancel stops the batch at a page boundary."""
        pumping = asyncio.create_task(self._pump())
        cancelled = False
        while True:
            try:
                return await asyncio.shield(pumping)
            except asyncio.CancelledError:
                if cancelled or not activity.is_cancelled():
                    # Cancelled twice, or not by Temporal (the event loop ends).
                    pumping.cancel()
                    with contextlib.suppress(BaseException):
                        await pumping
                    raise
                cancelled = True
                log.info("fetch_cancelled", next_seq=self.state.next_seq, stops="at its next page")
                self.stop.set()
                self.wind_down.set()

    async def _pump(self) -> bool:
        """Fetch and stage pages until the batch is full; True when the source is done."""
        async for page in self.pages:
            await self._take(page)
            if page.checkpoint is None:
                return True
            if self._batch_full():
                if not self.task.fetch_winds_down:
                    return False
                # No new request; the pages in flight are taken into this batch.
                self.wind_down.set()
        # A fetch that winds down ends early with a checkpoint: it says "done" only by a
        # last page without one (handled above).
        return not self.task.fetch_winds_down and not self.stop.is_set()

    async def _take(self, page: Page) -> None:
        """One page: staged (and streamed), counted, heartbeated, reported."""
        state, inp = self.state, self.inp
        seq = state.next_seq
        # Streaming: the page may be sent before this heartbeat reaches Temporal; where
        # the fetch stands is staged with it (a retry resumes there).
        cursor = state.after(page).cursor(inp.first_seq) if self.stream is not None else None
        await self.acts._stage_raw(self.key, seq, page, cursor)
        if self.stream is not None:
            self.stream.judge.stated = page.info.expected_total
            await self.stream.put(seq, page.records)
        state.take(page)
        self.beat(state)
        now = time.monotonic()
        if page.checkpoint is None or now - self.progress_at >= self.progress_every:
            self.progress_at = now
            await self.acts._record_progress(inp, state)
        if self.callback is not None:
            self.last_ms = await self.callback.progress(
                state.units_done,
                inp.total,
                f"{page.info.source or 'fetch'}: {state.records} records",
                self.last_ms,
                seq,
            )

    def _batch_full(self) -> bool:
        """The batch ends here: a cancel, a stream whose sink refused a page, its pages or
        its time used up, or the worker shutting down (SIGTERM: what is fetched returns
        with its checkpoint; the next fetch goes on elsewhere, nothing twice)."""
        return (
            self.stop.is_set()
            or (self.stream is not None and self.stream.refused.is_set())
            or self.state.pages >= self.inp.max_pages
            or time.monotonic() - self.started >= self.inp.max_seconds
            or activity.is_worker_shutdown()
        )

    async def _abort_stream(self) -> None:
        if self.stream is not None:
            await self.stream.abort()

    async def _close_stream(self) -> None:
        """The pages staged are delivered (or left to process/emit from the gap on)."""
        if self.stream is None:
            return
        try:
            self.streamed = streamed = await self.stream.close()
        except BaseException:  # cancelled meanwhile: nothing is sent after the attempt
            await self.stream.abort()
            raise
        log.info(
            "stream_emit_done",
            first_seq=self.inp.first_seq,
            delivered_below=streamed.next_seq,
            records=streamed.records_emitted,
            stopped=streamed.stopped,
        )
        RECORDS_EMITTED.labels(self.inp.run.task_code).inc(streamed.records_emitted)

    def result(self, done: bool) -> FetchResult:
        inp, state = self.inp, self.state
        log.info(
            "fetch_batch_done",
            first_seq=inp.first_seq,
            next_seq=state.next_seq,
            pages=state.pages,
            records=state.records,
            done=done,
        )
        PAGES_FETCHED.labels(inp.run.task_code).inc(state.pages)
        RECORDS_FETCHED.labels(inp.run.task_code).inc(state.records)
        return FetchResult(
            first_seq=inp.first_seq,
            next_seq=state.next_seq,
            pages=state.pages,
            records=state.records,
            checkpoint=None if done else state.checkpoint,
            done=done,
            units_done=state.units_done,
            progress_last_ms=self.last_ms,
            expected_total=state.expected_total,
            incomplete=state.incomplete,
            outage=self.outage,
            streamed=self.streamed,
            responses_ignored=state.responses_ignored,
            resources=state.resources,
        )


def _resume_state(inp: FetchInput) -> FetchState:
    """Where a fetch attempt starts: the batch's start, or — a retried attempt — its last
    heartbeat (pages staged before it are kept: staging by sequence number makes a
    re-fetched page an overwrite, not a duplicate)."""
    state = FetchState(
        checkpoint=inp.checkpoint,
        next_seq=inp.first_seq,
        units_done=inp.units_done,
        stream=Ledger.starting(inp.first_seq, judges=True, delivers=True) if inp.stream else None,
    )
    details = activity.info().heartbeat_details
    if details:
        state.resume(details[0])
        log.info("fetch_resumed", next_seq=state.next_seq, pages=state.pages)
    return state
