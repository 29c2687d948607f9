"""A throw-away PostgreSQL server for tests and benchmarks: initdb into a folder, start it
on a free loopback port, create a database, stop and remove it afterwards. Uses Debian's
postgresql package (installed by .ci/run when missing); as root it runs as `postgres`."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from infra.devserver import free_port, port_open


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def available() -> bool:
    return pg_bin("initdb") is not None and pg_bin("pg_ctl") is not None


class PgServer:
    def __init__(self, dbname: str = "artemis", durable: bool = False) -> None:
        # Not durable (the default, for speed): fsync and synchronous commits are off, so
        # a crash may lose the last commits. A crash test needs a durable server.
        self.durable = durable
        self.dbname = dbname
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="artemis-pg-"))
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self._as_root = os.geteuid() == 0

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        if self._as_root:
            cmd = ("runuser", "-u", "postgres", "--", *cmd)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def start(self) -> PgServer:
        initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.sock.mkdir(parents=True)
        if self._as_root:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sock, "postgres")
        out = self._run(
            initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"
        )
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr}")
        self._pg_ctl_start()
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", self.port):
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL did not open its port")
            time.sleep(0.1)
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        return self

    def crash(self) -> None:
        """Stop at once, as a crash would (no shutdown checkpoint); the data stays."""
        pg_ctl = pg_bin("pg_ctl")
        assert pg_ctl
        self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        """Start again on the same port after ``crash`` (crash recovery runs)."""
        self._pg_ctl_start()

    def _pg_ctl_start(self) -> None:
        pg_ctl = pg_bin("pg_ctl")
        assert pg_ctl
        opts = f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1"
        if not self.durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        out = self._run(
            pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(self.root / "pg.log"), "-w", "start"
        )
        if out.returncode:
            raise RuntimeError(f"pg_ctl start failed: {out.stderr}{out.stdout}")

    def stop(self) -> None:
        pg_ctl = pg_bin("pg_ctl")
        if pg_ctl and self.data.exists():
            self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
