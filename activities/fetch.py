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

from activities.run_base import RunActivityBase, log, off_loop, run_key
from artemis.errors import ArtemisError, ErrorCode
from artemis.metrics import PAGES_FETCHED, RECORDS_FETCHED
from artemis.outage import outage_of
from artemis.run_models import FetchInput, FetchResult, Outage
from artemis.tasks import FetchControls
from artemis.tasks.registry import get_task
from artemis.tracing import current_trace


class FetchActivities(RunActivityBase):
    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        trace = current_trace()
        state = _resume_state(inp)
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
            keepalive=lambda: activity.heartbeat(state),
            wind_down=wind_down,
            max_pages=max(0, inp.max_pages - state["pages"]),
        )
        try:
            callback = await self._callback(inp.run, inp.callback, trace)
        except ArtemisError as e:  # progress is best effort: never fail the fetch over it
            log.warning("callback_progress_disabled", error=str(e))
            callback = None
        last_ms = inp.progress_last_ms
        key = run_key(inp.run)
        # Nothing staged from here on is counted yet: an earlier attempt's leftovers go.
        await off_loop(self.staging.drop_from, key, "raw", state["next_seq"])
        started = time.monotonic()
        progress_every = self.settings.events.progress_min_interval_ms / 1000
        progress_at = started
        outage: Outage | None = None
        pages = task.fetch(ctx, self.client, state["checkpoint"])
        # Set when Temporal cancels the fetch (a pause, a stop; learnt with the answer to
        # a heartbeat): no new request, the page in flight is taken, then the batch ends
        # at that page boundary with its checkpoint.
        stop = asyncio.Event()

        async def pump() -> bool:
            """Fetch and stage pages until the batch is full; True when the source is done."""
            nonlocal last_ms, progress_at
            async for page in pages:
                seq = state["next_seq"]
                await self._stage_raw(key, seq, page)
                state.update(
                    checkpoint=page.checkpoint,
                    next_seq=seq + 1,
                    pages=state["pages"] + 1,
                    records=state["records"] + len(page.records),
                    units_done=(
                        state["units_done"]
                        if page.info.units_done is None
                        else page.info.units_done
                    ),
                    done=page.checkpoint is None,
                    expected_total=page.info.expected_total,
                    incomplete=page.info.incomplete,
                )
                activity.heartbeat(state)
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
                            "fetch_cancelled", next_seq=state["next_seq"], stops="at its next page"
                        )
                        stop.set()
                        wind_down.set()
        except asyncio.CancelledError:
            log.info("fetch_cancelled", next_seq=state["next_seq"], pages=state["pages"])
            raise
        except ArtemisError as e:
            # The source (or staging) failing transiently: the pages so far count, and the
            # workflow waits, then fetches on from their checkpoint (SPEC §4 "Outages").
            outage = (
                outage_of(e, "source", task.source_name(ctx))
                if inp.report_outages and not task.error_budgets
                else None
            )
            if outage is None:
                raise
        finally:
            await pages.aclose()
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
        )

    async def _stage_raw(self, key: str, seq: int, page: Any) -> None:
        """Stage one fetched page (an overwrite when a retried attempt fetches it again);
        a page seen before in this run is a SOURCE_LOOP naming the request."""
        try:
            await off_loop(
                self.staging.put_pages, key, "raw", [(seq, page.records)], page.info.digest
            )
        except ArtemisError as e:
            if e.code == ErrorCode.SOURCE_LOOP and page.info.request:
                raise e.with_request(page.info.request) from None
            raise

    async def _record_progress(self, inp: FetchInput, state: dict[str, Any]) -> None:
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
    details = activity.info().heartbeat_details
    if details:
        state.update(details[0])
        log.info("fetch_resumed", next_seq=state["next_seq"], pages=state["pages"])
    return state
