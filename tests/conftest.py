"""Shared fixtures: a real Temporal dev server, the real sample servers on 127.0.0.1, a
real SQLite database, an in-process worker and the starter API served by uvicorn.

Every test gets its own task queue and ids, so tests never see each other's runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from artemis.config import Settings, load_settings
from artemis.logsetup import configure_logging
from artemis.migrate import upgrade
from artemis.run_state import TERMINAL
from artemis.vault import allow_generated_key_file
from artemis_samples.app import create_app as create_samples_app
from artemis_samples.server import ThreadedServer
from infra.devserver import TEST_DYNAMIC_CONFIG, DevServer, dynamic_config_args, free_port
from infra.redisserver import RedisServer  # noqa: F401  (tests import it from here)
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parent.parent

# The test suite is an embedded one-machine stack: its key file may be generated (a
# production `artemis worker` / `api` refuses to start without COOKIE_MASTER_KEY).
allow_generated_key_file()

# The fixtures that start a server process (Temporal, PostgreSQL, Redis, an object store,
# the sample servers): a test that needs none of them is in the fast tier (`make check`).
SERVER_FIXTURES = frozenset({"temporal_server", "pg_server", "redis_url", "s3_server", "samples"})


# A parametrised test's case by one of these names gets its server at run time
# (``request.getfixturevalue``), which its fixture names do not show.
SERVER_CASES = frozenset({"postgresql", "redis"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that needs a server ``servers`` (``-m "not servers"``: the fast tier):
    every end-to-end test (tests/e2e: the API, the CLI and `artemis dev` as processes), any
    test whose fixtures start one, and a parametrised test's ``postgresql`` and ``redis``
    cases (its ``sqlite`` case stays in the fast tier). A server fixture a test left
    unmarked reaches anyway fails in the fast tier (``_no_server_in_the_fast_tier``)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        cases = {value for value in params.values() if isinstance(value, str)}
        e2e = item.path.parent.name == "e2e"
        if e2e or names & SERVER_FIXTURES or cases & SERVER_CASES:
            item.add_marker(pytest.mark.servers)


def _no_server_in_the_fast_tier(config: pytest.Config, what: str) -> None:
    """A server started in a run that deselects ``servers``: the test that asked for it
    escaped the marking above, and would make the fast tier start servers in every one
    of its processes. Fails that test, naming the server."""
    if "not servers" in config.getoption("markexpr", ""):
        pytest.fail(
            f"a test of the fast tier started {what}: mark it `servers` "
            "(tests/conftest.py: pytest_collection_modifyitems)",
            pytrace=False,
        )


# How long the tasks left on the session's event loop get to end once cancelled.
LEFT_TASKS_GRACE_S = 60


@pytest.fixture(scope="session", autouse=True)
async def no_task_outlives_the_session(pytestconfig: pytest.Config) -> AsyncIterator[None]:
    """At the session's end, before pytest-asyncio closes the loop (which waits, without a
    bound, for every task left on it): the tasks still there are cancelled and given
    LEFT_TASKS_GRACE_S to end. One that does not end is a leak the suite must not hang
    on: its stack and the session's failures so far are printed, and the session exits
    at once with status 3."""
    yield
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in left:
        task.cancel()
    if not left:
        return
    _, pending = await asyncio.wait(left, timeout=LEFT_TASKS_GRACE_S)
    if pending:
        # pytest captures the file descriptors during a fixture's teardown, and _exit
        # drops what it captured: the capture ends first, so this reaches the terminal.
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=False)
        err = sys.__stderr__ or sys.stderr
        print(f"\n{len(pending)} task(s) did not end when cancelled:", file=err)
        for task in pending:
            task.print_stack(file=err)
        err.flush()
        _print_failures(pytestconfig)
        sys.stdout.flush()
        os._exit(3)


def _print_failures(config: pytest.Config) -> None:
    """What pytest prints at a session's end (the failures, the errors, the short summary),
    printed now: the exit that follows skips pytest's own summary, and a leak that comes
    after a failed test must not hide which test failed."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    for part in ("summary_failures", "summary_errors", "short_test_summary"):
        try:
            getattr(reporter, part)()
        except Exception as err:  # a pytest without it: the stacks above still tell
            print(f"(pytest's {part} failed: {err!r})", file=sys.__stderr__)
    sys.stdout.flush()


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artemis")


