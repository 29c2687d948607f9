"""A request's ``max_bad_records`` is held to the operator's bounds
(``quarantine.max_bad_records_cap_count`` / ``_cap_pct``): past either, the start is a 422
INVALID_INPUT naming the bound; the registry's own value and a run's params read back in
the worker are not capped again (artemis/quarantine/'s RecordPolicyParams)."""

from __future__ import annotations

import pytest

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from tests.unit.test_quarantine import Items, Params

CAPPED = Settings(quarantine={"max_bad_records_cap_count": 500, "max_bad_records_cap_pct": 5})


@pytest.mark.parametrize(
    ("asked", "bound"),
    [
        ("100%", "quarantine.max_bad_records_cap_pct (5%)"),
        ("5.5 %", "quarantine.max_bad_records_cap_pct (5%)"),
        (10**18, "quarantine.max_bad_records_cap_count (500 records)"),
        ("501", "quarantine.max_bad_records_cap_count (500 records)"),
    ],
)
def test_a_request_past_the_operators_bound_is_refused_naming_it(asked, bound):
    with pytest.raises(ArtemisError) as e:
        Items().prepare_params({"max_bad_records": asked}, CAPPED)
    assert e.value.code is ErrorCode.INVALID_INPUT and e.value.code.http_status == 422
    assert e.value.message.startswith("params.max_bad_records: ")
    assert f"is past the operator's bound {bound}" in e.value.message


def test_a_request_within_the_bounds_is_taken_and_the_defaults_cap_ten_percent():
    assert Items().prepare_params({"max_bad_records": "5%"}, CAPPED).max_bad_records == "5%"  # type: ignore[attr-defined]
    assert Items().prepare_params({"max_bad_records": 500}, CAPPED).max_bad_records == 500  # type: ignore[attr-defined]
    with pytest.raises(ArtemisError, match=r"max_bad_records_cap_pct \(10%\)"):
        Items().prepare_params({"max_bad_records": "50%"}, Settings())
    # task_defaults are params too: the operator's own past the bound is refused alike.
    defaults = Settings(task_defaults={"items": {"max_bad_records": 10**6}})
    with pytest.raises(ArtemisError, match=r"max_bad_records_cap_count \(100000 records\)"):
        Items().prepare_params({}, defaults)


def test_params_read_back_in_the_worker_are_not_capped_again():
    # (a run started under a wider bound keeps it: its params were checked when it started)
    assert Params.model_validate({"max_bad_records": "100%"}).max_bad_records == "100%"
