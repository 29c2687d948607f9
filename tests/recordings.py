"""A source server that replays the real recordings of ``../shared/fixtures/`` (a
sample must not agree with the client's mistakes, so these pages come from the live
APIs, recorded by other people).

- Crossref ``/crossref/works``: a recorded cursor chain (``query=widget``: 3 pages of 20,
  ``query=ecology``: 2 pages of 30) served *in sequence* — the live API returns the same
  ``next-cursor`` on every page, so pages are handed out by position in the session, not
  looked up by URL — then an empty page. ``total-results`` is made consistent with what
  is served (the recorded value counts the whole live index).
- PubMed ``/pubmed/eutils/esearch.fcgi`` (the recorded JSON answer, its ``idlist`` paged
  over the PMIDs of the recorded efetch files, ``count`` made consistent) and
  ``efetch.fcgi`` (the recorded ``PubmedArticle`` elements, byte for byte, for the ids
  asked).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"

CHAINS = {
    "widget": [f"crossref/works_query-widget_cursor_page{i}.json" for i in (1, 2, 3)],
    "ecology": [f"crossref/works_query-ecology_rows30_cursor_page{i}.json" for i in (1, 2)],
}
EFETCH_FILES = (
    "pubmed/efetch_biopython_pmid-11748933-11700088.xml",
    "pubmed/efetch_biopython_pmid-12091962-9997_rettype-abstract.xml",
    "pubmed/efetch_eutils_pmid-23121403.xml",
    "pubmed/efetch_fastpaper_pmid-41884867-41884779-41884685.xml",
)
ESEARCH_FILE = "pubmed/esearch_eutils-mcp-server_science-breast-cancer_usehistory.json"


def available() -> bool:
    return all((FIXTURES / f).exists() for c in CHAINS.values() for f in c) and all(
        (FIXTURES / f).exists() for f in (*EFETCH_FILES, ESEARCH_FILE)
    )


def load_chain(name: str) -> list[dict[str, Any]]:
    return [json.loads((FIXTURES / f).read_text()) for f in CHAINS[name]]


def recorded_articles() -> dict[str, bytes]:
    """PMID → its ``<PubmedArticle>`` element as recorded (``MedlineCitation/PMID`` only:
    other PMIDs inside, e.g. CommentsCorrections, do not name the record)."""
    out: dict[str, bytes] = {}
    for f in EFETCH_FILES:
        body = (FIXTURES / f).read_bytes()
        for m in re.finditer(rb"<PubmedArticle>.*?</PubmedArticle>", body, re.S):
            art = m.group(0)
            pmid = re.search(rb"<MedlineCitation[^>]*>\s*<PMID[^>]*>(\d+)</PMID>", art)
            assert pmid is not None, f"no MedlineCitation/PMID in {f}"
            out[pmid.group(1).decode()] = art
    return out


def create_app() -> FastAPI:
    app = FastAPI()
    sessions: dict[str, dict[str, Any]] = {}  # cursor → {"chain", "pos"}
    articles = recorded_articles()
    pmids = list(articles)
    head = (FIXTURES / EFETCH_FILES[0]).read_bytes().split(b"<PubmedArticleSet>")[0]
    esearch = json.loads((FIXTURES / ESEARCH_FILE).read_text())
    calls: list[dict[str, Any]] = []
    app.state.calls = calls

    @app.get("/crossref/works")
    async def works(request: Request) -> JSONResponse:
        p = dict(request.query_params)
        calls.append({"api": "works", "params": p})
        chain = load_chain(p.get("query", "")) if p.get("query") in CHAINS else None
        if chain is None or "cursor" not in p:
            return JSONResponse({"status": "failed", "message": "replays cursor chains"}, 400)
        rows = chain[0]["message"]["items-per-page"]
        if int(p.get("rows", 20)) != rows:
            return JSONResponse(
                {"status": "failed", "message": f"this chain was recorded with rows={rows}"}, 400
            )
        cursor = chain[0]["message"]["next-cursor"]
        if p["cursor"] == "*":
            sessions[cursor] = {"chain": p["query"], "pos": 0}
        session = sessions.get(p["cursor"]) if p["cursor"] != "*" else sessions[cursor]
        if session is None or session["chain"] != p["query"]:
            return JSONResponse({"status": "failed", "message": "cursor expired"}, 400)
        pos = session["pos"]
        session["pos"] += 1
        total = sum(len(page["message"]["items"]) for page in chain)
        if pos < len(chain):
            page = json.loads(json.dumps(chain[pos]))
        else:  # past the recordings: the end of the walk, an empty page
            page = json.loads(json.dumps(chain[-1]))
            page["message"]["items"] = []
        page["message"]["total-results"] = total
        return JSONResponse(page)

    @app.get("/pubmed/eutils/esearch.fcgi")
    async def search(request: Request) -> JSONResponse:
        p = dict(request.query_params)
        calls.append({"api": "esearch", "params": p})
        start, size = int(p.get("retstart", 0)), int(p.get("retmax", 20))
        answer = json.loads(json.dumps(esearch))
        result = answer["esearchresult"]
        ids = pmids[start : start + size]
        result.update(count=str(len(pmids)), retstart=str(start), retmax=str(len(ids)), idlist=ids)
        return JSONResponse(answer)

    @app.api_route("/pubmed/eutils/efetch.fcgi", methods=["GET", "POST"])
    async def fetch(request: Request) -> Response:
        p = dict(request.query_params)
        if request.method == "POST":
            from urllib.parse import parse_qsl

            p.update(parse_qsl((await request.body()).decode()))
        calls.append({"api": "efetch", "params": p})
        ids = [i for i in p.get("id", "").split(",") if i]
        body = b"".join(articles[i] for i in ids if i in articles)
        return Response(
            head + b"<PubmedArticleSet>" + body + b"</PubmedArticleSet>\n", media_type="text/xml"
        )

    return app
