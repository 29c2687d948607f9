"""An XML answer's depth is bounded: elements nested past ``MAX_XML_DEPTH`` (256) are a
SOURCE_CONTRACT naming the bound, found while parsing, never a RecursionError in the
readers that walk the tree; an answer at the bound reads whole."""

from __future__ import annotations

import pytest

from artemis.errors import ArtemisError, ErrorCode
from artemis.outage import outage_of
from artemis.sources.xmldoc import MAX_XML_DEPTH, parse_xml


def nested(depth: int, leaf: str = "<v>deep</v>") -> bytes:
    """``depth`` elements, each inside the one before, the innermost holding ``leaf``."""
    return ("<e>" * (depth - 1) + leaf + "</e>" * (depth - 1)).encode()


@pytest.mark.parametrize("depth", [MAX_XML_DEPTH + 1, 200_000])
def test_xml_nested_past_the_bound_is_a_contract_error_naming_it(depth):
    with pytest.raises(ArtemisError) as e:
        parse_xml(nested(depth), "orders page 1")
    err = e.value
    assert err.code is ErrorCode.SOURCE_CONTRACT and not err.retryable
    assert err.message == (
        "orders page 1: the XML answer nests elements deeper than 256 levels "
        "(the bound of an answer's depth)"
    )
    assert err.details == {"limit": MAX_XML_DEPTH}
    assert outage_of(err, "source", "orders") is None  # fails at once


def test_xml_at_the_bound_reads_whole():
    doc = parse_xml(nested(MAX_XML_DEPTH), "orders page 1")
    [record] = doc.records(".")
    value = record
    for _ in range(MAX_XML_DEPTH - 2):
        value = value["e"]
    assert value == {"v": "deep"}
    assert doc.lookup(".//v") == "deep"


def test_the_bound_counts_depth_not_size():
    """Many siblings, each shallow: as many elements as the deep answer, read whole."""
    wide = b"<list>" + b"<item><id>1</id></item>" * 100_000 + b"</list>"
    assert len(parse_xml(wide, "wide").records("./item")) == 100_000
