"""The frozen registry contract as requests: its pagination cfg as a paginator, and the
request plumbing (base URL, headers, timeouts, proxy and TLS, rate limits, credentials,
retry classes) every registry source shares. Transport and credentials are
``artemis.registry.auth``'s (``Credentials`` and ``require_credentials`` are named here
too). What shape a provenance's records have is declared in its registry entry
(``record_model``), never read from its paths.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, Form, HttpClient, status_error
from artemis.logsetup import get_logger
from artemis.paging import (
    CursorPaginator,
    LinkHeaderPaginator,
    NextUrlPaginator,
    OffsetPaginator,
    PageNumberPaginator,
    Paginator,
    ScrollPaginator,
    SinglePaginator,
    TokenPaginator,
)
from artemis.ratelimit import GateClosed, RateGate, TokenBucket, gate_for
from artemis.registry.auth import (
    Credentials,
    Reach,
    _TokenRefused,
    require_credentials,
    transport_for,
)
from artemis.registry.http_rules import TOKEN_AUTH_TYPES, TOKEN_USAGE
from artemis.registry.limit_headers import LimitHeaders, rate_limit_problems
from artemis.registry.models import PAGINATION_MODES
from artemis.registry.resolve import Contract, base_url, merge_params, param_name
from artemis.security import check_same_origin
from artemis.sources.rest import JSON_TYPE, encode_body
from artemis.transport_errors import TransportError, transport_error

log = get_logger(__name__)


def paginator_for(contract: Contract, page_size: int | None = None) -> Paginator:
    """The contract's pagination cfg as a paginator (endpoint param names win)."""
    pg, ep = contract.pagination or {}, contract.endpoint
    mode = pg.get("pagination_mode_code") or "PAGE_NUMBER"
    size = page_size or pg.get("page_size_value")
    if size and pg.get("max_page_size_value"):
        size = min(size, pg["max_page_size_value"])
    total_path = pg.get("total_count_jsonpath")
    if mode in ("PAGE_NUMBER", "OFFSET"):
        return _counted_paginator(mode, pg, ep, size)
    if mode == "CURSOR":
        return CursorPaginator(
            cursor_param=param_name("cursor", ep, pg, "cursor_param_name", "cursor"),
            cursor_path=pg.get("next_cursor_jsonpath") or "$.next_cursor",
            initial_cursor=pg.get("initial_cursor_value"),
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "rows"),
            total_path=total_path,
            short_page_ends=bool(pg.get("short_page_is_last")),
            stateful=bool(pg.get("stateful_cursor")),
        )
    if mode == "TOKEN":
        return TokenPaginator(
            token_param=param_name("token", ep, pg, "token_param_name", "page_token"),
            token_path=pg.get("next_token_jsonpath") or "$.next_page_token",
            total_path=total_path,
            absent_ends=bool(pg.get("absent_token_is_last")),
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "page_size"),
        )
    if mode == "SCROLL":
        return _scroll_paginator(contract, pg, ep, size)
    if mode in ("LINK_HEADER", "NEXT_URL"):
        return _next_url_paginator(mode, pg, ep, size)
    if mode == "SINGLE":
        # One request, no paging parameter: not even a run's page size is sent.
        return SinglePaginator(total_path=total_path)
    raise ArtemisError(
        ErrorCode.CONFIG_ERROR,
        f"pagination_mode_code {mode!r} is not one of {', '.join(PAGINATION_MODES)}",
    )


def _counted_paginator(
    mode: str, pg: dict[str, Any], ep: dict[str, Any] | None, size: int | None
) -> Paginator:
    """A PAGE_NUMBER or OFFSET pagination cfg as its paginator."""
    total_path = pg.get("total_count_jsonpath")
    short_ends = bool(pg.get("short_page_is_last"))
    # The source's own end marker (PAGE_NUMBER / OFFSET), when it has one.
    next_path, more_path = pg.get("next_page_jsonpath"), pg.get("has_more_jsonpath")
    if mode == "PAGE_NUMBER":
        return PageNumberPaginator(
            page=pg.get("start_page_number") or 1,
            page_param=param_name("page", ep, pg, "page_number_param_name", "page"),
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "page_size"),
            next_page_path=next_path,
            has_more_path=more_path,
            total_path=total_path,
            short_page_ends=short_ends,
        )
    return OffsetPaginator(
        limit=size or 100,
        offset_param=param_name("offset", ep, pg, "offset_param_name", "offset"),
        limit_param=param_name("limit", ep, pg, "limit_param_name", "limit"),
        total_path=total_path,
        max_offset=pg.get("max_result_window"),
        short_page_ends=short_ends,
        next_offset_path=next_path,
        has_more_path=more_path,
    )


