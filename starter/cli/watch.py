"""Following a run: its Server-Sent Events (httpx-sse), a live Rich view, `watch_task`.

The server (starter/api/routes/events.py) sends one SSE event per run event: an `id:`
(the resume cursor) and a `data:` line holding the event as JSON; keep-alive comments,
`retry:` fields and `event:` names may come too and are standard SSE, so no event without
data is handed on. The stream closes after the terminal event (`complete`, `error`,
`cancelled`); a dropped connection is resumed with `Last-Event-ID`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, connect_sse
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from artemis.config import Settings
from artemis.event_kinds import TERMINAL_EVENTS, Control, Ending
from artemis.run_state import TERMINAL, StepStatus
from starter.cli._common import _call, _call_error, _fail, _headers, console

MAX_FAILURES = 5
STREAM_TIMEOUT = httpx.Timeout(30, read=None)  # a quiet run sends nothing for a while
CLOSE_WAIT_S = 30

_ICONS = {
    StepStatus.PENDING: "[dim]○ pending[/dim]",
    StepStatus.IN_PROGRESS: "[yellow]◐ in progress[/yellow]",
    StepStatus.COMPLETED: "[green]● completed[/green]",
    StepStatus.ERROR: "[red]✖ error[/red]",
    "SKIPPED": "[dim]– skipped[/dim]",
}


def _stream(
    base: str, task_id: str, settings: Settings, last: str | None, follow: bool
) -> Iterator[ServerSentEvent]:
    """One connection's events that carry data, after `last` when given."""
    url = f"{base}/tasks/{task_id}/events"
    headers = {**_headers(settings), **({"Last-Event-ID": last} if last else {})}
    params = {} if follow else {"follow": "false"}
    with (
        httpx.Client(timeout=STREAM_TIMEOUT) as client,
        connect_sse(client, "GET", url, headers=headers, params=params) as source,
    ):
        if source.response.status_code != 200:
            source.response.read()
            _call_error(source.response, f"GET {url}")
        for sse in source.iter_sse():
            if sse.data:  # not a keep-alive, ping or retry-only block
                yield sse


def iter_events(
    base: str, task_id: str, settings: Settings, follow: bool = True
) -> Iterator[dict[str, Any]]:
    """The run's SSE events; reconnects with Last-Event-ID when the connection drops."""
    last: str | None = None
    failures = 0
    while True:
        try:
            for sse in _stream(base, task_id, settings, last, follow):
                failures = 0
                last = sse.id or last
                event = sse.json()
                yield event
                if event.get("event") in TERMINAL_EVENTS:
                    return
            if not follow:
                return
        except httpx.HTTPError as e:  # httpx_sse.SSEError is one too
            failures += 1
            if failures > MAX_FAILURES:
                _fail(f"lost the event stream of {task_id}: {e}")
            time.sleep(min(2.0, 0.2 * 2**failures))


def _activity_text(ev: dict[str, Any]) -> str:
    """One line for an `activity_start` / `activity_result` event."""
    started = ev.get("event") == "activity_start"
    what = "started" if started else ("failed" if ev.get("error") else "done")
    detail = ""
    if not started and ev.get("error"):
        err = ev.get("data") or {}
        detail = f" · {err.get('code')}: {err.get('message')}"
    return escape(
        f"{ev.get('activity')} ({ev.get('summary')}) attempt {ev.get('attempt')} {what}{detail}"
    )


def _progress_text(c: dict[str, Any]) -> str:
    total = c.get("total") or 0
    units = f"{c.get('current', 0)}/{total} units · " if total else ""
    flight = c.get("in_flight") or {}
    fetching = f" (+{flight['pages']} fetching)" if flight.get("pages") else ""
    bad = c.get("records_quarantined") or 0
    return (
        f"{units}{c.get('pages', 0)} pages{fetching} · "
        f"{c.get('records_fetched', 0)} fetched · {c.get('records_emitted', 0)} emitted"
        + (f" · {bad} quarantined" if bad else "")
    )


