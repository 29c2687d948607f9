"""The bundled sample servers held to the APIs they stand for and, where a real recording
exists, to the live API's own answers in ``../shared/fixtures/``: a sample written by the
same hand as the client must not be able to drift into agreeing with the client's
mistakes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import httpx
import pytest
from Bio import Entrez

from artemis.literature.normalize import parse_pubmed_xml
from artemis_samples.app import create_app
from artemis_samples.platform import note_ids
from artemis_samples.server import ThreadedServer

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
needs_recordings = pytest.mark.skipif(not FIXTURES.exists(), reason="no ../shared/fixtures")


@pytest.fixture(scope="module")
def server():
    s = ThreadedServer(create_app()).start()
    yield s
    s.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        c.post("/_control/reset", json={})
        c.post("/_control/literature", json={"enforce_rate": False})
        yield c


def _recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def _prolog(body: bytes) -> list[bytes]:
    """The XML declaration and the DOCTYPE: the first two lines, as E-utilities write them."""
    return body.split(b"\n")[:2]


def _paths(elem: ET.Element, prefix: str = "") -> set[str]:
    here = f"{prefix}/{elem.tag}"
    out = {here}
    for child in elem:
        out |= _paths(child, here)
    return out


# -- quotes -----------------------------------------------------------------------------


def test_quotes_answer_the_spec_shape_with_next_page_null_on_the_last_page(http):
    q = {"symbol": "AAPL", "start": "2025-11-01", "end": "2025-11-30", "page_size": 20}
    first = http.get("/quotes", params={**q, "page": 1}).json()
    last = http.get("/quotes", params={**q, "page": 2}).json()
    assert set(first) == set(last) == {"symbol", "items", "page", "next_page"}
    assert first["symbol"] == "AAPL" and first["page"] == 1 and first["next_page"] == 2
    assert last["next_page"] is None and len(first["items"]) + len(last["items"]) == 30
    item_keys = {"symbol", "date", "open", "high", "low", "close", "volume"}
    assert all(set(i) == item_keys for i in first["items"] + last["items"])
    assert http.get("/quotes", params={**q, "start": "2025-13-01"}).status_code == 400


# -- the notes platform --------------------------------------------------------------------


def test_platform_answers_the_spec_shape(http):
    cookie = {"Cookie": "web_session=sample-conformance"}
    http.post("/_control/platform", json={"notes_per_keyword": 12})
    pages, page = [], 1
    while page is not None:
        body = http.get(
            "/platform/search",
            params={"keyword": "k", "page": page, "page_size": 5},
            headers=cookie,
        ).json()
        assert set(body) == {"items", "next_page"}
        assert all({"note_id", "note_url"} <= set(i) for i in body["items"])
        pages.append(body)
        page = body["next_page"]
        assert page is None or isinstance(page, int)
    assert [len(p["items"]) for p in pages] == [5, 5, 2]
    note_id = pages[0]["items"][0]["note_id"]
    note = http.get(f"/platform/notes/{note_id}", headers=cookie).json()
    assert {"note_id", "title", "content", "author", "liked_count", "published_at"} <= set(note)
    assert http.get(f"/platform/notes/{note_id}").status_code == 401  # no cookie
    assert http.get("/platform/notes/nosuchnote", headers=cookie).status_code == 404
    http.post("/_control/platform", json={"rate_per_s": 1})
    codes = [http.get(f"/platform/notes/{i}", headers=cookie) for i in note_ids("k", 3)]
    limited = [r for r in codes if r.status_code == 429]
    assert limited and all(r.headers.get("retry-after") for r in limited)


# -- Crossref (held to the recordings) -------------------------------------------------


@needs_recordings
def test_crossref_cursor_walk_has_the_live_shape_one_cursor_and_a_short_last_page(http):
    recorded = [_recorded(f"crossref/works_query-widget_cursor_page{i}.json") for i in (1, 2, 3)]
    real_message_keys = set().union(*(set(p["message"]) for p in recorded))
    real_item_keys = set().union(*(set(i) for p in recorded for i in p["message"]["items"]))
    q = {
        "query": "shape",
        "rows": 400,
        "filter": "from-index-date:2025-01-01,until-index-date:2025-01-30",
    }
    pages = [http.get("/works", params={**q, "cursor": "*"})]
    while len(pages[-1].json()["message"]["items"]) == 400:
        cursor = pages[-1].json()["message"]["next-cursor"]
        pages.append(http.get("/works", params={**q, "cursor": cursor}))
    bodies = [p.json() for p in pages]
    for body, resp in zip(bodies, pages, strict=True):
        assert set(body) == set(recorded[0])  # status, message-type, message-version, message
        assert body["message-type"] == recorded[0]["message-type"] == "work-list"
        assert set(body["message"]) <= real_message_keys, set(body["message"]) - real_message_keys
        assert all(set(i) <= real_item_keys for i in body["message"]["items"])
        assert isinstance(body["message"]["total-results"], int)
        assert resp.headers["x-rate-limit-limit"] and resp.headers["x-rate-limit-interval"]
    # as recorded: one cursor value for the whole session, and the end is a short page
    assert len({b["message"]["next-cursor"] for b in bodies}) == 1
    assert [len(b["message"]["items"]) for b in bodies] == [400, 400, 100]
    assert bodies[0]["message"]["total-results"] == 900
    # the same cursor sent again is the session's next page (nothing left: empty)
    again = http.get("/works", params={**q, "cursor": bodies[0]["message"]["next-cursor"]})
    assert again.json()["message"]["items"] == []
    assert http.get("/works", params={**q, "rows": 1001}).status_code == 400
    assert http.get("/works", params={**q, "cursor": "*", "offset": 5}).status_code == 400


# -- PubMed (held to the recordings) ------------------------------------------------------


@needs_recordings
def test_pubmed_esearch_and_efetch_have_the_live_shape(http):
    real = _recorded("pubmed/esearch_eutils-mcp-server_science-breast-cancer_usehistory.json")
    body = http.get(
        "/entrez/eutils/esearch.fcgi",
        params={
            "db": "pubmed",
            "term": "shape",
            "retmode": "json",
            "usehistory": "y",
            "retmax": 3,
            "mindate": "2025/01/01",
            "maxdate": "2025/01/02",
            "datetype": "edat",
        },
    ).json()
    assert body["header"] == real["header"]
    result, real_result = body["esearchresult"], real["esearchresult"]
    assert set(result) <= set(real_result), set(result) - set(real_result)
    for key in ("count", "retmax", "retstart", "webenv", "querykey"):
        assert isinstance(result[key], str) == isinstance(real_result[key], str), key
    assert result["count"].isdigit() and all(i.isdigit() for i in result["idlist"])
    ids = result["idlist"]
    xml = http.get(
        "/entrez/eutils/efetch.fcgi", params={"db": "pubmed", "retmode": "xml", "id": ",".join(ids)}
    ).content
    recorded = sorted((FIXTURES / "pubmed").glob("efetch_*.xml"))
    real_roots = [ET.fromstring(f.read_bytes()) for f in recorded]
    real_paths = set().union(*(_paths(r) for r in real_roots))
    sample_root = ET.fromstring(xml)
    sample_paths = _paths(sample_root)
    assert sample_paths <= real_paths, sorted(sample_paths - real_paths)
    # months as the live service writes them in PubDate ("Jun", "Nov")
    real_months = {m.text for r in real_roots for m in r.iterfind(".//PubDate/Month") if m.text}
    sample_months = {m.text for m in sample_root.iterfind(".//PubDate/Month") if m.text is not None}
    assert real_months and all(m.isalpha() for m in real_months)
    assert sample_months and all(m.isalpha() for m in sample_months)
    sample_records = parse_pubmed_xml(xml)
    real_records = parse_pubmed_xml(recorded[0].read_bytes())
    assert [r["id"] for r in sample_records] == ids
    assert {k for r in sample_records for k, v in r.items() if v} <= set(real_records[0])


@needs_recordings
def test_pubmed_esearch_answers_xml_unless_json_is_asked_for_in_the_live_shape(http):
    """E-utilities answer esearch in XML by default; the sample's XML has the recorded
    prolog, the elements in the recorded order and the ids one a line, as recorded."""
    window = {"mindate": "2025/01/01", "maxdate": "2025/01/02", "datetype": "edat"}
    plain_file = FIXTURES / "pubmed/esearch_biopython_term-biopython.xml"
    history_file = FIXTURES / "pubmed/esearch_biopython_term-cancer_reldate60_usehistory.xml"
    for recorded, extra in ((plain_file, {}), (history_file, {"usehistory": "y"})):
        resp = http.get(
            "/entrez/eutils/esearch.fcgi",
            params={"db": "pubmed", "term": "shape", "retmax": 3, **window, **extra},
        )
        assert resp.headers["content-type"].startswith("text/xml")
        real = recorded.read_bytes()
        assert _prolog(resp.content) == _prolog(real)
        root, real_root = ET.fromstring(resp.content), ET.fromstring(real)
        assert root.tag == real_root.tag == "eSearchResult"
        assert [e.tag for e in root] == [e.tag for e in real_root]
        assert _paths(root) <= _paths(real_root)
        assert b"<IdList>\n<Id>" in resp.content and b"</Id>\n</IdList>" in real
        assert root.findtext("Count") == "60" and root.findtext("RetMax") == "3"
    # the same search with retmode=json: JSON, its keys in the recorded answer's order
    real_json = _recorded("pubmed/esearch_eutils-mcp-server_science-breast-cancer_usehistory.json")
    resp = http.get(
        "/entrez/eutils/esearch.fcgi",
        params={"db": "pubmed", "term": "shape", "retmax": 3, "retmode": "json", **window},
    )
    assert resp.headers["content-type"].startswith("application/json")
    result = resp.json()["esearchresult"]
    assert list(result) == [k for k in real_json["esearchresult"] if k in result]
    assert [e.text for e in root.iter("Id")] == result["idlist"]
    # an in-band refusal is an ERROR in place of the result, in either format
    half = {"db": "pubmed", "term": "shape", "mindate": "2025/01/01"}
    refused = ET.fromstring(http.get("/entrez/eutils/esearch.fcgi", params=half).content)
    assert [e.tag for e in refused] == ["ERROR"]
    as_json = http.get("/entrez/eutils/esearch.fcgi", params={**half, "retmode": "json"})
    assert set(as_json.json()["esearchresult"]) == {"ERROR"}


@needs_recordings
def test_pubmed_efetch_carries_the_live_doctype(http):
    real = (FIXTURES / "pubmed/efetch_biopython_pmid-11748933-11700088.xml").read_bytes()
    resp = http.get("/entrez/eutils/efetch.fcgi", params={"db": "pubmed", "id": "30000001"})
    assert resp.headers["content-type"].startswith("text/xml")
    assert _prolog(resp.content) == _prolog(real)
    lines, real_lines = resp.content.split(b"\n"), real.split(b"\n")
    assert lines[2] == real_lines[2] == b"<PubmedArticleSet>"
    assert lines[3].startswith(b"<PubmedArticle>") and real_lines[3].startswith(b"<PubmedArticle>")
    # a history fetch from an unknown session: eFetchResult/ERROR, as the live service says
    gone = http.get(
        "/entrez/eutils/efetch.fcgi",
        params={"db": "pubmed", "WebEnv": "MCID_gone", "query_key": "1"},
    )
    assert gone.status_code == 200
    error = ET.fromstring(gone.content)
    assert error.tag == "eFetchResult" and [e.tag for e in error] == ["ERROR"]
    assert "Cannot retrieve history data" in (error.findtext("ERROR") or "")


# -- PubMed through a real client: Biopython's Bio.Entrez ---------------------------------

NCBI_HOST = "eutils.ncbi.nlm.nih.gov"


class _ToSample(urllib.request.BaseHandler):
    """Bio.Entrez has E-utilities' address written into each call: its requests to that
    host go to the sample instead, and any other request (a DTD Biopython would download
    because it does not ship it) is refused, so the test never leaves the machine."""

    handler_order = 100  # before the HTTP(S) handlers' own preparation of the request

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def https_request(self, request: urllib.request.Request) -> urllib.request.Request:
        if request.host != NCBI_HOST:
            raise urllib.error.URLError(f"offline test: no request to {request.full_url}")
        request.full_url = self.base_url + request.selector
        return request

    http_request = https_request


@pytest.fixture
def entrez(server, http, monkeypatch):
    monkeypatch.setattr(Entrez, "email", "conformance@example.org")
    monkeypatch.setattr(Entrez, "max_tries", 1)  # a failure is the sample's: no retry
    urllib.request.install_opener(
        urllib.request.build_opener(urllib.request.ProxyHandler({}), _ToSample(server.url))
    )
    try:
        yield Entrez
    finally:
        urllib.request.install_opener(None)


def _pmids(articles: dict[str, Any]) -> list[str]:
    return [str(a["MedlineCitation"]["PMID"]) for a in articles["PubmedArticle"]]


def test_biopython_entrez_searches_and_fetches_from_the_sample_pubmed(entrez, http):
    """The calls of Biopython's tutorial, unchanged, against the sample: esearch without
    retmode (XML), efetch by ids (GET, and POST above 200 ids), a history session
    (usehistory=y, then efetch by WebEnv + query_key); Entrez.read parses each answer
    with the DTD its DOCTYPE names, from the DTDs Biopython ships."""
    window = {"mindate": "2025/01/01", "maxdate": "2025/01/10", "datetype": "edat"}
    with entrez.esearch(db="pubmed", term="biopython", retmax=250, **window) as handle:
        found = entrez.read(handle)
    assert (found["Count"], found["RetMax"], found["RetStart"]) == ("300", "250", "0")
    ids = list(found["IdList"])
    assert len(ids) == len(set(ids)) == 250
    assert found["QueryTranslation"].endswith("2025/01/01:2025/01/10[Date - Entry]")

    with entrez.efetch(db="pubmed", id=ids[:5], retmode="xml") as handle:
        articles = entrez.read(handle)
    assert _pmids(articles) == ids[:5]
    article = articles["PubmedArticle"][0]["MedlineCitation"]["Article"]
    assert article["ArticleTitle"] and article["Journal"]["Title"]
    assert article["AuthorList"][0]["LastName"]
    with entrez.efetch(db="pubmed", id=",".join(ids), rettype="abstract") as handle:
        assert _pmids(entrez.read(handle)) == ids  # 250 ids: Biopython sends them by POST

    with entrez.esearch(
        db="pubmed", term="biopython", usehistory="y", retmax=0, **window
    ) as handle:
        session = entrez.read(handle)
    assert session["Count"] == "300" and session["IdList"] == []
    assert session["WebEnv"] and session["QueryKey"] == "1"
    fetched: list[str] = []
    for start in range(0, 300, 120):  # the tutorial's batch loop over the history server
        with entrez.efetch(
            db="pubmed",
            retmode="xml",
            retstart=start,
            retmax=120,
            webenv=session["WebEnv"],
            query_key=session["QueryKey"],
        ) as handle:
            fetched += _pmids(entrez.read(handle))
    assert fetched[:250] == ids and len(fetched) == len(set(fetched)) == 300

    # an in-band refusal is read as Biopython reads E-utilities' own: a RuntimeError
    with entrez.esearch(db="pubmed", term="biopython", mindate="2025/01/01") as handle:
        with pytest.raises(RuntimeError, match="mindate and maxdate go together"):
            entrez.read(handle)

    # retmode=json still answers JSON
    with entrez.esearch(
        db="pubmed", term="biopython", retmode="json", retmax=3, **window
    ) as handle:
        assert json.load(handle)["esearchresult"]["idlist"] == ids[:3]

    calls = http.get("/_literature/calls").json()
    assert [c["api"] for c in calls] == ["esearch", "efetch", "efetch", "esearch"] + [
        "efetch"
    ] * 3 + ["esearch", "esearch"]
    assert all(c["params"]["tool"] == "biopython" for c in calls)
    assert "retmode" not in calls[0]["params"]  # XML without asking for it
    assert [c["method"] for c in calls if c["api"] == "efetch"] == ["GET", "POST"] + ["GET"] * 3
    assert calls[4]["params"]["webenv"] == session["WebEnv"]  # as Biopython spells it
