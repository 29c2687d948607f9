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
from artemis.db import get_engine
from artemis.migrate import upgrade
from artemis.registry.models import RegProvCredential


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def crawl_engine(request, tmp_path_factory):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('crawler') / 'crawl.db'}"
    else:
        url = request.getfixturevalue("pg_server").url
    upgrade(url)
    return get_engine(url)


@pytest.fixture
def crawl_db(crawl_engine):
    with crawl_engine.begin() as conn:
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
    return crawl_engine
