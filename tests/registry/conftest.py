"""A migrated registry database per test module (SQLite file; PostgreSQL when available)."""

from __future__ import annotations

import pytest
from sqlalchemy import delete

from artemis.crawler.models import CookieRow, VaultKey
from artemis.registry.models import DIMENSIONS, RegProvenance, RegProvWatermark


def wipe(conn) -> None:
    conn.execute(delete(DIMENSIONS["credential"].__table__))
    for name, model in DIMENSIONS.items():
        if name != "credential":
            conn.execute(delete(model.__table__))
    conn.execute(delete(RegProvWatermark.__table__))
    conn.execute(delete(RegProvenance.__table__))
    # Each test has its own master key file: the vault's keys go, with every row they
    # sealed (the PostgreSQL database is shared with the crawler tests).
    conn.execute(delete(CookieRow.__table__))
    conn.execute(delete(VaultKey.__table__))


@pytest.fixture
def reg(db_engine):
    with db_engine.begin() as conn:
        wipe(conn)
    return db_engine


@pytest.fixture
def key_file(tmp_path):
    return str(tmp_path / "master.key")
