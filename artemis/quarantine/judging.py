"""Judging a page (pure: no database): each record through the task's ``process`` and
the record model's check; the bad ones set aside with their reasons, the drift found."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pydantic import TypeAdapter, ValidationError

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode
from artemis.quarantine.policy import RecordPolicy, Stage
from artemis.redact import redact_text
from artemis.sinks.records import RecordFault, RecordSpec, fault_of, model_error

# -- judging a page ---------------------------------------------------------------------------


@dataclass
class BadRecord:
    """One record set aside: where it was, what it was and why."""

    position: int  # in its page as fetched (or as processed, for a MODEL-stage record)
    record: Any
    code: str
    field: str | None
    message: str
    stage: Stage
    key: dict[str, Any] | None = None


@dataclass
class Drift:
    field: str
    kind: Literal["added", "missing"]
    example: Any = None
    type_name: str | None = None


@dataclass
class Judged:
    records: list[dict[str, Any]]  # to every sink
    bad: list[BadRecord] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    fields_dropped: int = 0  # values of unnamed fields dropped (a record × a field)
    filtered: int = 0  # records ``process`` left out on purpose (``JudgingContext.leave_out``)


@dataclass
class Rejection:
    """A record the task's ``process`` turned down (``JudgingContext.reject``)."""

    record: Any
    message: str
    field: str | None = None
    code: str = ErrorCode.SOURCE_CONTRACT.value


class JudgingContext(Protocol):
    """What judging reads and writes of a run's context (``TaskContext``,
    artemis/tasks/base.py)."""

    task_code: str
    params: Any
    settings: Any
    filtered: int
    rejected: list[Rejection]


class JudgedTask(Protocol):
    """A task as judging sees it (``TaskUnit``, artemis/tasks/base.py), declared here: the
    tasks import this module, so it names none of theirs."""

    judges_records: ClassVar[bool]

    def process(self, records: list[Any], ctx: Any) -> list[dict[str, Any]]: ...

    def record_policy(self, ctx: Any) -> RecordPolicy: ...

    def record_spec(self, params: Any = None) -> RecordSpec | None: ...

    def evolve_model(self, ctx: Any, fields: dict[str, str]) -> bool: ...

    def lanes(self, params: Any) -> dict[str, Any] | None: ...

    def lane_params(self, params: Any, lane: str) -> Any: ...


_PROCESS_FAULTS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def _set_aside(
    judged: Judged,
    faults: dict[int, Any],
    origin: list[int] | None,
    raw: list[Any],
    records: list[Any],
    spec: RecordSpec,
) -> set[int]:
    """A row in ``judged.bad`` for each record that does not fit the model; the raw
    positions set aside. One row per raw record: a raw record any of whose processed
    records does not fit is set aside whole (a replay processes it again), its other
    records with it."""
    taken = {b.position for b in judged.bad}
    aside: set[int] = set()
    for i, fault in sorted(faults.items()):
        if origin is not None and i < len(origin):
            o = origin[i]
            aside.add(o)
            if o in taken:
                continue
            taken.add(o)
            position, record, stage = o, raw[o], Stage.PROCESS
        else:
            # (after every raw position: rows of one page never share a place)
            position, record, stage = 2 * len(raw) + i, records[i], Stage.MODEL
        judged.bad.append(
            BadRecord(
                position=position,
                record=record,
                code=ErrorCode.RECORD_MODEL.value,
                field=fault.field,
                message=f"record {fault.problem}",
                stage=stage,
                key=_key_of(records[i], spec),
            )
        )
    return aside


@dataclass(frozen=True)
class Rules:
    """What a page is judged by: the run's bad-record ``policy``, its record model
    (``spec``; None: it has none) and whether the task's process runs first (``process``
    False: records processed already, checked against the model only)."""

    policy: RecordPolicy
    spec: RecordSpec | None
    process: bool = True


