"""The frozen registry contract as requests: its pagination cfg as a paginator, the API
family of its SEARCH endpoint, and the request plumbing (base URL, headers, timeouts, rate
limit, credentials, retry classes) every literature source shares.

Crossref has no module of its own: the generic REST source over this client and the
registry's settings serves it (its ``$.DOI`` key and ``normalize_crossref`` are in
``generic``, its date filter in ``planning``).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from sqlalchemy import select

from artemis.config import Settings
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import (
    Answer,
    HttpClient,
    TransportError,
    retry_after_seconds,
    status_error,
    transport_error,
)
from artemis.logsetup import get_logger
from artemis.ratelimit import TokenBucket, gate_for
from artemis.redact import register_secret
from artemis.registry.models import PAGINATION_MODES, RegProvCredential
from artemis.registry.resolve import Contract, base_url, merge_params, param_name
from artemis.registry.secret_env import check_secret_env, placement
from artemis.security import check_same_origin
from artemis.sources.paginators import (
    CursorPaginator,
    LinkHeaderPaginator,
    OffsetPaginator,
    PageNumberPaginator,
    Paginator,
    ScrollPaginator,
    TokenPaginator,
)
from artemis.sources.rest import JSON_TYPE, encode_body

log = get_logger(__name__)


def paginator_for(contract: Contract, page_size: int | None = None) -> Paginator:
    """The contract's pagination cfg as a paginator (endpoint param names win, §3.4)."""
    pg, ep = contract.pagination or {}, contract.endpoint
    mode = pg.get("pagination_mode_code") or "PAGE_NUMBER"
    size = page_size or pg.get("page_size_value")
    if size and pg.get("max_page_size_value"):
        size = min(size, pg["max_page_size_value"])
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
    if mode == "OFFSET":
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
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "page_size"),
        )
    if mode == "SCROLL":
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
            total_path=total_path,
        )
    if mode == "LINK_HEADER":
        return LinkHeaderPaginator(
            total_path=total_path,
            page_size=size,
            page_size_param=param_name("page_size", ep, pg, "page_size_param_name", "page_size"),
        )
    raise ArtemisError(
        ErrorCode.CONFIG_ERROR,
        f"pagination_mode_code {mode!r} is not one of {', '.join(PAGINATION_MODES)}",
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


class Credentials:
    """The contract's credentials in priority order, with per-key health: a key answered
    401/403 is benched for an hour, one answered 429 until its Retry-After (else a minute),
    and the next healthy key takes over. Secrets are decrypted here, on use."""

    # credential id -> monotonic time until which the key is not used (per worker process)
    _benched: ClassVar[dict[int, float]] = {}

    def __init__(self, contract: Contract, settings: Settings) -> None:
        self.rows = [c for c in contract.credentials if c.get("has_secret")]
        # A row written around the import's checks may hold one of the service's own
        # variables: the run stops before that secret is sent anywhere.
        for cred in self.rows:
            check_secret_env(
                cred.get("secret_env_name"),
                ErrorCode.CONFIG_ERROR,
                f"credential {cred.get('credential_name')!r}: secret_env",
            )
        self.settings = settings
        self._secrets: dict[int, str] = {}

    def _secret(self, cred_id: int) -> str:
        if cred_id not in self._secrets:
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
        where, name = placement(cred)
        secret = self._secret(cred["id"])
        if where == "query":
            params[name] = secret
        else:
            bearer = cred.get("auth_type_code") == "BEARER"
            headers[name] = f"Bearer {secret}" if bearer else secret
        return int(cred["id"])

    def bench(self, cred_id: int, resp: Answer) -> bool:
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
        # The largest answer read from this source (None: http_client.max_body_bytes).
        self.max_bytes = http.get("max_body_bytes")
        read_ms = http.get("timeout_read_millis")
        # None: the client's own read timeout (http_client.timeout_seconds)
        self.timeout = read_ms / 1000 if read_ms else None
        rl = contract.rate_limit or {}
        # The provenance's limit, held across every worker process (one database gate).
        qps = rl.get("qps_limit")
        self.gate = (
            gate_for(
                settings.database.url,
                f"provenance:{self.code}",
                float(qps) * settings.runs.rate_limit_headroom,
                rl.get("burst_capacity"),
            )
            if qps
            else None
        )
        # An operator's live rate for this run (POST /tasks/{id}/rate-limit): held evenly
        # (no burst) on top of the provenance's limit, by the one activity fetching the run.
        self.run_bucket = TokenBucket(qps_override, 1) if qps_override else None
        self.credentials = Credentials(contract, settings)

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

    async def throttle(self) -> None:
        if self.run_bucket is not None:
            await self.run_bucket.acquire()
        if self.gate is not None:
            await self.gate.acquire()

    async def send(
        self,
        client: HttpClient,
        method: str,
        url: str,
        params: dict[str, Any],
        what: str,
        *,
        body: dict[str, Any] | None = None,
        content_type: str | None = None,
    ) -> Answer:
        """One request under the rate limit with the first healthy credential; on 401/403/429
        the key is benched and the request goes again with the next one.

        ``body``: the request's body, encoded as ``content_type`` (JSON by default, or a
        form), with ``params`` in the query string. Without one, a POST sends ``params``
        as its form body (E-utilities' efetch by POST) and any other method in the query
        string."""
        # Credentials go only to the contract's own origin (SPEC §5): a URL elsewhere is
        # never sent, with or without them.
        check_same_origin(url, self.base, f"{self.code} {what}")
        for _ in range(len(self.credentials.rows) + 1):
            p, headers = dict(params), dict(self.headers)
            cred_id = self.credentials.apply(p, headers)
            await self.throttle()
            try:
                if body is not None:
                    kind = content_type or JSON_TYPE
                    resp = await client.request(
                        method,
                        url,
                        params=p or None,
                        content=encode_body(body, kind),
                        headers={**headers, "Content-Type": kind},
                        timeout=self.timeout,
                        max_bytes=self.max_bytes,
                    )
                elif method == "POST":
                    resp = await client.post(
                        url, data=p, headers=headers, timeout=self.timeout, max_bytes=self.max_bytes
                    )
                elif method != "GET":
                    resp = await client.request(
                        method,
                        url,
                        params=p or None,
                        headers=headers,
                        timeout=self.timeout,
                        max_bytes=self.max_bytes,
                    )
                else:
                    resp = await client.get(
                        url,
                        params=p or None,
                        headers=headers,
                        timeout=self.timeout,
                        max_bytes=self.max_bytes,
                    )
            except TransportError as e:
                raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
            if (
                cred_id is not None
                and resp.status_code in (401, 403, 429)
                and self.credentials.bench(cred_id, resp)
            ):
                continue
            return resp
        return resp
