"""Resolution (docs/registry.md): pick, per dimension, the one row in force for a provenance,
a task type and an instant, and assemble them into the run's execution contract.

Rules:
- time: ``effective_from <= at < COALESCE(effective_to, +inf)`` (half-open, UTC);
- scope: a TASK row for the task type wins; else a SOURCE row (no field-level merge);
- ties: ``effective_from DESC, id DESC``;
- endpoints: filtered by usage (SEARCH, DETAIL, ...) and, when given, by name;
- credentials: ACTIVE and not deleted; endpoint-bound before global, TASK before SOURCE,
  ``is_default_preferred`` first, then newest; all of them, in order, for rotation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import (
    DEFAULT_RESOURCE,
    DIMENSIONS,
    TASK_TYPES,
    DimensionBase,
    RegProvCredential,
    RegProvenance,
    RegProvEndpointDef,
    RegProvHttpCfg,
)
from artemis.registry.secret_env import origin

# Columns that hold secrets: never part of a contract, a print-out or an export.
SECRET_COLUMNS = ("secret_ciphertext", "principal_ciphertext", "client_secret_ciphertext")
CONTRACT_KEYS = (
    "endpoint",
    "pagination",
    "window_offset",
    "http",
    "batching",
    "retry",
    "rate_limit",
    "credential",
    "record_model",
)
# The dimensions a named resource has rows of its own in, besides its SEARCH endpoint.
_RESOURCE_KEYS = {
    "pagination": "pagination_cfg",
    "window_offset": "window_offset_cfg",
    "record_model": "record_model",
}
_CFG_FOR_KEY = {
    "pagination": "pagination_cfg",
    "window_offset": "window_offset_cfg",
    "http": "http_cfg",
    "batching": "batching_cfg",
    "retry": "retry_cfg",
    "rate_limit": "rate_limit_cfg",
    "record_model": "record_model",
}


def as_utc(value: datetime | str | None) -> datetime:
    """An instant in UTC (naive values are taken as UTC); None is now."""
    if value is None:
        return datetime.now(UTC)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, f"not an ISO timestamp: {value!r}"
            ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def row_dict(row: Any) -> dict[str, Any]:
    """A row as JSON-ready data, secrets removed."""
    out = {}
    for key, value in dict(row._mapping).items():
        if key in SECRET_COLUMNS:
            continue
        if isinstance(value, datetime):
            value = as_utc(value).isoformat()
        out[key] = value
    if "secret_ciphertext" in dict(row._mapping):
        out["has_secret"] = row._mapping["secret_ciphertext"] is not None
    if "principal_ciphertext" in dict(row._mapping):
        out["has_principal"] = row._mapping["principal_ciphertext"] is not None
    if "client_secret_ciphertext" in dict(row._mapping):
        out["has_client_secret"] = row._mapping["client_secret_ciphertext"] is not None
    return out


def _in_force(table: Any, at: datetime) -> Any:
    return and_(
        table.c.effective_from <= at, or_(table.c.effective_to.is_(None), table.c.effective_to > at)
    )


def current_row(
    conn: Connection,
    model: type[DimensionBase],
    provenance_id: int,
    task_type: str | None,
    at: datetime,
    *filters: Any,
    resource: str = DEFAULT_RESOURCE,
) -> Any | None:
    """A two-step query: the newest TASK row in force, else the newest SOURCE row; of
    ``resource`` in the dimensions a resource has rows of its own in."""
    table = model.__table__  # type: ignore[attr-defined]
    base = [table.c.provenance_id == provenance_id, _in_force(table, at), *filters]
    if "resource_name" in table.c and model is not RegProvEndpointDef:
        base.append(table.c.resource_name == resource)
    order = (table.c.effective_from.desc(), table.c.id.desc())
    if task_type is not None:
        row = conn.execute(
            select(table)
            .where(table.c.scope_code == "TASK", table.c.task_type == task_type, *base)
            .order_by(*order)
            .limit(1)
        ).first()
        if row is not None:
            return row
    return conn.execute(
        select(table).where(table.c.scope_code == "SOURCE", *base).order_by(*order).limit(1)
    ).first()


def credentials_in_order(
    conn: Connection,
    provenance_id: int,
    task_type: str | None,
    at: datetime,
    endpoint_id: int | None,
) -> list[Any]:
    table = RegProvCredential.__table__  # type: ignore[attr-defined]
    scope = table.c.scope_code == "SOURCE"
    if task_type is not None:
        scope = or_(and_(table.c.scope_code == "TASK", table.c.task_type == task_type), scope)
    rows = conn.execute(
        select(table).where(
            table.c.provenance_id == provenance_id,
            table.c.lifecycle_status_code == "ACTIVE",
            table.c.deleted.is_(False),
            _in_force(table, at),
            scope,
            or_(table.c.endpoint_id.is_(None), table.c.endpoint_id == endpoint_id)
            if endpoint_id is not None
            else table.c.endpoint_id.is_(None),
        )
    ).fetchall()

    def rank(r: Any) -> tuple:
        return (
            0 if endpoint_id is not None and r.endpoint_id == endpoint_id else 1,
            0 if r.scope_code == "TASK" else 1,
            0 if r.is_default_preferred else 1,
            -as_utc(r.effective_from).timestamp(),
            -r.id,
        )

    return sorted(rows, key=rank)


def place_of(code: str, resource: dict[str, Any]) -> str:
    """Where a resource lands (its table and folder): ``output_name``, else
    ``{provenance}__{resource}``."""
    return str(resource["endpoint"].get("output_name") or f"{code}__{resource['name']}")


@dataclass
class Contract:
    """Everything one run needs to know about a source, frozen at resolution time."""

    provenance: dict[str, Any]
    task_type: str | None
    at: str
    usage: str
    endpoint: dict[str, Any] | None
    endpoints: dict[str, dict[str, Any]]
    pagination: dict[str, Any] | None
    window_offset: dict[str, Any] | None
    http: dict[str, Any] | None
    batching: dict[str, Any] | None
    retry: dict[str, Any] | None
    rate_limit: dict[str, Any] | None
    credentials: list[dict[str, Any]] = field(default_factory=list)
    # None in the contracts of runs started before the record model was a dimension.
    record_model: dict[str, Any] | None = None
    # A provenance of several resources (docs/registry.md "Resources"): each by name, in
    # an order where a parent comes before its sub-resources (artemis/registry/tree.py).
    # None: the provenance is one resource, the contract's own endpoint.
    resources: dict[str, dict[str, Any]] | None = None

    @property
    def credential(self) -> dict[str, Any] | None:
        return self.credentials[0] if self.credentials else None

    def public(self) -> dict[str, Any]:
        """The printed form: the eight dimensions, each the selected row or null; and a
        provenance of several resources each of them (parents first): its parent, the
        place it lands in and its own endpoint, pagination, record model and window."""
        out = {k: getattr(self, k) for k in CONTRACT_KEYS}
        out["provenance"] = self.provenance
        out["task_type"] = self.task_type
        out["at"] = self.at
        if self.resources:
            code = str(self.provenance.get("provenance_code") or "")
            out["resources"] = {
                name: {
                    "name": name,
                    "parent": res.get("parent"),
                    "place": place_of(code, res),
                    **{k: res.get(k) for k in ("endpoint", *_RESOURCE_KEYS)},
                }
                for name, res in self.resources.items()
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """The contract as a run carries it. Temporal's JSON converter writes a mapping's
        keys sorted, so each record model row also carries its fields' order as a list
        (``field_order``): the model's column order survives the trip."""
        from dataclasses import asdict

        out = asdict(self)
        for row in [out.get("record_model")] + [
            (res or {}).get("record_model") for res in (out.get("resources") or {}).values()
        ]:
            if isinstance(row, dict) and isinstance(row.get("fields_json"), dict):
                # (a contract that crossed once already keeps the order it carried)
                row.setdefault("field_order", field_order(row["fields_json"]))
        return out


