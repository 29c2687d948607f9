"""A provenance of several resources (docs/registry.md "Resources"): each resource's own
contract (its SEARCH endpoint, pagination, record model and window over the provenance's
shared rows), the place it lands in, the values a sub-resource takes from its parent
record, and the tree a run walks (``artemis.sources.tree.TreeSource``).

Words: a *resource* is one named endpoint of a provenance; a *sub-resource* is asked once
per record of its *parent resource*. ("Parent" and "child" alone name the runs a
backfill fans out: docs/architecture.md, "Words".)
"""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, tzinfo
from typing import Any
from urllib.parse import quote

from artemis.errors import ArtemisError, ErrorCode
from artemis.paging import MISSING
from artemis.registry.resolve import Contract, as_utc
from artemis.registry.watermark import pointer_of
from artemis.sources.tree import Node

# ``{parent.field}`` (a dotted path into the parent record) in a path, query or body.
PLACEHOLDER = re.compile(r"\{parent\.([A-Za-z0-9_@$-]+(?:\.[A-Za-z0-9_@$-]+)*)\}")
# The deepest tree a provenance may describe (a resource and its ancestors).
MAX_DEPTH = 8


def resource_problems(contract: Contract) -> list[str]:
    """What keeps a provenance's resources from being a tree: a SEARCH endpoint of the
    provenance's own mixed with named ones, a parent resource that is not there, a cycle, a
    tree deeper than ``MAX_DEPTH``, a ``{parent.…}`` placeholder without a parent."""
    resources = contract.resources or {}
    if not resources:
        return []
    problems = []
    if contract.endpoint is not None:
        problems.append(
            f"endpoint {contract.endpoint.get('endpoint_name')!r} is a SEARCH endpoint of no "
            f"resource next to the resources {', '.join(resources)}: name its resource_name"
        )
    for name, res in resources.items():
        parent = res.get("parent")
        if parent and parent not in resources:
            problems.append(
                f"resource {name!r}: its parent resource {parent!r} has no SEARCH endpoint in force"
            )
        elif parent and _ancestors(resources, name) is None:
            problems.append(f"resource {name!r}: its parent resources make a cycle")
        elif len(_ancestors(resources, name) or []) >= MAX_DEPTH:
            problems.append(f"resource {name!r}: deeper than {MAX_DEPTH} levels")
        if not parent and _placeholders(res["endpoint"]):
            problems.append(
                f"resource {name!r}: {{parent.…}} in its request, and no parent_resource_name"
            )
    return problems


def _ancestors(resources: dict[str, dict[str, Any]], name: str) -> list[str] | None:
    """``name``'s parent resources, nearest first; None when they make a cycle (a
    missing parent ends the list)."""
    out: list[str] = []
    at = resources[name].get("parent")
    while at:
        if at == name or at in out:
            return None
        out.append(at)
        at = (resources.get(at) or {}).get("parent")
    return out


def _placeholders(endpoint: dict[str, Any]) -> list[str]:
    text = " ".join(
        str(v)
        for v in (
            endpoint.get("path_template"),
            endpoint.get("default_query_params"),
            endpoint.get("default_body_payload"),
        )
        if v
    )
    return PLACEHOLDER.findall(text)


def walked(
    resources: dict[str, dict[str, Any]], target: str | None, only: bool
) -> tuple[dict[str, Node], list[str]]:
    """The tree a run walks: every resource (``target`` None), or ``target`` with its
    parent resources (fetched for their values; landing too unless ``only``). The nodes
    and the root resources, in the contract's order (parents first)."""
    if target is not None and target not in resources:
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"params.resource: {target!r} is not a resource of this provenance "
            f"(resources: {', '.join(resources)})",
        )
    wanted = list(resources) if target is None else [target, *(_ancestors(resources, target) or [])]
    nodes = {
        name: Node(name, lands=(target is None or name == target or not only))
        for name in resources
        if name in wanted
    }
    for name in nodes:
        parent = resources[name].get("parent")
        if parent in nodes:
            nodes[parent].children.append(name)
    roots = [n for n in nodes if not resources[n].get("parent")]
    return nodes, roots


