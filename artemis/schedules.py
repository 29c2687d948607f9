"""Schedules: task runs that Temporal starts on a calendar (docs/schedules.md).

A schedule is a Temporal Schedule whose action starts the small ``ScheduledStart``
workflow (workflows/scheduled_start.py); that workflow's activity starts the run through
the API's own start path (``starter/service.py`` ``RunService.start``: params validated,
the owner's task ids and execution locks, secrets sealed, the run recorded in task
storage), then waits for the run to end, so that the schedule's overlap policy applies to
runs, not to the seconds a start takes. This module holds what a schedule is: its
definition as a user writes it (``ScheduleDef``, in the config's ``schedules:`` or a
``POST /schedules`` body) and the starter workflow's input (``ScheduledStart``), which
names the run to start and never carries a secret: a callback's token stays in the
workers' configuration and is read when the run starts."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from artemis.run_models import MADE_BY_API, ScheduledStart

# The starter workflow a schedule's action starts.
# The memo key that marks a schedule as Artemis' own, with who made it.
MEMO_KEY = "artemis_schedule"
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_TIME_OF_DAY = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?$")


def duration_s(value: Any, what: str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"1h"`` or ``"1d"``."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: a duration such as 90, '15m', '1h' or '1d', not {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if m is None:
            raise ValueError(f"{what}: a duration such as 90, '15m', '1h' or '1d', not {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds < 0:
        raise ValueError(f"{what}: a duration may not be negative ({value!r})")
    return seconds


class ScheduleCallback(BaseModel):
    """Where a scheduled run calls back (the CronJob protocol, docs/api.md), its run id
    being the run's task id. No token here: the run sends ``callback.default_token``, or
    the value of ``token_env`` in the workers' environment (a schedule of the
    configuration only)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, max_length=2048)
    auth_header: str | None = Field(None, max_length=100)
    token_env: str | None = Field(None, max_length=100, pattern=r"^[A-Z_][A-Z0-9_]*$")

    @field_validator("base_url")
    @classmethod
    def _no_secret_in_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.username or parts.password or parts.query:
                raise ValueError(
                    "callback.base_url: no user, password or query in the URL (a schedule "
                    "holds no secret: the token is the workers' to send)"
                )
        return value


