"""Record steps: a resource's records shaped before its record model checks them
(``record_model.record_steps_json``; docs/resources.md "Shaping records").

A step is a mapping of one key, the step's name, to its arguments. The steps apply in
order to each record, each to the record as the steps before it left it:

- ``rename: {from: _id, to: doc_id}``: a key of the record under a field's name (the way
  a key no column can be named after, ``_id``, ``@id``, ``#text``, gets a column);
- ``map: {from: $.attributes.title, to: title}``: the value at a JSONPath into the record
  copied to a field (a path that selects several values gives the list of them);
- ``add: {to: kind, value: article}``, ``{to: source, from: provenance}`` or
  ``{to: since, from: window_start}``: a constant, the provenance's code, or the start of
  the run's window (ISO 8601, UTC; null when the run has no window start);
- ``drop: [type, attributes]``: keys of the record removed;
- ``filter: {path: $.type, equals: articles}``: the record goes on when a value is at the
  path (with ``equals``, that value; ``true`` is not ``1``), else it is left out, counted
  in the run's stats as ``records_filtered``.

A value ``rename`` or ``map`` does not find (the key or path absent) sets its field to
null; with ``required: true`` the record is rejected instead: quarantined with the step
named (``record_steps_json[0] (map $.attributes.title → title): ...``). A null found is a
value like any other (the record model says whether its field may be null). A step's
field replaces a value of that name; ``drop`` and ``filter`` never reject.

What cannot work is refused at import, each problem by its place
(``record_steps_json[1].map.from: not a JSONPath ...``): a shape that is no step, a path
that is no JSONPath, a field no column can be named, a field the record model does not
declare, a field set twice, a declared field dropped for good, a constant that does not
fit its field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import jsonpath
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode
from artemis.paging import MISSING, json_path_lookup
from artemis.sinks.records import (
    declared_spec,
    did_you_mean,
    field_name_problem,
    parse_field_type,
)

FIELD = "record_steps_json"
STEP_NAMES = ("rename", "map", "add", "drop", "filter")
# Every record goes through every step: a bound on the work one record costs.
MAX_STEPS = 100
# The declared types an ``add from:`` value fits (text; a window's start is ISO text).
_TEXT_KINDS = {"provenance": ("str", "json"), "window_start": ("datetime", "str", "json")}


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _field_ok(value: str) -> str:
    why = field_name_problem(value)
    if why is not None:
        raise ValueError(f"{value!r} cannot name a field: {why}")
    return value


def _jsonpath_ok(value: str) -> str:
    if not value.startswith("$"):
        raise ValueError(f"a JSONPath into the record, starting with '$' (got {value!r})")
    try:
        jsonpath.compile(value)
    except jsonpath.JSONPathError as e:
        raise ValueError(f"not a JSONPath: {str(e).splitlines()[0]}") from None
    return value


class RenameArgs(_Args):
    source: str = Field(alias="from", min_length=1, max_length=200)
    to: str
    required: StrictBool = False

    _to = field_validator("to")(_field_ok)


class MapArgs(_Args):
    source: str = Field(alias="from", max_length=500)
    to: str
    required: StrictBool = False

    _to = field_validator("to")(_field_ok)
    _path = field_validator("source")(_jsonpath_ok)


class AddArgs(_Args):
    to: str
    value: Any = None
    source: Literal["provenance", "window_start"] | None = Field(None, alias="from")

    _to = field_validator("to")(_field_ok)

    @model_validator(mode="after")
    def _one_value(self) -> AddArgs:
        given = "value" in self.model_fields_set
        if given and self.source is not None:
            raise ValueError("add takes value or from, not both")
        if not given and self.source is None:
            raise ValueError(
                "add takes value (a constant) or from (provenance or window_start): name one"
            )
        return self


class FilterArgs(_Args):
    path: str = Field(max_length=500)
    equals: Any = None

    _path = field_validator("path")(_jsonpath_ok)


_ARGS: dict[str, type[_Args]] = {
    "rename": RenameArgs,
    "map": MapArgs,
    "add": AddArgs,
    "filter": FilterArgs,
}
_DROP = TypeAdapter(list[str])


@dataclass(frozen=True)
class Step:
    """One step: its place in the list, its name and its arguments (``drop``: the keys)."""

    index: int
    name: str
    args: Any

    @property
    def to(self) -> str | None:
        """The field the step sets (None: ``drop`` and ``filter`` set none)."""
        return getattr(self.args, "to", None)

    def describe(self) -> str:
        """The step as a reason names it: ``record_steps_json[0] (map $.a.b → b)``."""
        a = self.args
        if self.name in ("rename", "map"):
            what = f"{a.source} → {a.to}"
        elif self.name == "add":
            what = f"{a.source or _short(a.value)} → {a.to}"
        elif self.name == "drop":
            what = ", ".join(a)
        else:
            what = a.path + (f" == {_short(a.equals)}" if "equals" in a.model_fields_set else "")
        return f"{FIELD}[{self.index}] ({self.name} {what})"


def _short(value: Any) -> str:
    text = jsonio.dumps(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


def as_json(raw: Any) -> Any:
    """A steps value as JSON holds it (a YAML date in a constant is its ISO text, as a
    record's date is): what is stored and what the steps compare."""
    return jsonio.loads(jsonio.dumps(raw))


def _one(i: int, raw: Any) -> tuple[Step | None, list[str]]:
    """Step ``i`` of the list, or what is wrong with it."""
    at = f"{FIELD}[{i}]"
    if not isinstance(raw, dict) or len(raw) != 1:
        got = list(raw) if isinstance(raw, dict) else type(raw).__name__
        return None, [
            f"{at}: a step is a mapping of one key, the step's name ({', '.join(STEP_NAMES)}), "
            f"to its arguments, e.g. {{map: {{from: $.a.b, to: b}}}} (got {got})"
        ]
    name, args = next(iter(raw.items()))
    if name not in STEP_NAMES:
        hint = did_you_mean(str(name), STEP_NAMES)
        return None, [f"{at}: {name!r} is not a step ({', '.join(STEP_NAMES)}){hint}"]
    if name == "drop":
        return _drop(i, args)
    model = _ARGS[name]
    if not isinstance(args, dict):
        names = ", ".join(f.alias or n for n, f in model.model_fields.items())
        return None, [f"{at}.{name}: a mapping of {names} (got {type(args).__name__})"]
    try:
        return Step(i, name, model.model_validate(args)), []
    except ValidationError as e:
        return None, [f"{at}.{name}{_problem(err, model)}" for err in e.errors()]


def _drop(i: int, args: Any) -> tuple[Step | None, list[str]]:
    try:
        keys = _DROP.validate_python(args, strict=True)
    except ValidationError:
        keys = []
    if not keys or not all(keys):
        return None, [f"{FIELD}[{i}].drop: a list of the record's keys to remove (got {args!r})"]
    return Step(i, "drop", tuple(keys)), []


def _problem(err: Any, model: type[_Args]) -> str:
    """One pydantic error as ``.field: why``."""
    where = "".join(f".{p}" for p in err["loc"])
    if err["type"] == "extra_forbidden":
        keys = ", ".join(f.alias or n for n, f in model.model_fields.items())
        return f"{where}: unknown key (this step takes {keys})"
    if err["type"] == "missing":
        return f"{where}: required"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "value_error":
        return f"{where}: {msg}"
    return f"{where}: {msg} (got {err.get('input')!r})"


def parsed_steps(raw: Any) -> tuple[list[Step], list[str]]:
    """The steps of a ``record_steps_json`` value and the problems of those that are not
    steps, each named by its place."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], [f"{FIELD}: a list of steps (got {type(raw).__name__})"]
    if len(raw) > MAX_STEPS:
        return [], [f"{FIELD}: {len(raw)} steps, at most {MAX_STEPS}"]
    steps: list[Step] = []
    problems: list[str] = []
    for i, one in enumerate(raw):
        step, wrong = _one(i, one)
        problems += wrong
        if step is not None:
            steps.append(step)
    return steps, problems


def _order_problems(steps: list[Step]) -> list[str]:
    """Steps that undo one another: a field set twice (the later step always replaces
    the earlier's value), a rename of a key an earlier step dropped."""
    out: list[str] = []
    set_by: dict[str, Step] = {}
    dropped: dict[str, Step] = {}
    for step in steps:
        at = f"{FIELD}[{step.index}].{step.name}"
        if step.name == "rename" and step.args.source in dropped:
            earlier = dropped[step.args.source].index
            out.append(f"{at}.from: {step.args.source!r} is dropped by {FIELD}[{earlier}]")
        if step.to is not None and step.to in set_by:
            out.append(
                f"{at}.to: {step.to!r} is set by {FIELD}[{set_by[step.to].index}] already "
                "(each field is set by one step)"
            )
        if step.to is not None:
            set_by.setdefault(step.to, step)
            dropped.pop(step.to, None)
        if step.name == "drop":
            for key in step.args:
                dropped[key] = step
                set_by.pop(key, None)
    return out


def _model_problems(
    steps: list[Step], fields: dict[str, Any], key: list[str], strict: bool
) -> list[str]:
    """Steps against the record model they shape for: a field it does not declare, a
    declared field dropped and set by no later step, a value that does not fit."""
    out: list[str] = []
    names = list(fields)
    spec = declared_spec({"key": key, "fields": fields}, "RecordStepsCheck")
    for step in steps:
        at, to = f"{FIELD}[{step.index}].{step.name}", step.to
        if to is not None and to not in fields:
            out.append(
                f"{at}.to: {to!r} is not a field of the record model (fields_json: "
                f"{', '.join(names)}){did_you_mean(to, names)}"
            )
        elif step.name == "add" and to is not None:
            annotation = spec.model.model_fields[to].annotation
            out += _add_fits(step, at, fields[to], annotation, strict)
        if step.name == "drop":
            later = {s.to for s in steps if s.index > step.index}
            gone = [k for k in step.args if k in fields and k not in later]
            out += [
                f"{at}: {k!r} is a field of the record model and no later step sets it "
                "(its column would stay empty)"
                for k in gone
            ]
    return out


def _add_fits(step: Step, at: str, declared: Any, annotation: Any, strict: bool) -> list[str]:
    """An ``add``'s value fits its field's declared type (``declared``: as the model
    writes it, ``annotation``: as its check reads it)."""
    a = step.args
    if a.source is not None:
        kind = parse_field_type(declared)[0] if isinstance(declared, str) else "struct"
        if kind not in _TEXT_KINDS[a.source]:
            return [
                f"{at}.from: {a.source} gives text, and field {a.to!r} is {kind} "
                f"(a field of type {' or '.join(_TEXT_KINDS[a.source])} takes it)"
            ]
        return []
    try:
        TypeAdapter(annotation).validate_json(jsonio.dumps(a.value), strict=strict)
    except ValidationError as e:
        why = e.errors()[0]["msg"]
        return [f"{at}.value: {a.value!r} does not fit field {a.to!r}: {why}"]
    return []


def step_problems(
    raw: Any,
    fields: dict[str, Any] | None = None,
    key: list[str] | None = None,
    strict: bool = True,
) -> list[str]:
    """What is wrong with a ``record_steps_json`` value, against the record model it
    shapes for (``fields``/``key``; None: no model to check against), each problem named
    by its place. ``strict``: constants are read as the model's check reads records
    (``coerce_types_enabled`` off)."""
    steps, problems = parsed_steps(raw)
    if problems:
        return problems
    problems = _order_problems(steps)
    if fields and key:
        problems += _model_problems(steps, fields, key, strict)
    return problems


@lru_cache(maxsize=256)
def _cached(text: str) -> tuple[Step, ...]:
    row = json.loads(text)
    problems = step_problems(
        row.get(FIELD), row.get("fields_json"), row.get("key_json"), not row.get("coerce")
    )
    if problems:
        raise ArtemisError(ErrorCode.CONFIG_ERROR, "; ".join(problems), retryable=False)
    return tuple(parsed_steps(row.get(FIELD))[0])


def steps_of(row: dict[str, Any] | None) -> tuple[Step, ...]:
    """The steps of a record model row (empty: none); CONFIG_ERROR naming each problem
    of a row written around the import's checks."""
    if not row or not row.get(FIELD):
        return ()
    text = json.dumps(
        {
            FIELD: row[FIELD],
            "fields_json": row.get("fields_json"),
            "key_json": row.get("key_json"),
            "coerce": bool(row.get("coerce_types_enabled")),
        },
        sort_keys=True,
        default=str,
    )
    return _cached(text)


# -- applying them ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepEnv:
    """What ``add from:`` reads: the provenance's code and the run's window start (ISO)."""

    provenance: str
    window_start: str | None


@dataclass(frozen=True)
class Shaped:
    """A record through the steps: the record as they left it, and whether it goes on
    (False: a filter left it out, ``record`` is the record as it stood there)."""

    record: dict[str, Any]
    kept: bool = True


@dataclass(frozen=True)
class Refused:
    """A record a step cannot apply to: the reason names the step; ``field`` its field."""

    reason: str
    field: str | None


def apply_steps(record: dict[str, Any], steps: tuple[Step, ...], env: StepEnv) -> Shaped | Refused:
    """``record`` through ``steps`` in order (see the module); ``record`` itself is left
    as it was (a rejected record is quarantined as the source gave it)."""
    out = dict(record)
    for step in steps:
        a = step.args
        if step.name == "drop":
            for k in a:
                out.pop(k, None)
            continue
        if step.name == "filter":
            found = json_path_lookup(out, a.path)
            if found is MISSING or ("equals" in a.model_fields_set and not _same(found, a.equals)):
                return Shaped(out, kept=False)
            continue
        if step.name == "add":
            out[a.to] = a.value if a.source is None else getattr(env, a.source)
            continue
        if step.name == "rename":
            value = out.pop(a.source, MISSING)
        else:
            value = json_path_lookup(out, a.source)
        if value is MISSING and a.required:
            where = "key" if step.name == "rename" else "path"
            return Refused(f"{step.describe()}: nothing at {where} {a.source}", a.to)
        out[a.to] = None if value is MISSING else value
    return Shaped(out)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values are: ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


__all__ = [
    "FIELD",
    "STEP_NAMES",
    "Refused",
    "Shaped",
    "Step",
    "StepEnv",
    "apply_steps",
    "parsed_steps",
    "step_problems",
    "steps_of",
]
