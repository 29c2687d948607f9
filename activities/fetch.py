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
    off_loop,
    on_loop_if,
    require_every_page,
    run_key,
    run_place,
    run_sinks,
)
from activities.streaming import PageStream
from artemis.errors import ArtemisError, ErrorCode
from artemis.metrics import PAGES_FETCHED, RECORDS_EMITTED, RECORDS_FETCHED
from artemis.outage import outage_of
from artemis.quarantine import PageJudge
from artemis.run_models import FetchInput, FetchResult, Outage, Streamed
from artemis.tasks import FetchControls, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, current_trace


class FetchActivities(RunActivityBase):
    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        trace = current_trace()
        key = run_key(inp.run)
        beat = Heartbeat(self.settings.worker.heartbeat_throttle_s)
        state = _resume_state(inp)
        await self._start_attempt(inp, key, state)
        task = get_task(inp.run.task_code)
        ctx = await self._context(task, inp.run, inp.params, trace)
        wind_down = asyncio.Event()
        ctx.controls = FetchControls(
            qps=inp.qps or None,
            # A retried attempt: the source's last request may have been served, its
            # answer lost.
            resumed=activity.info().attempt > 1 or inp.resumed,
            # A task waiting on its source (a 429's Retry-After) keeps the attempt alive
            # without losing the resume state.
            keepalive=lambda: beat(state),
            wind_down=wind_down,
            max_pages=max(0, inp.max_pages - state["pages"]),
        )
        try:
            callback = await self._callback(inp.run, inp.callback, trace)
        except ArtemisError as e:  # progress is best effort: never fail the fetch over it
            log.warning("callback_progress_disabled", error=str(e))
            callback = None
        last_ms = inp.progress_last_ms
        stream: PageStream | None = None
        if inp.stream:
            try:
                stream = await self._stream(task, inp, key, trace, state, beat)
            except ArtemisError as e:
                # The batch path takes the whole batch over (it waits a sink out, or fails
                # as it always did); a page an earlier attempt sent goes under its key.
                log.info("stream_unavailable", code=e.code.value, error=str(e)[:300])
        started = time.monotonic()
        progress_every = self.settings.events.progress_min_interval_ms / 1000
        progress_at = started
        outage: Outage | None = None
        pages = task.fetch(ctx, task.source_client(self.client, ctx), state["checkpoint"])
        # Set when Temporal cancels the fetch (a pause, a stop; learnt with the answer to
        # a heartbeat): no new request, the page in flight is taken, then the batch ends
        # at that page boundary with its checkpoint.
        stop = asyncio.Event()

        async def pump() -> bool:
            """Fetch and stage pages until the batch is full; True when the source is done."""
            nonlocal last_ms, progress_at
            async for page in pages:
                seq = state["next_seq"]
                after = {
                    "checkpoint": page.checkpoint,
                    "next_seq": seq + 1,
                    "pages": state["pages"] + 1,
                    "records": state["records"] + len(page.records),
                    "units_done": (
                        state["units_done"]
                        if page.info.units_done is None
                        else page.info.units_done
                    ),
                    "done": page.checkpoint is None,
                    "expected_total": page.info.expected_total,
                    "incomplete": page.info.incomplete,
                }
                # Streaming: the page may be sent before this heartbeat reaches Temporal;
                # where the fetch stands is staged with it (a retry resumes there).
                cursor = {**after, "first_seq": inp.first_seq} if stream is not None else None
                await self._stage_raw(key, seq, page, cursor)
                if stream is not None:
                    stream.judge.stated = page.info.expected_total
                    await stream.put(seq, page.records)
                state.update(after)
                beat(state)
                now = time.monotonic()
                if page.checkpoint is None or now - progress_at >= progress_every:
                    progress_at = now
                    await self._record_progress(inp, state)
                if callback is not None:
                    last_ms = await callback.progress(
                        state["units_done"],
                        inp.total,
                        f"{page.info.source or 'fetch'}: {state['records']} records",
                        last_ms,
                        seq,
                    )
                if page.checkpoint is None:
                    return True
                if (
                    stop.is_set()
                    or (stream is not None and stream.refused.is_set())
                    or state["pages"] >= inp.max_pages
                    or time.monotonic() - started >= inp.max_seconds
                    # A worker shutting down (SIGTERM): return what is fetched, with
                    # its checkpoint; the next fetch goes on elsewhere, nothing twice.
                    or activity.is_worker_shutdown()
                ):
                    if not task.fetch_winds_down:
                        return False
                    # No new request; the pages in flight are taken into this batch.
                    wind_down.set()
            # A fetch that winds down ends early with a checkpoint: it says "done" only
            # by a last page without one (handled above).
            return not task.fetch_winds_down and not stop.is_set()

        cancelled = False
        # Between pages too (and while the last sends finish): the resume state as of the
        # last page, while one is slow.
        stop_beating = beating_meanwhile(lambda: beat(state))
        try:
            try:
                if state.get("done"):
                    done = True
                else:
                    pumping = asyncio.create_task(pump())
                    while True:
                        try:
                            # Shielded: Temporal's cancel stops the batch at a page boundary.
                            done = await asyncio.shield(pumping)
                            break
                        except asyncio.CancelledError:
                            if cancelled or not activity.is_cancelled():
                                # Cancelled twice, or not by Temporal (the event loop ends).
                                pumping.cancel()
                                with contextlib.suppress(BaseException):
                                    await pumping
                                raise
                            cancelled = True
                            log.info(
                                "fetch_cancelled",
                                next_seq=state["next_seq"],
                                stops="at its next page",
                            )
                            stop.set()
                            wind_down.set()
            except asyncio.CancelledError:
                log.info("fetch_cancelled", next_seq=state["next_seq"], pages=state["pages"])
                if stream is not None:
                    await stream.abort()
                raise
            except ArtemisError as e:
                # The source (or staging) failing transiently: the pages so far count, and the
                # workflow waits, then fetches on from their checkpoint (docs/architecture.md).
                outage = (
                    outage_of(e, "source", task.source_name(ctx))
                    if inp.report_outages and not task.error_budgets
                    else None
                )
                if outage is None:
                    if stream is not None:
                        await stream.abort()
                    raise
            except BaseException:
                if stream is not None:
                    await stream.abort()
                raise
            finally:
                await pages.aclose()
            # The pages staged are delivered (or left to process/emit from the gap on).
            streamed: Streamed | None = None
            if stream is not None:
                try:
                    streamed = await stream.close()
                except BaseException:  # cancelled meanwhile: nothing is sent after the attempt
                    await stream.abort()
                    raise
                log.info(
                    "stream_emit_done",
                    first_seq=inp.first_seq,
                    delivered_below=streamed.next_seq,
                    records=streamed.records_emitted,
                    stopped=streamed.stopped,
                )
                RECORDS_EMITTED.labels(inp.run.task_code).inc(streamed.records_emitted)
        finally:
            stop_beating()
        if outage is not None:
            done = False  # the workflow logs the wait, one line per attempt
        log.info(
            "fetch_batch_done",
            first_seq=inp.first_seq,
            next_seq=state["next_seq"],
            pages=state["pages"],
            records=state["records"],
            done=done,
        )
        PAGES_FETCHED.labels(inp.run.task_code).inc(state["pages"])
        RECORDS_FETCHED.labels(inp.run.task_code).inc(state["records"])
        return FetchResult(
            first_seq=inp.first_seq,
            next_seq=state["next_seq"],
            pages=state["pages"],
            records=state["records"],
            checkpoint=None if done else state["checkpoint"],
            done=done,
            units_done=state["units_done"],
            progress_last_ms=last_ms,
            expected_total=state.get("expected_total"),
            incomplete=state.get("incomplete"),
            outage=outage,
            streamed=streamed,
        )

    async def _stream(
        self,
        task: TaskUnit,
        inp: FetchInput,
        key: str,
        trace: TraceContext,
        state: dict[str, Any],
        beat: Heartbeat,
    ) -> PageStream:
        """The fetch's stream to the run's sinks. Every batch before this one is delivered
        (the workflow asks for a stream only then): their staged pages can go. A retried
        attempt first sends the pages its predecessor staged and had not delivered."""
        # The run's sinks, as emit_batch builds them (its output's secrets read back here).
        ctx = await self._context(task, inp.run, inp.params, trace, inp.output)
        sinks = await run_sinks(task, ctx)
        if inp.first_seq:
            await off_loop(self.staging.prune_below, key, inp.first_seq)
        judge = PageJudge(
            task,
            ctx,
            run_place(inp.run, inp.params, inp.output, ctx),
            inp.records_before + state["stream"]["records_in"],
            state.get("expected_total"),
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
            lambda outcomes: on_loop_if(
                self.db_here and judge.brief(outcomes), judge.keep, outcomes
            ),
            lambda seq, outcome: self.report_judged(inp.run, seq, outcome),
        )
        below, staged_to = state["stream"]["next_seq"], state["next_seq"] - 1
        try:
            if staged_to >= below:
                staged = await off_loop(self.staging.get_pages, key, "raw", below, staged_to)
                require_every_page(staged, below, staged_to, "fetched")
                log.info("stream_resumed", next_seq=below, staged_to=staged_to)
                for seq, records in staged:
                    await stream.put(seq, records)
        except BaseException:  # the stream started: it never outlives the attempt
            await stream.abort()
            raise
        return stream

    async def _start_attempt(self, inp: FetchInput, key: str, state: dict[str, Any]) -> None:
        """Where the attempt starts. A streaming fetch of this batch staged (and may have
        sent) pages its last heartbeat does not know of — a worker killed between the two,
        or an attempt that failed: it goes on after them, so each keeps its sequence number
        (and a page sent again goes with the records it went with, under the same key).
        Nothing staged from there on is counted yet: an earlier attempt's leftovers go."""
        batch = inp.first_seq if inp.stream else None
        cursor = await on_loop_if(
            self.db_here, self.staging.start_attempt, key, state["next_seq"], batch
        )
        if cursor is not None:
            log.info("fetch_resumed", next_seq=cursor["next_seq"], source="staging")
            state.update(cursor)

    async def _stage_raw(
        self, key: str, seq: int, page: Any, cursor: dict[str, Any] | None = None
    ) -> None:
        """Stage one fetched page (an overwrite when a retried attempt fetches it again);
        a page seen before in this run is a SOURCE_LOOP naming the request. ``cursor``:
        where the fetch stands after it, staged with it (a streaming fetch)."""
        try:
            await on_loop_if(
                self.db_here,
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

    async def _record_progress(self, inp: FetchInput, state: dict[str, Any]) -> None:
        # Queued, not waited for: committed with the batch's result at the latest.
        await self.record(
            inp.run,
            "progress",
            {
                "pages": state["pages"],
                "records": state["records"],
                "units_done": state["units_done"],
                "total": inp.total,
                "expected_total": state.get("expected_total"),
            },
            "step_fetch",
            soon=True,
        )


def _resume_state(inp: FetchInput) -> dict[str, Any]:
    """Where a fetch attempt starts: the batch's start, or — a retried attempt — its last
    heartbeat (pages staged before it are kept: staging by sequence number makes a
    re-fetched page an overwrite, not a duplicate)."""
    state: dict[str, Any] = {
        "checkpoint": inp.checkpoint,
        "next_seq": inp.first_seq,
        "pages": 0,
        "records": 0,
        "units_done": inp.units_done,
    }
    if inp.stream:
        state["stream"] = PageStream.start_state(inp.first_seq)
    details = activity.info().heartbeat_details
    if details:
        state.update(details[0])
        log.info("fetch_resumed", next_seq=state["next_seq"], pages=state["pages"])
    return state
