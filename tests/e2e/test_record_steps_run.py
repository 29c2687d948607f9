"""Records shaped in YAML, end to end (docs/resources.md "Shaping records"): a JSON:API
source whose records nest their fields under ``attributes``, shaped by ``map`` and ``add``
steps only, lands in a typed SQLite table through the real API, worker and Temporal; a
``filter`` step and a required value count what they leave out and set aside, and a
replay shapes a record set aside by the steps in force then."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from artemis_samples.server import ThreadedServer
from tests.conftest import new_task_id
from tests.e2e.test_literature import harvest_source, import_doc
from tests.e2e.test_quarantine import replay

ROW = {"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z"}
ARTICLES = 5


def article(i: int) -> dict[str, Any]:
    """A JSON:API resource object: its fields under ``attributes``."""
    return {
        "id": str(i),
        "type": "articles",
        "attributes": {
            "title": f"Article {i}",
            "published": f"2025-02-{i:02d}",
            "words": 250 * i,
            "rating": i / 2,
            "featured": i % 2 == 0,
            "status": "draft" if i == 2 else "published",
        },
        "links": {"self": f"/articles/{i}"},
    }


def jsonapi_app() -> FastAPI:
    """``GET /{ns}/articles?page[size]=N&page[number]=M``, JSON:API's document: the records
    in ``data``, the next page's link in ``links.next`` (none on the last page).
    Namespace ``untitled`` leaves the title out of article 4."""
    app = FastAPI()

    @app.get("/{ns}/articles")
    async def articles(ns: str, request: Request) -> JSONResponse:
        size = int(request.query_params.get("page[size]", "2"))
        number = int(request.query_params.get("page[number]", "1"))
        ids = range((number - 1) * size + 1, min(number * size, ARTICLES) + 1)
        data = [article(i) for i in ids]
        if ns.startswith("untitled"):
            for one in data:
                if one["id"] == "4":
                    del one["attributes"]["title"]
        links: dict[str, Any] = {"self": str(request.url)}
        if number * size < ARTICLES:
            links["next"] = f"/{ns}/articles?page[number]={number + 1}&page[size]={size}"
        body = {"data": data, "links": links, "meta": {"total": ARTICLES}}
        return JSONResponse(body, media_type="application/vnd.api+json")

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    running = ThreadedServer(jsonapi_app()).start()
    yield running
    running.stop()


FIELDS = {
    "id": "str",
    "title": "str",
    "published": "date",
    "words": "int",
    "rating": "float | None",
    "featured": "bool",
    "source": "str",
    "kind": "str",
    "harvested_from": "datetime",
}
# `map` and `add` only: the fields out of `attributes`, and three of the run's own.
SHAPE = [
    {"map": {"from": "$.attributes.title", "to": "title"}},
    {"map": {"from": "$.attributes.published", "to": "published"}},
    {"map": {"from": "$.attributes.words", "to": "words"}},
    {"map": {"from": "$.attributes.rating", "to": "rating"}},
    {"map": {"from": "$.attributes.featured", "to": "featured"}},
    {"add": {"to": "source", "from": "provenance"}},
    {"add": {"to": "kind", "value": "article"}},
    {"add": {"to": "harvested_from", "from": "window_start"}},
]


def articles_doc(
    code: str, base: str, steps: list[dict[str, Any]], fields: dict[str, str] = FIELDS
) -> dict[str, Any]:
    return {
        "provenance": {"provenance_code": code, "base_url_default": base},
        "endpoint_def": [
            {
                **ROW,
                "endpoint_name": "articles",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/articles",
            }
        ],
        "pagination_cfg": [
            {
                **ROW,
                "pagination_mode_code": "NEXT_URL",
                "next_url_jsonpath": "$.links.next",
                "page_size_param_name": "page[size]",
                "page_size_value": 2,
                "records_jsonpath": "$.data",
                "total_count_jsonpath": "$.meta.total",
            }
        ],
        "record_model": [
            {**ROW, "key_json": ["id"], "fields_json": fields, "record_steps_json": steps}
        ],
    }


async def run_articles(make_stack, tmp_path, doc: dict[str, Any], **overrides: Any):
    """A source_harvest run of ``doc``'s articles from 2025-01-01 into a SQLite table: the
    stack, the run's data, the lake's URL and the table."""
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}},
        **overrides,
    )
    code = doc["provenance"]["provenance_code"]
    import_doc(stack, doc)
    resp = await harvest_source(stack, new_task_id(), provenance=code, start="2025-01-01")
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    return stack, data, lake, code.replace("-", "_")


async def test_map_and_add_steps_land_nested_records_in_a_typed_table(make_stack, tmp_path, server):
    ns = f"n{uuid.uuid4().hex[:10]}"
    doc = articles_doc(f"articles-{ns}", f"{server.url}/{ns}", SHAPE)
    _, data, lake, table = await run_articles(make_stack, tmp_path, doc)
    stats = data["stats"]
    assert stats["records_fetched"] == stats["records_emitted"] == ARTICLES, stats
    assert stats["records_quarantined"] == stats["records_filtered"] == 0, stats
    # What no step maps (`type`, `attributes`, `links`) is dropped by the model, and told.
    assert stats["fields_dropped"] == 3 * ARTICLES, stats
    engine = sa.create_engine(lake)
    columns = {c["name"]: c for c in sa.inspect(engine).get_columns(table)}
    kinds = {name: type(c["type"]).__name__ for name, c in columns.items() if name in FIELDS}
    assert kinds == {
        "id": "TEXT",
        "title": "TEXT",
        "published": "DATE",
        "words": "BIGINT",
        "rating": "DOUBLE",
        "featured": "BOOLEAN",
        "source": "TEXT",
        "kind": "TEXT",
        "harvested_from": "DATETIME",
    }, kinds
    assert columns["rating"]["nullable"] and not columns["title"]["nullable"]
    t = sa.Table(table, sa.MetaData(), autoload_with=engine)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*(t.c[n] for n in FIELDS)).order_by(t.c.id)).all()
    assert len(rows) == ARTICLES
    assert tuple(rows[3]) == (
        "4",
        "Article 4",
        date(2025, 2, 4),
        1000,
        2.0,
        True,
        f"articles-{ns}",
        "article",
        datetime(2025, 1, 1, tzinfo=UTC).replace(tzinfo=None),
    )
    assert [r.featured for r in rows] == [False, True, False, True, False]


async def test_a_filtered_record_is_counted_and_one_set_aside_is_shaped_again_on_replay(
    make_stack, tmp_path, server
):
    ns = f"untitled{uuid.uuid4().hex[:10]}"
    code, base = f"articles-{ns}", f"{server.url}/{ns}"
    fields = {**FIELDS, "title": "str | None"}
    rest = [
        *SHAPE[1:],
        {"filter": {"path": "$.attributes.status", "equals": "published"}},
        {"drop": ["type", "attributes", "links"]},
    ]
    # A title is required of the records by the steps (the model would take none).
    steps = [{"map": {**SHAPE[0]["map"], "required": True}}, *rest]
    doc = articles_doc(code, base, steps, fields)
    # (pages processed in their own step: the count's other way to the run's stats than
    # the first test's, whose pages are emitted while fetching)
    stack, data, lake, table = await run_articles(
        make_stack, tmp_path, doc, runs={"emit_while_fetching": False}
    )
    stats = data["stats"]
    # 1 and 3 and 5 land; 2 is a draft, left out; 4 has no title, set aside.
    assert stats["records_fetched"] == ARTICLES and stats["records_emitted"] == 3, stats
    assert stats["records_filtered"] == 1 and stats["records_quarantined"] == 1, stats
    assert stats["fields_dropped"] == 0, stats
    assert landed(lake, table) == {"1": "Article 1", "3": "Article 3", "5": "Article 5"}
    listed = await stack.http.get("/quarantine", params={"task_id": data["task_id"]})
    (row,) = listed.json()["data"]["items"]
    assert row["message"] == (
        "record_steps_json[0] (map $.attributes.title → title): nothing at path $.attributes.title"
    )
    assert (row["field_path"], row["stage"]) == ("title", "process")
    # Set aside as the source gave it: the replay shapes it by the steps in force then.
    import_doc(stack, articles_doc(code, base, [SHAPE[0], *rest], fields))
    done = await replay(stack, data["task_id"])
    assert (done["result"]["landed"], done["result"]["still_bad"]) == (1, 0), done
    assert landed(lake, table)["4"] is None


def landed(lake: str, table: str) -> dict[str, Any]:
    with sa.create_engine(lake).connect() as conn:
        return dict(conn.execute(sa.text(f"SELECT id, title FROM {table}")).all())