@pytest.fixture(scope="session")
def log_file(tmp_root: Path) -> Path:
    return tmp_root / "logs" / "artemis.log"


@pytest.fixture(scope="session")
def temporal_server(tmp_root: Path, pytestconfig: pytest.Config):
    _no_server_in_the_fast_tier(pytestconfig, "a Temporal server")
    server = DevServer(
        port=free_port(),
        ui_port=None,
        db_file=None,
        log_file=tmp_root / "temporal.log",
        extra_args=dynamic_config_args(TEST_DYNAMIC_CONFIG),
    ).start()
    yield server
    server.stop()


def require(present: bool, what: str, package: str) -> None:
    """A service the tests run for real: required in CI (.ci/run installs it), skipped
    elsewhere when it is not installed."""
    if not present:
        if os.environ.get("CI"):
            raise RuntimeError(f"{what} is required in CI (apt-get install {package})")
        pytest.skip(f"{what} is not installed here")


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config):
    """A real PostgreSQL on 127.0.0.1 (Debian's package; .ci/run installs it when missing)."""
    _no_server_in_the_fast_tier(pytestconfig, "PostgreSQL")
    from infra.pgserver import PgServer, available

    require(available(), "PostgreSQL", "postgresql")
    server = PgServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_root: Path, pytestconfig: pytest.Config):
    """A real Redis on 127.0.0.1 (Debian's redis-server; .ci/run installs it when missing).
    Skipped only outside CI when it is absent; in CI it is required."""
    _no_server_in_the_fast_tier(pytestconfig, "Redis")
    from infra.redisserver import available

    require(available(), "redis-server", "redis-server")
    server = RedisServer(tmp_root).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def s3_server(pytestconfig: pytest.Config):
    """A real S3-compatible server on 127.0.0.1 (moto in server mode) with a bucket
    ``lake``; the credentials come from the environment, as they do in production."""
    _no_server_in_the_fast_tier(pytestconfig, "an object store")
    from moto.server import ThreadedMotoServer

    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    httpx.put(f"{url}/lake").raise_for_status()
    yield url
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _port_open(port: int) -> bool:
    from infra.devserver import port_open

    return port_open("127.0.0.1", port)


@pytest.fixture(scope="session")
def samples(pytestconfig: pytest.Config):
    _no_server_in_the_fast_tier(pytestconfig, "the sample servers")
    server = ThreadedServer(create_samples_app()).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def base_settings(
    tmp_root: Path, temporal_server: DevServer, samples: ThreadedServer, log_file: Path
) -> Settings:
    db_url = f"sqlite:///{tmp_root / 'artemis.db'}"
    settings = load_settings(
        None,
        **{
            # Every stack's task queue is one more queue of one deployment: Temporal
            # limits the deployments of a namespace (100 by default), and every worker
            # of this code polls as the same build.
            "temporal": {
                "address": temporal_server.address,
                "task_queue": "unused",
                "deployment_name": "artemis-tests",
            },
            "database": {"url": db_url},
            "vault": {"master_key_file": str(tmp_root / "master.key")},
            "logging": {"output": "file", "level": "INFO", "file": {"path": str(log_file)}},
            "task_defaults": {
                "pull_stock_quotes": {
                    "base_url": samples.url,
                    "page_size": 10,
                    "symbols": ["AAPL"],
                    "start": "2025-11-01",
                    "end": "2025-11-30",
                }
            },
            "output_defaults": {
                "pull_stock_quotes": {"sinks": ["http"], "http_endpoint": f"{samples.url}/sink/t"},
                "literature_harvest": {
                    "sinks": ["http"],
                    "http_endpoint": f"{samples.url}/sink/literature",
                },
                "source_harvest": {
                    "sinks": ["http"],
                    "http_endpoint": f"{samples.url}/sink/sources",
                },
                "crawl_notes": {"sinks": ["http"], "http_endpoint": f"{samples.url}/sink/notes"},
            },
            "crawler": {
                "platforms": {"sample": {"base_url": f"{samples.url}/platform"}},
                "backoff_s": [0.2, 0.4, 0.8],
                "detail_timeout_s": 2.0,
            },
            "runs": {"heartbeat_timeout_s": 2.0, "pages_per_fetch": 5, "provenance_refresh_s": 0.5},
            # The sample servers listen on loopback at ports of the moment.
            "security": {"allowed_hosts": ["127.0.0.1", "localhost", "::1"]},
        },
    )
    upgrade(db_url)
    _import_sample_registry(db_url, samples.url, settings.vault.master_key_file)
    configure_logging(settings.logging, force=True)
    return settings


