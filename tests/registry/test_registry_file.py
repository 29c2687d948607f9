"""The registry YAML is checked as typed models before anything is written: every wrong
field is refused by its path, and the values that reach the database are typed."""

from __future__ import annotations

import pytest
import yaml
from sqlalchemy import select

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegProvenance, RegProvPaginationCfg
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