def _next_url_paginator(
    mode: str, pg: dict[str, Any], ep: dict[str, Any] | None, size: int | None
) -> Paginator:
    """A LINK_HEADER or NEXT_URL pagination cfg as its paginator: the next page's URL in
    the ``Link`` header, or in the answer at ``next_url_jsonpath``."""
    common: dict[str, Any] = {
        "total_path": pg.get("total_count_jsonpath"),
        "page_size": size,
        "page_size_param": param_name("page_size", ep, pg, "page_size_param_name", "page_size"),
    }
    if mode == "LINK_HEADER":
        return LinkHeaderPaginator(**common)
    return NextUrlPaginator(next_url_path=pg.get("next_url_jsonpath") or "$.next", **common)


def _scroll_paginator(
    contract: Contract, pg: dict[str, Any], ep: dict[str, Any] | None, size: int | None
) -> Paginator:
    """A SCROLL pagination cfg as its paginator: its scroll and release URLs are paths
    after the contract's base URL."""
    base = base_url(contract)
    release = pg.get("scroll_release_path_template")
    return ScrollPaginator(
        scroll_url=base + (pg.get("scroll_path_template") or ""),
        release_url=base + release if release else None,
        keep_alive=pg.get("scroll_keep_alive_value") or "1m",
        keep_alive_param=pg.get("scroll_keep_alive_param_name") or "scroll",
        scroll_id_param=pg.get("scroll_id_param_name") or "scroll_id",
        scroll_id_path=pg.get("scroll_id_jsonpath") or "$._scroll_id",
        page_size=size,
        page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "size"),
        total_path=pg.get("total_count_jsonpath"),
    )