def _import_sample_registry(db_url: str, samples_url: str, key_file: str) -> None:
    """The bundled PubMed and Crossref provenances, pointed at the sample servers."""
    from artemis.db import get_engine
    from artemis.registry.yaml_io import import_yaml

    for name, base in (("pubmed", f"{samples_url}/entrez"), ("crossref", samples_url)):
        doc = yaml.safe_load((ROOT / "infra" / "registry" / f"{name}.yaml").read_text())
        doc["provenance"]["base_url_default"] = base
        import_yaml(get_engine(db_url), yaml.safe_dump(doc), key_file)


@pytest.fixture
def app_log(base_settings: Settings) -> Path:
    """The log file of the in-process API and worker, for a test that reads it. Logging is
    set up again here: a test elsewhere may have reconfigured it since ``base_settings``
    (tests/unit/test_tracing_and_logging.py does), and then nothing would reach the file."""
    configure_logging(base_settings.logging, force=True)
    return Path(base_settings.logging.file.path)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_engine(request, tmp_path_factory):
    """A migrated Artemis database per test module: a SQLite file, and a real PostgreSQL
    (``pg_server``; skipped where none can run). The registry and crawler tests use it."""
    from artemis.db import get_engine
    from artemis.migrate import upgrade

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'artemis.db'}"
    else:
        url = request.getfixturevalue("pg_server").url
    upgrade(url)
    return get_engine(url)


@pytest.fixture(scope="session")
async def client(base_settings: Settings):
    from artemis.temporal.client import connect

    return await connect(base_settings)


