"""Activities of the task-run workflow: thin adapters from Temporal to the TaskUnit API.

All I/O of a run happens here. Records go to and from the staging table; what returns
to the workflow is counts, sequence numbers and checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from artemis.callback import (
    CallbackClient,
    CallbackTarget,
    FinalizeOutcome,
    finalize_body,
    resolve_base_url,
)
from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.events import EventLog
from artemis.http import make_client
from artemis.logsetup import get_logger
from artemis.metrics import (
    CALLBACKS,
    PAGES_FETCHED,
    RECORDS_EMITTED,
    RECORDS_FETCHED,
    RUNS_FINISHED,
    RUNS_STARTED,
    WAITING,
)
from artemis.outage import outage_of
from artemis.retained import Retained
from artemis.run_models import (
    BatchInput,
    CircuitBreaker,
    CleanupInput,
    CleanupResult,
    CleanupRunInput,
    EmitResult,
    FetchInput,
    FetchResult,
    FetchRetry,
    FinalizeInput,
    FinalizeResult,
    MirrorInput,
    Outage,
    OutageNote,
    PrepareInput,
    PrepareResult,
    ProcessResult,
    RetainInput,
    RunRef,
    SplitInput,
    SplitResult,
)
from artemis.run_state import OPEN, TERMINAL, end_error
from artemis.security import origin
from artemis.sinks import EmitContext, RunEnd
from artemis.sinks.base import unseal_output
from artemis.sinks.files import drop_file_records, drop_file_records_older_than
from artemis.staging import Staging
from artemis.tasks import TaskContext, TaskUnit
from artemis.tasks.registry import get_task
from artemis.tracing import TraceContext, current_trace
from artemis.vault import RunSecrets
from temporal_shared.runs import OPEN_STATUSES, closed_run_end

log = get_logger("artemis.activities")

# The plan step a waiting run is stuck in, by what it waits on.
_OUTAGE_STEP = {"source": "step_fetch", "sink": "step_emit", "store": "step_process"}

FINALIZE_MAX_ATTEMPTS = 4  # the first try and 3 retries (0.5 s, 1 s, 2 s)
CALLBACK_TOKEN = "callback_token"

T = TypeVar("T")


def run_key(run: RunRef) -> str:
    return f"{run.task_code}/{run.task_id}"


def _require_every_page(pages: list[tuple[int, Any]], first: int, last: int, what: str) -> None:
    """The staged pages of a batch are all there: a missing one is never skipped in
    silence (a staging store that lost a commit, say) — the run fails visibly."""
    missing = sorted(set(range(first, last + 1)) - {seq for seq, _ in pages})
    if missing:
        raise ArtemisError(
            ErrorCode.INTERNAL,
            f"staged {what} page(s) {missing[:10]} of #{first}-#{last} are missing from the "
            "staging table: they cannot be skipped in silence",
            retryable=False,
        )


async def all_or_first_error(coros: Any) -> None:
    """Run the coroutines together; the first failure cancels the rest and is raised
    (as itself, not inside an ExceptionGroup: the activity boundary reads its code)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat in the background while a short activity works.

    The activity's heartbeat timeout is how Temporal learns that its worker died: without
    one, a batch lost with a killed worker waits out its whole start-to-close timeout
    before it runs again elsewhere. Local activities have no heartbeat, so nothing runs.
    """
    info = activity.info()
    timeout = info.heartbeat_timeout
    if info.is_local or not timeout:
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(max(timeout.total_seconds() / 3, 0.05))

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating


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


class TaskRunActivities:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = make_client(settings.http_client)
        self.staging = Staging(settings.database.url)
        self._task_store = None
        self.events = EventLog(settings.database.url)
        # Set by the worker: poll a provenance's queue now (a run is about to fetch from it).
        self.on_rate_key: Callable[[str], Awaitable[None]] | None = None
        self.secrets = RunSecrets(
            settings.database.url, settings.vault.get("master_key_file", ".artemis/master.key")
        )
        self.retained = Retained(settings.database.url)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def record(
        self, run: RunRef, kind: str, data: dict[str, Any], step: str | None = None
    ) -> None:
        """Append to the run's event stream. Best effort: an event-log outage is logged and
        never fails the activity (the run's state lives in Temporal, not in its events)."""
        try:
            await asyncio.to_thread(
                self.events.append, run.task_id, kind, data, step, None, run.root_task_id
            )
        except Exception as e:
            log.warning("event_not_recorded", kind=kind, error=f"{type(e).__name__}: {e}")

    def _context(
        self,
        task: TaskUnit,
        run: RunRef,
        params: dict[str, Any],
        trace: TraceContext,
        output: dict[str, Any] | None = None,
    ) -> TaskContext:
        if output:
            # A request's sink secrets, read back inside the activity (never in history).
            # (stored under the top run's key: a backfill's windows use their parent's)
            owner = f"{run.task_code}/{run.root_task_id or run.task_id}"
            output = unseal_output(output, lambda name: self.secrets.get(owner, name))
        return TaskContext(
            task_code=run.task_code,
            task_id=run.task_id,
            params=task.Params.model_validate(params),
            settings=self.settings,
            trace=trace,
            request_id=run.request_id,
            output=output or {},
        )

    def _callback(
        self, run: RunRef, target: dict[str, Any] | None, trace: TraceContext
    ) -> CallbackClient | None:
        if not target:
            return None
        tgt = CallbackTarget(**target)
        if not tgt.enabled:
            return None
        token = self.secrets.get(run_key(run), CALLBACK_TOKEN) or self._default_token(tgt)
        return CallbackClient(
            tgt,
            self.settings.callback,
            self.client,
            trace,
            token,
            run.request_id,
            run_key(run),
            self.settings.callback_hosts(),
        )

    def _default_token(self, target: CallbackTarget) -> str | None:
        """``callback.default_token``, only for a callback to ``callback.base_url``'s
        origin: a request naming another allowed host gets no token of ours (SPEC §5)."""
        cfg = self.settings.callback
        if not cfg.default_token or not cfg.base_url:
            return None
        url = resolve_base_url(target, cfg, self.settings.callback_hosts())
        return cfg.default_token if origin(url) == origin(cfg.base_url) else None

    # -- 1. prepare -------------------------------------------------------------------
    @activity.defn(name="prepare_params")
    async def prepare_params(self, inp: PrepareInput) -> PrepareResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        params = task.prepare_params(inp.params, self.settings, trusted=True)
        ctx = self._context(task, inp.run, params.model_dump(mode="json"), trace)
        plan = task.plan_children(ctx)
        search = {k: str(v) for k, v in task.search_attributes(ctx).items() if v}
        if plan is not None:
            children, parallelism = plan
            log.info("params_prepared", children=len(children), parallelism=parallelism)
            return PrepareResult(
                params=params.model_dump(mode="json"),
                total=len(children),
                children=children,
                parallelism=parallelism,
                search=search,
                tolerance_pct=task.completeness_tolerance(ctx),
            )
        total = task.total_hint(ctx)
        retry = task.fetch_retry(ctx)
        circuit = task.circuit_breaker(ctx)
        rate_key = task.rate_key(ctx)
        log.info(
            "params_prepared", total=total, fetch_retry=retry, circuit=circuit, rate_key=rate_key
        )
        if rate_key and self.on_rate_key is not None:
            try:
                await self.on_rate_key(rate_key)
            except Exception as e:  # the periodic refresh still comes
                log.warning("provenance_queue_not_ensured", error=f"{type(e).__name__}: {e}")
        return PrepareResult(
            params=params.model_dump(mode="json"),
            total=total,
            fetch_retry=FetchRetry(**retry) if retry else None,
            circuit=CircuitBreaker(**circuit) if circuit else None,
            rate_key=rate_key,
            search=search,
            tolerance_pct=task.completeness_tolerance(ctx),
            outage_tolerance_s=task.outage_tolerance(ctx),
        )

    @activity.defn(name="mirror_state")
    async def mirror_state(self, inp: MirrorInput) -> str:
        """Record the run's state in task storage (pending/running/terminal, stats, error)."""
        from artemis.taskstore import StorageUnavailable, TaskData, TaskNotFound

        def write() -> str:
            store = self.task_store
            run = inp.run
            result = inp.stats if inp.status == "completed" else None
            try:
                # The API writes `pending` beside its answer; whichever comes first
                # creates the record, the other finds it (insert-if-absent).
                store.create(
                    run.task_id,
                    TaskData(
                        task_id=run.task_id,
                        task_code=run.task_code,
                        workflow_id=run.workflow_id,
                        status="pending",
                    ),
                )
                store.update_status(run.task_id, inp.status, result=result or None, error=inp.error)
                if inp.status != "completed" and inp.stats:
                    data = store.load(run.task_id)
                    if data is not None:
                        store.save(run.task_id, data.model_copy(update={"result": inp.stats}))
            except (StorageUnavailable, TaskNotFound) as e:
                raise ArtemisError(
                    ErrorCode.INTERNAL, f"task store: {type(e).__name__}: {e}", retryable=True
                ) from None
            return inp.status

        if inp.status in TERMINAL:
            # The stream's end goes first: it must not wait on a task-store outage.
            await self.record(
                inp.run,
                "run_status",
                {"status": inp.status, "stats": inp.stats, "error": inp.error},
            )
        status = await asyncio.to_thread(write)
        if inp.status == "running":
            RUNS_STARTED.labels(inp.run.task_code).inc()
        elif inp.status in TERMINAL:
            RUNS_FINISHED.labels(inp.run.task_code, inp.status).inc()
        log.info("task_state_recorded", status=status)
        return status

    @property
    def task_store(self):  # noqa: ANN201
        if self._task_store is None:
            from artemis.taskstore import make_task_storage

            self._task_store = make_task_storage(self.settings)
        return self._task_store

    @activity.defn(name="cleanup_old_tasks")
    async def cleanup_old_tasks(self, inp: CleanupInput) -> CleanupResult:
        """The clean-up schedule (seed 001's cleanup_old_tasks(hours=24)): record the
        ending of runs that could not record it themselves, then drop terminal tasks,
        stale staged pages and old events."""
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        reconciled = await self._reconcile_open_runs(now - timedelta(seconds=inp.reconcile_after_s))
        before = now - timedelta(hours=inp.hours)
        tasks = await asyncio.to_thread(self.task_store.delete_expired, before)
        # Runs kept for a retry keep their pages until their state expires, then go whole.
        expired = await asyncio.to_thread(self.retained.expired, now)
        for key in expired:
            await asyncio.to_thread(self._drop_key, key)
        keep = await asyncio.to_thread(self.retained.live_keys, now)
        pages = await asyncio.to_thread(self.staging.drop_older_than, before, keep)
        events = await asyncio.to_thread(self.events.drop_older_than, before)
        # A run may write files for up to 30 days (meta.timeout_s); its records go once it
        # has been quiet longer than that and the clean-up's own age.
        quiet = min(before, now - timedelta(days=30, hours=1))
        files = await asyncio.to_thread(
            drop_file_records_older_than, self.settings.database.url, quiet
        )
        log.info(
            "cleanup_done",
            hours=inp.hours,
            runs_reconciled=reconciled,
            tasks_removed=tasks,
            staged_pages_removed=pages,
            events_removed=events,
            sink_files_forgotten=files,
            retained_expired=len(expired),
        )
        return CleanupResult(
            tasks_removed=tasks,
            staged_pages_removed=pages,
            events_removed=events,
            runs_reconciled=reconciled,
            sink_files_forgotten=files,
        )

    async def _reconcile_open_runs(self, quiet_since: Any) -> int:
        """Runs the task store holds open (pending/running), untouched since
        ``quiet_since``, whose workflow has closed — terminated in Temporal, or its last
        task-store write failed — get their ending from Temporal, recorded once. This
        schedule is that repair's one owner: an API read never writes."""
        from temporalio.service import RPCError, RPCStatusCode

        from artemis.taskstore import ConcurrentModification, TaskNotFound

        client = activity.client()
        done = 0
        for status in sorted(OPEN):
            cursor = None
            while True:
                items, cursor = await asyncio.to_thread(
                    self.task_store.list, status=status, limit=200, cursor=cursor
                )
                for rec in items:
                    if (rec.updated_at or rec.created_at) > quiet_since:
                        continue
                    handle = client.get_workflow_handle(rec.workflow_id)
                    try:
                        desc = await handle.describe()
                    except RPCError as e:
                        if e.status != RPCStatusCode.NOT_FOUND:
                            raise
                        end = {
                            "status": "failed",
                            "error": end_error(
                                "failed",
                                ErrorCode.INTERNAL.value,
                                "the run's workflow is not in Temporal "
                                "(never started, or past its retention)",
                            ),
                        }
                    else:
                        if desc.status in OPEN_STATUSES:
                            continue
                        end = await closed_run_end(handle, desc.status)
                    try:
                        await asyncio.to_thread(
                            self.task_store.update_status,
                            rec.task_id,
                            end["status"],
                            expected_version=rec.version,
                            result=end.get("stats") or {},
                            error=end.get("error"),
                        )
                    except (ConcurrentModification, TaskNotFound):
                        continue  # the run (or another clean-up) wrote first
                    log.info("task_store_reconciled", task_id=rec.task_id, status=end["status"])
                    done += 1
                if not cursor:
                    break
        return done

    @activity.defn(name="split_run")
    async def split_run(self, inp: SplitInput) -> SplitResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = self._context(task, inp.run, inp.params, trace)
        children = task.split(ctx, inp.details)
        parallelism = task.split_parallelism(ctx)
        log.info(
            "run_split", pieces=len(children or []), parallelism=parallelism, details=inp.details
        )
        return SplitResult(children=children, parallelism=parallelism)

    # -- 2. fetch ----------------------------------------------------------------------
    @activity.defn(name="fetch_pages")
    async def fetch_pages(self, inp: FetchInput) -> FetchResult:
        trace = current_trace()
        state = _resume_state(inp)
        task = get_task(inp.run.task_code)
        ctx = self._context(task, inp.run, inp.params, trace)
        if inp.qps:
            ctx.overrides["qps"] = inp.qps
        # A retried attempt: the source's last request may have been served, its answer lost.
        ctx.overrides["resumed"] = activity.info().attempt > 1 or inp.resumed
        # A task waiting on its source (a 429's Retry-After) keeps the attempt alive
        # without losing the resume state.
        ctx.overrides["keepalive"] = lambda: activity.heartbeat(state)
        wind_down = ctx.overrides["wind_down"] = asyncio.Event()
        ctx.overrides["max_pages"] = max(0, inp.max_pages - state["pages"])
        try:
            callback = self._callback(inp.run, inp.callback, trace)
        except ArtemisError as e:  # progress is best effort: never fail the fetch over it
            log.warning("callback_progress_disabled", error=str(e))
            callback = None
        last_ms = inp.progress_last_ms
        key = run_key(inp.run)
        # Nothing staged from here on is counted yet: an earlier attempt's leftovers go.
        await asyncio.to_thread(self.staging.drop_from, key, "raw", state["next_seq"])
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
                    units_done=page.info.get("units_done", state["units_done"]),
                    done=page.checkpoint is None,
                    expected_total=page.info.get("expected_total"),
                    incomplete=page.info.get("incomplete"),
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
                        f"{page.info.get('source', 'fetch')}: {state['records']} records",
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
            await asyncio.to_thread(
                self.staging.put_pages, key, "raw", [(seq, page.records)], page.info.get("digest")
            )
        except ArtemisError as e:
            if e.code == ErrorCode.SOURCE_LOOP and page.info.get("request"):
                raise e.with_request(str(page.info["request"])) from None
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

    # -- 3. process ---------------------------------------------------------------------
    @activity.defn(name="process_batch")
    async def process_batch(self, inp: BatchInput) -> ProcessResult:
        async with heartbeating():
            return await self._process_batch(inp)

    async def _process_batch(self, inp: BatchInput) -> ProcessResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = self._context(task, inp.run, inp.params, trace, inp.output)
        key = run_key(inp.run)
        raw = await asyncio.to_thread(
            self.staging.get_pages, key, "raw", inp.first_seq, inp.last_seq
        )
        _require_every_page(raw, inp.first_seq, inp.last_seq, "fetched")
        out: list[tuple[int, list[dict[str, Any]]]] = []
        n_in = n_out = 0
        for seq, records in raw:
            try:
                processed = task.process(records, ctx)
            except ArtemisError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                # A record without a field its task needs, or of the wrong type: the source
                # broke its contract (SPEC §4), not a failure a retry can fix.
                raise ArtemisError(
                    ErrorCode.SOURCE_CONTRACT,
                    f"process: a record of page {seq} does not have the shape "
                    f"{inp.run.task_code} expects: {type(e).__name__}: {e}",
                ) from None
            n_in += len(records)
            n_out += len(processed)
            out.append((seq, processed))
        await asyncio.to_thread(self.staging.put_pages, key, "processed", out)
        if n_out != n_in:
            log.info("process_dropped_records", dropped=n_in - n_out)
        return ProcessResult(records_in=n_in, records_out=n_out)

    # -- 4. emit -------------------------------------------------------------------------
    @activity.defn(name="emit_batch")
    async def emit_batch(self, inp: BatchInput) -> EmitResult:
        trace = current_trace()
        task = get_task(inp.run.task_code)
        ctx = self._context(task, inp.run, inp.params, trace, inp.output)
        sinks = task.decide_sinks(ctx)
        key = run_key(inp.run)
        if inp.prune_below is not None:
            # The batches before this one were delivered (emits run in order): staging
            # keeps only what is not, so a long sink outage stages no more than the
            # batches the fetch side may be ahead (runs.max_batches_ahead).
            await asyncio.to_thread(self.staging.prune_below, key, inp.prune_below)
        state: dict[str, Any] = {"next_seq": inp.first_seq, "records": 0, "batches": 0}
        details = activity.info().heartbeat_details
        if details:
            state.update(details[0])
            log.info("emit_resumed", next_seq=state["next_seq"])
        # Per sink, the records of the pages delivered without a gap (a page above the
        # heartbeat's next_seq may count again on a retry, as it may be sent again).
        state["sinks"] = dict(state.get("sinks") or {})
        pages = await asyncio.to_thread(
            self.staging.get_pages, key, "processed", state["next_seq"], inp.last_seq
        )
        _require_every_page(pages, state["next_seq"], inp.last_seq, "processed")
        skip = set(inp.skip_seqs)
        # Pages go out ``emit_concurrency`` at a time, each under its own key; the
        # heartbeat resumes after the pages delivered without a gap (one above it may go
        # again on a retry — under the same key, so the sink takes it once).
        # Pages delivered above the gap, with what they counted: counted into the
        # heartbeat's state only once the pages below them are delivered too (a retry
        # sends them again, and must not count them twice). Pages delivered by an earlier
        # call (``skip_seqs``) count nothing here.
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
                    try:
                        await task.emit(self.client, sinks, records, page)
                    except ArtemisError as e:
                        names = ",".join(s.name for s in sinks)
                        outage = outage_of(e, "sink", names) if inp.report_outages else None
                        if outage is None:
                            raise
                        halted.append(outage)
                        return
            n = 0 if seq in skip else len(records)
            delivered[seq] = (n, page.counts)
            while state["next_seq"] in delivered:
                n, counts = delivered.pop(state["next_seq"])
                state["records"] += n
                state["batches"] += 1 if n else 0
                for name, taken in counts.items():
                    state["sinks"][name] = state["sinks"].get(name, 0) + taken
                state["next_seq"] += 1
            activity.heartbeat(state)

        try:
            await all_or_first_error(deliver(seq, records) for seq, records in pages)
        except asyncio.CancelledError:
            log.info("emit_cancelled", next_seq=state["next_seq"])
            raise
        if halted:
            return self._emit_halted(inp, state, delivered, halted[0], skip)
        log.info(
            "emit_batch_done",
            first_seq=inp.first_seq,
            last_seq=inp.last_seq,
            records=state["records"],
        )
        RECORDS_EMITTED.labels(inp.run.task_code).inc(state["records"])
        return EmitResult(
            records_emitted=state["records"], batches=state["batches"], sinks=state["sinks"]
        )

    def _emit_halted(
        self,
        inp: BatchInput,
        state: dict[str, Any],
        above: dict[int, tuple[int, dict[str, int]]],
        outage: Outage,
        skip: set[int],
    ) -> EmitResult:
        """A sink is down: what this call delivered (every page of it, below the gap and
        above), for the workflow to count once and skip when it sends the rest."""
        records, batches, sinks = state["records"], state["batches"], dict(state["sinks"])
        for n, counts in above.values():
            records += n
            batches += 1 if n else 0
            for name, taken in counts.items():
                sinks[name] = sinks.get(name, 0) + taken
        seqs = [s for s in range(inp.first_seq, state["next_seq"]) if s not in skip]
        seqs += [s for s in above if s not in skip]
        RECORDS_EMITTED.labels(inp.run.task_code).inc(records)
        return EmitResult(
            records_emitted=records,
            batches=batches,
            sinks=sinks,
            outage=outage,
            delivered_seqs=sorted(seqs),
        )

    @activity.defn(name="note_outage")
    async def note_outage(self, inp: OutageNote) -> None:
        """A run started waiting on a dependency (each attempt), or it recovered: the
        run's event stream and the waiting gauge (the workflow logs the line)."""
        key = run_key(inp.run)
        w = inp.waiting
        if inp.kind == "waiting":
            WAITING.wait(key, str(w.get("dependency")), float(w.get("next_in_s") or 60))
        else:
            WAITING.done(key, str(w.get("dependency")))
        await self.record(inp.run, inp.kind, w, _OUTAGE_STEP.get(str(w.get("dependency"))))

    # -- 5. finalize ------------------------------------------------------------------------
    @activity.defn(name="finalize_run")
    async def finalize_run(self, inp: FinalizeInput) -> FinalizeResult:
        trace = current_trace()
        stats = dict(inp.stats)
        if inp.params is not None and inp.status == "completed":
            task = get_task(inp.run.task_code)
            try:
                stats = task.finalize(self._context(task, inp.run, inp.params, trace), stats)
            except Exception as e:  # finalize must not fail the run (seed 000 §7)
                log.warning("task_finalize_hook_failed", error=f"{type(e).__name__}: {e}")
        if inp.params is not None:
            task = get_task(inp.run.task_code)
            try:
                ended = self._context(task, inp.run, inp.params, trace)
                await asyncio.to_thread(task.run_ended, ended, inp.status, inp.error_code)
            except Exception as e:  # an execution record is bookkeeping: never fail here
                log.warning("task_run_ended_hook_failed", error=f"{type(e).__name__}: {e}")
        if inp.params is not None and inp.finish_sinks:
            finished = await self._finish_sinks(inp, trace)
            if finished:
                stats["sinks_finished"] = finished
        outcome, detail = FinalizeOutcome.SKIPPED, ""
        callback = None
        try:
            callback = self._callback(inp.run, inp.callback, trace)
        except ArtemisError as e:
            if e.code != ErrorCode.INVALID_INPUT:
                # e.g. a run secret that this master key cannot read (a rotation half done):
                # retried, and if it never reads, a visible finalize failure, never dropped.
                e.retryable = True
                raise
            # A refused callback target (not allowed host) is reported, never retried.
            log.warning(
                "callback_finalize_failure", error=str(e), run_id=(inp.callback or {}).get("run_id")
            )
            outcome, detail = FinalizeOutcome.REJECTED, str(e)
        if callback is not None:
            attempt = activity.info().attempt
            body = finalize_body(inp.status, stats, inp.error_message)
            suffix = f":retry{inp.retry_attempt}" if inp.retry_attempt else ""
            outcome, detail = await callback.finalize(body, attempt, suffix)
            if outcome == FinalizeOutcome.RETRY:
                if attempt < FINALIZE_MAX_ATTEMPTS:
                    CALLBACKS.labels("finalize", "retry").inc()
                    raise ApplicationError(
                        f"finalize callback failed: {detail}", type=ErrorCode.CALLBACK_ERROR.value
                    )
                log.error(
                    "callback_finalize_gave_up",
                    run_id=callback.target.run_id,
                    attempts=attempt,
                    error=detail,
                )
                outcome = "gave_up"
        CALLBACKS.labels("finalize", str(outcome)).inc()
        if inp.cleanup:
            # Histories of earlier builds clean up here; new runs do it in cleanup_run, so a
            # failed clean-up can never send the finalize again.
            await self._drop_run_data(inp.run)
        log.info(
            "run_finalized",
            status=inp.status,
            callback=outcome,
            **{k: v for k, v in stats.items() if isinstance(v, int)},
        )
        return FinalizeResult(callback=outcome, detail=detail, stats=stats)

    async def _finish_sinks(self, inp: FinalizeInput, trace: TraceContext) -> dict[str, Any]:
        """Each sink's last word on the run (the files sink's manifest), before the
        callback says the run is done. A failure is retried with the finalize; after the
        last attempt it is reported in the stats, never dropped in silence."""
        assert inp.params is not None
        task = get_task(inp.run.task_code)
        ctx = self._context(task, inp.run, inp.params, trace, inp.output)
        end = RunEnd(run_key(inp.run), inp.run.task_code, inp.run.task_id, inp.status)
        finished: dict[str, Any] = {}
        try:
            sinks = task.decide_sinks(ctx)
        except ArtemisError as e:
            log.error("sinks_unavailable_at_finalize", error=str(e))
            return {"error": str(e)}
        for sink in sinks:
            try:
                result = await sink.finish(end)
            except Exception as e:
                retryable = not isinstance(e, ArtemisError) or e.retryable
                if retryable and activity.info().attempt < FINALIZE_MAX_ATTEMPTS:
                    raise
                # The callback still goes; the failure is in the run's stats and the log.
                log.error("sink_finish_failed", sink=sink.name, error=f"{type(e).__name__}: {e}")
                result = {"error": f"{type(e).__name__}: {e}"}
            if result is not None:
                finished[sink.name] = result
        return finished

    @activity.defn(name="retain_run")
    async def retain_run(self, inp: RetainInput) -> None:
        """A run failed with a retryable code: keep its request and carry (references and
        counts only) beside its staged pages and secret, for POST /tasks/{id}/retry."""
        from dataclasses import asdict

        await asyncio.to_thread(
            self.retained.keep,
            run_key(inp.run),
            inp.run.task_code,
            inp.run.task_id,
            inp.run.workflow_id,
            inp.error_code,
            inp.error_message,
            {"request": asdict(inp.request), "carry": asdict(inp.carry)},
            inp.retain_s,
        )
        log.info(
            "run_retained",
            error_code=inp.error_code,
            next_seq=inp.carry.next_seq,
            undelivered=inp.carry.undelivered,
            retain_s=inp.retain_s,
        )

    @activity.defn(name="cleanup_run")
    async def cleanup_run(self, inp: CleanupRunInput) -> None:
        """After a finalize was sent: drop the run's staged pages and its secret."""
        await self._drop_run_data(inp.run)

    async def _drop_run_data(self, run: RunRef) -> None:
        key = run_key(run)
        await asyncio.to_thread(self._drop_key, key)
        log.info("run_data_dropped")

    def _drop_key(self, key: str) -> None:
        """A run's staged pages, secret, files-sink records and retained state."""
        self.staging.drop_run(key)
        self.secrets.drop(key)
        drop_file_records(self.settings.database.url, key)
        self.retained.drop(key)

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.cleanup_run,
            self.retain_run,
            self.prepare_params,
            self.split_run,
            self.mirror_state,
            self.cleanup_old_tasks,
            self.fetch_pages,
            self.process_batch,
            self.emit_batch,
            self.note_outage,
            self.finalize_run,
        ]
