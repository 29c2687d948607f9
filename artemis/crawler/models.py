"""The crawler tables (docs/operations.md): cookies, candidate notes, executions and the
collected notes, plus the vault's key records (salts, never keys)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Index, Text, UniqueConstraint, text
from sqlmodel import Column, Field, SQLModel

from artemis.db import UTCDateTime, utcnow
from artemis.run_state import TERMINAL, AlertStatus, CandidateStatus, CookieStatus, RunStatus

COOKIE_STATUSES = tuple(CookieStatus)
CANDIDATE_STATUSES = tuple(CandidateStatus)
# An execution record has a run's statuses (it is written by the run).
EXECUTION_STATUSES = (RunStatus.RUNNING, *sorted(TERMINAL))


class VaultKey(SQLModel, table=True):
    """One encryption key: derived from the master key and this row's salt (the key itself
    is never stored). ``retired_at`` is set once no row is encrypted with it any more."""

    __tablename__ = "tbl_vault_key"

    key_id: str = Field(primary_key=True, max_length=64)
    kdf: str = Field(max_length=32)
    salt: str = Field(max_length=64)
    # A fingerprint of the master key the salt was used with, to name a wrong master key.
    master_check: str = Field(max_length=64)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    retired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class CookieRow(SQLModel, table=True):
    __tablename__ = "tbl_cookie"
    __table_args__ = (Index("ix_tbl_cookie_pick", "platform", "status", "priority"),)

    id: int | None = Field(default=None, primary_key=True)
    cookie_name: str = Field(max_length=100, unique=True)
    platform: str = Field(max_length=50)
    cookie_encrypted: str = Field(sa_column=Column(Text, nullable=False))
    encryption_key_id: str = Field(max_length=64)
    status: str = Field(default=CookieStatus.ACTIVE.value, max_length=16)
    priority: int = 0
    daily_used: int = 0
    daily_limit: int = 500
    usage_day: str = Field(default="", max_length=10)  # the UTC date daily_used counts
    consecutive_errors: int = 0
    total_errors: int = 0
    cooling_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Candidate(SQLModel, table=True):
    __tablename__ = "tbl_candidate"
    __table_args__ = (
        UniqueConstraint("platform", "note_id", name="uq_tbl_candidate_note"),
        Index("ix_tbl_candidate_claim", "platform", "status", "id"),
        Index("ix_tbl_candidate_locked", "status", "locked_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    note_id: str = Field(max_length=100)
    platform: str = Field(max_length=50)
    note_url: str | None = Field(default=None, max_length=1000)
    status: str = Field(default=CandidateStatus.PENDING.value, max_length=16)
    processing_lock: str | None = Field(default=None, max_length=100)
    locked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    retry_count: int = 0
    last_error_code: str | None = Field(default=None, max_length=40)
    source_keyword: str | None = Field(default=None, max_length=200)
    exec_meta: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class CrawlExecution(SQLModel, table=True):
    __tablename__ = "tbl_crawl_execution"
    __table_args__ = (
        # The database's own guard behind the Temporal workflow-id lock: one running
        # execution per workflow name.
        Index(
            "uq_tbl_crawl_execution_running",
            "workflow_name",
            unique=True,
            sqlite_where=text(f"status = '{RunStatus.RUNNING}'"),
            postgresql_where=text(f"status = '{RunStatus.RUNNING}'"),
        ),
        Index("ix_tbl_crawl_execution_heartbeat", "status", "heartbeat_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    workflow_name: str = Field(max_length=200)
    execution_id: str = Field(max_length=100, unique=True)
    status: str = Field(default=RunStatus.RUNNING.value, max_length=16)
    started_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    heartbeat_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    completed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    items_processed: int = 0
    items_failed: int = 0
    error_code: str | None = Field(default=None, max_length=40)


class SourceNote(SQLModel, table=True):
    __tablename__ = "tbl_source"

    id: int | None = Field(default=None, primary_key=True)
    idempotency_key: str = Field(max_length=120, unique=True)
    note_id: str = Field(max_length=100)
    platform: str = Field(max_length=50)
    title: str | None = Field(default=None, max_length=500)
    content: str | None = Field(default=None, sa_column=Column(Text))
    author: str | None = Field(default=None, max_length=200)
    data: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    processing_lock: str | None = Field(default=None, max_length=100)
    locked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    retry_count: int = 0
    last_error_code: str | None = Field(default=None, max_length=40)
    exec_meta: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class FetchOutcome(SQLModel, table=True):
    """One detail fetch's outcome, for the success-rate alert (kept for a day)."""

    __tablename__ = "tbl_fetch_outcome"
    __table_args__ = (Index("ix_tbl_fetch_outcome_at", "platform", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    platform: str = Field(max_length=50)
    ok: bool
    code: str | None = Field(default=None, max_length=40)
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AlertState(SQLModel, table=True):
    """Where each alert is in its episode: ok → pending (condition seen) → firing
    (delivered once) → ok (resolve delivered)."""

    __tablename__ = "tbl_alert_state"

    key: str = Field(primary_key=True, max_length=150)
    status: str = Field(default=AlertStatus.OK.value, max_length=16)
    since: datetime | None = Field(default=None, sa_type=UTCDateTime)
    fired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    resolved_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    value: float | None = None
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
