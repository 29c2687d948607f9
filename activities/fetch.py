"""Step 2 of a run: fetch a batch of pages from its source and stage them by sequence
number (heartbeated with its resume state: a retried attempt goes on from its last
page; a cancel — a pause, a stop — ends the batch at the next page boundary; a source's
transient failure ends it with ``FetchResult.outage`` for the workflow to wait out).

**Emit while fetching** (``FetchInput.stream``): the pages are processed and sent to the
run's sinks as they are staged (``PageStream``), so the last page's emit, not the last
batch's, is a run's tail. The guarantees are the batch path's: a page is staged before it
is processed, processed in order (the task's ``process`` sees the pages one after
another), sent ``emit_concurrency`` pages at a time under its own idempotency key (run
key, sink, sequence number), and counted once it and every page before it are delivered
— by the stream's delivery ledger (``artemis/ledger.py``), which lives in the fetch's
heartbeat, so a retried attempt (a worker SIGKILLed mid-batch) sends again only the
pages above it, under the same keys. The first failure — a sink down, a record the task
cannot process — stops the stream: the pages from the gap on go through process_batch
and emit_batch (``activities/batches.py``), which wait out outages or fail the run; a
sink's refusal for good (a non-retryable error) fails the run with it, never sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from temporalio import activity

from activities.run_base import (
    Heartbeat,
    RunStep,
    beating_meanwhile,
    log,
    require_every_page,
    run_key,
    run_place,
    run_sinks,
)
from artemis.calls import statement, work
from artemis.errors import ArtemisError, ErrorCode
from artemis.fetch_state import FetchState
from artemis.ledger import Ledger, PageDone
from artemis.metrics import PAGES_FETCHED, RECORDS_EMITTED, RECORDS_FETCHED
from artemis.outage import outage_of
from artemis.quarantine.pages import Judge, Outcome, Tally, keep_judged, page_judge
from artemis.redact import redact_text
from artemis.run_models import FetchInput, FetchResult, Outage
from artemis.sinks import EmitContext, Sink
from artemis.sources import Page
from artemis.tasks import FetchControls, TaskContext, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, current_trace


class FetchActivities(RunStep):
    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        beat = Heartbeat(self.settings.worker.heartbeat_throttle_s, FetchState.to_json)
        fetch = BatchFetch(self, inp, _resume_state(inp), beat)
        await fetch.start_attempt()
        await fetch.open(current_trace())
        # Between pages too (and while the last sends finish): the resume state as of the
        # last page, while one is slow.
        stop_beating = beating_meanwhile(lambda: beat(fetch.state))
        try:
            done = await fetch.run()
        finally:
            stop_beating()
        return fetch.result(done)


class BatchFetch:
    """One attempt of a fetch, in named pieces: the page loop (``_pump``: request,
    stage, count, next page), the batch's end (``_batch_full``), the cancel shield (a
    pause or a stop ends the batch at a page boundary), the stream concurrently with it (its pages
    processed and emitted while fetching) and the progress it reports. ``state`` is the
    resume state, heartbeated after every page."""

    def __init__(
        self, acts: FetchActivities, inp: FetchInput, state: FetchState, beat: Heartbeat
    ) -> None:
        self.acts = acts
        self.inp = inp
        self.key = run_key(inp.run)
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
        self.trace = trace
        self.ctx = await self.acts.task_context(task, inp.run, inp.params, trace)
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
            self.callback = await self.acts.cronjob_client(inp.run, inp.callback, trace)
        except ArtemisError as e:  # progress is best effort: never fail the fetch over it
            log.warning("callback_progress_disabled", error=str(e))
        if inp.stream:
            try:
                self.stream = await self._open_stream(trace)
            except ArtemisError as e:
                # The batch path takes the whole batch over (it waits a sink out, or fails
                # the run); a page an earlier attempt sent goes under its key.
                log.info("stream_unavailable", code=e.code.value, error=str(e)[:300])
        self.started = self.progress_at = time.monotonic()
        client = task.source_client(self.acts.client, self.ctx)
        self.pages = task.fetch(self.ctx, client, state.checkpoint)

    async def start_attempt(self) -> None:
        """Where the attempt starts. A streaming fetch of this batch staged (and may have
        sent) pages its last heartbeat does not know of — a worker killed between the two,
        or an attempt that failed: it goes on after them, so each keeps its sequence number
        (and a page sent again goes with the records it went with, under the same key).
        Nothing staged from there on is counted yet: an earlier attempt's leftovers go."""
        inp, state, staging = self.inp, self.state, self.acts.staging
        batch = inp.first_seq if inp.stream else None
        cursor = await statement(
            self.acts.db, staging.start_attempt, self.key, state.next_seq, batch
        )
        if cursor is not None:
            state.resume(cursor)
            log.info("fetch_resumed", next_seq=state.next_seq, source="staging")

    async def _open_stream(self, trace: TraceContext) -> PageStream:
        """The fetch's stream to the run's sinks. Every batch before this one is delivered
        (the workflow asks for a stream only then): their staged pages can go. A retried
        attempt first sends the pages its predecessor staged and had not delivered."""
        inp, task, state, acts = self.inp, self.task, self.state, self.acts
        # The run's sinks, as emit_batch builds them (its output's secrets read back here).
        ctx = await acts.task_context(task, inp.run, inp.params, trace, inp.output)
        sinks = await run_sinks(task, ctx)
        if inp.first_seq:
            await work(acts.staging.prune_below, self.key, inp.first_seq)
        streamed = state.stream
        assert streamed is not None, "a fetch that streams has its stream's ledger"
        tally = Tally(inp.records_before + streamed.records_in, state.expected_total, True)
        judge = page_judge(task, ctx, run_place(inp.run, inp.params, inp.output, ctx), tally)
        stream = PageStream(self, ctx, sinks, judge)
        below, staged_to = streamed.next_seq, state.next_seq - 1
        try:
            if staged_to >= below:
                staged = await work(acts.staging.get_pages, self.key, "raw", below, staged_to)
                require_every_page(staged, below, staged_to, "fetched")
                log.info("stream_resumed", next_seq=below, staged_to=staged_to)
                for seq, records in staged:
                    await stream.put(seq, records)
        except BaseException:  # the stream started: it never outlives the attempt
            await stream.abort()
            raise
        return stream

    async def _stage(self, seq: int, page: Page, cursor: dict[str, Any] | None) -> None:
        """Stage one fetched page (an overwrite when a retried attempt fetches it again);
        a page seen before in this run is a SOURCE_LOOP naming the request. ``cursor``:
        where the fetch stands after it, staged with it (a streaming fetch)."""
        try:
            await statement(
                self.acts.db,
                self.acts.staging.put_pages,
                self.key,
                "raw",
                [(seq, page.records)],
                page.info.digest,
                cursor,
            )
        except ArtemisError as e:
            if e.code == ErrorCode.SOURCE_LOOP and page.info.request:
                raise e.with_request(page.info.request) from None
            raise

    async def _record_progress(self) -> None:
        # Queued, not waited for: committed with the batch's result at the latest.
        state = self.state
        await self.acts.record(
            self.inp.run,
            "progress",
            {
                "pages": state.pages,
                "records": state.records,
                "units_done": state.units_done,
                "total": self.inp.total,
                "expected_total": state.expected_total,
            },
            "step_fetch",
            soon=True,
        )

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
        taken = (page.checkpoint, page.info, len(page.records))
        cursor = state.after(*taken).cursor(inp.first_seq) if self.stream is not None else None
        await self._stage(seq, page, cursor)
        if self.stream is not None:
            self.stream.judge.stated = page.info.expected_total
            await self.stream.put(seq, page.records)
        state.take(*taken)
        self.beat(state)
        now = time.monotonic()
        if page.checkpoint is None or now - self.progress_at >= self.progress_every:
            self.progress_at = now
            await self._record_progress()
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


