"""The embedded stack of `artemis dev` and `artemis demo` in one process tree: Temporal
dev server (with UI), the database, a worker, the starter API and the sample servers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import sqlalchemy as sa
import uvicorn
import yaml
from rich.console import Console
from rich.table import Table
from sqlmodel import col

import infra
from artemis.config import DatabaseSettings, LogFileSettings, Settings, load_settings
from artemis.crawler.cookies import add_cookie
from artemis.crawler.models import SourceNote
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from artemis.logsetup import configure_logging
from artemis.migrate import upgrade
from artemis.pipes import QuietOnClosedPipe
from artemis.registry.yaml_io import import_yaml
from artemis.run_state import RunStatus
from artemis.temporal.client import connect
from artemis.vault import MASTER_KEY_ENV, allow_generated_key_file
from artemis_samples.app import create_app as create_samples_app
from artemis_samples.server import ThreadedServer
from infra.devserver import EAGER_DYNAMIC_CONFIG, DevServer, dynamic_config_args
from starter.api.app import create_app
from starter.cli._common import print_table
from starter.cli.watch import watch_task
from starter.service import ui_list_url, ui_url
from workers.main import running_worker

# Off a terminal nothing is wrapped or cut (a link stays whole for the reader of a log).
_TTY = sys.stdout.isatty()
console = Console(file=QuietOnClosedPipe(sys.stdout), width=None if _TTY else 10_000)  # type: ignore[arg-type]


def _rule(title: str) -> None:
    """A titled rule: the terminal's width, or a short one off a terminal."""
    if _TTY:
        console.rule(title)
    else:
        console.print(f"── {title} ──")


DEFAULT_SAMPLES = "http://127.0.0.1:8300"


def _moved(value: Any, old: str, new: str) -> Any:
    """``value`` with every string that starts with ``old`` starting with ``new``."""
    if isinstance(value, str):
        return new + value[len(old) :] if value.startswith(old) else value
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    return value


def _deep_merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base`` key by key (mappings merged, anything else replaced)."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _default(section: str) -> dict[str, Any]:
    """A settings section's built-in default, as a mapping."""
    value = Settings.model_fields[section].get_default(call_default_factory=True)
    return value.model_dump() if hasattr(value, "model_dump") else dict(value)


def _config_mapping(path: Path) -> dict[str, Any]:
    """The config file as written (load_settings has already refused a broken one)."""
    loaded = yaml.safe_load(path.read_text()) or {}
    return loaded if isinstance(loaded, dict) else {}


