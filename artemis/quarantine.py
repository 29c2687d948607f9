"""Bad records and schema drift: where a run's records are judged, once per record,
before any sink.

A page goes through the task's ``process`` and then the record model's check. A record
that either rejects is *bad*: with ``on_bad_record: quarantine`` (the default) it is
kept aside in ``quarantined_record`` with the reason (field path, error code, message),
the rest of its page goes on to every sink, and ``max_bad_records`` (a count, or a
percentage of the records fetched) bounds how many a run may set aside before it fails
``BAD_RECORDS``; with ``fail`` the first bad record fails the run. A page on which
*every* record breaks the same rule is not bad records but a source that changed under
us: ``SOURCE_CONTRACT``, whatever the policy.

A field the model does not name is drift: recorded once per run and field in
``schema_drift`` (with an example value), and then, by ``schema_contract``: ``discard``
drops it (the default), ``freeze`` fails the run ``SOURCE_CONTRACT``, ``evolve`` drops it
from this run and adds it to the provenance's record model (as nullable) for the next
runs — when the import's rules allow its name, at most ``schema.max_new_fields`` a run;
the others are recorded ``skipped`` with the reason. A field the model names that no
record of a page carries is drift too.

What the rows show is redacted as log lines are (``artemis.redact``): the reason, the
record key, the drift example. A record that holds a secret value (a key the source
echoes) is shown redacted and kept sealed for its replay (``RecordSeal``).

Quarantined records are replayed by their own run (``workflows/quarantine_replay.py``):
each one judged again by the task and model in force then, and landed under an
idempotency key of its own, fixed per quarantine row.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any, ClassVar, Literal, Protocol, cast

from cryptography.fernet import InvalidToken, MultiFernet
from pydantic import BaseModel, Field, ValidationInfo, field_validator
from sqlalchemy import (
    Column,
    Index,
    Text,
    UniqueConstraint,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlmodel import Field as SqlField
from sqlmodel import SQLModel

from artemis import jsonio
from artemis.config import QuarantineSettings
from artemis.db import UTCDateTime, get_engine, upsert_insert, utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.owners import SEP as OWNER_SEP
from artemis.owners import owned_task_id
from artemis.redact import redact_json, redact_text
from artemis.registry.field_docs import MAX_BAD_RECORDS
from artemis.sinks.factory import lane_output
from artemis.sinks.records import RecordSpec, evolution_plan, model_error
from artemis.sources.tree import RECORD_KEY, RESOURCE_KEY
from artemis.vault import MASTER_KEY_ENV, PREVIOUS_KEYS_ENV, derive_multi, master_keys

# -- the policy ------------------------------------------------------------------------------

OnBadRecord = Literal["quarantine", "fail"]
SchemaContract = Literal["evolve", "freeze", "discard"]
DEFAULT_MAX_BAD = "1%"
# The fewest records a percentage max_bad_records is taken of.
PERCENT_FLOOR = 1000
POLICY_FIELDS = ("on_bad_record", "max_bad_records", "schema_contract", "coerce_types")


class QuarantineStatus(StrEnum):
    QUARANTINED = "quarantined"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


class Stage(StrEnum):
    """Where a replay judges a record again from (a row's ``replay_from``; its column is
    ``stage``)."""

    PROCESS = "process"  # the raw record as fetched: processed again, then checked
    MODEL = "model"  # the record as processed (its raw form could not be told): checked


class Check(StrEnum):
    """Which check set a record aside (a row's ``stage`` as shown): the task's ``process``
    step (it failed on the record or turned it down), or the record model's judgement."""

    PROCESS = "process"
    JUDGE = "judge"


# The codes of a model misfit: RECORD_MODEL, and SINK_ERROR, which rows set aside by a
# build before RECORD_MODEL existed carry for the same reason (a record rejected by the
# task's process step has its own code, or SOURCE_CONTRACT).
_JUDGED = frozenset({ErrorCode.RECORD_MODEL.value, ErrorCode.SINK_ERROR.value})


def check_of(error_code: str | None) -> Check:
    """The check a reason's code names: a model misfit is the judge's, the rest process's."""
    return Check.JUDGE if error_code in _JUDGED else Check.PROCESS


def parse_max_bad(value: Any) -> int | float:
    """``100`` → 100 records; ``"1%"`` / ``"0.5 %"`` → 1.0 / 0.5 percent (a float)."""
    if isinstance(value, bool):
        raise ValueError("max_bad_records is a count (e.g. 100) or a percentage ('1%')")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("max_bad_records: a count is 0 or more")
        return value
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1].strip())
        except ValueError:
            pct = math.nan
        if not 0 <= pct <= 100:
            raise ValueError(f"max_bad_records {value!r}: a percentage is 0% to 100%")
        return pct
    if text.isdigit():
        return int(text)
    raise ValueError(
        f"max_bad_records {value!r} is neither a count (e.g. 100) nor a percentage ('1%')"
    )


