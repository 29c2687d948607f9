"""The vault of cookies and registry credential secrets (docs/security.md).

Each encryption key is derived from ``COOKIE_MASTER_KEY`` with HKDF-SHA256 and a random
salt stored in ``tbl_vault_key`` (the key itself is never stored); every encrypted row
names its key in ``encryption_key_id``. :meth:`CookieVault.rotate` makes a new key (from a
new master key, or a fresh salt under the same one) and re-encrypts every cookie with
``MultiFernet.rotate`` (the registry's credential secrets too), after which the old keys
are retired: every row decrypts with the new key alone. Rows written before the vault had
salted keys carry the key id ``hkdf-sha256-v1`` (a fixed salt per purpose); they are read
as such and moved to a salted key by the next rotation. A stored fingerprint (an HMAC of
the master key, never the key) lets a wrong master key be named as such instead of failing
as garbage.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection, Engine

from artemis.config import Settings
from artemis.crawler.models import CookieRow, VaultKey
from artemis.db import get_engine, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.redact import register_secret
from artemis.registry.models import RegProvCredential, RegProvTokenState
from artemis.vault import MASTER_KEY_ENV, derive_multi, master_key, read_master_keys

KDF = "hkdf-sha256"
PURPOSE = b"artemis-cookies"
MIN_MASTER_LEN = 32

_k = VaultKey.__table__  # type: ignore[attr-defined]
_c = CookieRow.__table__  # type: ignore[attr-defined]
_r = RegProvCredential.__table__  # type: ignore[attr-defined]
_t = RegProvTokenState.__table__  # type: ignore[attr-defined]
# What the vault seals: each table, its sealed columns, and the purpose its rows sealed
# before salted keys were read by.
_SEALED = (
    (_c, ("cookie_encrypted",), "artemis-cookies"),
    (
        _r,
        ("secret_ciphertext", "principal_ciphertext", "client_secret_ciphertext"),
        "registry-credentials",
    ),
    (_t, ("refresh_token_ciphertext", "access_token_ciphertext"), "registry-credentials"),
)
# The first scheme: one fixed-salt key per purpose (artemis.vault.derive_fernet).
LEGACY_KEY_ID = "hkdf-sha256-v1"


def _check(master: bytes, salt: str) -> str:
    return hmac.new(master, b"artemis-vault-check:" + salt.encode(), hashlib.sha256).hexdigest()[
        :32
    ]


def _derive(master: bytes, salt: str) -> Fernet:
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=base64.b64decode(salt), info=PURPOSE
    ).derive(master)
    return Fernet(base64.urlsafe_b64encode(key))


@dataclass(frozen=True)
class RotateResult:
    new_key_id: str
    rows: int
    retired: list[str]


class CookieVault:
    def __init__(self, engine: Engine, master: bytes, previous: list[bytes] | None = None) -> None:
        if len(master) < MIN_MASTER_LEN:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"{MASTER_KEY_ENV} must be a random key of at least {MIN_MASTER_LEN} "
                f"characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(48))'`)",
            )
        self.engine = engine
        self.master = master
        # Masters of a rotation in progress (COOKIE_MASTER_KEYS_READ): a vault key made
        # under one of them still opens its rows until `rotate-key` moves them.
        self.previous = [m for m in previous or [] if m != master]
        self._fernets: dict[str, Fernet] = {}

    # -- keys -------------------------------------------------------------------------
    def _fernet(self, row: object, master: bytes | None = None) -> Fernet:
        master = master or self.master
        key_id = row.key_id  # type: ignore[attr-defined]
        if master is self.master and key_id in self._fernets:
            return self._fernets[key_id]
        if row.kdf != KDF:  # type: ignore[attr-defined]
            raise ArtemisError(ErrorCode.CONFIG_ERROR, f"vault key {key_id}: unknown KDF")
        if master is self.master:
            # the master this key was made with: the current one or one being rotated out
            master = next(
                (
                    m
                    for m in (self.master, *self.previous)
                    if hmac.compare_digest(_check(m, row.salt), row.master_check)  # type: ignore[attr-defined]
                ),
                self.master,
            )
            if master is not self.master:
                fernet = _derive(master, row.salt)  # type: ignore[attr-defined]
                self._fernets[key_id] = fernet
                return fernet
        if not hmac.compare_digest(_check(master, row.salt), row.master_check):  # type: ignore[attr-defined]
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"vault key {key_id} was made with another master key: set the "
                f"{MASTER_KEY_ENV} it was created with (or the one `artemis cookies "
                "rotate-key` moved to)",
            )
        fernet = _derive(master, row.salt)  # type: ignore[attr-defined]
        if master is self.master:
            self._fernets[key_id] = fernet
        return fernet

    def _new_key(self, conn: Connection, master: bytes) -> str:
        salt = base64.b64encode(secrets.token_bytes(16)).decode()
        key_id = f"k-{utcnow():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
        conn.execute(
            insert(_k).values(
                key_id=key_id,
                kdf=KDF,
                salt=salt,
                master_check=_check(master, salt),
                created_at=utcnow(),
            )
        )
        return key_id

    def _legacy(self, purpose: str) -> Fernet | MultiFernet:
        return derive_multi([self.master, *self.previous], purpose)

    def _active(self, conn: Connection) -> object:
        row = conn.execute(
            select(_k).where(_k.c.retired_at.is_(None)).order_by(_k.c.created_at.desc()).limit(1)
        ).first()
        if row is None:
            self._new_key(conn, self.master)
            return self._active(conn)
        return row

    def _row(self, conn: Connection, key_id: str) -> object:
        row = conn.execute(select(_k).where(_k.c.key_id == key_id)).first()
        if row is None:
            raise ArtemisError(ErrorCode.CONFIG_ERROR, f"unknown vault key {key_id!r}")
        return row

    # -- values -----------------------------------------------------------------------------
    def encrypt(self, value: str) -> tuple[str, str]:
        """(ciphertext, key id) under the active key."""
        with self.engine.begin() as conn:
            return self.seal(conn, value)

    def seal(self, conn: Connection, value: str) -> tuple[str, str]:
        """:meth:`encrypt` inside the caller's transaction."""
        row = self._active(conn)
        return self._fernet(row).encrypt(value.encode()).decode(), row.key_id  # type: ignore[attr-defined]

    def decrypt(
        self, token: str, key_id: str | None, legacy_purpose: str = "registry-credentials"
    ) -> str:
        """Decrypt inside the activity that uses the value; the value is registered with
        the log redaction before it is returned."""
        with self.engine.connect() as conn:
            return self.open(conn, token, key_id, legacy_purpose)

    def open(
        self,
        conn: Connection,
        token: str,
        key_id: str | None,
        legacy_purpose: str = "registry-credentials",
    ) -> str:
        """:meth:`decrypt` inside the caller's transaction."""
        if key_id in (None, LEGACY_KEY_ID):
            fernet = self._legacy(legacy_purpose)
        else:
            fernet = self._fernet(self._row(conn, key_id))
        try:
            value = fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"a secret under vault key {key_id} does not decrypt with this {MASTER_KEY_ENV}",
            ) from None
        register_secret(value)
        return value

    def rotate(self, new_master: bytes | None = None) -> RotateResult:
        """Re-encrypt every cookie, credential secret and refresh-token state under a new
        key (all or nothing) and retire the old keys. With ``new_master`` the new key
        hangs off it: from then on set ``COOKIE_MASTER_KEY`` to the new master."""
        target = new_master or self.master
        if len(target) < MIN_MASTER_LEN:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR, f"the new master key is shorter than {MIN_MASTER_LEN}"
            )
        with self.engine.begin() as conn:
            old_rows = conn.execute(select(_k).where(_k.c.retired_at.is_(None))).all()
            new_id = self._new_key(conn, target)
            new_fernet = _derive(target, self._row(conn, new_id).salt)  # type: ignore[attr-defined]
            old = {r.key_id: self._fernet(r) for r in old_rows}
            count = 0
            # Cookies, then the registry's credential secrets (legacy rows by purpose), then
            # the tokens a refresh wrote back. The secrets of one row share its key: they
            # move to the new key together.
            for table, columns, purpose in _SEALED:
                count += self._reseal(conn, table, columns, purpose, old, (new_id, new_fernet))
            retired = sorted(old)
            conn.execute(update(_k).where(_k.c.key_id.in_(retired)).values(retired_at=utcnow()))
        self.master = target
        self._fernets.clear()
        return RotateResult(new_id, count, retired)

    def _reseal(
        self,
        conn: Connection,
        table: Any,
        columns: tuple[str, ...],
        purpose: str,
        old: dict[str, Fernet],
        new: tuple[str, Fernet],
    ) -> int:
        """Every row of ``table`` sealed again under the new key; how many."""
        new_id, new_fernet = new
        query = select(table.c.id, table.c.encryption_key_id, *(table.c[c] for c in columns))
        query = query.where(table.c[columns[0]].is_not(None))
        if table is _t:
            # A refresh writing its rotated token meanwhile (PostgreSQL) waits for the
            # rotation, rather than have it overwrite the new token with the old one.
            query = query.with_for_update()
        rows = conn.execute(query).all()
        for r in rows:
            kid = r.encryption_key_id
            if kid in (None, LEGACY_KEY_ID):
                fernet: Fernet | MultiFernet = self._legacy(purpose)
            else:
                if kid not in old:
                    old[kid] = self._fernet(self._row(conn, kid))
                fernet = old[kid]
            values: dict[str, object] = {"encryption_key_id": new_id}
            for column in columns:
                sealed = r._mapping[column]
                if not sealed:
                    continue
                try:
                    values[column] = new_fernet.encrypt(fernet.decrypt(sealed.encode())).decode()
                except InvalidToken:
                    raise ArtemisError(
                        ErrorCode.CONFIG_ERROR,
                        f"{table.name} row {r.id} does not decrypt with its key "
                        f"{kid}: nothing was rotated",
                    ) from None
            if "updated_at" in table.c:
                values["updated_at"] = utcnow()
            conn.execute(update(table).where(table.c.id == r.id).values(**values))
        return len(rows)


def vault_for(settings: Settings) -> CookieVault:
    """The vault of these settings: ``COOKIE_MASTER_KEY``, else (dev stack only) the key
    file ``vault.master_key_file``."""
    return CookieVault(
        get_engine(settings.database.url),
        master_key(settings.vault.master_key_file),
        read_master_keys(),
    )
