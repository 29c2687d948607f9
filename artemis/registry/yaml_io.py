"""YAML import and export of one provenance.

Format: a top-level ``provenance`` mapping (the ``reg_provenance`` columns) and one list
per dimension named after its table without the ``reg_prov_`` prefix (``endpoint_def``,
``window_offset_cfg``, ``pagination_cfg``, ``http_cfg``, ``batching_cfg``, ``retry_cfg``,
``rate_limit_cfg``, ``credential``), each row with its table's column names and no ids.
A credential names its secret by environment variable (``secret_env: NCBI_API_KEY``), the
second secret of a pair (HTTP Basic's user, an OAuth2 client id) the same way
(``principal_env``), and its endpoint by name (``endpoint_name: efetch``).

Importing again updates the provenance in place: rows match on (table, scope, task type,
effective_from, and the endpoint or credential name); an unchanged file writes nothing;
any refused row (an overlapping interval, a missing secret) leaves the whole file unwritten.

A file is at most ``MAX_FILE_BYTES`` and holds no anchors or aliases: a registry file is
written out plainly, and a small file whose aliases expand to a huge document (the
"billion laughs") is refused before it is built. A credential's ``secret_env`` may not name
one of the service's own variables (``artemis.registry.secret_env``); the report lists
each credential with the origins it will be sent to and how, never its value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from sqlalchemy import delete, select, update
from sqlalchemy.engine import Connection, Engine

from artemis.crawler.vault import CookieVault
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.file_models import HIDDEN, PROVENANCE_COLUMNS, parse_file
from artemis.registry.http_rules import (
    DEFAULT_TOKEN_JSONPATH,
    OAUTH2,
    OAUTH2_REFRESH,
    SESSION,
    TOKEN_AUTH_TYPES,
    TOKEN_USAGE,
    basic_user_problem,
    token_url_problem,
)
from artemis.registry.models import (
    DIMENSIONS,
    DimensionBase,
    RegProvCredential,
    RegProvenance,
    RegProvEndpointDef,
    RegProvTokenState,
    utcnow,
)
from artemis.registry.resolve import as_utc, credential_origins, find_provenance
from artemis.registry.secret_env import check_secret_env, origin, placement
from artemis.registry.writes import (
    Place,
    add_row,
    describe,
    identity_value,
    places,
    shared,
    stored_places,
    update_row,
)
from artemis.sinks.sql import table_name_problem
from artemis.vault import master_key, read_master_keys

# Import order: endpoints before credentials (which may name one).
ORDER = (
    "endpoint_def",
    "window_offset_cfg",
    "pagination_cfg",
    "http_cfg",
    "batching_cfg",
    "retry_cfg",
    "rate_limit_cfg",
    "record_model",
    "credential",
)
# The largest registry file read (a provenance's file is a few KiB).
MAX_FILE_BYTES = 1024 * 1024


@dataclass
class ImportReport:
    provenance: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: int = 0
    # Each credential of the file: where its secret is sent and how (never the value).
    credentials: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "provenance": self.provenance,
            "created": self.created,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "credentials": self.credentials,
        }


# A credential's variables in the file, by the column each one's value is sealed in.
_SEALED = {
    "secret_env": "secret_ciphertext",
    "principal_env": "principal_ciphertext",
    "client_secret_env": "client_secret_ciphertext",
}


class CredentialBox:
    """Credential secrets sealed by the vault (salted key, key id per row) inside the
    import's own transaction."""

    def __init__(self, conn: Connection, key_file: str) -> None:
        self.conn = conn
        self.vault = CookieVault(conn.engine, master_key(key_file), read_master_keys())

    def seal(self, secret: str) -> tuple[str, str]:
        return self.vault.seal(self.conn, secret)

    def open(self, token: str, key_id: str | None) -> str:
        return self.vault.open(self.conn, token, key_id)


class _AliasRefused(yaml.YAMLError):
    pass


