"""A throw-away redis-server for tests and benchmarks: on a free loopback port, no
persistence, in a folder of its own; a test may kill it and start it again. Uses
Debian's redis-server package (installed by .ci/run when missing)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from infra.devserver import free_port, port_open


def available() -> bool:
    return shutil.which("redis-server") is not None


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.binary = shutil.which("redis-server")
        self.port = free_port()
        self.directory = directory
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert self.binary, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)

    stop = kill