def field_order(fields: dict[str, Any], prefix: str = "") -> list[str]:
    """Every field's path in declared order, a struct's own fields after it
    (``["id", "author", "author.name", "price"]``)."""
    out: list[str] = []
    for name, value in fields.items():
        out.append(prefix + name)
        if isinstance(value, dict):
            out += field_order(value, f"{prefix}{name}.")
    return out


def in_field_order(
    fields: dict[str, Any], order: list[str] | None, prefix: str = ""
) -> dict[str, Any]:
    """``fields`` put back in ``order`` (``field_order``'s; a field it does not name last)."""
    if not order:
        return fields
    rank = {path: i for i, path in enumerate(order)}
    names = sorted(fields, key=lambda n: rank.get(prefix + n, len(rank)))
    return {
        n: in_field_order(fields[n], order, f"{prefix}{n}.")
        if isinstance(fields[n], dict)
        else fields[n]
        for n in names
    }


def find_provenance(conn: Connection, code: str) -> Any:
    table = RegProvenance.__table__  # type: ignore[attr-defined]
    row = conn.execute(select(table).where(table.c.provenance_code == code)).first()
    if row is None:
        raise ArtemisError(ErrorCode.INVALID_INPUT, f"unknown provenance {code!r}")
    return row


def resolve_contract(
    conn: Connection,
    code: str,
    task_type: str | None = None,
    at: datetime | str | None = None,
    usage: str = "SEARCH",
    endpoint_name: str | None = None,
) -> Contract:
    when = as_utc(at)
    prov = find_provenance(conn, code)
    ep_table = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    endpoints: dict[str, dict[str, Any]] = {}
    usages = (
        conn.execute(
            select(ep_table.c.endpoint_usage_code)
            .where(ep_table.c.provenance_id == prov.id)
            .distinct()
        )
        .scalars()
        .all()
    )
    for u in sorted(set(usages) | {usage}):
        filters = [ep_table.c.endpoint_usage_code == u]
        if u == "SEARCH":  # a named resource's SEARCH is in ``resources``
            filters.append(ep_table.c.resource_name == DEFAULT_RESOURCE)
        if endpoint_name and u == usage:
            filters.append(ep_table.c.endpoint_name == endpoint_name)
        row = current_row(conn, RegProvEndpointDef, prov.id, task_type, when, *filters)
        if row is not None:
            endpoints[u] = row_dict(row)
    endpoint = endpoints.get(usage)
    dims = {
        key: current_row(conn, DIMENSIONS[cfg], prov.id, task_type, when)
        for key, cfg in _CFG_FOR_KEY.items()
    }
    creds = credentials_in_order(
        conn, prov.id, task_type, when, endpoint["id"] if endpoint else None
    )
    # Then the keys bound to the contract's other endpoints (DETAIL, TOKEN...): a request
    # to one of them carries its own keys first, and never another endpoint's.
    for other in endpoints.values():
        if endpoint is None or other["id"] != endpoint["id"]:
            creds += [
                r
                for r in credentials_in_order(conn, prov.id, task_type, when, other["id"])
                if r.endpoint_id == other["id"]
            ]
    return Contract(
        provenance=row_dict(prov),
        task_type=task_type,
        at=when.isoformat(),
        usage=usage,
        endpoint=endpoint,
        endpoints=endpoints,
        **{k: (row_dict(r) if r is not None else None) for k, r in dims.items()},
        credentials=[row_dict(r) for r in creds],
        resources=resolve_resources(conn, prov.id, task_type, when),
    )


