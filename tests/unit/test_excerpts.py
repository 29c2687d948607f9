"""What of an answer's body may reach an error text: a short excerpt, redacted after a
cut to a bounded window (not the whole body), and a found JSON value in a bounded form."""

from __future__ import annotations

from artemis.http import EXCERPT_CHARS, Answer, Headers, body_excerpt, excerpt
from artemis.paging import describe
from artemis.redact import register_secret


def test_an_excerpt_is_short_and_a_secret_across_its_end_is_redacted_whole():
    secret = "operator-registered-secret-0123456789"
    register_secret(secret)
    body = "." * 150 + secret + "-" * (8 << 20) + "TAIL"
    for given in (body, body.encode()):
        cut = excerpt(given)
        assert len(cut) <= EXCERPT_CHARS and cut.startswith("." * 150)
        assert secret[:8] not in cut and "***RED" in cut
    bearer = "x" * 120 + "Authorization: Bearer tok-0123456789abcdef" + "y" * 100
    assert "tok-0123" not in excerpt(bearer)


def test_an_answers_excerpt_is_read_from_a_prefix_in_its_charset():
    text = "é" * 300
    answer = Answer(400, Headers(), text.encode("latin-1"), charset="latin-1")
    assert body_excerpt(answer) == "é" * EXCERPT_CHARS
    assert answer.head(5) == "ééééé"


def test_a_found_value_is_described_bounded_and_redacted():
    assert describe({"a": 1}) == "dict {'a': 1}"
    long = describe(list(range(1_000_000)))
    assert long.startswith("list [0, 1, 2") and len(long) < 100
    assert "tok-0123" not in describe({"authorization": "Bearer tok-0123456789abcdef"})
