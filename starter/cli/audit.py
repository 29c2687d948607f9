"""`artemis audit`: look for secrets in clear, for runs waiting on a worker build that
no worker polls, and for runs whose workflow task keeps failing (stuck)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from artemis.config import Settings
from starter.cli._common import ConfigOpt, _settings, console

if TYPE_CHECKING:
    from artemis.audit import Auditor


def audit(
    histories: int = typer.Option(
        200, "--histories", help="how many recent Artemis workflow histories to scan (0: none)"
    ),
    logs: list[Path] = typer.Option(
        [], "--logs", help="a log file to scan besides the configured one (repeatable)"
    ),
    data_dir: Path = typer.Option(
        Path(".artemis"), "--data-dir", help="the dev stack's folder (its logs are scanned)"
    ),
    config: Path | None = ConfigOpt,
) -> None:
    """Scan the database, the log files and Temporal histories for secrets in clear; print
    JSON with `passed` and the findings (never the secrets); exit 1 when it fails."""
    report = _audit(_settings(config), histories, logs, data_dir)
    console.print_json(data=report.to_dict())
    if histories > 0:
        # The Temporal SDK's core runtime can abort (SIGABRT) while the interpreter tears
        # down after asyncio.run closed its loop (seen once in six suite runs): the report
        # is complete once printed, so leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if report.passed else 1)
    raise typer.Exit(0 if report.passed else 1)


def _audit(
    settings: Settings, histories: int, logs: list[Path] | None = None, data_dir: Path | None = None
):
    """The audit's report: the database, the log files, then up to `histories` histories.
    The log files: the configured one (``logging.output: file``), the dev stack's
    (``<data-dir>/logs/artemis.log``, where `artemis dev` writes), any given; one that
    should be there and is not is a finding — an audit that scanned nothing does not
    pass."""
    # lazy: importing it costs every `artemis` start-up ~0.3 s
    from artemis.audit import Auditor, Finding
    from artemis.crawler.vault import vault_for

    auditor = Auditor()
    vault = vault_for(settings)
    auditor.learn_database_secrets(vault.engine, vault)
    auditor.scan_database(vault.engine)
    wanted: list[Path] = list(logs or [])
    if settings.logging.output == "file":
        wanted.append(Path(settings.logging.file.path))
    dev_log = (data_dir or Path(".artemis")) / "logs" / "artemis.log"
    if dev_log.exists():
        wanted.append(dev_log)
    seen: set[Path] = set()
    for path in wanted:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        if not path.is_file():
            auditor.report.findings.append(
                Finding("logs", f"{path}: a log file to scan is missing: nothing scanned there")
            )
            continue
        auditor.scan_logs(path)
    # how many log files were read (0 when the log goes to stdout/stderr and no dev
    # stack's log is here: nothing that should be scanned was missed)
    auditor.report.checked["log_files"] = len(seen)
    if histories > 0:
        _look_at_temporal(auditor, settings, histories)
    return auditor.report


async def _stuck(settings: Settings) -> list[dict]:
    """The task queue's runs whose workflow task keeps failing."""
    # lazy: importing it costs every `artemis` start-up ~0.55 s
    from artemis.temporal.client import connect
    from artemis.temporal.runs import stuck_runs

    return await stuck_runs(await connect(settings), settings.temporal.task_queue)


def _look_at_temporal(auditor: Auditor, settings: Settings, histories: int) -> None:
    """Up to ``histories`` histories scanned, the builds runs wait on, the stuck runs:
    each a finding, and so is a look that could not be taken (an audit that could not
    look does not pass)."""
    from artemis.audit import Finding

    try:
        auditor.scan_histories(asyncio.run(_histories(settings, histories)))
    except Exception as e:  # an audit that could not look does not pass
        auditor.report.findings.append(
            Finding("temporal", f"histories not scanned: {type(e).__name__}: {e}")
        )
    try:
        for build in asyncio.run(_stranded(settings)):
            auditor.report.findings.append(
                Finding(
                    "temporal",
                    f"runs are pinned to worker build {build}, which no worker polls: "
                    "they wait until a worker of that build runs (artemis builds list)",
                )
            )
    except Exception as e:
        auditor.report.findings.append(
            Finding("temporal", f"worker builds not checked: {type(e).__name__}: {e}")
        )
    try:
        auditor.note_stuck(asyncio.run(_stuck(settings)))
    except Exception as e:
        auditor.report.findings.append(
            Finding("temporal", f"stuck runs not checked: {type(e).__name__}: {e}")
        )


async def _stranded(settings: Settings) -> list[str]:
    """The builds runs are pinned to that no worker polls."""
    # lazy: importing it costs every `artemis` start-up ~0.55 s
    from artemis.temporal.client import connect
    from artemis.temporal.versioning import builds

    client = await connect(settings)
    queue = settings.temporal.task_queue
    found = await builds(client, settings.temporal.deployment_name or queue, queue)
    return [b.build_id for b in found if b.stranded]


async def _histories(settings: Settings, limit: int) -> list[tuple[str, str]]:
    # lazy: importing it costs every `artemis` start-up ~0.55 s
    from artemis.temporal.client import connect

    client = await connect(settings)
    out: list[tuple[str, str]] = []
    async for wf in client.list_workflows("WorkflowId STARTS_WITH 'artemis/'", limit=limit):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        out.append((f"{wf.id}/{wf.run_id}", history.to_json()))
    return out
