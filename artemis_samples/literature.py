"""Sample PubMed E-utilities and Crossref REST servers: synthetic, deterministic
corpora served with the real APIs' parameter names, limits and error shapes.

PubMed: ``esearch.fcgi`` (XML ``eSearchResult`` by default, JSON with ``retmode=json``, as
E-utilities answer; usehistory → WebEnv + QueryKey, a query added to a WebEnv sent back
gets the next key; only the first 9,999 ids of a query are listed: a page crossing that
line comes back clamped with a WarningList "Restrictions achieved" notice, and a
``retstart`` past 9,998 is refused in band, HTTP 200 with an ``ERROR`` (in JSON a string
holding a raw newline, as the live service writes it); mindate/maxdate together with
datetype), ``efetch.fcgi`` (``PubmedArticleSet`` XML with the live DOCTYPE, GET or POST, by
id list or from the history server by WebEnv + query_key with retstart/retmax; errors as
``eFetchResult``/``ERROR``), parameter names read case-insensitively (``webenv`` as
Biopython sends it), 3 requests/s without ``api_key`` and 10 with (429 above).
Crossref: ``/works`` with ``rows`` <= 1000, ``cursor=*`` then ``message.next-cursor`` (one
value for the whole session: the server keeps the position, as the live API does; the
last page is shorter than ``rows``), ``message.total-results``, ``offset`` refused with
``cursor``, ``filter=from-index-date:...,until-index-date:...``, ``X-Rate-Limit-Limit`` /
``X-Rate-Limit-Interval`` headers.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections import deque
from datetime import date, timedelta
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

CORPUS_START = date(2025, 1, 1)
PMID_BASE = 30_000_000
# PubMed's esearch lists the first 9,999 ids of a query at most (retstart <= 9998).
PUBMED_CAP = 9_999
# efetch from the history server: at most 10,000 records a request.
EFETCH_MAX = 10_000

# The prologs E-utilities write, word for word (../shared/fixtures/pubmed/): clients such as
# Biopython's Bio.Entrez read the DTD a document names to parse it (both are among the DTDs
# Biopython ships, so nothing is downloaded).
ESEARCH_PROLOG = (
    '<?xml version="1.0" encoding="UTF-8" ?>\n'
    '<!DOCTYPE eSearchResult PUBLIC "-//NLM//DTD esearch 20060628//EN" '
    '"https://eutils.ncbi.nlm.nih.gov/eutils/dtd/20060628/esearch.dtd">\n'
)
PUBMED_PROLOG = (
    '<?xml version="1.0" ?>\n'
    '<!DOCTYPE PubmedArticleSet PUBLIC "-//NLM//DTD PubMedArticle, 1st January 2025//EN" '
    '"https://dtd.nlm.nih.gov/ncbi/pubmed/out/pubmed_250101.dtd">\n'
)
EFETCH_ERROR_PROLOG = (
    '<?xml version="1.0" encoding="UTF-8" ?>\n'
    '<!DOCTYPE eEfetchResult PUBLIC "-//NLM//DTD efetch 20131226//EN" '
    '"https://eutils.ncbi.nlm.nih.gov/eutils/dtd/20131226/efetch.dtd">\n'
)
# esearch's JSON is its XML mapped by the DTD's rules (lower-cased names), under a header.
ESEARCH_HEADER = {"type": "esearch", "version": "0.3"}
# The datetype values and the field each names in a QueryTranslation.
_DATE_FIELDS = {"edat": "Date - Entry", "pdat": "Date - Publication", "mdat": "Date - Modification"}
# The cap refusal, as the live service words it (a raw newline after "Exception:").
CAP_REFUSAL = (
    "Search Backend failed: Exception:\n'retstart' cannot be larger than 9998. For PubMed, "
    "ESearch can only retrieve the first 9,999 records matching the query. To obtain more "
    "than 9,999 PubMed records, consider using EDirect."
)


def _refusal(kind: str, message: str, headers: dict[str, str], **extra: Any) -> JSONResponse:
    """Crossref's answer to a request it refuses (HTTP 400, a validation failure)."""
    return JSONResponse(
        {
            "status": "failed",
            "message-type": "validation-failure",
            "message": [{"type": kind, "message": message, **extra}],
        },
        400,
        headers=headers,
    )


def _named(params: dict[str, str]) -> dict[str, str]:
    """The parameters by lower-cased name: E-utilities read ``WebEnv`` and ``webenv``
    (Biopython's spelling) alike (``calls`` keep them as they were sent)."""
    return {k.lower(): v for k, v in params.items()}


