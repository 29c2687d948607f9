"""``literature_harvest``: harvest a provenance (PubMed, Crossref, ...) through the execution
contract resolved from the registry once per run and frozen in its params (so in history).

- ``harvest``: the whole query (optionally within ``start``..``end``);
- ``update``: from the watermark minus the contract's overlap up to now minus its lag; the
  watermark advances only when the run completes;
- ``backfill``: ``start``..``end`` cut into the contract's windows, each a child run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from artemis.config import Settings
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.client import ContractClient, api_family
from artemis.registry.rest_source import rest_source
from artemis.literature.planning import (
    LiteratureParams,
    backfill_windows,
    child_params,
    day_start,
    halves,
    update_window,
    window_params,
)
from artemis.literature.normalize import normalize_crossref
from artemis.literature.pubmed import PubMedSource
from artemis.registry.resolve import Contract, as_utc, resolve_contract
from artemis.registry.watermark import advance_watermark, read_watermark
from artemis.sinks.records import RecordSpec, declared_spec, record_model_name
from artemis.sources import Source
from artemis.tasks.base import TaskContext, TaskUnit, describe_validation_error


class LiteratureRecord(BaseModel):
    """A normalised article (artemis/literature/normalize.py): PubMed and Crossref give
    this shape; ``published`` is as precise as the source says (``2024``, ``2024-05``…)."""

    provenance: str
    id: str
    doi: str | None = None
    title: str | None = None
    journal: str | None = None
    published: str | None = None
    authors: list[str] = []
    abstract: str | None = None


def _declared_model(params: BaseModel | None) -> dict[str, Any] | None:
    """The record model a run's frozen contract declares for its provenance, or None."""
    contract = getattr(params, "contract", None) or {}
    row = contract.get("record_model")
    if row is None:  # a contract frozen before the record model was a dimension
        return (contract.get("provenance") or {}).get("record_model")
    if row.get("fields_json") is None:
        return None
    return {"key": row.get("key_json"), "fields": row["fields_json"]}