class Stack:
    """One test's slice of the stack: its own task queue, worker and API server."""

    def __init__(self, settings: Settings, api_url: str, samples_url: str, client) -> None:
        self.settings = settings
        self.api_url = api_url
        self.samples_url = samples_url
        self.client = client
        # A JSON API client: state changes carry Content-Type: application/json (docs/security.md)
        self.http = httpx.AsyncClient(
            base_url=api_url, timeout=60, headers={"Content-Type": "application/json"}
        )
        self.samples_http = httpx.AsyncClient(base_url=samples_url, timeout=30)

    async def run(
        self,
        body: dict[str, Any],
        mode: str = "sync",
        code: str = "pull_stock_quotes",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        return await self.http.post(
            f"/tasks/{code}/run", params={"mode": mode}, json=body, headers=headers
        )

    async def wait_status(
        self,
        task_id: str,
        statuses: Collection[str] | None = None,
        timeout: float = 60,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        statuses = statuses or TERMINAL
        deadline = time.monotonic() + timeout
        while True:
            resp = await self.http.get(f"/tasks/{task_id}", headers=headers)
            data = resp.json()["data"]
            if data and data.get("status") in statuses:
                return data
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} still {data and data.get('status')}")
            await asyncio.sleep(0.1)

    async def sink_batches(self, run_key_prefix: str | None = None) -> list[dict[str, Any]]:
        batches = (await self.samples_http.get("/_sink/batches")).json()
        if run_key_prefix:
            batches = [
                b for b in batches if (b["idempotency_key"] or "").startswith(run_key_prefix)
            ]
        return batches

    async def cronjob_calls(self, run_id: str) -> list[dict[str, Any]]:
        calls = (await self.samples_http.get("/_cronjob/calls")).json()
        return [c for c in calls if c["run_id"] == run_id]

    def callback_run(
        self, symbols: list[str], callback: dict[str, Any] | None = None, **params: Any
    ) -> tuple[str, str, dict[str, Any]]:
        """(task_id, CronJob run_id, request body) of a run that calls the CronJob back."""
        task_id, run_id = new_task_id(), f"cron-{new_task_id()}"
        cb = {"base_url": f"{self.samples_url}/cronjob/runs", **(callback or {})}
        meta = {"task_id": task_id, "run_id": run_id, "callback": cb}
        return task_id, run_id, {"meta": meta, "params": {"symbols": symbols, **params}}

    async def finals(self, run_id: str) -> list[dict[str, Any]]:
        """The finalize calls the CronJob received for ``run_id``."""
        return [c for c in await self.cronjob_calls(run_id) if c["kind"] == "callback"]

    async def fault(self, target: str, **spec: Any) -> None:
        await self.samples_http.post(f"/_control/{target}", json=spec)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.samples_http.aclose()


def settings_with(base: Settings, **overrides: Any) -> Settings:
    data = base.model_dump()
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return Settings(**data)


async def serve_api(settings: Settings, client) -> tuple[uvicorn.Server, asyncio.Task, str]:
    from starter.api.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, client),
            host="127.0.0.1",
            port=0,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_keep_alive=settings.server.keep_alive_s,
        )
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())

    def started() -> bool:
        if task.done():  # a failed start-up: its error, or a plain stop that says nothing
            task.result()
            pytest.fail("the API server stopped before it started")
        return server.started

    await eventually(started, "the API server to start", interval=0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


@pytest.fixture
async def make_stack(
    base_settings: Settings, client, samples: ThreadedServer
) -> AsyncIterator[Callable[..., Any]]:
    """Build a stack with optional settings overrides (and an in-process worker)."""
    from workers.main import running_worker

    opened: list[Any] = []

    async def factory(worker: bool = True, **overrides: Any) -> Stack:
        overrides.setdefault("temporal", {})
        overrides["temporal"] = {
            **overrides["temporal"],
            "task_queue": f"tq-{uuid.uuid4().hex[:10]}",
        }
        settings = settings_with(base_settings, **overrides)
        if worker:
            cm = running_worker(settings, client)
            await cm.__aenter__()
            opened.append(("worker", cm))
        server, task, url = await serve_api(settings, client)
        opened.append(("api", (server, task)))
        stack = Stack(settings, url, samples.url, client)
        opened.append(("stack", stack))
        return stack

    yield factory
    failed: BaseException | None = None
    for kind, obj in reversed(opened):
        try:  # each piece is closed even when one before it failed to close
            if kind == "worker":
                await obj.__aexit__(None, None, None)
            elif kind == "api":
                server, task = obj
                server.should_exit = True
                await task
            else:
                await obj.aclose()
        except Exception as e:
            failed = failed or e
    if failed is not None:
        raise failed


@pytest.fixture
async def stack(make_stack) -> Stack:
    return await make_stack()


def write_config(path: Path, settings: Settings) -> Path:
    path.write_text(yaml.safe_dump(json.loads(settings.model_dump_json())))
    return path


def _start_cli(args: list[str], config: Path, log_path: Path) -> subprocess.Popen:
    """An `artemis` command as production runs it: with COOKIE_MASTER_KEY (the embedded
    test stack's key, so every process decrypts alike)."""
    key_file = yaml.safe_load(config.read_text())["vault"]["master_key_file"]
    env = {
        **os.environ,
        "ARTEMIS_CONFIG": str(config),
        "COOKIE_MASTER_KEY": Path(key_file).read_text().strip(),
    }
    out = open(log_path, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "infra.devstack", *args],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )


def start_worker_process(config: Path, log_path: Path) -> subprocess.Popen:
    return _start_cli(["worker"], config, log_path)


def start_api_process(config: Path, port: int, log_path: Path) -> subprocess.Popen:
    return _start_cli(["api", "--port", str(port)], config, log_path)


def new_task_id() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"