class DevStack:
    def __init__(
        self,
        config: Path | None,
        data_dir: Path,
        api_port: int,
        temporal_port: int,
        ui_port: int,
        samples_port: int,
        samples: bool = True,
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        if not os.environ.get(MASTER_KEY_ENV):
            # The embedded stack alone may keep its key in a generated file; say so.
            allow_generated_key_file()
            console.print(
                f"[yellow]{MASTER_KEY_ENV} is not set: the dev stack keeps its master key in "
                f"{data_dir / 'master.key'} (generated once; for this machine only)[/]"
            )
        samples_url = f"http://127.0.0.1:{samples_port}"
        base = load_settings(config)
        overrides: dict[str, Any] = {
            "temporal": {
                "address": f"127.0.0.1:{temporal_port}",
                "ui_url": f"http://127.0.0.1:{ui_port}",
            },
            "server": {"port": api_port},
            # the config's own key file wins over the data folder's
            "vault": {
                "master_key_file": str(data_dir / "master.key"),
                **base.vault.model_dump(exclude_unset=True),
            },
        }
        # --data-dir holds every file the stack keeps, unless the config names its own.
        if not config or base.database.url == DatabaseSettings().url:
            overrides["database"] = {"url": f"sqlite:///{data_dir / 'artemis.db'}"}
        if base.logging.output == "stderr" or (
            base.logging.output == "file" and base.logging.file.path == LogFileSettings().path
        ):
            overrides["logging"] = {
                **base.logging.model_dump(),
                "output": "file",
                "file": {
                    **base.logging.file.model_dump(),
                    "path": str(data_dir / "logs" / "artemis.log"),
                },
            }
        if samples or not config:
            # The demo's own defaults (its sample servers, a SQLite table and Parquet
            # files for the quotes), under the config file's values key by key: a config
            # that adds its own task keeps the demo's tasks working.
            demo = self._demo_defaults(samples_url, data_dir)
            raw = _config_mapping(config) if config else {}
            for section, values in demo.items():
                mine = _moved(raw.get(section) or {}, DEFAULT_SAMPLES, samples_url)
                overrides[section] = _deep_merged(_deep_merged(_default(section), values), mine)
        # The stack's own database (no config, or one that names none): the demo imports its
        # sample registry there and runs every sample.
        self.own_registry = "database" in overrides
        self.settings: Settings = load_settings(config, **overrides)
        self.samples_url = samples_url
        self.samples_port = samples_port
        self.with_samples = samples
        self.api_url = f"http://127.0.0.1:{api_port}"
        codec = (
            ["--ui-codec-endpoint", self.api_url]
            if self.settings.temporal.payload_encryption
            else []
        )
        self.temporal = DevServer(
            port=temporal_port,
            ui_port=ui_port,
            db_file=data_dir / "temporal.db",
            log_file=data_dir / "temporal.log",
            # eager dispatch: docs/operations.md
            extra_args=codec + dynamic_config_args(EAGER_DYNAMIC_CONFIG),
            tied_to_parent=True,
            pid_file=data_dir / "temporal.pid",
        )

    @staticmethod
    def _demo_defaults(samples_url: str, data_dir: Path) -> dict[str, Any]:
        """What the demo sets beneath a config file: every sample task reaches the sample
        servers on ``--samples-port`` and lands somewhere under ``--data-dir``."""
        return {
            "task_defaults": {
                "pull_stock_quotes": {
                    "symbols": ["AAPL", "TSLA"],
                    "start": "2025-11-01",
                    "end": "2025-11-30",
                    "page_size": 10,
                    "base_url": samples_url,
                }
            },
            "output_defaults": {
                "pull_stock_quotes": {
                    "sinks": ["http"],
                    "http_endpoint": f"{samples_url}/sink/quotes",
                    # the demo's quotes also land in a SQLite table and Parquet files
                    "sql": {"url": f"sqlite:///{data_dir / 'lake.db'}", "table": "quotes"},
                    "files": {"url": str(data_dir / "lake"), "format": "parquet"},
                },
                "literature_harvest": {
                    "sinks": ["http"],
                    "http_endpoint": f"{samples_url}/sink/literature",
                },
                "crawl_notes": {"sinks": ["http"], "http_endpoint": f"{samples_url}/sink/notes"},
            },
            "crawler": {"platforms": {"sample": {"base_url": f"{samples_url}/platform"}}},
            "alerts": {"webhook_url": f"{samples_url}/alerts/webhook"},
            # a request may name the sample servers (and only them) on their port
            "security": {"allowed_hosts": _sample_hosts(samples_url)},
        }

    async def _serve(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        configure_logging(self.settings.logging)
        console.print("starting Temporal dev server …")
        # From the main thread: the server is tied to this process (a parent-death
        # signal), so even a SIGKILL of `artemis dev` leaves no Temporal behind.
        stale = self.temporal.stop_stale()
        if stale is not None:
            console.print(
                f"[yellow]stopped a Temporal dev server left by an earlier run (pid {stale})[/]"
            )
        self.temporal.start()
        samples: ThreadedServer | None = None
        try:
            await asyncio.to_thread(upgrade, self.settings.database.url)
            if self.with_samples and self.own_registry:
                await asyncio.to_thread(self._import_sample_registry)
            if self.with_samples:
                samples = ThreadedServer(
                    create_samples_app(latency_ms=20.0), port=self.samples_port
                ).start()
            client = await connect(self.settings)
            api = uvicorn.Server(
                uvicorn.Config(
                    create_app(self.settings, client),
                    host="127.0.0.1",
                    port=self.settings.server.port,
                    log_config=None,
                    access_log=False,
                    timeout_keep_alive=self.settings.server.keep_alive_s,
                )
            )
            api.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
            # The dev stack's database keeps runs between sessions: its build is made
            # current, a run pinned to an older build waits for that build's worker.
            async with running_worker(self.settings, client, promote=True):
                api_task = asyncio.create_task(api.serve())
                while not api.started:
                    if api_task.done():
                        api_task.result()
                        raise RuntimeError("API did not start")
                    await asyncio.sleep(0.05)
                self._banner()
                if ready:
                    ready.set()
                await stop.wait()
                api.should_exit = True
                await api_task
        finally:
            if samples:
                samples.stop()
            await asyncio.to_thread(self.temporal.stop)

    def _banner(self) -> None:
        rows = [("Temporal", self.temporal.address), ("Temporal UI", self.temporal.ui_url or "-")]
        if self.temporal.ui_url:
            # the list filtered to the task runs (the housekeeping loops have rows too)
            rows.append(("Runs in the UI", ui_list_url(self.settings)))
        rows.append(("Artemis API", f"{self.api_url}  (docs: {self.api_url}/docs)"))
        if self.with_samples:
            rows.append(("Sample servers", self.samples_url))
        rows.append(("Database", self.settings.database.url))
        if self.settings.logging.output == "file":
            rows.append(("Logs", self.settings.logging.file.path))
        for name, value in rows:
            # a line each, never folded: a link stays whole to copy on a narrow terminal
            console.print(f"{name:<15} {value}", markup=False, highlight=False, soft_wrap=True)

    def _stop_on_signals(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

    async def run_forever(self) -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        self._stop_on_signals(stop)
        server = asyncio.create_task(self._serve(stop, ready))
        up = asyncio.create_task(ready.wait())
        await asyncio.wait([server, up], return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            console.print("\nthe stack is up; press Ctrl-C to stop")
        else:
            up.cancel()
        await server

    async def demo(self, stay: bool) -> bool:
        stop, ready = asyncio.Event(), asyncio.Event()
        self._stop_on_signals(stop)
        server = asyncio.create_task(self._serve(stop, ready))
        await asyncio.wait(
            [server, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        if server.done():
            server.result()
            return False
        try:
            ok = await asyncio.to_thread(self._run_samples)
        except Exception as e:
            console.print(f"[red]demo failed:[/red] {e}")
            ok = False
        if stay:
            console.print("\nthe stack stays up; press Ctrl-C to stop")
            await stop.wait()
        stop.set()
        await server
        return ok

    def _import_sample_registry(self) -> None:
        """The bundled PubMed and Crossref provenances, pointed at the sample servers."""
        folder = Path(infra.__file__).parent / "registry"
        for name, base in (
            ("pubmed", f"{self.samples_url}/entrez"),
            ("crossref", self.samples_url),
        ):
            doc = yaml.safe_load((folder / f"{name}.yaml").read_text())
            doc["provenance"]["base_url_default"] = base
            import_yaml(
                get_engine(self.settings.database.url),
                yaml.safe_dump(doc),
                self.settings.vault.master_key_file,
                source=f"{name}.yaml",
            )

    def _start_and_watch(
        self, http: httpx.Client, code: str, body: dict[str, Any]
    ) -> tuple[str, dict[str, Any]] | None:
        """Start a sample run (async) and show it live; (task id, final state), or None
        when the start was refused (said on the console)."""
        resp = http.post(f"{self.api_url}/tasks/{code}/run?mode=async", json=body).json()
        if not resp["success"]:
            console.print(f"[red]start refused:[/red] {resp['error']}")
            return None
        task_id = resp["data"]["task_id"]
        return task_id, watch_task(self.api_url, task_id, self.settings)

    def _run_literature(self, http: httpx.Client) -> bool:
        ok = True
        t = Table(title="literature harvests (registry contracts, sample servers)")
        for heading in ("provenance", "status", "records", "delivered once", "pages", "ms"):
            t.add_column(heading)
        for provenance, query in (("pubmed", "neoplasms"), ("crossref", "ecology")):
            _rule(f"[bold]sample run: literature_harvest · {provenance}")
            body = {
                "params": {
                    "provenance": provenance,
                    "task_type": "harvest",
                    "query": query,
                    "start": "2025-01-01",
                    "end": "2025-01-20",
                }
            }
            started = self._start_and_watch(http, "literature_harvest", body)
            if started is None:
                return False
            task_id, final = started
            prefix = f"literature_harvest/{task_id}:"
            ids: dict[str, int] = {}
            for b in http.get(f"{self.samples_url}/_sink/batches").json():
                if b["status"] == 200 and (b["idempotency_key"] or "").startswith(prefix):
                    for r in b["records"]:
                        ids[r["id"]] = ids.get(r["id"], 0) + 1
            stats = final.get("stats") or {}
            once = bool(ids) and set(ids.values()) == {1}
            t.add_row(
                provenance,
                final["status"],
                str(len(ids)),
                str(once),
                str(stats.get("pages")),
                str(final.get("duration_ms")),
            )
            ok = ok and final["status"] == RunStatus.COMPLETED and once
        print_table(t, out=console)
        return ok

    def _run_samples(self) -> bool:
        http = httpx.Client(timeout=30)
        http.post(f"{self.samples_url}/_control/reset", json={})
        body = {
            "meta": {
                "run_id": "demo-run-1",
                "callback": {"base_url": f"{self.samples_url}/cronjob/runs"},
            },
            "body": {
                "symbols": ["AAPL", "TSLA", "MSFT", "NVDA"],
                "start": "2025-09-01",
                "end": "2025-11-30",
                "page_size": 10,
            },
        }
        if self.own_registry:
            body["output"] = {"sinks": ["http", "sql", "files"]}
        _rule("[bold]sample run: pull_stock_quotes")
        started = self._start_and_watch(http, "pull_stock_quotes", body)
        if started is None:
            return False
        task_id, final = started
        batches = http.get(f"{self.samples_url}/_sink/batches").json()
        calls = http.get(f"{self.samples_url}/_cronjob/calls").json()
        keys = {b["idempotency_key"] for b in batches if b["status"] == 200}
        received = sum(len(b["records"]) for b in batches if b["status"] == 200)
        t = Table(title="summary")
        t.add_column("what")
        t.add_column("value", justify="right")
        t.add_row("status", final["status"])
        for k, v in (final.get("stats") or {}).items():
            if isinstance(v, dict):  # per sink: one row each (the whole is in the body below)
                for name, taken in v.items():
                    count = taken.get("records") if isinstance(taken, dict) else taken
                    t.add_row(f"{k}.{name}", str(count))
            else:
                t.add_row(k, str(v))
        t.add_row("duration", f"{final.get('duration_ms')} ms")
        t.add_row("sink batches received (unique keys)", f"{len(batches)} ({len(keys)})")
        t.add_row("records received by the sink", str(received))
        t.add_row("CronJob progress calls", str(sum(1 for c in calls if c["kind"] == "progress")))
        finals = [c["body"] for c in calls if c["kind"] == "callback"]
        t.add_row("CronJob finalize", str(finals[-1].get("result")) if finals else "-")
        print_table(t, out=console)
        if finals:
            # the whole body the CronJob received, as JSON on lines of its own (its
            # `body`, which the protocol sends as a JSON string, read as JSON)
            _rule("the CronJob's finalize body")
            shown = dict(finals[-1])
            if isinstance(shown.get("body"), str):
                with contextlib.suppress(ValueError):
                    shown["body"] = json.loads(shown["body"])
            console.print_json(data=shown)
        ui = ui_url(self.settings, final["workflow_id"])
        console.print(f"see the run in the Temporal UI: [link]{ui}[/link]")
        runs = ui_list_url(self.settings)
        console.print(f"every run (the list filtered to task runs): [link]{runs}[/link]")
        expected = (final.get("stats") or {}).get("records_fetched")
        quotes_ok = final["status"] == RunStatus.COMPLETED and received == expected
        if self.own_registry:
            quotes_ok = self._show_lake(task_id, expected) and quotes_ok
        literature_ok = self._run_literature(http) if self.own_registry else True
        crawl_ok = self._run_crawl(http) if self.own_registry else True
        return quotes_ok and literature_ok and crawl_ok

    def _show_lake(self, task_id: str, expected: int | None) -> bool:
        """What the run left in the SQLite table and the Parquet files, and how to look."""
        out = self.settings.output_defaults["pull_stock_quotes"]
        url, table = out["sql"]["url"], out["sql"]["table"]
        db = sa.engine.make_url(url).database or url
        with sa.create_engine(url).connect() as conn:
            rows = conn.execute(
                sa.text(f'SELECT COUNT(*) FROM "{table}" WHERE _artemis_task_id = :t'),
                {"t": task_id},
            ).scalar_one()
        run_dir = Path(out["files"]["url"]) / "pull_stock_quotes" / task_id
        files = sorted(run_dir.glob("files-*.parquet"))
        in_files = sum(pq.read_metadata(f).num_rows for f in files)
        t = Table(title="the same quotes, landed")
        t.add_column("where")
        t.add_column("records", justify="right")
        t.add_row(f"table {table} ({db})", str(rows))
        t.add_row(f"{len(files)} Parquet files + _manifest.json ({run_dir})", str(in_files))
        print_table(t, out=console)
        console.print(
            "query them:\n"
            f'  sqlite3 {db} "SELECT symbol, COUNT(*), MIN(date), MAX(date) FROM {table} '
            'GROUP BY symbol"\n'
            f'  .venv/bin/python -c "import pyarrow.parquet as pq; '
            f"print(pq.read_table('{run_dir}').group_by('symbol').aggregate("
            "[('close', 'mean')]))\""
        )
        return rows == expected == in_files

    def _run_crawl(self, http: httpx.Client) -> bool:
        """A small crawl of the sample platform with two pooled cookies (one of them
        revoked by the platform, so the pool's error handling shows)."""
        _rule("[bold]sample run: crawl_notes · sample platform")
        vault = vault_for(self.settings)
        for name, session, priority in (
            ("demo-1", "sample-demo-1", 2),
            ("demo-2", "sample-demo-2", 1),
        ):
            add_cookie(vault, "sample", name, f"web_session={session}", priority)
        http.post(
            f"{self.samples_url}/_control/platform",
            json={"notes_per_keyword": 15, "revoked": ["sample-demo-1"]},
        )
        tag = uuid.uuid4().hex[:4]  # fresh keywords: a second demo finds new notes
        body = {"params": {"platform": "sample", "keywords": [f"travel-{tag}", f"food-{tag}"]}}
        started = self._start_and_watch(http, "crawl_notes", body)
        if started is None:
            return False
        task_id, final = started
        sent: dict[str, int] = {}
        for b in http.get(f"{self.samples_url}/_sink/batches").json():
            if b["status"] == 200 and (b["idempotency_key"] or "").startswith(
                f"crawl_notes/{task_id}:"
            ):
                for r in b["records"]:
                    sent[r["note_id"]] = sent.get(r["note_id"], 0) + 1
        with vault.engine.connect() as conn:
            # This run's notes (the data dir outlives a demo: earlier demos' notes stay).
            stored = conn.execute(
                sa.select(sa.func.count())
                .select_from(SourceNote)
                .where(
                    col(SourceNote.platform) == "sample", col(SourceNote.note_id).in_(list(sent))
                )
            ).scalar_one()
        t = Table(title="crawl (cookie pool, execution lock, tbl_source once)")
        for heading in ("status", "notes stored in tbl_source", "sent to the sink", "each once"):
            t.add_column(heading)
        once = bool(sent) and set(sent.values()) == {1}
        t.add_row(final["status"], str(stored), str(len(sent)), str(once))
        print_table(t, out=console)
        console.print("try `artemis cookies list` and `artemis audit` against this stack")
        return final["status"] == RunStatus.COMPLETED and once and stored == len(sent)


def _sample_hosts(samples_url: str) -> list[str]:
    """The allow-list of a stack whose sample servers listen at ``samples_url``: their
    port on loopback, by IP (an internal address is admitted by an IP entry only) and by
    name."""
    port = samples_url.rsplit(":", 1)[1]
    return [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