def resource_contract(contract: Contract, name: str) -> Contract:
    """The contract of one resource: its own endpoint, pagination, record model and
    window over the provenance's shared rows (http, retry, rate limit, credentials)."""
    res = (contract.resources or {})[name]
    return dataclasses.replace(
        contract,
        endpoint=res["endpoint"],
        endpoints={**contract.endpoints, "SEARCH": res["endpoint"]},
        pagination=res.get("pagination"),
        record_model=res.get("record_model"),
        window_offset=res.get("window_offset"),
        resources=None,
    )


def for_parent(endpoint: dict[str, Any], parent: dict[str, Any], name: str) -> dict[str, Any]:
    """``endpoint`` asked for one parent record: each ``{parent.field}`` of its path
    template that record's value percent-encoded per path segment (a ``/`` in it
    separates segments; an empty, ``.`` or ``..`` segment is refused), and of its query
    and body the value itself (or written into the text around it)."""
    out = dict(endpoint)
    out["path_template"] = PLACEHOLDER.sub(
        lambda m: _path_value(_value(parent, m.group(1), name), m.group(1), name),
        str(endpoint.get("path_template") or ""),
    )
    for key in ("default_query_params", "default_body_payload"):
        if endpoint.get(key):
            out[key] = _filled(endpoint[key], parent, name)
    return out


def _value(parent: dict[str, Any], path: str, name: str) -> Any:
    at: Any = parent
    for part in path.split("."):
        at = at.get(part, MISSING) if isinstance(at, dict) else MISSING
    if at is MISSING or at is None or isinstance(at, (dict, list)):
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"resource {name!r}: {{parent.{path}}}: the parent record has "
            + ("no value there" if at is MISSING or at is None else "no single value there"),
            retryable=False,
        )
    return at


def _path_value(value: Any, path: str, name: str) -> str:
    segments = str(value).split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"resource {name!r}: {{parent.{path}}} = {str(value)[:80]!r} is not a path "
            "(an empty, '.' or '..' segment)",
            retryable=False,
        )
    return "/".join(quote(s, safe="") for s in segments)


def _filled(value: Any, parent: dict[str, Any], name: str) -> Any:
    if isinstance(value, dict):
        return {k: _filled(v, parent, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, parent, name) for v in value]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return _value(parent, whole.group(1), name)
    return PLACEHOLDER.sub(lambda m: str(_value(parent, m.group(1), name)), value)


def adopted(
    resource: dict[str, Any], parent: dict[str, Any], record: dict[str, Any]
) -> dict[str, Any]:
    """``record`` with the parent fields its resource copies (``include_from_parent_json``:
    a list of fields, each landing as ``{parent resource}_{field}``; or a mapping of
    parent field to the record's field)."""
    wanted = resource["endpoint"].get("include_from_parent_json")
    if not wanted or not isinstance(record, dict):
        return record
    pairs = (
        wanted.items()
        if isinstance(wanted, dict)
        else [(f, f"{resource['parent']}_{f.replace('.', '_')}") for f in wanted]
    )
    out = dict(record)
    for field, column in pairs:
        at: Any = parent
        for part in str(field).split("."):
            at = at.get(part) if isinstance(at, dict) else None
        out[str(column)] = at
    return out


def changed_since(
    resource: dict[str, Any], record: dict[str, Any], start: datetime | None, tz: tzinfo
) -> bool:
    """Whether a parent record changed since ``start`` by its resource's own field
    (``window_offset_cfg.watermark_field_name`` of the resource): an update asks the
    sub-resources of the changed ones only. True without a field or a start."""
    win = resource.get("window_offset") or {}
    if start is None or not win.get("watermark_field_name") or not isinstance(record, dict):
        return True
    seen = pointer_of(record, {**win, "offset_type_code": "DATE"}, tz)
    return seen is None or as_utc(seen) >= as_utc(start)
