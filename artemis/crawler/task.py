"""``crawl_notes``: search a platform's keywords into candidate notes, then fetch each
claimed note's details with a pooled cookie, write it once to ``tbl_source`` and send it
to the sinks of ``output_defaults.crawl_notes`` (docs/operations.md).

One run is one *execution* of its workflow name (the execution lock: a workflow of its
own, ``artemis/lock/{workflow_name}``, a named token's ``artemis/lock/{owner}~{workflow_name}``,
held while the run runs: starter/locks.py; mirrored in ``tbl_crawl_execution`` under the
same name); its task id is the execution id that locks the candidates it claims.

- fetch: the search phase pages through the keywords (``max_pages`` per keyword),
  ``runs.fetch_concurrency`` of them at a time, each with its own checkpoint, and adds
  candidates; the detail phase claims ``crawler.batch_size`` candidates at a time and
  fetches them, a cookie per request (401 → ``COOKIE_INVALID``, the cookie is blamed and
  the next one tried; 429 → wait ``Retry-After`` or the backoff; a timeout or a platform
  error sends the candidate back to pending, or to failed after ``max_retry``). Each
  batch is one staged page.
- emit: ``tbl_source`` first (fenced by the candidate's lock, idempotent by
  ``{note_id}_v1``); only notes this page stored (or stored before, on a retried emit)
  go on to the other sinks, under the page's idempotency key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from artemis.bounds import OutageTolerance
from artemis.calls import work
from artemis.config import Settings
from artemis.crawler.alerts import record_outcome
from artemis.crawler.claims import Claimed, Claims, LockLost
from artemis.crawler.cookies import CookiePool, PoolRules
from artemis.crawler.platform import HttpJsonPlatform, platform_for
from artemis.crawler.vault import vault_for
from artemis.db import get_engine, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import HttpClient
from artemis.logsetup import get_logger
from artemis.owners import owned_lock, owner_of
from artemis.paging import check_loop, page_digest
from artemis.sinks import EmitContext, Sink
from artemis.sources import Page, PageInfo, Source
from artemis.tasks.base import TaskContext, TaskUnit, fetch_units

log = get_logger("artemis.crawler")

CANDIDATE_FIELD = "_candidate_id"


class CrawlParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    platform: str = Field(min_length=1, max_length=50)
    keywords: list[str] = Field(min_length=1, max_length=100)
    max_pages: int | None = Field(None, ge=1, le=1000)
    workflow_name: str | None = Field(None, min_length=1, max_length=150)
    # How long an outage of the source or a sink is waited out (docs/architecture.md);
    # default: runs.outage_tolerance_s. 0: fail fast.
    outage_tolerance_s: OutageTolerance = None

    @field_validator("keywords")
    @classmethod
    def _keywords(cls, v: list[str]) -> list[str]:
        cleaned = [k.strip() for k in v]
        if any(not k for k in cleaned):
            raise ValueError("every keyword must be non-empty")
        return cleaned

    @field_validator("workflow_name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9._:-]{1,100}", v):
            raise ValueError("1-100 letters, digits and . _ : - (it names an execution lock)")
        return v

    @model_validator(mode="after")
    def _default_name(self) -> CrawlParams:
        if self.workflow_name is None:
            self.workflow_name = f"crawl_notes:{self.platform}"
        return self


class CookieSession:
    """Requests to one platform with pooled cookies, decrypted only here (inside the
    activity that makes the request)."""

    def __init__(
        self, settings: Settings, platform: str, keepalive: Callable[[], None] | None = None
    ) -> None:
        self.platform = platform
        self.cfg = settings.crawler
        self.engine = get_engine(settings.database.url)
        self.pool = CookiePool(
            self.engine,
            PoolRules(
                self.cfg.max_consecutive_errors,
                self.cfg.max_total_errors,
                self.cfg.cooling_duration_minutes,
            ),
        )
        self.vault = vault_for(settings)
        self.adapter: HttpJsonPlatform = platform_for(settings, platform)
        self.keepalive: Callable[[], None] = keepalive or (lambda: None)
        self.last_cookie: str | None = None  # the name of the last cookie used (not secret)

    async def _db(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return await work(fn, *args, **kw)

    async def _wait(self, seconds: float) -> None:
        """Sleep without letting the activity's heartbeat lapse."""
        end = asyncio.get_running_loop().time() + seconds
        while (left := end - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(min(left, 1.0))
            self.keepalive()

    async def with_cookie(self, what: str, call: Callable[[str], Any]) -> Any:
        """Run ``call(cookie)`` with pooled cookies: a refused cookie is counted against it
        and the next one tried; a 429 waits (Retry-After, else the backoff) and tries
        again; other failures are raised to the caller."""
        tried: set[int] = set()
        invalid = waits = 0
        while True:
            lease = await self._db(self.pool.acquire, self.platform, utcnow(), tried)
            self.last_cookie = lease.cookie_name
            cookie = await self._db(self.vault.decrypt, lease.ciphertext, lease.key_id)
            try:
                result = await call(cookie)
            except ArtemisError as e:
                if e.code == ErrorCode.COOKIE_INVALID:
                    status = await self._db(self.pool.report, lease.cookie_id, False, utcnow())
                    log.warning(
                        "cookie_refused", cookie=lease.cookie_name, status=status, what=what
                    )
                    tried.add(lease.cookie_id)
                    invalid += 1
                    if invalid >= ErrorCode.COOKIE_INVALID.info.max_retries:
                        raise
                    continue
                if e.details.get("rate_limited") and waits < len(self.cfg.backoff_s):
                    wait = e.retry_after_s or self.cfg.backoff_s[waits]
                    waits += 1
                    log.info("platform_rate_limited", what=what, wait_s=wait)
                    await self._wait(wait)
                    continue
                raise
            finally:
                del cookie
            await self._db(self.pool.report, lease.cookie_id, True, utcnow())
            return result


class _Crawl(CookieSession):
    """The I/O parts of one crawl activity attempt."""

    def __init__(self, ctx: TaskContext) -> None:
        self.params: CrawlParams = ctx.params  # type: ignore[assignment]
        super().__init__(ctx.settings, self.params.platform, ctx.controls.keepalive)
        self.claims = Claims(self.engine, self.cfg.max_retry)
        self.execution = ctx.task_id

    async def detail(self, client: HttpClient, c: Claimed) -> dict[str, Any] | None:
        try:
            note = await self.with_cookie(
                f"note {c.note_id}",
                lambda cookie: self.adapter.detail(
                    client, c.note_id, cookie, self.cfg.detail_timeout_s
                ),
            )
        except ArtemisError as e:
            if e.code == ErrorCode.COOKIE_EXHAUSTED:
                raise
            await self._db(
                record_outcome, self.engine, self.platform, False, e.code.value, utcnow()
            )
            status = await self._db(
                self.claims.fail, self.execution, c.id, e.code.value, utcnow(), not e.retryable
            )
            log.warning("note_failed", note_id=c.note_id, code=e.code.value, now=status)
            return None
        await self._db(record_outcome, self.engine, self.platform, True, None, utcnow())
        return {**note, CANDIDATE_FIELD: c.id}

    async def details(self, client: HttpClient, batch: list[Claimed]) -> list[dict[str, Any]]:
        """The notes of a claimed batch, one after another (a failed one is not among
        them); on a failure that ends the batch, its candidates are given back."""
        notes: list[dict[str, Any]] = []
        done: set[int] = set()
        try:
            for c in batch:
                note = await self.detail(client, c)
                done.add(c.id)
                if note is not None:
                    notes.append(note)
        except BaseException:
            # Cookies exhausted or the attempt cancelled: give back what was not tried,
            # and what was fetched but will not be staged now.
            for c in batch:
                if c.id not in done or any(n[CANDIDATE_FIELD] == c.id for n in notes):
                    await self._db(self.claims.release, self.execution, c.id, utcnow())
            raise
        return notes


async def _search(
    adapter: HttpJsonPlatform,
    client: HttpClient,
    keyword: str,
    page: int,
    timeout: float,
    cookie: str,
) -> Any:
    return await adapter.search(client, keyword, page, cookie, timeout)


class _KeywordSearch(Source):
    """One keyword's search pages, turned into candidates: a unit of the search phase.
    Its checkpoint: the next page and the last page's fingerprint (a page holding the
    notes of the page before it is a loop, not progress)."""

    def __init__(self, crawl: _Crawl, keyword: str) -> None:
        self.crawl, self.keyword = crawl, keyword
        self.name = f"search {keyword}"

    async def pages(
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        crawl, kw, p = self.crawl, self.keyword, self.crawl.params
        page_no, digest = 1, None
        if checkpoint:
            page_no, digest = int(checkpoint["page"]), checkpoint.get("digest")
        while True:
            found = await crawl.with_cookie(
                f"search {kw!r}",
                functools.partial(
                    _search, crawl.adapter, client, kw, page_no, crawl.cfg.search_timeout_s
                ),
            )
            new = page_digest([i["note_id"] for i in found.items])
            check_loop(digest, new, f"{p.platform} search {kw!r}", f"page {page_no}")
            await crawl._db(crawl.claims.add_candidates, p.platform, found.items, kw)
            await crawl._db(crawl.claims.heartbeat, crawl.execution, utcnow())
            last = found.next_page is None or (p.max_pages is not None and page_no >= p.max_pages)
            page_no, digest = found.next_page, new
            yield Page(
                records=[],
                checkpoint=None if last else {"page": page_no, "digest": digest},
            )
            if last:
                return


def _after_search(units: dict[str, Any] | None) -> dict[str, Any]:
    """The crawl's checkpoint after a search page: the detail phase once every keyword
    is done (``units``: the search's checkpoint, None then)."""
    return {"phase": "details"} if units is None else {"phase": "search", "units": units}


def _search_checkpoint(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The crawl's checkpoint; a search checkpoint of one keyword after another
    (``{"phase": "search", "k", "page", "digest"}``) is read as per-keyword units."""
    cp = dict(raw or {"phase": "search"})
    if cp.get("phase") == "search" and "k" in cp:
        k, page = int(cp["k"]), int(cp.get("page") or 1)
        started = page > 1 or cp.get("digest") is not None
        cp = {
            "phase": "search",
            "units": {
                "v": 2,
                "done": list(range(k)),
                "open": {str(k): {"page": page, "digest": cp.get("digest")}} if started else {},
            },
        }
    return cp


class NoteRecord(BaseModel):
    """A note as the sinks get it (the sample platform's detail answer): a
    platform whose notes carry other fields needs its own model for the sql and files sinks."""

    note_id: str
    platform: str
    title: str | None = None
    content: str | None = None
    author: str | None = None
    liked_count: int | None = None
    published_at: str | None = None


class CrawlNotes(TaskUnit):
    code = "crawl_notes"
    Params = CrawlParams
    Record = NoteRecord
    record_key = ("note_id",)
    summary = "Search a platform's keywords and collect each note once"
    error_budgets = True
    # A note's candidate is collected, retried or failed by the crawl's own rules.
    judges_records = False

    def emit_concurrency(self, ctx: TaskContext) -> int:
        return 1  # tbl_source first, page by page, inside the claim's fence

    def prepare_params(
        self, incoming: dict[str, Any], settings: Settings, trusted: bool = False
    ) -> BaseModel:
        params: CrawlParams = super().prepare_params(incoming, settings, trusted)  # type: ignore[assignment]
        platform_for(settings, params.platform)  # an unknown platform is a 422, not a run
        return params

    def lock_name(self, params: BaseModel) -> str | None:
        return params.workflow_name  # type: ignore[attr-defined, no-any-return]

    def total_hint(self, ctx: TaskContext) -> int:
        return len(ctx.params.keywords)  # type: ignore[attr-defined]

    def search_attributes(self, ctx: TaskContext) -> dict[str, str]:
        return {"ArtemisProvenance": ctx.params.platform}  # type: ignore[attr-defined]

    async def fetch(
        self, ctx: TaskContext, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncGenerator[Page, None]:
        """The search phase searches ``fetch_concurrency`` keywords at a time (each a unit
        with its own checkpoint, ``artemis/tasks/base.py``); then the detail phase claims
        and fetches batches of candidates. At a batch's end (``wind_down``) no new request
        starts; the searches in flight are taken, and the checkpoint resumes the rest."""
        crawl = _Crawl(ctx)
        p = crawl.params
        cp = _search_checkpoint(checkpoint)
        wind_down = ctx.controls.wind_down
        # the lock's name as the run's owner holds it: another owner's execution of the
        # same workflow name is not this one's stale twin
        assert p.workflow_name is not None  # its default is set when the params are read
        lock = owned_lock(owner_of(ctx.task_id), p.workflow_name)
        await crawl._db(crawl.claims.start_execution, lock, crawl.execution, utcnow())
        if cp["phase"] == "search":
            searches = [_KeywordSearch(crawl, kw) for kw in p.keywords]
            units = cp.get("units")
            async for page in fetch_units(
                searches,
                client,
                units,
                dataclasses.replace(ctx.controls, wind_down=wind_down),
                concurrency=self.fetch_concurrency(ctx),
                tolerance=0.0,
            ):
                cp = _after_search(page.checkpoint)
                yield Page(records=[], checkpoint=cp, info=page.info)
            if cp["phase"] == "search":
                return  # wound down mid-search: the next fetch resumes every keyword
        while not (wind_down is not None and wind_down.is_set()):
            batch = await crawl._db(
                crawl.claims.claim, crawl.execution, p.platform, crawl.cfg.batch_size, utcnow()
            )
            if not batch:
                yield Page(records=[], checkpoint=None, info=PageInfo(units_done=len(p.keywords)))
                return
            notes = await crawl.details(client, batch)
            await crawl._db(
                crawl.claims.heartbeat,
                crawl.execution,
                utcnow(),
                len(notes),
                len(batch) - len(notes),
            )
            yield Page(
                records=notes,
                checkpoint={"phase": "details"},
                info=PageInfo(units_done=len(p.keywords), source=f"{p.platform} notes"),
            )

    def decide_sinks(self, ctx: TaskContext) -> list[Sink]:
        return [NoteStore(ctx), *super().decide_sinks(ctx)]

    async def emit(
        self,
        client: HttpClient,
        sinks: list[Sink],
        records: list[dict[str, Any]],
        ctx: EmitContext,
    ) -> None:
        store, rest = sinks[0], sinks[1:]
        assert isinstance(store, NoteStore)
        deliver = await work(store.write, records, ctx.seq)
        ctx.delivered(store.name, len(deliver))
        if deliver:
            for sink in rest:
                await sink.emit(client, deliver, ctx)
                ctx.delivered(sink.name, len(deliver))

    def describe(self, params: BaseModel) -> str:
        p: CrawlParams = params  # type: ignore[assignment]
        shown = ", ".join(p.keywords[:5]) + (
            f" +{len(p.keywords) - 5}" if len(p.keywords) > 5 else ""
        )
        return f"{p.platform}: {shown}"

    def run_ended(self, ctx: TaskContext, status: str, error_code: str | None) -> None:
        Claims(get_engine(ctx.settings.database.url)).finish_execution(
            ctx.task_id, status, utcnow(), error_code
        )


class NoteStore(Sink):
    """``tbl_source``: each note once, fenced by its candidate's lock."""

    name = "tbl_source"

    def __init__(self, ctx: TaskContext) -> None:
        self.claims = Claims(get_engine(ctx.settings.database.url), ctx.settings.crawler.max_retry)
        self.execution = ctx.task_id

    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        await work(self.write, records, ctx.seq)

    def write(self, records: list[dict[str, Any]], seq: int) -> list[dict[str, Any]]:
        """Store the page's notes; the ones the other sinks should get (without the
        internal candidate field)."""
        now: datetime = utcnow()
        deliver: list[dict[str, Any]] = []
        outcomes: dict[str, int] = {}
        for rec in records:
            note = {k: v for k, v in rec.items() if k != CANDIDATE_FIELD}
            try:
                outcome = self.claims.write_note(
                    self.execution, int(rec[CANDIDATE_FIELD]), note, now, page_seq=seq
                )
            except LockLost:
                outcome = "lock_lost"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome in ("created", "replayed"):
                deliver.append(note)
        log.info("notes_written", seq=seq, **outcomes)
        return deliver
