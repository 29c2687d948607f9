"""Records shaped in YAML (artemis/registry/record_steps.py, docs/resources.md "Shaping
records"): each step that cannot work is refused at import naming its place; each step's
effect on a record; and, through source_harvest's own process and page judge on the
registry database (SQLite and PostgreSQL), a record a step cannot apply to quarantined
with the step named, a record a filter leaves out counted, an update's pointer read from
the records as shaped, and a row written around the import stopped when a run starts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from sqlalchemy import select, update

from artemis.config import Settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.ledger import Ledger, PageDone
from artemis.quarantine.pages import PageJudge, Tally
from artemis.quarantine.policy import Stage
from artemis.quarantine.store import RunPlace
from artemis.registry.models import RegProvenance, RegProvRecordModel
from artemis.registry.record_steps import (
    Refused,
    Shaped,
    StepEnv,
    apply_steps,
    parsed_steps,
    step_problems,
    steps_of,
)
from artemis.registry.watermark import take_seen
from artemis.registry.writes import check_registry
from artemis.registry.yaml_io import export_yaml, import_yaml
from artemis.run_state import RunState, stats_view
from artemis.tasks.base import TaskContext
from artemis.tasks.source_harvest import SourceHarvest
from artemis.tracing import TraceContext, new_span_id, new_trace_id
from tests.conftest import ROOT, new_task_id

ROW = {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z"}
FIELDS = {
    "id": "str",
    "title": "str",
    "published": "date | None",
    "words": "int | None",
    "source": "str",
    "kind": "str | None",
    "since": "datetime | None",
}
# A JSON:API resource's records shaped into FIELDS.
STEPS = [
    {"map": {"from": "$.attributes.title", "to": "title", "required": True}},
    {"map": {"from": "$.attributes.published", "to": "published"}},
    {"map": {"from": "$.attributes.words", "to": "words"}},
    {"add": {"to": "source", "from": "provenance"}},
    {"add": {"to": "kind", "value": "article"}},
    {"add": {"to": "since", "from": "window_start"}},
    {"filter": {"path": "$.attributes.status", "equals": "published"}},
    {"drop": ["type", "attributes"]},
]


def doc(code: str, steps: Any, **row: Any) -> dict[str, Any]:
    return {
        "provenance": {"provenance_code": code, "base_url_default": "https://news.example"},
        "endpoint_def": [
            {
                **ROW,
                "endpoint_name": "articles",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/articles",
            }
        ],
        "record_model": [
            {
                **ROW,
                "key_json": ["id"],
                "fields_json": FIELDS,
                "record_steps_json": steps,
                **row,
            }
        ],
    }


def article(i: int, status: str = "published", **attributes: Any) -> dict[str, Any]:
    return {
        "id": str(i),
        "type": "articles",
        "attributes": {
            "title": f"Article {i}",
            "published": f"2025-03-{i:02d}",
            "words": 100 * i,
            "status": status,
            **attributes,
        },
    }


ENV = StepEnv(provenance="news", window_start="2025-03-01T00:00:00+00:00")


# -- refused at import ---------------------------------------------------------------------------
M, R, A, D, F = "map", "rename", "add", "drop", "filter"


@pytest.mark.parametrize(
    "steps, problem",
    [
        ({M: {"from": "$.a", "to": "title"}}, ".record_steps_json: Input should be a valid list"),
        (
            [{"mapp": {"from": "$.a", "to": "title"}}],
            ": record_steps_json[0]: 'mapp' is not a step (rename, map, add, drop, filter), "
            "did you mean 'map'?",
        ),
        (
            [{M: {"from": "$.a", "to": "title"}, A: {"to": "kind", "value": "x"}}],
            ": record_steps_json[0]: a step is a mapping of one key, the step's name",
        ),
        ([{M: "$.a"}], ": record_steps_json[0].map: a mapping of from, to, required (got str)"),
        (
            [{M: {"from": "$.a", "to": "title", "as": "x"}}],
            ": record_steps_json[0].map.as: unknown key (this step takes from, to, required)",
        ),
        (
            [{M: {"from": "$.[[[", "to": "title"}}],
            ": record_steps_json[0].map.from: not a JSONPath",
        ),
        (
            [{M: {"from": "attributes.title", "to": "title"}}],
            ": record_steps_json[0].map.from: a JSONPath into the record, starting with '$'",
        ),
        ([{M: {"from": "$.a"}}], ": record_steps_json[0].map.to: required"),
        (
            [{M: {"from": "$.a", "to": "_id"}}],
            ": record_steps_json[0].map.to: '_id' cannot name a field: a name starts with a letter",
        ),
        (
            [{M: {"from": "$.a", "to": "titel"}}],
            ": record_steps_json[0].map.to: 'titel' is not a field of the record model "
            "(fields_json: id, kind, published, since, source, title, words), did you mean "
            "'title'?",
        ),
        (
            [{M: {"from": "$.a", "to": "title", "required": "yes"}}],
            ": record_steps_json[0].map.required: Input should be a valid boolean (got 'yes')",
        ),
        ([{R: {"from": "", "to": "id"}}], ": record_steps_json[0].rename.from: String should have"),
        ([{R: {"from": "_id", "to": "@id"}}], ": record_steps_json[0].rename.to: '@id' cannot"),
        (
            [{A: {"to": "kind", "value": "x", "from": "provenance"}}],
            ": record_steps_json[0].add: add takes value or from, not both",
        ),
        (
            [{A: {"to": "kind"}}],
            ": record_steps_json[0].add: add takes value (a constant) or from (provenance or "
            "window_start): name one",
        ),
        (
            [{A: {"to": "kind", "from": "run_id"}}],
            ": record_steps_json[0].add.from: Input should be 'provenance' or 'window_start' "
            "(got 'run_id')",
        ),
        (
            [{A: {"to": "words", "from": "provenance"}}],
            ": record_steps_json[0].add.from: provenance gives text, and field 'words' is int",
        ),
        (
            [{A: {"to": "published", "from": "window_start"}}],
            ": record_steps_json[0].add.from: window_start gives text, and field 'published' is "
            "date (a field of type datetime or str or json takes it)",
        ),
        (
            [{A: {"to": "words", "value": "many"}}],
            ": record_steps_json[0].add.value: 'many' does not fit field 'words': Input should be "
            "a valid integer",
        ),
        (
            [{A: {"to": "title", "value": None}}],
            ": record_steps_json[0].add.value: None does not fit field 'title'",
        ),
        ([{D: []}], ": record_steps_json[0].drop: a list of the record's keys to remove (got [])"),
        ([{D: "type"}], ": record_steps_json[0].drop: a list of the record's keys to remove"),
        (
            [{D: ["title"]}],
            ": record_steps_json[0].drop: 'title' is a field of the record model and no later "
            "step sets it (its column would stay empty)",
        ),
        ([{F: {"path": "$..["}}], ": record_steps_json[0].filter.path: not a JSONPath"),
        (
            [{F: {"path": "$.a", "eq": 1}}],
            ": record_steps_json[0].filter.eq: unknown key (this step takes path, equals)",
        ),
        (
            [{M: {"from": "$.a", "to": "title"}}, {A: {"to": "title", "value": "x"}}],
            ": record_steps_json[1].add.to: 'title' is set by record_steps_json[0] already "
            "(each field is set by one step)",
        ),
        (
            [{D: ["_id"]}, {R: {"from": "_id", "to": "id"}}],
            ": record_steps_json[1].rename.from: '_id' is dropped by record_steps_json[0]",
        ),
        ([{D: [f"x{i}"]} for i in range(101)], ": record_steps_json: 101 steps, at most 100"),
    ],
)
def test_a_step_that_cannot_work_is_refused_at_import_by_its_place(reg, key_file, steps, problem):
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc("news", steps)), key_file, source="news.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert f"news.yaml: record_model[0]{problem}" in e.value.message, e.value.message
    with reg.connect() as conn:
        assert conn.execute(select(RegProvenance.__table__)).first() is None


def test_steps_beside_a_paper_family_are_refused(reg, key_file):
    family = doc("news", STEPS)
    row = family["record_model"][0]
    del row["key_json"], row["fields_json"]
    row["record_family_code"] = "CROSSREF"
    with pytest.raises(ArtemisError, match="the CROSSREF family's records are shaped by Artemis"):
        import_yaml(reg, yaml.safe_dump(family), key_file)


def test_every_problem_of_a_row_is_listed_at_once():
    problems = step_problems([{"map": {"from": "$.[", "to": "_x"}}, {"drop": []}], FIELDS, ["id"])
    assert [p.split(":")[0] for p in problems] == [
        "record_steps_json[0].map.from",
        "record_steps_json[0].map.to",
        "record_steps_json[1].drop",
    ]


def test_steps_that_can_work_are_stored_as_json_and_come_back_in_the_export(reg, key_file):
    steps = [*STEPS, {"filter": {"path": "$.attributes.published"}}]
    # A constant YAML reads as a date is kept as the ISO text a record's date is.
    fields = {**FIELDS, "kind": "str | None"}
    text = yaml.safe_dump(doc("news", steps, fields_json=fields))
    text = text.replace("value: article", "value: 2025-03-01")
    import_yaml(reg, text, key_file)
    with reg.connect() as conn:
        stored = conn.execute(select(RegProvRecordModel.record_steps_json)).scalar_one()
    assert stored[4] == {"add": {"to": "kind", "value": "2025-03-01"}}
    assert stored[:4] == steps[:4] and stored[5:] == steps[5:]
    exported = yaml.safe_load(export_yaml(reg, "news"))
    assert exported["record_model"][0]["record_steps_json"] == stored
    again = import_yaml(reg, yaml.safe_dump(exported), key_file)
    assert again.created == [] and again.updated == []


def test_the_docs_example_imports_as_written_and_shapes_its_record(reg, key_file):
    text = (ROOT / "docs" / "resources.md").read_text()
    section = text.split("## Shaping records\n")[1].split("\n## ")[0]
    example = section.split("```yaml\n")[1].split("```")[0]
    import_yaml(reg, example, key_file)
    with reg.connect() as conn:
        row = conn.execute(select(RegProvRecordModel.__table__)).one()._mapping
    record = {
        "id": "1",
        "type": "articles",
        "attributes": {
            "title": "Launch",
            "published": "2025-02-01",
            "words": 250,
            "status": "published",
        },
    }
    assert apply_steps(record, steps_of(dict(row)), ENV) == Shaped(
        {
            "id": "1",
            "title": "Launch",
            "published": "2025-02-01",
            "words": 250,
            "source": "news",
            "kind": "article",
            "harvested_from": ENV.window_start,
        }
    )


# -- what each step does -----------------------------------------------------------------------


def shaped(record: dict[str, Any], *steps: dict[str, Any]) -> Shaped | Refused:
    parsed, problems = parsed_steps(list(steps))
    assert not problems
    return apply_steps(record, tuple(parsed), ENV)


def test_rename_gives_a_key_no_column_can_be_named_after_a_field():
    record = {"_id": "a1", "@lang": "en", "#text": "body"}
    out = shaped(
        record,
        {"rename": {"from": "_id", "to": "doc_id"}},
        {"rename": {"from": "@lang", "to": "lang"}},
        {"rename": {"from": "#text", "to": "text"}},
    )
    assert out == Shaped({"doc_id": "a1", "lang": "en", "text": "body"})
    assert record == {"_id": "a1", "@lang": "en", "#text": "body"}  # the source's, untouched


def test_a_missing_value_is_null_and_a_required_one_rejects_the_record_naming_the_step():
    step = {"rename": {"from": "_id", "to": "doc_id"}}
    assert shaped({"x": 1}, step) == Shaped({"x": 1, "doc_id": None})
    # A null found is a value: the record model says whether its field may be null.
    assert shaped({"_id": None}, step) == Shaped({"doc_id": None})
    required = {"rename": {"from": "_id", "to": "doc_id", "required": True}}
    assert shaped({"_id": None}, required) == Shaped({"doc_id": None})
    assert shaped({"x": 1}, required) == Refused(
        "record_steps_json[0] (rename _id → doc_id): nothing at key _id", "doc_id"
    )
    title = {"map": {"from": "$.attributes.title", "to": "title", "required": True}}
    assert shaped({"attributes": {}}, {"drop": ["x"]}, title) == Refused(
        "record_steps_json[1] (map $.attributes.title → title): nothing at path $.attributes.title",
        "title",
    )
    # A path through a value that is not an object finds nothing either.
    assert isinstance(shaped({"attributes": "gone"}, title), Refused)


def test_map_copies_a_value_from_a_json_path_and_a_path_of_several_values_gives_their_list():
    record = {"attributes": {"title": "T", "tags": [{"n": "a"}, {"n": "b"}]}, "@id": "x"}
    out = shaped(
        record,
        {"map": {"from": "$.attributes.title", "to": "title"}},
        {"map": {"from": "$.attributes.tags[*].n", "to": "tags"}},
        {"map": {"from": "$['@id']", "to": "ref"}},
        {"map": {"from": "$.attributes.none", "to": "none"}},
    )
    assert isinstance(out, Shaped) and out.kept
    assert (out.record["title"], out.record["tags"], out.record["ref"]) == ("T", ["a", "b"], "x")
    assert out.record["none"] is None
    assert out.record["attributes"] is record["attributes"]  # copied, not moved


def test_add_a_constant_the_provenance_and_the_window_start_and_drop_keys():
    out = shaped(
        {"id": 1, "type": "articles", "attributes": {}, "kind": "old"},
        {"add": {"to": "kind", "value": {"a": [1, None]}}},
        {"add": {"to": "source", "from": "provenance"}},
        {"add": {"to": "since", "from": "window_start"}},
        {"drop": ["type", "attributes", "not-there"]},
    )
    assert out == Shaped(
        {"id": 1, "kind": {"a": [1, None]}, "source": "news", "since": ENV.window_start}
    )
    parsed, _ = parsed_steps([{"add": {"to": "since", "from": "window_start"}}])
    # A run without a window start (a harvest without `start`) adds null.
    assert apply_steps({}, tuple(parsed), StepEnv("news", None)) == Shaped({"since": None})


def test_filter_keeps_a_record_with_a_value_there_or_that_value():
    present = {"filter": {"path": "$.attributes.status"}}
    equals = {"filter": {"path": "$.attributes.status", "equals": "published"}}
    flag = {"filter": {"path": "$.draft", "equals": True}}
    assert shaped({"attributes": {"status": None}}, present).kept  # null is a value
    assert not shaped({"attributes": {}}, present).kept
    assert shaped({"attributes": {"status": "published"}}, equals).kept
    left = shaped({"attributes": {"status": "draft"}}, {"add": {"to": "k", "value": 1}}, equals)
    # Left out as it stood there: what an update's pointer reads.
    assert left == Shaped({"attributes": {"status": "draft"}, "k": 1}, kept=False)
    assert shaped({"draft": True}, flag).kept and not shaped({"draft": 1}, flag).kept


def test_each_step_sees_the_record_as_the_steps_before_it_left_it():
    out = shaped(
        {"_id": "a", "attributes": {"n": 2}},
        {"rename": {"from": "attributes", "to": "attrs"}},
        {"map": {"from": "$.attrs.n", "to": "n", "required": True}},
        {"filter": {"path": "$.n", "equals": 2}},
        {"drop": ["attrs"]},
    )
    assert out == Shaped({"_id": "a", "n": 2})


# -- through a run's process and page judge ------------------------------------------------------
def settings_of(reg, key_file: str) -> Settings:
    return Settings(
        database={"url": reg.url.render_as_string(hide_password=False)},
        vault={"master_key_file": key_file},
    )


def judge_of(settings: Settings, code: str, **params: Any) -> PageJudge:
    """A run's page judge as the process activity builds it (an operator's run)."""
    task = SourceHarvest()
    prepared = task.prepare_params({"provenance": code, **params}, settings)
    task_id = new_task_id()
    ctx = TaskContext(
        "source_harvest",
        task_id,
        prepared,
        settings,
        TraceContext(new_trace_id(), new_span_id()),
        role="operator",
    )
    place = RunPlace(f"source_harvest/{task_id}", "source_harvest", task_id, code, {}, {})
    return PageJudge(task, ctx, place, Tally(counts_pages=True))


def test_a_page_is_shaped_a_bad_record_is_quarantined_naming_its_step_a_filtered_one_counted(
    reg, key_file
):
    import_yaml(reg, yaml.safe_dump(doc("news", STEPS)), key_file)
    judge = judge_of(settings_of(reg, key_file), "news", start="2025-03-01")
    untitled = article(3)
    del untitled["attributes"]["title"]
    wordy = article(5, words="many")  # shaped, then not fitting the model
    raw = [article(1), article(2, status="draft"), untitled, article(4, published=None), wordy]
    out = judge.page(0, raw)
    assert out.records == [
        {
            "id": "1",
            "title": "Article 1",
            "published": "2025-03-01",
            "words": 100,
            "source": "news",
            "kind": "article",
            "since": "2025-03-01T00:00:00+00:00",
        },
        {
            "id": "4",
            "title": "Article 4",
            "published": None,
            "words": 400,
            "source": "news",
            "kind": "article",
            "since": "2025-03-01T00:00:00+00:00",
        },
    ]
    assert out.filtered == 1 and out.quarantined == 2 and out.dropped == 0
    by_id = {b.record["id"]: b for b in out.bad}
    step = by_id["3"]
    assert step.message == (
        "record_steps_json[0] (map $.attributes.title → title): nothing at path $.attributes.title"
    )
    assert (step.field, step.code, step.stage) == ("title", "SOURCE_CONTRACT", Stage.PROCESS)
    # Kept as the source gave them: a replay shapes them again, by the steps then in force.
    assert step.record is untitled
    assert by_id["5"].record is wordy and by_id["5"].stage is Stage.PROCESS
    assert by_id["5"].field == "words"
    judge.keep([out])


def test_a_page_whose_every_record_lacks_a_required_value_is_the_source_changing(reg, key_file):
    import_yaml(reg, yaml.safe_dump(doc("news", STEPS)), key_file)
    judge = judge_of(settings_of(reg, key_file), "news")
    raw = [article(1), article(2)]
    for r in raw:
        r["attributes"]["headline"] = r["attributes"].pop("title")
    with pytest.raises(ArtemisError) as e:
        judge.page(0, raw)
    assert e.value.code is ErrorCode.SOURCE_CONTRACT
    assert "every one of its 2 records breaks the same rule" in e.value.message
    assert "record_steps_json[0] (map $.attributes.title → title)" in e.value.message


def test_an_update_s_pointer_is_read_from_the_records_as_shaped(reg, key_file):
    fields = {**FIELDS, "updated": "datetime"}
    steps = [
        {"map": {"from": "$.attributes.updated", "to": "updated"}},
        *STEPS,
    ]
    news = doc("news", steps, fields_json=fields)
    news["window_offset_cfg"] = [{**ROW, "watermark_field_name": "updated"}]
    import_yaml(reg, yaml.safe_dump(news), key_file)
    settings = settings_of(reg, key_file)
    judge = judge_of(settings, "news", task_type="update", start="2025-03-01")
    raw = [
        article(1, updated="2025-03-02T10:00:00Z"),
        # left out by the filter: seen all the same (asked again, it is left out again)
        article(2, status="draft", updated="2025-03-04T10:00:00Z"),
    ]
    judge.page(0, raw)
    with reg.begin() as conn:
        pid = conn.execute(select(RegProvenance.id)).scalar_one()
        seen = take_seen(conn, pid, judge.ctx.task_id, "")
    assert seen == "2025-03-04T10:00:00+00:00"


def test_a_row_written_around_the_import_stops_the_run_when_it_starts(reg, key_file):
    import_yaml(reg, yaml.safe_dump(doc("news", STEPS)), key_file)
    t = RegProvRecordModel.__table__
    with reg.begin() as conn:
        conn.execute(update(t).values(record_steps_json=[{"map": {"from": "$.a", "to": "nope"}}]))
    with pytest.raises(ArtemisError) as e:
        SourceHarvest().prepare_params({"provenance": "news"}, settings_of(reg, key_file))
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert e.value.message.startswith(
        "provenance 'news': record_model: record_steps_json[0].map.to: 'nope' is not a field "
        "of the record model"
    )
    # `registry check` finds it before a run does.
    with reg.connect() as conn:
        found = [f for f in check_registry(conn) if f["kind"] == "record_steps"]
    assert len(found) == 1 and found[0]["table"] == "reg_prov_record_model", found
    assert "record_steps_json[0].map.to: 'nope' is not a field" in found[0]["message"]


def test_records_filtered_are_counted_in_the_run_s_stats_and_on_the_stream_s_wire():
    run = RunState()
    run.processed(3, quarantined=1, dropped=0, filtered=2)
    run.processed(1, filtered=1)
    assert stats_view(run.stats)["records_filtered"] == 3
    # A run carried over from a build that counted none shows 0, then counts.
    old = RunState(stats={"pages": 0, "records_processed": 0, "batches": 0})
    assert stats_view(old.stats)["records_filtered"] == 0
    old.processed(1, filtered=1)
    assert old.stats["records_filtered"] == 1
    # The stream's ledger carries them on its wire.
    stream = Ledger.starting(0, judges=True, delivers=True)
    stream.count({0: PageDone(records_in=3, records_out=1, filtered=2)})
    back = Ledger.from_json(json.loads(json.dumps(stream.to_json())))
    assert back.records_filtered == 2 and back == stream