class _PlainLoader(yaml.SafeLoader):
    """The safe loader without anchors and aliases (refused where the first one stands)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            raise _AliasRefused(
                f"YAML anchors and aliases are not accepted ({sign}{event.anchor} at line "
                f"{line}): write each value out"
            )
        return super().compose_node(parent, index)


def check_size(size: int, source: str) -> None:
    """Refuse a file over ``MAX_FILE_BYTES`` (``size`` in bytes)."""
    if size > MAX_FILE_BYTES:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{source}: {size} bytes, over the registry file limit of {MAX_FILE_BYTES} "
            "bytes (1 MiB): one provenance per file",
        )


def _load(text: str, source: str) -> dict[str, Any]:
    check_size(len(text.encode("utf-8", "surrogatepass")), source)
    try:
        data = yaml.load(text, Loader=_PlainLoader)  # a SafeLoader
    except _AliasRefused as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{source}: {e}") from None
    except yaml.YAMLError as e:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"{source}: not valid YAML: {e}") from None
    return parse_file(data, source)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, datetime) or isinstance(b, datetime):
        return a is not None and b is not None and as_utc(a) == as_utc(b)
    return a == b


def import_yaml(engine: Engine, text: str, key_file: str, source: str = "<yaml>") -> ImportReport:
    data = _load(text, source)
    with engine.begin() as conn:  # one transaction: all of the file or nothing
        return _import(conn, data, CredentialBox(conn, key_file), source)


def _import(
    conn: Connection, data: dict[str, Any], box: CredentialBox, source: str
) -> ImportReport:
    prov_in = data["provenance"]
    code = prov_in["provenance_code"]
    report = ImportReport(code)
    pt = RegProvenance.__table__  # type: ignore[attr-defined]
    existing = conn.execute(select(pt).where(pt.c.provenance_code == code)).first()
    values = {**prov_in, "provenance_name": prov_in.get("provenance_name") or code}
    # On every import: a file may bring a resource, or move one to another place.
    _refuse_shared_tables(conn, code, data)
    if existing is None:
        now = utcnow()
        key = conn.execute(
            pt.insert().values(**values, created_at=now, updated_at=now)
        ).inserted_primary_key
        assert key is not None
        pid = key[0]
        report.created.append(f"reg_provenance {code}")
    else:
        pid = existing.id
        changed = {k: v for k, v in values.items() if not _same(existing._mapping[k], v)}
        if changed:
            conn.execute(update(pt).where(pt.c.id == pid).values(**changed, updated_at=utcnow()))
            report.updated.append(f"reg_provenance {code}: {', '.join(sorted(changed))}")
        else:
            report.unchanged += 1
    credentials: list[tuple[str | None, dict[str, Any]]] = []
    for dim in ORDER:
        model = DIMENSIONS[dim]
        for i, raw in enumerate(data.get(dim) or []):
            where = f"{source}: {dim}[{i}]"
            row = dict(raw)
            try:
                _import_row(conn, model, pid, row, box, report)
            except ArtemisError as e:
                raise ArtemisError(e.code, f"{where}: {e.message}", details=e.details) from None
            if model is RegProvCredential:
                credentials.append((raw.get("endpoint_name"), row))
    _check_token_endpoints(conn, pid, data, source)
    _check_token_origins(conn, pid, credentials, source)
    # After every row is in: the origins come from the file's http_cfg and provenance.
    report.credentials = [_destination(conn, pid, ep, row) for ep, row in credentials]
    return report


def _token_endpoints(conn: Connection, pid: int) -> list[Any]:
    t = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    return list(
        conn.execute(
            select(t).where(t.c.provenance_id == pid, t.c.endpoint_usage_code == TOKEN_USAGE)
        ).fetchall()
    )


def _check_token_endpoints(conn: Connection, pid: int, data: dict[str, Any], source: str) -> None:
    """An OAuth2 client needs a TOKEN endpoint to get its access tokens from, is not bound
    to it, and that endpoint is asked by POST at an https URL (http on loopback only)
    without a login in it."""
    for i, ep in enumerate(data.get("endpoint_def") or []):
        if ep.get("endpoint_usage_code") != TOKEN_USAGE:
            continue
        where = f"{source}: endpoint_def[{i}]"
        if ep.get("http_method_code", "POST") != "POST":
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{where}: a TOKEN endpoint is asked by POST (RFC 6749 §3.2), not "
                f"{ep['http_method_code']}",
            )
        path = ep.get("path_template") or ""
        if "://" in path:
            why = token_url_problem(path, "path_template")
            if why:
                raise ArtemisError(ErrorCode.INVALID_INPUT, f"{where}: {why}")
    tokens = _token_endpoints(conn, pid)
    for i, cred in enumerate(data.get("credential") or []):
        kind = cred.get("auth_type_code")
        if kind not in TOKEN_AUTH_TYPES:
            continue
        where = f"{source}: credential[{i}]"
        if not tokens:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{where}: {kind} needs an endpoint_def row with endpoint_usage_code "
                f"{TOKEN_USAGE} (where its tokens are fetched)",
            )
        if cred.get("endpoint_name") in {t.endpoint_name for t in tokens}:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{where}: endpoint_name binds the credential to the endpoint its token "
                f"is for, not to the {TOKEN_USAGE} endpoint (leave it out for every "
                "endpoint)",
            )
        typed = [t.endpoint_name for t in tokens if t.request_content_type]
        if kind != SESSION and typed:
            # RFC 6749 §4.4.2 and §6: an OAuth2 token request is a form, always.
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{where}: {kind} asks its {TOKEN_USAGE} endpoint {typed[0]!r} with a form "
                "(RFC 6749); request_content_type there is for SESSION_TOKEN logins: "
                "leave it out",
            )


def _check_token_origins(
    conn: Connection,
    pid: int,
    credentials: list[tuple[str | None, dict[str, Any]]],
    source: str,
) -> None:
    """A TOKEN endpoint written as a path is on the source's base URL: an OAuth2 client
    whose base URL is ``http://`` to another host than loopback would send its secret
    there in clear, as an ``http://`` token URL would."""
    paths = [
        ep.path_template or ""
        for ep in _token_endpoints(conn, pid)
        if "://" not in (ep.path_template or "")
    ]
    if not paths:
        return
    for i, (_, row) in enumerate(credentials):
        if row.get("auth_type_code") not in TOKEN_AUTH_TYPES:
            continue
        for base in credential_origins(conn, pid, row):
            for path in paths:
                why = token_url_problem(
                    f"{base}{path}", "the TOKEN endpoint (path_template after the base URL)"
                )
                if why:
                    raise ArtemisError(ErrorCode.INVALID_INPUT, f"{source}: credential[{i}]: {why}")


