"""A migrated database with empty crawler tables per test (SQLite file and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import delete

from artemis.crawler.models import (
    AlertState,
    Candidate,
    CookieRow,
    CrawlExecution,
    FetchOutcome,
    SourceNote,
    VaultKey,
)
from artemis.registry.models import RegProvCredential


@pytest.fixture
def crawl_db(db_engine):
    with db_engine.begin() as conn:
        for model in (
            SourceNote,
            Candidate,
            CrawlExecution,
            CookieRow,
            VaultKey,
            AlertState,
            FetchOutcome,
            RegProvCredential,  # sealed under other tests' master keys
        ):
            conn.execute(delete(model.__table__))
    return db_engine
