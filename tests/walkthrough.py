"""Running a documented walk-through as written: its fenced blocks, the commands of its
console blocks with the outputs they show, and the stack it runs on (API and worker
processes started in a folder of its own with the walk-through's configuration file,
standing in for `artemis dev --config infra/catalog.config.yaml`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import yaml

from infra.devserver import free_port
from tests.conftest import ROOT, settings_with, write_config
from tests.helpers import eventually, stop_processes

# The configuration of the dev stack both walk-throughs run on (README "Add your own API
# in YAML", docs/resources.md "Walk-through: a tree in three tables").
CONFIG = ROOT / "infra" / "catalog.config.yaml"
# The dev stack's sample server, as the walk-throughs name it (the tests' runs elsewhere).
DEV_SAMPLES = "http://127.0.0.1:8300"
# A shown output's line that stands for lines left out (the same in the printed output).
ELIDED = "…"


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def console(block: str) -> list[tuple[str, str]]:
    """``$ command`` lines of a console block, each with the output shown after it."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in steps]


def as_shown(printed: str, shown: str) -> str:
    """``printed`` cut as ``shown`` is: where a shown output has an ``…`` line, the printed
    lines between the shown head and tail become that line (equal to ``shown`` when the
    command printed what it shows)."""
    lines = shown.splitlines()
    if ELIDED not in lines:
        return printed
    at = lines.index(ELIDED)
    tail = len(lines) - at - 1
    out = printed.splitlines()
    if len(out) < at + tail:
        return printed
    return "\n".join([*out[:at], ELIDED, *out[len(out) - tail :]])


def run_shown(command: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """A shown command's output: ``artemis`` is this interpreter's CLI (in ``env``),
    ``.venv/bin/python`` this interpreter; ``sqlite3`` the real one where installed, else
    the same query through Python's sqlite3."""
    argv = shlex.split(command)
    if argv[0] == "artemis":
        argv[:1] = [sys.executable, "-m", "infra.devstack"]
    elif argv[0] == ".venv/bin/python":
        argv[0] = sys.executable
    elif argv[0] == "sqlite3" and shutil.which("sqlite3") is None:
        with sqlite3.connect(cwd / argv[1]) as conn:
            rows = conn.execute(argv[2]).fetchall()
        return "\n".join("|".join(str(v) for v in row) for row in rows)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout.strip()


def walkthrough_folder(
    tmp_path: Path, base_settings, samples_url: str, files: Iterable[Path]
) -> tuple[dict[str, str], int]:
    """The folder a user runs a walk-through in: its registry ``files`` (the sample
    server's address theirs) and its configuration, and the suite's stack (its Temporal,
    a task queue and an API port of its own, the configuration's outputs) in a config
    file. The environment of the walk-through's commands, and the API's port."""
    (tmp_path / "infra" / "registry").mkdir(parents=True)
    for path in files:
        (tmp_path / "infra" / "registry" / path.name).write_text(
            path.read_text().replace(DEV_SAMPLES, samples_url)
        )
    shutil.copy(CONFIG, tmp_path / "infra" / CONFIG.name)
    own = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    settings = settings_with(
        base_settings,
        temporal={"task_queue": f"tq-{uuid.uuid4().hex[:10]}"},
        server={"port": port},
        output_defaults=own["output_defaults"],
    )
    config = write_config(tmp_path / "suite.yaml", settings)
    env = {
        **os.environ,
        "ARTEMIS_CONFIG": str(config),
        "ARTEMIS_API": f"http://127.0.0.1:{port}",
        "COOKIE_MASTER_KEY": Path(settings.vault.master_key_file).read_text().strip(),
    }
    return env, port


@asynccontextmanager
async def walkthrough_stack(env: dict[str, str], port: int, cwd: Path) -> AsyncIterator[None]:
    """The API and a worker as processes of the walk-through's folder, with its
    configuration; both stopped on the way out (their logs: ``api.log``, ``worker.log``)."""

    def artemis(args: list[str], log: str) -> subprocess.Popen:
        out = open(cwd / log, "ab")  # noqa: SIM115 (the process holds it)
        return subprocess.Popen(
            [sys.executable, "-m", "infra.devstack", *args],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    api = worker = None
    try:
        api = artemis(["api", "--port", str(port)], "api.log")
        worker = artemis(["worker"], "worker.log")
        await api_answers(api, env["ARTEMIS_API"], cwd / "api.log")
        yield
    finally:
        stop_processes(worker, api)


async def api_answers(api: subprocess.Popen, api_url: str, log: Path) -> None:
    """Wait until the API process answers /health (failing at once if it died)."""

    async def api_up() -> bool:
        assert api.poll() is None, log.read_text()
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(f"{api_url}/health")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(api_up, "the API process to answer", timeout=90, interval=0.2)


def run_the_commands(lines: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    """Each walk-through command (all ``artemis …``) run to success, in order; their
    outputs."""
    outputs = []
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "artemis", line
        done = subprocess.run(
            [sys.executable, "-m", "infra.devstack", *argv[1:]],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    return outputs