def _refuse_shared_tables(conn: Connection, code: str, data: dict[str, Any]) -> None:
    """Two places whose tables are one would write two sources into one table: ``my-shop``
    and ``my_shop`` (one name), ``Shop`` and ``shop`` (SQLite's names ignore case; so do
    the folders of a case-insensitive file system), or two tables PostgreSQL would cut to
    the same 63 bytes (a name past them is refused). Every place of the file (its code's,
    each resource's) is checked against each other and every other provenance's."""
    mine = places(code, data.get("endpoint_def") or [])
    for place in mine:
        why = table_name_problem(place.table)
        if why is not None:
            raise ArtemisError(ErrorCode.INVALID_INPUT, _too_long(place, why))
    others = [p for other, found in stored_places(conn).items() if other != code for p in found]
    for i, place in enumerate(mine):
        for theirs in [*mine[:i], *others]:
            if not shared(place, theirs):
                continue
            case = (
                "" if theirs.table == place.table else ": table names are one whatever their case"
            )
            if place.resource is None:
                who, fix = f"provenance_code {code!r}: its default table", "pick another code"
            else:
                who = f"endpoint_def: resource {place.resource!r}: its place {place.name!r}, table"
                fix = f"give resource {place.resource!r} another output_name"
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"{who} {place.table!r} is {theirs.owner()} ({theirs.table!r}{case}); {fix}",
            )


def _too_long(place: Place, why: str) -> str:
    if place.resource is None:
        return f"provenance_code {place.code!r}: its default table: {why}; pick a shorter code"
    return (
        f"endpoint_def: resource {place.resource!r}: its place {place.name!r}: {why}; give "
        "it a shorter output_name"
    )


