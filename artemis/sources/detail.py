"""SEARCH → DETAIL: a search source's records give ids, and DETAIL requests fetch the
records by id, in batches.

Each page of the search (a ``RestSource``) is read for its records' ids (``id_path``,
a JSONPath over each record); the ids are fetched ``batch_size`` at a time, up to
``parallel`` batches in flight, and delivered in order. A batch's request is built from
the DETAIL endpoint:

- without a template: the ids joined by ``joiner`` in ``id_param``, in the query string
  of a GET, in the body of a POST (the endpoint's method, or POST for a batch longer
  than ``post_over`` ids);
- with a template (``{"params": {...}, "body": {...}}``): its ``params`` merged over the
  endpoint's query parameters, and on a POST its ``body`` over the endpoint's body. In
  the template's string values and the endpoint's path, ``{ids}`` is the joined ids,
  ``{id}`` the batch's one id (a batch size of 1), and a value that is exactly
  ``"{ids_json}"`` becomes the list of ids itself. Other braces are left as they are.

The checkpoint holds the search's checkpoint after the page being fetched and the ids
of that page not fetched yet: a resumed attempt fetches those, then goes on searching.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

from artemis import jsonio
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, HttpClient, body_excerpt
from artemis.paging import MISSING, contract_error, json_path_lookup, page_digest
from artemis.security import check_same_origin
from artemis.sources.base import Page, PageInfo, Source
from artemis.sources.responses import Asked, act_on, once
from artemis.sources.rest import JSON_TYPE, Request, RestSource, SourceHooks, place
from artemis.sources.xmldoc import XmlDocument, parse_xml
from artemis.transport_errors import TransportError, transport_error

PLACEHOLDERS = ("{ids}", "{id}", "{ids_json}")


@dataclass
class DetailRequests:
    """How a batch of ids is asked of the DETAIL endpoint (see the module)."""

    url: str
    method: str = "GET"
    params: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    content_type: str = JSON_TYPE
    id_param: str = "id"
    joiner: str = ","
    batch_size: int = 200
    post_over: int | None = None
    template: dict[str, Any] | None = None
    records_path: str = "$.items"
    response_format: str = "JSON"
    record_types: dict[str, str] | None = None

    def build(self, ids: list[Any]) -> Request:
        joined = self.joiner.join(str(i) for i in ids)
        values = {"{ids}": joined, "{id}": str(ids[0]) if len(ids) == 1 else joined}
        url = self.url
        for name, value in values.items():
            url = url.replace(name, quote(value, safe=","))
        over = self.post_over is not None and len(ids) > self.post_over
        method = "POST" if over else self.method
        if self.template is not None:
            params = place(self.params, fill(self.template.get("params") or {}, ids, values))
            body = None
            if method == "POST":
                body = place(self.body, fill(self.template.get("body") or {}, ids, values))
            return Request(method, url, params, body, self.content_type)
        if method == "POST":
            return Request(
                method,
                url,
                dict(self.params),
                place(self.body, {self.id_param: joined}),
                self.content_type,
            )
        return Request(method, url, {**self.params, self.id_param: joined})


def fill(template: Any, ids: list[Any], values: dict[str, str]) -> Any:
    """A template's values with the placeholders put in (see the module)."""
    if isinstance(template, dict):
        return {k: fill(v, ids, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, ids, values) for v in template]
    if isinstance(template, str):
        if template == "{ids_json}":
            return list(ids)
        for name, value in values.items():
            template = template.replace(name, value)
    return template