class RecordPolicyParams(BaseModel):
    """A run's bad-record and drift policy, as params (request or ``task_defaults.<code>``):
    None leaves it to the provenance's registry entry, then to the defaults."""

    on_bad_record: OnBadRecord | None = None
    max_bad_records: int | str | None = Field(None, description=MAX_BAD_RECORDS)
    schema_contract: SchemaContract | None = None
    # Read the record model's types laxly ("1.5" a float, "7" an int, "true" a bool).
    coerce_types: bool | None = None

    @field_validator("max_bad_records")
    @classmethod
    def _max_bad(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            limit = parse_max_bad(value)
            # Bounded by the operator's caps where a run is asked for (the context holds
            # the settings): a run's params read back in the worker were checked then.
            settings = (info.context or {}).get("settings")
            if settings is not None:
                check_max_bad_cap(limit, value, settings.quarantine)
        return value


def check_max_bad_cap(limit: int | float, value: Any, caps: QuarantineSettings) -> None:
    """ValueError naming the operator's bound when ``value`` (parsed: ``limit``) allows
    more bad records than ``quarantine.max_bad_records_cap_count`` / ``_cap_pct``."""
    if isinstance(limit, int) and limit > caps.max_bad_records_cap_count:
        raise ValueError(
            f"max_bad_records {value!r} is past the operator's bound "
            f"quarantine.max_bad_records_cap_count ({caps.max_bad_records_cap_count} records)"
        )
    if isinstance(limit, float) and limit > caps.max_bad_records_cap_pct:
        raise ValueError(
            f"max_bad_records {value!r} is past the operator's bound "
            f"quarantine.max_bad_records_cap_pct ({caps.max_bad_records_cap_pct:g}%)"
        )


@dataclass(frozen=True)
class RecordPolicy:
    on_bad_record: OnBadRecord = "quarantine"
    max_bad_records: int | str = DEFAULT_MAX_BAD
    schema_contract: SchemaContract = "discard"
    coerce_types: bool = False

    @classmethod
    def of(cls, *layers: dict[str, Any] | None) -> RecordPolicy:
        """The first value each layer sets (params over the registry), else the defaults."""
        values: dict[str, Any] = {}
        for layer in layers:
            for name in POLICY_FIELDS:
                if name not in values and (layer or {}).get(name) is not None:
                    values[name] = (layer or {})[name]
        return cls(**values)

    @property
    def quarantines(self) -> bool:
        return self.on_bad_record == "quarantine"

    def bound(self, fetched: int, stated: int | None) -> int:
        """How many records the run may quarantine: a count as it is; a percentage of the
        records fetched so far, or of the total the source states, or of PERCENT_FLOOR
        records, whichever is largest (so the second bad record of a run's first page
        does not fail it: a percentage needs records to be one of)."""
        limit = parse_max_bad(self.max_bad_records)
        if isinstance(limit, int):
            return limit
        return math.floor(limit / 100 * max(fetched, stated or 0, PERCENT_FLOOR))

    def describe_bound(self) -> str:
        limit = parse_max_bad(self.max_bad_records)
        if isinstance(limit, int):
            return str(limit)
        return (
            f"{limit:g}% of the records fetched, of the stated total or of "
            f"{PERCENT_FLOOR:,} records, whichever is largest"
        )


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


def judge(
    task: JudgedTask,
    ctx: JudgingContext,
    seq: int,
    raw: list[Any],
    policy: RecordPolicy,
    spec: RecordSpec | None,
    process: bool = True,
) -> Judged:
    """One page through the task's ``process`` and the record model's check (see the
    module). Raises SOURCE_CONTRACT for a page every record of which breaks one rule (or
    any bad record under ``fail``: SOURCE_CONTRACT for the process step, RECORD_MODEL naming
    the record and field for the model), and for a new field under ``freeze``.
    ``process``: False for records processed already (checked against the model only)."""
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
        converted, faults = spec.coerced(records)
    else:
        converted, faults = None, spec.failures(records)
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


# -- the tables --------------------------------------------------------------------------------


class QuarantinedRecord(SQLModel, table=True):
    """A record set aside by a run, replayable. (run_key, page_seq, position) is unique:
    a page judged again (a retried attempt) keeps one row per record."""

    __tablename__ = "quarantined_record"
    __table_args__ = (
        UniqueConstraint("run_key", "page_seq", "position", name="uq_quarantined_record_place"),
        Index("ix_quarantined_record_run_status", "run_key", "status"),
        Index("ix_quarantined_record_created", "created_at"),
    )

    id: int | None = SqlField(default=None, primary_key=True)
    run_key: str = SqlField(max_length=200)
    task_code: str = SqlField(max_length=64)
    task_id: str = SqlField(max_length=200, index=True)
    provenance: str | None = SqlField(default=None, max_length=64)
    page_seq: int
    position: int
    stage: str = SqlField(max_length=16)
    record_key: str | None = SqlField(default=None, sa_column=Column(Text))
    # The record as shown (redacted like a log line when it holds a secret) and, then,
    # the record itself sealed for its replay (Fernet under the master key).
    record: str | None = SqlField(default=None, sa_column=Column(Text))
    record_sealed: str | None = SqlField(default=None, sa_column=Column(Text))
    record_bytes: int = 0
    error_code: str = SqlField(max_length=40)
    field_path: str | None = SqlField(default=None, max_length=300)
    message: str = SqlField(sa_column=Column(Text, nullable=False))
    status: str = SqlField(default=QuarantineStatus.QUARANTINED.value, max_length=16)
    replays: int = 0
    replayed_by: str | None = SqlField(default=None, max_length=300)
    created_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)


