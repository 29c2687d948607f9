"""Sources read what an API says in band (docs/architecture.md): E-utilities' ERROR,
WarningList and ErrorList, bodies that are not JSON, records that are not where the
contract says, and a stateful cursor session resumed after a lost answer. Each against a
real HTTP server on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from artemis.config import load_settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.literature.pubmed import PubMedSource
from artemis.paging import CursorPaginator, PageNumberPaginator
from artemis.registry.client import ContractClient
from artemis.registry.resolve import Contract
from artemis.sources.rest import RestSource, Search
from artemis_samples.app import create_app as create_samples_app
from artemis_samples.server import ThreadedServer
from tests.helpers import http_client

RAW_NEWLINE_ERROR = (
    '{"header":{"type":"esearch","version":"0.3"},"esearchresult":{"ERROR":"Search Backend '
    'failed: Exception:\nPosition 15000 is out of acceptable range [9999,9998]"}}'
)


def esearch_app() -> FastAPI:
    app = FastAPI()

    @app.get("/{case}/esearch.fcgi")
    async def esearch(case: str, request: Request) -> Response:
        retstart = int(request.query_params.get("retstart", 0))
        ok: dict[str, Any] = {"count": "40", "retmax": "20", "retstart": str(retstart)}
        if case == "html":
            return Response("<html><body>Service unavailable</body></html>", 200)
        if case == "cap":
            return Response(RAW_NEWLINE_ERROR, media_type="application/json")
        if case == "clamped":
            ok.update(
                idlist=[str(i) for i in range(20)],
                warninglist={
                    "phrasesignored": [],
                    "quotedphrasesnotfound": [],
                    "outputmessages": ["Restrictions achieved. start and count adjusted to 0, 9"],
                },
            )
        elif case == "unknown-phrase":
            ok.update(
                count="0",
                idlist=[],
                errorlist={"phrasesnotfound": ["zzzqqq"], "fieldsnotfound": []},
            )
        elif case == "repeat":
            ok["idlist"] = [str(i) for i in range(20)]  # the same 20 ids at any retstart
        elif case == "no-count":
            ok.pop("count")
            ok["idlist"] = []
        return JSONResponse({"header": {"type": "esearch"}, "esearchresult": ok})

    @app.get("/{case}/efetch.fcgi")
    async def efetch(case: str, id: str) -> Response:
        body = "".join(
            f"<PubmedArticle><MedlineCitation><PMID>{i}</PMID></MedlineCitation></PubmedArticle>"
            for i in id.split(",")
        )
        return Response(f"<PubmedArticleSet>{body}</PubmedArticleSet>", media_type="text/xml")

    return app


@pytest.fixture(scope="module")
def server():
    s = ThreadedServer(esearch_app()).start()
    yield s
    s.stop()


def pubmed(base: str) -> PubMedSource:
    endpoint = {"endpoint_name": "esearch", "path_template": "/esearch.fcgi"}
    fetch = {"endpoint_name": "efetch", "path_template": "/efetch.fcgi"}
    contract = Contract(
        provenance={"provenance_code": "pm", "base_url_default": base},
        task_type="harvest",
        at="",
        usage="SEARCH",
        endpoint=endpoint,
        endpoints={"SEARCH": endpoint, "DETAIL": fetch},
        pagination={"page_size_value": 20, "max_result_window": 9999},
        window_offset=None,
        http=None,
        batching=None,
        retry=None,
        rate_limit=None,
    )
    return PubMedSource(ContractClient(contract, load_settings(None)), "q", {}, None)


async def _drain(source, checkpoint=None) -> list[Any]:
    async with http_client() as client:
        return [p async for p in source.pages(client, checkpoint)]


@pytest.mark.parametrize(
    "case,code,text",
    [
        ("html", ErrorCode.SOURCE_CONTRACT, "Service unavailable"),  # a snippet, not INTERNAL
        ("cap", ErrorCode.RESULT_CAP_EXCEEDED, "out of acceptable range"),
        ("clamped", ErrorCode.RESULT_CAP_EXCEEDED, "Restrictions achieved"),
        ("unknown-phrase", ErrorCode.INVALID_INPUT, "zzzqqq"),
        ("repeat", ErrorCode.SOURCE_LOOP, "retstart=20"),
        ("no-count", ErrorCode.SOURCE_CONTRACT, "'$.esearchresult.count'"),
    ],
)
async def test_esearch_answers_are_read_in_band(server, case, code, text):
    with pytest.raises(ArtemisError) as e:
        await _drain(pubmed(f"{server.url}/{case}"))
    assert e.value.code == code and text in e.value.message, e.value.message
    assert not e.value.retryable


async def test_records_not_where_the_contract_says_are_a_source_contract_error(server):
    source = RestSource(
        f"{server.url}/repeat/esearch.fcgi",
        PageNumberPaginator(next_page_path=None),
        Search(records_path="$.esearchresult.items"),
        name="wrong-path",
    )
    with pytest.raises(ArtemisError) as e:
        await _drain(source)
    assert e.value.code == ErrorCode.SOURCE_CONTRACT
    assert "'$.esearchresult.items'" in e.value.message and "GET http" in e.value.message


async def test_a_stateful_cursor_resumed_after_a_lost_answer_reopens_and_skips_nothing():
    samples = ThreadedServer(create_samples_app()).start()
    try:
        params = {
            "query": "resume",
            "filter": "from-index-date:2025-01-01,until-index-date:2025-01-05",
        }

        def source() -> RestSource:
            return RestSource(
                f"{samples.url}/works",
                CursorPaginator(
                    cursor_path="$.message.next-cursor",
                    initial_cursor="*",
                    page_size=20,
                    page_size_param="rows",
                    short_page_ends=True,
                    total_path="$.message.total-results",
                ),
                Search(params=params, records_path="$.message.items", record_key="$.DOI"),
            )

        seen: list[str] = []
        async with http_client() as client:
            pages = source().pages(client, None)
            for _ in range(3):
                page = await pages.__anext__()
                seen += [r["DOI"] for r in page.records]
            await pages.aclose()
            checkpoint = page.checkpoint
            assert checkpoint is not None and checkpoint["stateful"] is True
            # The worker died after asking for page 4: the server's session moved on.
            lost = await client.get(
                f"{samples.url}/works",
                params={**params, "rows": 20, "cursor": checkpoint["cursor"]},
            )
            assert len(lost.json()["message"]["items"]) == 20
            resumed = source()
            resumed.resumed = True
            rest = [p async for p in resumed.pages(client, checkpoint)]
        seen += [r["DOI"] for p in rest for r in p.records]
        assert len(seen) == len(set(seen)) == 150  # 5 days x 30, each once
        assert rest[-1].info.taken == rest[-1].info.expected_total == 150
    finally:
        samples.stop()
