"""The registry YAML is checked as typed models before anything is written: every wrong
field is refused by its path, and the values that reach the database are typed."""

from __future__ import annotations

import pytest
import yaml
from sqlalchemy import select

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import PAGINATION_MODES, RegProvenance, RegProvPaginationCfg
from artemis.registry.yaml_io import import_yaml
from tests.conftest import ROOT

BUNDLED = ROOT / "infra" / "registry"


def crossref() -> dict:
    return yaml.safe_load((BUNDLED / "crossref.yaml").read_text())


def edit(doc: dict, section: str, **cols) -> dict:
    doc[section][0].update(cols)
    return doc


@pytest.mark.parametrize(
    "change, where, why",
    [
        (
            lambda d: edit(d, "pagination_cfg", page_size_value="lots"),
            "pagination_cfg[0].page_size_value",
            "valid integer",
        ),
        (
            lambda d: edit(d, "pagination_cfg", colour="red"),
            "pagination_cfg[0].colour",
            "unknown field",
        ),
        (
            lambda d: edit(d, "pagination_cfg", records_jsonpath="$.[[["),
            "pagination_cfg[0].records_jsonpath",
            "not a JSONPath",
        ),
        (
            lambda d: edit(d, "pagination_cfg", short_page_is_last="sometimes"),
            "pagination_cfg[0].short_page_is_last",
            "valid boolean",
        ),
        (lambda d: edit(d, "pagination_cfg", id=7), "pagination_cfg[0].id", "unknown field"),
        (
            lambda d: edit(d, "rate_limit_cfg", qps_limit=[1]),
            "rate_limit_cfg[0].qps_limit",
            "valid number",
        ),
        (lambda d: {**d, "paginaton_cfg": []}, "paginaton_cfg", "unknown field"),
        (
            lambda d: {**d, "provenance": {"provenance_name": "x"}},
            "provenance.provenance_code",
            "is required",
        ),
        (
            lambda d: {**d, "pagination_cfg": {"scope_code": "SOURCE"}},
            "pagination_cfg",
            "valid list",
        ),
    ],
)
def test_a_wrong_field_is_refused_by_its_path_and_nothing_is_written(
    reg, key_file, change, where, why
):
    text = yaml.safe_dump(change(crossref()))
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, text, key_file, source="crossref.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert f"crossref.yaml: {where}: " in e.value.message and why in e.value.message
    with reg.connect() as conn:
        assert conn.execute(select(RegProvenance.__table__)).first() is None


def test_an_inline_secret_is_refused_with_the_way_to_name_one(reg, key_file):
    doc = crossref()
    doc["credential"] = [
        {
            "scope_code": "SOURCE",
            "effective_from": "2025-01-01T00:00:00Z",
            "credential_name": "k",
            "auth_type_code": "BEARER",
            "secret_value": "inline-secret",
        }
    ]
    with pytest.raises(ArtemisError, match="use secret_env") as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="crossref.yaml")
    assert "inline-secret" not in e.value.message


def test_values_reach_the_database_typed(reg, key_file):
    doc = edit(crossref(), "pagination_cfg", page_size_value="500", short_page_is_last="yes")
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    t = RegProvPaginationCfg.__table__
    with reg.connect() as conn:
        row = conn.execute(select(t)).one()._mapping
    # Coerced by the model, not stored as the strings the file held.
    assert row["page_size_value"] == 500 and row["short_page_is_last"] is True


def refused(reg, key_file, doc: dict) -> str:
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="my.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    return e.value.message


def test_every_problem_is_listed_with_the_closest_valid_name(reg, key_file):
    doc = edit(crossref(), "pagination_cfg", page_param_name="page", next_page="$.next")
    doc["http_cfg"][0]["max_body_byte"] = 100
    message = refused(reg, key_file, doc)
    assert message.startswith("my.yaml: 3 problems: ")
    # the field is page_number_param_name here, page_param_name in endpoint_def
    # (not page_size_param_name: the row sets that one already)
    assert (
        "pagination_cfg[0].page_param_name: unknown field, did you mean "
        "'page_number_param_name'? (page_param_name is a field of endpoint_def)"
    ) in message
    assert "pagination_cfg[0].next_page: unknown field, did you mean 'next_page_jsonpath'?" in (
        message
    )
    assert "http_cfg[0].max_body_byte: unknown field, did you mean 'max_body_bytes'?" in message


@pytest.mark.parametrize(
    "section, column, value, expected",
    [
        (
            "pagination_cfg",
            "pagination_mode_code",
            "PAGE",
            "must be one of PAGE_NUMBER, OFFSET, CURSOR, TOKEN, SCROLL, LINK_HEADER, NEXT_URL, "
            "SINGLE (got 'PAGE'), "
            "did you mean 'PAGE_NUMBER'?",
        ),
        ("http_cfg", "scope_code", "source", "did you mean 'SOURCE'?"),
        ("retry_cfg", "backoff_policy_code", "EXPONENTAL", "did you mean 'EXPONENTIAL'?"),
        ("window_offset_cfg", "window_size_unit_code", "DAYS", "did you mean 'DAY'"),
    ],
)
def test_a_code_outside_its_values_is_refused_naming_them(
    reg, key_file, section, column, value, expected
):
    message = refused(reg, key_file, edit(crossref(), section, **{column: value}))
    assert f"{section}[0].{column}: " in message and expected in message