class QuarantineRun(SQLModel, table=True):
    """What a replay needs of the run that quarantined records: its task, params and
    output (as in its history: sealed secrets stay references)."""

    __tablename__ = "quarantine_run"

    run_key: str = SqlField(primary_key=True, max_length=200)
    task_code: str = SqlField(max_length=64)
    task_id: str = SqlField(max_length=200, index=True)
    provenance: str | None = SqlField(default=None, max_length=64)
    params: str = SqlField(sa_column=Column(Text, nullable=False))
    output: str = SqlField(sa_column=Column(Text, nullable=False))
    created_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)


class SchemaDrift(SQLModel, table=True):
    """A field a run saw the source add (or stop sending): one row per run and field."""

    __tablename__ = "schema_drift"

    run_key: str = SqlField(primary_key=True, max_length=200)
    field_name: str = SqlField(primary_key=True, max_length=200)
    kind: str = SqlField(max_length=16)
    task_code: str = SqlField(max_length=64)
    task_id: str = SqlField(max_length=200)
    provenance: str | None = SqlField(default=None, max_length=64)
    page_seq: int
    example: str | None = SqlField(default=None, sa_column=Column(Text))
    type_name: str | None = SqlField(default=None, max_length=40)
    action: str = SqlField(max_length=16)
    created_at: datetime = SqlField(default_factory=utcnow, sa_type=UTCDateTime)


_Q = QuarantinedRecord.__table__  # type: ignore[attr-defined]
_RUNS = QuarantineRun.__table__  # type: ignore[attr-defined]
_DRIFT = SchemaDrift.__table__  # type: ignore[attr-defined]


@dataclass
class RunPlace:
    """Which run a page belongs to, for the rows written about it: ``run_key`` the run
    that fetched it (a window's own), ``task_id`` the run that was started."""

    run_key: str
    task_code: str
    task_id: str
    provenance: str | None
    params: dict[str, Any]
    output: dict[str, Any]


def _rows(
    place: RunPlace,
    seq: int,
    bad: list[BadRecord],
    max_record_bytes: int,
    now: datetime,
    seal: RecordSeal | None,
) -> list[dict[str, Any]]:
    rows = []
    for b in bad:
        body = jsonio.dumps(b.record)
        kept = len(body) <= max_record_bytes
        shown, sealed = _kept_record(b.record, body, seal) if kept else (None, None)
        rows.append(
            {
                "run_key": place.run_key,
                "task_code": place.task_code,
                "task_id": place.task_id,
                "provenance": place.provenance,
                "page_seq": seq,
                "position": b.position,
                "stage": b.stage.value,
                "record_key": jsonio.dumps(redact_json(b.key)).decode() if b.key else None,
                "record": shown,
                "record_sealed": sealed,
                "record_bytes": len(body),
                "error_code": b.code,
                "field_path": (b.field or None) and redact_text(str(b.field))[:300],
                "message": redact_text(b.message)[:2000] + _not_kept(kept, shown, len(body)),
                "status": QuarantineStatus.QUARANTINED.value,
                "replays": 0,
                "replayed_by": None,
                "created_at": now,
                "updated_at": now,
            }
        )
    return rows


def _not_kept(kept: bool, shown: str | None, size: int) -> str:
    if not kept:
        return f" (record of {size} bytes not kept: over the bound)"
    if shown is None:
        return " (record not kept: it holds a secret value and there is no key to seal it)"
    return ""


