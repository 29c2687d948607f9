"""A migrated registry database per test module (SQLite file; PostgreSQL when available)."""

from __future__ import annotations

import pytest
from sqlalchemy import delete

from artemis.crawler.models import CookieRow, VaultKey
from artemis.db import get_engine
from artemis.migrate import upgrade
from artemis.registry.models import DIMENSIONS, RegProvenance, RegProvWatermark


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def reg_engine(request, tmp_path_factory):
    """The registry's tests run on SQLite and on a real PostgreSQL alike."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('registry') / 'reg.db'}"
    else:
        url = request.getfixturevalue("pg_server").url
    upgrade(url)
    return get_engine(url)


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
def reg(reg_engine):
    with reg_engine.begin() as conn:
        wipe(conn)
    return reg_engine


@pytest.fixture
def key_file(tmp_path):
    return str(tmp_path / "master.key")
