"""``literature_harvest``: harvest a provenance (PubMed, Crossref, ...) through the execution
contract resolved from the registry once per run and frozen in its params (so in history).

- ``harvest``: the whole query (optionally within ``start``..``end``);
- ``update``: from the watermark minus the contract's overlap up to now minus its lag; the
  watermark advances only when the run completes.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar, Literal

import httpx
from pydantic import BaseModel, Field, model_validator
from sqlalchemy import select

from artemis.completeness import check_loop, page_digest
from artemis.config import Settings
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import retry_after_seconds, status_error, transport_error
from artemis.literature.normalize import normalize_crossref, parse_pubmed_xml
from artemis.logsetup import get_logger, register_secret
from artemis.ratelimit import bucket_for
from artemis.registry.models import RegProvCredential
from artemis.registry.resolve import (
    Contract,
    as_utc,
    base_url,
    merge_params,
    param_name,
    resolve_contract,
)
from artemis.registry.watermark import advance_watermark, read_watermark
from artemis.sources import Page, Source
from artemis.sources.paginators import (
    MISSING,
    CursorPaginator,
    LinkHeaderPaginator,
    OffsetPaginator,
    PageNumberPaginator,
    Paginator,
    TokenPaginator,
    as_count,
    describe,
    json_path_lookup,
)
from artemis.sources.rest import RestSource, describe_request
from artemis.tasks.base import TaskContext, TaskUnit, register_task

log = get_logger(__name__)

_UNITS = {
    "MINUTE": timedelta(minutes=1),
    "HOUR": timedelta(hours=1),
    "DAY": timedelta(days=1),
    "WEEK": timedelta(weeks=1),
    "MONTH": timedelta(days=30),
}


class LiteratureParams(BaseModel):
    model_config = {"extra": "forbid"}

    provenance: str = Field(min_length=1)
    task_type: Literal["harvest", "update", "backfill"] = "harvest"
    start: date | None = None
    end: date | None = None
    query: str | None = None
    page_size: int | None = Field(None, ge=1, le=10_000)
    parallelism: int | None = Field(None, ge=1, le=32)  # backfill: windows run at once
    # The shortfall against the source's stated total this run accepts (percent); default:
    # the registry's pagination_cfg.completeness_tolerance_pct, else 0.
    completeness_tolerance_pct: float | None = Field(None, ge=0, le=100)
    # Filled by prepare_params: the frozen contract and the window actually harvested.
    contract: dict[str, Any] | None = None
    window_start: datetime | None = None
    window_end: datetime | None = None
    parent: str | None = None  # the task id of the run that fanned this one out

    @model_validator(mode="after")
    def _window(self) -> LiteratureParams:
        if self.start and self.end and self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        return self


def _span(value: int | None, unit: str | None) -> timedelta:
    if not value:
        return timedelta(0)
    if unit not in _UNITS:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR, f"window unit {unit!r} is not one of {', '.join(_UNITS)}"
        )
    return value * _UNITS[unit]


def paginator_for(contract: Contract, page_size: int | None = None) -> Paginator:
    """The contract's pagination cfg as a paginator (endpoint param names win, §3.4)."""
    pg, ep = contract.pagination or {}, contract.endpoint
    mode = pg.get("pagination_mode_code") or "PAGE_NUMBER"
    size = page_size or pg.get("page_size_value")
    if size and pg.get("max_page_size_value"):
        size = min(size, pg["max_page_size_value"])
    total_path = pg.get("total_count_jsonpath")
    short_ends = bool(pg.get("short_page_is_last"))
    if mode == "PAGE_NUMBER":
        return PageNumberPaginator(
            page=pg.get("start_page_number") or 1,
            page_param=param_name("page", ep, pg, "page_number_param_name", "page"),
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "page_size"),
            next_page_path=None,
            total_path=total_path,
            short_page_ends=short_ends,
        )
    if mode == "OFFSET":
        return OffsetPaginator(
            limit=size or 100,
            offset_param=param_name("offset", ep, pg, "offset_param_name", "offset"),
            limit_param=param_name("limit", ep, pg, "limit_param_name", "limit"),
            total_path=total_path,
            max_offset=pg.get("max_result_window"),
            short_page_ends=short_ends,
        )
    if mode == "CURSOR":
        return CursorPaginator(
            cursor_param=param_name("cursor", ep, pg, "cursor_param_name", "cursor"),
            cursor_path=pg.get("next_cursor_jsonpath") or "$.next_cursor",
            initial_cursor=pg.get("initial_cursor_value"),
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "rows"),
            total_path=total_path,
            short_page_ends=short_ends,
            stateful=bool(pg.get("stateful_cursor")),
        )
    if mode == "TOKEN":
        return TokenPaginator(
            token_param=param_name("token", ep, pg, "token_param_name", "page_token"),
            token_path=pg.get("next_token_jsonpath") or "$.next_page_token",
            total_path=total_path,
            absent_ends=bool(pg.get("absent_token_is_last")),
        )
    if mode == "LINK_HEADER":
        return LinkHeaderPaginator(total_path=total_path)
    raise ArtemisError(
        ErrorCode.CONFIG_ERROR,
        f"pagination_mode_code {mode!r} is not one of "
        "PAGE_NUMBER, OFFSET, CURSOR, TOKEN, LINK_HEADER",
    )


