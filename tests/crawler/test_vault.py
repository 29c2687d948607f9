"""The cookie vault: salted keys, key ids per row, rotation with MultiFernet, and the
`artemis cookies` commands (the value comes from stdin and is never printed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from artemis.crawler.cookies import CookiePool, add_cookie, list_cookies
from artemis.crawler.models import CookieRow, VaultKey
from artemis.crawler.vault import CookieVault
from artemis.db import utcnow
from artemis.errors import ArtemisError, ErrorCode
from tests.helpers import artemis_cli

ROOT = Path(__file__).resolve().parents[2]
OLD = b"old-master-key-0123456789-abcdefghijklmnop"
NEW = b"new-master-key-9876543210-zyxwvutsrqponmlk"


def test_rows_name_their_key_and_rotation_leaves_only_the_new_key(crawl_db):
    vault = CookieVault(crawl_db, OLD)
    for i in range(3):
        add_cookie(vault, "xhs", f"acct-{i}", f"web_session=secret{i}; a1=x{i}")
    with crawl_db.connect() as conn:
        rows = conn.execute(select(CookieRow.__table__)).all()
        keys = conn.execute(select(VaultKey.__table__)).all()
    assert len(keys) == 1 and {r.encryption_key_id for r in rows} == {keys[0].key_id}
    assert all("secret" not in r.cookie_encrypted for r in rows)
    assert "salt" not in keys[0].master_check and len(keys[0].salt) >= 16
    assert vault.decrypt(rows[0].cookie_encrypted, rows[0].encryption_key_id) == (
        "web_session=secret0; a1=x0"
    )

    result = CookieVault(crawl_db, OLD).rotate(NEW)
    assert result.rows == 3 and result.retired == [keys[0].key_id]
    with crawl_db.connect() as conn:
        rows = conn.execute(select(CookieRow.__table__).order_by(CookieRow.id)).all()
        live = conn.execute(select(VaultKey.key_id).where(VaultKey.retired_at.is_(None))).all()
    assert [k for (k,) in live] == [result.new_key_id]
    fresh = CookieVault(crawl_db, NEW)  # the new master alone
    assert [fresh.decrypt(r.cookie_encrypted, r.encryption_key_id) for r in rows] == [
        f"web_session=secret{i}; a1=x{i}" for i in range(3)
    ]
    with pytest.raises(ArtemisError) as e:
        CookieVault(crawl_db, OLD).decrypt(rows[0].cookie_encrypted, rows[0].encryption_key_id)
    assert e.value.code == ErrorCode.CONFIG_ERROR and "another master key" in e.value.message

    # Renewing under the same master: a new salt, a new key id, same values.
    again = fresh.rotate()
    with crawl_db.connect() as conn:
        row = conn.execute(select(CookieRow.__table__).order_by(CookieRow.id)).first()
    assert row.encryption_key_id == again.new_key_id != result.new_key_id
    assert fresh.decrypt(row.cookie_encrypted, row.encryption_key_id).startswith("web_session=")
    lease = CookiePool(crawl_db).acquire("xhs", utcnow())
    assert lease.key_id == again.new_key_id


def test_bad_master_keys_and_bad_cookies_are_refused_clearly(crawl_db):
    with pytest.raises(ArtemisError) as e:
        CookieVault(crawl_db, b"short")
    assert e.value.code == ErrorCode.CONFIG_ERROR and "COOKIE_MASTER_KEY" in e.value.message
    vault = CookieVault(crawl_db, OLD)
    for bad in ("", "no pairs here", "=novalue", "web_session=a\nb=c"):
        with pytest.raises(ArtemisError) as e:
            add_cookie(vault, "xhs", "n", bad)
        assert e.value.code == ErrorCode.INVALID_INPUT and "cookie" in e.value.message
    assert add_cookie(vault, "xhs", "n", "web_session=v1") == "created"
    assert add_cookie(vault, "xhs", "n", "web_session=v2", priority=3) == "replaced"
    listed = list_cookies(crawl_db)
    assert len(listed) == 1 and listed[0]["priority"] == 3
    assert all("v2" not in str(v) for v in listed[0].values())


def _cli(*args: str, config: Path, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
    return artemis_cli(*args, "--config", str(config), stdin=stdin, env={"COLUMNS": "200", **env})


def test_cookie_commands_read_stdin_and_never_print_the_value(tmp_path):
    from artemis.migrate import upgrade

    db = f"sqlite:///{tmp_path / 'c.db'}"
    upgrade(db)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"database": {"url": db}}))
    master = {"COOKIE_MASTER_KEY": OLD.decode()}
    added = _cli(
        "cookies",
        "add",
        "--platform",
        "xhs",
        "--name",
        "acct-1",
        "--priority",
        "2",
        config=config,
        stdin="web_session=TOPSECRET-1; a1=z\n",
        **master,
    )
    assert added.returncode == 0, added.stderr
    assert "created" in added.stdout and "TOPSECRET" not in added.stdout + added.stderr
    empty = _cli("cookies", "add", "--platform", "xhs", "--name", "x", config=config, **master)
    assert empty.returncode == 1 and "stdin" in empty.stderr
    listed = _cli("cookies", "list", config=config, **master)
    assert listed.returncode == 0 and "acct-1" in listed.stdout and "active" in listed.stdout
    assert "TOPSECRET" not in listed.stdout
    rotated = _cli(
        "cookies",
        "rotate-key",
        "--new-master-key-env",
        "NEXT_KEY",
        config=config,
        NEXT_KEY=NEW.decode(),
        **master,
    )
    assert rotated.returncode == 0, rotated.stderr
    assert '"rows": 1' in rotated.stdout and "TOPSECRET" not in rotated.stdout
    from artemis.db import get_engine

    engine = get_engine(db)
    with engine.connect() as conn:
        row = conn.execute(select(CookieRow.__table__)).first()
    assert CookieVault(engine, NEW).decrypt(row.cookie_encrypted, row.encryption_key_id) == (
        "web_session=TOPSECRET-1; a1=z"
    )
    disabled = _cli("cookies", "disable", "acct-1", config=config, **master)
    assert disabled.returncode == 0
    missing = _cli("cookies", "disable", "nobody", config=config, **master)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr + missing.stdout
