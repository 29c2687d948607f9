"""Records of every literature source normalised to one shape:
``{"provenance", "id", "doi", "title", "journal", "published", "authors", "abstract"}``
(PubMed ``id`` = PMID, Crossref ``id`` = DOI)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from artemis.errors import ArtemisError, ErrorCode
from artemis.http import excerpt

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
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"pubmed efetch: the answer is not XML ({e}): {excerpt(body)!r}",
        ) from None
    if root.tag == "eFetchResult" or root.find("ERROR") is not None:
        raise ArtemisError(
            ErrorCode.SOURCE_ERROR,
            f"pubmed efetch error: {_text(root.find('ERROR')) or _text(root)}",
        )
    if root.tag != "PubmedArticleSet":
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"pubmed efetch: expected a PubmedArticleSet, got <{root.tag}>",
        )
    records = []
    for art in root:
        if art.tag == "PubmedArticle":
            records.append(_pubmed_article(art, provenance))
        elif art.tag == "PubmedBookArticle":
            records.append(_pubmed_book(art, provenance))
        else:
            # Anything else in a PubmedArticleSet is a shape the contract does not name:
            # never a record skipped in silence.
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"pubmed efetch: unexpected <{art.tag}> in PubmedArticleSet "
                "(expected PubmedArticle or PubmedBookArticle)",
            )
    return records


def _pmid(elem: ET.Element | None, where: str) -> str:
    pmid = _text(elem.find("PMID")) if elem is not None else None
    if not pmid:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT, f"pubmed efetch: a {where} without {where}/PMID"
        )
    return pmid


def _pub_date(pub: ET.Element | None) -> str | None:
    if pub is None:
        return None
    published = _date(_text(pub.find("Year")), _text(pub.find("Month")), _text(pub.find("Day")))
    if published is None:
        medline = _text(pub.find("MedlineDate"))
        published = medline[:4] if medline and medline[:4].isdigit() else None
    return published


def _authors(parent: ET.Element | None) -> list[str]:
    authors = []
    for a in parent.findall("AuthorList/Author") if parent is not None else []:
        parts_ = [x for x in (_text(a.find("ForeName")), _text(a.find("LastName"))) if x]
        name = " ".join(parts_) if parts_ else _text(a.find("CollectiveName"))
        if name:
            authors.append(name)
    return authors


def _abstract(parent: ET.Element | None) -> str | None:
    parts = []
    for t in parent.findall("Abstract/AbstractText") if parent is not None else []:
        text = _text(t)
        if text:
            label = t.get("Label")
            parts.append(f"{label}: {text}" if label else text)
    return " ".join(parts) or None


def _doi(art: ET.Element, article: ET.Element | None) -> str | None:
    for loc in article.findall("ELocationID") if article is not None else []:
        if loc.get("EIdType") == "doi":
            return _text(loc)
    # The record's own ids only (references inside it list other articles' DOIs).
    for path in ("PubmedData/ArticleIdList/ArticleId", "PubmedBookData/ArticleIdList/ArticleId"):
        for aid in art.findall(path):
            if aid.get("IdType") == "doi":
                return _text(aid)
    return None


def _pubmed_article(art: ET.Element, provenance: str) -> dict[str, Any]:
    cit = art.find("MedlineCitation")
    pmid = _pmid(cit, "MedlineCitation")
    assert cit is not None
    article = cit.find("Article")
    journal = article.find("Journal") if article is not None else None
    doi = _doi(art, article)
    return {
        "provenance": provenance,
        "id": pmid,
        "doi": doi.lower() if doi else None,
        "title": _text(article.find("ArticleTitle")) if article is not None else None,
        "journal": _text(journal.find("Title")) if journal is not None else None,
        "published": _pub_date(
            journal.find("JournalIssue/PubDate") if journal is not None else None
        ),
        "authors": _authors(article),
        "abstract": _abstract(article),
    }


def _pubmed_book(art: ET.Element, provenance: str) -> dict[str, Any]:
    """A book or book chapter (NCBI Bookshelf): esearch lists it like an article."""
    doc = art.find("BookDocument")
    pmid = _pmid(doc, "BookDocument")
    assert doc is not None
    book = doc.find("Book")
    doi = _doi(art, None)
    title = _text(doc.find("ArticleTitle")) or (
        _text(book.find("BookTitle")) if book is not None else None
    )
    return {
        "provenance": provenance,
        "id": pmid,
        "doi": doi.lower() if doi else None,
        "title": title,
        "journal": _text(book.find("Publisher/PublisherName")) if book is not None else None,
        "published": _pub_date(book.find("PubDate") if book is not None else None),
        "authors": _authors(doc) or _authors(book),
        "abstract": _abstract(doc),
    }


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
