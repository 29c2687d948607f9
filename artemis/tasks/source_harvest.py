"""``source_harvest``: harvest any registry provenance in its own record model, through the
execution contract resolved from the registry once per run and frozen in its params (so
in history). Nothing about the source is code: the provenance's registry entry says where
to ask, how to page, what the records are and where the run's pointer is read.

- ``harvest``: the whole query (optionally within ``start``..``end``);
- ``update``: from the watermark minus the contract's overlap (the first run: ``start``,
  else now minus the lookback) up to now minus its lag; or, with an ``ID``/``COMPOSITE``
  pointer, from the largest id the last run saw. The watermark advances only when the
  run completes;
- ``backfill``: ``start``..``end`` cut into the contract's windows, each a child run.

``literature_harvest`` (artemis/literature/harvest.py) is this task for the paper
families, its records normalised to the paper shape.
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator
from sqlalchemy.engine import Connection

from artemis import jsonio
from artemis.bounds import OutageTolerance
from artemis.config import Settings
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.logsetup import get_logger
from artemis.quarantine.policy import POLICY_FIELDS, RecordPolicy, RecordPolicyParams
from artemis.registry.client import ContractClient, require_credentials
from artemis.registry.evolve import evolve_record_model
from artemis.registry.frozen import load_contract, store_contract
from artemis.registry.models import DEFAULT_RESOURCE
from artemis.registry.record_steps import Refused, Step, StepEnv, apply_steps, steps_of
from artemis.registry.resolve import (
    Contract,
    as_utc,
    in_field_order,
    place_of,
    resolve_contract,
)
from artemis.registry.rest_source import rest_source
from artemis.registry.tree import (
    adopted,
    changed_since,
    for_parent,
    resource_contract,
    resource_problems,
    walked,
)
from artemis.registry.watermark import (
    PointerKey,
    advance_pointer,
    drop_seen,
    largest,
    note_seen,
    pointer_field,
    pointer_of,
    read_pointer,
    take_seen,
)
from artemis.registry.windows import (
    EARLIEST,
    count_windows,
    day_start,
    halves,
    iter_windows,
    pointer_problems,
    source_zone,
    update_window,
    window_query,
)
from artemis.run_state import RunStatus
from artemis.sinks.records import RecordSpec, declared_spec, record_model_name
from artemis.sources import Source
from artemis.sources.tree import NoPages, TreeSource, Walking
from artemis.tasks.base import (
    ChildPlan,
    Lane,
    TaskContext,
    TaskUnit,
    describe_validation_error,
    policy_params,
)

log = get_logger(__name__)


# The most child params one slice of a backfill's plan returns, as JSON: a local
# activity's result recorded in the parent's history (docs/performance.md).
CHILD_SLICE_BYTES = 64 * 1024
# The longest query a request may send: a run's params travel in its history, and no
# source's own query language needs more.
MAX_QUERY_CHARS = 2048


class SourceParams(RecordPolicyParams):
    model_config = {"extra": "forbid"}

    provenance: str = Field(min_length=1)
    task_type: Literal["harvest", "update", "backfill"] = "harvest"
    start: date | None = None
    end: date | None = None
    query: str | None = Field(None, max_length=MAX_QUERY_CHARS)
    page_size: int | None = Field(None, ge=1, le=10_000)
    # backfill: windows run at once (at most the provenance's rate_limit.max_concurrency)
    parallelism: int | None = Field(None, ge=1, le=32)
    # A provenance of several resources: one resource (with its parent resources, fetched
    # for their values; their records land too unless ``only``).
    resource: str | None = Field(None, min_length=1, max_length=64)
    only: bool = False
    # The shortfall against the source's stated total this run accepts (percent); default:
    # the registry's pagination_cfg.completeness_tolerance_pct, else 0.
    completeness_tolerance_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    # How long an outage of the source or a sink is waited out; default: the registry's
    # retry_cfg.outage_tolerance_millis, else runs.outage_tolerance_s. 0: fail fast.
    outage_tolerance_s: OutageTolerance = None
    # Filled by prepare_params: the frozen contract, the window actually harvested and an
    # ID/COMPOSITE update's pointer.
    contract: dict[str, Any] | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    pointer: Any = None
    parent: str | None = None  # the task id of the run that fanned this one out
    # A child run's contract by reference (artemis/registry/frozen.py), read when it
    # prepares: a parent starting many children carries no contract per child.
    contract_ref: str | None = None

    @model_validator(mode="after")
    def _window(self) -> SourceParams:
        for name in ("start", "end"):
            day = getattr(self, name)
            if day is not None and day < EARLIEST.date():
                raise ValueError(
                    f"{name} ({day}) is before {EARLIEST.date()}, the earliest day a window "
                    "may name"
                )
        if self.start and self.end and self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        return self


def child_params(
    p: SourceParams, start: date, end: date, parent: str, contract_ref: str
) -> dict[str, Any]:
    """A child run's params: ``p``'s query over ``start``..``end``, its frozen contract by
    reference (stored once: artemis/registry/frozen.py)."""
    return {
        "provenance": p.provenance,
        "task_type": "harvest",
        "query": p.query,
        "page_size": p.page_size,
        "resource": p.resource,
        "only": p.only,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "contract_ref": contract_ref,
        "completeness_tolerance_pct": p.completeness_tolerance_pct,
        "outage_tolerance_s": p.outage_tolerance_s,
        # the run's record policy, applied by each window (max_bad_records per window)
        **{name: getattr(p, name) for name in POLICY_FIELDS},
        "window_start": None,
        "window_end": None,
        "parent": parent,
    }


def check_days(p: SourceParams, contract: dict[str, Any], now: datetime, max_windows: int) -> None:
    """A window's days are not in the future (today is the source zone's), and a
    backfill's range cuts into at most ``runs.max_windows`` windows: INVALID_INPUT naming
    the field, the bound and the count."""
    tz = source_zone(contract)
    today = now.astimezone(tz).date()
    for name in ("start", "end"):
        day = getattr(p, name)
        if day is not None and day > today:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"params.{name}: {day} is in the future (today is {today} in the source's "
                f"time zone, {tz}): a window ends at most today",
            )
    if p.task_type == "backfill" and p.start is not None and p.end is not None:
        count = count_windows(p.start, p.end, contract.get("window_offset") or {})
        if count > max_windows:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"params.start..params.end: {p.start}..{p.end} cuts into {count} windows, "
                f"more than runs.max_windows ({max_windows}): backfill shorter ranges, or "
                "raise the bound in the configuration",
                details={"windows": count, "max_windows": max_windows},
            )


def record_model_row(contract: dict[str, Any] | None) -> dict[str, Any] | None:
    """The contract's record model row; a contract frozen before the record model was a
    dimension carried it in its provenance (fields only)."""
    contract = contract or {}
    row = contract.get("record_model")
    if row is None and "record_model" not in contract:
        old = (contract.get("provenance") or {}).get("record_model")
        if old:
            return {"key_json": old["key"], "fields_json": old["fields"]}
    return row


def declared_model(contract: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record model a contract declares as fields and key, or None."""
    row = record_model_row(contract)
    if not row or row.get("fields_json") is None:
        return None
    fields = in_field_order(row["fields_json"], row.get("field_order"))
    return {"key": row.get("key_json"), "fields": fields}


