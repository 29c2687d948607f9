"""``literature_harvest``: the papers task. A registry run (``source_harvest``,
artemis/tasks/source_harvest.py) over a provenance of a paper family (its ``record_model``
row's ``record_family_code``): PubMed through E-utilities (esearch + efetch XML) or
Crossref works, each record normalised to one paper shape (artemis/literature/normalize.py).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime
from typing import Any, ClassVar

from pydantic import BaseModel

from artemis.errors import ArtemisError, ErrorCode
from artemis.literature.normalize import normalize_crossref
from artemis.literature.planning import LiteratureParams, window_params
from artemis.literature.pubmed import PubMedSource
from artemis.registry.client import ContractClient
from artemis.registry.resolve import Contract
from artemis.registry.rest_source import Shaping, rest_source
from artemis.registry.windows import day_start, source_zone
from artemis.sinks.records import RecordSpec
from artemis.sources import Source
from artemis.tasks.base import TaskContext, TaskUnit
from artemis.tasks.source_harvest import SourceHarvest, declared_model, record_family

PAPER_FAMILIES = ("PUBMED", "CROSSREF")


def started_before_families(contract: dict[str, Any] | None) -> bool:
    """A run whose frozen contract has no record model dimension: it goes on
    as it began (its family read from its SEARCH path, its own model if it declared one)."""
    return contract is not None and "record_model" not in contract


# The columns a contract without a record model dimension was run with: the others did
# nothing for such a run, and it goes on without them (none refuses it mid-run).
_EARLIER_HTTP = ("base_url_override", "default_headers_json", "timeout_read_millis")
_EARLIER_ENDPOINT_OFF = {
    "default_body_payload": None,
    "request_content_type": None,
    "response_format_code": None,
    "is_auth_required": False,
}


def as_it_began(contract: Contract, family: str | None) -> Contract:
    """A contract without a record model dimension, reduced to the columns its run read
    when it started."""
    http = {
        k: v
        for k, v in (contract.http or {}).items()
        if k in _EARLIER_HTTP or k in ("id", "max_body_bytes")
    }
    endpoints = {
        usage: {**ep, **_EARLIER_ENDPOINT_OFF}
        for usage, ep in contract.endpoints.items()
        # only E-utilities read a DETAIL endpoint (efetch)
        if usage == "SEARCH" or (usage == "DETAIL" and family == "PUBMED")
    }
    search = endpoints.get("SEARCH")
    if search is not None and family != "PUBMED":
        search["http_method_code"] = "GET"  # a JSON search was always read by GET
    rate = {**(contract.rate_limit or {}), "bucket_granularity_code": None}
    return replace(
        contract,
        http=http or None,
        endpoint=search,
        endpoints=endpoints,
        rate_limit=rate if contract.rate_limit else None,
        credentials=[
            c
            for c in contract.credentials
            if c.get("auth_type_code") in ("API_KEY_QUERY", "API_KEY_HEADER", "BEARER")
        ],
    )


def _family_of_earlier_run(contract: dict[str, Any]) -> str | None:
    endpoints = contract.get("endpoints") or {}
    path = (endpoints.get("SEARCH") or contract.get("endpoint") or {}).get("path_template") or ""
    if "esearch" in path:
        return "PUBMED"
    if path.rstrip("/").endswith("/works"):
        return "CROSSREF"
    return None


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


class LiteratureHarvest(SourceHarvest):
    # The paper shape is Artemis' own: a family's model does not evolve.
    evolves_model = False
    code = "literature_harvest"
    Params: ClassVar[type[BaseModel]] = LiteratureParams
    Record = LiteratureRecord
    record_key = ("provenance", "id")
    summary = "Harvest papers (PubMed, Crossref) normalised to one shape"

    def check_provenance(self, contract: Contract) -> None:
        """Only a paper family: any other source is ``source_harvest``'s."""
        family = record_family(contract.to_dict())
        if family not in PAPER_FAMILIES:
            code = contract.provenance["provenance_code"]
            what = (
                "declares its own record model"
                if (contract.record_model or {}).get("fields_json")
                else "declares no paper family"
            )
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"provenance {code!r} {what} (record_model.record_family_code: "
                f"{' or '.join(PAPER_FAMILIES)}): harvest it with source_harvest "
                f"-p provenance={code}",
            )

    def window_of(
        self, start: date | None, end: date | None, contract: dict[str, Any]
    ) -> tuple[datetime | None, datetime | None]:
        # The paper APIs take days, both ends inclusive, as days of the source's zone.
        tz = source_zone(contract)
        return day_start(start, tz), day_start(end, tz)

    def check_window(self, contract: Contract) -> None:
        """The paper APIs' windows are their own date filters (checked at import)."""

    def record_spec(self, params: BaseModel | None = None) -> RecordSpec | None:
        contract = getattr(params, "contract", None)
        if started_before_families(contract) and declared_model(contract) is not None:
            return SourceHarvest.record_spec(self, params)
        return TaskUnit.record_spec(self, params)

    def output_place(self, params: BaseModel) -> str | None:
        # Papers of every provenance share one shape, so one table and folder.
        return None

    def process(self, records: list[dict[str, Any]], ctx: TaskContext) -> list[dict[str, Any]]:
        contract = getattr(ctx.params, "contract", None)
        if started_before_families(contract) and declared_model(contract) is not None:
            return SourceHarvest.process(self, records, ctx)
        return records  # normalised by the source

    def _pointer_cfg(self, ctx: TaskContext) -> dict[str, Any] | None:
        # A paper API's date field is its filter's (EDAT, index-date), not a record field:
        # an update's pointer is its window's end.
        return None

    def build_sources(self, ctx: TaskContext) -> list[Source]:
        """PubMed's E-utilities source, or Crossref's works through the REST source."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        contract = self._contract(ctx)
        if started_before_families(p.contract):
            family = _family_of_earlier_run(p.contract or {})
            contract = as_it_began(contract, family)
        else:
            family = record_family(p.contract)
        cc = ContractClient(contract, ctx.settings, ctx.controls.qps)
        date_field = (contract.window_offset or {}).get("default_date_field_name")
        window = (
            window_params(family, date_field, p.window_start, p.window_end, source_zone(p.contract))
            if family
            else {}
        )
        parallel = 1 if p.parent else self.fetch_concurrency(ctx)
        if family == "PUBMED":
            return [PubMedSource(cc, p.query or "all[sb]", window, p.page_size, parallel)]
        if family is None:  # such a contract's source of no paper family: plain paging
            return [rest_source(cc, p.query, window, p.page_size, parallel)]
        code = cc.code
        return [
            rest_source(
                cc,
                p.query,
                window,
                p.page_size,
                parallel,
                Shaping(lambda item: normalize_crossref(item, code), record_key="$.DOI"),
            )
        ]

    def describe(self, params: BaseModel) -> str:
        p: LiteratureParams = params  # type: ignore[assignment]
        start = p.window_start or p.start
        end = p.window_end or p.end
        window = f" {str(start)[:10]}..{str(end)[:10]}" if start or end else ""
        query = f" {p.query!r}" if p.query else ""
        return f"{p.provenance} {p.task_type}{window}{query}"
