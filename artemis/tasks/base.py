"""The TaskUnit API (docs/architecture.md): a task author describes *what* to fetch,
process and emit; the task-run workflow decides *when*, in durable batches.

Lifecycle: ``prepare_params`` → ``build_sources`` → ``fetch`` → ``process`` →
``decide_sinks`` → ``emit`` → ``finalize``. Each method gets a ``TaskContext``. ``fetch``
yields pages with checkpoints so that a batch can resume after a crash; ``process`` and
``emit`` see one batch of records at a time, so memory stays bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from pydantic import BaseModel, ValidationError

from artemis.completeness import shortfall
from artemis.config import Settings
from artemis.errors import (
    ArtemisError,
    ErrorCode,
    describe_fields,
    invalid_fields,
    validation_fields,
)
from artemis.http import HttpClient
from artemis.owners import writes_shared
from artemis.quarantine.judging import Rejection
from artemis.quarantine.policy import POLICY_FIELDS, RecordPolicy
from artemis.ratelimit import bucket_for
from artemis.security import same_origin
from artemis.sinks import (
    EmitContext,
    HttpSink,
    RecordSpec,
    Sink,
    build_sinks,
    lane_output,
    resolve_lanes,
    resolve_output,
    resolved_spec,
)
from artemis.sources import Page, PageInfo, Source
from artemis.sources.tree import RECORD_KEY, RESOURCE_KEY
from artemis.tracing import TraceContext


@dataclass
class FetchControls:
    """What the fetch activity tells one ``fetch`` call about its attempt; the defaults
    are those of a call outside an activity (a test, a one-shot fetch)."""

    # An operator's rate (requests per second, from a set_rate_limit signal).
    qps: float | None = None
    # A retried attempt (or a resumed batch): the source's last request may have been
    # served and its answer lost.
    resumed: bool = False
    # Heartbeats the activity without losing its resume state: a fetch waiting on its
    # source (a 429's Retry-After, a cookie's cool-down) calls it to stay alive.
    keepalive: Callable[[], None] | None = None
    # Set at a batch's end: no new request starts, the pages in flight still come.
    wind_down: asyncio.Event | None = None
    # At most this many requests in this call (None: no bound).
    max_pages: int | None = None


@dataclass
class TaskContext:
    task_code: str
    task_id: str
    params: BaseModel
    settings: Settings
    trace: TraceContext
    request_id: str | None = None
    output: dict[str, Any] = field(default_factory=dict)
    # The fetch attempt's controls (set by the fetch activity).
    controls: FetchControls = field(default_factory=FetchControls)
    # A replay of quarantined records (their run ended): no run-scoped side effects.
    replaying: bool = False
    # The records ``process`` turned down on the page it is processing (``reject``).
    rejected: list[Rejection] = field(default_factory=list)
    # The records ``process`` left out on purpose on that page (``leave_out``).
    filtered: int = 0
    # The role of the token that started the run: only an operator's or admin's run
    # changes a provenance's shared state (``writes_shared``).
    role: str = "client"

    @property
    def writes_shared(self) -> bool:
        return writes_shared(self.role)

    def reject(
        self,
        record: Any,
        reason: str,
        field: str | None = None,
        code: str = ErrorCode.SOURCE_CONTRACT.value,
    ) -> None:
        """Turn down one record in ``process`` (pass it as ``process`` got it, and leave
        it out of what ``process`` returns): it is quarantined with ``reason`` and
        ``field``, or fails the run under ``on_bad_record: fail`` — the rest of the page
        goes on."""
        self.rejected.append(Rejection(record, reason, field, code))

    def leave_out(self) -> None:
        """Leave one record out in ``process`` on purpose (a record step's filter): it is
        neither delivered nor quarantined, and counted as ``records_filtered``."""
        self.filtered += 1


@dataclass(frozen=True)
class Lane:
    """Where one lane of a run's records lands (``TaskUnit.lanes``): its place (a table
    and a folder) and its record model."""

    place: str
    spec: RecordSpec | None


@dataclass(frozen=True)
class ChildPlan:
    """A run that fans out: ``count`` child runs, ``parallelism`` at a time."""

    count: int
    parallelism: int


class TaskUnit:
    """Base class of every task. Subclasses set ``code`` and ``Params``, and override
    ``build_sources`` (and ``process`` when records need shaping)."""

    code: ClassVar[str]
    Params: ClassVar[type[BaseModel]]
    summary: ClassVar[str] = ""
    # The fetch honours ``ctx.controls.wind_down`` (the default fetch does): at a
    # batch's end it stops new requests and hands over the pages in flight.
    fetch_winds_down: ClassVar[bool] = True

    # ``prepare_params`` reads the database (or anything else that blocks): the API
    # validates a start request in a thread then. False (the default's pure validation
    # of the request and the config): on its event loop, without a thread's round trip.
    prepare_blocks: ClassVar[bool] = False

    # -- 1. params ---------------------------------------------------------------
    def prepare_params(
        self, incoming: dict[str, Any], settings: Settings, trusted: bool = False
    ) -> BaseModel:
        """Merge ``task_defaults.<code>`` with the request and validate. ``trusted`` params
        come from the workflow (a parent run), which may set ``internal_params``.

        Raises ArtemisError(INVALID_INPUT) naming each bad field.
        """
        merged = {**settings.task_defaults.get(self.code, {}), **(incoming or {})}
        internal = [k for k in self.internal_params if k in (incoming or {})]
        if internal and not trusted:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, f"params.{internal[0]}: set by Artemis, not by the request"
            )
        try:
            # (the settings: params bounded by the operator's caps, RecordPolicyParams)
            params = self.Params.model_validate(merged, context={"settings": settings})
        except ValidationError as e:
            raise invalid_input(e, "params") from None
        if getattr(params, "schema_contract", None) == "evolve" and not self.evolves_model:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"params.schema_contract: 'evolve' needs a record model declared as data "
                f"(a registry provenance's record_model); {self.code}'s is in code: use "
                "'discard' or 'freeze'",
            )
        return params

    # -- 2. sources ----------------------------------------------------------------
    def build_sources(self, ctx: TaskContext) -> list[Source]:
        """Construct the sources for this run; no I/O here."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_sources")

    # True: an activity failing with a retryable code is retried at most that code's
    # ``max_retries`` times (the error table of docs/api.md), whatever the retry policy says.
    error_budgets: ClassVar[bool] = False

    # Params only Artemis sets (a frozen contract, a child's window): refused from requests.
    internal_params: ClassVar[tuple[str, ...]] = ()

    # Params holding a URL the run will call: from a request, its host must be in
    # security.allowed_hosts; on the origin of task_defaults (config) it is trusted.
    request_url_params: ClassVar[tuple[str, ...]] = ()

    def source_client(self, client: HttpClient, ctx: TaskContext) -> HttpClient:
        """The client the run's source is fetched with: the guarded one (each connection's
        address checked against the allow-list) when a URL param is not on the origin
        the operator configured in ``task_defaults.<code>``, i.e. a request named it."""
        defaults = ctx.settings.task_defaults.get(self.code, {})
        for name in self.request_url_params:
            value = getattr(ctx.params, name, None)
            if isinstance(value, str) and not same_origin(value, defaults.get(name)):
                return client.guarded()
        return client

    def plan_children(self, ctx: TaskContext) -> ChildPlan | None:
        """Fan the run out into child runs (how many, how many at once), or None. Their
        params are asked a slice at a time (``child_slice``), so that a run with
        thousands of children never holds them all in one payload."""
        return None

    def child_slice(self, ctx: TaskContext, offset: int, limit: int) -> list[dict[str, Any]]:
        """The params of child runs ``offset`` .. ``offset + limit - 1`` of the plan."""
        raise NotImplementedError(f"{type(self).__name__} plans children: give child_slice")

    def split_parallelism(self, ctx: TaskContext) -> int:
        """How many pieces of a split run at once. A run that is itself a piece (or a
        window) holds one slot of its parent: its pieces take turns in it, so however deep
        the splitting, no more than the top run's parallelism fetch at a time."""
        return 1

    def split(self, ctx: TaskContext, details: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Params of smaller runs covering this one after RESULT_CAP_EXCEEDED, or None."""
        return None

    def rate_key(self, ctx: TaskContext) -> str | None:
        """A rate-limited source's key (its fetches go to that provenance's task queue, one
        page per activity, so the queue's activities-per-second limit holds cluster-wide)."""
        return None

    def search_attributes(self, ctx: TaskContext) -> dict[str, str]:
        """Keyword search attributes for the Temporal UI beyond the task code and ids
        (``ArtemisProvenance``, ``ArtemisTaskType``); values only, never secrets."""
        return {}

    def circuit_breaker(self, ctx: TaskContext) -> dict[str, Any] | None:
        """``{"threshold", "cool_down_s"}`` when the source has a circuit breaker."""
        return None

    def fetch_retry(self, ctx: TaskContext) -> dict[str, Any] | None:
        """The fetch activity's retry policy when the task has its own (keys of FetchRetry:
        initial_s, backoff, maximum_s, maximum_attempts); None keeps the defaults."""
        return None

    def describe(self, params: BaseModel) -> str:
        """What a run of these params harvests, in a few words (the Temporal UI's summary
        of the run: symbols, provenance and window, platform and keywords)."""
        return ""

    def source_name(self, ctx: TaskContext) -> str:
        """What an operator calls this run's source (``waiting: source <name> …``)."""
        return self.code

    def outage_tolerance(self, ctx: TaskContext) -> float | None:
        """How long an outage of this run's source or sinks is waited out: the param
        ``outage_tolerance_s`` (request or ``task_defaults.<code>``) when the task has it,
        else None (the provenance's, else ``runs.outage_tolerance_s``)."""
        value = getattr(ctx.params, "outage_tolerance_s", None)
        return float(value) if value is not None else None

    def total_hint(self, ctx: TaskContext) -> int:
        """A unit count for progress (default: the number of sources)."""
        return len(self.build_sources(ctx))

    # -- 3. fetch --------------------------------------------------------------------
    async def fetch(
        self, ctx: TaskContext, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncGenerator[Page, None]:
        """Yield the pages of every source, ``fetch_concurrency`` sources at a time,
        resumable from ``checkpoint`` (per source; see "the units of a run" below). The
        page's ``info.units_done`` counts the sources finished so far (for progress)
        and ``info.expected_total`` what the sources stated so far. A source that
        stated a total and ends short of it beyond the tolerance ends the fetch with
        ``info.incomplete`` on its last page (the run fails INCOMPLETE once that page
        is counted and emitted). ``ctx.controls.max_pages`` bounds the requests of
        this call; setting ``ctx.controls.wind_down`` (an ``asyncio.Event``) stops
        new requests, the pages in flight still come. The last page's checkpoint is None
        only when every source is done."""
        sources = self.build_sources(ctx)
        qps = ctx.controls.qps
        if qps:
            # An operator's rate (POST /tasks/{id}/rate-limit), one bucket for the run's
            # sources; each source decides whether it applies (a registry source applies
            # it to its contract's limiter instead).
            bucket = bucket_for(f"run:{ctx.task_code}/{ctx.task_id}", qps, 1)
            for src in sources:
                src.limit_rate(bucket.acquire)
        async for page in fetch_units(
            sources,
            client,
            checkpoint,
            ctx.controls,
            concurrency=self.fetch_concurrency(ctx),
            tolerance=self.completeness_tolerance(ctx),
        ):
            yield page

    def emit_concurrency(self, ctx: TaskContext) -> int:
        """How many pages of a batch go to the sinks at once (``runs.emit_concurrency``)."""
        return int(ctx.settings.runs.emit_concurrency)

    def fetch_concurrency(self, ctx: TaskContext) -> int:
        """How many of the run's sources fetch at once (``runs.fetch_concurrency``)."""
        return int(ctx.settings.runs.fetch_concurrency)

    def completeness_tolerance(self, ctx: TaskContext) -> float:
        """The shortfall (percent of a stated total) a run accepts before INCOMPLETE."""
        value = getattr(ctx.params, "completeness_tolerance_pct", None)
        return float(value) if value is not None else 0.0

    # -- 4. process ------------------------------------------------------------------
    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        """Shape one page of records (pure; default: unchanged)."""
        return records

    def record_policy(self, ctx: TaskContext) -> RecordPolicy:
        """What happens to a record ``process`` or the record model rejects, and to a field
        the model does not name (``artemis/quarantine/``): the run's params
        (``on_bad_record``, ``max_bad_records``, ``schema_contract``, from the request or
        ``task_defaults.<code>``), else the defaults (quarantine, 1 %, discard)."""
        return RecordPolicy.of(policy_params(ctx.params))

    # False: records are not judged before the sinks (no quarantine, no drift): the
    # task's own rules hold (a crawl's candidates fail and retry on their own), and a
    # sink's model check fails the run.
    judges_records: ClassVar[bool] = True

    # A task whose record model is data (a registry provenance's) may evolve it: a new
    # field seen is added for the next runs. A model in code cannot.
    evolves_model: ClassVar[bool] = False

    def evolve_model(self, ctx: TaskContext, fields: dict[str, str]) -> bool:
        """Add ``fields`` (name → declared type, nullable) to the record model of the next
        runs; True when the model changed."""
        return False

    def replay_params(self, params: dict[str, Any], settings: Settings) -> dict[str, Any]:
        """The params a replay of a run's quarantined records judges them by: the run's
        own (a task whose record model is data refreshes it to the one in force now)."""
        return params

    # -- 5./6. sinks -------------------------------------------------------------------
    # The shape of a processed record and the fields that identify one (the sql sink's
    # upsert key, the Parquet schema): declared once here, used by every sink that needs it.
    Record: ClassVar[type[BaseModel] | None] = None
    record_key: ClassVar[tuple[str, ...]] = ()

    def record_spec(self, params: BaseModel | None = None) -> RecordSpec | None:
        """The record model and key of a run with ``params`` (None: the task's own); a
        task whose records depend on the run (a registry provenance may declare its own
        model) overrides this."""
        return RecordSpec(self.Record, self.record_key) if self.Record is not None else None

    def lanes(self, params: BaseModel) -> dict[str, Lane] | None:
        """A run whose records land in several places (a provenance of several
        resources: artemis/registry/tree.py): each lane's place and record model, by name.
        Its pages' records are then ``{"@resource": lane, "@record": record}``
        (artemis/sources/tree.py), judged and sent by lane. None: one place, the run's."""
        return None

    def lane_params(self, params: BaseModel, lane: str) -> BaseModel:
        """The params of a run of ``lane`` alone: its records judged by that lane's model
        and policy (a replay of its quarantined records runs with them)."""
        return params

    def output_place(self, params: BaseModel) -> str | None:
        """The run's own place among the sinks: a table (``sql.tables`` by it, else it)
        and a folder of its own. None: the task's (``sql.table``, ``{url}/{code}/``)."""
        return None

    def decide_sinks(self, ctx: TaskContext) -> list[Sink]:
        """The run's sinks, from the output it resolved when it started (request over
        ``output_defaults``): a worker with another configuration sends its records to
        the same places. A run whose output was not resolved at its start (it carries
        only its request's output) is resolved here, against this worker's configuration.
        A run of several lanes has each sink once per lane (``{sink}/{lane}``), in the
        lane's own table and folder."""
        record, database_url = self.record_spec(ctx.params), ctx.settings.database.url
        defaults = ctx.settings.output_defaults.get(self.code, {})
        lanes = self.lanes(ctx.params)
        if lanes:
            output = ctx.output or {}
            if resolved_spec(output) is None:
                asked = {lane: (ln.place, ln.spec) for lane, ln in lanes.items()}
                output = resolve_lanes(self.code, defaults, output, asked, database_url)
            return [
                laned(sink, lane)
                for lane, ln in lanes.items()
                for sink in build_sinks(
                    resolved_spec(lane_output(output, lane)) or {},
                    ln.spec,
                    database_url,
                    defaults.get("http_endpoint"),
                )
            ]
        spec = resolved_spec(ctx.output or {})
        if spec is None:
            resolved = resolve_output(
                self.code,
                defaults,
                ctx.output,
                record,
                database_url,
                self.output_place(ctx.params),
            )
            spec = resolved_spec(resolved) or {}
        return build_sinks(spec, record, database_url, defaults.get("http_endpoint"))

    async def emit(
        self,
        client: HttpClient,
        sinks: list[Sink],
        records: list[dict[str, Any]],
        ctx: EmitContext,
    ) -> None:
        by_lane = lane_records(records) if any(sink_lane(s) for s in sinks) else None
        for sink in sinks:
            lane = sink_lane(sink)
            mine = records if by_lane is None or lane is None else by_lane.get(lane, [])
            if by_lane is not None and not mine:
                continue
            try:
                await sink.emit(client, mine, ctx)
            except ArtemisError as e:
                e.details.setdefault("sink", sink.name)  # which sink an outage is of
                raise
            ctx.delivered(sink.name, len(mine))

    # -- 7. finalize ---------------------------------------------------------------------
    def finalize(self, ctx: TaskContext, stats: dict[str, Any]) -> dict[str, Any]:
        """Last word on the stats (default: unchanged). Must not raise."""
        return stats

    def run_ended(self, ctx: TaskContext, status: str, error_code: str | None) -> None:
        """Told how every run ended (completed, failed, cancelled, timeout), e.g. to close
        an execution record. Errors are logged, never fail the run."""

    # -- execution lock ------------------------------------------------------------------
    def lock_name(self, params: BaseModel) -> str | None:
        """A workflow name of which one execution at a time may run: each run holds the
        lock ``artemis/lock/{name}`` (workflows/execution_lock.py) and a second start is
        refused with EXECUTION_LOCKED. None: runs are independent."""
        return None


def laned(sink: Sink, lane: str) -> Sink:
    """``sink`` as one lane's: named ``{sink}/{lane}`` (its stats and idempotency keys are
    the lane's own); an HTTP sink says the lane in ``X-Artemis-Resource``."""
    sink.name = f"{sink.name}/{lane}"
    sink.lane = lane  # type: ignore[attr-defined]
    if isinstance(sink, HttpSink):
        sink.headers = {**sink.headers, "X-Artemis-Resource": lane}
    return sink


def sink_lane(sink: Sink) -> str | None:
    return getattr(sink, "lane", None)


def lane_records(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A page of several lanes' records (``{"@resource", "@record"}``) by lane, each in
    its order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r[RESOURCE_KEY], []).append(r[RECORD_KEY])
    return out


def policy_params(params: BaseModel) -> dict[str, Any]:
    return {name: getattr(params, name, None) for name in POLICY_FIELDS}


def describe_validation_error(e: ValidationError, prefix: str) -> str:
    return describe_fields(validation_fields(e.errors(), prefix))


def invalid_input(e: ValidationError, prefix: str) -> ArtemisError:
    """A 422 INVALID_INPUT naming each bad field under ``prefix`` (``params``, ``body``)."""
    return invalid_fields(e.errors(), prefix)


# -- the units of a run ---------------------------------------------------------------
#
# A run's independent units (the sources of ``build_sources``: the symbols of a quote
# run, say) fetched concurrently, as one stream of pages with one resumable checkpoint.
#
# Up to ``concurrency`` sources fetch at once; their pages reach the caller in the order
# they arrive. Each source reads at most one page ahead: its next request starts when the
# caller takes its page, so memory stays bounded and a source that breaks its contract is
# asked at most once more. The checkpoint that comes with each page records, per unit,
# where it resumes — only for pages already handed to the caller — so a retried fetch
# resumes every unfinished unit where it stopped and fetches again at most the pages that
# were in flight::
#
#     {"v": 2, "done": [0, 2], "open": {"1": <source checkpoint>}, "expected": 1200}
#
# ``done``: the units finished; ``open``: those started, with the checkpoint after their
# last page handed over; ``expected``: the totals the finished units stated. Units in
# neither start from the beginning. A checkpoint without ``"v"`` (``{"source": i,
# "state": …, "expected": …}``, one source after another) is read as well.
#
# When a unit that stated a total ends short of it beyond the tolerance, its last page
# carries ``info.incomplete`` and the stream ends there (the run fails INCOMPLETE once
# that page is counted and emitted).


@dataclass
class UnitsCheckpoint:
    done: set[int] = field(default_factory=set)
    open: dict[int, Any] = field(default_factory=dict)
    expected: int | None = None

    @classmethod
    def load(cls, raw: dict[str, Any] | None) -> UnitsCheckpoint:
        if not raw:
            return cls()
        if raw.get("v") == 2:
            return cls(
                done={int(i) for i in raw.get("done") or []},
                open={int(i): s for i, s in (raw.get("open") or {}).items()},
                expected=raw.get("expected"),
            )
        # One source after another (no "v"): the ones before ``source`` are done.
        index, state = int(raw.get("source", 0)), raw.get("state")
        return cls(
            done=set(range(index)),
            open={index: state} if state is not None else {},
            expected=raw.get("expected"),
        )

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": 2,
            "done": sorted(self.done),
            "open": {str(i): s for i, s in sorted(self.open.items())},
        }
        if self.expected is not None:
            out["expected"] = self.expected
        return out


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


@dataclass
class _Units:
    """What the unit workers share: the units left to fetch, the page budget and the
    queue their pages reach the consumer by."""

    sources: Sequence[Source]
    client: HttpClient
    cp: UnitsCheckpoint
    todo: list[int]
    queue: asyncio.Queue[Any]
    running: int
    # Requests left under ``max_pages`` (-1: no limit).
    budget: int
    resumed: bool
    wind_down: asyncio.Event | None
    # The share of a unit's stated total it may end short of (percent), and the totals
    # the open units stated so far (unit → total).
    tolerance: float = 0.0
    stated: dict[int, int] = field(default_factory=dict)

    def settle(self, i: int, page: Page) -> bool:
        """Record unit ``i``'s page in the checkpoint and the totals, and fill in its info
        and the checkpoint it carries. True when the unit ended short of its stated total
        beyond the tolerance: the page then carries ``info.incomplete`` and the stream
        ends with it."""
        cp, stated, name = self.cp, self.stated, self.sources[i].name
        said = page.info.expected_total
        if page.checkpoint is not None:
            cp.open[i] = page.checkpoint
            if isinstance(said, int):
                stated[i] = said
        else:
            cp.open.pop(i, None)
            stated.pop(i, None)
            short = shortfall(
                name,
                said,
                page.info.taken,
                self.tolerance,
                page.info.request or "its last page",
            )
            if short is not None:
                page.info.incomplete = short
                page.info.expected_total = _sum(_add(cp.expected, said), stated)
                page.info.units_done = len(cp.done)
                page.info.source = name
                return True
            cp.done.add(i)
            cp.expected = _add(cp.expected, said)
        page.info.units_done = len(cp.done)
        page.info.expected_total = _sum(cp.expected, stated)
        page.info.source = name
        page.checkpoint = None if len(cp.done) == len(self.sources) else cp.dump()
        return False

    def may_request(self) -> bool:
        """One more request may start (and is counted against ``max_pages``)."""
        if _set(self.wind_down) or self.budget == 0:
            return False
        self.budget -= 1
        return True

    async def work(self) -> None:
        """Fetch units one after another until none is left, the budget is spent or the
        run winds down; the last worker to finish ends the stream."""
        try:
            while self.todo and not _set(self.wind_down) and self.budget != 0:
                i = self.todo.pop(0)
                state = self.cp.open.get(i)
                if state is not None:
                    self.sources[i].resumed = self.resumed
                gen = cast(AsyncGenerator[Page, None], self.sources[i].pages(self.client, state))
                async with aclosing(gen) as pages:
                    while self.may_request():
                        page = await anext(pages, None)
                        if page is None:
                            break
                        taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                        await self.queue.put((i, page, taken))
                        if page.checkpoint is None:
                            break
                        # One page ahead at most: the next request starts once this page
                        # is taken (it overlaps the caller's work on it, no more).
                        await taken
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # handed to the consumer, which raises it
            await self.queue.put(_Failed(e))
            return
        self.running -= 1
        if self.running == 0:
            await self.queue.put(_END)


async def fetch_units(
    sources: Sequence[Source],
    client: HttpClient,
    checkpoint: dict[str, Any] | None,
    controls: FetchControls | None = None,
    *,
    concurrency: int,
    tolerance: float,
) -> AsyncIterator[Page]:
    """Yield the pages of every unit, ``concurrency`` units at a time (see "the units of
    a run" above); ``controls``: the attempt's (resumed, wind_down, max_pages).

    The stream ends with a page whose checkpoint is None once every unit is done (a
    run with nothing left gets one empty such page). It ends earlier — its last page's
    checkpoint resuming every unit — when ``max_pages`` pages were requested, or once
    ``wind_down`` is set: no new request starts then, and the pages in flight still
    come."""
    controls = controls or FetchControls()
    cp = UnitsCheckpoint.load(checkpoint)
    todo = [i for i in range(len(sources)) if i not in cp.done]
    # Started units first: they hold what a crashed attempt had begun.
    todo.sort(key=lambda i: (i not in cp.open, i))
    max_pages = controls.max_pages
    units = _Units(
        sources,
        client,
        cp,
        todo,
        queue=asyncio.Queue(maxsize=max(1, concurrency)),
        running=max(1, min(concurrency, len(todo))),
        budget=max_pages if max_pages is not None else -1,
        resumed=controls.resumed,
        wind_down=controls.wind_down,
        tolerance=tolerance,
    )
    if not todo:
        yield Page(records=[], checkpoint=None, info=PageInfo(units_done=len(cp.done)))
        return
    workers = [asyncio.create_task(units.work()) for _ in range(units.running)]
    try:
        while True:
            item = await units.queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            i, page, taken = item
            taken.set_result(None)
            ended_short = units.settle(i, page)
            yield page
            if ended_short:
                return
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def _set(event: asyncio.Event | None) -> bool:
    return event is not None and event.is_set()


def _add(a: int | None, b: Any) -> int | None:
    if not isinstance(b, int):
        return a
    return b if a is None else a + b


def _sum(base: int | None, open_units: dict[int, int]) -> int | None:
    total = base
    for v in open_units.values():
        total = _add(total, v)
    return total
