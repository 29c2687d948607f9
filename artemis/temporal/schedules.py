"""Artemis' schedules as Temporal Schedules (artemis/schedules.py says what one is): made,
read, paused, triggered and deleted through Temporal's own API, so the Temporal UI shows,
pauses and triggers the same schedules; and the configuration's schedules reconciled at
worker start.

A schedule's memo (set when it is made, never changed) marks it as Artemis' and says who
made it: ``config`` (the configuration's ``schedules:``; reconciled, and removed when the
file drops it) or ``api`` (``POST /schedules``; never touched by a reconcile). A schedule
Artemis did not make has no such memo and is never touched."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleCalendarSpec,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.service import RPCError, RPCStatusCode

from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.run_models import MADE_BY_CONFIG, STARTER_WORKFLOW, ScheduledStart
from artemis.schedules import MEMO_KEY, ScheduleDef, name_of, schedule_id

log = get_logger("artemis.schedules")

OVERLAP = {"skip": ScheduleOverlapPolicy.SKIP, "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE}
# The starter workflow ends with its run; this is only a backstop past the run's deadline.
STARTER_SLACK = timedelta(hours=2)


def temporal_schedule(d: ScheduleDef, start: ScheduledStart, task_queue: str, sid: str) -> Schedule:
    """``d`` as a Temporal Schedule whose action starts the starter workflow with
    ``start`` (its workflow id: the schedule id, to which Temporal adds the instant)."""
    spec = ScheduleSpec(
        jitter=timedelta(seconds=d.jitter) if d.jitter else None,
        time_zone_name=d.time_zone,
    )
    if d.every is not None:
        offset = timedelta(seconds=d.offset) if d.offset else None
        spec.intervals = [ScheduleIntervalSpec(every=timedelta(seconds=d.every), offset=offset)]
    elif d.cron is not None:
        spec.cron_expressions = [d.cron]
    else:
        hour, minute, second = d.at_parts()
        spec.calendars = [
            ScheduleCalendarSpec(
                hour=[ScheduleRange(hour)],
                minute=[ScheduleRange(minute)],
                second=[ScheduleRange(second)],
            )
        ]
    timeout = timedelta(seconds=start.timeout_s or 86400) + STARTER_SLACK
    return Schedule(
        action=ScheduleActionStartWorkflow(
            STARTER_WORKFLOW,
            start,
            id=sid,
            task_queue=task_queue,
            execution_timeout=timeout,
            static_summary=f"schedule {d.name}: {d.task}",
        ),
        spec=spec,
        policy=SchedulePolicy(
            overlap=OVERLAP[d.overlap], catchup_window=timedelta(seconds=d.catchup_window)
        ),
        state=ScheduleState(note=d.note, paused=d.paused),
    )


def _missing(name: str) -> ArtemisError:
    return ArtemisError(ErrorCode.NOT_FOUND, f"no schedule named {name!r}")


class ScheduleBook:
    """The schedules of the workers of one task queue."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue

    def handle(self, name: str) -> ScheduleHandle:
        return self.client.get_schedule_handle(schedule_id(self.task_queue, name))

    async def create(self, d: ScheduleDef, start: ScheduledStart, made_by: str) -> None:
        sid = schedule_id(self.task_queue, d.name)
        try:
            await self.client.create_schedule(
                sid,
                temporal_schedule(d, start, self.task_queue, sid),
                memo={MEMO_KEY: {"made_by": made_by, "owner": start.owner}},
            )
        except ScheduleAlreadyRunningError:
            raise ArtemisError(
                ErrorCode.CONFLICT, f"a schedule named {d.name!r} exists already"
            ) from None

    async def update(self, d: ScheduleDef, start: ScheduledStart) -> None:
        sid = schedule_id(self.task_queue, d.name)
        new = temporal_schedule(d, start, self.task_queue, sid)

        def updater(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=new)

        await self._call(d.name, self.handle(d.name).update(updater))

    async def describe(self, name: str) -> ScheduleDescription:
        return await self._call(name, self.handle(name).describe())

    async def _call(self, name: str, call: Any) -> Any:
        try:
            return await call
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise _missing(name) from None
            raise

    async def made_by(self, desc: ScheduleDescription) -> dict[str, Any] | None:
        """The memo's mark (None: a schedule Artemis did not make)."""
        try:
            mark = (await desc.memo()).get(MEMO_KEY)
        except Exception:  # a memo this converter cannot read is not Artemis'
            return None
        return mark if isinstance(mark, dict) else None

    async def start_of(self, desc: ScheduleDescription) -> ScheduledStart | None:
        """The starter workflow's input the schedule holds (None: not a starter)."""
        action = desc.schedule.action
        if not isinstance(action, ScheduleActionStartWorkflow):
            return None
        if action.workflow != STARTER_WORKFLOW or not action.args:
            return None
        args = list(action.args)
        if not isinstance(args[0], ScheduledStart):
            decoded = await self.client.data_converter.decode(args, [ScheduledStart])
            return decoded[0] if decoded and isinstance(decoded[0], ScheduledStart) else None
        return args[0]

    async def own(self, name: str) -> ScheduleDescription:
        """The description of this task queue's schedule ``name`` that Artemis made
        (NOT_FOUND otherwise: a schedule made by hand is not Artemis' to change)."""
        desc = await self.describe(name)
        if await self.made_by(desc) is None:
            raise ArtemisError(
                ErrorCode.NOT_FOUND,
                f"schedule {name!r} was not made by Artemis (no {MEMO_KEY} memo): change it "
                "in the Temporal UI or with the temporal CLI",
            )
        return desc

    async def pause(self, name: str, note: str) -> None:
        await self.own(name)
        await self._call(name, self.handle(name).pause(note=note))

    async def unpause(self, name: str, note: str) -> None:
        await self.own(name)
        await self._call(name, self.handle(name).unpause(note=note))

    async def trigger(self, name: str) -> None:
        await self.own(name)
        await self._call(name, self.handle(name).trigger())

    async def delete(self, name: str) -> None:
        await self.own(name)
        await self._call(name, self.handle(name).delete())

    async def names(self) -> list[str]:
        """The names of this task queue's schedules Temporal lists (its visibility store:
        one made a moment ago may not be listed yet)."""
        out: list[str] = []
        async for entry in await self.client.list_schedules():
            name = name_of(self.task_queue, entry.id)
            if name is not None:
                out.append(name)
        return sorted(out)

    # -- reading -----------------------------------------------------------------------------
    async def view(self, name: str, recent: bool = True) -> dict[str, Any]:
        """What ``schedules show`` prints: the definition as Temporal holds it, its state,
        the next starts and, with ``recent``, the last starts and how each went."""
        desc = await self.own(name)
        start = await self.start_of(desc)
        mark = await self.made_by(desc) or {}
        sched, info = desc.schedule, desc.info
        out: dict[str, Any] = {
            "name": name,
            "schedule_id": desc.id,
            "made_by": mark.get("made_by"),
            "owner": start.owner if start else mark.get("owner"),
            "task": start.task_code if start else None,
            "params": start.params if start else None,
            "when": describe_spec(sched.spec),
            "time_zone": sched.spec.time_zone_name or "UTC",
            "jitter_s": sched.spec.jitter.total_seconds() if sched.spec.jitter else 0,
            "overlap": _overlap_name(sched.policy.overlap),
            "catchup_window_s": sched.policy.catchup_window.total_seconds()
            if sched.policy.catchup_window
            else None,
            "paused": sched.state.paused,
            "note": sched.state.note or None,
            "next_starts": [_iso(t) for t in info.next_action_times[:5]],
            "starts": info.num_actions,
            "skipped_overlap": info.num_actions_skipped_overlap,
            "missed_catchup": info.num_actions_missed_catchup_window,
        }
        if recent:
            out["recent"] = [await self._outcome(a) for a in reversed(info.recent_actions)]
        return out

    async def _outcome(self, action: Any) -> dict[str, Any]:
        """One recent start: when, its starter workflow, the run it started or why none."""
        wid = getattr(action.action, "workflow_id", None)
        rid = getattr(action.action, "first_execution_run_id", None)
        out: dict[str, Any] = {
            "scheduled_at": _iso(action.scheduled_at),
            "started_at": _iso(action.started_at),
            "starter_workflow_id": wid,
        }
        if wid is None:
            return out
        handle = self.client.get_workflow_handle(wid, run_id=rid)
        try:
            d = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                out["outcome"] = "gone (past the namespace's retention)"
                return out
            raise
        if d.status == WorkflowExecutionStatus.RUNNING:
            out["outcome"] = "running"
        elif d.status == WorkflowExecutionStatus.COMPLETED:
            result = await handle.result()
            out["outcome"] = "started"
            out.update(_plain(result))
        elif d.status == WorkflowExecutionStatus.FAILED:
            out["outcome"] = "start failed"
            out["reason"] = await _failure(handle)
        else:
            out["outcome"] = (d.status.name if d.status else "unknown").lower()
        return out

    # -- the configuration's schedules ------------------------------------------------------
    async def reconcile(self, wanted: list[tuple[ScheduleDef, ScheduledStart]]) -> dict[str, int]:
        """Make this task queue's configuration schedules what ``wanted`` says: create the
        missing, update the changed, delete those the configuration dropped. Only the
        schedules marked ``config`` are updated or deleted; several workers doing this at
        once agree (a create that meets one made meanwhile checks it instead; a delete of
        one gone already is done)."""
        counts = {"created": 0, "updated": 0, "deleted": 0, "kept": 0}
        names = {d.name for d, _ in wanted}
        for d, start in wanted:
            counts[await self._ensure(d, start)] += 1
        for name in await self.names():
            if name in names:
                continue
            try:
                desc = await self.describe(name)
            except ArtemisError:
                continue  # deleted meanwhile
            if ((await self.made_by(desc)) or {}).get("made_by") != MADE_BY_CONFIG:
                continue
            try:
                await self.handle(name).delete()
                counts["deleted"] += 1
                log.info("schedule_deleted", schedule=name, reason="not in the configuration")
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:
                    raise
        return counts

    async def _ensure(self, d: ScheduleDef, start: ScheduledStart) -> str:
        try:
            await self.create(d, start, MADE_BY_CONFIG)
            log.info("schedule_created", schedule=d.name, task_code=d.task)
            return "created"
        except ArtemisError as e:
            if e.code is not ErrorCode.CONFLICT:
                raise
        desc = await self.describe(d.name)
        mark = await self.made_by(desc) or {}
        if mark.get("made_by") != MADE_BY_CONFIG:
            log.warning(
                "schedule_not_reconciled",
                schedule=d.name,
                reason=f"a schedule of that name was made by {mark.get('made_by') or 'hand'}",
            )
            return "kept"
        held = await self.start_of(desc)
        if held is not None and held.digest == start.digest:
            return "kept"
        await self.update(d, start)
        log.info("schedule_updated", schedule=d.name, task_code=d.task)
        return "updated"


