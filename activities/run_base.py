"""What the activities of a task run share: the worker's clients (HTTP, staging,
events, run secrets, kept runs, task storage), the run's context for its task's hooks,
and small helpers (the run's key, heartbeating, all-or-first-error).

Activities are thin adapters from Temporal to the TaskUnit API: all I/O of a run happens
in them; what returns to the workflow is counts, sequence numbers and checkpoints. They
say what each synchronous call is — a short statement on Artemis' database (a run's
staged pages, its secret, its task-store record), a task's hook, batch-sized work or a
task's own blocking code — and ``artemis.calls`` decides where it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sqlalchemy import Engine
from temporalio import activity

from artemis.callback import CallbackClient, CallbackTarget, CallingRun, resolve_base_url
from artemis.calls import hooks, statement, work
from artemis.config import Settings
from artemis.db import get_engine, run_transaction
from artemis.errors import ArtemisError, ErrorCode
from artemis.events import EventLog, EventWriter
from artemis.http import HttpClient, make_client
from artemis.logsetup import get_logger
from artemis.metrics import RECORDS_QUARANTINED, SCHEMA_DRIFT
from artemis.quarantine.judging import example_text
from artemis.quarantine.pages import Outcome
from artemis.quarantine.store import RunPlace
from artemis.redact import redact_text
from artemis.retained import Retained
from artemis.run_models import RunRef
from artemis.security import same_origin
from artemis.sinks.base import Sink
from artemis.sinks.factory import builds_offline
from artemis.sinks.files import drop_file_records
from artemis.sinks.sealing import register_sink_secret, unseal_output
from artemis.staging import Staging
from artemis.tasks import TaskContext, TaskUnit
from artemis.taskstore import TaskStorage, make_task_storage
from artemis.tracing import TraceContext
from artemis.vault import CALLBACK_TOKEN, RunSecrets

log = get_logger("artemis.activities")


async def run_sinks(task: TaskUnit, ctx: TaskContext) -> list[Sink]:
    """The run's sinks (``decide_sinks``): a hook call when its output names only sinks
    built without I/O (``builds_offline``), else work of its own (a sql sink opens a
    database, a files sink an object store)."""
    if builds_offline(ctx.output):
        return await hooks(task, ("decide_sinks", "record_spec"), task.decide_sinks, ctx)
    return await work(task.decide_sinks, ctx)


def run_key(run: RunRef) -> str:
    return f"{run.task_code}/{run.task_id}"


def run_place(
    run: RunRef, params: dict[str, Any], output: dict[str, Any], ctx: TaskContext
) -> RunPlace:
    """The run, as the rows about its bad records name it (with what a replay needs: its
    params and its output as in history, secrets sealed). A backfill's window or a split's
    piece files its records under the run that was started (its top run's task id): one
    quarantine, one bound and one drift report per run the user started."""
    provenance = getattr(ctx.params, "provenance", None)
    return RunPlace(
        run_key(run),
        run.task_code,
        run.root_task_id or run.task_id,
        provenance if isinstance(provenance, str) else None,
        params,
        output,
    )


def secrets_key(run: RunRef) -> str:
    """Where the run's secrets are: its start's key, else (a run started without one)
    under its top run's key (a backfill's windows use their parent's)."""
    return run.secrets_key or f"{run.task_code}/{run.root_task_id or run.task_id}"


def require_every_page(pages: list[tuple[int, Any]], first: int, last: int, what: str) -> None:
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


class Heartbeat:
    """``activity.heartbeat``, held back for an attempt's first throttle interval.

    Temporal's SDK sends an attempt's first heartbeat at once and throttles the rest: on a
    short attempt (a small run's one fetch) that first one is a round trip to Temporal and
    a write of the activity's state there, for nothing — the attempt ends before anyone
    could read it. Held back for ``first_after_s`` (``worker.heartbeat_throttle_s``, the
    interval the rest are sent at anyway; at most half the heartbeat timeout), the latest
    heartbeat made in that interval goes at its end, and an attempt that ends sooner sends
    none. What it costs: a worker killed before its attempt's first heartbeat leaves no
    resume state — a streaming fetch resumes from the cursor staged with its last page
    and sends the staged pages again under the same keys; a batch fetch fetches its batch
    again; an emit sends its pages again under the same keys — and a cancel (a pause, a
    stop) reaches an attempt at most that interval later than it did. The heartbeat
    timeout runs from the attempt's start either way.

    ``wire``: what a detail is in Temporal (plain JSON), made as the heartbeat goes — a
    held one at the interval's end, from its state as it stands then."""

    def __init__(self, first_after_s: float, wire: Callable[[Any], Any] | None = None) -> None:
        self._wire = wire
        timeout = activity.info().heartbeat_timeout
        if timeout:
            # sent before the heartbeat timeout could run out on an attempt that beats
            first_after_s = min(first_after_s, timeout.total_seconds() / 2)
        self._from = time.monotonic() + first_after_s
        self._on = first_after_s <= 0
        self._held: tuple[Any, ...] | None = None
        if not self._on:
            # (the activity's context goes with the callback; after the attempt has ended
            # the SDK drops a heartbeat; a synchronous activity has no loop: its next call
            # after the interval sends)
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(first_after_s, self._release)

    def __call__(self, *details: Any) -> None:
        if not self._on:
            if time.monotonic() < self._from:
                self._held = details
                return
            self._on = True
            self._held = None
        self._send(details)

    def _release(self) -> None:
        """The interval is over: the latest heartbeat held goes now (an attempt that made
        none has no details to send yet)."""
        if self._on:
            return
        self._on = True
        held, self._held = self._held, None
        if held is not None:
            self._send(held)

    def _send(self, details: tuple[Any, ...]) -> None:
        wire = self._wire
        activity.heartbeat(*(details if wire is None else (wire(d) for d in details)))


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
            # The first after an interval too: a short attempt sends none (Heartbeat).
            await asyncio.sleep(max(timeout.total_seconds() / 3, 0.05))
            activity.heartbeat()

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating


def beating_meanwhile(beat: Callable[[], None]) -> Callable[[], None]:
    """Call ``beat`` every third of the attempt's heartbeat timeout until the returned
    function is called: a page that takes longer than the timeout (a slow source, a large
    answer read up to its limit) must not time out an attempt whose worker is alive. The
    timeout tells Temporal that a worker died (its calls stop with it); what bounds a
    request is the HTTP client's own timeouts. A local activity has no heartbeat."""
    info = activity.info()
    timeout = info.heartbeat_timeout
    if info.is_local or not timeout:
        return lambda: None
    loop = asyncio.get_running_loop()
    every = max(timeout.total_seconds() / 3, 0.05)
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:  # (in the activity's context: call_later keeps it)
        nonlocal handle
        handle = loop.call_later(every, tick)  # the next one first: a failed beat is one
        try:
            beat()
        except Exception as e:
            log.warning("heartbeat_failed", error=f"{type(e).__name__}: {e}")

    handle = loop.call_later(every, tick)

    def stop() -> None:
        if handle is not None:
            handle.cancel()

    return stop


class RunData:
    """A run's data outside Temporal: staged pages, its secret, the files sink's records
    and its kept state (for a retry) — dropped together."""

    def __init__(self, settings: Settings) -> None:
        self.database_url = settings.database.url
        self.staging = Staging(settings.database.url)
        self.secrets = RunSecrets(settings.database.url, settings.vault.master_key_file)
        self.retained = Retained(settings.database.url)

    def drop(self, key: str) -> None:
        # One transaction (one commit, one turn at SQLite's write lock and one thread's
        # wait for the GIL, instead of four), and all of it or none.
        # (artemis.db: on SQLite, its driver)
        with run_transaction(get_engine(self.database_url)) as conn:
            self.staging.drop_run(key, conn)
            self.secrets.drop(key, conn)
            drop_file_records(self.database_url, key, conn)
            self.retained.drop(key, conn)


class RunServices:
    """The clients every run activity uses (one set per worker, shared by the steps)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = make_client(settings.http_client, settings.security)
        self.data = RunData(settings)
        self.staging = self.data.staging
        self.secrets = self.data.secrets
        self.retained = self.data.retained
        self.events = EventLog(settings.database.url)
        self.event_writer = EventWriter(self.events)
        # Artemis' own database (staging, secrets, kept runs, quarantine): where the run's
        # statements go.
        self.db = self.staging.engine
        self._task_store: TaskStorage | None = None
        # Set by the worker: poll a provenance's queue now (a run is about to fetch from it).
        self.on_rate_key: Callable[[str], Awaitable[None]] | None = None
        # Set by the worker: the build it polls as (named in a state kept for a retry).
        self.build_id: str | None = settings.worker.build_id

    async def aclose(self) -> None:
        await self.client.aclose()

    @property
    def built_task_store(self) -> TaskStorage | None:
        """The task store once built (None before its first use)."""
        return self._task_store

    @property
    def task_store(self) -> TaskStorage:
        if self._task_store is None:
            self._task_store = make_task_storage(self.settings)
        return self._task_store

    async def record(
        self,
        run: RunRef,
        kind: str,
        data: dict[str, Any],
        step: str | None = None,
        soon: bool = False,
    ) -> None:
        """Append to the run's event stream. Best effort: an event-log outage is logged and
        never fails the activity (the run's state lives in Temporal, not in its events).
        ``soon``: queued, not waited for — committed with the next awaited event (the
        activity's result at the latest: an activity's events are one transaction)."""
        try:
            if soon:
                self.event_writer.append_soon(run.task_id, kind, data, step, run.root_task_id)
                return
            await self.event_writer.append(run.task_id, kind, data, step, run.root_task_id)
        except Exception as e:
            log.warning("event_not_recorded", kind=kind, error=f"{type(e).__name__}: {e}")

    async def report_judged(self, run: RunRef, seq: int, outcome: Outcome) -> None:
        """A judged page's events, log lines and metrics: its drift and its quarantine."""
        await self.report_drift(run, seq, outcome)
        await self.report_quarantined(run, seq, outcome)

    async def report_quarantined(self, run: RunRef, seq: int, outcome: Outcome) -> None:
        """A page's quarantined records: one event per page, with a sample reason (told
        where the page is counted: a page judged again after a stop is told once)."""
        if not outcome.quarantined:
            return
        sample = outcome.sample
        assert sample is not None
        reason = {
            "code": sample.code,
            "field": sample.field,
            "message": redact_text(sample.message)[:500],
        }
        log.info("records_quarantined", seq=seq, records=outcome.quarantined, **reason)
        RECORDS_QUARANTINED.labels(run.task_code).inc(outcome.new)
        data: dict[str, Any] = {"page": seq, "records": outcome.quarantined, "held": outcome.held}
        await self.record(run, "quarantined", {**data, "sample": reason}, "step_process", soon=True)

    async def report_drift(self, run: RunRef, seq: int, outcome: Outcome) -> None:
        """The drift the run had not seen, told as soon as the page is kept: a field is
        noted once per run (``note_drift``), so a page judged again — the stream stopped
        before counting it, or an attempt was cut short — finds it seen and says nothing.
        Awaited, not queued: the row and its event are committed moments apart (drift is
        rare: once per run and field)."""
        for d in outcome.new_drift:
            drift: dict[str, Any] = {
                "field": d.field,
                "change": d.kind,
                "page": seq,
                "example": None if d.example is None else redact_text(example_text(d.example)),
                "type": d.type_name,
                "evolved": d.field in outcome.evolved,
            }
            if d.field in outcome.skipped:  # not added to the model, and why
                drift["skipped"] = outcome.skipped[d.field]
            log.warning("schema_drift", **drift)
            SCHEMA_DRIFT.labels(run.task_code, d.kind).inc()
            await self.record(run, "schema_drift", drift, "step_process")

    async def task_context(
        self,
        task: TaskUnit,
        run: RunRef,
        params: dict[str, Any],
        trace: TraceContext,
        output: dict[str, Any] | None = None,
    ) -> TaskContext:
        if output:
            # A request's sink secrets, read back inside the activity (never in history).
            key = secrets_key(run)
            opened: list[tuple[str, str]] = []
            output = await statement(
                self.db,
                unseal_output,
                output,
                lambda name: self.secrets.get(key, name),
                opened,
            )
            # Redacted in this activity's text only (a thread's context is its own).
            for name, value in opened:
                register_sink_secret(name, value)
        return TaskContext(
            task_code=run.task_code,
            task_id=run.task_id,
            params=task.Params.model_validate(params),
            settings=self.settings,
            trace=trace,
            request_id=run.request_id,
            output=output or {},
            role=run.role,
        )

    async def cronjob_client(
        self, run: RunRef, target: dict[str, Any] | None, trace: TraceContext
    ) -> CallbackClient | None:
        if not target:
            return None
        tgt = CallbackTarget.of(target)
        if not tgt.enabled:
            return None
        token = await statement(self.db, self.secrets.get, secrets_key(run), CALLBACK_TOKEN)
        token = token or self._default_token(tgt)
        # A callback URL that is not the operator's (callback.base_url's origin) came
        # from the request: its connections are checked where they are made.
        hosts = self.settings.callback_hosts()
        url = resolve_base_url(tgt, self.settings.callback, hosts)
        own = same_origin(url, self.settings.callback.base_url)
        return CallbackClient(
            tgt,
            self.settings.callback,
            self.client if own else self.client.guarded(hosts),
            CallingRun(trace, token, run.request_id, run_key(run)),
            self.settings.callback_hosts(),
        )

    def _default_token(self, target: CallbackTarget) -> str | None:
        """``callback.default_token``, only for a callback to ``callback.base_url``'s
        origin: a request naming another allowed host gets no token of ours."""
        cfg = self.settings.callback
        if not cfg.default_token or not cfg.base_url:
            return None
        url = resolve_base_url(target, cfg, self.settings.callback_hosts())
        return cfg.default_token if same_origin(url, cfg.base_url) else None


class RunStep:
    """One step's activities (``activities/prepare.py``, ``fetch.py``, …): given the
    worker's one set of ``RunServices``, which it reads under these names."""

    def __init__(self, services: RunServices) -> None:
        self.services = services

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def client(self) -> HttpClient:
        return self.services.client

    @property
    def data(self) -> RunData:
        return self.services.data

    @property
    def staging(self) -> Staging:
        return self.services.staging

    @property
    def secrets(self) -> RunSecrets:
        return self.services.secrets

    @property
    def retained(self) -> Retained:
        return self.services.retained

    @property
    def db(self) -> Engine:
        return self.services.db

    @property
    def task_store(self) -> TaskStorage:
        return self.services.task_store

    @property
    def build_id(self) -> str | None:
        return self.services.build_id

    @property
    def on_rate_key(self) -> Callable[[str], Awaitable[None]] | None:
        return self.services.on_rate_key

    async def record(
        self,
        run: RunRef,
        kind: str,
        data: dict[str, Any],
        step: str | None = None,
        soon: bool = False,
    ) -> None:
        await self.services.record(run, kind, data, step, soon)

    async def report_judged(self, run: RunRef, seq: int, outcome: Outcome) -> None:
        await self.services.report_judged(run, seq, outcome)

    async def report_drift(self, run: RunRef, seq: int, outcome: Outcome) -> None:
        await self.services.report_drift(run, seq, outcome)

    async def report_quarantined(self, run: RunRef, seq: int, outcome: Outcome) -> None:
        await self.services.report_quarantined(run, seq, outcome)

    async def task_context(
        self,
        task: TaskUnit,
        run: RunRef,
        params: dict[str, Any],
        trace: TraceContext,
        output: dict[str, Any] | None = None,
    ) -> TaskContext:
        return await self.services.task_context(task, run, params, trace, output)

    async def cronjob_client(
        self, run: RunRef, target: dict[str, Any] | None, trace: TraceContext
    ) -> CallbackClient | None:
        return await self.services.cronjob_client(run, target, trace)