def _destination(
    conn: Connection, pid: int, endpoint_name: str | None, row: dict[str, Any]
) -> dict[str, Any]:
    """Where a credential's secret goes: the origins, the endpoint it is bound to (None:
    every endpoint of the provenance) and the query parameter or header it rides in. The
    secrets of an OAuth2 client, a refresh token or a login go to its TOKEN endpoint's
    origins only; the token it gets goes where another key would (``token_sent_to``)."""
    where, name = placement(row)
    kind = row.get("auth_type_code")
    how = f"query parameter {name}" if where == "query" else f"header {name}"
    if kind in ("BEARER", OAUTH2, OAUTH2_REFRESH) or (
        kind == SESSION and name.lower() == "authorization"
    ):
        how += " (Bearer)"
    elif kind == "BASIC":
        how += " (Basic, with the user of principal_env)"
    out = {
        "credential": row.get("credential_name"),
        "secret_env": row.get("secret_env_name"),
        "endpoint": endpoint_name,
        "sent_to": credential_origins(conn, pid, row),
        "as": how,
    }
    for var in ("principal_env", "client_secret_env"):
        if row.get(f"{var}_name"):
            out[var] = row[f"{var}_name"]
    if kind in TOKEN_AUTH_TYPES:
        token_origins = set()
        for ep in _token_endpoints(conn, pid):
            path = ep.path_template or ""
            if "://" in path:
                token_origins.add(origin(path))
            else:
                token_origins.update(credential_origins(conn, pid, row))
        out["token_sent_to"], out["sent_to"] = out["sent_to"], sorted(token_origins)
        out["as"] = f"{_token_request(row)} as {how}"
    return out


def _token_request(row: dict[str, Any]) -> str:
    """What a token credential sends to its TOKEN endpoint, how, and what it gets."""
    kind = row.get("auth_type_code")
    if kind == SESSION:
        path = row.get("token_jsonpath") or DEFAULT_TOKEN_JSONPATH
        return f"a login to the {TOKEN_USAGE} endpoint (its token at {path}); its session token"
    by = row.get("token_auth_method_code") or "CLIENT_SECRET_BASIC"
    what = "a refresh token and its client" if kind == OAUTH2_REFRESH else "client credentials"
    return f"{what} to the {TOKEN_USAGE} endpoint ({by}); its access token"


def _import_row(
    conn: Connection,
    model: type[DimensionBase],
    pid: int,
    raw: dict[str, Any],
    box: CredentialBox,
    report: ImportReport,
) -> None:
    values: dict[str, str] = {}
    if model is RegProvCredential:
        values = _credential_values(conn, pid, raw)
    raw["provenance_id"] = pid
    for key in ("effective_from", "effective_to"):
        if raw.get(key) is not None:
            raw[key] = as_utc(raw[key])
    current = _current_row(conn, model, pid, raw)
    if current is None:
        for column, value in values.items():
            # Sealed in one transaction, so all under the one key the row names.
            raw[column], raw["encryption_key_id"] = box.seal(value)
        new_id = add_row(conn, model, raw)
        report.created.append(describe(model, {**raw, "id": new_id}))
        return
    cur = current._mapping
    changed = _changed_columns(model, cur, raw)
    if model is RegProvCredential and _reseal_if_changed(box, cur, values, changed):
        # A new refresh token (a new authorization): the one the state holds, rotated
        # from the old, is not this one's; the next refresh starts from the new.
        ts = RegProvTokenState.__table__  # type: ignore[attr-defined]
        conn.execute(delete(ts).where(ts.c.credential_id == cur["id"]))
    if changed:
        update_row(conn, model, cur["id"], changed)
        report.updated.append(f"{describe(model, current)}: {', '.join(sorted(changed))}")
    else:
        report.unchanged += 1


def _credential_values(conn: Connection, pid: int, raw: dict[str, Any]) -> dict[str, str]:
    """A credential row's secrets by the column they are sealed in, read from the
    variables it names (their names kept in the row), and its endpoint's id in place of
    its name."""
    values: dict[str, str] = {}
    for var, column in _SEALED.items():
        env = raw.pop(var, None)
        if var != "secret_env":
            # The file is the whole row: a variable it leaves out is none.
            raw[f"{var}_name"] = env
        if not env:
            continue
        values[column] = _read_env(env, var)
        raw[f"{var}_name"] = env
    why = (
        basic_user_problem(values["principal_ciphertext"])
        if raw.get("auth_type_code") == "BASIC" and "principal_ciphertext" in values
        else None
    )
    if why:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"principal_env {raw['principal_env_name']}: {why}"
        )
    ep_name = raw.pop("endpoint_name", None)
    raw["endpoint_id"] = _endpoint_id(conn, pid, ep_name, raw) if ep_name else None
    return values


def _current_row(
    conn: Connection, model: type[DimensionBase], pid: int, raw: dict[str, Any]
) -> Any:
    """The stored row the file's row is (same scope, task type, start and identity), if
    any; a row without a start is always new."""
    t = model.__table__  # type: ignore[attr-defined]
    match = [
        t.c.provenance_id == pid,
        t.c.scope_code == raw.get("scope_code"),
        t.c.task_type_key == (raw.get("task_type") or "ALL"),
        t.c.effective_from == raw.get("effective_from"),
    ]
    match += [t.c[c] == identity_value(raw, c) for c in model.identity]
    return conn.execute(select(t).where(*match)).first() if raw.get("effective_from") else None