def _kept_record(
    record: Any, body: bytes, seal: RecordSeal | None
) -> tuple[str | None, str | None]:
    """(the record as shown, the record sealed): a record that holds a secret value (a key
    the source echoes) is shown redacted and kept sealed for its replay; without a seal
    it is not kept (a replay never lands a redacted record)."""
    text = body.decode()
    if redact_text(text) == text:
        return text, None
    if seal is None:
        return None, None
    return jsonio.dumps(redact_json(record)).decode(), seal.seal(text)


class RecordSeal:
    """Quarantined records that hold a secret, sealed at rest (Fernet, under a key
    derived from the master key for this purpose alone: ``artemis.vault``); opened by
    the replay only."""

    PURPOSE = "quarantined-records"

    def __init__(self, key_file: str) -> None:
        self.key_file = key_file
        self._fernet: MultiFernet | None = None

    @property
    def fernet(self) -> MultiFernet:
        if self._fernet is None:  # (read when a record needs it: most runs never do)
            self._fernet = derive_multi(master_keys(self.key_file), self.PURPOSE)
        return self._fernet

    def seal(self, text: str) -> str:
        return self.fernet.encrypt(text.encode()).decode()

    def open(self, token: str) -> str:
        try:
            return self.fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                "a quarantined record cannot be opened with the master key "
                f"({MASTER_KEY_ENV}; a previous key belongs in {PREVIOUS_KEYS_ENV})",
                retryable=False,
            ) from None


@cache
def _statements(dialect: str) -> tuple[Any, Any, Any, Any]:
    """(the run's row, new rows, rows rewritten, the started run's count), built once per
    dialect: a page's rows go in one executemany of a statement compiled once."""
    from sqlalchemy.dialects import postgresql, sqlite

    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    run = insert(_RUNS).on_conflict_do_nothing(index_elements=["run_key"])
    rows = insert(_Q)
    rows = rows.on_conflict_do_update(
        index_elements=["run_key", "page_seq", "position"],
        set_={
            k: rows.excluded[k]
            for k in (
                "stage",
                "record_key",
                "record",
                "record_sealed",
                "record_bytes",
                "error_code",
                "field_path",
                "message",
                "updated_at",
            )
        },
    )
    fresh = (
        insert(_Q)
        .on_conflict_do_nothing(index_elements=["run_key", "page_seq", "position"])
        .returning(_Q.c.id)
    )
    count = select(func.count()).select_from(_Q).where(_Q.c.task_id == bindparam("p_task_id"))
    return run, fresh, rows, count


def store_bad(
    database_url: str,
    place: RunPlace,
    pages: list[tuple[int, list[BadRecord]]],
    max_record_bytes: int,
    with_run: bool = True,
    seal: RecordSeal | None = None,
) -> tuple[int, int]:
    """Keep each page's bad records, ``[(seq, bad)]`` (one row per record and place: a page
    judged again rewrites its rows); returns how many rows the started run
    (``place.task_id``) holds now, and how many of these are new. A record larger than
    ``max_record_bytes`` is kept with its reason but without its body (it cannot be
    replayed). ``with_run``: write what a replay needs of the run too (once per activity
    is enough). What the rows show is redacted as log lines are; a record holding a
    secret is kept sealed by ``seal`` (none: not kept)."""
    engine = get_engine(database_url)
    run_stmt, fresh_stmt, rows_stmt, count = _statements(engine.dialect.name)
    now = utcnow()
    rows = []
    for seq, bad in pages:
        rows.extend(_rows(place, seq, bad, max_record_bytes, now, seal))
    counted = {"p_task_id": place.task_id}
    with engine.begin() as c:
        if with_run:
            c.execute(
                run_stmt,
                {
                    "run_key": place.run_key,
                    "task_code": place.task_code,
                    "task_id": place.task_id,
                    "provenance": place.provenance,
                    "params": jsonio.dumps(place.params).decode(),
                    "output": jsonio.dumps(place.output).decode(),
                    "created_at": now,
                },
            )
        new = len(c.execute(fresh_stmt, rows).all()) if rows else 0
        if new < len(rows):  # a page judged again (a retried attempt): its rows rewritten
            c.execute(rows_stmt, rows)
        held = int(c.execute(count, counted).scalar_one())
    return held, new


