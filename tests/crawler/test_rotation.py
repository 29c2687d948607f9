"""Rotating the master key on a running cluster (docs/operations.md): during the switch
the old and the new key both read — cookies and credential secrets, run secrets, Temporal
payloads — while everything new is written under the new one; afterwards `rotate-key`
has moved the stored secrets and the old key can go."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from temporalio.api.common.v1 import Payload

from artemis.crawler.cookies import add_cookie
from artemis.crawler.models import CookieRow
from artemis.crawler.vault import CookieVault
from artemis.errors import ArtemisError
from artemis.migrate import upgrade
from artemis.temporal.codec import FernetPayloadCodec
from artemis.vault import RunSecrets, derive_multi, master_keys

OLD = b"old-master-key-0123456789-abcdefghijklmnop"
NEW = b"new-master-key-9876543210-zyxwvutsrqponmlk"


def _cookie(engine, vault: CookieVault) -> str:
    with engine.connect() as conn:
        row = conn.execute(select(CookieRow.__table__)).first()
    return vault.decrypt(row.cookie_encrypted, row.encryption_key_id)


def test_cookies_read_under_both_keys_during_the_switch_and_under_the_new_alone_after(crawl_db):
    add_cookie(CookieVault(crawl_db, OLD), "p", "a", "web_session=s1", 1)
    # the switch: COOKIE_MASTER_KEY=NEW, COOKIE_MASTER_KEYS_READ=OLD
    switching = CookieVault(crawl_db, NEW, [OLD])
    assert _cookie(crawl_db, switching) == "web_session=s1"
    with pytest.raises(ArtemisError, match="another master key"):
        _cookie(crawl_db, CookieVault(crawl_db, NEW))  # the new key alone: not yet
    switching.rotate(NEW)  # `artemis cookies rotate-key --new-master-key-env …`
    assert _cookie(crawl_db, CookieVault(crawl_db, NEW)) == "web_session=s1"


def test_run_secrets_read_under_both_keys_then_move_to_the_new(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(db)
    RunSecrets(db, masters=[OLD]).put("code/t1", "callback_token", "tok-1")
    monkeypatch.setenv("COOKIE_MASTER_KEY", NEW.decode())
    monkeypatch.setenv("COOKIE_MASTER_KEYS_READ", OLD.decode())
    assert master_keys() == [NEW, OLD]
    switching = RunSecrets(db)
    assert switching.get("code/t1", "callback_token") == "tok-1"
    switching.put("code/t2", "callback_token", "tok-2")  # new ones under NEW
    assert RunSecrets(db, masters=[NEW]).get("code/t2", "callback_token") == "tok-2"
    assert switching.rotate_all() == 2
    assert RunSecrets(db, masters=[NEW]).get("code/t1", "callback_token") == "tok-1"


async def test_payloads_of_old_histories_stay_readable_after_the_switch():
    old = FernetPayloadCodec(derive_multi([OLD], "temporal-payloads"))
    switching = FernetPayloadCodec(derive_multi([NEW, OLD], "temporal-payloads"))
    new_only = FernetPayloadCodec(derive_multi([NEW], "temporal-payloads"))
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b'{"x": 1}')
    written_before = await old.encode([payload])
    assert await switching.decode(written_before) == [payload]
    written_after = await switching.encode([payload])
    assert await new_only.decode(written_after) == [payload]  # new writes use the new key
    with pytest.raises(ValueError, match="COOKIE_MASTER_KEY"):
        await new_only.decode(written_before)
