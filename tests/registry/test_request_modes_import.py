"""The request-mode fields at import: a file using them all imports and round-trips, and
each combination that cannot work is refused with its reason, nothing written."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegProvenance
from artemis.registry.resolve import resolve_contract
from artemis.registry.yaml_io import export_yaml, import_yaml
from tests.conftest import ROOT

FROM = "2025-01-01T00:00:00Z"
ROW = {"scope_code": "SOURCE", "effective_from": FROM}
FILE: dict[str, Any] = {
    "provenance": {
        "provenance_code": "shop",
        "base_url_default": "https://search.example",
        "record_model": {"key": ["id"], "fields": {"id": "int", "name": "str"}},
    },
    "endpoint_def": [
        {
            **ROW,
            "endpoint_name": "search",
            "endpoint_usage_code": "SEARCH",
            "http_method_code": "POST",
            "path_template": "/idx/_search",
            "default_body_payload": {"query": {"match_all": {}}, "sort": ["_doc"]},
            "request_content_type": "application/json",
            "response_format_code": "JSON",
        },
        {
            **ROW,
            "endpoint_name": "items",
            "endpoint_usage_code": "DETAIL",
            "http_method_code": "POST",
            "path_template": "/items/_mget",
            "response_format_code": "XML",
        },
    ],
    "pagination_cfg": [
        {
            **ROW,
            "pagination_mode_code": "SCROLL",
            "paging_params_in_code": "BODY",
            "page_size_value": 500,
            "scroll_path_template": "/_search/scroll",
            "scroll_keep_alive_value": "2m",
            "scroll_keep_alive_param_name": "scroll",
            "scroll_id_jsonpath": "$._scroll_id",
            "scroll_id_param_name": "scroll_id",
            "scroll_release_path_template": "/_search/scroll",
            "records_jsonpath": "$.hits.hits",
            "total_count_jsonpath": "$.hits.total.value",
            "record_key_jsonpath": "$._id",
        }
    ],
    "batching_cfg": [
        {
            **ROW,
            "detail_batch_size": 50,
            "request_template_json": {"body": {"ids": "{ids_json}"}},
            "detail_id_jsonpath": "$._id",
            "detail_records_jsonpath": "./docs/doc",
        }
    ],
}


def with_(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(FILE)
    change(doc)
    return doc


def refused(reg: Any, key_file: str, doc: dict[str, Any]) -> str:
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="shop.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    with reg.connect() as conn:
        assert conn.execute(select(RegProvenance.__table__)).first() is None
    return e.value.message


def test_a_file_using_every_request_mode_imports_resolves_and_round_trips(reg, key_file):
    import_yaml(reg, yaml.safe_dump(FILE), key_file)
    with reg.connect() as conn:
        c = resolve_contract(conn, "shop", "harvest")
    pg, bt = c.pagination or {}, c.batching or {}
    assert (pg["pagination_mode_code"], pg["scroll_keep_alive_value"]) == ("SCROLL", "2m")
    assert pg["paging_params_in_code"] == "BODY"
    assert bt["request_template_json"] == {"body": {"ids": "{ids_json}"}}
    assert bt["detail_records_jsonpath"] == "./docs/doc"
    assert (c.endpoint or {})["default_body_payload"]["sort"] == ["_doc"]
    assert c.endpoints["DETAIL"]["response_format_code"] == "XML"
    again = import_yaml(reg, export_yaml(reg, "shop"), key_file)
    assert again.created == [] and again.updated == []


def _set(section: str, i: int, **cols: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        doc[section][i].update(cols)
        for k in [k for k, v in cols.items() if v is None]:
            doc[section][i].pop(k)

    return change


CASES = [
    (
        _set("pagination_cfg", 0, scroll_path_template=None),
        "pagination_cfg[0]: SCROLL paging needs scroll_path_template",
    ),
    (
        _set("pagination_cfg", 0, pagination_mode_code="CURSOR"),
        "scroll_path_template is for SCROLL paging, not CURSOR",
    ),
    (
        _set("pagination_cfg", 0, scroll_path_template="_search/scroll"),
        "scroll_path_template is a path after the base URL, starting with '/'",
    ),
    (
        _set(
            "pagination_cfg",
            0,
            pagination_mode_code="LINK_HEADER",
            scroll_path_template=None,
            scroll_keep_alive_value=None,
            scroll_keep_alive_param_name=None,
            scroll_id_jsonpath=None,
            scroll_id_param_name=None,
            scroll_release_path_template=None,
        ),
        "LINK_HEADER paging follows the next URL: its parameters are in the query",
    ),
    (
        _set("pagination_cfg", 0, paging_params_in_code="HEADER"),
        "pagination_cfg[0].paging_params_in_code: must be one of QUERY, BODY",
    ),
    (
        _set("endpoint_def", 0, http_method_code="GET"),
        "endpoint_def[0]: default_body_payload is for a POST search (http_method_code is GET)",
    ),
    (
        _set(
            "endpoint_def",
            0,
            http_method_code="GET",
            default_body_payload=None,
            request_content_type=None,
        ),
        "endpoint_def[0] with pagination_cfg[0]: paging_params_in_code BODY needs a POST search",
    ),
    (
        _set("endpoint_def", 0, request_content_type="application/x-www-form-urlencoded"),
        "default_body_payload.query: a form body (application/x-www-form-urlencoded) holds text",
    ),
    (
        _set("endpoint_def", 0, request_content_type="text/plain"),
        "endpoint_def[0].request_content_type: must be one of application/json, "
        "application/x-www-form-urlencoded",
    ),
    (
        _set("endpoint_def", 0, response_format_code="YAML"),
        "endpoint_def[0].response_format_code: must be one of JSON, XML (got 'YAML')",
    ),
    (
        _set("endpoint_def", 0, endpoint_usage_code="LIST"),
        "endpoint_def[0].endpoint_usage_code: must be one of SEARCH, DETAIL, TOKEN",
    ),
    (
        _set("endpoint_def", 0, response_format_code="XML"),
        "records_jsonpath '$.hits.hits': the SEARCH endpoint answers XML, so it is an XML path",
    ),
    (
        _set("pagination_cfg", 0, records_jsonpath="./hits/hit"),
        "the answer's paths are all JSONPaths ($...) or all XML paths (./...)",
    ),
    (
        _set("pagination_cfg", 0, records_jsonpath="./hits[", total_count_jsonpath=None),
        "pagination_cfg[0].records_jsonpath: not an XML path",
    ),
    (
        _set("pagination_cfg", 0, record_key_jsonpath="./@id"),
        "record_key_jsonpath is a JSONPath into a record",
    ),
    (
        _set("batching_cfg", 0, detail_records_jsonpath="$.docs"),
        "detail_records_jsonpath '$.docs': the DETAIL endpoint's answer needs an XML path",
    ),
    (
        _set("batching_cfg", 0, request_template_json={"query": {"ids": "{ids}"}}),
        "request_template_json.query: unknown key (it holds params and body)",
    ),
    (
        _set("batching_cfg", 0, request_template_json={"params": {"ids": "all"}}),
        "request_template_json names no ids",
    ),
    (
        _set("batching_cfg", 0, request_template_json={"params": {"id": "{id}"}}),
        "{id} is one id: set detail_batch_size to 1",
    ),
    (
        lambda d: [
            _set("batching_cfg", 0, detail_id_jsonpath=None)(d),
            _set("pagination_cfg", 0, record_key_jsonpath=None)(d),
        ],
        "a DETAIL endpoint fetches the search's records by id: name where the id is",
    ),
    (
        _set("endpoint_def", 1, http_method_code="GET"),
        "request_template_json.body is sent only by POST",
    ),
    (
        lambda d: d["endpoint_def"].pop(1),
        "batching_cfg: its settings are read by DETAIL requests, and the file has no DETAIL",
    ),
]


@pytest.mark.parametrize("change, needle", CASES)
def test_a_combination_that_cannot_work_is_refused_with_its_reason(reg, key_file, change, needle):
    message = refused(reg, key_file, with_(change))
    assert needle in message, message


def test_rows_that_never_meet_are_not_checked_together(reg, key_file):
    # A GET search row for the update task only, paged by a QUERY row for update: the
    # SOURCE scroll row with BODY paging never pairs with it.
    def change(doc: dict[str, Any]) -> None:
        doc["endpoint_def"].append(
            {
                "scope_code": "TASK",
                "task_type": "update",
                "effective_from": FROM,
                "endpoint_name": "search",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/recent",
            }
        )
        doc["pagination_cfg"].append(
            {
                "scope_code": "TASK",
                "task_type": "update",
                "effective_from": FROM,
                "pagination_mode_code": "PAGE_NUMBER",
                "record_key_jsonpath": "$._id",
            }
        )
        doc["pagination_cfg"][0].update(scope_code="TASK", task_type="harvest")
        doc["endpoint_def"][0].update(scope_code="TASK", task_type="harvest")

    import_yaml(reg, yaml.safe_dump(with_(change)), key_file)


def test_the_pubmed_family_refuses_the_fields_its_source_does_not_read(reg, key_file):
    doc = yaml.safe_load((ROOT / "infra" / "registry" / "pubmed.yaml").read_text())
    doc["batching_cfg"][0]["request_template_json"] = {"params": {"id": "{ids}"}}
    doc["endpoint_def"][1]["response_format_code"] = "JSON"
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="pubmed.yaml")
    message = e.value.message
    assert "batching_cfg[0].request_template_json: not read by the PUBMED family" in message
    assert "endpoint_def[1].response_format_code: the PUBMED family reads its DETAIL" in message