class LiteratureHarvest(TaskUnit):
    code = "literature_harvest"
    Params = LiteratureParams
    Record = LiteratureRecord
    record_key = ("provenance", "id")
    summary = "Harvest a provenance through its registry contract"

    internal_params = ("contract", "window_start", "window_end", "parent")
    prepare_blocks = True  # the registry's contract and watermark, read in the database

    def prepare_params(
        self, incoming: dict[str, Any], settings: Settings, trusted: bool = False
    ) -> BaseModel:
        params: LiteratureParams = super().prepare_params(  # type: ignore[assignment]
            incoming, settings, trusted
        )
        start, end = day_start(params.start), day_start(params.end)
        if params.parent and params.contract:
            # A child run: its parent's frozen contract, over its own window.
            params.window_start, params.window_end = start, end
            return params
        now = datetime.now(UTC)
        with get_engine(settings.database.url).connect() as conn:
            contract = resolve_contract(conn, params.provenance, params.task_type, now)
            if contract.endpoint is None:
                raise ArtemisError(
                    ErrorCode.CONFIG_ERROR,
                    f"provenance {params.provenance!r} has no SEARCH endpoint "
                    f"in force for task_type {params.task_type}",
                )
            if params.task_type == "backfill" and (start is None or end is None):
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT, "params.start and params.end: a backfill needs both"
                )
            if params.task_type == "update":
                mark = read_watermark(conn, contract.provenance["id"], "update", params.query or "")
                start, end = update_window(contract.window_offset or {}, mark, start, end, now)
        params.contract = contract.to_dict()
        params.window_start, params.window_end = start, end
        return params

    def plan_children(self, ctx: TaskContext) -> tuple[list[dict[str, Any]], int] | None:
        """A backfill: its range cut into the contract's windows (calendar months or fixed
        sizes), each a child run; ``parallelism`` (else ``rate_limit.max_concurrency``, else
        2) at once."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        if p.task_type != "backfill" or p.parent:
            return None
        assert p.window_start is not None and p.window_end is not None
        contract = self._contract(ctx)
        windows = backfill_windows(
            p.window_start.date(), p.window_end.date(), contract.window_offset or {}
        )
        children = [child_params(p, a, b, ctx.task_id) for a, b in windows]
        return children, self._parallelism(ctx)

    def _parallelism(self, ctx: TaskContext) -> int:
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        contract = self._contract(ctx)
        return int(p.parallelism or (contract.rate_limit or {}).get("max_concurrency") or 2)

    def split_parallelism(self, ctx: TaskContext) -> int:
        """A window or piece (it has a parent) splits inside its parent's slot: one piece
        at a time; a top-level run uses its own parallelism."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        return 1 if p.parent else self._parallelism(ctx)

    def split(self, ctx: TaskContext, details: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Halve the window whose hits exceed the result cap (down to single days)."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        if p.window_start is None or p.window_end is None:
            return None
        pieces = halves(p.window_start.date(), p.window_end.date())
        if pieces is None:
            return None
        return [child_params(p, a, b, ctx.task_id) for a, b in pieces]

    def _contract(self, ctx: TaskContext) -> Contract:
        return Contract(**ctx.params.contract)  # type: ignore[attr-defined]

    def record_spec(self, params: BaseModel | None = None) -> RecordSpec | None:
        """The provenance's own record model when its registry entry declares one
        (``provenance.record_model``, frozen in the run's contract), else the paper model."""
        declared = _declared_model(params)
        if declared is None:
            return super().record_spec(params)
        code = str(getattr(params, "provenance", "") or "")
        try:
            return declared_spec(declared, record_model_name(code))
        except ValidationError as e:  # checked at import: a row edited by hand
            why = describe_validation_error(e, "record_model")
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR, f"provenance {code!r}: {why}", retryable=False
            ) from None

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        """A provenance with its own record model keeps the fields the model names (as the
        built-in normalisers keep the paper fields): a field the model allows to be null
        and the record lacks is null; one it requires and the record lacks stays absent,
        for the sinks to refuse by name."""
        declared = _declared_model(ctx.params)
        if declared is None:
            return records
        spec = self.record_spec(ctx.params)
        assert spec is not None
        optional = {n for n, f in spec.model.model_fields.items() if not f.is_required()}
        names = list(spec.model.model_fields)
        return [
            {n: r.get(n) for n in names if n in r or n in optional} if isinstance(r, dict) else r
            for r in records
        ]

    def build_sources(self, ctx: TaskContext) -> list[Source]:
        """PubMed's E-utilities source, else the generic REST source, over the run's window."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        contract = self._contract(ctx)
        cc = ContractClient(contract, ctx.settings, ctx.controls.qps)
        family = api_family(contract)
        date_field = (contract.window_offset or {}).get("default_date_field_name")
        window = window_params(family, date_field, p.window_start, p.window_end)
        # A backfill's window runs already fetch `parallelism` at once: one request each,
        # so the provenance's max_concurrency stays the bound of the whole.
        parallel = 1 if p.parent else self.fetch_concurrency(ctx)
        if family == "eutils":
            return [PubMedSource(cc, p.query or "all[sb]", window, p.page_size, parallel)]
        code = cc.code
        crossref = family == "crossref"
        return [
            rest_source(
                cc,
                p.query,
                window,
                p.page_size,
                parallel,
                transform=(lambda item: normalize_crossref(item, code)) if crossref else None,
                record_key="$.DOI" if crossref else None,
            )
        ]

    def completeness_tolerance(self, ctx: TaskContext) -> float:
        """The run's own tolerance, else the provenance's (pagination cfg), else 0."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        if p.completeness_tolerance_pct is not None:
            return p.completeness_tolerance_pct
        own = (self._contract(ctx).pagination or {}).get("completeness_tolerance_pct")
        return float(own) if own is not None else 0.0

    def search_attributes(self, ctx: TaskContext) -> dict[str, str]:
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        return {"ArtemisProvenance": p.provenance, "ArtemisTaskType": p.task_type}

    def rate_key(self, ctx: TaskContext) -> str | None:
        contract = self._contract(ctx)
        if (contract.rate_limit or {}).get("qps_limit"):
            return str(contract.provenance["provenance_code"])
        return None

    def describe(self, params: BaseModel) -> str:
        p: LiteratureParams = params  # type: ignore[assignment]
        start = p.window_start or p.start
        end = p.window_end or p.end
        window = f" {str(start)[:10]}..{str(end)[:10]}" if start or end else ""
        query = f" {p.query!r}" if p.query else ""
        return f"{p.provenance} {p.task_type}{window}{query}"

    def source_name(self, ctx: TaskContext) -> str:
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
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

    def finalize(self, ctx: TaskContext, stats: dict[str, Any]) -> dict[str, Any]:
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        if p.task_type == "update" and p.window_end is not None:
            contract = self._contract(ctx)
            with get_engine(ctx.settings.database.url).begin() as conn:
                advance_watermark(
                    conn,
                    contract.provenance["id"],
                    "update",
                    p.query or "",
                    p.window_end,
                    ctx.task_id,
                )
            stats = {**stats, "watermark": as_utc(p.window_end).isoformat()}
        return stats
