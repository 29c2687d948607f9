"""The read side of runs: where a run is (its workflow), what it is doing and how it
ended, as the API and the CLI show it — the task store's record (the run's mirrored
snapshot) first, the workflow's ``progress`` query while it is open, Temporal's own
answer when neither says. A read never writes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from artemis.calls import work
from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.outage import waiting_line
from artemis.run_models import (
    SA_OWNER,
    SA_PROVENANCE,
    SA_RUN_ID,
    SA_TASK_CODE,
    SA_TASK_ID,
    WORKFLOW_NAME,
    workflow_id_for,
)
from artemis.run_state import OPEN, TERMINAL, RunStatus, stats_view
from artemis.tasks.registry import task_codes
from artemis.taskstore import StorageUnavailable, TaskStorage, make_task_storage
from artemis.temporal.client import SearchAttributeCheck
from artemis.temporal.runs import OPEN_STATUSES, closed_run_end, stuck_of
from artemis.temporal.versioning import polled_builds

log = get_logger("artemis.starter")

KEY_TASK_CODE = SearchAttributeKey.for_keyword(SA_TASK_CODE)
KEY_TASK_ID = SearchAttributeKey.for_keyword(SA_TASK_ID)
KEY_OWNER = SearchAttributeKey.for_keyword(SA_OWNER)
KEY_RUN_ID = SearchAttributeKey.for_keyword(SA_RUN_ID)
KEY_PROVENANCE = SearchAttributeKey.for_keyword(SA_PROVENANCE)

# How long GET /tasks/{id} waits for a worker to answer the progress query.
QUERY_TIMEOUT_S = 3.0


class RunReads:
    """Finding and reading runs (the base of ``starter.service.RunService``)."""

    client: Client
    settings: Settings
    _store: TaskStorage | None
    _search_attributes: SearchAttributeCheck | None = None

    @property
    def search_attributes(self) -> SearchAttributeCheck:
        """The namespace's search attributes as last checked (``/ready``, each start)."""
        if self._search_attributes is None:
            self._search_attributes = SearchAttributeCheck(self.client)
        return self._search_attributes

    @property
    def store(self) -> TaskStorage:
        if self._store is None:
            self._store = make_task_storage(self.settings)
        return self._store

    async def record(self, task_id: str) -> Any:
        """The task-store record of a run, or None (absent, expired or store unreachable:
        then Temporal alone answers)."""
        try:
            return await work(self.store.load, task_id)
        except StorageUnavailable as e:
            log.warning("task_store_unavailable", task_id=task_id, error=str(e))
            return None

    @staticmethod
    async def _holder(handle: WorkflowHandle) -> str | None:
        desc = await handle.describe()
        return desc.typed_search_attributes.get(KEY_TASK_ID)

    async def find(self, task_id: str, workflow_id: str | None = None) -> WorkflowHandle | None:
        """The run's workflow: the id the task store recorded, else one per task code. (A
        run recorded under its lock's id, as runs with a lock once were, shares that id
        with the lock's other runs: only the one of this task counts.)"""
        candidates = [workflow_id] if workflow_id else []
        candidates += [workflow_id_for(code, task_id) for code in task_codes()]
        for wf_id in candidates:
            handle = self.client.get_workflow_handle(wf_id)
            try:
                if wf_id.startswith("artemis/lock/"):
                    if await self._holder(handle) != task_id:
                        continue
                    return handle
                await handle.describe()
                return handle
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:
                    raise
        return None

    async def status(self, task_id: str, handle: WorkflowHandle | None = None) -> dict[str, Any]:
        """The run as operators see it. Given a handle: Temporal's answer (a run just
        started or finished). Otherwise the task store first — a finished run is answered
        from it, also after Temporal's retention — merged with the live progress query
        while the run is open. A read never writes: a run that closed without recording
        its end is answered from Temporal here and recorded by the clean-up loop."""
        if handle is not None:
            return await self._temporal_status(task_id, handle)
        record = await self.record(task_id)
        if record is not None and record.status in TERMINAL:
            return from_record(record)
        handle = await self.find(task_id, record.workflow_id if record is not None else None)
        if handle is None:
            if record is not None:
                return from_record(record)
            raise ArtemisError(ErrorCode.TASK_NOT_FOUND, f"no task with id {task_id!r}")
        out = await self._temporal_status(task_id, handle, record)
        if record is not None:
            out["created_at"] = record.created_at.isoformat()
            out["feedback"] = record.feedback
            out["task_store"] = record.status
        out["source"] = "temporal"
        return out

    async def closed_end(self, task_id: str) -> dict[str, Any] | None:
        """How a run ended, when it has: {status, stats, error}; None while it is open."""
        record = await self.record(task_id)
        if record is not None and record.status in TERMINAL:
            return {
                "status": record.status,
                "stats": stats_view(record.result),
                "error": record.error,
            }
        handle = await self.find(task_id, record.workflow_id if record is not None else None)
        if handle is None:
            return None
        desc = await handle.describe()
        if desc.status in OPEN_STATUSES:
            return None
        end = await closed_run_end(handle, desc.status)
        return {
            "status": end["status"],
            "stats": stats_view(end.get("stats")),
            "error": end.get("error"),
        }

    async def _temporal_status(
        self, task_id: str, handle: WorkflowHandle, record: Any = None
    ) -> dict[str, Any]:
        desc = await handle.describe()
        code = desc.typed_search_attributes.get(KEY_TASK_CODE) or handle.id.split("/")[1]
        out: dict[str, Any] = {
            "task_id": task_id,
            "task_code": code,
            "provenance": desc.typed_search_attributes.get(KEY_PROVENANCE),
            "workflow_id": handle.id,
            "run_id": desc.run_id,
            "started_at": desc.start_time.isoformat() if desc.start_time else None,
            "completed_at": desc.close_time.isoformat() if desc.close_time else None,
        }
        st = desc.status
        if st in OPEN_STATUSES:
            # the worker build the run is pinned to (none before its first step)
            out["build"] = _pinned_build(desc)
            stuck = await stuck_of(self.client, desc)
            if stuck is not None:
                # No progress query: the worker fails the run's every task, and a query
                # it answers would say `running` for a run that does not move.
                out.update(_stuck_view(stuck, record))
                return out
            out.update(await self._progress_view(handle, desc, record))
            return out
        out.update(await closed_run_end(handle, st))
        return out

    async def _progress_view(
        self, handle: WorkflowHandle, desc: Any, record: Any
    ) -> dict[str, Any]:
        """An open run as its ``progress`` query answers (the task store's word and the
        reason when no worker answers)."""
        try:
            # A query needs a live worker; answer from Temporal alone when none responds.
            progress = await asyncio.wait_for(handle.query("progress"), QUERY_TIMEOUT_S)
        except (TimeoutError, RPCError, WorkflowQueryFailedError) as e:
            # No worker answers: the run's own last word is its mirrored record
            # (`running` once it started; `pending` before).
            stored = record.status if record is not None else None
            progress = {
                "status": stored if stored in OPEN else RunStatus.PENDING.value,
                "stage": "unknown",
                "note": await self._unanswered(desc, e),
            }
        return {
            "status": progress.get("status") or RunStatus.RUNNING.value,
            "progress": progress,
            "stats": stats_view(progress),
            "error": progress.get("error"),
            # the operator's controls as the run holds them
            "paused": bool(progress.get("paused")),
            "qps": progress.get("qps"),
            "waiting": progress.get("waiting"),
            "waiting_line": waiting_line(progress["waiting"], datetime.now(UTC))
            if progress.get("waiting")
            else None,
        }

    async def _unanswered(self, desc: Any, error: BaseException) -> str:
        """Why the progress query went unanswered, as far as Temporal tells: a run pinned
        to a build that no worker polls waits for a worker of that build."""
        note = f"progress query unanswered: {type(error).__name__}"
        build = _pinned_build(desc)
        if build is None:
            return note
        try:
            polled = await polled_builds(self.client, desc.task_queue)
        except RPCError:
            return note
        if build in polled:
            return note
        return (
            f"{note}; the run is pinned to worker build {build}, which no worker polls: "
            "start a worker of that build (artemis builds list)"
        )


