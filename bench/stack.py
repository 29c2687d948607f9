"""The whole stack for a benchmark, each piece its own process: a Temporal dev server,
the sample servers, one `artemis worker` and one `artemis api`, on free loopback ports."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.devserver import DevServer, dynamic_config_args, free_port, port_open  # noqa: E402


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not port_open("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)


@dataclass
class BenchStack:
    tmp: Path
    samples: str
    api: str
    env: dict[str, str]
    # The stack's Temporal (host:port), for a bench's own client.
    temporal: str = ""
    worker_pids: list[int] = field(default_factory=list)
    api_pid: int = 0
    temporal_pid: int = 0
    samples_pid: int = 0

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each piece has used so far: api, worker(s), temporal,
        the sample servers (the outside world: sources and sinks) and the bench's own
        process (its client) — a difference of two readings is where a bench's time went."""
        tick = os.sysconf("SC_CLK_TCK")

        def used(pid: int) -> float:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        return {
            "api": used(self.api_pid),
            "worker": sum(used(p) for p in self.worker_pids),
            "temporal": used(self.temporal_pid),
            "samples": used(self.samples_pid) if self.samples_pid else 0.0,
            "bench": time.process_time(),
        }

    def rss_mb(self, pid: int, peak: bool = False) -> float:
        """A process's resident memory now (VmRSS) or at its peak so far (VmHWM), in MB."""
        want = "VmHWM:" if peak else "VmRSS:"
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(want):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {want} for process {pid}")

    def cli(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "starter.cli", *args],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )


@contextmanager
def bench_stack(
    config: dict[str, Any],
    latency_ms: float = 0.0,
    before_start: Any = None,
    workers: int = 1,
    dynamic_config: dict[str, str] | None = None,
) -> Iterator[BenchStack]:
    """``config`` is merged into the generated YAML (its ``{samples}`` placeholders filled);
    ``before_start(stack)`` runs after `db upgrade`, before the workers (``workers``
    processes) start; ``dynamic_config``: the dev server's dynamic config values
    (``system.enableActivityEagerExecution=true``, say)."""
    tmp = Path(tempfile.mkdtemp(prefix="artemis-bench-"))
    extra = dynamic_config_args(dynamic_config or {})
    temporal = DevServer(
        port=free_port(),
        ui_port=None,
        db_file=None,
        log_file=tmp / "temporal.log",
        extra_args=extra,
    ).start()
    samples_port, api_port = free_port(), free_port()
    samples = f"http://127.0.0.1:{samples_port}"
    base = {
        "temporal": {"address": temporal.address, "task_queue": "bench"},
        "database": {"url": f"sqlite:///{tmp / 'artemis.db'}"},
        "vault": {"master_key_file": str(tmp / "master.key")},
        "logging": {
            "output": "file",
            "level": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
            "file": {"path": str(tmp / "a.log")},
        },
        "server": {"port": api_port, "sync_timeout_s": 600},
        # requests name the sample servers, on loopback at a port of the moment
        "security": {"allowed_hosts": ["127.0.0.1"]},
    }
    text = yaml.safe_dump({**base, **config}).replace("{samples}", samples)
    (tmp / "config.yaml").write_text(text)
    # `artemis worker` and `api` need the cluster's master key (the same in every process).
    env = {
        **os.environ,
        "ARTEMIS_CONFIG": str(tmp / "config.yaml"),
        "COOKIE_MASTER_KEY": os.environ.get("COOKIE_MASTER_KEY") or secrets.token_urlsafe(48),
    }
    stack = BenchStack(tmp, samples, f"http://127.0.0.1:{api_port}", env, temporal.address)
    cli = [sys.executable, "-m", "infra.devstack"]
    procs: list[subprocess.Popen] = []
    try:
        stack.cli("db", "upgrade")
        if before_start is not None:
            before_start(stack)
        procs.append(
            subprocess.Popen(
                cli
                + [
                    "samples",
                    "serve",
                    "--port",
                    str(samples_port),
                    "--latency-ms",
                    str(latency_ms),
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
            )
        )
        wait_port(samples_port, procs[-1], "sample servers")
        stack.samples_pid = procs[-1].pid
        for _ in range(workers):
            procs.append(
                subprocess.Popen(cli + ["worker"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
            )
            stack.worker_pids.append(procs[-1].pid)
        procs.append(subprocess.Popen(cli + ["api"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL))
        stack.api_pid = procs[-1].pid
        stack.temporal_pid = temporal.proc.pid if temporal.proc is not None else 0
        wait_port(api_port, procs[-1], "api")
        yield stack
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        temporal.stop()
        remove_bench_dir(tmp)


def remove_bench_dir(path: Path) -> None:
    """A bench's temporary directory goes when it ends (a stack's SQLite WAL alone reaches
    ~60 MB); ARTEMIS_BENCH_KEEP=1 keeps it to look at."""
    if os.environ.get("ARTEMIS_BENCH_KEEP") != "1":
        shutil.rmtree(path, ignore_errors=True)