def _wants_json(params: dict[str, str]) -> bool:
    """E-utilities answer XML unless ``retmode=json`` is asked for."""
    return params.get("retmode", "").lower() == "json"


def _esearch_answer(result: dict[str, Any], as_json: bool) -> Response:
    """One esearch answer, in XML (the default) or JSON; ``result`` holds the JSON names."""
    if as_json:
        return Response(
            json.dumps({"header": ESEARCH_HEADER, "esearchresult": result}, separators=(",", ":")),
            media_type="application/json; charset=UTF-8",
        )
    ids = result.get("idlist", [])
    id_list = (
        "<IdList>\n" + "".join(f"<Id>{i}</Id>\n" for i in ids) + "</IdList>" if ids else "<IdList/>"
    )
    parts = [
        f"<Count>{result['count']}</Count><RetMax>{result['retmax']}</RetMax>"
        f"<RetStart>{result['retstart']}</RetStart>",
    ]
    if "querykey" in result:
        parts.append(
            f"<QueryKey>{result['querykey']}</QueryKey><WebEnv>{escape(result['webenv'])}</WebEnv>"
        )
    parts.append(id_list)
    parts.append(
        "<TranslationSet/>"
        f"<QueryTranslation>{escape(result['querytranslation'])}</QueryTranslation>"
    )
    notes = (result.get("warninglist") or {}).get("outputmessages") or []
    if notes:
        messages = "".join(f"<OutputMessage>{escape(m)}</OutputMessage>" for m in notes)
        parts.append(f"<WarningList>{messages}</WarningList>")
    return _xml(ESEARCH_PROLOG + f"<eSearchResult>{''.join(parts)}</eSearchResult>\n")


def _esearch_error(message: str, as_json: bool) -> Response:
    """esearch refusing in band (HTTP 200): ``ERROR`` in place of the result. In JSON the
    live service leaves a newline in the message raw, so the body is not strict JSON."""
    if as_json:
        text = json.dumps(message).replace("\\n", "\n")
        return Response(
            f'{{"header":{json.dumps(ESEARCH_HEADER, separators=(",", ":"))},'
            f'"esearchresult":{{"ERROR":{text}}}}}',
            media_type="application/json; charset=UTF-8",
        )
    return _xml(
        ESEARCH_PROLOG + f"<eSearchResult><ERROR>{escape(message)}</ERROR></eSearchResult>\n"
    )


def _efetch_error(message: str, status: int = 200) -> Response:
    return _xml(
        EFETCH_ERROR_PROLOG
        + f"<eFetchResult>\n\t<ERROR>{escape(message)}</ERROR>\n</eFetchResult>\n",
        status,
    )


def _xml(body: str, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="text/xml; charset=UTF-8")


def _query_translation(term: str, p: dict[str, str]) -> str:
    out = f'"{term}"[All Fields]' if term else ""
    if "mindate" in p:
        field = _DATE_FIELDS.get(p.get("datetype", "pdat"), "Date - Publication")
        dates = f"{p['mindate']}:{p['maxdate']}[{field}]"
        out = f"{out} AND {dates}" if out else dates
    return out


class LiteratureState:
    def __init__(self) -> None:
        self.pubmed_total = 3000
        self.pubmed_per_day = 30
        self.crossref_total = 3000
        self.crossref_per_day = 30
        self.enforce_rate = True
        self.latency_ms = 0.0
        self.bad_keys: set[str] = set()
        # {"api": "works", "status": 429, "times": 2, "retry_after": "2"}
        self.fault: dict[str, Any] | None = None
        self.sessions: dict[str, dict[str, Any]] = {}
        self.calls: list[dict[str, Any]] = []
        self._recent: dict[str, deque[float]] = {}

    def configure(self, spec: dict[str, Any]) -> None:
        for key in (
            "pubmed_total",
            "pubmed_per_day",
            "crossref_total",
            "crossref_per_day",
            "enforce_rate",
            "latency_ms",
            "fault",
        ):
            if key in spec:
                setattr(self, key, spec[key])
        if "bad_keys" in spec:
            self.bad_keys = set(spec["bad_keys"])
        if spec.get("expire_sessions"):
            self.sessions.clear()
        if spec.get("reset"):
            self.calls.clear()
            self.sessions.clear()
            self._recent.clear()

    async def delay_or_fault(self, api: str) -> JSONResponse | None:
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        f = self.fault
        if f and f.get("api") == api and f.get("times", 0) > 0:
            f["times"] -= 1
            headers = {"Retry-After": str(f["retry_after"])} if f.get("retry_after") else None
            return JSONResponse(
                {"status": "error", "message": "injected failure"},
                status_code=int(f["status"]),
                headers=headers,
            )
        return None

    def over_rate(self, key: str, limit: float) -> bool:
        """A sliding one-second window per key."""
        now = time.monotonic()
        window = self._recent.setdefault(key, deque())
        while window and now - window[0] > 1.0:
            window.popleft()
        window.append(now)
        return self.enforce_rate and len(window) > limit