class DetailSource(Source):
    def __init__(
        self,
        search: RestSource,
        details: DetailRequests,
        hooks: SourceHooks,
        *,
        id_path: str,
        parallel: int = 1,
        name: str = "detail",
    ) -> None:
        """``hooks``: the DETAIL endpoint's (its ``send`` and ``status_error`` required;
        its response rules: an ignored answer is a batch of no records, its ids gone, and
        the search goes on)."""
        assert hooks.send is not None and hooks.status_error is not None
        self.search = search
        self.details = details
        self.id_path = id_path
        self.send: Callable[[HttpClient, Request], Awaitable[Answer]] = hooks.send
        self.status_error: Callable[[str, Answer], ArtemisError] = hooks.status_error
        self.transform = hooks.transform
        self.parallel = max(1, parallel)
        self.name = name
        self.actions = hooks.actions or []

    def limit_rate(self, acquire: Callable[[], Awaitable[None]]) -> None:
        self.search.limit_rate(acquire)

    def ids_of(self, records: list[Any]) -> list[Any]:
        out = []
        for r in records:
            value = json_path_lookup(r, self.id_path)
            if value is MISSING or value is None or value == "" or isinstance(value, dict | list):
                raise contract_error(f"{self.name} search", self.id_path, "the record's id", value)
            out.append(value)
        return out

    async def pages(
        self, client: HttpClient, checkpoint: dict[str, Any] | None
    ) -> AsyncIterator[Page]:
        st: dict[str, Any] = {
            "search": None,
            "ids_left": [],
            "searched": False,
            "done": False,
            "taken": 0,
            "total": None,
            **(checkpoint or {}),
        }
        # The search resumes as a retried attempt would: its last request may have been
        # served and its answer lost.
        self.search.resumed = self.resumed
        start = st["search"] if st["searched"] else None
        pages = cast(AsyncGenerator[Page, None], self.search.pages(client, start))
        async with aclosing(pages) as search:
            while True:
                if not st["ids_left"]:
                    if st["done"]:
                        yield self._page([], None, st, None)
                        return
                    page = await anext(search, None)
                    if page is None:
                        st["done"] = True
                        continue
                    st.update(
                        ids_left=self.ids_of(page.records),
                        search=page.checkpoint,
                        searched=True,
                        done=page.checkpoint is None,
                        total=page.info.expected_total,
                    )
                    if not st["ids_left"]:
                        if st["done"]:
                            # (the search's last page may be an answer a rule ignored)
                            yield self._page([], None, st, page.info.request, page.info.ignored)
                            return
                        continue
                size = self.details.batch_size
                batches = [
                    st["ids_left"][k : k + size]
                    for k in range(0, min(len(st["ids_left"]), size * self.parallel), size)
                ]
                answers = await asyncio.gather(*(self._fetch(client, b) for b in batches))
                for batch, (records, request, ignored) in zip(batches, answers, strict=True):
                    st["ids_left"] = st["ids_left"][len(batch) :]
                    st["taken"] += len(records)
                    last = st["done"] and not st["ids_left"]
                    yield self._page(records, None if last else dict(st), st, request, ignored)
                    if last:
                        return

    def _page(
        self,
        records: list[dict[str, Any]],
        checkpoint: dict[str, Any] | None,
        st: dict[str, Any],
        request: str | None,
        ignored: int = 0,
    ) -> Page:
        digest = page_digest(records) if records else None
        if self.transform:
            records = [self.transform(r) for r in records]
        return Page(
            records=records,
            checkpoint=checkpoint,
            info=PageInfo(
                request=request,
                expected_total=st["total"],
                taken=st["taken"],
                digest=digest,
                ignored=ignored,
            ),
        )

    async def _fetch(self, client: HttpClient, ids: list[Any]) -> tuple[list[Any], str, int]:
        """A batch's records, its request, and 1 when a response rule ignored its answer
        (no records), else 0."""
        req = self.details.build(ids)
        check_same_origin(req.url, self.search.url, f"{self.name} DETAIL")
        request = req.describe()
        what = f"{self.name} {req.method} {req.url}"
        try:
            resp = await self.send(client, req)
        except TransportError as e:
            raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
        # Parsed once, whether a rule's jsonpath reads it first or the records are.
        parse = once(lambda: self._parse(resp, what))
        asked = Asked(self.name, what, request)
        if self.actions and act_on(self.actions, resp, parse, asked, self.status_error):
            return [], request, 1
        if resp.status_code >= 400:
            raise self.status_error(what, resp)
        return self._records(parse(), request), request, 0

    def _parse(self, resp: Answer, what: str) -> Any:
        if self.details.response_format == "XML":
            return parse_xml(resp.content, what)
        try:
            return jsonio.loads(resp.content)
        except ValueError:
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"{what}: the answer is not JSON (HTTP {resp.status_code}): {body_excerpt(resp)!r}",
            ) from None

    def _records(self, doc: Any, request: str) -> list[Any]:
        """The records of a DETAIL answer at its records path."""
        path = self.details.records_path
        if isinstance(doc, XmlDocument):
            records: Any = doc.records(path, self.details.record_types)
        else:
            records = json_path_lookup(doc, path)
            # An object there is one record (``GET /items/{id}`` answers one).
            if isinstance(records, dict):
                records = [records]
        if not isinstance(records, list):
            raise contract_error(self.name, path, "the list of records", records).with_request(
                request
            )
        return records
