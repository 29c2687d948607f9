"""A record model drafted from a sample of records (``artemis registry preview``): each
field's type as the sample shows it, ``| None`` where a value was null or absent, nested
mappings as structs, and a key suggested from a field every record has and no two share.
The draft is checked against the sample before it is handed out: every sampled record
fits it, so the model pasted into the file lands them all.

Pure: no I/O. ``draft_model`` gives ``{key, fields, notes}`` (``key`` and ``fields`` are
a ``RecordModelDecl``, the short form a file takes); ``draft_yaml`` writes it as a
``record_model`` row, the notes as YAML comments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

import yaml

from artemis.quarantine.judging import model_faults
from artemis.sinks.records import (
    MAX_FIELDS,
    declared_spec,
    field_name_problem,
    same_but_case,
)

_ABSENT: Any = object()
# ISO 8601 text as the model's strict check reads it: a day, or a day and a time.
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})?$"
)
# Key names a source uses for its records' identity, best first.
_KEY_NAMES = ("id", "uuid", "key", "code", "slug")
# Types a key may have: a scalar that compares exactly (not a float, a bool or a struct).
_KEY_TYPES = ("int", "str", "date", "datetime")
# How often the check of the draft may loosen a field before giving up on a fit.
_MAX_ROUNDS = 8


def draft_model(records: Iterable[Any]) -> dict[str, Any]:
    """The record model ``records`` fit: ``{"key": [...], "fields": {...}, "notes":
    {field path: why}, "left_out": {name: why}, "key_note": why or None}``. A field whose
    type the sample cannot tell (only nulls, several JSON types) is ``json``, with a note;
    a name no column can have is left out, saying why. ValueError when the sample holds no
    record (a JSON object)."""
    sample = [r for r in records if isinstance(r, dict)]
    if not sample:
        raise ValueError("no record (a JSON object) in the sample to draft a model from")
    notes: dict[str, str] = {}
    left_out: dict[str, str] = {}
    fields: dict[str, Any] = {}
    for name in _names(sample):
        why = _name_problem(name, fields)
        if why is None and len(fields) >= MAX_FIELDS:
            why = f"a record model has at most {MAX_FIELDS} fields"
        if why is not None:
            left_out[name] = why
            continue
        fields[name] = _field_type([r.get(name, _ABSENT) for r in sample], name, notes)
    if not fields:
        raise ValueError("no field of the sample can be a column: " + "; ".join(left_out.values()))
    key, key_note = _key(sample, fields)
    _fit(sample, key, fields, notes)
    return {
        "key": key,
        "fields": fields,
        "notes": notes,
        "left_out": left_out,
        "key_note": key_note,
    }


def _names(sample: list[dict[str, Any]]) -> list[str]:
    """Every key of the sample, in the order they first appear."""
    seen: dict[str, None] = {}
    for record in sample:
        for name in record:
            seen.setdefault(str(name), None)
    return list(seen)


def _name_problem(name: str, declared: dict[str, Any]) -> str | None:
    why = field_name_problem(name)
    if why is not None:
        return (
            f"{why}; a record step can give it a column "
            f"({{rename: {{from: {name}, to: NEW_NAME}}}})"
        )
    twin = same_but_case(name, declared)
    if twin is not None:
        return f"differs only in case from field {twin!r} (a table's column names ignore case)"
    return None


def _field_type(values: list[Any], path: str, notes: dict[str, str]) -> str | dict[str, Any]:
    """A field's type from its values (``_ABSENT`` where a record lacks it): a type name,
    ``| None`` when a value is null or absent, or a struct's sub-fields."""
    nullable = any(v is _ABSENT or v is None for v in values)
    present = [v for v in values if v is not _ABSENT and v is not None]
    if not present:
        notes[path] = "only null or absent in the sample: its type cannot be told"
        return "json | None"
    kinds = {_kind(v) for v in present}
    if kinds == {"dict"}:
        return _mapping_type(present, path, notes)
    base = _one_type(kinds, path, notes)
    return f"{base} | None" if nullable else base


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return _text_kind(value)
    if isinstance(value, list):
        if not value:
            return "empty list"
        return "list[str]" if all(isinstance(v, str) for v in value) else "list"
    if isinstance(value, dict):
        return "dict"
    return "json"


def _text_kind(value: str) -> str:
    """``date`` or ``datetime`` for ISO 8601 text the model's check reads as one."""
    try:
        if _DATE.match(value):
            date.fromisoformat(value)
            return "date"
        if _DATETIME.match(value):
            datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
            return "datetime"
    except ValueError:
        pass
    return "str"


def _one_type(kinds: set[str], path: str, notes: dict[str, str]) -> str:
    """The one declared type that every kind of value seen fits."""
    if len(kinds) == 1:
        (kind,) = kinds
        if kind == "empty list":
            notes[path] = "only empty lists in the sample: their items' type cannot be told"
            return "list"
        return kind
    if kinds <= {"int", "float"}:
        return "float"
    if kinds <= {"str", "date", "datetime"}:
        return "str"  # dates mixed with other text: text
    if kinds <= {"list[str]", "empty list"}:
        return "list[str]"
    if kinds <= {"list[str]", "list", "empty list"}:
        return "list"
    notes[path] = f"values of several types in the sample ({', '.join(sorted(kinds))})"
    return "json"