@dataclass(frozen=True)
class Sending:
    """How ``ContractClient.send`` sends a request beyond its method, URL and params: its
    ``body`` encoded as ``content_type``, the ``endpoint`` whose credential and rate
    bucket it takes, and ``query_only`` (the params always in the query string)."""

    body: dict[str, Any] | None = None
    content_type: str | None = None
    endpoint: dict[str, Any] | None = None
    query_only: bool = False


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
            k: str(v) for k, v in merge_params(http.get("default_headers_json"), None).items()
        }
        # The largest answer read from this source (None: http_client.max_body_bytes).
        self.max_bytes = http.get("max_body_bytes")
        read_ms = http.get("timeout_read_millis")
        # None: the client's own read timeout (http_client.timeout_seconds)
        self.timeout = read_ms / 1000 if read_ms else None
        # Proxy, TLS verification, connect timeout and compression of this source.
        self.transport = transport_for(contract)
        self.settings = settings
        rl = contract.rate_limit or {}
        # The provenance's limit, held across every worker process (database gates):
        # one gate for the provenance, or one per credential or per endpoint.
        qps = rl.get("qps_limit")
        self.qps = float(qps) * settings.runs.rate_limit_headroom if qps else None
        self.burst = rl.get("burst_capacity")
        self.granularity = rl.get("bucket_granularity_code") or "GLOBAL"
        # The source's own rate-limit headers close the gate a request passed.
        self.limit_headers = _limit_headers(self.code, rl)
        self.gate = self.gate_for() if self.granularity == "GLOBAL" else None
        # An operator's live rate for this run (POST /tasks/{id}/rate-limit): held evenly
        # (no burst) on top of the provenance's limit, by the one activity fetching the run.
        self.run_bucket = TokenBucket(qps_override, 1) if qps_override else None
        require_credentials(contract)
        self.credentials = Credentials(contract, settings, self.reach())

    def reach(self) -> Reach:
        """How this client reaches the source's origin (its credentials' requests too)."""
        return Reach(self.base, self.headers, self.transport, self.timeout, self.max_bytes)

    def for_contract(self, contract: Contract) -> ContractClient:
        """This client for another contract of the same provenance (one resource's, or one
        asked for a parent record): the same transport, credentials and rate gates."""
        other = copy.copy(self)
        other.contract = contract
        return other

    def status_error(self, what: str, resp: Answer) -> ArtemisError:
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

    def gate_for(
        self, cred: dict[str, Any] | None = None, endpoint: dict[str, Any] | None = None
    ) -> RateGate | None:
        """The database gate a request with ``cred`` to ``endpoint`` passes
        (``bucket_granularity_code``): the provenance's, the credential's (requests
        without one share one) or the endpoint's; None without a ``qps_limit`` or
        header reading."""
        if not self.qps and self.limit_headers is None:
            return None
        key = f"provenance:{self.code}"
        if self.granularity == "PER_KEY":
            key += f":key:{cred['credential_name'] if cred else '-'}"
        elif self.granularity == "PER_ENDPOINT":
            ep = endpoint if endpoint is not None else self.contract.endpoint
            key += f":endpoint:{ep['endpoint_name'] if ep else '-'}"
        return gate_for(self.settings.database.url, key, self.qps, self.burst)

    async def throttle(
        self, cred: dict[str, Any] | None = None, endpoint: dict[str, Any] | None = None
    ) -> RateGate | None:
        """Wait for the request's turn; the gate it passed. A gate closed by the source's
        headers for longer than ``runs.retry_max_interval_s`` is a retryable wait of the
        run (an outage on Temporal timers) rather than a sleep holding the fetch."""
        if self.run_bucket is not None:
            await self.run_bucket.acquire()
        gate = self.gate if self.granularity == "GLOBAL" else self.gate_for(cred, endpoint)
        if gate is not None:
            try:
                await gate.acquire(self.settings.runs.retry_max_interval_s)
            except GateClosed as e:
                raise ArtemisError(
                    ErrorCode.SOURCE_ERROR,
                    f"provenance {self.code!r}: the source's rate-limit headers said its "
                    f"budget is spent; its gate opens in {e.seconds:.0f} s",
                    retryable=True,
                    retry_after_s=e.seconds,
                    details={"reason": "rate limit spent"},
                ) from None
        return gate

    async def read_limits(self, gate: RateGate | None, resp: Answer) -> None:
        """An answer whose rate-limit headers say the budget is spent closes ``gate``
        until the reset, for every worker."""
        if gate is None or self.limit_headers is None:
            return
        seconds = self.limit_headers.closed_for(resp, time.time())
        if seconds is not None and await gate.close_for(seconds):
            log.info("rate_gate_closed", provenance=self.code, gate=gate.key, seconds=seconds)

    def endpoint_of(self, url: str) -> dict[str, Any] | None:
        """The contract's endpoint a URL is a request to (its path template after the base
        URL, a ``{placeholder}`` standing for one path segment); the contract's own when
        it is one of several that fit or none fits (a next-page URL the source handed
        back). A caller that knows the endpoint says so (``send(..., Sending(endpoint=...))``)."""
        bare = url.split("?", 1)[0]
        found = []
        for usage, ep in self.contract.endpoints.items():
            if usage == TOKEN_USAGE or not ep.get("path_template"):
                continue
            pattern = re.escape(self.url(ep))
            pattern = re.sub(r"\\\{[^}]*\\\}", "[^/?#]+", pattern)
            if re.fullmatch(pattern, bare):
                found.append(ep)
        own = self.contract.endpoint
        if len(found) == 1:
            return found[0]
        return own

    async def send(
        self,
        client: HttpClient,
        method: str,
        url: str,
        params: dict[str, Any],
        what: str,
        how: Sending | None = None,
    ) -> Answer:
        """One request under the rate limit with the first healthy credential for
        ``endpoint`` (default: the one ``url`` names, else the contract's own); on
        401/403/429 the key is benched and the request goes again with the next one. A
        token (access, session) answered 401 is fetched again once before the bench.

        When every key is refused (401/403), the request fails at once
        (``Credentials.exhausted``) rather than answering the last refusal.

        ``body``: the request's body, encoded as ``content_type`` (JSON by default, or a
        form), with ``params`` in the query string. Without one, a POST sends ``params``
        as its form body (E-utilities' efetch by POST) and any other method in the query
        string; ``query_only``: ``params`` always go in the query string, and a POST
        without a body sends none (a scroll's continue request, which an
        Elasticsearch-style server refuses as a form). These four are ``how``'s."""
        how = how or Sending()
        endpoint = how.endpoint
        # Credentials go only to the contract's own origin (artemis/security.py): a URL elsewhere is
        # never sent, with or without them.
        check_same_origin(url, self.base, f"{self.code} {what}")
        ep = endpoint if endpoint is not None else self.endpoint_of(url)
        renewed: set[int] = set()
        while True:
            p, headers = dict(params), dict(self.headers)
            cred = self.credentials.current(ep)
            sent: str | None = None
            if cred is not None:
                try:
                    sent = await self.credentials.apply(cred, p, headers, client)
                except _TokenRefused as e:
                    if self.credentials.bench(cred["id"], None, ep):
                        continue
                    waits = self.credentials.exhausted(ep, what)
                    raise (waits if waits.retryable else e.error) from None
            gate = await self.throttle(cred, ep)
            try:
                resp = await self._request(client, method, url, p, headers, how)
            except TransportError as e:
                raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
            await self.read_limits(gate, resp)
            if cred is None or resp.status_code not in (401, 403, 429):
                return resp
            if self._goes_again(cred, sent, resp, ep, renewed):
                continue
            if resp.status_code in (401, 403):
                # Every key refused: final, naming each (a 429 is the caller's to wait).
                raise self.credentials.exhausted(ep, what)
            return resp

    def _request(
        self,
        client: HttpClient,
        method: str,
        url: str,
        p: dict[str, Any],
        headers: dict[str, str],
        how: Sending,
    ) -> Awaitable[Answer]:
        """The request ``send`` makes, not yet awaited: ``body`` encoded as
        ``content_type``, else a POST's params as its form (unless ``query_only``), else
        the params in the query string."""
        body, content_type, query_only = how.body, how.content_type, how.query_only
        carried = self.reach().carried()
        if body is not None:
            kind = content_type or JSON_TYPE
            return client.request(
                method,
                url,
                params=p or None,
                body=encode_body(body, kind),
                headers={**headers, "Content-Type": kind},
                transport=carried,
            )
        if method == "POST" and not query_only:
            return client.post(url, body=Form(p), headers=headers, transport=carried)
        return client.request(method, url, params=p or None, headers=headers, transport=carried)

    def _goes_again(
        self,
        cred: dict[str, Any],
        sent: str | None,
        resp: Answer,
        ep: dict[str, Any] | None,
        renewed: set[int],
    ) -> bool:
        """After a 401/403/429 with ``cred``: whether the request goes again, with a new
        access token or a new session login (once per key) or with the next key once this
        one is benched."""
        if (
            resp.status_code == 401
            and cred.get("auth_type_code") in TOKEN_AUTH_TYPES
            and cred["id"] not in renewed
            and sent is not None
        ):
            # An access token expired early or was revoked, a session ended: one new
            # token, then the key's health decides.
            renewed.add(cred["id"])
            self.credentials.expire(cred, sent)
            return True
        return self.credentials.bench(cred["id"], resp, ep)


def _limit_headers(code: str, rl: dict[str, Any]) -> LimitHeaders | None:
    """The rate-limit cfg's header reading; a row written around the import that cannot
    act as written stops the run before a request."""
    problems = rate_limit_problems(rl)
    if problems:
        raise ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"provenance {code!r} rate_limit_cfg: {'; '.join(problems)}",
            retryable=False,
        )
    return LimitHeaders.of(rl)
