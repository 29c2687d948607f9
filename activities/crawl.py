"""Activities of the crawler's own workflows: the timeout reclaim and the batch detail
fetch behind POST /notes/details. Thin adapters over ``artemis.crawler``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio import activity

from artemis.calls import work
from artemis.config import Settings
from artemis.crawler.alerts import evaluate, record_outcome, webhook_sender
from artemis.crawler.claims import Claims
from artemis.crawler.task import CookieSession
from artemis.db import get_engine, utcnow
from artemis.errors import ArtemisError
from artemis.http import make_client
from artemis.logsetup import get_logger
from artemis.run_models import (
    AlertsInput,
    AlertsResult,
    NoteDetailInput,
    NoteDetailOutcome,
    ReclaimInput,
    ReclaimResult,
)
from artemis.staging import Staging
from artemis.temporal.runs import stuck_runs

log = get_logger("artemis.activities.crawl")


class CrawlActivities:
    def __init__(self, settings: Settings, client: Any = None) -> None:
        self.settings = settings
        self.client = client or make_client(settings.http_client)
        self.staging = Staging(settings.database.url)

    @activity.defn(name="reclaim_stale_locks")
    async def reclaim_stale_locks(self, inp: ReclaimInput) -> ReclaimResult:
        now = datetime.fromisoformat(inp.now) if inp.now else utcnow()
        claims = Claims(get_engine(self.settings.database.url), self.settings.crawler.max_retry)
        r = await work(claims.reclaim, now, inp.lock_timeout_minutes)
        log.info(
            "locks_reclaimed",
            records_pending=r.records_pending,
            records_failed=r.records_failed,
            executions_timed_out=r.executions_timed_out,
        )
        return ReclaimResult(r.records_pending, r.records_failed, r.executions_timed_out)

    @activity.defn(name="fetch_note_detail")
    async def fetch_note_detail(self, inp: NoteDetailInput) -> NoteDetailOutcome:
        """One note of a batch; the note goes to staging, its outcome to the workflow."""
        session = CookieSession(self.settings, inp.platform, lambda: activity.heartbeat())
        try:
            note = await session.with_cookie(
                f"note {inp.note_id}",
                lambda cookie: session.adapter.detail(
                    self.client, inp.note_id, cookie, inp.timeout_s
                ),
            )
        except ArtemisError as e:
            log.warning("note_detail_failed", note_id=inp.note_id, code=e.code.value)
            await work(record_outcome, session.engine, inp.platform, False, e.code.value, utcnow())
            return NoteDetailOutcome(
                id=inp.note_id,
                success=False,
                error={"code": e.code.value, "message": e.message, "retryable": e.retryable},
                cookie_used=session.last_cookie,
            )
        await work(record_outcome, session.engine, inp.platform, True, None, utcnow())
        await work(self.staging.put_pages, inp.batch_key, "note", [(inp.seq, [note])])
        return NoteDetailOutcome(id=inp.note_id, success=True, cookie_used=session.last_cookie)

    @activity.defn(name="evaluate_alerts")
    async def evaluate_alerts(self, inp: AlertsInput) -> AlertsResult:
        """One evaluation of the crawler's alerts at the workflow's time."""
        now = datetime.fromisoformat(inp.now) if inp.now else utcnow()
        engine = get_engine(self.settings.database.url)
        try:  # the task queue's runs whose workflow task keeps failing (run_stuck)
            stuck = await stuck_runs(activity.client(), activity.info().task_queue)
        except Exception as e:  # Temporal's list away: the other alerts go on
            log.warning("stuck_runs_unchecked", error=f"{type(e).__name__}: {e}")
            stuck = None
        sent = await work(
            evaluate,
            engine,
            self.settings,
            now,
            webhook_sender(self.settings.alerts.webhook_url),
            stuck,
        )
        return AlertsResult(
            sent=[f"{m['status']}:{m['key']}" for m in sent],
        )

    def all(self) -> list[Any]:
        return [self.reclaim_stale_locks, self.fetch_note_detail, self.evaluate_alerts]
