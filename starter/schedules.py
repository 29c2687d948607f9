"""What ``/schedules`` and ``artemis schedules`` do (docs/schedules.md): a schedule made
through the API is checked now as each of its starts will be (``RunService.check_start``)
and belongs to the token that made it; its runs start with that token's role. Reading,
pausing, triggering and deleting go to Temporal (artemis/temporal/schedules.py)."""

from __future__ import annotations

from typing import Any

from artemis.callback import CallbackTarget
from artemis.calls import work
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.owners import writes_shared
from artemis.run_models import MADE_BY_API, MADE_BY_CONFIG
from artemis.schedules import ScheduleDef, start_of, with_time_zone
from artemis.temporal.schedules import ScheduleBook
from starter.service import RunService, StartRequest

log = get_logger("artemis.schedules")


class ScheduleService:
    def __init__(self, runs: RunService) -> None:
        self.runs = runs
        self.settings = runs.settings
        self.book = ScheduleBook(runs.client, runs.settings.temporal.task_queue)

    async def create(self, d: ScheduleDef, owner: str, role: str) -> dict[str, Any]:
        """Make schedule ``d`` for ``owner`` (an operator's or admin's token): checked as
        its starts will be, so a schedule that could never start is a 422 now."""
        if not writes_shared(role):
            raise ArtemisError(
                ErrorCode.FORBIDDEN,
                f"a schedule needs an operator or admin token (token {owner!r} is a {role})",
            )
        if d.owner is not None and d.owner != owner:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                "owner: a schedule made through the API belongs to the token that makes it",
            )
        if d.callback is not None and d.callback.token_env is not None:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                "callback.token_env: a schedule made through the API names no secret; its "
                "runs send callback.default_token (a schedule of the configuration may "
                "name a variable of the workers' environment)",
            )
        callback = None
        if d.callback is not None:
            if not (d.callback.base_url or self.settings.callback.base_url):
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT,
                    "callback.base_url: none given and callback.base_url is not configured",
                )
            callback = CallbackTarget(
                caller_run_id=d.name,
                base_url=d.callback.base_url,
                auth_header=d.callback.auth_header,
            )
        ask = StartRequest(params=dict(d.params), callback=callback, role=role)
        await self.runs.check_start(d.task, ask, owner)
        d = await work(with_time_zone, d, self.settings.database.url)
        if d.timeout_s is None:  # the run's deadline, which the starter outlives
            d = d.model_copy(update={"timeout_s": self.settings.server.run_timeout_s})
        await self.book.create(d, start_of(d, owner, role), MADE_BY_API)
        log.info("schedule_created", schedule=d.name, task_code=d.task, owner=owner)
        return await self.book.view(d.name, recent=False)

    async def list(self) -> list[dict[str, Any]]:
        """Every schedule of this task queue that Artemis made, as Temporal lists them."""
        out = []
        for name in await self.book.names():
            try:
                out.append(await self.book.view(name, recent=False))
            except ArtemisError:
                continue  # deleted meanwhile, or not Artemis'
        return out

    async def show(self, name: str) -> dict[str, Any]:
        return await self.book.view(name)

    async def _not_configured(self, name: str) -> None:
        """A schedule of the configuration is changed in the configuration: a change made
        here would be undone (or the schedule made again) at the next worker start."""
        desc = await self.book.own(name)
        if ((await self.book.made_by(desc)) or {}).get("made_by") == MADE_BY_CONFIG:
            raise ArtemisError(
                ErrorCode.CONFLICT,
                f"schedule {name!r} is the configuration's (schedules:): change it there",
            )

    async def pause(self, name: str, note: str) -> dict[str, Any]:
        await self._not_configured(name)
        await self.book.pause(name, note)
        return await self.book.view(name, recent=False)

    async def unpause(self, name: str, note: str) -> dict[str, Any]:
        await self._not_configured(name)
        await self.book.unpause(name, note)
        return await self.book.view(name, recent=False)

    async def trigger(self, name: str) -> dict[str, Any]:
        await self.book.trigger(name)
        return {"name": name, "triggered": True}

    async def delete(self, name: str) -> dict[str, Any]:
        await self._not_configured(name)
        await self.book.delete(name)
        log.info("schedule_deleted", schedule=name, reason="deleted by request")
        return {"name": name, "deleted": True}