class StepView:
    """A live table of the run's plan steps, counters and latest activity."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.todos: list[dict[str, str]] = []
        self.counters: dict[str, Any] = {}
        self.last = ""
        self.ended: dict[str, Any] | None = None
        # What the run waits on while a dependency is down (a `waiting` event's line).
        self.waiting = ""
        # Records set aside (``quarantined`` events) and fields the source changed.
        self.quarantined = 0
        self.drift: list[str] = []
        # What ``changes`` last said of each line (piped output: a line per change).
        self._said: dict[str, str] = {}

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "plan_update":
            self.todos = ev.get("todos", [])
        elif kind == "progress":
            self.counters = ev
        elif kind in ("activity_start", "activity_result"):
            self.last = _activity_text(ev)
        elif kind == Control.PAUSED:
            self.waiting = (
                f"paused: {ev.get('reason') or 'by request'} (resume: artemis tasks resume)"
            )
        elif kind == Control.RESUMED:
            self.waiting = ""
        elif kind == "waiting":
            # (shown under "waiting": the line's own "waiting: " is not said twice)
            self.waiting = str(ev.get("line") or "").removeprefix("waiting: ") or "waiting"
        elif kind == "recovered":
            self.waiting = ""
            self.last = (
                f"{ev.get('dependency')} {ev.get('name')} back after "
                f"{ev.get('waited_s')} s ({ev.get('attempts')} attempts)"
            )
        elif kind == "quarantined":
            self.quarantined += int(ev.get("records") or 0)
            sample = ev.get("sample") or {}
            self.last = (
                f"page {ev.get('page')}: {ev.get('records')} quarantined "
                f"({sample.get('field') or sample.get('code')}: {sample.get('message')})"
            )
        elif kind == "schema_drift":
            verb = "new" if ev.get("change") == "added" else "missing"
            self.drift.append(
                f"{verb} {ev.get('field')}" + (" (evolved)" if ev.get("evolved") else "")
            )
        elif kind in TERMINAL_EVENTS:
            self.ended = ev

    def changes(self) -> list[str]:
        """What changed since the last call, a line of text each: a step's status, the
        counters, what the run waits on, how it ended."""
        lines: list[str] = []
        for t in self.todos:
            name = str(t.get("content", t["id"]))
            status = str(t["status"]).lower().replace("_", " ")
            if self._said.get(name) != status:
                self._said[name] = status
                lines.append(f"{name}: {status}")
        for key, text in (
            ("progress", _progress_text(self.counters) if self.counters else ""),
            ("waiting", self.waiting),
            ("quarantined", f"{self.quarantined} records" if self.quarantined else ""),
            ("result", str(self.ended.get("event")) if self.ended else ""),
        ):
            if text and self._said.get(key) != text:
                self._said[key] = text
                lines.append(f"{key}: {text}")
        return lines

    def __rich__(self) -> Table:
        table = Table(title=f"task {self.task_id}", show_header=False, box=None)
        table.add_column("step")
        table.add_column("status")
        for t in self.todos:
            status = t["status"]
            ended = self.ended and self.ended.get("event") != Ending.COMPLETE
            if status == StepStatus.PENDING and ended:
                status = "SKIPPED"  # the run ended before this step
            table.add_row(t.get("content", t["id"]), _ICONS.get(status, status))
        if self.counters:
            table.add_row("progress", _progress_text(self.counters))
        if self.waiting:
            table.add_row("waiting", f"[yellow]{escape(self.waiting)}[/yellow]")
        if self.quarantined:
            table.add_row("quarantined", f"[yellow]{self.quarantined} records[/yellow]")
        if self.drift:
            table.add_row("schema drift", escape(", ".join(self.drift)))
        if self.last:
            table.add_row("latest", self.last)
        if self.ended:
            table.add_row("result", f"[bold]{self.ended.get('event')}[/bold]")
        return table


def _closed_record(base: str, task_id: str, settings: Settings) -> dict[str, Any]:
    """The run's record once it is closed (the terminal event comes a moment before the
    workflow closes), or as it is after CLOSE_WAIT_S."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    while True:
        data = _call("GET", f"{base}/tasks/{task_id}", settings)["data"]
        closed = data.get("status") in TERMINAL and data.get("completed_at")
        if closed or time.monotonic() > deadline:
            return data
        time.sleep(0.2)


def watch_task(
    base: str,
    task_id: str,
    settings: Settings,
    quiet: bool = False,
    to: Console | None = None,
) -> dict[str, Any]:
    """Show the run's steps live (from its event stream) until it ends, on ``to`` (the
    standard output's console unless told; a command printing JSON shows them on standard
    error); return its status."""
    view = StepView(task_id)
    out = to or console
    if not quiet and not out.is_terminal:
        # Piped: a line of text each time what the view says changes (a live table
        # would show only once the run ended).
        for ev in iter_events(base, task_id, settings):
            view.apply(ev)
            for line in view.changes():
                out.print(line, markup=False, highlight=False, soft_wrap=True)
        return _closed_record(base, task_id, settings)
    live = nullcontext() if quiet else Live(view, console=out, refresh_per_second=8)
    with live:
        for ev in iter_events(base, task_id, settings):
            view.apply(ev)
    if not quiet:
        out.line()
    return _closed_record(base, task_id, settings)
