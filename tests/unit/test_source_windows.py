"""The windows and pointers of a registry run, without a stack: how a window's instants
are written in a source's parameters and zone, an update's window (overlap, lag,
lookback), a backfill's calendar windows, a record's pointer and the order pointers
compare in; the pointer table's rules on SQLite and PostgreSQL; where a provenance's
records are placed."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import insert

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegProvenance
from artemis.registry.watermark import (
    PointerKey,
    advance_pointer,
    drop_seen,
    largest,
    note_seen,
    pointer_field,
    pointer_of,
    read_pointer,
    take_seen,
)
from artemis.registry.windows import (
    backfill_windows,
    check_time_format,
    day_start,
    format_instant,
    halves,
    source_zone,
    span,
    update_window,
    window_query,
    zone,
)
from artemis.sinks.factory import _placed, table_name_for
from artemis.sinks.records import declared_spec
from artemis.tasks.source_harvest import SourceHarvest, SourceParams

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- writing instants --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, tz, written",
    [
        (None, UTC, "2025-03-09T07:30:00+00:00"),
        ("ISO", NY, "2025-03-09T03:30:00-04:00"),  # after the 2:00 change: EDT
        ("ISO", BERLIN, "2025-03-09T08:30:00+01:00"),
        ("EPOCH", NY, "1741505400"),  # the instant, whatever the zone
        ("EPOCH_MS", BERLIN, "1741505400000"),
        ("%Y-%m-%d", NY, "2025-03-09"),
        ("%Y-%m-%dT%H:%M:%SZ", UTC, "2025-03-09T07:30:00Z"),
        ("%Y-%m-%d %H:%M", BERLIN, "2025-03-09 08:30"),  # the zone's wall clock
    ],
)
def test_an_instant_is_written_as_the_format_says_in_the_sources_zone(fmt, tz, written):
    assert format_instant(at("2025-03-09T07:30:00+00:00"), fmt, tz) == written


def test_a_time_format_names_something():
    for ok in (None, "ISO", "EPOCH", "EPOCH_MS", "%Y-%m-%d"):
        assert check_time_format(ok) == ok
    with pytest.raises(ValueError, match="strftime pattern"):
        check_time_format("YYYY-MM-DD")


def contract(window: dict[str, Any] | None = None, tz: str | None = None) -> dict[str, Any]:
    prov: dict[str, Any] = {"id": 1, "provenance_code": "src"}
    if tz is not None:
        prov["timezone_default"] = tz
    return {"provenance": prov, "window_offset": window}


def test_a_window_goes_in_the_parameters_the_contract_names():
    start, end = at("2025-03-01T05:00:00+00:00"), at("2025-03-02T05:00:00+00:00")
    both = {
        "window_start_param_name": "updated_at_min",
        "window_end_param_name": "updated_at_max",
        "window_time_format": "ISO",
    }
    assert window_query(contract(both, "America/New_York"), start, end) == {
        "updated_at_min": "2025-03-01T00:00:00-05:00",
        "updated_at_max": "2025-03-02T00:00:00-05:00",
    }
    since = {"window_start_param_name": "since", "window_time_format": "EPOCH"}
    assert window_query(contract(since), start, end) == {"since": "1740805200"}
    assert window_query(contract(since), None, end) == {}
    assert window_query(contract({}), start, end) == {}
    assert window_query(contract(None), start, end) == {}


# -- zones and days ----------------------------------------------------------------------------


def test_a_sources_zone_is_its_timezone_default_else_utc():
    assert source_zone(contract(tz="Europe/Berlin")) == BERLIN
    assert source_zone(contract()) is UTC and source_zone(None) is UTC
    assert zone("utc") is UTC
    with pytest.raises(ArtemisError) as e:
        zone("Mars/Olympus_Mons")
    assert e.value.code is ErrorCode.CONFIG_ERROR and "'Mars/Olympus_Mons'" in e.value.message


def test_a_runs_days_are_instants_from_midnight_to_midnight_of_the_sources_zone():
    ny = contract(tz="America/New_York")
    task = SourceHarvest()
    # Mar 9 2025 in New York is 23 hours long (clocks go forward at 2:00)
    start, end = task.window_of(date(2025, 3, 9), date(2025, 3, 9), ny)
    assert (start, end) == (at("2025-03-09T05:00:00+00:00"), at("2025-03-10T04:00:00+00:00"))
    assert end - start == timedelta(hours=23)
    # Nov 2 2025 is 25 hours long
    start, end = task.window_of(date(2025, 11, 2), date(2025, 11, 2), ny)
    assert end - start == timedelta(hours=25)
    # open ends stay open
    assert task.window_of(date(2025, 3, 1), None, ny) == (at("2025-03-01T05:00:00+00:00"), None)
    assert task.window_of(None, None, ny) == (None, None)
    # without a zone, UTC midnights
    assert task.window_of(date(2025, 3, 1), date(2025, 3, 1), contract()) == (
        at("2025-03-01T00:00:00+00:00"),
        at("2025-03-02T00:00:00+00:00"),
    )
    assert day_start(date(2025, 3, 1), BERLIN) == at("2025-02-28T23:00:00+00:00")


# -- an update's window ------------------------------------------------------------------------

NOW = at("2025-06-01T12:00:00+00:00")


def test_an_update_asks_from_its_pointer_less_the_overlap_up_to_now_less_the_lag():
    win = {"overlap_value": 2, "overlap_unit_code": "HOUR", "watermark_lag_seconds": 600}
    mark = at("2025-05-31T08:00:00+00:00")
    assert update_window(win, mark, None, None, NOW) == (
        at("2025-05-31T06:00:00+00:00"),
        at("2025-06-01T11:50:00+00:00"),
    )
    # the pointer wins over a start; an end given is kept
    start, end = at("2025-01-01T00:00:00+00:00"), at("2025-06-01T00:00:00+00:00")
    assert update_window(win, mark, start, end, NOW) == (at("2025-05-31T06:00:00+00:00"), end)


def test_a_first_update_asks_from_its_start_else_now_less_lag_and_lookback():
    win = {"lookback_value": 3, "lookback_unit_code": "DAY", "watermark_lag_seconds": 600}
    start = at("2025-05-01T00:00:00+00:00")
    assert update_window(win, None, start, None, NOW)[0] == start
    assert update_window(win, None, None, None, NOW) == (
        NOW - timedelta(days=3, seconds=600),
        NOW - timedelta(seconds=600),
    )
    # MONTH is 30 days; the overlap does not apply without a pointer
    month = {"lookback_value": 1, "lookback_unit_code": "MONTH", "overlap_value": 1}
    assert update_window(month | {"overlap_unit_code": "DAY"}, None, None, None, NOW)[0] == (
        NOW - timedelta(days=30)
    )


def test_a_first_update_without_start_or_lookback_is_refused_naming_params_start():
    with pytest.raises(ArtemisError) as e:
        update_window({"watermark_lag_seconds": 60}, None, None, None, NOW)
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert e.value.message.startswith("params.start") and "lookback_value" in e.value.message


def test_a_span_is_a_value_of_units():
    assert span(None, None) == timedelta(0) and span(0, "DAY") == timedelta(0)
    assert span(90, "MINUTE") == timedelta(hours=1.5) and span(2, "WEEK") == timedelta(days=14)
    with pytest.raises(ArtemisError) as e:
        span(1, "FORTNIGHT")
    assert e.value.code is ErrorCode.CONFIG_ERROR and "'FORTNIGHT'" in e.value.message


# -- a backfill's windows ----------------------------------------------------------------------


def d(text: str) -> date:
    return date.fromisoformat(text)


def windows(first: str, last: str, **win: Any) -> list[tuple[str, str]]:
    return [(a.isoformat(), b.isoformat()) for a, b in backfill_windows(d(first), d(last), win)]


def test_calendar_months_cut_at_the_first_of_each_month():
    month = {"window_mode_code": "CALENDAR", "window_size_unit_code": "MONTH"}
    assert windows("2024-01-20", "2024-03-09", **month) == [
        ("2024-01-20", "2024-01-31"),
        ("2024-02-01", "2024-02-29"),  # a leap year
        ("2024-03-01", "2024-03-09"),
    ]
    assert windows("2024-11-15", "2025-02-10", **month, window_size_value=2) == [
        ("2024-11-15", "2024-12-31"),
        ("2025-01-01", "2025-02-10"),
    ]
    assert windows("2025-12-31", "2026-01-01", **month) == [
        ("2025-12-31", "2025-12-31"),
        ("2026-01-01", "2026-01-01"),
    ]


def test_calendar_weeks_cut_on_mondays():
    week = {"window_mode_code": "CALENDAR", "window_size_unit_code": "WEEK"}
    assert windows("2025-03-05", "2025-03-18", **week) == [  # a Wednesday to a Tuesday
        ("2025-03-05", "2025-03-09"),
        ("2025-03-10", "2025-03-16"),
        ("2025-03-17", "2025-03-18"),
    ]
    assert windows("2025-03-10", "2025-03-30", **week, window_size_value=2) == [
        ("2025-03-10", "2025-03-23"),
        ("2025-03-24", "2025-03-30"),
    ]


def test_sliding_windows_are_fixed_sizes_of_at_least_a_day():
    assert windows(
        "2025-03-01", "2025-03-07", window_size_value=3, window_size_unit_code="DAY"
    ) == [
        ("2025-03-01", "2025-03-03"),
        ("2025-03-04", "2025-03-06"),
        ("2025-03-07", "2025-03-07"),
    ]
    assert windows(
        "2025-03-01", "2025-03-02", window_size_value=6, window_size_unit_code="HOUR"
    ) == [
        ("2025-03-01", "2025-03-01"),
        ("2025-03-02", "2025-03-02"),
    ]
    assert windows("2025-03-01", "2025-03-02") == [
        ("2025-03-01", "2025-03-01"),
        ("2025-03-02", "2025-03-02"),
    ]


def test_a_window_over_the_cap_halves_down_to_a_day():
    assert halves(d("2025-03-01"), d("2025-03-10")) == [
        (d("2025-03-01"), d("2025-03-05")),
        (d("2025-03-06"), d("2025-03-10")),
    ]
    assert halves(d("2025-03-01"), d("2025-03-01")) is None


# -- a record's pointer and their order --------------------------------------------------------

DATE = {"offset_type_code": "DATE", "watermark_field_name": "updated_at"}
ID = {"offset_type_code": "ID", "watermark_field_name": "id"}
COMPOSITE = {
    "offset_type_code": "COMPOSITE",
    "watermark_field_name": "updated_at",
    "watermark_id_field_name": "id",
}


def test_a_date_pointer_is_the_records_instant_in_utc():
    assert pointer_of({"updated_at": "2025-03-01T10:00:00Z"}, DATE) == "2025-03-01T10:00:00+00:00"
    assert (
        pointer_of({"updated_at": "2025-03-01T10:00:00-05:00"}, DATE) == "2025-03-01T15:00:00+00:00"
    )
    # an offset the record states wins over the source's zone
    assert (
        pointer_of({"updated_at": "2025-03-01T10:00:00+09:00"}, DATE, BERLIN)
        == "2025-03-01T01:00:00+00:00"
    )


def test_a_time_without_an_offset_is_the_sources_wall_clock():
    assert (
        pointer_of({"updated_at": "2025-03-01T11:00:00"}, DATE, BERLIN)
        == "2025-03-01T10:00:00+00:00"
    )
    assert (
        pointer_of({"updated_at": "2025-07-01 11:00:00"}, DATE, NY) == "2025-07-01T15:00:00+00:00"
    )
    assert pointer_of({"updated_at": "2025-03-01"}, DATE, NY) == "2025-03-01T05:00:00+00:00"
    assert pointer_of({"updated_at": "2025-03-01T11:00:00"}, DATE) == "2025-03-01T11:00:00+00:00"


def test_the_pointer_field_falls_back_to_the_date_field_but_never_for_an_id():
    fallback = {"offset_type_code": "DATE", "default_date_field_name": "modified"}
    assert pointer_field(fallback) == "modified"
    assert pointer_of({"modified": "2025-03-01T00:00:00Z"}, fallback) == "2025-03-01T00:00:00+00:00"
    assert pointer_field({"offset_type_code": "ID", "default_date_field_name": "modified"}) is None
    assert pointer_field({}) is None


def test_id_and_composite_pointers():
    assert pointer_of({"id": 42}, ID) == 42 and pointer_of({"id": "a7"}, ID) == "a7"
    record = {"id": 7, "updated_at": "2025-03-01T10:00:00-05:00"}
    assert pointer_of(record, COMPOSITE) == ["2025-03-01T15:00:00+00:00", 7]
    assert pointer_of({"updated_at": "2025-03-01T10:00:00Z"}, COMPOSITE)[1] is None
    assert pointer_of({"title": "no pointer"}, DATE) is None
    assert pointer_of({"id": None}, ID) is None


@pytest.mark.parametrize(
    "record, win, needle",
    [
        ({"updated_at": "last tuesday"}, DATE, "ISO 8601"),
        ({"updated_at": True}, DATE, "ISO 8601"),
        ({"id": True}, ID, "an integer or a string"),
        ({"id": 1.5}, ID, "an integer or a string"),
        ({"id": [1], "updated_at": "2025-03-01T00:00:00Z"}, COMPOSITE, "'id'"),
    ],
)
def test_a_pointer_field_of_another_kind_is_a_source_contract_error_naming_it(record, win, needle):
    with pytest.raises(ArtemisError) as e:
        pointer_of(record, win)
    assert e.value.code is ErrorCode.SOURCE_CONTRACT and needle in e.value.message


def test_pointers_compare_by_time_and_by_number():
    # instants by time, whatever offset they are written with
    assert (
        largest(["2025-03-01T10:00:00+02:00", "2025-03-01T09:00:00+00:00", None])
        == "2025-03-01T09:00:00+00:00"
    )
    assert largest([9, 10, 2]) == 10
    # ids written as digit strings are numbers too
    assert largest(["99", "100", "7"]) == "100"
    assert largest(["abc", "abd"]) == "abd"
    # a composite pointer: the time first, the id breaks a tie
    assert largest(
        [
            ["2025-03-01T20:00:00+00:00", 4],
            ["2025-03-01T20:00:00+00:00", 5],
            ["2025-03-01T19:00:00+00:00", 99],
        ]
    ) == ["2025-03-01T20:00:00+00:00", 5]
    assert largest([]) is None and largest([None]) is None


def params(window: dict[str, Any], pointer: Any) -> SourceParams:
    return SourceParams(provenance="src", contract=contract(window), pointer=pointer)


def test_the_pointer_is_sent_in_the_id_parameter_less_the_overlap():
    q = SourceHarvest()._pointer_query
    win = {**ID, "watermark_id_param_name": "since", "overlap_value": 2}
    assert q(params(win, 21)) == {"since": 19}
    assert q(params(win, 1)) == {"since": 0}
    assert q(params(win, "120")) == {"since": "118"}
    assert q(params(win, "a7")) == {"since": "a7"}
    assert q(params(win, None)) == {}
    assert q(params({**ID, "overlap_value": 2}, 21)) == {}  # no parameter named
    # a composite pointer sends its id as it is, with its instant; with an overlap
    # (in time) the id would leave out the overlap's earlier ids, so it is not sent
    composite = {**COMPOSITE, "watermark_id_param_name": "since_id"}
    assert q(params(composite, ["2025-03-01T20:00:00+00:00", 5])) == {"since_id": 5}
    assert q(params(composite, ["2025-03-01T20:00:00+00:00", None])) == {}
    overlapped = {**composite, "overlap_value": 2, "overlap_unit_code": "MINUTE"}
    assert q(params(overlapped, ["2025-03-01T20:00:00+00:00", 5])) == {}


# -- the pointer table -------------------------------------------------------------------------


@pytest.fixture
def prov(db_engine) -> int:
    with db_engine.begin() as conn:
        return conn.execute(
            insert(RegProvenance.__table__).values(  # type: ignore[attr-defined]
                provenance_code=f"p-{uuid.uuid4().hex[:8]}",
                provenance_name="pointer test",
                timezone_default="UTC",
                lifecycle_status_code="ACTIVE",
                created_at=NOW,
                updated_at=NOW,
            )
        ).inserted_primary_key[0]


def test_a_runs_largest_pointer_is_taken_once_per_query(db_engine, prov):
    with db_engine.begin() as conn:
        for value in ("2025-03-01T10:00:00+00:00", "2025-03-01T12:00:00+00:00"):
            note_seen(conn, prov, "run-1", "", value)
        note_seen(conn, prov, "run-1", "bugs", "2025-03-09T00:00:00+00:00")
        note_seen(conn, prov, "run-2", "", "2025-03-05T00:00:00+00:00")
        assert take_seen(conn, prov, "run-1", "") == "2025-03-01T12:00:00+00:00"
        assert take_seen(conn, prov, "run-1", "") is None  # taken
        assert take_seen(conn, prov, "run-1", "bugs") == "2025-03-09T00:00:00+00:00"
        drop_seen(conn, prov, "run-2")
        assert take_seen(conn, prov, "run-2", "") is None


def test_a_pointer_only_moves_forward(db_engine, prov):
    t = at("2025-03-01T10:00:00+00:00")
    with db_engine.begin() as conn:
        assert read_pointer(conn, prov, "update", "") == (None, None)
        assert advance_pointer(conn, PointerKey(prov, "update", ""), t, [t.isoformat(), 5], "r1")
        later = t + timedelta(hours=1)
        # an earlier pointer, or the same, leaves it
        assert not advance_pointer(
            conn,
            PointerKey(prov, "update", ""),
            t - timedelta(hours=1),
            [(t - timedelta(hours=1)).isoformat(), 9],
            "r2",
        )
        assert not advance_pointer(
            conn, PointerKey(prov, "update", ""), t, [t.isoformat(), 5], "r2"
        )
        assert read_pointer(conn, prov, "update", "") == (t, [t.isoformat(), 5])
        # the same instant with a larger id moves it
        assert advance_pointer(conn, PointerKey(prov, "update", ""), t, [t.isoformat(), 6], "r3")
        assert advance_pointer(
            conn, PointerKey(prov, "update", ""), later, [later.isoformat(), 1], "r4"
        )
        assert read_pointer(conn, prov, "update", "") == (later, [later.isoformat(), 1])
        # ids: numbers, never backwards
        assert advance_pointer(conn, PointerKey(prov, "update", "ids"), t, 21, "r1")
        assert not advance_pointer(conn, PointerKey(prov, "update", "ids"), later, 20, "r2")
        assert advance_pointer(conn, PointerKey(prov, "update", "ids"), later, 30, "r3")
        assert read_pointer(conn, prov, "update", "ids") == (later, 30)
        # a window's end (no cursor): by its instant
        assert advance_pointer(conn, PointerKey(prov, "update", "w"), t, None, "r1")
        assert not advance_pointer(conn, PointerKey(prov, "update", "w"), t, None, "r2")
        assert advance_pointer(conn, PointerKey(prov, "update", "w"), later, None, "r3")
        assert read_pointer(conn, prov, "update", "w") == (later, None)


# -- where a provenance's records land ---------------------------------------------------------


def test_a_places_default_table_is_its_name_as_an_identifier():
    assert table_name_for("catalog") == "catalog"
    assert table_name_for("my-shop.v2") == "my_shop_v2"
    assert table_name_for("GH Issues") == "GH_Issues"
    assert table_name_for("9lives") == "t_9lives"
    assert table_name_for("_x") == "_x"


SPEC = declared_spec({"key": ["id"], "fields": {"id": "int"}}, "R")


def test_a_place_gets_its_own_table_and_folder():
    out = {
        "sinks": ["sql", "files"],
        "sql": {"url": "sqlite://", "tables": {"stock-main": "stock"}},
        "files": {"url": "/lake", "format": "parquet"},
    }
    mapped = _placed(out, "stock-main", SPEC)
    assert mapped["sql"] == {"url": "sqlite://", "table": "stock"}
    assert mapped["files"] == {"url": "/lake", "format": "parquet", "folder": "stock-main"}
    assert _placed(out, "my-shop", SPEC)["sql"]["table"] == "my_shop"
    assert out["sql"]["tables"] == {"stock-main": "stock"}  # the config is left as it was


@pytest.mark.parametrize(
    "out, needle",
    [
        ({"sinks": ["sql"], "sql": {"url": "sqlite://", "table": "all"}}, "sql.tables"),
        ({"sinks": ["sql"], "sql": {"url": "sqlite://", "tables": ["a"]}}, "a mapping"),
    ],
)
def test_one_table_for_every_place_is_refused(out, needle):
    with pytest.raises(ArtemisError) as e:
        _placed(out, "src", SPEC)
    assert e.value.code is ErrorCode.CONFIG_ERROR and needle in e.value.message


@pytest.mark.parametrize(
    "out, sink",
    [
        ({"sinks": ["sql"], "sql": {"url": "sqlite://"}}, "sql"),
        ({"sinks": ["files"], "files": {"url": "/l", "format": "parquet"}}, "files (parquet)"),
    ],
)
def test_a_typed_sink_for_a_place_without_a_model_is_refused_naming_it(out, sink):
    with pytest.raises(ArtemisError) as e:
        _placed(out, "src", None)
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert "'src' declares no record model" in e.value.message and sink in e.value.message


def test_json_lines_need_no_model():
    out = {"sinks": ["files", "log"], "files": {"url": "/l"}}
    assert _placed(out, "src", None)["files"] == {"url": "/l", "folder": "src"}


def test_a_typed_sink_only_a_request_picked_is_the_requests_error():
    configured = {"sinks": ["files"], "files": {"url": "/l"}, "sql": {"url": "sqlite://"}}
    for merged, field in (
        ({**configured, "files": {"url": "/l", "format": "parquet"}}, "output.files.format"),
        ({**configured, "sinks": ["sql"]}, "output.sinks"),
    ):
        with pytest.raises(ArtemisError) as e:
            _placed(merged, "src", None, configured)
        assert e.value.code is ErrorCode.INVALID_INPUT and e.value.message.startswith(field)
    # the configuration's own typed sink stays the operator's
    typed = {"sinks": ["sql"], "sql": {"url": "sqlite://"}}
    with pytest.raises(ArtemisError) as e:
        _placed({**typed, "sinks": ["sql", "log"]}, "src", None, typed)
    assert e.value.code is ErrorCode.CONFIG_ERROR