def judge(task: JudgedTask, ctx: JudgingContext, seq: int, raw: list[Any], rules: Rules) -> Judged:
    """One page through the task's ``process`` and the record model's check (see the
    module). Raises SOURCE_CONTRACT for a page every record of which breaks one rule (or
    any bad record under ``fail``: SOURCE_CONTRACT for the process step, RECORD_MODEL naming
    the record and field for the model), and for a new field under ``freeze``."""
    policy, spec, process = rules.policy, rules.spec, rules.process
    code = ctx.task_code
    ctx.filtered = 0
    if process:
        out, origin, bad = _processed(task, ctx, seq, raw, policy, code)
    else:
        out, origin, bad = list(raw), None, []
    judged = Judged(out, bad, filtered=ctx.filtered)
    if spec is None or not out:
        return judged
    judged.records, judged.drift, judged.fields_dropped = _drift(out, spec, policy, seq)
    records = judged.records
    if policy.coerce_types:
        converted, faults = coerced(spec, records)
    else:
        converted, faults = None, model_faults(spec, records)
    if not faults:
        if converted is not None:
            judged.records = converted
        return judged
    first = min(faults)
    if not policy.quarantines:
        raise model_error(f"page {seq}: record {first} {faults[first].problem}")
    _contract_break(
        seq, len(records), [(f.field, f.kind) for f in faults.values()], faults[first].problem
    )
    if origin is None and process:
        origin = _origins(task, ctx, raw, len(records))
    good = [i for i in range(len(records)) if i not in faults]
    values = converted if converted is not None else [records[i] for i in good]
    aside = _set_aside(judged, faults, origin, raw, records, spec)
    judged.records = [
        v
        for i, v in zip(good, values, strict=True)
        if not (origin is not None and i < len(origin) and origin[i] in aside)
    ]
    return judged


def _processed(
    task: JudgedTask, ctx: JudgingContext, seq: int, raw: list[Any], policy: RecordPolicy, code: str
) -> tuple[list[dict[str, Any]], list[int] | None, list[BadRecord]]:
    """The page through ``process``: (records out, the raw position each came from when
    that is known, the records set aside)."""
    ctx.rejected = []
    try:
        out = task.process(raw, ctx)
        origin: list[int] | None = list(range(len(raw))) if len(out) == len(raw) else None
    except ArtemisError:
        raise
    except _PROCESS_FAULTS as e:
        if not policy.quarantines:
            raise _shape_error(seq, code, e) from None
        out, origin, bad = _one_by_one(task, ctx, raw)
        if not bad:  # it fails on the page, on no record alone: the page's shape
            raise _shape_error(seq, code, e) from None
        _contract_break(seq, len(raw), [(b.field, b.message) for b in bad], bad[0].message)
        return out, origin, bad
    rejected, ctx.rejected = ctx.rejected, []
    if not rejected:
        return out, origin, []
    if not policy.quarantines:
        first = rejected[0]
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"process: page {seq}: {code} rejected a record"
            + (f" (field {first.field!r})" if first.field else "")
            + f": {first.message}",
        )
    turned: list[BadRecord] = []
    seen: set[int] = set()
    for k, r in enumerate(rejected):
        at = _position(raw, r.record)
        if at in seen:
            continue  # turned down twice: one row
        seen.add(at)
        # A record that is not one of the page's (process built it) is kept as given and
        # judged by the model alone on replay, at a place after the page's own.
        found = at >= 0
        turned.append(
            BadRecord(
                position=at if found else len(raw) + k,
                record=r.record,
                code=r.code,
                field=r.field,
                message=r.message,
                stage=Stage.PROCESS if found else Stage.MODEL,
            )
        )
    _contract_break(seq, len(raw), [(b.field, b.message) for b in turned], turned[0].message)
    return out, None, turned


def _one_by_one(
    task: JudgedTask, ctx: JudgingContext, raw: list[Any]
) -> tuple[list[dict[str, Any]], list[int], list[BadRecord]]:
    """``process`` failed on the page: each record on its own, to tell the ones it fails."""
    out: list[dict[str, Any]] = []
    origin: list[int] = []
    bad: list[BadRecord] = []
    ctx.filtered = 0  # (counted again: the page's own call failed part-way)
    for i, record in enumerate(raw):
        ctx.rejected = []
        try:
            got = task.process([record], ctx)
        except _PROCESS_FAULTS as e:
            bad.append(
                BadRecord(
                    i,
                    record,
                    ErrorCode.SOURCE_CONTRACT.value,
                    _field_of(e),
                    f"{type(e).__name__}: {e}",
                    Stage.PROCESS,
                )
            )
            continue
        for r in ctx.rejected:
            bad.append(BadRecord(i, record, r.code, r.field, r.message, Stage.PROCESS))
        out.extend(got)
        origin.extend([i] * len(got))
    ctx.rejected = []
    return out, origin, bad


def _origins(task: JudgedTask, ctx: JudgingContext, raw: list[Any], n: int) -> list[int] | None:
    """Which raw record each processed one came from, told by processing them one by one
    (only for a page with a bad record whose process does not map one to one); None when
    the records processed alone differ from the page processed whole."""
    origin: list[int] = []
    for i, record in enumerate(raw):
        ctx.rejected = []
        try:
            origin.extend([i] * len(task.process([record], ctx)))
        except _PROCESS_FAULTS:
            continue
    ctx.rejected = []
    return origin if len(origin) == n else None


def _contract_break(seq: int, n: int, rules: list[tuple[Any, Any]], example: str) -> None:
    """Every record of a page (two or more) broke the same rule: the source changed (a
    renamed key, a records path gone), which no quarantine should hide."""
    if n >= 2 and len(rules) == n and len(set(rules)) == 1:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"page {seq}: every one of its {n} records breaks the same rule — the source "
            f"changed, not a bad record: {example}",
        )