def _mapping_type(
    values: list[dict[str, Any]], path: str, notes: dict[str, str]
) -> str | dict[str, Any]:
    """A struct of the mappings' keys, each typed by its values; ``dict`` when a key
    cannot name a struct's field or the mappings have no key at all."""
    names = _names(values)
    if not names:
        notes[path] = "only empty mappings in the sample: a struct needs a field"
        return "dict | None"
    bad = [n for n in names if field_name_problem(n) is not None]
    if bad:
        notes[path] = f"a mapping with keys no struct field can be named ({bad[0]!r}): a dict"
        return "dict | None"
    return {
        n: _field_type([v.get(n, _ABSENT) for v in values], f"{path}.{n}", notes) for n in names
    }


def _key(sample: list[dict[str, Any]], fields: dict[str, Any]) -> tuple[list[str], str | None]:
    """A field every record has (never null) and no two records share, an id-like name
    first; else such a pair; else the first field every record has, with a note."""
    required = [
        n
        for n, t in fields.items()
        if isinstance(t, str) and t in _KEY_TYPES and all(r.get(n) is not None for r in sample)
    ]
    single = [n for n in required if _unique(sample, [n])]
    if single:
        return [min(single, key=lambda n: (_key_rank(n), required.index(n)))], None
    for i, a in enumerate(required):
        for b in required[i + 1 :]:
            if _unique(sample, [a, b]):
                return [a, b], None
    if required:
        return [required[0]], "no field (or pair of fields) is unique in the sample: check it"
    plain = [n for n, t in fields.items() if isinstance(t, str)]
    if not plain:
        raise ValueError("no field of the sample can be a key: every one is a mapping")
    name = plain[0]
    fields[name] = fields[name].replace(" | None", "")
    return [name], (
        f"no field is in every record of the sample: a record without {name!r} would be set aside"
    )


def _key_rank(name: str) -> int:
    low = name.lower()
    if low in _KEY_NAMES:
        return _KEY_NAMES.index(low)
    if low.endswith(("_id", "id", "_key", "uuid")):
        return len(_KEY_NAMES)
    return len(_KEY_NAMES) + 1


def _unique(sample: list[dict[str, Any]], names: list[str]) -> bool:
    seen = {json.dumps([r.get(n) for n in names], sort_keys=True, default=str) for r in sample}
    return len(seen) == len(sample)


def _fit(
    sample: list[dict[str, Any]], key: list[str], fields: dict[str, Any], notes: dict[str, str]
) -> None:
    """Loosen the fields a sampled record does not fit (the model's own check says which)
    until every record fits: a struct becomes a ``dict``, any other type ``json``."""
    for _ in range(_MAX_ROUNDS):
        spec = declared_spec({"key": key, "fields": fields}, "DraftedRecord")
        named = [{k: v for k, v in r.items() if k in fields} for r in sample]
        faults = model_faults(spec, named)
        loosened = False
        for fault in faults.values():
            name = fault.field.split(".")[0]
            if name in key or name not in fields:
                continue
            loose = "dict | None" if isinstance(fields[name], dict) else "json | None"
            if fields[name] != loose:
                fields[name] = loose
                notes[name] = f"loosened to {loose.split(' ')[0]}: {fault.problem}"
                loosened = True
        if not faults or not loosened:
            return


def draft_yaml(
    draft: dict[str, Any],
    *,
    resource: str | None = None,
    effective_from: str = "1970-01-01T00:00:00Z",
    scope: str = "SOURCE",
    task_type: str | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """``draft`` as a file's ``record_model`` section of one row, ready to paste: its
    notes as comments next to the fields they are about. ``extra``: more columns of the
    row kept as they are (the record steps and policy of a model in force)."""
    lines = ["record_model:", f"  - scope_code: {scope}"]
    if task_type:
        lines.append(f"    task_type: {task_type}")
    lines.append(f"    effective_from: {json.dumps(effective_from)}")
    if resource:
        lines.append(f"    resource_name: {_yaml_name(resource)}")
    key_line = f"    key_json: [{', '.join(_yaml_name(k) for k in draft['key'])}]"
    lines.append(_commented(key_line, draft.get("key_note")))
    lines.append("    fields_json:")
    lines += _field_lines(draft["fields"], draft.get("notes") or {}, "", 6)
    for name, why in (draft.get("left_out") or {}).items():
        lines.append(f"      # not declared: {json.dumps(name)}: {_one_line(why)}")
    for column, value in (extra or {}).items():
        text = yaml.safe_dump({column: value}, default_flow_style=False, sort_keys=False)
        lines += ["    " + line for line in text.rstrip("\n").split("\n")]
    return "\n".join(lines) + "\n"


def _field_lines(
    fields: dict[str, Any], notes: dict[str, str], prefix: str, indent: int
) -> list[str]:
    out = []
    pad = " " * indent
    for name, kind in fields.items():
        path = f"{prefix}{name}"
        if isinstance(kind, dict):
            out.append(_commented(f"{pad}{_yaml_name(name)}:", notes.get(path)))
            out += _field_lines(kind, notes, f"{path}.", indent + 2)
        else:
            out.append(_commented(f"{pad}{_yaml_name(name)}: {kind}", notes.get(path)))
    return out


def _commented(line: str, note: str | None) -> str:
    return f"{line}  # {_one_line(note)}" if note else line


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _yaml_name(name: str) -> str:
    """A name as a plain YAML scalar when YAML reads it back as that text (``on`` and
    ``null`` would not be), else quoted."""
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name) and yaml.safe_load(name) == name:
        return name
    return json.dumps(name)