def note_drift(
    database_url: str,
    place: RunPlace,
    seq: int,
    drift: list[Drift],
    action: str,
    actions: dict[str, str] | None = None,
) -> list[Drift]:
    """Record drift once per run and field; returns the drift not seen before in the run.
    ``action``: what became of a new field (``actions``: of each one, where they differ:
    ``evolved`` or ``skipped``)."""
    if not drift:
        return []
    engine = get_engine(database_url)
    insert = upsert_insert(engine)
    new: list[Drift] = []
    with engine.begin() as conn:
        for d in drift:
            done = conn.execute(
                insert(_DRIFT)
                .values(
                    # once per started run and field (a backfill's windows report it once)
                    run_key=_drift_key(place),
                    field_name=d.field,
                    kind=d.kind,
                    task_code=place.task_code,
                    task_id=place.task_id,
                    provenance=place.provenance,
                    page_seq=seq,
                    example=None if d.example is None else example_text(d.example),
                    type_name=d.type_name,
                    action=(actions or {}).get(d.field, action) if d.kind == "added" else "noted",
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing(index_elements=["run_key", "field_name"])
            )
            if done.rowcount:
                new.append(d)
    return new


def _drift_key(place: RunPlace) -> str:
    return f"{place.task_code}/{place.task_id}"


def run_actions(database_url: str, place: RunPlace) -> dict[str, str]:
    """What the started run (all its windows) did with each new field it saw so far:
    field → ``evolved``, ``skipped``, ``discarded`` or ``frozen``."""
    q = select(_DRIFT.c.field_name, _DRIFT.c.action).where(
        _DRIFT.c.run_key == _drift_key(place), _DRIFT.c.kind == "added"
    )
    with get_engine(database_url).connect() as conn:
        return {str(f): str(a) for f, a in conn.execute(q).all()}


def run_drift(database_url: str, run_key: str) -> list[dict[str, Any]]:
    with get_engine(database_url).connect() as conn:
        rows = conn.execute(
            select(_DRIFT).where(_DRIFT.c.run_key == run_key).order_by(_DRIFT.c.created_at)
        ).all()
    return [dict(r._mapping) for r in rows]


# -- reading and replaying ---------------------------------------------------------------------


@dataclass(frozen=True)
class RowFilter:
    """Rows across runs: of one owner's runs (None: every owner's), of a provenance,
    set aside since an instant, of an error code."""

    owner: str | None = None
    provenance: str | None = None
    since: datetime | None = None
    code: str | None = None

    def where(self, q: Any) -> Any:
        if self.owner is not None:
            mine = owned_task_id(self.owner, "")
            # the default owner's task ids carry no owner: none holds the separator
            q = q.where(
                _Q.c.task_id.startswith(mine, autoescape=True)
                if mine
                else ~_Q.c.task_id.contains(OWNER_SEP, autoescape=True)
            )
        if self.provenance is not None:
            q = q.where(_Q.c.provenance == self.provenance)
        if self.since is not None:
            q = q.where(_Q.c.created_at >= self.since)
        if self.code is not None:
            q = q.where(_Q.c.error_code == self.code)
        return q


def list_rows(
    database_url: str,
    *,
    task_id: str | None = None,
    task_ids: list[str] | None = None,
    status: str | None = None,
    after_id: int = 0,
    limit: int = 100,
    with_record: bool = False,
    ids: list[int] | None = None,
    key_file: str | None = None,
    across: RowFilter | None = None,
) -> list[dict[str, Any]]:
    """A run's rows in id order (``across``: the rows of the runs it selects).
    ``with_record``: with the record as shown (redacted when it holds a secret);
    ``key_file`` too (the replay, in a worker): the record itself, opened from its seal."""
    left_out = {"record_sealed"}  # (the replay's alone)
    if not with_record:
        left_out.add("record")
    elif key_file:
        left_out.clear()
    cols = [c for c in _Q.c if c.name not in left_out]
    q = select(*cols).where(_Q.c.id > after_id)
    if ids is not None:
        q = q.where(_Q.c.id.in_(ids))
    if task_id is not None:
        q = q.where(_Q.c.task_id == task_id)
    if task_ids is not None:
        q = q.where(_Q.c.task_id.in_(task_ids))
    if status is not None:
        q = q.where(_Q.c.status == status)
    if across is not None:
        q = across.where(q)
    with get_engine(database_url).connect() as conn:
        rows = conn.execute(q.order_by(_Q.c.id).limit(limit)).all()
    out = [dict(r._mapping) for r in rows]
    if with_record and key_file:
        seal = RecordSeal(key_file)
        for row in out:
            sealed = row.pop("record_sealed", None)
            if sealed is not None:
                row["record"] = seal.open(sealed)
    return [_shown(row) for row in out]


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """A row as read: ``stage`` says which check set it aside, ``replay_from`` where a
    replay judges it again from (the column ``stage`` stores)."""
    row["replay_from"] = row.get("stage")
    row["stage"] = check_of(row.get("error_code")).value
    for name in ("record_key", "record"):
        if isinstance(row.get(name), str):
            row[name] = jsonio.loads(row[name])
    return row


def get_row(database_url: str, row_id: int) -> dict[str, Any] | None:
    """One row as shown (the API's view: a record holding a secret, redacted)."""
    cols = [c for c in _Q.c if c.name != "record_sealed"]
    with get_engine(database_url).connect() as conn:
        row = conn.execute(select(*cols).where(_Q.c.id == row_id)).first()
    return _shown(dict(row._mapping)) if row is not None else None


def counts(
    database_url: str, task_id: str | None, across: RowFilter | None = None
) -> dict[str, int]:
    """Rows by status: a run's (``task_id``), or those ``across`` selects."""
    q = select(_Q.c.status, func.count())
    if task_id is not None:
        q = q.where(_Q.c.task_id == task_id)
    if across is not None:
        q = across.where(q)
    with get_engine(database_url).connect() as conn:
        rows = conn.execute(q.group_by(_Q.c.status)).all()
    return {str(s): int(n) for s, n in rows}


def run_of(database_url: str, task_id: str) -> dict[str, Any] | None:
    with get_engine(database_url).connect() as conn:
        row = conn.execute(select(_RUNS).where(_RUNS.c.task_id == task_id)).first()
    if row is None:
        return None
    out = dict(row._mapping)
    out["params"] = jsonio.loads(out["params"])
    out["output"] = jsonio.loads(out["output"])
    return out


def discard(database_url: str, task_id: str, ids: list[int] | None = None) -> int:
    """Give up on quarantined records (kept, marked discarded, never replayed)."""
    q = update(_Q).where(_Q.c.task_id == task_id, _Q.c.status == QuarantineStatus.QUARANTINED.value)
    if ids is not None:
        q = q.where(_Q.c.id.in_(ids))
    with get_engine(database_url).begin() as conn:
        return conn.execute(
            q.values(status=QuarantineStatus.DISCARDED.value, updated_at=utcnow())
        ).rowcount


def mark_replayed(conn: Connection, row_id: int, by: str) -> None:
    conn.execute(
        update(_Q)
        .where(_Q.c.id == row_id, _Q.c.status == QuarantineStatus.QUARANTINED.value)
        .values(
            status=QuarantineStatus.REPLAYED.value,
            replays=_Q.c.replays + 1,
            replayed_by=by,
            updated_at=utcnow(),
        )
    )


def mark_still_bad(conn: Connection, row_id: int, bad: BadRecord) -> None:
    conn.execute(
        update(_Q)
        .where(_Q.c.id == row_id)
        .values(
            error_code=bad.code,
            field_path=(bad.field or None) and redact_text(str(bad.field))[:300],
            message=redact_text(bad.message)[:2000],
            replays=_Q.c.replays + 1,
            updated_at=utcnow(),
        )
    )


def drop_older_than(database_url: str, days: float) -> int:
    """Housekeeping: rows (and their runs' replay data) older than ``days``."""
    before = utcnow() - timedelta(days=days)
    with get_engine(database_url).begin() as conn:
        n = conn.execute(delete(_Q).where(_Q.c.created_at < before)).rowcount
        kept = select(_Q.c.run_key).distinct()
        conn.execute(delete(_RUNS).where(_RUNS.c.created_at < before, _RUNS.c.run_key.not_in(kept)))
        conn.execute(delete(_DRIFT).where(_DRIFT.c.created_at < before))
    return int(n or 0)


def check_bound(count: int, policy: RecordPolicy, fetched: int, stated: int | None) -> None:
    """BAD_RECORDS once the run holds more quarantined records than it may."""
    bound = policy.bound(fetched, stated)
    if count > bound:
        raise ArtemisError(
            ErrorCode.BAD_RECORDS,
            f"{count} records quarantined, more than max_bad_records allows "
            f"({policy.describe_bound()}: {bound} of "
            f"{max(fetched, stated or 0, PERCENT_FLOOR)} records): the "
            "quarantined records are kept (artemis quarantine list)",
            retryable=False,
            details={"quarantined": count, "bound": bound},
        )


# -- a run's pages judged (what the process activities use) -----------------------------------


@dataclass
class Outcome:
    """One page judged and its rows written: what goes on, and what to count and tell."""

    records: list[dict[str, Any]]
    quarantined: int = 0
    dropped: int = 0
    sample: BadRecord | None = None
    filtered: int = 0  # records the task's process left out on purpose
    new_drift: list[Drift] = field(default_factory=list)
    evolved: list[str] = field(default_factory=list)
    # New fields the model did not take, and why (an invalid name, the column budget,
    # schema.max_new_fields): told in their schema_drift events.
    skipped: dict[str, str] = field(default_factory=dict)
    held: int = 0  # the run's quarantined records in all, after this page
    new: int = 0  # rows this page added (a page judged again adds none)
    seq: int = 0
    bad: list[BadRecord] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)  # not seen before in this activity
    # A page of several lanes: each lane's own judgement (``LanedJudge``).
    parts: dict[str, Outcome] = field(default_factory=dict)