def _drift(
    records: list[dict[str, Any]], spec: RecordSpec, policy: RecordPolicy, seq: int
) -> tuple[list[dict[str, Any]], list[Drift], int]:
    """The records without the fields the model does not name; the drift seen (a new
    field with its first value; a nullable field no record of the page carries)."""
    names = spec.model.model_fields
    added: dict[str, list[Any]] = {}
    out: list[dict[str, Any]] = []
    dropped = 0
    present: set[str] = set()
    for r in records:
        if not isinstance(r, dict):
            out.append(r)
            continue
        extra = [k for k in r if k not in names]
        if not extra:
            out.append(r)
            present.update(r)
            continue
        for k in extra:
            added.setdefault(k, []).append(r[k])
        dropped += len(extra)
        kept = {k: v for k, v in r.items() if k in names}
        present.update(kept)
        out.append(kept)
    if added and policy.schema_contract == "freeze":
        name = sorted(added)[0]
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"page {seq}: records carry a field {name!r} the record model does not name "
            f"(schema_contract: freeze; its values look like {infer_type(added[name])}): add "
            "it to the model, or let the provenance's schema_contract evolve or discard",
            details={"field": name},
        )
    drift = [
        # (a name is kept to the drift table's 200 characters: past 63 none is valid)
        Drift(name[:200], "added", values[0], infer_type(values))
        for name, values in sorted(added.items())
    ]
    if len(out) >= 2:  # (one record alone says little about a field that is often null)
        drift += [
            Drift(name, "missing")
            for name, f in names.items()
            if name not in present and not f.is_required()
        ]
    return out, drift, dropped


def infer_type(values: list[Any]) -> str:
    """The declared type a new field gets when the model evolves: the one its values
    share (ints and floats: float), nullable; JSON when nulls only or mixed."""
    kinds = {_kind_of(v) for v in values if v is not None}
    if kinds == {"int", "float"}:
        kinds = {"float"}
    if len(kinds) != 1:
        return "json | None"
    return f"{kinds.pop()} | None"


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "list[str]"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return "json"


def example_text(value: Any) -> str:
    """A drift's example value as shown (events, the drift table): redacted as log lines
    are before it is cut (a secret cut in two is no longer found)."""
    text = redact_text(jsonio.dumps(value).decode(errors="replace"))
    return text if len(text) <= 80 else text[:77] + "..."


def _position(raw: list[Any], record: Any) -> int:
    for i, r in enumerate(raw):
        if r is record:
            return i
    for i, r in enumerate(raw):
        if r == record:
            return i
    return -1


def _field_of(e: BaseException) -> str | None:
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    return None


def _key_of(record: Any, spec: RecordSpec) -> dict[str, Any] | None:
    if not isinstance(record, dict):
        return None
    key = {k: record.get(k) for k in spec.key if record.get(k) is not None}
    return key or None


def _shape_error(seq: int, code: str, e: BaseException) -> ArtemisError:
    return ArtemisError(
        ErrorCode.SOURCE_CONTRACT,
        f"process: a record of page {seq} does not have the shape {code} expects: "
        f"{type(e).__name__}: {e}",
    )


def model_faults(spec: RecordSpec, records: list[dict[str, Any]]) -> dict[int, RecordFault]:
    """The records that do not fit the model, by position: each one's first fault (one
    check of the whole list; an empty mapping when every record fits)."""
    return _faults(spec, spec.adapter, records)


def coerced(
    spec: RecordSpec, records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[int, RecordFault]]:
    """The records converted to the model's types where a lax reading can (their values
    as JSON writes them), and the faults of those that cannot be."""
    faults = _faults(spec, spec.lax_adapter, records)
    good = [r for i, r in enumerate(records) if i not in faults]
    models = spec.lax_adapter.validate_json(jsonio.dumps(good))
    return [m.model_dump(mode="json") for m in models], faults


def _faults(
    spec: RecordSpec, adapter: TypeAdapter[list[Any]], records: list[dict[str, Any]]
) -> dict[int, RecordFault]:
    name = spec.model.__name__
    try:
        adapter.validate_json(jsonio.dumps(records))
    except ValidationError as e:
        faults: dict[int, RecordFault] = {}
        for err in e.errors():
            loc = err.get("loc") or ()
            if not loc or not isinstance(loc[0], int) or loc[0] in faults:
                continue
            faults[loc[0]] = fault_of(err, name)
        if not faults:  # not a record's fault (the list itself): say so plainly
            raise model_error(f"records do not fit {name}: {e}") from None
        return faults
    return {}