def api_family(contract: Contract) -> str:
    """Which API a provenance speaks, from its SEARCH endpoint: ``eutils`` (esearch +
    efetch), ``crossref`` (/works) or ``generic`` JSON."""
    path = (contract.endpoints.get("SEARCH") or contract.endpoint or {}).get("path_template") or ""
    if "esearch" in path:
        return "eutils"
    if path.rstrip("/").endswith("/works"):
        return "crossref"
    return "generic"


def window_params(
    code: str, date_field: str | None, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """The API's own way to ask for a date window (both ends inclusive, day precision)."""
    if start is None and end is None:
        return {}
    lo = (start or datetime(1900, 1, 1, tzinfo=UTC)).date()
    hi = (end or datetime.now(UTC)).date()
    if code == "eutils":
        return {
            "mindate": lo.strftime("%Y/%m/%d"),
            "maxdate": hi.strftime("%Y/%m/%d"),
            "datetype": (date_field or "edat").lower(),
        }
    if code == "crossref":
        field = (date_field or "index-date").lower()
        return {"filter": f"from-{field}:{lo.isoformat()},until-{field}:{hi.isoformat()}"}
    raise ArtemisError(ErrorCode.CONFIG_ERROR, f"no date-window mapping for provenance {code!r}")


class Credentials:
    """The contract's credentials in priority order, with per-key health: a key answered
    401/403 is benched for an hour, one answered 429 until its Retry-After (else a minute),
    and the next healthy key takes over. Secrets are decrypted here, on use."""

    # credential id -> monotonic time until which the key is not used (per worker process)
    _benched: ClassVar[dict[int, float]] = {}

    def __init__(self, contract: Contract, settings: Settings) -> None:
        self.rows = [c for c in contract.credentials if c.get("has_secret")]
        self.settings = settings
        self._secrets: dict[int, str] = {}

    def _secret(self, cred_id: int) -> str:
        if cred_id not in self._secrets:
            from artemis.crawler.vault import vault_for

            t = RegProvCredential.__table__  # type: ignore[attr-defined]
            with get_engine(self.settings.database.url).connect() as conn:
                row = conn.execute(
                    select(t.c.secret_ciphertext, t.c.encryption_key_id).where(t.c.id == cred_id)
                ).first()
            if row is None or not row.secret_ciphertext:
                raise ArtemisError(ErrorCode.CONFIG_ERROR, f"credential {cred_id} has no secret")
            secret = vault_for(self.settings).decrypt(row.secret_ciphertext, row.encryption_key_id)
            register_secret(secret)
            self._secrets[cred_id] = secret
        return self._secrets[cred_id]

    def current(self) -> dict[str, Any] | None:
        """The first healthy key; when every key is benched, a retryable error that says
        when the first comes back."""
        if not self.rows:
            return None
        now = time.monotonic()
        for cred in self.rows:
            if self._benched.get(cred["id"], 0) <= now:
                return cred
        wait = min(self._benched[c["id"]] for c in self.rows) - now
        raise ArtemisError(
            ErrorCode.SOURCE_ERROR,
            f"every credential is benched (next back in {wait:.0f} s)",
            retryable=True,
            retry_after_s=max(1.0, wait),
        )

    def apply(self, params: dict[str, Any], headers: dict[str, str]) -> int | None:
        cred = self.current()
        if cred is None:
            return None
        secret = self._secret(cred["id"])
        name = cred.get("param_or_header_name")
        kind = cred.get("auth_type_code")
        if kind == "API_KEY_QUERY":
            params[name or "api_key"] = secret
        elif kind == "API_KEY_HEADER":
            headers[name or "X-API-Key"] = secret
        elif kind == "BEARER":
            headers[name or "Authorization"] = f"Bearer {secret}"
        else:
            raise ArtemisError(ErrorCode.CONFIG_ERROR, f"auth_type_code {kind!r} is unknown")
        return int(cred["id"])

    def bench(self, cred_id: int, resp: httpx.Response) -> bool:
        """Take a key out after 401/403/429; True when another key is healthy now."""
        if resp.status_code == 429:
            seconds = retry_after_seconds(resp) or 60.0
        else:
            seconds = 3600.0
        self._benched[cred_id] = time.monotonic() + seconds
        log.warning(
            "credential_benched", credential_id=cred_id, status=resp.status_code, seconds=seconds
        )
        now = time.monotonic()
        return any(self._benched.get(c["id"], 0) <= now for c in self.rows)


class ContractClient:
    """Request plumbing shared by literature sources: base URL, headers, timeouts, the rate
    limit and credentials, all from the frozen contract."""

    def __init__(
        self, contract: Contract, settings: Settings, qps_override: float | None = None
    ) -> None:
        self.contract = contract
        self.code = contract.provenance["provenance_code"]
        self.base = base_url(contract)
        http = contract.http or {}
        self.headers: dict[str, str] = {
            k: v for k, v in merge_params(http.get("default_headers_json"), None).items()
        }
        read_ms = http.get("timeout_read_millis")
        self.timeout = read_ms / 1000 if read_ms else None
        rl = contract.rate_limit or {}
        qps = qps_override or rl.get("qps_limit")
        # A live override is held evenly (no burst): it is usually asked to go gentler.
        burst = 1 if qps_override else rl.get("burst_capacity")
        self.bucket = bucket_for(self.code, qps, burst) if qps else None
        self.credentials = Credentials(contract, settings)

    def status_error(self, what: str, resp: httpx.Response) -> ArtemisError:
        """An error answer classified by the contract's retry cfg: statuses in
        ``giveup_http_statuses_json`` are final, those in ``retry_http_statuses_json`` are
        retried; ``Retry-After`` becomes the next retry's delay when ``respect_retry_after``."""
        err = status_error(ErrorCode.SOURCE_ERROR, what, resp)
        rt = self.contract.retry or {}
        if resp.status_code in (rt.get("giveup_http_statuses_json") or []):
            err.retryable = False
        elif resp.status_code in (rt.get("retry_http_statuses_json") or []):
            err.retryable = True
        if rt.get("respect_retry_after") is False:
            err.retry_after_s = None
        return err

    def url(self, endpoint: dict[str, Any]) -> str:
        return f"{self.base}{endpoint['path_template']}"

    async def throttle(self) -> None:
        if self.bucket is not None:
            await self.bucket.acquire()

    async def send(
        self, client: httpx.AsyncClient, method: str, url: str, params: dict[str, Any], what: str
    ) -> httpx.Response:
        """One request under the rate limit with the first healthy credential; on 401/403/429
        the key is benched and the request goes again with the next one."""
        for _ in range(len(self.credentials.rows) + 1):
            p, headers = dict(params), dict(self.headers)
            cred_id = self.credentials.apply(p, headers)
            await self.throttle()
            try:
                if method == "POST":
                    resp = await client.post(
                        url, data=p, headers=headers, timeout=self.timeout or 30
                    )
                else:
                    resp = await client.get(
                        url, params=p or None, headers=headers, timeout=self.timeout or 30
                    )
            except httpx.HTTPError as e:
                raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
            if (
                cred_id is not None
                and resp.status_code in (401, 403, 429)
                and self.credentials.bench(cred_id, resp)
            ):
                continue
            return resp
        return resp


class PubMedSource(Source):
    """esearch with ``usehistory=y`` pages through ids; efetch turns them into records in
    batches (POST above the contract's threshold). The checkpoint holds the esearch
    position and the ids not fetched yet."""

    name = "pubmed"

    def __init__(
        self, cc: ContractClient, query: str, window: dict[str, Any], page_size: int | None
    ) -> None:
        self.cc = cc
        c = cc.contract
        search = c.endpoints.get("SEARCH") or c.endpoint
        fetch = c.endpoints.get("DETAIL")
        if not search or not fetch:
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                "pubmed needs a SEARCH (esearch) and a DETAIL (efetch) endpoint",
            )
        self.search_ep: dict[str, Any] = search
        self.fetch_ep: dict[str, Any] = fetch

        pg, bt = c.pagination or {}, c.batching or {}
        self.retmax = min(
            page_size or pg.get("page_size_value") or 500, pg.get("max_page_size_value") or 10_000
        )
        self.cap = pg.get("max_result_window") or 9_999
        self.offset_param = param_name(
            "offset", self.search_ep, pg, "offset_param_name", "retstart"
        )
        self.size_param = param_name(
            "page_size", self.search_ep, pg, "page_size_param_name", "retmax"
        )
        self.batch = bt.get("detail_batch_size") or 200
        self.post_over = bt.get("post_threshold_ids") or 200
        self.id_param = param_name("id", self.fetch_ep, bt, "id_param_name", "id")
        self.joiner = bt.get("id_joiner") or ","
        self.query = query
        self.window = window

    async def _call(
        self,
        client: httpx.AsyncClient,
        ep: dict[str, Any],
        params: dict[str, Any],
        force_post: bool = False,
    ) -> httpx.Response:
        what = f"pubmed {ep['endpoint_name']}"
        method = "POST" if force_post or ep.get("http_method_code") == "POST" else "GET"
        resp = await self.cc.send(
            client,
            method,
            self.cc.url(ep),
            merge_params(ep.get("default_query_params"), params),
            what,
        )
        if resp.status_code >= 400:
            raise self.cc.status_error(what, resp)
        return resp

    async def pages(
        self, client: httpx.AsyncClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        st = {
            "retstart": 0,
            "pending": [],
            "count": None,
            "webenv": None,
            # Records delivered; a checkpoint of an earlier build lacks it: every id taken
            # off the esearch list before the pending ones went to efetch.
            "taken": 0 if not checkpoint else checkpoint["retstart"] - len(checkpoint["pending"]),
            "digest": None,
            **(checkpoint or {}),
        }
        while True:
            if not st["pending"]:
                if st["count"] is None or st["retstart"] < st["count"]:
                    await self._search(client, st)
                if not st["pending"]:
                    # The count is reached, or esearch answered an empty page: the end, on
                    # the source's word (what was delivered is reconciled against the count).
                    yield self._page([], None, st, 0)
                    return
            ids, st["pending"] = st["pending"][: self.batch], st["pending"][self.batch :]
            resp = await self._call(
                client,
                self.fetch_ep,
                {self.id_param: self.joiner.join(ids)},
                force_post=len(ids) > self.post_over,
            )
            records = parse_pubmed_xml(resp.content, self.cc.code)
            st["taken"] += len(records)
            if len(records) != len(ids):
                log.warning("pubmed_efetch_short", asked=len(ids), got=len(records))
            done = not st["pending"] and st["retstart"] >= (st["count"] or 0)
            yield self._page(records, None if done else dict(st), st, len(ids))
            if done:
                return

    def _page(
        self,
        records: list[dict[str, Any]],
        checkpoint: dict[str, Any] | None,
        st: dict[str, Any],
        ids: int,
    ) -> Page:
        return Page(
            records=records,
            checkpoint=checkpoint,
            info={
                "source": "pubmed",
                "ids": ids,
                "expected_total": st["count"],
                "taken": st["taken"],
                "request": f"esearch retstart={st['retstart']} of count={st['count']}",
                "digest": page_digest([r["id"] for r in records]),
            },
        )

    async def _esearch(self, client: httpx.AsyncClient, params: dict[str, Any]) -> dict[str, Any]:
        """One esearch answer's ``esearchresult``. The body is read the way NCBI writes it:
        an in-band ``ERROR`` may hold a raw newline inside its JSON string."""
        resp = await self._call(client, self.search_ep, params)
        request = describe_request(self.cc.url(self.search_ep), params)
        try:
            data = json.loads(resp.text, strict=False)
        except ValueError:
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"pubmed esearch: the answer is not JSON (HTTP {resp.status_code}): "
                f"{resp.text[:200]!r} (request: {request})",
            ) from None
        result = data.get("esearchresult") if isinstance(data, dict) else None
        if not isinstance(result, dict):
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"pubmed esearch: expected an object at '$.esearchresult', found "
                f"{describe(json_path_lookup(data, '$.esearchresult'))} (request: {request})",
            )
        result["_request"] = request
        return result

    def _over_cap(self, what: str, count: int | None) -> ArtemisError:
        """The window holds more than esearch lists: the run splits it (never truncated)."""
        return ArtemisError(
            ErrorCode.RESULT_CAP_EXCEEDED,
            f"pubmed esearch: {what} for window {self.window or 'all'}",
            retryable=False,
            details={"count": count, "cap": self.cap},
        )

    async def _search(self, client: httpx.AsyncClient, st: dict[str, Any]) -> None:
        # Never ask past the cap: E-utilities would clamp the page (or refuse in band).
        size = max(1, min(self.retmax, self.cap - st["retstart"]))
        params = {
            "term": self.query,
            self.offset_param: st["retstart"],
            self.size_param: size,
            "usehistory": "y",
            **self.window,
        }
        if st.get("webenv"):
            params["WebEnv"] = st["webenv"]
        result = await self._esearch(client, params)
        error = result.get("ERROR")
        if error is not None and "WebEnv" in params and "webenv" in str(error).lower():
            # The history session expired: re-open one and go on from the same retstart
            # (the checkpoint), rather than failing or starting the window over.
            log.warning(
                "source_session_reopened", source="pubmed", error=error, retstart=st["retstart"]
            )
            st["webenv"] = None
            params.pop("WebEnv")
            result = await self._esearch(client, params)
            error = result.get("ERROR")
        request = result.pop("_request")
        if error is not None:
            text = str(error)
            if any(m in text for m in _CAP_ERRORS):
                # PubMed lists only the first 9,999 ids of a query, refused in band past it.
                raise self._over_cap(f"refused past the {self.cap} result cap: {text!r}", None)
            raise ArtemisError(
                ErrorCode.SOURCE_ERROR,
                f"pubmed esearch: {text} (request: {request})",
                retryable=False,
            )
        errors = result.get("errorlist") or {}
        unknown = [
            f"{kind} {', '.join(map(str, errors[kind]))}"
            for kind in ("phrasesnotfound", "fieldsnotfound")
            if isinstance(errors, dict) and errors.get(kind)
        ]
        if unknown:
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"params.query: PubMed does not know {'; '.join(unknown)} (esearch errorlist), "
                f"so its count would not be the query's (request: {request})",
            )
        count = as_count(result.get("count"))
        if count is None:
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"pubmed esearch: expected the hit count at '$.esearchresult.count', found "
                f"{describe(result.get('count', MISSING))} (request: {request})",
            )
        if count > self.cap:
            # Never truncate silently: esearch only reaches the first `cap` hits. The run
            # splits its window (RESULT_CAP_EXCEEDED) until every piece fits.
            raise self._over_cap(f"{count} hits exceed the {self.cap} result cap", count)
        warnings = result.get("warninglist") or {}
        notes = warnings.get("outputmessages") if isinstance(warnings, dict) else None
        clamped = [m for m in notes or [] if "restrictions achieved" in str(m).lower()]
        if clamped:
            # A page cut to fit the cap is not a short page: the query holds more.
            raise self._over_cap(f"the page was clamped ({clamped[0]})", count)
        raw_ids = result.get("idlist", MISSING)
        if not isinstance(raw_ids, list) or not all(as_count(i) is not None for i in raw_ids):
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"pubmed esearch: expected a list of PMIDs at '$.esearchresult.idlist', found "
                f"{describe(raw_ids)} (request: {request})",
            )
        ids = [str(i) for i in raw_ids]
        digest = page_digest(ids)
        check_loop(st.get("digest"), digest, "pubmed esearch", request)
        st.update(
            count=count,
            webenv=result.get("webenv"),
            retstart=st["retstart"] + len(ids),
            pending=ids,
            digest=digest or st.get("digest"),
        )


