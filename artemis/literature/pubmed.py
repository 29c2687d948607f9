"""PubMed through E-utilities: esearch (with a history session) pages through PMIDs, efetch
turns them into records; in-band refusals and result-cap overruns become errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, HttpClient, body_excerpt
from artemis.literature.normalize import parse_pubmed_xml
from artemis.logsetup import get_logger
from artemis.paging import MISSING, as_count, check_loop, describe, json_path_lookup, page_digest
from artemis.registry.client import ContractClient
from artemis.registry.resolve import merge_params, param_name
from artemis.sources import Page, PageInfo, Source
from artemis.sources.rest import describe_request

log = get_logger(__name__)

# E-utilities' in-band refusals past the result cap ("'retstart' cannot be larger than
# 9998", "Position 15000 is out of acceptable range [9999,9998]").
_CAP_ERRORS = ("cannot be larger than", "out of acceptable range")


class PubMedSource(Source):
    """esearch with ``usehistory=y`` pages through ids; efetch turns them into records in
    batches (POST above the contract's threshold). The checkpoint holds the esearch
    position and the ids not fetched yet."""

    name = "pubmed"

    def __init__(
        self,
        cc: ContractClient,
        query: str,
        window: dict[str, Any],
        page_size: int | None,
        parallel: int = 1,
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
        # efetch batches in flight at once: the run's fetch concurrency, bounded by the
        # provenance's max_parallel_requests and max_concurrency (the rate is its gate's).
        limits = [
            v
            for v in (bt.get("max_parallel_requests"), (c.rate_limit or {}).get("max_concurrency"))
            if v
        ]
        self.parallel = max(1, min([parallel, *limits]))
        self.query = query
        self.window = window

    async def _call(
        self,
        client: HttpClient,
        ep: dict[str, Any],
        params: dict[str, Any],
        force_post: bool = False,
    ) -> Answer:
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
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        st = {
            "retstart": 0,
            "pending": [],
            "count": None,
            "webenv": None,
            # Records delivered; for a checkpoint without it, every id taken off the
            # esearch list but the pending ones.
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
                    yield self._page([], None, st)
                    return
            # Up to ``parallel`` efetch batches at once, delivered in order: each page's
            # checkpoint holds the ids after it (those in flight are asked again on resume).
            batches = [
                st["pending"][k : k + self.batch]
                for k in range(0, min(len(st["pending"]), self.batch * self.parallel), self.batch)
            ]
            fetching = [asyncio.ensure_future(self._efetch(client, ids)) for ids in batches]
            try:
                for ids, job in zip(batches, fetching, strict=True):
                    records = await job
                    st["pending"] = st["pending"][len(ids) :]
                    st["taken"] += len(records)
                    done = not st["pending"] and st["retstart"] >= (st["count"] or 0)
                    yield self._page(records, None if done else dict(st), st)
                    if done:
                        return
            finally:
                for job in fetching:
                    job.cancel()
                await asyncio.gather(*fetching, return_exceptions=True)

    async def _efetch(self, client: HttpClient, ids: list[str]) -> list[dict[str, Any]]:
        resp = await self._call(
            client,
            self.fetch_ep,
            # PubmedArticleSet XML (efetch's default for PubMed), which is what is parsed.
            {self.id_param: self.joiner.join(ids), "retmode": "xml"},
            force_post=len(ids) > self.post_over,
        )
        records = parse_pubmed_xml(resp.content, self.cc.code)
        if len(records) != len(ids):
            log.warning("pubmed_efetch_short", asked=len(ids), got=len(records))
        return records

    def _page(
        self,
        records: list[dict[str, Any]],
        checkpoint: dict[str, Any] | None,
        st: dict[str, Any],
    ) -> Page:
        return Page(
            records=records,
            checkpoint=checkpoint,
            info=PageInfo(
                source="pubmed",
                expected_total=st["count"],
                taken=st["taken"],
                request=f"esearch retstart={st['retstart']} of count={st['count']}",
                digest=page_digest([r["id"] for r in records]),
            ),
        )

    async def _esearch(self, client: HttpClient, params: dict[str, Any]) -> dict[str, Any]:
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
                f"{body_excerpt(resp)!r} (request: {request})",
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

    async def _search(self, client: HttpClient, st: dict[str, Any]) -> None:
        """The next esearch page: its ids become the pending ones, the position advances."""
        # Never ask past the cap: E-utilities would clamp the page (or refuse in band).
        size = max(1, min(self.retmax, self.cap - st["retstart"]))
        params = {
            "term": self.query,
            # E-utilities answer esearch in XML unless asked for JSON, which is read here
            # (whatever the registry's default query parameters say).
            "retmode": "json",
            self.offset_param: st["retstart"],
            self.size_param: size,
            "usehistory": "y",
            **self.window,
        }
        if st.get("webenv"):
            params["WebEnv"] = st["webenv"]
        result = await self._esearch_in_session(client, params, st)
        request = result.pop("_request")
        self._check_refusals(result, request)
        count = self._count(result, request)
        ids = self._ids(result, request)
        digest = page_digest(ids)
        check_loop(st.get("digest"), digest, "pubmed esearch", request)
        st.update(
            count=count,
            webenv=result.get("webenv"),
            retstart=st["retstart"] + len(ids),
            pending=ids,
            digest=digest or st.get("digest"),
        )

    async def _esearch_in_session(
        self, client: HttpClient, params: dict[str, Any], st: dict[str, Any]
    ) -> dict[str, Any]:
        """esearch within the checkpoint's history session, re-opened once if it expired."""
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
        return result

    def _check_refusals(self, result: dict[str, Any], request: str) -> None:
        """An in-band ``ERROR`` (the result cap, else final) or terms PubMed does not know."""
        error = result.get("ERROR")
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

    def _count(self, result: dict[str, Any], request: str) -> int:
        """The hit count, refused when esearch cannot reach every hit (over the cap, or a
        page clamped to fit it)."""
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
        return count

    def _ids(self, result: dict[str, Any], request: str) -> list[str]:
        raw_ids = result.get("idlist", MISSING)
        if not isinstance(raw_ids, list) or not all(as_count(i) is not None for i in raw_ids):
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"pubmed esearch: expected a list of PMIDs at '$.esearchresult.idlist', found "
                f"{describe(raw_ids)} (request: {request})",
            )
        return [str(i) for i in raw_ids]
