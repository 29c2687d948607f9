"""Small helpers the tests share: waiting for a condition that must come, reading how a
workflow history ended, and checking request times that a rate limit let through."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from artemis.config import HttpClientSettings
from artemis.http import HttpClient, make_client

TRANSIENT_RPC = frozenset(
    {
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    }
)


async def eventually(
    check: Callable[[], Any], what: str, timeout: float = 60, interval: float = 0.05
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy and return that;
    fail the test, naming ``what``, when ``timeout`` seconds pass first. A transient
    Temporal error (``TRANSIENT_RPC``) counts as a falsy answer; any other error fails."""
    deadline = time.monotonic() + timeout
    transient: RPCError | None = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except RPCError as err:
            # A loaded dev server answers a read now and then with CANCELLED or
            # UNAVAILABLE; that is "not yet", not the answer. Other codes fail at once.
            if err.status not in TRANSIENT_RPC:
                raise
            transient, value = err, None
        if value:
            return value
        if time.monotonic() > deadline:
            last = f" (last server error: {transient})" if transient is not None else ""
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}{last}")
        await asyncio.sleep(interval)


def ending(history: WorkflowHistory) -> str:
    """How a history ended, by its last event: ``WORKFLOW_EXECUTION_COMPLETED``,
    ``…_FAILED``, ``…_CANCELED``, ``…_CONTINUED_AS_NEW``, ``…_TIMED_OUT``, ``…_TERMINATED``
    — or another event type when the run had not closed yet (a replay would prove little)."""
    return EventType.Name(history.events[-1].event_type).removeprefix("EVENT_TYPE_")


async def patch_traces(client: Any, workflow_id: str) -> list[str]:
    """What patch markers left in every execution of ``workflow_id`` (each generation of
    a continued run, a retried one): ``core_patch`` markers and upserts of
    ``TemporalChangeVersion``. A task run has no patch to leave any."""
    found: list[str] = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for e in history.events:
            if e.HasField("marker_recorded_event_attributes"):
                name = e.marker_recorded_event_attributes.marker_name
                if name == "core_patch":
                    found.append(f"{wf.run_id}: marker {name}")
            elif e.HasField("upsert_workflow_search_attributes_event_attributes"):
                fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
                if "TemporalChangeVersion" in fields.indexed_fields:
                    found.append(f"{wf.run_id}: TemporalChangeVersion upsert")
    return found


def assert_rate_at_most(
    times: Sequence[float], qps: float, burst: int = 1, jitter: float = 0.5
) -> None:
    """``times`` are server-side arrival times of requests a token bucket (``qps``,
    ``burst``) let through. The bucket grants at most ``burst + qps * L`` requests in any
    stretch of length L; a granted request may reach the server up to ``jitter`` seconds
    late on a loaded machine, so no stretch of arrivals may hold more than
    ``burst + qps * (L + jitter)``. Checked for every stretch that starts and ends on a
    request (which covers both the busiest second and the average over the whole run)."""
    ts = sorted(times)
    for i, first in enumerate(ts):
        for j in range(i + 1, len(ts)):
            allowed = burst + qps * (ts[j] - first + jitter)
            assert j - i + 1 <= allowed, (
                f"{j - i + 1} requests within {ts[j] - first:.2f} s: more than {allowed:.1f}"
                f" at {qps}/s (burst {burst}, {jitter} s of lateness allowed)"
            )


def quiet_port() -> int:
    """A free port below the kernel's ephemeral range. The ports of a stack are picked
    before `artemis dev` starts its Temporal server, which binds ports the kernel picks
    for it (its HTTP API, metrics, internal services): a port picked the same way could
    be taken by one of them first (a CI run once found Temporal's gRPC on the API's
    port). The kernel never hands out one of these."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def stop_processes(*procs: Any) -> None:
    """Stop the test's own processes that still run (None: never started): all are sent
    SIGTERM first, and one that has not exited 10 s later is killed."""
    running = [p for p in procs if p is not None and p.poll() is None]
    for proc in running:
        proc.terminate()
    for proc in running:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def http_client(**settings: Any) -> HttpClient:
    """The workers' own HTTP client (what sources, sinks and callbacks are given)."""
    return make_client(HttpClientSettings(**settings))


class SlowCallbacks(logging.Handler):
    """asyncio's own report of a slow callback: "Executing <Handle ...> took 0.123
    seconds" (logged at WARNING by the ``asyncio`` logger in debug mode)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing ") and " took " in message:
            self.seen.append(message)


@contextlib.contextmanager
def slow_callbacks_reported(slow_s: float) -> Iterator[SlowCallbacks]:
    """asyncio's debug mode on the running loop (slow callback: over ``slow_s``), and what
    it reports."""
    loop = asyncio.get_running_loop()
    handler = SlowCallbacks()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(handler)
    was_debug, was_slow = loop.get_debug(), loop.slow_callback_duration
    loop.set_debug(True)
    loop.slow_callback_duration = slow_s
    try:
        yield handler
    finally:
        loop.set_debug(was_debug)
        loop.slow_callback_duration = was_slow
        asyncio_log.removeHandler(handler)


def secret_keys(stack: Any, task_id: str) -> list[str]:
    """The keys under which run secrets of ``task_id`` are stored in the stack's database."""
    from sqlalchemy import select

    from artemis.db import RunSecret, get_engine

    engine = get_engine(stack.settings.database.url)
    with engine.connect() as conn:
        rows = conn.execute(select(RunSecret.__table__.c.run_key)).scalars().all()  # type: ignore[attr-defined]
    return [k for k in rows if f"/{task_id}" in k]


def artemis_cli(
    *args: str, env: dict[str, str | None] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess:
    """``artemis <args>`` run in this process: the installed command (``full_app``, as
    ``python -m starter.cli`` builds it) with its console script's error handling
    (``guarded``), its own stdin, stdout, stderr and exit status, and ``env`` over this
    process's environment for the call (None: the variable unset). It costs no Python
    start-up and no import of the CLI's modules, about 3 s a command run as a process;
    the end-to-end tests run the CLI as a process (the entry point, SIGPIPE)."""
    import sys

    from click.testing import CliRunner

    from starter.cli import full_app, guarded

    runner = CliRunner()
    argv = sys.argv
    with runner.isolation(input=stdin, env=env) as (out, err, _):
        sys.argv = ["artemis", *args]
        try:
            guarded(full_app())
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            sys.argv = argv
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return subprocess.CompletedProcess(["artemis", *args], code, stdout, stderr)
