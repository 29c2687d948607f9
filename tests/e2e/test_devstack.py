"""`artemis dev` as a user runs it: its output on a pipe whose reader
goes away, then a SIGKILL — the stack keeps serving through the first and leaves no
Temporal server behind after the second; --data-dir and --samples-port reach everything
they name."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infra.devserver import free_port, port_open
from tests.conftest import ROOT, new_task_id
from tests.helpers import eventually, quiet_port


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


async def test_a_closed_pipe_does_not_stop_artemis_dev_and_sigkill_leaves_no_temporal(tmp_path):
    ports = {name: quiet_port() for name in ("api", "temporal", "ui", "samples")}
    data = tmp_path / "state"
    config = tmp_path / "dev.yaml"
    # logs on stdout (the pipe that closes: every run logs to it after), nothing else: the
    # sample defaults follow --samples-port
    config.write_text(yaml.safe_dump({"logging": {"output": "stdout", "format": "json"}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.devstack", "dev", "--config", str(config)]
        + ["--data-dir", str(data), "--api-port", str(ports["api"])]
        + ["--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"])]
        + ["--samples-port", str(ports["samples"])],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "COOKIE_MASTER_KEY"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{ports['api']}"
    try:
        await eventually(
            lambda: proc.poll() is None and port_open("127.0.0.1", ports["api"]),
            "the dev stack's API",
            timeout=120,
            interval=0.2,
        )
        assert proc.stdout is not None
        # It says when it is up, and how to stop it.
        said = await asyncio.wait_for(asyncio.to_thread(_read_until, proc.stdout, b"Ctrl-C"), 120)
        assert b"the stack is up; press Ctrl-C to stop" in said, said[-2000:]
        proc.stdout.close()  # the reader goes away (`artemis dev | head`, a closed terminal)
        async with httpx.AsyncClient(base_url=api, timeout=120) as http:
            resp = await http.post(
                "/tasks/pull_stock_quotes/run",
                json={"meta": {"task_id": new_task_id()}, "params": {"symbols": ["PIPE"]}},
            )
            # logged all along to the closed pipe, and it ran against --samples-port
            assert resp.status_code == 200, resp.text
            assert resp.json()["data"]["status"] == "completed", resp.text
            assert proc.poll() is None, "artemis dev ended with its output pipe"
            assert (await http.get("/health")).status_code == 200
        # --data-dir holds the stack's database and the Temporal server's pid
        assert (data / "artemis.db").exists() and (data / "temporal.pid").exists()
        temporal_pid = int((data / "temporal.pid").read_text().split()[0])
        assert _alive(temporal_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        await eventually(
            lambda: not _alive(temporal_pid), "the Temporal server to follow its parent", 30
        )
        assert not port_open("127.0.0.1", ports["temporal"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        pid_file = data / "temporal.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().split()[0])
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_dev_server_left_by_an_earlier_crash_is_found_and_stopped(tmp_path):
    from artemis.errors import ArtemisError
    from infra.devserver import DevServer

    def server() -> DevServer:
        return DevServer(
            port=port,
            ui_port=None,
            db_file=tmp_path / "t.db",
            log_file=tmp_path / "t.log",
            pid_file=tmp_path / "temporal.pid",
        )

    port = free_port()
    left = server().start()
    assert left.proc is not None
    pid = left.proc.pid
    # its owner (this process) is alive: another stack's server, left alone
    with pytest.raises(ArtemisError) as refused:
        server().stop_stale()
    assert f"pid {pid}" in refused.value.message and _alive(pid)
    # as if its `artemis dev` had been SIGKILLed: the owner named in the pid file is gone
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "temporal.pid").write_text(f"{pid} {gone.pid}")
    again = server()
    assert again.stop_stale() == pid
    left.proc.wait(15)  # reaped (it is this test's child)
    assert not _alive(pid) and not port_open("127.0.0.1", port)
    assert not (tmp_path / "temporal.pid").exists()
    again.start()  # the port is free again
    again.stop()


async def test_audit_reads_the_dev_stacks_log_and_fails_on_a_missing_configured_one(
    make_stack, tmp_path
):
    import asyncio
    import json

    from tests.conftest import settings_with, write_config

    def audit(config_path: Path, *extra: str) -> tuple[int, dict]:
        out = subprocess.run(
            [sys.executable, "-m", "starter.cli", "audit", "--config", str(config_path)]
            + ["--histories", "0", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
            cwd=ROOT,
        )
        return out.returncode, json.loads(out.stdout)

    base = (await make_stack(worker=False)).settings
    dev = tmp_path / "dev"
    (dev / "logs").mkdir(parents=True)
    (dev / "logs" / "artemis.log").write_text('{"event": "a"}\n{"event": "b"}\n{"event": "c"}\n')
    config = write_config(tmp_path / "a.yaml", base)
    code, report = await asyncio.to_thread(audit, config, "--data-dir", str(dev))
    assert code == 0, report
    # the configured log and the dev stack's (`artemis dev` writes there)
    assert report["checked"]["log_files"] == 2 and report["checked"]["log_lines"] >= 3
    missing = write_config(
        tmp_path / "b.yaml",
        settings_with(base, logging={"output": "file", "file": {"path": str(tmp_path / "no.log")}}),
    )
    code, report = await asyncio.to_thread(audit, missing, "--data-dir", str(tmp_path / "none"))
    assert code == 1 and any("missing" in f["what"] for f in report["findings"]), report


def test_demo_with_a_config_of_its_own_keeps_the_demos_defaults(tmp_path):
    """`artemis demo --config F` where F adds an output for a task of its own and changes
    one quotes default: F merges with the demo's defaults key by key, so every sample
    still runs and lands where the demo puts it."""
    ports = {name: quiet_port() for name in ("api", "temporal", "ui", "samples")}
    config = tmp_path / "mine.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "output_defaults": {"my_api": {"sinks": ["log"]}},
                "task_defaults": {"pull_stock_quotes": {"page_size": 5}},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "infra.devstack", "demo", "--exit", "--config", str(config)]
        + ["--data-dir", str(tmp_path / "state"), "--api-port", str(ports["api"])]
        + ["--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"])]
        + ["--samples-port", str(ports["samples"])],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "COOKIE_MASTER_KEY"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for sample in ("pull_stock_quotes", "literature_harvest · pubmed", "crawl_notes"):
        assert f"sample run: {sample}" in out, out[-3000:]
    assert "Traceback" not in out and "no sinks configured" not in out, out[-3000:]
    # the quotes landed in the demo's own SQLite table, under --data-dir
    assert (tmp_path / "state" / "lake.db").exists()
    # piped, the demo reads as lines a person can follow: no table as wide as its widest
    # JSON, and the CronJob's finalize body as JSON of its own, not a string in a cell
    # (a command to copy, holding --data-dir's path, is as long as it has to be)
    lines = [
        ln for ln in done.stdout.splitlines() if not ln.strip().startswith((".venv/", "sqlite3"))
    ]
    widest = max(lines, key=len)
    assert len(widest) <= 200, widest
    assert '"result": "success"' in done.stdout, out[-3000:]


def _read_until(pipe: Any, marker: bytes) -> bytes:
    """What ``pipe`` gave up to the line holding ``marker`` (or its end)."""
    seen = b""
    for line in iter(pipe.readline, b""):
        seen += line
        if marker in line:
            break
    return seen