def _stuck_view(stuck: dict[str, Any], record: Any) -> dict[str, Any]:
    """A run whose workflow task keeps failing: status ``stuck``, why and what to do; its
    counts as the task store last recorded them."""
    word = RunStatus.STUCK.value  # the status, its block and its stage
    return {
        "status": word,
        word: stuck,
        "progress": {"status": word, "stage": word, "note": stuck["reason"]},
        "stats": stats_view(record.result if record is not None else None),
        "error": None,
    }


def _pinned_build(desc: Any) -> str | None:
    info = desc.raw_description.workflow_execution_info.versioning_info
    return info.deployment_version.build_id or None


# The Temporal UI's list filtered to the task runs alone (the housekeeping loops and the
# note-details batches have workflow types of their own).
RUNS_QUERY = f'WorkflowType = "{WORKFLOW_NAME}"'


def provenance_of(payload: dict[str, Any] | None) -> str | None:
    """The source a run harvests, from its request (a registry run's provenance, a crawl's
    platform)."""
    params = (payload or {}).get("params") or {}
    value = params.get("provenance") or params.get("platform")
    return value if isinstance(value, str) else None


def from_record(record: Any) -> dict[str, Any]:
    """A run answered from the task store alone (its start and end are the workflow's:
    the duration is the run's own)."""
    duration = None
    if record.started_at and record.completed_at:
        duration = int((record.completed_at - record.started_at).total_seconds() * 1000)
    return {
        "task_id": record.task_id,
        "task_code": record.task_code,
        "provenance": provenance_of(record.payload),
        "workflow_id": record.workflow_id,
        "status": record.status,
        "created_at": record.created_at.isoformat(),
        "started_at": record.started_at.isoformat() if record.started_at else None,
        "completed_at": record.completed_at.isoformat() if record.completed_at else None,
        "duration_ms": duration,
        "stats": stats_view(record.result),
        "error": record.error,
        "feedback": record.feedback,
        "source": "task_store",
    }


def ui_url(settings: Settings, workflow_id: str) -> str:
    """The run's page in the Temporal UI (workflow ids hold slashes: encode them)."""
    return (
        f"{settings.temporal.ui_url}/namespaces/{quote(settings.temporal.namespace, safe='')}"
        f"/workflows/{quote(workflow_id, safe='')}"
    )


def ui_list_url(settings: Settings, query: str = RUNS_QUERY) -> str:
    """The Temporal UI's workflow list with ``query`` (a visibility query) as its filter."""
    return (
        f"{settings.temporal.ui_url}/namespaces/{quote(settings.temporal.namespace, safe='')}"
        f"/workflows?query={quote(query, safe='')}"
    )