def record_family(contract: dict[str, Any] | None) -> str | None:
    return (record_model_row(contract) or {}).get("record_family_code")


class SourceHarvest(TaskUnit):
    code = "source_harvest"
    Params: ClassVar[type[BaseModel]] = SourceParams
    summary = "Harvest any registry source in its own record model"

    internal_params = (
        "contract",
        "contract_ref",
        "window_start",
        "window_end",
        "parent",
        "pointer",
    )
    prepare_blocks = True  # the registry's contract and watermark, read in the database

    # -- which provenances this task runs -------------------------------------------------
    def check_provenance(self, contract: Contract) -> None:
        """A paper family is the papers task's: its records are normalised there."""
        family = record_family(contract.to_dict())
        if family is not None:
            code = contract.provenance["provenance_code"]
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"provenance {code!r} declares the paper family {family} "
                f"(record_model.record_family_code): harvest it with literature_harvest "
                f"-p provenance={code}",
            )

    def check_window(self, contract: Contract) -> None:
        """A window row written around the import's checks stops the run before it asks."""
        problems = pointer_problems(contract.window_offset or {})
        if problems:
            code = contract.provenance["provenance_code"]
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"provenance {code!r}: window_offset_cfg: {'; '.join(problems)}",
            )

    def window_of(
        self, start: date | None, end: date | None, contract: dict[str, Any]
    ) -> tuple[datetime | None, datetime | None]:
        """Days ``start``..``end`` (inclusive) as instants ``[from, to)`` in the source's
        zone."""
        tz = source_zone(contract)
        return day_start(start, tz), day_start(end + timedelta(days=1), tz) if end else None

    # -- 1. params ------------------------------------------------------------------------
    def prepare_params(
        self, incoming: dict[str, Any], settings: Settings, trusted: bool = False
    ) -> BaseModel:
        params: SourceParams = super().prepare_params(  # type: ignore[assignment]
            incoming, settings, trusted
        )
        if params.parent and (params.contract or params.contract_ref):
            # A child run: its parent's frozen contract (stored once, by reference), over
            # its own window.
            if params.contract is None:
                with get_engine(settings.database.url).connect() as conn:
                    params.contract = load_contract(conn, str(params.contract_ref))
            params.window_start, params.window_end = self.window_of(
                params.start, params.end, params.contract
            )
            return params
        now = datetime.now(UTC)
        with get_engine(settings.database.url).connect() as conn:
            contract = resolve_contract(conn, params.provenance, params.task_type, now)
            self._check_contract(contract, params)
            frozen = contract.to_dict()
            check_days(params, frozen, now, settings.runs.max_windows)
            start, end = self.window_of(params.start, params.end, frozen)
            if params.task_type == "update":
                start, end = self._update_window(conn, contract, params, start, end, now)
        params.contract = frozen
        params.window_start, params.window_end = start, end
        return params

    def _check_contract(self, contract: Contract, params: SourceParams) -> None:
        code = contract.provenance["provenance_code"]
        status = contract.provenance.get("lifecycle_status_code") or "ACTIVE"
        if status != "ACTIVE":
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"provenance {code!r} is {status} (provenance.lifecycle_status_code): "
                "only ACTIVE sources run",
            )
        problems = resource_problems(contract)
        if problems:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR, f"provenance {code!r}: {'; '.join(problems)}"
            )
        if params.resource is not None and not contract.resources:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"params.resource: provenance {code!r} is one resource (its file names no "
                "resource_name): leave resource out",
            )
        if contract.resources:
            walked(contract.resources, params.resource, params.only)  # a known resource
        elif contract.endpoint is None:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"provenance {code!r} has no SEARCH endpoint in force for task_type "
                f"{params.task_type}",
            )
        self.check_provenance(contract)
        self.check_window(contract)
        most = (contract.rate_limit or {}).get("max_concurrency")
        if params.parallelism and most and params.parallelism > int(most):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"params.parallelism: {params.parallelism} is above provenance {code!r}'s "
                f"rate_limit.max_concurrency ({most}), the operator's bound for this source",
            )
        checked = SourceParams(
            provenance=code,
            contract=contract.to_dict(),
            resource=params.resource,
            only=params.only,
        )
        self.record_spec(checked)
        self.record_steps(checked)
        for lane in self.lanes(checked) or {}:
            self.record_spec(self.lane_params(checked, lane))
            self.record_steps(self.lane_params(checked, lane))
        require_credentials(contract)
        if params.task_type == "backfill" and (params.start is None or params.end is None):
            raise ArtemisError(
                ErrorCode.INVALID_INPUT, "params.start and params.end: a backfill needs both"
            )

    def _update_window(
        self,
        conn: Connection,
        contract: Contract,
        params: SourceParams,
        start: datetime | None,
        end: datetime | None,
        now: datetime,
    ) -> tuple[datetime | None, datetime | None]:
        win = contract.window_offset or {}
        mark, cursor = read_pointer(conn, contract.provenance["id"], "update", params.query or "")
        kind = win.get("offset_type_code") or "DATE"
        if kind == "ID":
            # The pointer is the largest id seen; no time window is asked.
            params.pointer = cursor
            return (start, end if params.end else None)
        if kind == "COMPOSITE" and cursor is not None:
            params.pointer = cursor
            mark = as_utc(cursor[0])
        elif kind == "DATE" and cursor is not None:
            mark = as_utc(cursor)
        return update_window(win, mark, start, end if params.end else None, now)

    def plan_children(self, ctx: TaskContext) -> ChildPlan | None:
        """A backfill: its range cut into the contract's windows (calendar months or fixed
        sizes), each a child run; ``parallelism`` (else ``rate_limit.max_concurrency``, else
        2) at once. The contract is stored once here; the windows are listed a slice at a
        time (``child_slice``)."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        if p.task_type != "backfill" or p.parent:
            return None
        assert p.start is not None and p.end is not None
        with get_engine(ctx.settings.database.url).begin() as conn:
            store_contract(conn, p.contract or {})
        count = count_windows(p.start, p.end, self._contract(ctx).window_offset or {})
        return ChildPlan(count=count, parallelism=self._parallelism(ctx))

    def child_slice(self, ctx: TaskContext, offset: int, limit: int) -> list[dict[str, Any]]:
        """The child runs' params of windows ``offset`` .. ``offset + limit - 1``, at most
        ``CHILD_SLICE_BYTES`` of them as JSON (at least one)."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        assert p.start is not None and p.end is not None
        with get_engine(ctx.settings.database.url).begin() as conn:
            # touched (a long backfill's contract is not cleaned up), or stored again
            ref = store_contract(conn, p.contract or {})
        windows = iter_windows(p.start, p.end, self._contract(ctx).window_offset or {})
        out: list[dict[str, Any]] = []
        size = 0
        for a, b in itertools.islice(windows, offset, offset + limit):
            child = child_params(p, a, b, ctx.task_id, ref)
            size += len(jsonio.dumps(child))
            if out and size > CHILD_SLICE_BYTES:
                break
            out.append(child)
        return out

    def _parallelism(self, ctx: TaskContext) -> int:
        p: SourceParams = ctx.params  # type: ignore[assignment]
        contract = self._contract(ctx)
        return int(p.parallelism or (contract.rate_limit or {}).get("max_concurrency") or 2)

    def split_parallelism(self, ctx: TaskContext) -> int:
        """A window or piece (it has a parent) splits inside its parent's slot: one piece
        at a time; a top-level run uses its own parallelism."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        return 1 if p.parent else self._parallelism(ctx)

    def split(self, ctx: TaskContext, details: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Halve the window whose hits exceed the result cap (down to single days)."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        first, last = p.start, p.end
        if first is None or last is None:
            # An update asks its window from the watermark: its days are the window's.
            if p.window_start is None or p.window_end is None:
                return None
            first, last = p.window_start.date(), p.window_end.date()
        pieces = halves(first, last)
        if pieces is None:
            return None
        with get_engine(ctx.settings.database.url).begin() as conn:
            ref = store_contract(conn, p.contract or {})
        return [child_params(p, a, b, ctx.task_id, ref) for a, b in pieces]

    def _contract(self, ctx: TaskContext) -> Contract:
        return Contract(**ctx.params.contract)  # type: ignore[attr-defined]

    # -- records ------------------------------------------------------------------------
    def record_spec(self, params: BaseModel | None = None) -> RecordSpec | None:
        """The provenance's own record model (its ``record_model`` row, frozen in the run's
        contract); None when it declares none (records go as the source gives them, to
        sinks that need no model)."""
        declared = declared_model(self._own(params))
        if declared is None:
            return None
        code = str(getattr(params, "provenance", "") or "")
        place = self.output_place(params) if params is not None else None
        try:
            return declared_spec(declared, record_model_name(place or code))
        except ValidationError as e:  # checked at import: a row edited by hand
            why = describe_validation_error(e, "record_model")
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR, f"provenance {code!r}: {why}", retryable=False
            ) from None

    def output_place(self, params: BaseModel) -> str | None:
        """Each provenance lands in its own table and folder; a resource of a provenance
        of several in its own (artemis/registry/resolve.py ``place_of``)."""
        code = str(getattr(params, "provenance", "") or "")
        landing = self._landing(params)
        if landing and len(landing) == 1:
            resources = (getattr(params, "contract", None) or {})["resources"]
            return place_of(code, resources[landing[0]])
        return code or None

    # -- resources --------------------------------------------------------------------------
    def _landing(self, params: BaseModel | None) -> list[str] | None:
        """The resources whose records a run of a provenance of several lands (None: the
        provenance is one resource)."""
        contract = getattr(params, "contract", None) or {}
        if not contract.get("resources"):
            return None
        p: SourceParams = params  # type: ignore[assignment]
        nodes, _ = walked(contract["resources"], p.resource, p.only)
        return [name for name, node in nodes.items() if node.lands]

    def _own(self, params: BaseModel | None) -> dict[str, Any]:
        """The contract a run's records are judged by: the provenance's, or that of the
        one resource whose records it lands."""
        contract = getattr(params, "contract", None) or {}
        landing = self._landing(params)
        if landing and len(landing) == 1:
            return resource_contract(Contract(**contract), landing[0]).to_dict()
        return contract

    def lanes(self, params: BaseModel) -> dict[str, Lane] | None:
        """The resources a run lands, when more than one: each in its own place, by its
        own record model."""
        landing = self._landing(params)
        if not landing or len(landing) < 2:
            return None
        return {
            lane: Lane(
                str(self.output_place(self.lane_params(params, lane))),
                self.record_spec(self.lane_params(params, lane)),
            )
            for lane in landing
        }

    def lane_params(self, params: BaseModel, lane: str) -> BaseModel:
        return params.model_copy(update={"resource": lane, "only": True})

    def record_steps(self, params: BaseModel | None) -> tuple[Step, ...]:
        """The steps that shape the records of the run's record model
        (``record_steps_json``); CONFIG_ERROR naming a row written around the import."""
        try:
            return steps_of(self._own(params).get("record_model"))
        except ArtemisError as e:
            code = str(getattr(params, "provenance", "") or "")
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"provenance {code!r}: record_model: {e.message}",
                retryable=False,
            ) from None

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        """Each record shaped by the record model's steps (artemis/registry/record_steps.py:
        one a step cannot apply to is rejected naming the step, one a filter leaves out is
        counted); an update's pointer is noted from the records as shaped (those a filter
        left out too, as they stood there). The record model's check then drops (and
        reports) the fields it does not name, and sets aside a record that does not fit
        (artemis/quarantine/)."""
        steps = self.record_steps(ctx.params)
        env = self._step_env(ctx) if steps else None
        kept, seen = [], []
        for r in records:
            if not isinstance(r, dict):  # a null or a bare value where objects are
                ctx.reject(r, f"a record is a JSON object, not {_json_kind(r)}")
                continue
            if env is None:
                kept.append(r)
                continue
            shaped = apply_steps(r, steps, env)
            if isinstance(shaped, Refused):
                ctx.reject(r, shaped.reason, shaped.field)
                continue
            seen.append(shaped.record)
            if shaped.kept:
                kept.append(shaped.record)
            else:
                ctx.leave_out()
        if not ctx.replaying:  # a replay's records moved no pointer of its own
            self._note_pointer(seen if env is not None else kept, ctx)
        return kept

    def _step_env(self, ctx: TaskContext) -> StepEnv:
        p: SourceParams = ctx.params  # type: ignore[assignment]
        start = as_utc(p.window_start).isoformat() if p.window_start is not None else None
        return StepEnv(provenance=p.provenance, window_start=start)

    def record_policy(self, ctx: TaskContext) -> RecordPolicy:
        """The run's params, else the provenance's record model row, else the defaults."""
        row = self._own(ctx.params).get("record_model") or {}
        registry = {
            "on_bad_record": (row.get("on_bad_record_code") or "").lower() or None,
            "max_bad_records": row.get("max_bad_records_value"),
            "schema_contract": (row.get("schema_contract_code") or "").lower() or None,
            "coerce_types": row.get("coerce_types_enabled"),
        }
        policy = RecordPolicy.of(policy_params(ctx.params), registry)
        if policy.schema_contract == "evolve" and not ctx.writes_shared:
            # The model is every owner's: a client's run reports the new fields (drift)
            # and leaves the model as the operator set it.
            return dataclasses.replace(policy, schema_contract="discard")
        return policy

    evolves_model = True

    def replay_params(self, params: dict[str, Any], settings: Settings) -> dict[str, Any]:
        """The run's params with the provenance's record model (and its policy) in force
        now: a model fixed since the run lets its quarantined records land."""
        contract = dict(params.get("contract") or {})
        if not contract:
            return params
        with get_engine(settings.database.url).connect() as conn:
            fresh = resolve_contract(
                conn, params["provenance"], params.get("task_type") or "harvest", datetime.now(UTC)
            ).to_dict()
        contract["record_model"] = fresh.get("record_model")
        if contract.get("resources"):  # each resource's own model, as in force now
            now = fresh.get("resources") or {}
            contract["resources"] = {
                name: {**res, "record_model": (now.get(name) or {}).get("record_model")}
                for name, res in contract["resources"].items()
            }
        return {**params, "contract": contract}

    def evolve_model(self, ctx: TaskContext, fields: dict[str, str]) -> bool:
        """A new record model row from now: the one in force with ``fields`` added."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        contract = self._own(p)
        if declared_model(contract) is None or not ctx.writes_shared:
            return False
        landing = self._landing(p)
        return evolve_record_model(
            ctx.settings.database.url,
            contract["provenance"]["id"],
            p.task_type,
            fields,
            resource=landing[0] if landing else DEFAULT_RESOURCE,
        )

    def _pointer_cfg(self, ctx: TaskContext) -> dict[str, Any] | None:
        p: SourceParams = ctx.params  # type: ignore[assignment]
        win = (p.contract or {}).get("window_offset") or {}
        if p.task_type != "update" or pointer_field(win) is None:
            return None
        if (p.contract or {}).get("resources"):
            return None  # a tree's pointer is its window's end (docs/registry.md)
        return win

    def _note_pointer(self, records: list[dict[str, Any]], ctx: TaskContext) -> None:
        win = self._pointer_cfg(ctx)
        if win is None or not records or not ctx.writes_shared:
            return
        p: SourceParams = ctx.params  # type: ignore[assignment]
        contract = p.contract or {}
        tz = source_zone(contract)
        top = largest([pointer_of(r, win, tz) for r in records if isinstance(r, dict)])
        if top is None:
            return
        with get_engine(ctx.settings.database.url).begin() as conn:
            note_seen(conn, contract["provenance"]["id"], ctx.task_id, p.query or "", top)

    # -- 2. sources ------------------------------------------------------------------------
    def build_sources(self, ctx: TaskContext) -> list[Source]:
        """The contract's SEARCH endpoint over the run's window (and pointer)."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        contract = self._contract(ctx)
        cc = ContractClient(contract, ctx.settings, ctx.controls.qps)
        if contract.resources:
            return [self._tree_source(ctx, cc)]
        window = {
            **window_query(p.contract or {}, p.window_start, p.window_end),
            **self._pointer_query(p),
        }
        # A backfill's window runs already fetch `parallelism` at once: one request each,
        # so the provenance's max_concurrency stays the bound of the whole.
        parallel = 1 if p.parent else self.fetch_concurrency(ctx)
        return [rest_source(cc, p.query, window, p.page_size, parallel)]

    def _tree_source(self, ctx: TaskContext, cc: ContractClient) -> Source:
        """The provenance's resources walked as a tree (artemis/sources/tree.py): each
        resource asked over the run's window when its own window row names the
        parameters, a sub-resource once per parent record (in an update, per parent
        record changed since the window's start, by the parent's own field)."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        contract = cc.contract
        resources = contract.resources or {}
        nodes, roots = walked(resources, p.resource, p.only)
        tz = source_zone(p.contract or {})
        since = p.window_start if p.task_type == "update" else None

        def open_source(name: str, parent: dict[str, Any] | None) -> Source:
            own = resource_contract(contract, name)
            if parent is not None:
                if not changed_since(resources[resources[name]["parent"]], parent, since, tz):
                    return NoPages()
                endpoint = for_parent(own.endpoint or {}, parent, name)
                own = dataclasses.replace(
                    own, endpoint=endpoint, endpoints={**own.endpoints, "SEARCH": endpoint}
                )
            # (what window_query reads of the contract: not a deep copy of all of it)
            shown = {"window_offset": own.window_offset, "provenance": own.provenance}
            window = window_query(shown, p.window_start, p.window_end)
            query = p.query if parent is None else None
            return rest_source(cc.for_contract(own), query, window, p.page_size, 1)

        # A backfill's window runs already ask `parallelism` at once: one request each,
        # so the provenance's max_concurrency stays the bound of the whole.
        most = (contract.rate_limit or {}).get("max_concurrency")
        parallel = 1 if p.parent else int(most or self.fetch_concurrency(ctx))
        return TreeSource(
            nodes,
            roots,
            open_source,
            lambda name, parent, record: adopted(resources[name], parent, record),
            Walking(
                parallel=parallel,
                name=p.provenance,
                tolerance_pct=self.completeness_tolerance(ctx),
                enveloped=sum(1 for n in nodes.values() if n.lands) > 1,
            ),
        )

    def _pointer_query(self, p: SourceParams) -> dict[str, Any]:
        """An ID pointer (minus ``overlap_value`` ids when numeric) in
        ``watermark_id_param_name``; a COMPOSITE pointer's id next to its instant, only
        without an overlap: the pair is a keyset the source compares together
        (``(timestamp, id)`` after the pointer's), and an instant moved back by the overlap
        with the last id would leave out the earlier ids of the overlap."""
        win = (p.contract or {}).get("window_offset") or {}
        name = win.get("watermark_id_param_name")
        if p.pointer is None or not name:
            return {}
        if win.get("offset_type_code") == "COMPOSITE" and win.get("overlap_value"):
            return {}
        ident = p.pointer[1] if isinstance(p.pointer, list) else p.pointer
        if ident is None:
            return {}
        if win.get("offset_type_code") == "ID":
            overlap = int(win.get("overlap_value") or 0)
            if isinstance(ident, int):
                ident = max(0, ident - overlap)
            elif isinstance(ident, str) and ident.isascii() and ident.isdigit() and overlap:
                # An id the source writes as a string of digits is still a number.
                ident = str(max(0, int(ident) - overlap))
        return {name: ident}

    def completeness_tolerance(self, ctx: TaskContext) -> float:
        """The run's own tolerance, else the provenance's (pagination cfg), else 0."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        if p.completeness_tolerance_pct is not None:
            return p.completeness_tolerance_pct
        own = (self._contract(ctx).pagination or {}).get("completeness_tolerance_pct")
        return float(own) if own is not None else 0.0

    def search_attributes(self, ctx: TaskContext) -> dict[str, str]:
        p: SourceParams = ctx.params  # type: ignore[assignment]
        return {"ArtemisProvenance": p.provenance, "ArtemisTaskType": p.task_type}

    def rate_key(self, ctx: TaskContext) -> str | None:
        contract = self._contract(ctx)
        if (contract.rate_limit or {}).get("qps_limit"):
            return str(contract.provenance["provenance_code"])
        return None

    def describe(self, params: BaseModel) -> str:
        p: SourceParams = params  # type: ignore[assignment]
        start = p.start or (p.window_start.date() if p.window_start else None)
        end = p.end
        window = f" {start or ''}..{end or ''}" if start or end else ""
        query = f" {p.query!r}" if p.query else ""
        return f"{p.provenance} {p.task_type}{window}{query}"

    def source_name(self, ctx: TaskContext) -> str:
        p: SourceParams = ctx.params  # type: ignore[assignment]
        return p.provenance

    def outage_tolerance(self, ctx: TaskContext) -> float | None:
        own = super().outage_tolerance(ctx)
        if own is not None:
            return own
        millis = (self._contract(ctx).retry or {}).get("outage_tolerance_millis")
        return millis / 1000 if millis is not None else None

    def circuit_breaker(self, ctx: TaskContext) -> dict[str, Any] | None:
        rt = self._contract(ctx).retry or {}
        if not rt.get("circuit_break_threshold"):
            return None
        return {
            "threshold": int(rt["circuit_break_threshold"]),
            "cool_down_s": (rt.get("circuit_cool_down_millis") or 60_000) / 1000,
        }

    def fetch_retry(self, ctx: TaskContext) -> dict[str, Any] | None:
        """The contract's retry_cfg as the fetch activity's Temporal retry policy."""
        rt = self._contract(ctx).retry
        if not rt:
            return None
        retries = rt.get("max_retries")
        return {
            "initial_s": (rt.get("initial_delay_millis") or 1000) / 1000,
            "backoff": 1.0 if rt.get("backoff_policy_code") == "FIXED" else 2.0,
            "maximum_s": (rt.get("max_delay_millis") or 30_000) / 1000,
            "maximum_attempts": (4 if retries is None else int(retries)) + 1,
        }

    # -- 7. finalize -------------------------------------------------------------------------
    def finalize(self, ctx: TaskContext, stats: dict[str, Any]) -> dict[str, Any]:
        """An update moves its watermark: to the largest pointer its records held (a
        ``watermark_field_name`` is set), else to its window's end."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        if p.task_type != "update":
            return stats
        if not ctx.writes_shared:
            # The pointer is every owner's: a client's update harvests its window and
            # leaves the pointer where the operator's runs put it.
            log.info("pointer_kept", task_id=ctx.task_id, role=ctx.role)
            return {**stats, "watermark": None, "watermark_moved": False}
        contract = self._contract(ctx)
        pid = contract.provenance["id"]
        win = self._pointer_cfg(ctx)
        pointer = PointerKey(pid, "update", p.query or "")
        with get_engine(ctx.settings.database.url).begin() as conn:
            if win is None:
                if p.window_end is None:
                    return stats
                advance_pointer(conn, pointer, p.window_end, None, ctx.task_id)
                return {**stats, "watermark": as_utc(p.window_end).isoformat()}
            seen = take_seen(conn, pid, ctx.task_id, p.query or "")
            kind = win.get("offset_type_code") or "DATE"
            if seen is None:
                # No record: the pointer stays. A first update (no pointer yet) keeps where
                # its window started, so the next one asks from there: asked from its own
                # lookback instead, it would skip what changed between the two runs.
                first = read_pointer(conn, pid, "update", p.query or "")[0] is None
                if first and kind != "ID" and p.window_start is not None:
                    advance_pointer(conn, pointer, p.window_start, None, ctx.task_id)
                return {**stats, "watermark": None}
            instant = as_utc(seen[0] if kind == "COMPOSITE" else seen) if kind != "ID" else None
            if instant is not None and p.window_end is not None and instant > p.window_end:
                # A record newer than now minus the lag (a source asked with a start only
                # answers up to now): the pointer stops at the lag, so records the source
                # shows late are still asked for next time.
                instant = as_utc(p.window_end)
                seen = [instant.isoformat(), None] if kind == "COMPOSITE" else instant.isoformat()
            advance_pointer(
                conn, pointer, instant or p.window_end or datetime.now(UTC), seen, ctx.task_id
            )
        return {**stats, "watermark": seen}

    def run_ended(self, ctx: TaskContext, status: str, error_code: str | None) -> None:
        """A run that did not complete leaves no pointer behind."""
        p: SourceParams = ctx.params  # type: ignore[assignment]
        if status == RunStatus.COMPLETED or self._pointer_cfg(ctx) is None:
            return
        with get_engine(ctx.settings.database.url).begin() as conn:
            drop_seen(conn, (p.contract or {})["provenance"]["id"], ctx.task_id)


def _json_kind(value: Any) -> str:
    """What a JSON value is, by its JSON name (never its content)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
