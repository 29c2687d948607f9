"""Platform adapters: search a keyword into candidate notes, fetch one
note's details, each request with the cookie the pool lent it.

:class:`HttpJsonPlatform` speaks any platform whose search and detail answers are JSON,
configured by ``crawler.platforms.<name>`` (paths, parameter names, where the items and
the next page are). A search page ends the keyword only on the platform's own word (the
next page null, or a has-more flag false); a missing key or a wrong type is
``SOURCE_CONTRACT`` (docs/architecture.md). Failures map to the crawler's error codes: 401/403 →
``COOKIE_INVALID`` (the cookie is blamed, the next one tried), 429 → ``PLATFORM_ERROR``
with the server's ``Retry-After``, 5xx → ``PLATFORM_ERROR``, a timeout →
``TIMEOUT_ERROR``, a connection failure → ``NETWORK_ERROR``, 404 → ``PLATFORM_ERROR``
that no retry fixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from artemis.config import PlatformSettings
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import HttpClient, body_excerpt, retry_after_seconds
from artemis.paging import as_count, contract_error, json_path_lookup
from artemis.security import is_safe_id
from artemis.transport_errors import AnswerTooLarge, TransportError, TransportTimeout


@dataclass(frozen=True)
class SearchPage:
    items: list[dict[str, Any]]  # {"note_id", "note_url"}
    next_page: int | None  # None: the keyword's last page


class HttpJsonPlatform:
    def __init__(self, name: str, cfg: PlatformSettings) -> None:
        self.name = name
        self.cfg = cfg
        self.base = cfg.base_url.rstrip("/")

    def _headers(self, cookie: str | None) -> dict[str, str]:
        return {self.cfg.cookie_header: cookie} if cookie else {}

    async def _get(
        self,
        client: HttpClient,
        what: str,
        url: str,
        params: dict[str, Any] | None,
        cookie: str | None,
        timeout: float,
    ) -> Any:
        try:
            resp = await client.get(
                url, params=params, headers=self._headers(cookie), timeout=timeout
            )
        except TransportTimeout:
            raise ArtemisError(
                ErrorCode.TIMEOUT_ERROR, f"{self.name} {what}: no answer within {timeout:g} s"
            ) from None
        except AnswerTooLarge as e:
            raise ArtemisError(
                ErrorCode.PLATFORM_ERROR, f"{self.name} {what}: {e}", retryable=False
            ) from None
        except TransportError as e:
            raise ArtemisError(
                ErrorCode.NETWORK_ERROR, f"{self.name} {what}: {type(e).__name__}"
            ) from None
        code = resp.status_code
        if code in (401, 403):
            raise ArtemisError(
                ErrorCode.COOKIE_INVALID, f"{self.name} {what}: HTTP {code}, the cookie was refused"
            )
        if code == 429:
            raise ArtemisError(
                ErrorCode.PLATFORM_ERROR,
                f"{self.name} {what}: HTTP 429, rate limited",
                retry_after_s=retry_after_seconds(resp),
                details={"rate_limited": True},
            )
        if code == 404:
            raise ArtemisError(
                ErrorCode.PLATFORM_ERROR,
                f"{self.name} {what}: HTTP 404, not found",
                retryable=False,
            )
        if code >= 400:
            raise ArtemisError(ErrorCode.PLATFORM_ERROR, f"{self.name} {what}: HTTP {code}")
        try:
            return resp.json()
        except ValueError:
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"{self.name} {what}: the answer is not JSON: {body_excerpt(resp)!r}",
            ) from None

    async def search(
        self, client: HttpClient, keyword: str, page: int, cookie: str | None, timeout: float
    ) -> SearchPage:
        c = self.cfg
        data = await self._get(
            client,
            f"search {keyword!r} page {page}",
            self.base + c.search_path,
            {c.keyword_param: keyword, c.page_param: page, c.page_size_param: c.page_size},
            cookie if c.search_needs_cookie else None,
            timeout,
        )
        request = (
            f"GET {self.base}{c.search_path}?{c.keyword_param}={keyword}&{c.page_param}={page}"
        )
        raw = json_path_lookup(data, c.items_path)
        if not isinstance(raw, list):
            raise contract_error(
                f"{self.name} search", c.items_path, "the list of notes", raw
            ).with_request(request)
        items = []
        for item in raw:
            note_id = item.get(c.note_id_field) if isinstance(item, dict) else None
            if note_id in (None, "") or not is_safe_id(str(note_id)):
                raise contract_error(
                    f"{self.name} search",
                    f"{c.items_path}[].{c.note_id_field}",
                    "a note id (letters, digits and . _ : -, never '..')",
                    item,
                ).with_request(request)
            items.append({"note_id": str(note_id), "note_url": item.get(c.note_url_field)})
        # An empty page is the platform's own word that the keyword has no more notes.
        return SearchPage(items, self._next_page(data, page, request) if items else None)

    def _next_page(self, data: Any, page: int, request: str) -> int | None:
        """The next search page on the platform's word: ``next_page_path`` (a number, or
        null on the last page) or ``has_more_path`` (true or false)."""
        c, who = self.cfg, f"{self.name} search"
        if c.next_page_path:
            nxt = json_path_lookup(data, c.next_page_path)
            if nxt is None or nxt is False:
                return None
            number = as_count(nxt)
            if number is None or number < 1:
                raise contract_error(
                    who, c.next_page_path, "the next page number, or null on the last page", nxt
                ).with_request(request)
            return number
        assert c.has_more_path  # the settings require one of the two
        more = json_path_lookup(data, c.has_more_path)
        if not isinstance(more, bool):
            raise contract_error(who, c.has_more_path, "true or false", more).with_request(request)
        return page + 1 if more else None

    async def detail(
        self, client: HttpClient, note_id: str, cookie: str, timeout: float
    ) -> dict[str, Any]:
        if not is_safe_id(note_id):
            # `..` would collapse the path (/notes/.. is /) on a cookie-carrying request
            raise ArtemisError(
                ErrorCode.INVALID_INPUT,
                f"note id {note_id[:40]!r}: 1-128 letters, digits and . _ : -, never '..'",
            )
        path = self.cfg.detail_path.format(note_id=quote(note_id, safe=""))
        data = await self._get(client, f"note {note_id}", self.base + path, None, cookie, timeout)
        if not isinstance(data, dict):
            raise contract_error(f"{self.name} note {note_id}", "$", "a JSON object", data)
        return {
            **data,
            "note_id": str(data.get(self.cfg.note_id_field, note_id)),
            "platform": self.name,
        }


def platform_for(settings: Any, name: str) -> HttpJsonPlatform:
    cfg = settings.crawler.platforms.get(name)
    if cfg is None:
        known = ", ".join(sorted(settings.crawler.platforms)) or "none"
        raise ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"params.platform: unknown platform {name!r} (configured: {known})",
        )
    return HttpJsonPlatform(name, cfg)
