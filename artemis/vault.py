"""Encryption of secrets at rest (Fernet). The key comes from ``COOKIE_MASTER_KEY`` or,
for the embedded dev stack only, a key file generated in the data folder (docs/operations.md: every
process of a cluster must share one key, so nothing else may make one up)."""

from __future__ import annotations

import base64
import os
import secrets
from datetime import datetime
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy import bindparam, delete, or_, select, update
from sqlalchemy.engine import Connection

from artemis.config import DEFAULT_MASTER_KEY_FILE
from artemis.db import RunSecret, get_engine, transaction, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode

MASTER_KEY_ENV = "COOKIE_MASTER_KEY"
# Other master keys accepted for reading during a rotation (comma-separated): what they
# encrypted (payloads in histories, run secrets, vault keys) stays readable while
# everything new is written under COOKIE_MASTER_KEY.
PREVIOUS_KEYS_ENV = "COOKIE_MASTER_KEYS_READ"
MAKE_A_KEY = "python -c 'import secrets; print(secrets.token_urlsafe(48))'"

# Only the embedded stack (`artemis dev` / `demo`, the test suite) may generate a key file.
_generate_key_file = False


def allow_generated_key_file() -> None:
    """The embedded one-machine stack: a missing key file may be generated."""
    global _generate_key_file
    _generate_key_file = True


def master_key_missing() -> str:
    return (
        f"{MASTER_KEY_ENV} is not set: every worker and API process of a cluster needs the "
        f"same master key (at least 32 characters, from your secret store; make one with "
        f"`{MAKE_A_KEY}`). Only the embedded dev stack (artemis dev/demo) generates a key file."
    )


def master_key(key_file: str | os.PathLike[str] = DEFAULT_MASTER_KEY_FILE) -> bytes:
    env = os.environ.get(MASTER_KEY_ENV)
    if env:
        return env.encode()
    path = Path(key_file)
    if not path.exists():
        if not _generate_key_file:
            raise ArtemisError(ErrorCode.CONFIG_ERROR, master_key_missing())
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(48))
    return path.read_bytes().strip()


def read_master_keys() -> list[bytes]:
    raw = os.environ.get(PREVIOUS_KEYS_ENV, "")
    return [k.strip().encode() for k in raw.split(",") if k.strip()]


def master_keys(key_file: str | os.PathLike[str] = DEFAULT_MASTER_KEY_FILE) -> list[bytes]:
    """The current master key first (it encrypts), then the previous ones (they read)."""
    current = master_key(key_file)
    return [current, *(k for k in read_master_keys() if k != current)]


def derive_multi(masters: list[bytes], purpose: str) -> MultiFernet:
    """Encrypts with the first master's key, decrypts with any of them."""
    return MultiFernet([derive_fernet(m, purpose) for m in masters])


def derive_fernet(master: bytes, purpose: str) -> Fernet:
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"artemis-v1", info=purpose.encode()
    ).derive(master)
    return Fernet(base64.urlsafe_b64encode(key))


_SECRETS = RunSecret.__table__  # type: ignore[attr-defined]
# Built once: a run reads its secret and drops it (building costs more than running).
_GET_SECRET = select(_SECRETS.c.ciphertext).where(
    _SECRETS.c.run_key == bindparam("p_run_key"), _SECRETS.c.name == bindparam("p_name")
)
# A run's secrets: under its key, and under the keys of its starts (`{key}@{start}`).
_DROP_SECRETS = delete(_SECRETS).where(
    or_(
        _SECRETS.c.run_key == bindparam("p_run_key"),
        _SECRETS.c.run_key.like(bindparam("p_start_prefix"), escape="/"),
    )
)
# Separates a run's key from the start that wrote its secrets (no task id holds it).
START_SEP = "@"
# The name of a run's CronJob token among its secrets.
CALLBACK_TOKEN = "callback_token"


def _starts_of(run_key: str) -> str:
    """A LIKE pattern (escape "/") for the keys of ``run_key``'s starts."""
    escaped = run_key.replace("/", "//").replace("%", "/%").replace("_", "/_")
    return f"{escaped}{START_SEP}%"


class RunSecrets:
    """Secrets attached to one run, stored encrypted; read back inside activities only."""

    def __init__(
        self,
        database_url: str,
        key_file: str = DEFAULT_MASTER_KEY_FILE,
        masters: list[bytes] | None = None,
    ) -> None:
        self.engine = get_engine(database_url)
        self.fernet = derive_multi(masters or master_keys(key_file), "run-secrets")
        self._insert = upsert_insert(self.engine)

    def rotate_all(self) -> int:
        """Re-encrypt every stored run secret under the first master key (a rotation)."""
        table = RunSecret.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:
            rows = conn.execute(select(table.c.run_key, table.c.name, table.c.ciphertext)).all()
            for r in rows:
                token = self.fernet.rotate(r.ciphertext.encode()).decode()
                conn.execute(
                    update(table)
                    .where(table.c.run_key == r.run_key, table.c.name == r.name)
                    .values(ciphertext=token)
                )
        return len(rows)

    def put(self, run_key: str, name: str, value: str, replace: bool = True) -> None:
        """Store a run's secret; ``replace=False`` keeps one already stored (a repeated
        start of a running task must not swap the secret its run uses)."""
        table = RunSecret.__table__  # type: ignore[attr-defined]
        token = self.fernet.encrypt(value.encode()).decode()
        stmt = self._insert(table).values(
            run_key=run_key, name=name, ciphertext=token, created_at=utcnow()
        )
        if replace:
            stmt = stmt.on_conflict_do_update(
                index_elements=["run_key", "name"], set_={"ciphertext": stmt.excluded.ciphertext}
            )
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=["run_key", "name"])
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def put_many(self, run_key: str, values: dict[str, str]) -> None:
        """Store a start's secrets in one transaction (its key is its own: nothing to keep
        or replace)."""
        table = RunSecret.__table__  # type: ignore[attr-defined]
        now = utcnow()
        rows = [
            {
                "run_key": run_key,
                "name": name,
                "ciphertext": self.fernet.encrypt(value.encode()).decode(),
                "created_at": now,
            }
            for name, value in values.items()
        ]
        with self.engine.begin() as conn:
            conn.execute(self._insert(table), rows)

    def drop_key(self, key: str) -> None:
        """Drop the secrets stored under exactly ``key`` (a refused start's)."""
        table = RunSecret.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:
            conn.execute(delete(table).where(table.c.run_key == key))

    def keys_older_than(self, before: datetime) -> list[str]:
        """The keys with secrets written before ``before`` (candidates for the clean-up)."""
        table = RunSecret.__table__  # type: ignore[attr-defined]
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(table.c.run_key).where(table.c.created_at < before).distinct()
            ).all()
        return [r.run_key for r in rows]

    def get(self, run_key: str, name: str) -> str | None:
        with self.engine.connect() as conn:
            row = conn.execute(_GET_SECRET, {"p_run_key": run_key, "p_name": name}).first()
        if row is None:
            return None
        try:
            return self.fernet.decrypt(row.ciphertext.encode()).decode()
        except InvalidToken:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"run secret {name!r} cannot be decrypted with the current "
                f"master key ({MASTER_KEY_ENV})",
            ) from None

    def drop(self, run_key: str, conn: Connection | None = None) -> None:
        with transaction(self.engine, conn) as c:
            c.execute(_DROP_SECRETS, {"p_run_key": run_key, "p_start_prefix": _starts_of(run_key)})
