"""A literature run whose frozen contract has no record model dimension goes
on as it began: its family read from its SEARCH path, a source of no paper family paged
as it gives its records, an own model kept."""

from __future__ import annotations

from typing import Any

from artemis.config import Settings
from artemis.literature.harvest import LiteratureHarvest, LiteratureRecord
from artemis.literature.planning import LiteratureParams
from artemis.literature.pubmed import PubMedSource
from artemis.quarantine.judging import Rules, judge
from artemis.sources.rest import RestSource
from artemis.tasks.base import TaskContext
from artemis.tracing import TraceContext, new_span_id, new_trace_id


def earlier_contract(path: str, model: dict[str, Any] | None = None) -> dict[str, Any]:
    provenance = {"id": 1, "provenance_code": "old", "base_url_default": "http://127.0.0.1:9"}
    if model is not None:
        provenance["record_model"] = model
    endpoint = {"path_template": path, "endpoint_usage_code": "SEARCH"}
    detail = {"path_template": "/eutils/efetch.fcgi", "endpoint_usage_code": "DETAIL"}
    return {
        "provenance": provenance,
        "task_type": "harvest",
        "at": "2026-01-01T00:00:00+00:00",
        "usage": "SEARCH",
        "endpoint": endpoint,
        "endpoints": {"SEARCH": endpoint, **({"DETAIL": detail} if "esearch" in path else {})},
        "pagination": None,
        "window_offset": None,
        "http": None,
        "batching": None,
        "retry": None,
        "rate_limit": None,
        "credentials": [],
    }


def ctx(contract: dict[str, Any]) -> TaskContext:
    params = LiteratureParams(provenance="old", contract=contract)
    return TaskContext(
        "literature_harvest",
        "t-1",
        params,
        Settings(),
        TraceContext(new_trace_id(), new_span_id()),
    )


def test_an_earlier_runs_family_comes_from_its_search_path():
    task = LiteratureHarvest()
    [pubmed] = task.build_sources(ctx(earlier_contract("/eutils/esearch.fcgi")))
    assert isinstance(pubmed, PubMedSource)
    [crossref] = task.build_sources(ctx(earlier_contract("/works")))
    assert isinstance(crossref, RestSource) and crossref.transform is not None
    assert crossref.record_key == "$.DOI"
    # a source of no paper family: its records as it gives them
    [own] = task.build_sources(ctx(earlier_contract("/products")))
    assert isinstance(own, RestSource) and own.transform is None and own.record_key is None


def test_an_earlier_runs_own_model_is_kept():
    model = {"key": ["id"], "fields": {"id": "int", "name": "str | None"}}
    task = LiteratureHarvest()
    run = ctx(earlier_contract("/products", model))
    spec = task.record_spec(run.params)
    assert spec is not None and spec.key == ("id",) and spec.model.__name__ == "OldRecord"
    # its records judged by that model: the field it does not name dropped and reported
    judged = judge(task, run, 0, [{"id": 1, "extra": 2}], Rules(task.record_policy(run), spec))
    assert judged.records == [{"id": 1}] and [d.field for d in judged.drift] == ["extra"]
    # without a model, the paper shape
    plain = task.record_spec(ctx(earlier_contract("/works")).params)
    assert plain is not None and plain.model is LiteratureRecord


def test_an_earlier_run_goes_on_with_what_its_build_read():
    # Fields that did nothing for such a contract: none refuses the run mid-way.
    contract = earlier_contract("/products")
    contract["http"] = {
        "base_url_override": "http://127.0.0.1:9/api",
        "prefer_http2": True,
        "proxy_url": "http://user:secret@127.0.0.1:8/",
        "timeout_read_millis": 5000,
    }
    search = contract["endpoint"]
    search.update(is_auth_required=True, default_body_payload={"q": 1}, http_method_code="POST")
    contract["endpoints"]["DETAIL"] = {"path_template": "/x", "endpoint_usage_code": "DETAIL"}
    contract["rate_limit"] = {"qps_limit": 5, "bucket_granularity_code": "PER_KEY"}
    [source] = LiteratureHarvest().build_sources(ctx(contract))
    assert isinstance(source, RestSource) and source.method == "GET" and source.body is None
    assert source.url == "http://127.0.0.1:9/api/products"