@pytest.mark.parametrize(
    "cols, needle",
    [
        (
            {"next_page_jsonpath": "$.next"},
            "next_page_jsonpath is for PAGE_NUMBER and OFFSET paging, not CURSOR "
            "(which has next_cursor_jsonpath)",
        ),
        (
            {
                "pagination_mode_code": "OFFSET",
                "next_page_jsonpath": "$.n",
                "has_more_jsonpath": "$.m",
            },
            "set one of next_page_jsonpath and has_more_jsonpath, not both",
        ),
        ({"pagination_mode_code": "OFFSET", "has_more_jsonpath": "$.[["}, "not a JSONPath"),
    ],
)
def test_end_markers_belong_to_page_number_and_offset_paging(reg, key_file, cols, needle):
    message = refused(reg, key_file, edit(crossref(), "pagination_cfg", **cols))
    assert "pagination_cfg[0]" in message and needle in message


MODEL = {
    "key": ["id"],
    "fields": {"id": "int", "name": "str", "price": "float|None", "tags": "list[str] | None"},
}


def test_a_record_model_is_stored_resolved_into_the_contract_and_exported(reg, key_file):
    from artemis.registry.resolve import resolve_contract
    from artemis.registry.yaml_io import export_yaml

    doc = crossref()
    doc.pop("record_model")  # its family row: this provenance declares fields instead
    doc["provenance"]["record_model"] = MODEL
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    canonical = {**MODEL, "fields": {**MODEL["fields"], "price": "float | None"}}
    with reg.connect() as conn:
        contract = resolve_contract(conn, "crossref", "harvest")
    row = contract.record_model or {}
    assert (row["scope_code"], row["key_json"], row["fields_json"]) == (
        "SOURCE",
        canonical["key"],
        canonical["fields"],
    )
    assert row["effective_from"].startswith("1970-01-01")
    # exported as a row of its dimension (the short form is for writing by hand)
    exported = yaml.safe_load(export_yaml(reg, "crossref"))
    assert "record_model" not in exported["provenance"]
    [out] = exported["record_model"]
    assert (out["key_json"], out["fields_json"]) == (canonical["key"], canonical["fields"])
    # the exported file imports again unchanged
    again = import_yaml(reg, yaml.safe_dump(exported), key_file)
    assert again.updated == [] and again.created == []


@pytest.mark.parametrize(
    "model, needle",
    [
        (
            {"key": ["id"], "fields": {"id": "integer"}},
            "'integer' is not a field type, did you mean 'int'?",
        ),
        ({"key": ["id"], "fields": {"id": "int", "p": "number"}}, "did you mean 'float'?"),
        (
            {"key": ["ID"], "fields": {"id": "int"}},
            "key 'ID' is not one of the fields, did you mean 'id'?",
        ),
        ({"key": ["id"], "fields": {"id": "int | None"}}, "key 'id' may not be null"),
        ({"key": [], "fields": {"id": "int"}}, "record_model.key: List should have at least 1"),
        ({"key": ["id"], "fields": {"id": "int", "_artemis_x": "str"}}, "field '_artemis_x'"),
        ({"key": ["id"], "fields": {"id": "int", "json": "str"}}, "taken by Pydantic"),
        (
            {"key": ["id"], "fields": {"id": "int"}, "table": "x"},
            "record_model.table: unknown field",
        ),
    ],
)
def test_a_bad_record_model_is_refused_naming_what_is_wrong(reg, key_file, model, needle):
    doc = crossref()
    doc["provenance"]["record_model"] = model
    message = refused(reg, key_file, doc)
    assert "provenance.record_model" in message and needle in message


def test_every_field_of_the_file_is_described():
    from artemis.registry.file_models import file_model, row_model
    from artemis.registry.models import DIMENSIONS

    models = [file_model().model_fields["provenance"].annotation, *map(row_model, DIMENSIONS)]
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description (field_docs)"
            # every column acts: none is stored to do nothing
            assert "not read" not in field.description, f"{model.__name__}.{name}"


def test_every_column_of_the_seeds_tables_is_in_the_file():
    # A column the file cannot set would be stored to do nothing (or never set at all).
    from artemis.registry.file_models import HIDDEN, PROVENANCE_COLUMNS, row_model
    from artemis.registry.models import DIMENSIONS, RegProvenance

    for dim, table in DIMENSIONS.items():
        columns = set(table.model_fields) - HIDDEN - {"dimension", "identity"}
        assert columns <= set(row_model(dim).model_fields), dim
    own = set(RegProvenance.model_fields) - {"id", "created_at", "updated_at"}
    assert own == set(PROVENANCE_COLUMNS)


def test_registry_schema_prints_the_reference_and_the_json_schema():
    import json

    from artemis.registry.file_models import reference
    from tests.helpers import artemis_cli

    def cli(*args):
        out = artemis_cli("registry", "schema", *args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert cli() == reference()
    schema = json.loads(cli("--json"))
    pagination = schema["$defs"]["RegProvPaginationCfgRow"]["properties"]
    assert "next_page_jsonpath" in pagination and "has_more_jsonpath" in pagination
    assert pagination["pagination_mode_code"]["enum"] == list(PAGINATION_MODES)