class ScheduleDef(BaseModel):
    """One schedule: which task runs with which params, and when. Exactly one of
    ``every`` (with ``offset``), ``cron`` and ``at`` (daily, in ``time_zone``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="lower case, digits and '-'")
    task: str = Field(min_length=1, max_length=100, description="the task code")
    params: dict[str, Any] = Field(default_factory=dict)
    every: float | None = Field(None, description="seconds, or '15m', '1h', '1d'")
    offset: float | None = Field(None, description="with every: the start of each period")
    cron: str | None = Field(None, max_length=200, description="five fields, Temporal's cron")
    at: str | None = Field(None, description="HH:MM or HH:MM:SS, every day")
    time_zone: str | None = Field(None, max_length=64, description="IANA name; default UTC")
    overlap: Literal["skip", "buffer_one"] = "skip"
    catchup_window: float = Field(3600.0, description="how late a missed start may still go")
    jitter: float = Field(0.0, description="each start delayed by up to this")
    paused: bool = False
    note: str | None = Field(None, max_length=500)
    timeout_s: float | None = Field(None, gt=0, le=30 * 86400)
    callback: ScheduleCallback | None = None
    # The config's schedules name whose runs they are (an API schedule's are its token's).
    owner: str | None = Field(None, max_length=100)

    @field_validator("every", "offset", "catchup_window", "jitter", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: Any) -> Any:
        return None if value is None else duration_s(value, info.field_name)

    @field_validator("at")
    @classmethod
    def _at(cls, value: str | None) -> str | None:
        if value is not None and _TIME_OF_DAY.match(value) is None:
            raise ValueError(f"at: a time of day as HH:MM or HH:MM:SS, not {value!r}")
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"time_zone: no such IANA time zone {value!r}") from None
        return value

    @model_validator(mode="after")
    def _one_calendar(self) -> ScheduleDef:
        given = [k for k in ("every", "cron", "at") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a schedule needs exactly one of every, cron and at"
                + (f" (given: {', '.join(given)})" if given else "")
            )
        if self.every is not None and self.every < 1:
            raise ValueError("every: at least one second")
        if self.offset is not None and (self.every is None or self.offset >= self.every):
            raise ValueError("offset: only with every, and shorter than it")
        if self.cron is not None and len(self.cron.split()) != 5:
            raise ValueError(
                f"cron: five fields (minute hour day month weekday), not {self.cron!r}"
            )
        return self

    def at_parts(self) -> tuple[int, int, int]:
        """``at`` as hour, minute, second."""
        m = _TIME_OF_DAY.match(self.at or "")
        assert m is not None
        return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)

    def digest(self) -> str:
        """What the definition says, as a short hash: a schedule of the configuration is
        updated when it changes."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def start_of(d: ScheduleDef, owner: str, role: str, made_by: str = MADE_BY_API) -> ScheduledStart:
    """The starter workflow's input for definition ``d``, its runs ``owner``'s with
    ``role``."""
    cb = d.callback
    return ScheduledStart(
        name=d.name,
        task_code=d.task,
        params=dict(d.params),
        owner=owner,
        role=role,
        callback=None if cb is None else {"base_url": cb.base_url, "auth_header": cb.auth_header},
        token_env=cb.token_env if cb is not None else None,
        timeout_s=d.timeout_s,
        digest=d.digest(),
        made_by=made_by,
    )


def provenance_time_zone(database_url: str, params: dict[str, Any]) -> str | None:
    """The time zone of the provenance ``params`` name (``timezone_default``), for a
    schedule that names no time zone of its own; None without one."""
    code = params.get("provenance")
    if not isinstance(code, str) or not code:
        return None
    # lazy: the registry's tables are needed here only
    from sqlalchemy import select

    from artemis.db import get_engine
    from artemis.registry.models import RegProvenance

    t = RegProvenance.__table__  # type: ignore[attr-defined]
    with get_engine(database_url).connect() as conn:
        zone = conn.execute(
            select(t.c.timezone_default).where(t.c.provenance_code == code)
        ).scalar_one_or_none()
    return str(zone) if zone else None


def with_time_zone(d: ScheduleDef, database_url: str) -> ScheduleDef:
    """``d`` with the time zone of its provenance when it names none and keeps a
    calendar (``at``, ``cron``): "02:00" is the provenance's 02:00."""
    if d.time_zone is not None or d.every is not None:
        return d
    zone = provenance_time_zone(database_url, d.params)
    return d.model_copy(update={"time_zone": zone}) if zone else d


def run_task_id(name: str, scheduled_at: datetime) -> str:
    """The task id of the run a schedule starts for ``scheduled_at``: the same instant
    gives the same task id, so a start retried after a lost answer attaches to the run
    it made."""
    stamp = scheduled_at.astimezone(UTC).strftime("%Y%m%dT%H%M%S")
    if scheduled_at.microsecond:
        stamp += f".{scheduled_at.microsecond:06d}"
    return f"{name}-{stamp}Z"


def schedule_id(task_queue: str, name: str) -> str:
    """The Temporal schedule id of ``name`` for the workers of ``task_queue`` (two
    deployments sharing a namespace keep their schedules apart)."""
    return f"artemis-schedule/{task_queue}/{name}"


def name_of(task_queue: str, sid: str) -> str | None:
    """The schedule name in Temporal schedule id ``sid`` (None: not one of this task
    queue's)."""
    prefix = schedule_id(task_queue, "")
    return sid[len(prefix) :] if sid.startswith(prefix) else None