class PageJudge:
    """A run's pages judged one after another in one activity (``judge``), the bad records
    kept, the run's bound checked, drift recorded once per run and field (and the model
    evolved when the run's contract says so).

    ``fetched``: the records the run had fetched when the activity started (a streaming
    fetch: before its batch, and it adds each page it judges; ``counts_pages``)."""

    def __init__(
        self,
        task: JudgedTask,
        ctx: JudgingContext,
        place: RunPlace,
        fetched: int,
        stated: int | None,
        counts_pages: bool,
    ) -> None:
        self.task, self.ctx, self.place = task, ctx, place
        judges = task.judges_records
        self.policy = task.record_policy(ctx) if judges else RecordPolicy(on_bad_record="fail")
        self.spec = task.record_spec(ctx.params) if judges else None
        self.fetched, self.stated, self.counts_pages = fetched, stated, counts_pages
        self.database_url = ctx.settings.database.url
        self.max_record_bytes = ctx.settings.quarantine.max_record_bytes
        self.max_new_fields = ctx.settings.schema.max_new_fields
        self.seal = RecordSeal(ctx.settings.vault.master_key_file)
        self._noted: set[str] = set()
        self._run_written = False

    def page(self, seq: int, raw: list[Any]) -> Outcome:
        """The page judged (CPU only: the task's process and the model's check)."""
        if self.counts_pages:
            self.fetched += len(raw)
        judged = judge(self.task, self.ctx, seq, raw, self.policy, self.spec)
        out = Outcome(judged.records, len(judged.bad), judged.fields_dropped)
        out.seq, out.bad, out.filtered = seq, judged.bad, judged.filtered
        out.sample = judged.bad[0] if judged.bad else None
        out.drift = [d for d in judged.drift if d.field not in self._noted]
        self._noted.update(d.field for d in out.drift)
        return out

    @staticmethod
    def brief(outcomes: list[Outcome]) -> bool:
        """Keeping them is a few short statements (no drift: no registry write)."""
        return not any(o.drift for o in outcomes)

    def keep(self, outcomes: list[Outcome]) -> None:
        """Judged pages' rows kept in one transaction, the run's bound checked
        (BAD_RECORDS past it), their drift recorded once per run and field (and the model
        evolved): before any of these pages is counted as delivered."""
        pages = [(o.seq, o.bad) for o in outcomes if o.bad]
        if pages:
            held, new = store_bad(
                self.database_url,
                self.place,
                pages,
                self.max_record_bytes,
                with_run=not self._run_written,
                seal=self.seal,
            )
            self._run_written = True
            for o in outcomes:
                o.held = held
            next(o for o in reversed(outcomes) if o.bad).new = new
            check_bound(held, self.policy, self.fetched, self.stated)
        for out in outcomes:
            if out.drift:
                self._keep_drift(out)

    def _keep_drift(self, out: Outcome) -> None:
        """A page's drift recorded once per run and field; under ``evolve``, the new
        fields the import's rules allow (``evolution_plan``), at most
        ``schema.max_new_fields`` a run, added to the model and the rest recorded
        ``skipped`` with the reason (``out.skipped``)."""
        contract = self.policy.schema_contract
        action = {"evolve": "evolved", "freeze": "frozen"}.get(contract, "discarded")
        added = {d.field: d.type_name or "json | None" for d in out.drift if d.kind == "added"}
        grow: dict[str, str] = {}
        actions: dict[str, str] = {}
        if added and contract == "evolve":
            grow, out.skipped = self._plan(added)
            actions = {name: "skipped" for name in out.skipped}
        out.new_drift = note_drift(
            self.database_url, self.place, out.seq, out.drift, action, actions
        )
        if grow and self.task.evolve_model(self.ctx, grow):
            out.evolved = sorted(grow)

    def _plan(self, added: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """(the fields to add, {field: why skipped}) of ``added``: a field this run
        decided on before keeps its decision (another window's, or a retried attempt's:
        an ``evolved`` one is added again, which changes nothing when it is there); the
        others are held to the rules against the run's model and the fields it added."""
        decided = run_actions(self.database_url, self.place)
        evolved = [name for name, act in decided.items() if act == "evolved"]
        fresh = {k: v for k, v in added.items() if k not in decided}
        assert self.spec is not None  # (drift is found against a model)
        room = max(0, self.max_new_fields - len(evolved))
        grow, skipped = evolution_plan(
            [*self.spec.model.model_fields, *evolved],
            fresh,
            room,
            f"over schema.max_new_fields ({self.max_new_fields} new fields a run)",
        )
        grow.update({k: v for k, v in added.items() if k in evolved})
        return grow, skipped


class LanedJudge:
    """A run of several lanes (``JudgedTask.lanes``: a provenance of several resources):
    each lane's records of a page judged by that lane's own ``PageJudge`` — its record
    model and policy, its quarantine and drift under a run key of its own
    (``{run key}/{lane}``, whose replay runs with the lane's params and output) — and the
    page's outcome their sum, its records still by lane. Drift is told as
    ``{lane}.{field}``."""

    def __init__(
        self,
        task: JudgedTask,
        ctx: JudgingContext,
        place: RunPlace,
        lanes: list[str],
        fetched: int,
        stated: int | None,
        counts_pages: bool,
    ) -> None:
        self.judges: dict[str, PageJudge] = {}
        for lane in lanes:
            params = task.lane_params(ctx.params, lane)
            # (a TaskContext, a dataclass: the lane's own copy)
            own = dataclasses.replace(cast(Any, ctx), params=params, rejected=[])
            spot = dataclasses.replace(
                place,
                run_key=f"{place.run_key}/{lane}",
                params={**place.params, "resource": lane, "only": True},
                output=lane_output(place.output, lane),
            )
            self.judges[lane] = PageJudge(task, own, spot, fetched, stated, counts_pages)

    @property
    def stated(self) -> int | None:
        return next(iter(self.judges.values())).stated

    @stated.setter
    def stated(self, value: int | None) -> None:
        for judge in self.judges.values():
            judge.stated = value

    def page(self, seq: int, raw: list[Any]) -> Outcome:
        groups: dict[str, list[Any]] = {}
        for r in raw:
            groups.setdefault(r[RESOURCE_KEY], []).append(r[RECORD_KEY])
        parts = {lane: self.judges[lane].page(seq, recs) for lane, recs in groups.items()}
        records = [
            {RESOURCE_KEY: lane, RECORD_KEY: r} for lane, o in parts.items() for r in o.records
        ]
        out = Outcome(records, sum(o.quarantined for o in parts.values()))
        out.dropped = sum(o.dropped for o in parts.values())
        out.filtered = sum(o.filtered for o in parts.values())
        out.seq, out.parts = seq, parts
        out.bad = [b for o in parts.values() for b in o.bad]
        out.sample = next((o.sample for o in parts.values() if o.sample), None)
        out.drift = [d for o in parts.values() for d in o.drift]
        return out

    @staticmethod
    def brief(outcomes: list[Outcome]) -> bool:
        return PageJudge.brief(outcomes)

    def keep(self, outcomes: list[Outcome]) -> None:
        """Each lane's pages kept by its judge; the pages' outcomes then say the sums."""
        for lane, judge in self.judges.items():
            mine = [o.parts[lane] for o in outcomes if lane in o.parts]
            if mine:
                judge.keep(mine)
        for o in outcomes:
            o.held = sum(p.held for p in o.parts.values())
            o.new = sum(p.new for p in o.parts.values())
            o.new_drift = [
                Drift(f"{lane}.{d.field}", d.kind, d.example, d.type_name)
                for lane, p in o.parts.items()
                for d in p.new_drift
            ]
            o.evolved = [f"{lane}.{f}" for lane, p in o.parts.items() for f in p.evolved]
            o.skipped = {
                f"{lane}.{k}": v for lane, p in o.parts.items() for k, v in p.skipped.items()
            }


def page_judge(
    task: JudgedTask,
    ctx: JudgingContext,
    place: RunPlace,
    fetched: int,
    stated: int | None,
    counts_pages: bool,
) -> PageJudge | LanedJudge:
    """The judge of a run's pages: one ``PageJudge``, or one per lane (``LanedJudge``)."""
    lanes = task.lanes(ctx.params) if task.judges_records else None
    if lanes:
        return LanedJudge(task, ctx, place, list(lanes), fetched, stated, counts_pages)
    return PageJudge(task, ctx, place, fetched, stated, counts_pages)


# What judges a run's pages (``page_judge``).
Judge = PageJudge | LanedJudge
