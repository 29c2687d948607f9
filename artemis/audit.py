"""`artemis audit` (docs/security.md): prove that no secret is stored or written in
clear. It scans

- the database: every cookie must decrypt with its own key and must not be plaintext;
  every text column of every table is searched for cookie-shaped strings and for the
  known secret values (the decrypted cookies and registry credentials);
- the log files (``logging.file.path`` and its rotated backups);
- Temporal workflow histories (given by the caller, as JSON text).

Besides the secrets, the caller's look at Temporal: a run whose workflow task keeps
failing is a finding too (``note_stuck``), naming the reason and what to do.

Findings name where and what, never the secret. The report is JSON with ``passed``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, String, Text, inspect, select
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from artemis.crawler.models import CookieRow
from artemis.redact import REDACTED
from artemis.registry.models import RegProvCredential, RegProvTokenState

_PATTERNS = [
    (
        "cookie in clear (web_session=…)",
        re.compile(r"web_session=(?!\*\*\*REDACTED)[^;\s\"',&\\]+"),
    ),
    (
        "cookie_value in clear",
        re.compile(r"\"cookie_value\"\s*:\s*\"(?!\*\*\*REDACTED)[^\"]+\""),
    ),
]
MIN_SECRET_LEN = 8


@dataclass
class Finding:
    where: str
    what: str


@dataclass
class AuditReport:
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(
        default_factory=lambda: {"db_values": 0, "cookies": 0, "log_lines": 0, "histories": 0}
    )

    @property
    def passed(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "checked": self.checked,
            "findings": [asdict(f) for f in self.findings],
        }


class Auditor:
    def __init__(self) -> None:
        self.report = AuditReport()
        self._secrets: set[str] = set()

    def know(self, secret: str) -> None:
        """A secret value to look for; for a cookie, each of its values too."""
        parts = [secret]
        if "=" in secret:
            parts += [p.split("=", 1)[1].strip() for p in secret.split(";") if "=" in p]
        for p in parts:
            if len(p) >= MIN_SECRET_LEN and p != REDACTED:
                self._secrets.add(p)

    def scan_text(self, where: str, text: str) -> None:
        for what, pattern in _PATTERNS:
            if pattern.search(text):
                self.report.findings.append(Finding(where, what))
        for secret in self._secrets:
            if secret in text:
                self.report.findings.append(Finding(where, "a known secret value in clear"))
                break

    # -- the database ---------------------------------------------------------------------
    def learn_database_secrets(self, engine: Engine, vault: Any) -> None:
        """Decrypt what is encrypted (to know what to look for); a cookie that does not
        decrypt, or is stored in clear, is a finding itself."""
        t = CookieRow.__table__  # type: ignore[attr-defined]
        with engine.connect() as conn:
            for row in conn.execute(select(t.c.id, t.c.cookie_encrypted, t.c.encryption_key_id)):
                self.report.checked["cookies"] += 1
                where = f"db:tbl_cookie.cookie_encrypted id={row.id}"
                if not row.cookie_encrypted.startswith("gAAAAA"):
                    self.report.findings.append(Finding(where, "not a Fernet token (plaintext?)"))
                    continue
                try:
                    self.know(vault.decrypt(row.cookie_encrypted, row.encryption_key_id))
                except Exception as e:
                    self.report.findings.append(
                        Finding(where, f"does not decrypt with its key: {type(e).__name__}")
                    )
            c = RegProvCredential.__table__  # type: ignore[attr-defined]
            s = RegProvTokenState.__table__  # type: ignore[attr-defined]
            for table, column in (
                (c, "secret_ciphertext"),
                (c, "principal_ciphertext"),
                (c, "client_secret_ciphertext"),
                (s, "refresh_token_ciphertext"),
                (s, "access_token_ciphertext"),
            ):
                for row in conn.execute(
                    select(table.c.id, table.c[column], table.c.encryption_key_id)
                ):
                    if row[1]:
                        try:
                            self.know(vault.open(conn, row[1], row.encryption_key_id))
                        except Exception:
                            self.report.findings.append(
                                Finding(
                                    f"db:{table.name}.{column} id={row.id}",
                                    "does not decrypt with the master key",
                                )
                            )

    def scan_database(self, engine: Engine) -> None:
        names = set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            for table in SQLModel.metadata.sorted_tables:
                if table.name not in names:
                    continue
                cols = [
                    col
                    for col in table.columns
                    if isinstance(col.type, String | Text | JSON)
                    or "JSON" in type(col.type).__name__
                ]
                if not cols:
                    continue
                key = list(table.primary_key.columns)
                q = select(*key, *cols)
                for row in conn.execution_options(yield_per=1000).execute(q):
                    ident = ",".join(str(row._mapping[k.name]) for k in key)
                    for col in cols:
                        value = row._mapping[col.name]
                        if value is None:
                            continue
                        self.report.checked["db_values"] += 1
                        self.scan_text(f"db:{table.name}.{col.name} {ident}", str(value))

    # -- logs and histories ---------------------------------------------------------------
    def scan_logs(self, path: str | Path) -> None:
        base = Path(path)
        files = [base, *sorted(base.parent.glob(base.name + ".*"))] if base.parent.exists() else []
        for f in files:
            if not f.is_file():
                continue
            with f.open(encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    self.report.checked["log_lines"] += 1
                    self.scan_text(f"log:{f}:{n}", line)

    def scan_histories(self, histories: Iterable[tuple[str, str]]) -> None:
        for workflow_id, text in histories:
            self.report.checked["histories"] += 1
            self.scan_text(f"history:{workflow_id}", text)

    # -- runs that do not move --------------------------------------------------------------
    def note_stuck(self, runs: Iterable[dict[str, Any]]) -> None:
        """A finding per run whose workflow task keeps failing (the answer of
        ``artemis.temporal.runs.stuck_runs``), with its reason and what to do."""
        for run in runs:
            self.report.findings.append(
                Finding(
                    f"temporal:{run['workflow_id']}",
                    f"run {run.get('task_id') or run['workflow_id']} is stuck: {run['reason']}; "
                    f"{run['action']}",
                )
            )