# E-utilities' in-band refusals past the result cap ("'retstart' cannot be larger than
# 9998", "Position 15000 is out of acceptable range [9999,9998]").
_CAP_ERRORS = ("cannot be larger than", "out of acceptable range")


@register_task
class LiteratureHarvest(TaskUnit):
    code = "literature_harvest"
    Params = LiteratureParams
    summary = "Harvest a provenance through its registry contract"

    internal_params = ("contract", "window_start", "window_end", "parent")

    def prepare_params(
        self, incoming: dict[str, Any], settings: Settings, trusted: bool = False
    ) -> BaseModel:
        params: LiteratureParams = super().prepare_params(  # type: ignore[assignment]
            incoming, settings, trusted
        )
        if params.parent and params.contract:
            # A child run: its parent's frozen contract, over its own window.
            params.window_start = (
                datetime.combine(params.start, datetime.min.time(), UTC) if params.start else None
            )
            params.window_end = (
                datetime.combine(params.end, datetime.min.time(), UTC) if params.end else None
            )
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
            start = (
                datetime.combine(params.start, datetime.min.time(), UTC) if params.start else None
            )
            end = datetime.combine(params.end, datetime.min.time(), UTC) if params.end else None
            if params.task_type == "backfill" and (start is None or end is None):
                raise ArtemisError(
                    ErrorCode.INVALID_INPUT, "params.start and params.end: a backfill needs both"
                )
            if params.task_type == "update":
                win = contract.window_offset or {}
                lag = timedelta(seconds=win.get("watermark_lag_seconds") or 0)
                mark = read_watermark(conn, contract.provenance["id"], "update", params.query or "")
                if mark is None and start is None:
                    raise ArtemisError(
                        ErrorCode.INVALID_INPUT,
                        "params.start: the first update run of a query needs a "
                        "start (there is no watermark yet)",
                    )
                overlap = _span(win.get("overlap_value"), win.get("overlap_unit_code"))
                start = (mark - overlap) if mark is not None else start
                end = end or (now - lag)
        params.contract = contract.to_dict()
        params.window_start, params.window_end = start, end
        return params

    def _child(self, p: LiteratureParams, start: date, end: date, parent: str) -> dict[str, Any]:
        return {
            "provenance": p.provenance,
            "task_type": "harvest",
            "query": p.query,
            "page_size": p.page_size,
            "start": start.isoformat(),
            "end": end.isoformat(),
            "contract": p.contract,
            "completeness_tolerance_pct": p.completeness_tolerance_pct,
            "window_start": None,
            "window_end": None,
            "parent": parent,
        }

    def plan_children(self, ctx: TaskContext) -> tuple[list[dict[str, Any]], int] | None:
        """A backfill: its range cut into the contract's windows (calendar months or fixed
        sizes), each a child run; ``parallelism`` (else ``rate_limit.max_concurrency``, else
        2) at once."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        if p.task_type != "backfill" or p.parent:
            return None
        assert p.window_start is not None and p.window_end is not None
        contract = self._contract(ctx)
        win = contract.window_offset or {}
        first, last = p.window_start.date(), p.window_end.date()
        windows: list[tuple[date, date]] = []
        cur = first
        while cur <= last:
            if (
                win.get("window_mode_code") == "CALENDAR"
                and win.get("window_size_unit_code") == "MONTH"
            ):
                months = win.get("window_size_value") or 1
                y, m = divmod(cur.month - 1 + months, 12)
                nxt = date(cur.year + y, m + 1, 1)
            else:
                span = _span(
                    win.get("window_size_value") or 1, win.get("window_size_unit_code") or "DAY"
                )
                nxt = cur + max(timedelta(days=1), span)
            windows.append((cur, min(last, nxt - timedelta(days=1))))
            cur = nxt
        children = [self._child(p, a, b, ctx.task_id) for a, b in windows]
        parallel = p.parallelism or (contract.rate_limit or {}).get("max_concurrency") or 2
        return children, int(parallel)

    def split(self, ctx: TaskContext, details: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Halve the window whose hits exceed the result cap (down to single days)."""
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        if p.window_start is None or p.window_end is None:
            return None
        first, last = p.window_start.date(), p.window_end.date()
        if first >= last:
            return None
        mid = first + (last - first) // 2
        return [
            self._child(p, first, mid, ctx.task_id),
            self._child(p, mid + timedelta(days=1), last, ctx.task_id),
        ]

    def _contract(self, ctx: TaskContext) -> Contract:
        return Contract(**ctx.params.contract)  # type: ignore[attr-defined]

    def build_sources(self, ctx: TaskContext) -> list[Source]:
        p: LiteratureParams = ctx.params  # type: ignore[assignment]
        contract = self._contract(ctx)
        cc = ContractClient(contract, ctx.settings, ctx.overrides.get("qps"))
        code, family = cc.code, api_family(contract)
        date_field = (contract.window_offset or {}).get("default_date_field_name")
        window = window_params(family, date_field, p.window_start, p.window_end)
        if family == "eutils":
            return [PubMedSource(cc, p.query or "all[sb]", window, p.page_size)]
        ep = contract.endpoint or {}
        query = {"query": p.query} if p.query else {}
        params = merge_params(ep.get("default_query_params"), {**query, **window})
        transform = (lambda item: normalize_crossref(item, code)) if family == "crossref" else None
        pg = contract.pagination or {}
        return [
            RestSource(
                cc.url(ep),
                paginator_for(contract, p.page_size),
                params=params,
                records_path=pg.get("records_jsonpath") or "$.items",
                name=code,
                record_key=pg.get("record_key_jsonpath")
                or ("$.DOI" if family == "crossref" else None),
                transform=transform,
                status_error=cc.status_error,
                send=lambda client, url, q: cc.send(client, "GET", url, q, f"{code} GET {url}"),
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
