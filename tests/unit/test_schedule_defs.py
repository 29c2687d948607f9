"""A schedule's definition (artemis/schedules.py): what is refused, naming the field, and
the task ids its starts get."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from artemis.config import Settings
from artemis.schedules import ScheduleDef, name_of, run_task_id, schedule_id, start_of

BASE = {"name": "nightly", "task": "source_harvest", "params": {"provenance": "catalog"}}


@pytest.mark.parametrize(
    "given, seconds",
    [({"every": 90}, 90.0), ({"every": "15m"}, 900.0), ({"every": "1h"}, 3600.0)],
)
def test_durations_are_seconds_or_a_number_and_a_unit(given, seconds):
    assert ScheduleDef(**BASE, **given).every == seconds
    assert ScheduleDef(**BASE, at="02:00", jitter="5m").jitter == 300.0


@pytest.mark.parametrize(
    "given, said",
    [
        ({}, "exactly one of every, cron and at"),
        ({"every": "1h", "at": "02:00"}, "(given: every, at)"),
        ({"every": "1 fortnight"}, "every: a duration such as 90"),
        ({"every": "0.5s"}, "every: at least one second"),
        ({"every": "1h", "offset": "2h"}, "offset: only with every, and shorter than it"),
        ({"cron": "0 2 * *"}, "cron: five fields"),
        ({"at": "25:00"}, "at: a time of day as HH:MM"),
        ({"at": "02:00", "time_zone": "Mars/Olympus"}, "no such IANA time zone"),
        ({"at": "02:00", "overlap": "allow_all"}, "overlap"),
        ({"at": "02:00", "name": "Nightly"}, "name"),
        ({"at": "02:00", "callback": {"token": "s3cret"}}, "callback.token"),
    ],
)
def test_a_definition_that_cannot_work_is_refused_naming_the_field(given, said):
    with pytest.raises(ValidationError) as e:
        ScheduleDef(**{**BASE, **given})
    assert said in str(e.value)


def test_the_configuration_names_each_schedule_once():
    entry = {**BASE, "at": "02:00"}
    with pytest.raises(ValidationError, match="each name once \\(nightly"):
        Settings(schedules=[entry, entry])


def test_a_start_holds_no_secret_and_its_digest_follows_the_definition():
    d = ScheduleDef(**BASE, at="02:00", callback={"base_url": "https://cron", "token_env": "TOK"})
    start = start_of(d, "ops", "operator")
    assert start.callback == {"base_url": "https://cron", "auth_header": None}
    assert start.token_env == "TOK" and start.owner == "ops"
    assert start.digest == d.digest() != ScheduleDef(**BASE, at="03:00").digest()


def test_a_start_instant_names_its_run():
    on_the_hour = datetime(2026, 11, 29, 2, tzinfo=UTC)
    assert run_task_id("nightly", on_the_hour) == "nightly-20261129T020000Z"
    triggered = datetime(2026, 11, 29, 8, 36, 33, 378149, tzinfo=UTC)
    assert run_task_id("nightly", triggered) == "nightly-20261129T083633.378149Z"
    sid = schedule_id("artemis", "nightly")
    assert name_of("artemis", sid) == "nightly" and name_of("other", sid) is None


def test_the_instant_is_read_from_the_workflow_id_temporal_gave_the_start():
    from artemis.run_models import scheduled_instant

    at = scheduled_instant("artemis-schedule/artemis/nightly-2026-11-29T02:00:00Z")
    assert at == datetime(2026, 11, 29, 2, tzinfo=UTC)
    assert scheduled_instant("artemis-schedule/artemis/nightly") is None


def test_a_start_runs_with_its_makers_role_now_and_fails_once_the_maker_is_not_an_operator():
    from temporalio.exceptions import ApplicationError

    from activities.schedules import ScheduleActivities
    from artemis.run_models import MADE_BY_CONFIG

    tokens = [
        {"name": "ops", "token": "operator-token-0123456789", "role": "operator"},
        {"name": "cli", "token": "client-token-0123456789", "role": "client"},
    ]
    acts = ScheduleActivities(Settings(server={"api_tokens": tokens}), None)  # type: ignore[arg-type]
    assert acts._maker_role("s", "ops", "admin", "api") == "operator"
    for owner, said in (("gone", "no longer exists"), ("cli", "is now a client")):
        with pytest.raises(ApplicationError) as e:
            acts._maker_role("s", owner, "operator", "api")
        assert e.value.type == "FORBIDDEN" and e.value.non_retryable
        assert f"token {owner!r}, {said}" in e.value.message
    # the configuration's schedules are the operator's; an API without tokens trusts its own
    assert acts._maker_role("s", "anyone", "operator", MADE_BY_CONFIG) == "operator"
    open_api = ScheduleActivities(Settings(), None)  # type: ignore[arg-type]
    assert open_api._maker_role("s", "default", "admin", "api") == "admin"


def test_a_callback_url_holds_no_secret():
    with pytest.raises(ValidationError, match="no user, password or query"):
        ScheduleDef(**BASE, at="02:00", callback={"base_url": "https://u:p@cron.example/"})
    with pytest.raises(ValidationError, match="no user, password or query"):
        ScheduleDef(**BASE, at="02:00", callback={"base_url": "https://cron.example/?token=x"})
