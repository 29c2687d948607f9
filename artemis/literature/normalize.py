"""Records of every literature source normalised to one shape:
``{"provenance", "id", "doi", "title", "journal", "published", "authors", "abstract"}``
(PubMed ``id`` = PMID, Crossref ``id`` = DOI)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from artemis.errors import ArtemisError, ErrorCode

_MONTHS = {
    m: i
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
    )
}
_TAGS = re.compile(r"<[^>]+>")
_SPACES = re.compile(r"\s+")


def _text(el: ET.Element | None) -> str | None:
    if el is None:
        return None
    text = _SPACES.sub(" ", "".join(el.itertext())).strip()
    return text or None


def _month(value: str | None) -> int | None:
    if not value:
        return None
    if value.isdigit():
        return int(value)
    return _MONTHS.get(value[:3].lower())


def _date(
    year: str | None, month: str | int | None = None, day: str | int | None = None
) -> str | None:
    if not year or not str(year)[:4].isdigit():
        return None
    out = str(year)[:4]
    m = _month(str(month)) if month is not None else None
    if m:
        out += f"-{m:02d}"
        if day and str(day).isdigit():
            out += f"-{int(day):02d}"
    return out


def parse_pubmed_xml(body: bytes | str, provenance: str = "pubmed") -> list[dict[str, Any]]:
    """efetch ``PubmedArticleSet`` XML → normalised records."""
    try:
        root = ET.fromstring(body.encode() if isinstance(body, str) else body)
    except ET.ParseError as e:
        snippet = (body if isinstance(body, str) else body[:200].decode("utf-8", "replace"))[:200]
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT, f"pubmed efetch: the answer is not XML ({e}): {snippet!r}"
        ) from None
    if root.tag == "eFetchResult" or root.find("ERROR") is not None:
        raise ArtemisError(
            ErrorCode.SOURCE_ERROR,
            f"pubmed efetch error: {_text(root.find('ERROR')) or _text(root)}",
        )
    records = []
    for art in root.iter("PubmedArticle"):
        cit = art.find("MedlineCitation")
        if cit is None:
            continue
        pmid = _text(cit.find("PMID"))
        article = cit.find("Article")
        journal = article.find("Journal") if article is not None else None
        pub = journal.find("JournalIssue/PubDate") if journal is not None else None
        published = None
        if pub is not None:
            published = _date(
                _text(pub.find("Year")), _text(pub.find("Month")), _text(pub.find("Day"))
            )
            if published is None:
                medline = _text(pub.find("MedlineDate"))
                published = medline[:4] if medline and medline[:4].isdigit() else None
        authors = []
        for a in article.findall("AuthorList/Author") if article is not None else []:
            parts_ = [x for x in (_text(a.find("ForeName")), _text(a.find("LastName"))) if x]
            name = " ".join(parts_) if parts_ else _text(a.find("CollectiveName"))
            if name:
                authors.append(name)
        parts = []
        for t in article.findall("Abstract/AbstractText") if article is not None else []:
            text = _text(t)
            if text:
                label = t.get("Label")
                parts.append(f"{label}: {text}" if label else text)
        doi = None
        for loc in article.findall("ELocationID") if article is not None else []:
            if loc.get("EIdType") == "doi":
                doi = _text(loc)
        if doi is None:
            for aid in art.findall("PubmedData/ArticleIdList/ArticleId"):
                if aid.get("IdType") == "doi":
                    doi = _text(aid)
        records.append(
            {
                "provenance": provenance,
                "id": pmid,
                "doi": doi.lower() if doi else None,
                "title": _text(article.find("ArticleTitle")) if article is not None else None,
                "journal": _text(journal.find("Title")) if journal is not None else None,
                "published": published,
                "authors": authors,
                "abstract": " ".join(parts) or None,
            }
        )
    return records


def _crossref_date(item: dict[str, Any]) -> str | None:
    for key in ("published", "published-print", "published-online", "issued", "created"):
        parts = ((item.get(key) or {}).get("date-parts") or [[None]])[0]
        if parts and parts[0]:
            return _date(
                str(parts[0]),
                parts[1] if len(parts) > 1 else None,
                parts[2] if len(parts) > 2 else None,
            )
    return None


def normalize_crossref(item: dict[str, Any], provenance: str = "crossref") -> dict[str, Any]:
    """One Crossref ``/works`` item → a normalised record."""
    doi = item.get("DOI")
    if not doi:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"crossref item without DOI (expected a string at '$.DOI'): {str(item)[:120]!r}",
        )
    authors = []
    for a in item.get("author") or []:
        name = " ".join(x for x in (a.get("given"), a.get("family")) if x) or a.get("name")
        if name:
            authors.append(name)
    abstract = item.get("abstract")
    if abstract:
        abstract = _SPACES.sub(" ", _TAGS.sub(" ", abstract)).strip() or None
    title = (item.get("title") or [None])[0]
    journal = (item.get("container-title") or [None])[0]
    return {
        "provenance": provenance,
        "id": doi.lower(),
        "doi": doi.lower(),
        "title": _SPACES.sub(" ", title).strip() if title else None,
        "journal": journal,
        "published": _crossref_date(item),
        "authors": authors,
        "abstract": abstract,
    }
