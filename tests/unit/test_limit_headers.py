"""Reading a source's rate-limit headers (artemis/registry/limit_headers.py), each example
as its public document writes it: GitHub's REST API, draft-ietf-httpapi-ratelimit-headers
-07 (a Dictionary) and -10 (a List of Items), and comma lists of one value per window."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from artemis.http import Answer, Headers
from artemis.registry.limit_headers import MAX_CLOSED_S, LimitHeaders, ietf_limits

NOW = 1_372_700_000.0


def closed(row: dict[str, Any], headers: dict[str, str], status: int = 200) -> float | None:
    reading = LimitHeaders.of(row)
    assert reading is not None
    return reading.closed_for(Answer(status, Headers(headers)), NOW)


X = {"ratelimit_headers_code": "X_RATELIMIT"}
IETF = {"ratelimit_headers_code": "IETF"}


def test_no_header_reading_unless_asked():
    assert LimitHeaders.of({}) is None
    assert LimitHeaders.of({"ratelimit_headers_code": "NONE", "qps_limit": 3}) is None


def test_githubs_reset_is_an_epoch_instant():
    spent = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1372700873"}
    assert closed(X, spent) == 873.0
    # budget left: nothing closes; a reset already past closes nothing either
    assert closed(X, {**spent, "X-RateLimit-Remaining": "42"}) is None
    assert closed(X, {**spent, "X-RateLimit-Reset": "1372699999"}) is None


@pytest.mark.parametrize(
    ("fmt", "reset", "seconds"),
    [
        ("DELTA_SECONDS", "24", 24.0),
        ("DELTA_MILLIS", "600000", 600.0),
        ("EPOCH_MILLIS", "1372700030000", 30.0),
    ],
)
def test_the_other_reset_formats(fmt: str, reset: str, seconds: float):
    row = {**X, "reset_format_code": fmt}
    assert closed(row, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset}) == seconds


def test_the_reserve_closes_before_zero_and_names_are_configurable():
    row = {
        **X,
        "remaining_header_name": "RateLimit-Remaining",
        "reset_header_name": "RateLimit-Reset",
        "reset_format_code": "DELTA_SECONDS",
        "remaining_reserve_value": 3,
    }
    assert closed(row, {"RateLimit-Remaining": "3", "RateLimit-Reset": "5"}) == 5.0
    assert closed(row, {"RateLimit-Remaining": "4", "RateLimit-Reset": "5"}) is None
    assert closed(row, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "5"}) is None


def test_one_value_per_window_is_read_pairwise():
    row = {**X, "reset_format_code": "DELTA_SECONDS"}
    # Brave: 1 a second and 15000 a month
    assert closed(row, {"X-RateLimit-Remaining": "0, 1000", "X-RateLimit-Reset": "1, 9"}) == 1
    assert closed(row, {"X-RateLimit-Remaining": "3, 0", "X-RateLimit-Reset": "1, 9"}) == 9
    assert closed(row, {"X-RateLimit-Remaining": "0, x", "X-RateLimit-Reset": "1, 9"}) is None


def test_a_retry_after_on_a_429_takes_precedence():
    spent = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1372700873"}
    assert closed(X, {**spent, "Retry-After": "7"}, status=429) == 7.0
    assert closed(X, {"Retry-After": "7"}, status=429) == 7.0
    assert closed(X, {**spent, "Retry-After": "7"}, status=200) == 873.0


def test_a_reset_read_in_the_wrong_format_closes_a_day_at_most():
    row = {**X, "reset_format_code": "DELTA_SECONDS"}
    spent = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1372700873"}
    assert closed(row, spent) == MAX_CLOSED_S


def test_the_current_draft_a_list_of_service_limits():
    assert closed(IETF, {"RateLimit": '"default";r=0;t=30'}) == 30.0
    assert closed(IETF, {"RateLimit": '"default";r=50;t=30'}) is None
    # several policies: the spent one closes; a partition key is a comment here
    both = '"permin";r=0;t=20;pk=:cHsdsRa894==:, "perhr";r=900;t=1800'
    assert closed(IETF, {"RateLimit": both}) == 20.0


def test_a_limit_without_t_takes_its_policys_window():
    headers = {
        "RateLimit": '"permin";r=0',
        "RateLimit-Policy": '"permin";q=50;w=60,"perhr";q=1000;w=3600',
    }
    assert closed(IETF, headers) == 60.0
    # no t and no policy: nothing is known, nothing closes
    assert closed(IETF, {"RateLimit": '"permin";r=0'}) is None


def test_draft_07_a_dictionary_with_its_policy():
    assert closed(IETF, {"RateLimit": "limit=100, remaining=0, reset=5"}) == 5.0
    assert closed(IETF, {"RateLimit": "limit=100, remaining=50, reset=5"}) is None
    headers = {"RateLimit": "limit=10, remaining=0", "RateLimit-Policy": "10;w=1, 1000;w=3600"}
    assert closed(IETF, headers) == 1.0


@pytest.mark.parametrize(
    "value",
    ['"default";r=zero;t=30', '"default";t=30', '"unterminated;r=0;t=3', "r=0;t=3", ""],
)
def test_malformed_fields_are_ignored(value: str):
    assert ietf_limits(Headers({"RateLimit": value}), "RateLimit", "RateLimit-Policy") == []


def test_the_documented_rows_are_valid_rows():
    from artemis.registry.file_models import row_model

    text = (Path(__file__).resolve().parents[2] / "docs" / "registry.md").read_text()
    section = text.split("### Rate-limit headers\n")[1].split("\n## ")[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 2
    for block in blocks:
        for row in yaml.safe_load(block)["rate_limit_cfg"]:
            checked = row_model("rate_limit_cfg").model_validate(row)
            assert LimitHeaders.of(checked.model_dump()) is not None
