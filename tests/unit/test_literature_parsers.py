"""The literature parsers on real recorded responses (../shared/fixtures, skipped when absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artemis.errors import ArtemisError, ErrorCode
from artemis.literature.normalize import normalize_crossref, parse_pubmed_xml

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared/fixtures absent")
KEYS = {"provenance", "id", "doi", "title", "journal", "published", "authors", "abstract"}


@needs_fixtures
def test_pubmed_efetch_record_is_normalised():
    records = parse_pubmed_xml((FIXTURES / "pubmed/efetch_eutils_pmid-23121403.xml").read_bytes())
    assert len(records) == 1
    r = records[0]
    assert set(r) == KEYS
    assert r["provenance"] == "pubmed" and r["id"] == "23121403"
    assert r["doi"] == "10.1056/nejmoa1210384"
    assert r["title"] == "Low-dose aspirin for preventing recurrent venous thromboembolism."
    assert r["journal"] == "The New England journal of medicine"
    assert r["published"] == "2012-11-22"
    assert r["authors"] and r["abstract"].startswith("BACKGROUND: Patients who have had")


@needs_fixtures
@pytest.mark.parametrize(
    "name, count",
    [
        ("efetch_biopython_pmid-11748933-11700088.xml", 2),
        ("efetch_fastpaper_pmid-41884867-41884779-41884685.xml", 3),
        ("efetch_biopython_pmid-12091962-9997_rettype-abstract.xml", 2),
    ],
)
def test_pubmed_efetch_sets(name, count):
    records = parse_pubmed_xml((FIXTURES / "pubmed" / name).read_bytes())
    assert len(records) == count
    for r in records:
        assert set(r) == KEYS and r["id"].isdigit() and r["title"]


@needs_fixtures
def test_crossref_works_pages_are_normalised():
    page = json.loads(
        (FIXTURES / "crossref/works_query-ecology_rows30_cursor_page1.json").read_text()
    )
    items = page["message"]["items"]
    records = [normalize_crossref(i) for i in items]
    assert len(records) == len(items) == 30
    for r, item in zip(records, items, strict=True):
        assert set(r) == KEYS and r["provenance"] == "crossref"
        assert r["id"] == r["doi"] == item["DOI"].lower()
    assert page["message"]["next-cursor"]
    single = json.loads((FIXTURES / "crossref/work_10.1371_journal.pone.0033693.json").read_text())
    r = normalize_crossref(single["message"])
    assert r["doi"] == "10.1371/journal.pone.0033693" and r["title"] and r["published"]


def test_malformed_inputs_name_the_problem():
    with pytest.raises(ArtemisError, match="not XML") as bad:
        parse_pubmed_xml(b"<PubmedArticleSet><PubmedArticle>")
    assert bad.value.code == ErrorCode.SOURCE_CONTRACT and not bad.value.retryable
    assert "<PubmedArticleSet><PubmedArticle>" in bad.value.message  # a snippet of the body
    with pytest.raises(ArtemisError, match="without DOI"):
        normalize_crossref({"title": ["x"]})


def test_book_articles_are_records_and_unknown_elements_are_contract_errors():
    book = (
        b"<PubmedArticleSet><PubmedBookArticle><BookDocument><PMID>20301295</PMID>"
        b"<ArticleIdList><ArticleId IdType='bookaccession'>NBK1116</ArticleId></ArticleIdList>"
        b"<Book><Publisher><PublisherName>University of Washington</PublisherName></Publisher>"
        b"<BookTitle>GeneReviews</BookTitle><PubDate><Year>1993</Year></PubDate></Book>"
        b"<ArticleTitle>Alpha-Thalassemia</ArticleTitle><Abstract><AbstractText>A text."
        b"</AbstractText></Abstract></BookDocument><PubmedBookData><ArticleIdList>"
        b"<ArticleId IdType='doi'>10.1000/Book.1</ArticleId></ArticleIdList></PubmedBookData>"
        b"</PubmedBookArticle></PubmedArticleSet>"
    )
    (rec,) = parse_pubmed_xml(book)
    assert rec["id"] == "20301295" and rec["title"] == "Alpha-Thalassemia"
    assert rec["journal"] == "University of Washington" and rec["published"] == "1993"
    assert rec["doi"] == "10.1000/book.1" and rec["abstract"] == "A text."
    for bad, where in (
        (b"<PubmedArticleSet><Surprise/></PubmedArticleSet>", "Surprise"),
        (
            b"<PubmedArticleSet><PubmedArticle><MedlineCitation/></PubmedArticle>"
            b"</PubmedArticleSet>",
            "PMID",
        ),
        (b"<PubmedArticleSet><PubmedArticle/></PubmedArticleSet>", "PMID"),
    ):
        with pytest.raises(ArtemisError) as e:
            parse_pubmed_xml(bad)
        assert e.value.code == ErrorCode.SOURCE_CONTRACT and where in e.value.message
