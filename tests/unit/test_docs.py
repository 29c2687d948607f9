"""The documentation stays true where it states facts the code owns, and its links lead
somewhere: the README (the user guide) and docs/ (the contract, built by `make docs`)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from artemis.errors import ErrorCode
from artemis.run_state import RETRYABLE_ENDINGS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_the_error_table_lists_every_code_with_both_kinds_of_retry_and_its_status():
    text = (DOCS / "api.md").read_text()
    rows = {
        m.group(1): (m.group(2), int(m.group(3)), m.group(4), int(m.group(5)))
        for m in re.finditer(
            r"^\| `([A-Z_]+)` \| (yes|no) \| (\d+) \| (yes|no) \| (\d+) \|$", text, re.M
        )
    }
    yes = {True: "yes", False: "no"}
    expected = {
        c.value: (
            yes[c.retryable],
            c.info.max_retries,
            yes[c in RETRYABLE_ENDINGS],
            c.http_status,
        )
        for c in ErrorCode
    }
    assert rows == expected


def test_the_registry_field_reference_is_the_generated_one():
    from artemis.registry.file_models import reference

    text = (DOCS / "registry.md").read_text()
    shown = text.split("<!-- registry-reference:start -->\n")[1].split(
        "<!-- registry-reference:end -->"
    )[0]
    # When a column is added: paste `artemis registry schema` between the markers.
    assert shown == reference()


def _strip_fences(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where `[x](y)` is not a link."""
    return re.sub(r"(`+).*?\1", "", _strip_fences(text), flags=re.S)


def _links(text: str) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", _prose(text))


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc both write it for these pages:
    entities read, code marks and punctuation dropped, lower case, spaces to hyphens."""
    text = html.unescape(heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} +(.+?) *#*$", _strip_fences(path.read_text()), re.M)
    return {_slug(h) for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(page: Path):
    broken = []
    for target in _links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto: — not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_file():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_links_and_skips_code():
    assert _links("[a](docs/x.md#y) `[b](no.md)` [c](https://e.org)\n```\n[d](no.md)\n```") == [
        "docs/x.md#y",
        "https://e.org",
    ]
    assert _slug("output_defaults.&lt;code&gt;") == "output_defaultscode"
    assert _slug("Request modes: POST searches, XML") == "request-modes-post-searches-xml"
