"""POST /registry/preview: an imported provenance's first pages, fetched as a run fetches
them, and a record model drafted from them (artemis/registry/preview.py). An operator's
or admin's: it sends the provenance's credentials to its source. Only a provenance in the
registry is previewed, never a posted file: a file could name any environment variable as
a secret and any URL as a source. The provenance's URLs are held to the checks
``starter/ssrf.py`` applies to a request's URLs, and every connection to the guarded
client's (docs/security.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from artemis.calls import work
from artemis.config import Settings
from artemis.db import get_engine
from artemis.http import make_client
from artemis.netguard import Resolver
from artemis.registry.auth import token_url
from artemis.registry.preview import MAX_PAGES, preview, registry_contract
from artemis.registry.resolve import Contract, base_url
from artemis.security import check_request_url, check_resolved, url_host_port
from starter.api.auth import require_operator
from starter.api.deps import get_settings
from starter.api.envelope import envelope
from starter.api.schemas import INVALID, Envelope, documented

router = APIRouter(tags=["registry"])


class PreviewBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    provenance: str = Field(min_length=1, max_length=100, description="an imported provenance")
    resource: str | None = Field(
        None, min_length=1, max_length=64, description="default: its only or root resource"
    )
    pages: int = Field(2, ge=1, le=MAX_PAGES, description="how many pages to fetch")


class PreviewAnswer(BaseModel):
    """What a run would fetch first and make of it; nothing is written."""

    provenance: str
    resource: str | None = None
    source: str = Field(description="`registry`")
    requests: list[dict[str, Any]] = Field(
        description="each request made: `request` (method and URL, never a credential), "
        "`status`, `millis`, and the `resource` it was for"
    )
    parent: dict[str, Any] | None = Field(
        None, description="a sub-resource: the parent record it was asked for"
    )
    pages: list[dict[str, Any]]
    records: list[Any] = Field(description="the records found, as the source gave them")
    paging: dict[str, Any] = Field(description="`goes_on`, `next_request`, `why`")
    stated_total: int | None = None
    model: dict[str, Any] | None = Field(None, description="the record model in force")
    policy: dict[str, Any]
    set_aside: list[dict[str, Any]] = Field(description="records the model would set aside")
    not_named: list[dict[str, Any]] = Field(description="fields the model does not name")
    missing: list[str] = Field(description="fields the model names that no record carries")
    stops: list[str] = Field(description="what would stop a run")
    drafted_model: dict[str, Any] | None = None
    drafted_yaml: str | None = Field(None, description="a `record_model` row, ready to paste")
    draft_problem: str | None = None


@router.post(
    "/registry/preview",
    operation_id="preview_provenance",
    summary="An imported provenance's first pages and a drafted record model",
    responses={
        **documented(PreviewAnswer),
        **INVALID,
        502: {"model": Envelope[None], "description": "SOURCE_ERROR / SOURCE_CONTRACT"},
    },
    dependencies=[Depends(require_operator)],
)
async def preview_provenance(
    request: Request, body: PreviewBody, settings: Settings = Depends(get_settings)
) -> JSONResponse:
    engine = get_engine(settings.database.url)
    contract = await work(registry_contract, engine, body.provenance)
    await check_source_urls(settings, contract)
    client = make_client(settings.http_client, settings.security)
    try:
        report = await preview(
            contract,
            settings,
            client.guarded(),
            resource=body.resource,
            pages=body.pages,
        )
    finally:
        await client.aclose()
    return envelope(request, PreviewAnswer(**report).model_dump(mode="json"))


async def check_source_urls(settings: Settings, contract: Contract) -> None:
    """The provenance's base URL (and a token endpoint elsewhere) may be reached: a host
    of ``security.allowed_hosts`` that resolves now to an address it admits
    (INVALID_INPUT naming the URL's place otherwise), as for a request's URLs."""
    allowed = settings.security.allowed_hosts
    base = base_url(contract)
    urls = [(base, "provenance base URL (base_url_default / http_cfg.base_url_override)")]
    if contract.endpoints.get("TOKEN"):
        urls.append((token_url(contract, base), "the TOKEN endpoint's URL"))
    resolver = Resolver(settings.security.dns_server)
    for url, what in urls:
        check_request_url(url, allowed, what)
        host, port = url_host_port(url, what)
        await check_resolved(host, allowed, what, port, resolver)
