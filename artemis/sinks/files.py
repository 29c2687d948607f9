"""Files sink: one JSONL or Parquet file per page, on a local path or under ``s3://``.

``output_defaults.<code>.files: {url, format}`` (``format`` ``jsonl`` or ``parquet``;
``endpoint_url`` for an S3-compatible store other than AWS). Each page becomes
``{url}/{code}/{task_id}/files-{page_seq:06d}.{ext}``: named from the run and the page, so
a retried or re-run page overwrites the same object. A local file is written under a
temporary name and renamed into place; an S3 object is one PUT. Either way a reader sees a
whole file or none. Parquet files carry the schema of the task's record model (pyarrow).
S3 credentials come from the environment only (the AWS chain: ``AWS_ACCESS_KEY_ID``…,
a profile, an instance role), never from config or requests.

What each page wrote is recorded in the Artemis database (``sink_file``), and at finalize
the run's ``_manifest.json`` lists its files and record counts.
"""

from __future__ import annotations

import io
import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec
from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.engine import Connection

from artemis import jsonio
from artemis.calls import work
from artemis.db import SinkFile, get_engine, transaction, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import HttpClient
from artemis.logsetup import get_logger
from artemis.sinks.base import EmitContext, RunEnd, Sink
from artemis.sinks.records import RecordSpec

log = get_logger(__name__)

FORMATS = {"jsonl": "jsonl", "parquet": "parquet"}
MANIFEST = "_manifest.json"


def check_format(fmt: str, record: RecordSpec | None) -> None:
    """``output.files.format`` is one the sink writes (parquet needs a record model)."""
    if fmt not in FORMATS:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"output.files.format: {fmt!r} is not one of {', '.join(FORMATS)}",
        )
    if fmt == "parquet" and record is None:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            "output.files.format: parquet needs the task's record model; this task has none",
        )


_ledger = SinkFile.__table__  # type: ignore[attr-defined]
_DROP_RUN = delete(_ledger).where(_ledger.c.run_key == bindparam("p_run_key"))  # each clean-up


@dataclass(frozen=True)
class Written:
    path: str
    records: int
    bytes: int