def _h(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big")


WORDS = (
    "cell",
    "tumour",
    "protein",
    "cohort",
    "signal",
    "genome",
    "trial",
    "neural",
    "immune",
    "therapy",
    "kinase",
    "receptor",
    "model",
    "pathway",
    "dose",
)


def _title(seed: int) -> str:
    return " ".join(WORDS[(seed >> (4 * k)) % len(WORDS)] for k in range(6)).capitalize()


def pubmed_article(i: int, per_day: int) -> dict[str, Any]:
    pmid = PMID_BASE + i
    edat = CORPUS_START + timedelta(days=i // per_day)
    seed = _h("pubmed", i)
    return {
        "pmid": str(pmid),
        "edat": edat,
        "title": _title(seed),
        "journal": f"Journal of {WORDS[seed % len(WORDS)].capitalize()} Research",
        "authors": [(f"Author{seed % 97}", f"A{k}") for k in range(1 + seed % 3)],
        "abstract": f"Synthetic abstract {pmid}.",
        "doi": f"10.5555/pubmed.{pmid}",
    }


def _article_xml(a: dict[str, Any]) -> str:
    authors = "".join(
        f"<Author><LastName>{escape(last)}</LastName><ForeName>{escape(first)}</ForeName></Author>"
        for last, first in a["authors"]
    )
    d = a["edat"]
    return (
        f'<PubmedArticle><MedlineCitation Status="MEDLINE" Owner="NLM">'
        f'<PMID Version="1">{a["pmid"]}</PMID><Article PubModel="Print"><Journal>'
        f"<JournalIssue><PubDate><Year>{d.year}</Year><Month>{d.strftime('%b')}</Month>"
        f"<Day>{d.day:02d}</Day></PubDate></JournalIssue><Title>{escape(a['journal'])}"
        f"</Title></Journal><ArticleTitle>{escape(a['title'])}</ArticleTitle>"
        f'<ELocationID EIdType="doi" ValidYN="Y">{a["doi"]}</ELocationID>'
        f"<Abstract><AbstractText>{escape(a['abstract'])}</AbstractText></Abstract>"
        f"<AuthorList>{authors}</AuthorList></Article></MedlineCitation></PubmedArticle>"
    )


def crossref_item(i: int, per_day: int) -> dict[str, Any]:
    indexed = CORPUS_START + timedelta(days=i // per_day)
    seed = _h("crossref", i)
    return {
        "DOI": f"10.5555/crossref.{i}",
        "title": [_title(seed)],
        "container-title": [f"Proceedings of {WORDS[seed % len(WORDS)].capitalize()}"],
        "author": [{"given": f"G{k}", "family": f"Family{seed % 89}"} for k in range(1 + seed % 3)],
        "published": {"date-parts": [[indexed.year, indexed.month, indexed.day]]},
        "indexed": {"date-parts": [[indexed.year, indexed.month, indexed.day]]},
        "abstract": f"<jats:p>Synthetic abstract {i}.</jats:p>",
        "type": "journal-article",
    }


def _window(total: int, per_day: int, start: date | None, end: date | None) -> range:
    """Indices of corpus items whose day lies in [start, end] (inclusive)."""
    lo = 0 if start is None else max(0, (start - CORPUS_START).days * per_day)
    hi = total if end is None else min(total, ((end - CORPUS_START).days + 1) * per_day)
    return range(lo, max(lo, hi))


def _pubmed_date(value: str) -> date:
    y, m, d = (value.split("/") + ["1", "1"])[:3]
    return date(int(y), int(m), int(d))


def build_router(state: LiteratureState) -> APIRouter:
    router = APIRouter()

    async def params_of(request: Request) -> dict[str, str]:
        params = dict(request.query_params)
        if request.method == "POST":  # application/x-www-form-urlencoded, as NCBI expects
            params.update(parse_qsl((await request.body()).decode()))
        return params

    def pubmed_rate(params: dict[str, str]) -> JSONResponse | None:
        if params.get("api_key") in state.bad_keys:
            return JSONResponse({"error": "API key invalid"}, status_code=401)
        key = params.get("api_key") or "anonymous"
        limit = 10 if params.get("api_key") else 3
        if state.over_rate(f"pubmed:{key}", limit):
            return JSONResponse(
                {
                    "error": "API rate limit exceeded",
                    "api-key": key,
                    "count": str(limit + 1),
                    "limit": str(limit),
                },
                status_code=429,
                headers={"Retry-After": "1"},
            )
        return None

    @router.api_route("/entrez/eutils/esearch.fcgi", methods=["GET", "POST"])
    async def esearch(request: Request) -> Response:
        raw = await params_of(request)
        injected = await state.delay_or_fault("esearch")
        entry = {"api": "esearch", "params": raw, "at": time.time(), "status": 200}
        state.calls.append(entry)
        p = _named(raw)
        refused = injected or pubmed_rate(p)
        if refused:
            entry["status"] = refused.status_code
            return refused
        as_json = _wants_json(p)
        retstart, retmax = int(p.get("retstart", 0)), int(p.get("retmax", 20))
        if ("mindate" in p) != ("maxdate" in p):
            return _esearch_error("mindate and maxdate go together", as_json)
        if "mindate" in p and p.get("datetype", "pdat") not in _DATE_FIELDS:
            return _esearch_error("datetype must be edat|pdat|mdat", as_json)
        term = p.get("term", "")
        start = _pubmed_date(p["mindate"]) if "mindate" in p else None
        end = _pubmed_date(p["maxdate"]) if "maxdate" in p else None
        hits = (
            range(0)
            if term == "nothing"
            else _window(state.pubmed_total, state.pubmed_per_day, start, end)
        )
        if retstart > PUBMED_CAP - 1 and len(hits) > PUBMED_CAP:
            # As the live service does: refused in band (HTTP 200).
            return _esearch_error(CAP_REFUSAL, as_json)
        # Only the first 9,999 ids of a query are listed: a page crossing that line (or a
        # retmax over it) comes back clamped, with a WarningList notice.
        reach = min(len(hits), PUBMED_CAP)
        ids = [str(PMID_BASE + i) for i in hits[retstart : min(retstart + retmax, reach)]]
        webenv = p.get("webenv")
        if webenv and webenv not in state.sessions:
            # An expired history server session.
            return _esearch_error(
                f"Unable to find WebEnv {webenv}: the session has expired", as_json
            )
        # In the live answer's order: count, retmax, retstart, querykey, webenv, idlist,
        # translationset, querytranslation, warninglist.
        result: dict[str, Any] = {
            "count": str(len(hits)),
            "retmax": str(len(ids)),
            "retstart": str(retstart),
        }
        if p.get("usehistory") == "y":
            # The query joins the WebEnv sent (under the next query key) or a new one.
            webenv = webenv or f"MCID_{_h(term, start, end, time.time()):x}"
            queries = state.sessions.setdefault(webenv, {"queries": {}})["queries"]
            key = str(len(queries) + 1)
            queries[key] = (hits.start, hits.stop)
            result.update(querykey=key, webenv=webenv)
        result.update(idlist=ids, translationset=[], querytranslation=_query_translation(term, p))
        if retstart + retmax > reach and len(hits) > reach:
            result["warninglist"] = {
                "phrasesignored": [],
                "quotedphrasesnotfound": [],
                "outputmessages": [
                    f"Restrictions achieved. start and count adjusted to {retstart}, {len(ids)}"
                ],
            }
        return _esearch_answer(result, as_json)

    @router.api_route("/entrez/eutils/efetch.fcgi", methods=["GET", "POST"])
    async def efetch(request: Request) -> Response:
        raw = await params_of(request)
        entry = {
            "api": "efetch",
            "method": request.method,
            "params": raw,
            "at": time.time(),
            "status": 200,
        }
        state.calls.append(entry)
        p = _named(raw)
        limited = pubmed_rate(p)
        if limited:
            entry["status"] = limited.status_code
            return limited
        if "id" in p:
            ids = [int(x) - PMID_BASE for x in p["id"].split(",") if x.strip()]
            if request.method == "GET" and len(ids) > 200:
                return _efetch_error(
                    "Request-URI Too Long: send more than 200 ids by POST", status=414
                )
        elif "webenv" in p:
            # From the history server: the query ``query_key`` of the session ``WebEnv``.
            start = int(p.get("retstart", 0))
            n = min(int(p.get("retmax", 20)), EFETCH_MAX)
            session = state.sessions.get(p["webenv"])
            query = (session or {}).get("queries", {}).get(p.get("query_key", ""))
            if query is None:
                return _efetch_error(
                    f"Cannot retrieve history data. query_key: {p.get('query_key', '')}, "
                    f"WebEnv: {p['webenv']}, retstart: {start}, retmax: {n}"
                )
            ids = list(range(*query))[start : start + n]
        else:
            return _efetch_error("Empty id list - nothing todo", status=400)
        body = "".join(
            _article_xml(pubmed_article(i, state.pubmed_per_day))
            for i in ids
            if 0 <= i < state.pubmed_total
        )
        return _xml(f"{PUBMED_PROLOG}<PubmedArticleSet>\n{body}</PubmedArticleSet>")

    @router.get("/works")
    async def works(request: Request) -> JSONResponse:
        response = await _works(request)
        request.state.call["status"] = response.status_code
        return response

    async def _works(request: Request) -> JSONResponse:
        p = dict(request.query_params)
        injected = await state.delay_or_fault("works")
        entry = {
            "api": "works",
            "params": p,
            "at": time.time(),
            "status": injected.status_code if injected else 200,
        }
        request.state.call = entry
        state.calls.append(entry)
        if injected:
            return injected
        headers = {"X-Rate-Limit-Limit": "50", "X-Rate-Limit-Interval": "1s"}
        if state.over_rate("crossref", 50):
            return JSONResponse(
                {"status": "error", "message": "rate limit"},
                429,
                headers={**headers, "Retry-After": "1"},
            )
        rows = int(p.get("rows", 20))
        if rows > 1000:
            return _refusal(
                "integer-not-valid",
                "Integer specified as row must be less than or equal to 1000",
                headers,
                value=rows,
            )
        if "cursor" in p and "offset" in p:
            return _refusal("cursor-with-offset", "offset cannot be combined with cursor", headers)
        start = end = None
        for part in filter(None, (p.get("filter") or "").split(",")):
            name, _, value = part.partition(":")
            if name == "from-index-date":
                start = date.fromisoformat(value)
            elif name == "until-index-date":
                end = date.fromisoformat(value)
            else:
                return _refusal("filter-not-available", f"filter {name} is not available", headers)
        hits = (
            range(0)
            if p.get("query") == "nothing"
            else _window(state.crossref_total, state.crossref_per_day, start, end)
        )
        query_key = f"{p.get('query')}|{start}|{end}"
        cursors: dict[str, dict[str, Any]] = state.sessions.setdefault("crossref-cursors", {})
        if "cursor" in p:
            # As the live API does: one cursor value for the whole session (the server keeps
            # the position), so the same cursor sent again gets the *next* page.
            if p["cursor"] == "*":
                cursor = base64.urlsafe_b64encode(
                    hashlib.sha256(f"{query_key}|{time.time_ns()}".encode()).digest() * 3
                ).decode()
                cursors[cursor] = {"q": query_key, "pos": 0}
            else:
                cursor = p["cursor"]
            session = cursors.get(cursor)
            if session is None or session["q"] != query_key:
                return _refusal("cursor-expired", "cursor is invalid or expired", headers)
            pos = session["pos"]
            session["pos"] = min(len(hits), pos + rows)
        else:
            pos = int(p.get("offset", 0))
            if pos > 10_000:
                return _refusal("offset-too-large", "offset must be <= 10000", headers)
        page = hits[pos : pos + rows]
        message: dict[str, Any] = {
            "facets": {},
            "total-results": len(hits),
            "items": [crossref_item(i, state.crossref_per_day) for i in page],
            "items-per-page": rows,
            "query": {"start-index": pos, "search-terms": p.get("query")},
        }
        if "cursor" in p:
            message["next-cursor"] = cursor
            message["query"]["start-index"] = 0  # as the live API reports cursor pages
        return JSONResponse(
            {
                "status": "ok",
                "message-type": "work-list",
                "message-version": "1.0.0",
                "message": message,
            },
            headers=headers,
        )

    @router.post("/_control/literature")
    async def control(request: Request) -> dict[str, Any]:
        spec = await request.json()
        state.configure(spec)
        if spec.get("expire_cursors"):
            state.sessions.pop("crossref-cursors", None)
        return {"ok": True}

    @router.get("/_literature/calls")
    async def calls() -> list[dict[str, Any]]:
        return state.calls

    return router
