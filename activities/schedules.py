"""The scheduled start's activities (workflows/scheduled_start.py): start the task run
through the API's own start path, ``RunService.start`` (starter/service.py: params
validated, the owner's task ids and execution locks, secrets sealed, the run recorded in
task storage), and wait for the run to end. The start path is the API's and not a copy
of it, so a scheduled run is checked exactly as a requested one is."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.locks import until_closed
from artemis.callback import CallbackTarget
from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.owners import writes_shared
from artemis.registry.secret_env import refused_secret_env
from artemis.run_models import MADE_BY_API, ScheduledRun, StartScheduled
from artemis.schedules import run_task_id
from artemis.tracing import TraceContext, new_span_id, new_trace_id
from starter.service import RunService, StartRequest

log = get_logger("artemis.schedules")


class ScheduleActivities:
    def __init__(self, settings: Settings, client: Client) -> None:
        self.settings = settings
        self.client = client
        self._service: RunService | None = None

    @property
    def service(self) -> RunService:
        if self._service is None:
            self._service = RunService(self.client, self.settings)
        return self._service

    @activity.defn(name="start_scheduled_run")
    async def start_scheduled_run(self, inp: StartScheduled) -> ScheduledRun:
        """Start the schedule's run for the instant it was scheduled for (the same instant,
        the same task id: a retry attaches to the run a lost answer made)."""
        start = inp.start
        task_id = run_task_id(start.name, datetime.fromisoformat(inp.scheduled_at))
        role = self._maker_role(start.name, start.owner, start.role, start.made_by)
        callback = None
        if start.callback is not None:
            callback = CallbackTarget(
                caller_run_id=task_id,
                base_url=start.callback.get("base_url"),
                auth_header=start.callback.get("auth_header"),
            )
        ask = StartRequest(
            params=dict(start.params),
            task_id=task_id,
            request_id=f"schedule/{start.name}",
            timeout_s=start.timeout_s,
            callback=callback,
            callback_token=_token(start.token_env, start.name),
            role=role,
        )
        trace = TraceContext(new_trace_id(), new_span_id())
        try:
            started = await self.service.start(
                start.task_code, ask, trace, ask.request_id, owner=start.owner
            )
        except ArtemisError as e:
            log.warning(
                "scheduled_start_failed",
                schedule=start.name,
                task_code=start.task_code,
                code=e.code.value,
                error=e.message,
            )
            raise ApplicationError(
                e.message, type=e.code.value, non_retryable=not e.retryable
            ) from None
        finally:
            await self.service.drain()
        done = started.existing_result or {}
        log.info(
            "scheduled_run_started",
            schedule=start.name,
            task_id=started.task_id,
            workflow_id=started.workflow_id,
        )
        return ScheduledRun(
            task_id=started.task_id,
            workflow_id=started.workflow_id,
            run_id=started.run_id,
            status=done.get("status"),
        )

    @activity.defn(name="await_run_end")
    async def await_run_end(self, run: ScheduledRun) -> ScheduledRun:
        """Wait for the run's end, heartbeating; its status as the task store has it."""
        if run.status is None:
            await until_closed(self.client.get_workflow_handle(run.workflow_id, run_id=run.run_id))
        status = await self.service.status(run.task_id)
        return ScheduledRun(run.task_id, run.workflow_id, run.run_id, status.get("status"))

    def _maker_role(self, name: str, owner: str, role: str, made_by: str) -> str:
        """The role a start runs with: an API schedule's maker's role now, where the
        workers know the API's tokens (a token removed, or no longer an operator, fails
        the start naming it); else the role it was made with."""
        tokens = self.settings.server.tokens()
        if made_by != MADE_BY_API or not tokens:
            return role
        found = next((t for t in tokens if t.name == owner), None)
        if found is None or not writes_shared(found.role):
            now = "no longer exists" if found is None else f"is now a {found.role}"
            raise ApplicationError(
                f"schedule {name!r}: its maker, token {owner!r}, {now}: a schedule's runs "
                "need an operator or admin token (delete the schedule, or make it again)",
                type=ErrorCode.FORBIDDEN.value,
                non_retryable=True,
            )
        return found.role

    def all(self) -> list[Any]:
        return [self.start_scheduled_run, self.await_run_end]


def _token(env: str | None, name: str) -> str | None:
    """The callback token a schedule of the configuration names (None: none named, the
    run sends ``callback.default_token``)."""
    if env is None:
        return None
    why = refused_secret_env(env)
    value = os.environ.get(env)
    if why or not value:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"schedule {name!r}: callback.token_env {env}: "
            + (why or "is not set in the worker's environment"),
            retryable=False,
        )
    return value
