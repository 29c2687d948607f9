"""The README stays true where it states facts the code owns."""

from __future__ import annotations

import re
from pathlib import Path

from artemis.errors import ErrorCode

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_error_table_lists_every_code_with_its_retryability_and_status():
    rows = {
        m.group(1): (m.group(2), int(m.group(3)), int(m.group(4)))
        for m in re.finditer(r"^\| `([A-Z_]+)` \| (yes|no) \| (\d+) \| (\d+) \|$", README, re.M)
    }
    expected = {
        c.value: ("yes" if c.retryable else "no", c.info.max_retries, c.http_status)
        for c in ErrorCode
    }
    assert rows == expected


def test_readme_registry_field_reference_is_the_generated_one():
    from artemis.registry.file_models import reference

    shown = README.split("<!-- registry-reference:start -->\n")[1].split(
        "<!-- registry-reference:end -->"
    )[0]
    # When a column is added: paste `artemis registry schema` between the markers.
    assert shown == reference()
