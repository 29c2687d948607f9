"""Outages (docs/architecture.md) and the durable circuit breaker: a dependency failing
transiently is waited out on Temporal timers (no worker held) while it has been failing
less than the run's tolerance; past it the run fails SOURCE_/SINK_UNAVAILABLE."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import retry_policies
from workflows.run_core import RunContext

with workflow.unsafe.imports_passed_through():
    from activities.task_run import TaskRunActivities
    from artemis.errors import ErrorCode
    from artemis.outage import UNAVAILABLE, next_delay, outage_from_details
    from artemis.run_models import Outage, OutageNote
    from artemis.temporal.failures import details_of, message_of, root_application_error


class OutageWaits:
    """Outages waited out on durable timers, and the source's circuit breaker."""

    def __init__(self, run: RunContext) -> None:
        self.run = run

    def _tolerance(self) -> float:
        own = self.run.state.outage_tolerance_s
        return float(own) if own is not None else float(self.run.req.tuning.outage_tolerance_s)

    def reports_outages(self) -> bool:
        """Activities report a dependency's transient failure to the workflow (which
        waits) instead of failing; with a tolerance of 0 their retry policies decide."""
        return self._tolerance() > 0

    def store_outage(self, e: ActivityError) -> Outage | None:
        """The staging store unreachable, past the activity's own quick retries."""
        if not self.reports_outages():
            return None
        app = root_application_error(e)
        if app is None or app.non_retryable:
            return None
        return outage_from_details(details_of(e), app.message, app.type or ErrorCode.INTERNAL)

    def _backoff(self, dependency: str) -> tuple[float, float, float]:
        """(initial, coefficient, cap) of the waits between attempts: a source's own retry
        cfg where it has one, always capped at runs.retry_max_interval_s."""
        cap = float(self.run.req.tuning.retry_max_interval_s)
        own = self.run.state.fetch_retry
        if dependency == "source" and own is not None:
            return own.initial_s, max(own.backoff, 1.0), min(own.maximum_s, cap)
        if dependency == "sink":
            return 0.5, 2.0, cap
        return 1.0, 2.0, cap

    async def wait_out(self, outage: Outage) -> None:
        """Wait before the next attempt on a durable timer (no worker is held), showing
        the wait everywhere; past the tolerance, fail SOURCE_/SINK_UNAVAILABLE."""
        dep = outage.dependency
        now = workflow.now()
        track = self.run.state.outages.setdefault(dep, {"since": now, "attempt": 0})
        track["attempt"] += 1
        attempt = track["attempt"]
        since: datetime = track["since"]
        waited = (now - since).total_seconds()
        tolerance = self._tolerance()
        if waited >= tolerance:
            self.run.state.outages.pop(dep, None)
            self.run.state.waited(dep, None)
            raise _gave_up(outage, since, waited, attempt, tolerance)
        opened, delay = self._next_wait(outage, attempt, tolerance - waited)
        waiting = {
            "dependency": dep,
            "name": outage.name,
            "since": since.isoformat(),
            "reason": outage.reason,
            "error": outage.message,
            "code": outage.code,
            "attempt": attempt,
            "next_in_s": round(delay, 3),
            "next_attempt_at": (now + timedelta(seconds=delay)).isoformat(),
            "tolerance_s": tolerance,
        }
        track["waiting"] = waiting
        self.run.state.wait_for(waiting, circuit_open=opened)
        self.run.details()
        self.run.log("waiting", **{k: v for k, v in waiting.items() if k != "error"})
        await self._note_outage("waiting", waiting)
        await workflow.sleep(
            delay,
            summary=f"Wait for {dep} {outage.name} ({outage.reason}), attempt {attempt}",
        )
        if opened:
            self.run.state.circuit_closed()
        self.run.stop_point()

    def _next_wait(self, outage: Outage, attempt: int, left_s: float) -> tuple[bool, float]:
        """(the source's circuit breaker opens now, seconds until the next attempt)."""
        initial, coefficient, cap = self._backoff(outage.dependency)
        circuit = self.run.state.breaker if outage.dependency == "source" else None
        opened = circuit is not None and attempt % max(circuit.threshold, 1) == 0
        if opened and circuit is not None:
            # The source's circuit breaker: after `threshold` failures in a row it rests.
            self.run.state.circuit_opens += 1
            return True, min(circuit.cool_down_s, max(left_s, 0.0) + 0.05)
        # The attempts within this round of the breaker back off from the start.
        n = attempt % circuit.threshold if circuit is not None else attempt
        return False, next_delay(n, initial, coefficient, cap, outage.retry_after_s, left_s)

    def recovered(self, dependency: str) -> None:
        """A dependency answered again: its outage ends (a later failure starts afresh)."""
        track = self.run.state.outages.pop(dependency, None)
        if track is None:
            return
        waited = (workflow.now() - track["since"]).total_seconds()
        info = {
            "dependency": dependency,
            "name": (track.get("waiting") or {}).get("name", dependency),
            "since": track["since"].isoformat(),
            "waited_s": round(waited, 1),
            "attempts": track["attempt"],
        }
        others = [t["waiting"] for t in self.run.state.outages.values() if t.get("waiting")]
        self.run.state.waited(dependency, others[-1] if others else None)
        self.run.log("recovered", **info)
        self.run.details()
        # Recorded concurrently with the run, never in its way.
        self.run.bookkeeping.append(asyncio.create_task(self._note_outage("recovered", info)))

    async def _note_outage(self, kind: str, data: dict[str, Any]) -> None:
        try:
            await workflow.execute_local_activity_method(
                TaskRunActivities.note_outage,
                OutageNote(run=self.run.ref, kind=kind, waiting=data),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=retry_policies.OUTAGE_NOTE,
                summary=f"Record `{kind}` in the event stream",
            )
        except ActivityError as e:
            self.run.log("outage_note_failed", kind=kind, error=message_of(e))

    async def rest_after_failures(self, e: ActivityError) -> bool:
        """The durable circuit breaker: once the fetch has failed `threshold` times in a row
        (its retry policy's attempts) with a retryable error, wait the cool-down on a
        Temporal timer instead of burning retries, then go on. False: not this case."""
        circuit = self.run.state.breaker
        app = root_application_error(e)
        if circuit is None or app is None or app.non_retryable:
            return False
        if self.run.state.circuit_opens >= circuit.max_opens:
            return False
        self.run.state.circuit_opens += 1
        self.run.state.circuit_rest()
        self.run.details()
        self.run.log(
            "circuit_open",
            cool_down_s=circuit.cool_down_s,
            opens=self.run.state.circuit_opens,
            error=app.message,
        )
        # A durable timer (the same StartTimer command as asyncio.sleep, with a summary).
        await workflow.sleep(
            circuit.cool_down_s, summary=f"Circuit breaker cool-down ({circuit.cool_down_s:g} s)"
        )
        self.run.state.circuit_closed()
        self.run.log("circuit_closed", opens=self.run.state.circuit_opens)
        return True


def _gave_up(
    outage: Outage, since: datetime, waited: float, attempt: int, tolerance: float
) -> ApplicationError:
    """The run's failure once an outage outlasted its tolerance: SOURCE_/SINK_UNAVAILABLE
    naming the dependency, since when, how many attempts and the last error."""
    dep = outage.dependency
    return ApplicationError(
        f"{dep} {outage.name} unavailable for {waited:.0f} s since "
        f"{since.isoformat(timespec='seconds')} ({attempt} attempts, tolerance "
        f"{tolerance:g} s); last error: {outage.reason}: {outage.message}",
        {
            "dependency": dep,
            "name": outage.name,
            "since": since.isoformat(),
            "waited_s": round(waited, 1),
            "attempts": attempt,
            "last_error": outage.reason,
        },
        type=UNAVAILABLE.get(dep, UNAVAILABLE["store"]).value,
        non_retryable=True,
    )