class FileSink(Sink):
    name = "files"

    def __init__(
        self,
        url: str,
        fmt: str,
        record: RecordSpec | None,
        database_url: str,
        endpoint_url: str | None = None,
        folder: str | None = None,
    ) -> None:
        check_format(fmt, record)
        # The folder a run's files go under (default: its task code); a registry run's is
        # its provenance, so each source has a folder of its own.
        self.folder = folder
        self.url = url.rstrip("/")
        self.format = fmt
        self.record = record
        self.database_url = database_url
        options: dict[str, Any] = {}
        if self.url.startswith("s3://") and endpoint_url:
            options["client_kwargs"] = {"endpoint_url": endpoint_url}
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)
        except (ValueError, ImportError) as e:
            raise ArtemisError(ErrorCode.INVALID_INPUT, f"output.files.url: {e}") from None
        self.local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )

    # -- naming ----------------------------------------------------------------------------
    def run_dir(self, task_code: str, task_id: str) -> str:
        if task_id in ("", ".", "..") or "/" in task_id:
            raise ArtemisError(
                ErrorCode.SINK_ERROR,
                f"files sink: task id {task_id!r} cannot name a folder",
                retryable=False,
            )
        folder = self.folder or task_code
        if folder in ("", ".", "..") or "/" in folder or "\\" in folder:
            raise ArtemisError(
                ErrorCode.SINK_ERROR,
                f"files sink: {folder!r} cannot name a folder",
                retryable=False,
            )
        return f"{self.root}/{folder}/{task_id}"

    def page_path(self, ctx: EmitContext) -> str:
        ext = FORMATS[self.format]
        part = "" if ctx.replay_row is None else f"-q{ctx.replay_row}"
        return f"{self.run_dir(ctx.task_code, ctx.task_id)}/{self.name}-{ctx.seq:06d}{part}.{ext}"

    def location(self, path: str) -> str:
        """A path as the user would open it (with its scheme for remote stores)."""
        return path if self.local else self.fs.unstrip_protocol(path)

    # -- writing -----------------------------------------------------------------------------
    async def emit(
        self, client: HttpClient, records: list[dict[str, Any]], ctx: EmitContext
    ) -> None:
        await work(self.write, records, ctx)

    def encode(self, records: list[dict[str, Any]], where: str) -> bytes:
        if self.format == "jsonl":
            return b"".join(jsonio.dumps(r) + b"\n" for r in records)
        import pyarrow.parquet as pq

        assert self.record is not None
        table = self.record.arrow_table(self.record.rows(records, where))
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()

    def write(self, records: list[dict[str, Any]], ctx: EmitContext) -> Written:
        path = self.page_path(ctx)
        data = self.encode(records, f"files sink ({self.location(path)})")
        self._put(path, data)
        written = Written(self.location(path), len(records), len(data))
        if ctx.replay_row is None:
            # (a replayed record's file is named by its row: written again, it is the same
            # file; the run's manifest, written at its end, lists its pages only)
            self._record(ctx, written)
        return written

    def _put(self, path: str, data: bytes) -> None:
        """The whole object at ``path`` or, on failure, what was there before."""
        where = f"files sink: write {self.location(path)}"
        try:
            if self.local:
                parent = os.path.dirname(path)
                os.makedirs(parent, exist_ok=True)
                tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                # One PUT: S3 makes an object visible whole, or keeps the old one.
                self.fs.pipe_file(path, data)
        except PermissionError as e:
            raise ArtemisError(ErrorCode.SINK_ERROR, f"{where}: {e}", retryable=False) from None
        except FileNotFoundError as e:
            # e.g. an S3 bucket that does not exist: configuration, not a passing fault.
            raise ArtemisError(ErrorCode.SINK_ERROR, f"{where}: {e}", retryable=False) from None
        except OSError as e:
            raise ArtemisError(
                ErrorCode.SINK_ERROR,
                f"{where}: {type(e).__name__}: {e}",
                details={"reason": f"storage unreachable ({type(e).__name__})"},
            ) from None

    def _record(self, ctx: EmitContext, written: Written) -> None:
        engine = get_engine(self.database_url)
        insert = upsert_insert(engine)
        stmt = insert(_ledger).values(
            run_key=ctx.run_key,
            sink=self.name,
            seq=ctx.seq,
            path=written.path,
            records=written.records,
            bytes=written.bytes,
            written_at=utcnow(),
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_key", "sink", "seq"],
            set_={k: stmt.excluded[k] for k in ("path", "records", "bytes", "written_at")},
        )
        with engine.begin() as conn:
            conn.execute(stmt)

    # -- finalize ------------------------------------------------------------------------------
    async def finish(self, end: RunEnd) -> dict[str, Any]:
        return await work(self.write_manifest, end)

    def write_manifest(self, end: RunEnd) -> dict[str, Any]:
        """``_manifest.json`` in the folder of the run's files: each file, its page and records."""
        try:
            return self._write_manifest(end)
        except ArtemisError:
            raise
        except Exception as e:  # the database, the file system, the object store
            raise ArtemisError(
                ErrorCode.SINK_ERROR, f"files sink: manifest: {type(e).__name__}: {e}"
            ) from None

    def _write_manifest(self, end: RunEnd) -> dict[str, Any]:
        engine = get_engine(self.database_url)
        with engine.connect() as conn:
            rows = conn.execute(
                select(_ledger.c.seq, _ledger.c.path, _ledger.c.records, _ledger.c.bytes)
                .where(_ledger.c.run_key == end.run_key, _ledger.c.sink == self.name)
                .order_by(_ledger.c.seq)
            ).all()
        files = [
            {"path": r.path, "page_seq": r.seq, "records": r.records, "bytes": r.bytes}
            for r in rows
        ]
        manifest = {
            "task_code": end.task_code,
            "task_id": end.task_id,
            "status": end.status,
            "format": self.format,
            "files": files,
            "file_count": len(files),
            "records": sum(f["records"] for f in files),
            "written_at": utcnow().isoformat(),
        }
        run_dir = self.run_dir(end.task_code, end.task_id)
        if self.local and os.path.isdir(run_dir):
            # A worker killed mid-write leaves its temporary file (never a page file);
            # the run has stopped writing now, so what is left is litter.
            for name in os.listdir(run_dir):
                if name.startswith(f".{self.name}-") and name.endswith(".tmp"):
                    os.unlink(os.path.join(run_dir, name))
        path = f"{run_dir}/{MANIFEST}"
        self._put(path, jsonio.dumps(manifest) + b"\n")
        log.info("files_manifest_written", path=self.location(path), files=len(files))
        return {
            "manifest": self.location(path),
            "files": len(files),
            "records": manifest["records"],
        }


def drop_file_records(database_url: str, run_key: str, conn: Connection | None = None) -> int:
    """Forget what a run wrote (after its manifest is written)."""
    with transaction(get_engine(database_url), conn) as c:
        return c.execute(_DROP_RUN, {"p_run_key": run_key}).rowcount


def drop_file_records_older_than(database_url: str, before: datetime) -> int:
    """Records of runs that never reached their finalize (terminated in Temporal): every
    record of a run whose newest one is older than ``before`` — a run still writing keeps
    all of its records, however long ago it began."""
    quiet = (
        select(_ledger.c.run_key)
        .group_by(_ledger.c.run_key)
        .having(func.max(_ledger.c.written_at) < before)
    )
    with get_engine(database_url).begin() as conn:
        return conn.execute(delete(_ledger).where(_ledger.c.run_key.in_(quiet))).rowcount
