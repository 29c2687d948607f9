"""POST /notes/details as a workflow: every note fetched by its own activity, all at once,
each with its own deadline, so one slow or failing note fails alone (docs/operations.md).
Cookies are decrypted only inside those activities; notes travel through staging."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior
from temporalio.exceptions import ActivityError, TimeoutError

from workflows import retry_policies

with workflow.unsafe.imports_passed_through():
    from activities.crawl import CrawlActivities
    from artemis.errors import ErrorCode
    from artemis.run_models import NoteDetailInput, NoteDetailOutcome, NoteDetailsRequest


@workflow.defn(name="NoteDetails", versioning_behavior=VersioningBehavior.PINNED)
class NoteDetailsWorkflow:
    @workflow.run
    async def run(self, req: NoteDetailsRequest) -> list[NoteDetailOutcome]:
        async def one(seq: int, note_id: str) -> NoteDetailOutcome:
            try:
                return await workflow.execute_activity_method(
                    CrawlActivities.fetch_note_detail,
                    NoteDetailInput(
                        platform=req.platform,
                        note_id=note_id,
                        batch_key=req.batch_key,
                        seq=seq,
                        timeout_s=req.detail_timeout_s,
                        request_id=req.request_id,
                    ),
                    # The platform call has its own timeout; this one catches a stuck worker.
                    start_to_close_timeout=timedelta(seconds=req.detail_timeout_s + 5),
                    retry_policy=retry_policies.NOTE_DETAIL,
                    summary=f"Note {note_id}",
                )
            except ActivityError as e:
                timed_out = isinstance(e.cause, TimeoutError)
                return NoteDetailOutcome(
                    id=note_id,
                    success=False,
                    error={
                        "code": ErrorCode.TIMEOUT_ERROR if timed_out else ErrorCode.INTERNAL,
                        "message": f"note {note_id}: {e.cause or e}",
                        "retryable": True,
                    },
                )

        return list(await asyncio.gather(*(one(i, n) for i, n in enumerate(req.note_ids))))
