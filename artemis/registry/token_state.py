"""Where an ``OAUTH2_REFRESH_TOKEN`` credential's live tokens are kept between refreshes:
its row of ``reg_prov_token_state``, sealed by the vault (``RegProvTokenState``).

A refresh token the authorization server rotates on every use (RFC 9700 §4.14.2) is
single-use: the one the credential was imported with is worthless after the first
refresh, and every refresh leaves a new one that must outlive the worker which got it.
It is written back here, sealed, in the transaction that bumps the row's ``version``;
the access token issued with it is kept with it, so that another worker (or this one
after a restart) uses it until it is due instead of refreshing again. The refresh itself
runs under a named lock (``artemis/dblock.py``), one at a time across every worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, literal_column, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from artemis.config import Settings
from artemis.crawler.vault import CookieVault, vault_for
from artemis.db import get_engine, utcnow
from artemis.dblock import DB_NOW
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegProvCredential, RegProvTokenState

_s = RegProvTokenState.__table__  # type: ignore[attr-defined]
_c = RegProvCredential.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Stored:
    """What a credential's state holds, opened (each value registered with the log
    redaction by the vault)."""

    # Refreshes written so far; 0: none (the credential's own refresh token is current).
    version: int
    refresh_token: str
    access_token: str | None = None
    access_shape: str | None = None
    # Seconds from now (the database's clock) until the access token is due for renewal
    # and until it expires; None: the authorization server gave no lifetime.
    renew_in: float | None = None
    expires_in: float | None = None


@dataclass(frozen=True)
class Issued:
    """What a refresh answered, to be written back."""

    refresh_token: str
    # None: the answer had none (the refresh token is kept all the same)
    access_token: str | None
    access_shape: str
    renew_in: float | None = None
    expires_in: float | None = None


class TokenState:
    """The state row of credential ``credential_id``."""

    def __init__(self, settings: Settings, credential_id: int) -> None:
        self.settings = settings
        self.engine = get_engine(settings.database.url)
        self.credential_id = credential_id
        self._now: ColumnElement[Any] = literal_column(DB_NOW[self.engine.dialect.name])
        self._vault: CookieVault | None = None

    def vault(self) -> CookieVault:
        if self._vault is None:
            self._vault = vault_for(self.settings)
        return self._vault

    def read(self) -> Stored:
        """The refresh token in force and the access token last issued: the state row's,
        else the credential's own refresh token (its ``secret_env``), read afresh so that
        a new one imported since this worker last looked is the one used."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(
                    _s.c.version,
                    _s.c.refresh_token_ciphertext,
                    _s.c.access_token_ciphertext,
                    _s.c.encryption_key_id,
                    _s.c.access_shape,
                    (_s.c.access_renew_at - self._now).label("renew_in"),
                    (_s.c.access_expires_at - self._now).label("expires_in"),
                ).where(_s.c.credential_id == self.credential_id)
            ).first()
            if row is None:
                return Stored(0, self._own_refresh_token(conn))
            vault, key = self.vault(), row.encryption_key_id
            access = row.access_token_ciphertext
            return Stored(
                version=row.version,
                refresh_token=vault.open(conn, row.refresh_token_ciphertext, key),
                access_token=vault.open(conn, access, key) if access else None,
                access_shape=row.access_shape,
                renew_in=_seconds(row.renew_in),
                expires_in=_seconds(row.expires_in),
            )

    def _own_refresh_token(self, conn: Connection) -> str:
        row = conn.execute(
            select(_c.c.secret_ciphertext, _c.c.encryption_key_id).where(
                _c.c.id == self.credential_id
            )
        ).first()
        if row is None or not row.secret_ciphertext:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"credential {self.credential_id} has no refresh token (secret_env)",
                retryable=False,
            )
        return self.vault().open(conn, row.secret_ciphertext, row.encryption_key_id)

    def save(self, version: int, issued: Issued) -> bool:
        """Write what a refresh from state ``version`` issued, sealed; False when the
        state is no longer that version (a lock lost, a new refresh token imported
        meanwhile): nothing is written."""
        try:
            with self.engine.begin() as conn:
                return self._write(conn, version, issued)
        except IntegrityError:
            # Another writer made the first row meanwhile (the unique credential_id).
            return False

    def _write(self, conn: Connection, version: int, issued: Issued) -> bool:
        vault = self.vault()
        # Sealed in one transaction: both under the one key the row names.
        refresh, key = vault.seal(conn, issued.refresh_token)
        access = None
        if issued.access_token is not None:
            access, key = vault.seal(conn, issued.access_token)
        values = {
            "version": version + 1,
            "refresh_token_ciphertext": refresh,
            "access_token_ciphertext": access,
            "encryption_key_id": key,
            "access_shape": issued.access_shape,
            "access_renew_at": _at(self._now, issued.renew_in),
            "access_expires_at": _at(self._now, issued.expires_in),
            "updated_at": utcnow(),
        }
        if version == 0:
            conn.execute(insert(_s).values(credential_id=self.credential_id, **values))
            return True
        done = conn.execute(
            update(_s)
            .where(_s.c.credential_id == self.credential_id, _s.c.version == version)
            .values(**values)
        )
        return done.rowcount == 1


def _at(now: ColumnElement[Any], seconds: float | None) -> ColumnElement[Any] | None:
    """``seconds`` from now on the database's clock (None stays None)."""
    return None if seconds is None else now + max(0.0, seconds)


def _seconds(value: Any) -> float | None:
    # PostgreSQL's clock arithmetic may answer a Decimal.
    return None if value is None else float(value)