def resolve_resources(
    conn: Connection, provenance_id: int, task_type: str | None, at: datetime
) -> dict[str, dict[str, Any]] | None:
    """The provenance's named resources in force at ``at``, each its SEARCH endpoint and
    its own pagination, record model and window rows (None: it has none, the provenance
    is its one resource). Ordered parents first; a parent that is missing or a cycle is
    left for ``artemis.registry.tree.resource_problems`` to name."""
    ep = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    names = (
        conn.execute(
            select(ep.c.resource_name)
            .where(
                ep.c.provenance_id == provenance_id,
                ep.c.endpoint_usage_code == "SEARCH",
                ep.c.resource_name != DEFAULT_RESOURCE,
                _in_force(ep, at),
            )
            .distinct()
        )
        .scalars()
        .all()
    )
    found: dict[str, dict[str, Any]] = {}
    for name in sorted(names):
        search = current_row(
            conn,
            RegProvEndpointDef,
            provenance_id,
            task_type,
            at,
            ep.c.endpoint_usage_code == "SEARCH",
            ep.c.resource_name == name,
        )
        if search is None:  # (only TASK rows of another task type)
            continue
        own = {
            key: current_row(conn, DIMENSIONS[cfg], provenance_id, task_type, at, resource=name)
            for key, cfg in _RESOURCE_KEYS.items()
        }
        endpoint = row_dict(search)
        found[name] = {
            "name": name,
            "parent": endpoint.get("parent_resource_name"),
            "endpoint": endpoint,
            **{k: (row_dict(r) if r is not None else None) for k, r in own.items()},
        }
    return _parents_first(found) if found else None


