"""A record model drafted from a sample (artemis/registry/drafting.py): the types a
sample shows, ``| None`` for a value null or absent, structs, a key, notes as comments;
the draft is a file the import takes, and every sampled record fits it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from artemis.quarantine.judging import model_faults
from artemis.registry.drafting import _fit, draft_model, draft_yaml
from artemis.registry.file_models import parse_file
from artemis.sinks.records import declared_spec

SAMPLE: list[dict[str, Any]] = [
    {
        "sku": "A-1",
        "id": 7,
        "title": "Anvil",
        "price": 3,
        "day": "2024-02-29",
        "seen": "2024-03-01T10:00:00Z",
        "when": "2024-03-01",
        "maker": {"name": "Acme", "founded": "1920-01-01", "site": {"url": "https://acme.test"}},
        "tags": ["iron"],
        "bits": [1, "a"],
        "none": None,
        "mixed": 1,
        "on": True,
        "_id": "x",
        "ID": 1,
        "extra": {"@type": "thing"},
        "nothing": {},
        "empty": [],
    },
    {
        "sku": "A-2",
        "id": 8,
        "title": "Rocket",
        "price": 2.5,
        "day": None,
        "seen": "2024-03-02T10:00:00.5+01:00",
        "when": "2024-03-02T10:00:00Z",
        "maker": {"name": "Acme"},
        "tags": [],
        "mixed": "one",
        "on": False,
    },
]


def test_each_type_as_the_sample_shows_it() -> None:
    draft = draft_model(SAMPLE)
    assert draft["fields"] == {
        "sku": "str",
        "id": "int",
        "title": "str",
        "price": "float",  # an int and a float
        "day": "date | None",  # null in one record
        "seen": "datetime",
        "when": "str",  # a date mixed with a datetime: text
        "maker": {  # a struct; a sub-field absent from one mapping may be null
            "name": "str",
            "founded": "date | None",
            "site": {"url": "str"},
        },
        "tags": "list[str]",
        "bits": "list | None",  # absent from one record
        "none": "json | None",
        "mixed": "json",
        "on": "bool",
        "extra": "dict | None",
        "nothing": "dict | None",
        "empty": "list | None",
    }
    assert draft["notes"] == {
        "none": "only null or absent in the sample: its type cannot be told",
        "mixed": "values of several types in the sample (int, str)",
        "extra": "a mapping with keys no struct field can be named ('@type'): a dict",
        "nothing": "only empty mappings in the sample: a struct needs a field",
        "empty": "only empty lists in the sample: their items' type cannot be told",
    }
    # a name no column can have, and a name that is another one but for its case
    assert set(draft["left_out"]) == {"_id", "ID"}
    assert "rename: {from: _id" in draft["left_out"]["_id"]
    assert "differs only in case from field 'id'" in draft["left_out"]["ID"]
    assert draft["key"] == ["id"] and draft["key_note"] is None  # id-like before sku


def test_the_draft_is_a_file_the_import_takes_and_every_record_fits() -> None:
    draft = draft_model(SAMPLE)
    text = draft_yaml(draft, resource="parts")
    assert '"on": bool' in text  # YAML would read a plain `on` as true
    assert "mixed: json  # values of several types in the sample (int, str)" in text
    assert '# not declared: "_id": ' in text
    doc = {
        "provenance": {"provenance_code": "parts", "base_url_default": "https://parts.test"},
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "resource_name": "parts",
                "endpoint_name": "parts",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/parts",
            }
        ],
        **yaml.safe_load(text),
    }
    row = parse_file(doc, "parts.yaml")["record_model"][0]
    assert row["fields_json"] == draft["fields"] and row["key_json"] == ["id"]
    assert row["resource_name"] == "parts"
    spec = declared_spec({"key": draft["key"], "fields": draft["fields"]}, "PartsRecord")
    named = [{k: v for k, v in r.items() if k in draft["fields"]} for r in SAMPLE]
    assert model_faults(spec, named) == {}


def test_a_key_is_unique_and_in_every_record() -> None:
    # an id-like name wins among unique fields; a repeated value is no key
    records = [{"name": "a", "order_id": 1, "id": 5}, {"name": "b", "order_id": 2, "id": 5}]
    assert draft_model(records)["key"] == ["order_id"]
    # no single field is unique: a pair is
    pairs = [{"repo": "a", "n": 1}, {"repo": "a", "n": 2}, {"repo": "b", "n": 1}]
    assert draft_model(pairs)["key"] == ["repo", "n"]
    # nothing unique: the first field every record has, said so
    same = [{"k": 1, "v": 1}, {"k": 1, "v": 1}]
    draft = draft_model(same)
    assert draft["key"] == ["k"] and "no field" in draft["key_note"]
    assert "key_json: [k]  # no field (or pair of fields) is unique" in draft_yaml(draft)
    # no field in every record: the first one is the key, never null, and said so
    sparse = [{"a": 1}, {"b": 2}]
    draft = draft_model(sparse)
    assert draft["key"] == ["a"] and draft["fields"]["a"] == "int"
    assert "would be set aside" in draft["key_note"]


def test_a_field_the_check_refuses_is_loosened() -> None:
    fields: dict[str, Any] = {"id": "int", "at": "datetime", "s": {"n": "int"}}
    notes: dict[str, str] = {}
    sample = [{"id": 1, "at": "2024-01-01", "s": {}}]
    _fit(sample, ["id"], fields, notes)
    assert fields == {"id": "int", "at": "json | None", "s": "dict | None"}
    assert notes["at"].startswith("loosened to json: column 'at'")


def test_no_record_no_draft() -> None:
    with pytest.raises(ValueError, match="no record"):
        draft_model([None, 3, "x"])
    with pytest.raises(ValueError, match="can be a column"):
        draft_model([{"_id": 1}])


def test_a_model_in_force_keeps_its_place_and_steps() -> None:
    draft = draft_model([{"doc_id": "a"}])
    text = draft_yaml(
        draft,
        effective_from="2025-01-01T00:00:00Z",
        scope="TASK",
        task_type="harvest",
        extra={
            "schema_contract_code": "EVOLVE",
            "record_steps_json": [{"rename": {"from": "_id", "to": "doc_id"}}],
        },
    )
    row = yaml.safe_load(text)["record_model"][0]
    assert row == {
        "scope_code": "TASK",
        "task_type": "harvest",
        "effective_from": "2025-01-01T00:00:00Z",
        "key_json": ["doc_id"],
        "fields_json": {"doc_id": "str"},
        "schema_contract_code": "EVOLVE",
        "record_steps_json": [{"rename": {"from": "_id", "to": "doc_id"}}],
    }