def _changed_columns(model: type[DimensionBase], cur: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """The columns the file's row changes in the stored row ``cur``."""
    t = model.__table__  # type: ignore[attr-defined]
    changed = {k: v for k, v in raw.items() if not _same(cur.get(k), v)}
    # Columns the file leaves out go back to NULL (the file is the whole row).
    for col in t.c.keys():
        if (
            col not in raw
            and col not in HIDDEN
            and col not in ("secret_env_name",)
            and cur[col] is not None
            and t.c[col].default is None
            and t.c[col].nullable
        ):
            changed[col] = None
    return changed


def _reseal_if_changed(
    box: CredentialBox, cur: Any, values: dict[str, str], changed: dict[str, Any]
) -> bool:
    """A stored credential whose secrets differ from the variables' gets them all sealed
    again (into ``changed``); True when its secret itself changed."""
    old = {
        column: box.open(cur[column], cur["encryption_key_id"])
        for column in _SEALED.values()
        if cur[column]
    }
    if old == values:
        return False
    # All sealed again, under one key (the row names one).
    for column in _SEALED.values():
        changed[column] = None
        if column in values:
            changed[column], changed["encryption_key_id"] = box.seal(values[column])
    if not values:
        changed["encryption_key_id"] = None
    return old.get("secret_ciphertext") != values.get("secret_ciphertext")


def _read_env(env: str, field: str) -> str:
    """The value of a credential's variable at import (refused when it is one of the
    service's own, or unset)."""
    check_secret_env(env, label=field)
    value = os.environ.get(env)
    if not value:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT, f"environment variable {env} ({field}) is not set"
        )
    return value


def _endpoint_id(conn: Connection, pid: int, name: str, raw: dict[str, Any]) -> int:
    t = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    rows = conn.execute(
        select(t)
        .where(t.c.provenance_id == pid, t.c.endpoint_name == name)
        .order_by(t.c.effective_from.desc(), t.c.id.desc())
    ).fetchall()
    if not rows:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"endpoint_name {name!r} is not defined")
    start = as_utc(raw["effective_from"]) if raw.get("effective_from") else None
    for r in rows:  # the endpoint row in force when the credential starts, else the newest
        if (
            start
            and as_utc(r.effective_from) <= start
            and (r.effective_to is None or as_utc(r.effective_to) > start)
        ):
            return r.id
    return rows[0].id


def export_yaml(engine: Engine, code: str) -> str:
    with engine.connect() as conn:
        prov = find_provenance(conn, code)
        out: dict[str, Any] = {
            "provenance": {
                k: prov._mapping[k] for k in PROVENANCE_COLUMNS if prov._mapping[k] is not None
            }
        }
        et = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
        names = {
            r.id: r.endpoint_name
            for r in conn.execute(
                select(et.c.id, et.c.endpoint_name).where(et.c.provenance_id == prov.id)
            )
        }
        for dim in ORDER:
            t = DIMENSIONS[dim].__table__  # type: ignore[attr-defined]
            rows = conn.execute(
                select(t)
                .where(t.c.provenance_id == prov.id)
                .order_by(t.c.scope_code, t.c.task_type_key, t.c.effective_from, t.c.id)
            ).fetchall()
            if not rows:
                continue
            items = []
            for r in rows:
                m = r._mapping
                item = {}
                for k in t.c.keys():
                    # The provenance's own resource is the one a file names none for.
                    if k in HIDDEN or m[k] is None or (k == "resource_name" and not m[k]):
                        continue
                    v = m[k]
                    item[k] = (
                        as_utc(v).isoformat().replace("+00:00", "Z")
                        if isinstance(v, datetime)
                        else v
                    )
                if dim == "credential":
                    if m["endpoint_id"] is not None:
                        item["endpoint_name"] = names[m["endpoint_id"]]
                    if m["secret_env_name"]:
                        item["secret_env"] = m["secret_env_name"]
                    for name in ("principal_env", "client_secret_env"):
                        if m[f"{name}_name"]:
                            item[name] = m[f"{name}_name"]
                items.append(item)
            out[dim] = items
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)