def describe_spec(spec: ScheduleSpec) -> str:
    """A schedule's calendar in words: ``every 1h``, ``cron 0 2 * * *``, ``at 02:00``."""
    parts: list[str] = []
    for iv in spec.intervals:
        text = f"every {_span(iv.every)}"
        if iv.offset:
            text += f" (offset {_span(iv.offset)})"
        parts.append(text)
    parts += [f"cron {c}" for c in spec.cron_expressions]
    for cal in spec.calendars:
        h, m, s = cal.hour[0].start, cal.minute[0].start, cal.second[0].start
        parts.append(f"at {h:02d}:{m:02d}" + (f":{s:02d}" if s else "") + " every day")
    return ", ".join(parts)


def _span(t: timedelta) -> str:
    s = t.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s / size:g}{unit}"
    return f"{s:g}s"


def _overlap_name(policy: ScheduleOverlapPolicy) -> str:
    return {v: k for k, v in OVERLAP.items()}.get(policy, policy.name.lower())


def _iso(t: datetime | None) -> str | None:
    if t is None:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def _plain(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        return {k: result.get(k) for k in ("task_id", "workflow_id", "status")}
    return {k: getattr(result, k, None) for k in ("task_id", "workflow_id", "status")}


async def _failure(handle: Any) -> str:
    """Why a starter workflow failed, as its failure says (the start's error message)."""
    try:
        await asyncio.wait_for(handle.result(), 10)
    except WorkflowFailureError as e:
        cause: BaseException | None = e.cause
        while cause is not None and getattr(cause, "cause", None) is not None:
            cause = cause.cause  # type: ignore[attr-defined]
        return str(getattr(cause, "message", None) or cause or e)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "unknown"
