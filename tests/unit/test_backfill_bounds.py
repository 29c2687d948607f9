"""A backfill's size is known before it starts: its windows counted by arithmetic (the same
count as listing them), bounded by ``runs.max_windows``; days before 1900 or after today
in the source's zone refused; a request's parallelism and query within their bounds."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import pytest
from pydantic import ValidationError

from artemis.config import Settings
from artemis.errors import ArtemisError
from artemis.registry.windows import count_windows, iter_windows
from artemis.tasks.source_harvest import MAX_QUERY_CHARS, SourceParams, check_days

CONFIGS = [
    {},
    {"window_size_value": 1, "window_size_unit_code": "DAY"},
    {"window_size_value": 3, "window_size_unit_code": "DAY"},
    {"window_size_value": 36, "window_size_unit_code": "HOUR"},
    {"window_size_value": 1, "window_size_unit_code": "WEEK"},
    {"window_size_value": 2, "window_size_unit_code": "MONTH"},
    {"window_mode_code": "CALENDAR", "window_size_unit_code": "MONTH", "window_size_value": 1},
    {"window_mode_code": "CALENDAR", "window_size_unit_code": "MONTH", "window_size_value": 5},
    {"window_mode_code": "CALENDAR", "window_size_unit_code": "WEEK", "window_size_value": 2},
]


@pytest.mark.parametrize("win", CONFIGS, ids=str)
def test_windows_are_counted_as_many_as_are_listed(win):
    rng = random.Random(7)
    for _ in range(300):
        first = date(2000, 1, 1) + timedelta(days=rng.randint(0, 5000))
        last = first + timedelta(days=rng.randint(-3, 900))
        assert count_windows(first, last, win) == len(list(iter_windows(first, last, win)))


def test_the_longest_range_is_counted_at_once_and_listed_to_its_last_day():
    assert count_windows(date(1, 1, 1), date(9999, 12, 31), {}) == 3_652_059
    month = {"window_mode_code": "CALENDAR", "window_size_unit_code": "MONTH"}
    assert list(iter_windows(date(9999, 12, 5), date(9999, 12, 31), month)) == [
        (date(9999, 12, 5), date(9999, 12, 31))
    ]


def daily(start: date, end: date) -> SourceParams:
    return SourceParams(provenance="p", task_type="backfill", start=start, end=end)


CONTRACT = {"window_offset": {"window_size_value": 1, "window_size_unit_code": "DAY"}}
NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def test_the_default_bound_takes_ten_thousand_windows_and_refuses_one_more():
    bound = Settings().runs.max_windows
    assert bound == 10_000
    first = date(1990, 1, 1)
    check_days(daily(first, first + timedelta(days=bound - 1)), CONTRACT, NOW, bound)
    with pytest.raises(ArtemisError) as e:
        check_days(daily(first, first + timedelta(days=bound)), CONTRACT, NOW, bound)
    assert "10001 windows" in e.value.message and "runs.max_windows (10000)" in e.value.message


def test_a_day_after_today_in_the_sources_zone_is_refused():
    # 12:00 UTC on June 1 is already June 2 in Kiritimati (UTC+14): June 2 is today there.
    east = {**CONTRACT, "provenance": {"timezone_default": "Pacific/Kiritimati"}}
    p = SourceParams(provenance="p", task_type="harvest", start=date(2026, 6, 2))
    check_days(p, east, NOW, 10)
    with pytest.raises(ArtemisError) as e:
        check_days(p, CONTRACT, NOW, 10)
    assert "params.start: 2026-06-02 is in the future" in e.value.message


def test_days_before_1900_and_long_queries_are_refused_by_the_params():
    with pytest.raises(ValidationError, match="before 1900-01-01"):
        SourceParams(provenance="p", start=date(1, 1, 1))
    SourceParams(provenance="p", query="q" * MAX_QUERY_CHARS)
    with pytest.raises(ValidationError, match="at most 2048 characters"):
        SourceParams(provenance="p", query="q" * (MAX_QUERY_CHARS + 1))
