"""A record model that evolves holds to the import's rules (artemis/registry/evolve.py,
artemis/quarantine/'s PageJudge): a name the import refuses (``_id``, ``@attr``,
``#text``, one that differs only in case from a field, ``_artemis_*``) is skipped and
reported, at most ``schema.max_new_fields`` fields a run are added, and the model written
is one the next run starts with. On the registry database (SQLite and PostgreSQL), through
source_harvest's own params, policy and model."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from sqlalchemy import select

from artemis.config import Settings
from artemis.db import utcnow
from artemis.errors import ArtemisError, ErrorCode
from artemis.quarantine.pages import PageJudge, Tally
from artemis.quarantine.store import RunPlace, run_actions
from artemis.registry.evolve import evolve_record_model
from artemis.registry.models import RegProvenance, RegProvRecordModel
from artemis.registry.resolve import current_row
from artemis.registry.yaml_io import import_yaml
from artemis.sinks.records import MAX_FIELDS, evolution_plan
from artemis.tasks.base import TaskContext
from artemis.tasks.source_harvest import SourceHarvest
from artemis.tracing import TraceContext, new_span_id, new_trace_id
from tests.conftest import new_task_id

FIELDS = {"id": "int", "name": "str"}


def doc(code: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "provenance": {"provenance_code": code, "base_url_default": "https://shop.example"},
        "record_model": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "key_json": ["id"],
                "fields_json": fields or FIELDS,
                "schema_contract_code": "EVOLVE",
            }
        ],
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "items",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/items",
            }
        ],
    }


def settings_of(reg, key_file: str, max_new: int = 50) -> Settings:
    return Settings(
        database={"url": reg.url.render_as_string(hide_password=False)},
        vault={"master_key_file": key_file},
        schema={"max_new_fields": max_new},
    )


def judge_of(settings: Settings, code: str, task_id: str) -> PageJudge:
    """A run's page judge as a process activity builds it: an operator's run (its
    evolve is kept), its params prepared as the API prepares them."""
    task = SourceHarvest()
    params = task.prepare_params({"provenance": code, "schema_contract": "evolve"}, settings)
    ctx = TaskContext(
        "source_harvest",
        task_id,
        params,
        settings,
        TraceContext(new_trace_id(), new_span_id()),
        role="operator",
    )
    place = RunPlace(f"source_harvest/{task_id}", "source_harvest", task_id, code, {}, {})
    return PageJudge(task, ctx, place, Tally(counts_pages=True))


def fields_in_force(reg, code: str) -> dict[str, str]:
    with reg.connect() as conn:
        pid = conn.execute(
            select(RegProvenance.id).where(RegProvenance.provenance_code == code)
        ).scalar_one()
        row = current_row(conn, RegProvRecordModel, pid, "harvest", utcnow())
    return dict(row.fields_json)


def test_names_the_import_refuses_are_skipped_and_the_next_run_starts(reg, key_file):
    settings = settings_of(reg, key_file)
    import_yaml(reg, yaml.safe_dump(doc("shop")), key_file)
    judge = judge_of(settings, "shop", new_task_id())
    record = {
        "id": 1,
        "name": "kettle",
        "_id": "a1",  # every Elasticsearch hit's
        "@lang": "en",  # the XML reader's attribute
        "#text": "body",  # and element text
        "ID": 7,  # `id` to SQLite
        "NAME": "Kettle",
        "color": "red",  # the one the model may take
    }
    out = judge.page(0, [record, {**record, "id": 2}])
    judge.keep([out])
    assert out.records[0] == {"id": 1, "name": "kettle"}
    assert out.evolved == ["color"]
    assert sorted(out.skipped) == ["#text", "@lang", "ID", "NAME", "_id"]
    assert out.skipped["_id"].startswith("not a valid field name: a name starts with a letter")
    assert out.skipped["ID"] == (
        "differs only in case from field 'id' (a table's column names ignore case)"
    )
    # Each reported once in the run, with what became of it.
    assert {d.field for d in out.new_drift} == set(out.skipped) | {"color"}
    assert run_actions(settings.database.url, judge.place) == {
        **dict.fromkeys(out.skipped, "skipped"),
        "color": "evolved",
    }
    assert fields_in_force(reg, "shop") == {**FIELDS, "color": "str | None"}
    # The operator's next run starts: its model is one the import would take.
    again = judge_of(settings, "shop", new_task_id())
    assert again.spec is not None and "color" in again.spec.model.model_fields


def test_a_run_adds_at_most_max_new_fields_over_all_its_windows(reg, key_file):
    settings = settings_of(reg, key_file, max_new=3)
    import_yaml(reg, yaml.safe_dump(doc("wide")), key_file)
    run = new_task_id()
    first = judge_of(settings, "wide", run)
    new = {f"f{i}": i for i in range(5)}
    out = first.page(0, [{"id": 1, "name": "a", **new}])
    first.keep([out])
    assert out.evolved == ["f0", "f1", "f2"]
    over = "over schema.max_new_fields (3 new fields a run)"
    assert out.skipped == {"f3": over, "f4": over}
    # Another window of the same run (its own activity): the run's room is spent; a
    # field the run evolved before is added again, which changes nothing.
    window = judge_of(settings, "wide", run)
    later = window.page(1, [{"id": 2, "name": "b", "f0": 1, "g": "x"}])
    window.keep([later])
    assert later.skipped == {"g": over} and later.evolved == []
    assert set(fields_in_force(reg, "wide")) == {"id", "name", "f0", "f1", "f2"}
    # A run of its own has room again.
    other = judge_of(settings, "wide", new_task_id())
    page = other.page(0, [{"id": 3, "name": "c", "g": "x"}])
    other.keep([page])
    assert page.evolved == ["g"] and page.skipped == {}


def test_the_model_in_force_is_checked_again_when_it_is_written(reg, key_file):
    import_yaml(reg, yaml.safe_dump(doc("race")), key_file)
    url = reg.url.render_as_string(hide_password=False)
    with reg.connect() as conn:
        pid = conn.execute(
            select(RegProvenance.id).where(RegProvenance.provenance_code == "race")
        ).scalar_one()
    # Another run added `Colour` since this one's model was frozen: `colour` is its twin.
    assert evolve_record_model(url, pid, "harvest", {"Colour": "str | None"})
    assert not evolve_record_model(url, pid, "harvest", {"colour": "str | None", "_id": "str"})
    assert fields_in_force(reg, "race") == {**FIELDS, "Colour": "str | None"}
    assert evolve_record_model(url, pid, "harvest", {"colour": "str | None", "size": "int | None"})
    assert fields_in_force(reg, "race") == {**FIELDS, "Colour": "str | None", "size": "int | None"}


def test_the_column_budget_bounds_a_model_that_grows():
    existing = [f"c{i}" for i in range(MAX_FIELDS - 1)]
    added, skipped = evolution_plan(existing, {"a": "int | None", "b": "int | None"})
    assert added == {"a": "int | None"}
    assert skipped == {
        "b": f"over the column budget: a record model has at most {MAX_FIELDS} fields"
    }
    # _artemis_* are Artemis' own columns: never a field.
    _, refused = evolution_plan(["id"], {"_artemis_task_id": "str | None"})
    assert refused["_artemis_task_id"].startswith("not a valid field name")


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        # (the file's keys in its own order: the second one named is the one refused)
        ({"id": "int", "ID": "str | None"}, "field 'id': differs only in case from field 'ID'"),
        (
            {"id": "int", **{f"c{i}": "int | None" for i in range(MAX_FIELDS)}},
            f"{MAX_FIELDS + 1} fields: a record model has at most {MAX_FIELDS}",
        ),
    ],
)
def test_the_import_refuses_a_model_no_table_can_hold(reg, key_file, fields, said):
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc("bad", fields)), key_file)
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert said in e.value.message