# The end of the pages (a sentinel on the queue).
_END = None


class PageStream:
    """One fetch's stream. ``state`` is the fetch's resume state: its ``stream`` (the
    stream's delivery ledger, ``artemis/ledger.py``) is kept there, so every heartbeat the
    fetch sends carries both where the fetch and where the stream stand."""

    def __init__(
        self, fetch: BatchFetch, ctx: TaskContext, sinks: list[Sink], judge: Judge
    ) -> None:
        self.fetch, self.task, self.ctx, self.sinks, self.judge = (
            fetch,
            fetch.task,
            ctx,
            sinks,
            judge,
        )
        self.state = fetch.state
        assert self.state.stream is not None, "a fetch that streams has its stream's ledger"
        self.ledger: Ledger = self.state.stream
        # Set when a sink refused a page for good: the run fails with it, so the fetch
        # ends its batch at the next page instead of fetching what will not be sent.
        self.refused = asyncio.Event()
        self._queue: asyncio.Queue[tuple[int, list[dict[str, Any]]] | None] = asyncio.Queue()
        concurrency = self.task.emit_concurrency(ctx)
        self._gate = asyncio.Semaphore(concurrency)
        # Pages put and not yet sent (or skipped), at most: a sink slower than the source
        # slows the fetch down to its pace, and memory holds a few pages, not a batch.
        self._room = asyncio.Semaphore(max(8, 4 * concurrency))
        # Pages delivered above the ledger's gap (seq → what the page counts), and their
        # judgements, told once a page is counted.
        self._above: dict[int, PageDone] = {}
        self._judged: dict[int, Outcome] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._consumer = asyncio.create_task(self._consume())

    async def put(self, seq: int, records: list[dict[str, Any]]) -> None:
        """A staged page: the fetch goes on while it is processed and sent, unless the
        pages not yet sent fill the stream's room (then it waits for one to go)."""
        await self._room.acquire()
        self._queue.put_nowait((seq, records))

    async def close(self) -> Ledger:
        """Every page put is delivered (or the stream stopped): what it delivered."""
        self._queue.put_nowait(_END)
        await self._consumer
        while self._sending:
            await asyncio.gather(*list(self._sending))
        return Ledger.from_json(self.ledger.to_json())

    async def abort(self) -> None:
        """The fetch failed or was cancelled: nothing more is sent (what was delivered
        stays counted in the heartbeat)."""
        tasks = [self._consumer, *self._sending]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def _stop(self, seq: int, error: BaseException) -> None:
        if self.ledger.stopped is not None:
            return
        code = error.code.value if isinstance(error, ArtemisError) else ErrorCode.INTERNAL.value
        self.ledger.stopped = code
        # The reason is logged here; the process/emit activities that take the rest over
        # meet it again and report it (wait, retry or fail) as the batch path does.
        log.info(
            "stream_stopped",
            seq=seq,
            delivered_below=self.ledger.next_seq,
            code=code,
            error=str(error)[:300],
        )

    async def _consume(self) -> None:
        """Pages in order through the task's ``process`` — the pages waiting together in
        one thread hop (a CPU-bound fetch queues several) — each then sent on its own."""
        ended = False
        while not ended:
            waiting = [await self._queue.get()]
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            if waiting[-1] is _END:
                ended = True
                waiting.pop()
            pages = [page for page in waiting if page is not None]
            if not pages:
                continue
            if self.ledger.stopped is not None:
                for _ in pages:
                    self._room.release()
                continue
            done = await work(_judge_in_order, self.judge, pages)
            judged = [o for o in done if isinstance(o, Outcome)]
            if judged:
                try:  # their bad records kept (and the bound checked) before any is sent
                    await keep_judged(self.fetch.acts.db, self.judge, judged)
                except Exception as e:  # process_batch meets it again
                    self._stop(judged[0].seq, e)
                else:  # drift is told where it is noted (RunServices.report_drift)
                    for o in judged:
                        if o.new_drift:
                            await self.fetch.acts.report_drift(self.fetch.inp.run, o.seq, o.told())
            for i, (seq, records) in enumerate(pages):
                # (pages after one that failed were not judged: the stream stopped)
                out = done[i] if i < len(done) else None
                if isinstance(out, BaseException):  # process_batch meets it again
                    self._stop(seq, out)
                if out is None or isinstance(out, BaseException) or self.ledger.stopped:
                    self._room.release()
                    continue
                await self._gate.acquire()
                if self.ledger.stopped is not None:
                    self._gate.release()
                    self._room.release()
                    continue
                sending = asyncio.create_task(self._send(seq, len(records), out))
                self._sending.add(sending)
                sending.add_done_callback(self._sending.discard)

    async def _send(self, seq: int, n_in: int, judged: Outcome) -> None:
        records, run = judged.records, self.fetch.inp.run
        page = EmitContext(
            run_key=self.fetch.key,
            seq=seq,
            trace=self.fetch.trace,
            request_id=run.request_id,
            task_code=run.task_code,
            task_id=run.task_id,
        )
        try:
            if records:
                await self.task.emit(self.fetch.acts.client, self.sinks, records, page)
        except Exception as e:  # emit_batch meets it again: waits it out, or fails
            self._room.release()
            if isinstance(e, ArtemisError) and not e.retryable and self.ledger.error is None:
                # Refused for good: sent again it would be refused again (or, worse, taken
                # although the error table says no retry). The run fails with it.
                self.ledger.error = {"code": e.code.value, "message": redact_text(e.message)}
                self.refused.set()
            self._stop(seq, e)
            return
        finally:
            self._gate.release()
        self._room.release()
        self._above[seq] = judged.done(n_in, page.counts)
        self._judged[seq] = judged.told()
        # (stopped: the page that failed is the gap; those above it go again, emit_batch)
        counted = self.ledger.count(self._above)
        self.fetch.beat(self.state)
        # A page's quarantine is told where it is counted: a page above the gap when the
        # stream stops is judged and told again by process_batch, not twice.
        for at, _ in counted:
            await self.fetch.acts.report_quarantined(run, at, self._judged.pop(at))


def _judge_in_order(
    judge: Judge, pages: list[tuple[int, list[dict[str, Any]]]]
) -> list[Outcome | BaseException]:
    """Each page judged (the task's ``process``, then the record model's check), up to the
    first that fails (its error in its place; the pages after it are not judged)."""
    out: list[Outcome | BaseException] = []
    for seq, records in pages:
        try:
            out.append(judge.page(seq, records))
        except Exception as e:
            out.append(e)
            break
    return out