def _parents_first(found: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``found`` ordered so that a parent comes before its sub-resources (by name among
    equals); resources in a cycle or under a missing parent come last, in name order."""
    out: dict[str, dict[str, Any]] = {}
    while True:
        ready = [
            n for n, r in found.items() if n not in out and (not r["parent"] or r["parent"] in out)
        ]
        if not ready:
            break
        for name in ready:
            out[name] = found[name]
    out.update({n: r for n, r in found.items() if n not in out})
    return out


# -- merge rules ------------------------------------------------------------------------------
def merge_params(base: dict[str, Any] | None, runtime: dict[str, Any] | None) -> dict[str, Any]:
    """Key-level merge: runtime keys override the base; a None value deletes the key."""
    merged = {**(base or {}), **(runtime or {})}
    return {k: v for k, v in merged.items() if v is not None}


def param_name(
    kind: str,
    endpoint: dict[str, Any] | None,
    cfg: dict[str, Any] | None,
    cfg_column: str,
    default: str,
) -> str:
    """Endpoint-level name > pagination/batching cfg > default (``kind`` e.g. ``page``)."""
    if endpoint and endpoint.get(f"{kind}_param_name"):
        return endpoint[f"{kind}_param_name"]
    if cfg and cfg.get(cfg_column):
        return cfg[cfg_column]
    return default


def base_url(contract: Contract, default: str | None = None) -> str:
    """``http_cfg.base_url_override`` > ``reg_provenance.base_url_default`` > default."""
    url = (
        (contract.http or {}).get("base_url_override")
        or contract.provenance.get("base_url_default")
        or default
    )
    if not url:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"provenance {contract.provenance.get('provenance_code')!r} has no "
            "base URL (http_cfg.base_url_override or base_url_default)",
        )
    return url.rstrip("/")


def credential_origins(conn: Connection, provenance_id: int, cred: dict[str, Any]) -> list[str]:
    """Every origin (``scheme://host:port``) a credential row may be sent to: the base URL
    (``http_cfg.base_url_override`` > ``base_url_default``) of each contract that can offer
    it, over its interval and the task types its scope covers. A run sends a credential
    only to its contract's base origin, and that base changes only where an ``http_cfg``
    interval starts or ends, so resolving at those instants finds them all."""
    ht = RegProvHttpCfg.__table__  # type: ignore[attr-defined]
    pt = RegProvenance.__table__  # type: ignore[attr-defined]
    default = conn.execute(
        select(pt.c.base_url_default).where(pt.c.id == provenance_id)
    ).scalar_one_or_none()
    start = as_utc(cred["effective_from"])
    end = as_utc(cred["effective_to"]) if cred.get("effective_to") else None
    instants = {start}
    for r in conn.execute(
        select(ht.c.effective_from, ht.c.effective_to).where(ht.c.provenance_id == provenance_id)
    ):
        for edge in (r.effective_from, r.effective_to):
            if edge is not None and start <= as_utc(edge) and (end is None or as_utc(edge) < end):
                instants.add(as_utc(edge))
    tasks = [cred.get("task_type")] if cred.get("scope_code") == "TASK" else [None, *TASK_TYPES]
    found: set[str] = set()
    for task in tasks:
        for at in instants:
            row = current_row(conn, RegProvHttpCfg, provenance_id, task, at)
            url = (row.base_url_override if row is not None else None) or default
            if url:
                found.add(origin(url))
    return sorted(found)


def provenance_rates(conn: Connection, at: datetime | None = None) -> dict[str, dict[str, Any]]:
    """Per provenance with a rate limit in force (SOURCE scope): its ``qps`` and its
    ``max_concurrency``."""
    when = as_utc(at)
    out: dict[str, dict[str, Any]] = {}
    table = RegProvenance.__table__  # type: ignore[attr-defined]
    for prov in conn.execute(select(table)).fetchall():
        contract = resolve_contract(conn, prov.provenance_code, None, when)
        rl = contract.rate_limit or {}
        if not rl.get("qps_limit"):
            continue
        out[prov.provenance_code] = {
            "qps": float(rl["qps_limit"]),
            "max_concurrency": rl.get("max_concurrency"),
        }
    return out
