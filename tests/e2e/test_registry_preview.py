"""``artemis registry preview`` and ``POST /registry/preview`` against a JSON API written
for this test: a library of books paged by cursor behind an API key, each book with a
nested author, dates, nullable and absent fields and a list of tags, and each book's
reviews as a sub-resource. The preview prints two pages and a drafted model; the model
pasted into the file, imported and harvested lands every book, none set aside."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse

from artemis.errors import ArtemisError
from artemis_samples.server import ThreadedServer
from tests.conftest import ROOT, new_task_id, write_config
from tests.e2e.test_literature import import_doc

KEY_ENV = "LIBRARY_PREVIEW_KEY"
KEY = "library-key-5f1d0c9a7e"
FROM = "2025-01-01T00:00:00Z"
TOKENS = {"cli": "client-token-preview-0123", "ops": "operator-token-preview-0123"}

# Seven books, three a page: every type a model can hold, some values null or absent.
BOOKS: list[dict[str, Any]] = [
    {
        "id": 101,
        "title": "The Left Hand of Darkness",
        "subtitle": None,
        "author": {"name": "Ursula K. Le Guin", "born": "1929-10-21"},
        "published": "1969-03-01",
        "updated_at": "2024-05-01T10:00:00Z",
        "price": 12,
        "available": True,
        "tags": ["sf", "classic"],
        "rating": 4.5,
    },
    {
        "id": 102,
        "title": "Solaris",
        "author": {"name": "Stanisław Lem", "born": None},
        "published": "1961-06-01",
        "updated_at": "2024-05-02T11:30:00+02:00",
        "price": 9.5,
        "available": False,
        "tags": [],
        "rating": None,
    },
    {
        "id": 103,
        "title": "Kindred",
        "subtitle": "A novel",
        "author": {"name": "Octavia E. Butler", "born": "1947-06-22"},
        "published": "1979-06-01",
        "updated_at": "2024-05-03T09:15:00Z",
        "price": 14.25,
        "available": True,
        "tags": ["sf"],
        "rating": 4.8,
    },
    {
        "id": 104,
        "title": "Roadside Picnic",
        "subtitle": None,
        "author": {"name": "Arkady and Boris Strugatsky", "born": None},
        "published": "1972-01-01",
        "updated_at": "2024-05-04T08:00:00Z",
        "price": 11,
        "available": True,
        "tags": ["sf", "translated"],
        "rating": 4.2,
    },
    {
        "id": 105,
        "title": "The Dispossessed",
        "author": {"name": "Ursula K. Le Guin", "born": "1929-10-21"},
        "published": "1974-05-01",
        "updated_at": "2024-05-05T12:00:00Z",
        "price": 13.5,
        "available": False,
        "tags": ["sf", "utopia"],
        "rating": 4.6,
    },
    {
        "id": 106,
        "title": "Parable of the Sower",
        "subtitle": "Earthseed",
        "author": {"name": "Octavia E. Butler", "born": "1947-06-22"},
        "published": "1993-10-01",
        "updated_at": "2024-05-06T16:45:00Z",
        "price": 10,
        "available": True,
        "tags": [],
        "rating": None,
    },
    {
        "id": 107,
        "title": "Hyperion",
        "subtitle": None,
        "author": {"name": "Dan Simmons", "born": "1948-04-04"},
        "published": "1989-05-26",
        "updated_at": "2024-05-07T07:20:00Z",
        "price": 15.75,
        "available": True,
        "tags": ["sf", "space opera"],
        "rating": 4.4,
    },
]


def library_app() -> FastAPI:
    app = FastAPI()

    def refused(key: str | None) -> JSONResponse | None:
        if key != KEY:
            return JSONResponse({"error": "an API key is required"}, status_code=401)
        return None

    @app.get("/v1/books")
    async def books(
        limit: int = 3, cursor: str | None = None, x_library_key: str | None = Header(None)
    ) -> JSONResponse:
        if (no := refused(x_library_key)) is not None:
            return no
        start = int(cursor or 0)
        chunk = BOOKS[start : start + limit]
        nxt = str(start + limit) if start + limit < len(BOOKS) else None
        return JSONResponse({"data": chunk, "meta": {"total": len(BOOKS), "next": nxt}})

    @app.get("/v1/books/{book}/reviews")
    async def reviews(book: int, x_library_key: str | None = Header(None)) -> JSONResponse:
        if (no := refused(x_library_key)) is not None:
            return no
        found = [
            {"id": f"r-{book}-{n}", "stars": 3 + n % 3, "text": f"Review {n} of {book}."}
            for n in range(1, 4)
        ]
        return JSONResponse({"reviews": found})

    return app


@pytest.fixture(scope="module")
def library() -> Iterator[str]:
    server = ThreadedServer(library_app()).start()
    yield f"{server.url}/v1"
    server.stop()


@pytest.fixture
def key_env(monkeypatch) -> None:
    # The import (and a file's preview) reads the credential's secret from here.
    monkeypatch.setenv(KEY_ENV, KEY)


def _row(**values: Any) -> dict[str, Any]:
    return {"scope_code": "SOURCE", "effective_from": FROM, **values}


def library_doc(code: str, base: str) -> dict[str, Any]:
    """A registry file of the library's books: no record model yet."""
    return {
        "provenance": {"provenance_code": code, "base_url_default": base},
        "endpoint_def": [
            _row(endpoint_name="books", endpoint_usage_code="SEARCH", path_template="/books")
        ],
        "pagination_cfg": [
            _row(
                pagination_mode_code="CURSOR",
                cursor_param_name="cursor",
                next_cursor_jsonpath="$.meta.next",
                page_size_param_name="limit",
                page_size_value=3,
                records_jsonpath="$.data",
                total_count_jsonpath="$.meta.total",
            )
        ],
        "credential": [
            _row(
                credential_name="library",
                auth_type_code="API_KEY_HEADER",
                param_or_header_name="X-Library-Key",
                secret_env=KEY_ENV,
            )
        ],
    }


def tree_doc(code: str, base: str) -> dict[str, Any]:
    """The library as two resources: books, and each book's reviews."""
    doc = library_doc(code, base)
    doc["endpoint_def"] = [
        {**doc["endpoint_def"][0], "resource_name": "books"},
        _row(
            resource_name="reviews",
            parent_resource_name="books",
            endpoint_name="reviews",
            endpoint_usage_code="SEARCH",
            path_template="/books/{parent.id}/reviews",
            include_from_parent_json={"id": "book_id"},
        ),
    ]
    doc["pagination_cfg"] = [
        {**doc["pagination_cfg"][0], "resource_name": "books"},
        _row(resource_name="reviews", pagination_mode_code="SINGLE", records_jsonpath="$.reviews"),
    ]
    return doc


def preview_cli(config: Path, *args: str) -> str:
    """``artemis registry preview ARGS`` as a user runs it; its output."""
    out = subprocess.run(
        [sys.executable, "-m", "starter.cli", "registry", "preview", *args, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, KEY_ENV: KEY},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


DRAFTED_FIELDS = {
    "id": "int",
    "title": "str",
    "subtitle": "str | None",
    "author": {"name": "str", "born": "date | None"},
    "published": "date",
    "updated_at": "datetime",
    "price": "float",
    "available": "bool",
    "tags": "list[str]",
    "rating": "float | None",
}


async def test_a_files_preview_drafts_a_model_that_lands_every_record(
    make_stack, library, key_env, tmp_path
) -> None:
    from starter.cli.preview import run_preview

    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}
    )
    code = f"library-{new_task_id()[2:10]}"
    file = tmp_path / "library.yaml"
    file.write_text(yaml.safe_dump(library_doc(code, library), sort_keys=False))
    config = write_config(tmp_path / "config.yaml", stack.settings)

    # As printed: the two requests, the paging, the records and the drafted model.
    printed = await asyncio.to_thread(preview_cli, config, str(file))
    assert f"GET {library}/books?limit=3  → 200" in printed, printed
    assert f"GET {library}/books?cursor=3&limit=3  → 200" in printed, printed
    assert "paging goes on: " in printed and "a run asks next: GET " in printed, printed
    assert "pages: 2, records: 6, stated total: 7" in printed, printed
    assert "Roadside Picnic" in printed and "record_model:" in printed, printed
    assert KEY not in printed  # the credential went with the requests, never shown

    # As JSON: nothing in the registry, the records and what a model would make of them.
    report = await asyncio.to_thread(run_preview, stack.settings, str(file), None, 2)
    assert [c["status"] for c in report["requests"]] == [200, 200]
    assert [p["records"] for p in report["pages"]] == [3, 3]
    assert report["paging"]["goes_on"] and report["stated_total"] == 7
    assert [r["id"] for r in report["records"]] == [101, 102, 103, 104, 105, 106]
    assert report["model"] is None and report["set_aside"] == []
    assert report["drafted_model"]["key"] == ["id"], report["drafted_model"]
    assert report["drafted_model"]["fields"] == DRAFTED_FIELDS, report["drafted_model"]
    with pytest.raises(ArtemisError, match="unknown provenance"):
        await asyncio.to_thread(run_preview, stack.settings, code, None, 2)

    await _a_model_that_does_not_fit(stack, code, library, tmp_path)

    # The model pasted into the file, imported, harvested: every book lands, none aside.
    doc = yaml.safe_load(file.read_text())
    doc.update(yaml.safe_load(report["drafted_yaml"]))
    import_doc(stack, doc)
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"provenance": code}}, code="source_harvest"
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    assert data["stats"]["records_quarantined"] == 0, data["stats"]
    table = code.replace("-", "_")
    with sa.create_engine(lake).connect() as conn:
        rows = conn.execute(sa.text(f"SELECT id, author, published FROM {table} ORDER BY id")).all()
    assert [r.id for r in rows] == [b["id"] for b in BOOKS]
    assert json.loads(rows[1].author) == {"name": "Stanisław Lem", "born": None}

    # Previewed again by its code: the model in force sets nothing aside, names every field.
    again = await asyncio.to_thread(run_preview, stack.settings, code, None, 1)
    assert again["model"]["key"] == ["id"] and again["set_aside"] == []
    assert again["not_named"] == [] and again["source"] == "registry"


async def _a_model_that_does_not_fit(stack, code: str, library: str, tmp_path: Path) -> None:
    """The records a model would set aside and the fields it leaves out, judged as a run
    judges them, and what the row's policy would make of them."""
    from starter.cli.preview import run_preview

    wrong = tmp_path / "wrong.yaml"
    strict = _row(
        key_json=["id"],
        fields_json={"id": "int", "title": "str", "price": "int"},
        schema_contract_code="FREEZE",
    )
    wrong.write_text(yaml.safe_dump({**library_doc(code, library), "record_model": [strict]}))
    judged = await asyncio.to_thread(run_preview, stack.settings, str(wrong), None, 1)
    assert [(b["key"], b["field"]) for b in judged["set_aside"]] == [
        ({"id": 102}, "price"),
        ({"id": 103}, "price"),
    ], judged["set_aside"]
    assert "column 'price'" in judged["set_aside"][0]["reason"]
    assert [d["field"] for d in judged["not_named"]] == sorted(
        set(DRAFTED_FIELDS) - set(strict["fields_json"])
    )
    assert judged["stops"] == ["schema_contract is FREEZE: field 'author' fails the run"]
    # the drafted row takes the place of the one in force, with its policy
    row = yaml.safe_load(judged["drafted_yaml"])["record_model"][0]
    assert row["effective_from"] == FROM and row["schema_contract_code"] == "FREEZE"


async def test_the_api_previews_a_sub_resource_for_an_operator_only(
    make_stack, library, key_env
) -> None:
    stack = await make_stack(
        worker=False,
        server={
            "api_tokens": [
                {"name": "cli", "token": TOKENS["cli"], "role": "client"},
                {"name": "ops", "token": TOKENS["ops"], "role": "operator"},
            ]
        },
    )
    code = f"shelf-{new_task_id()[2:10]}"
    import_doc(stack, tree_doc(code, library))
    body = {"provenance": code, "resource": "reviews"}
    ops = {"Authorization": f"Bearer {TOKENS['ops']}"}

    resp = await stack.http.post("/registry/preview", json=body, headers=ops)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    # The parent's first page is asked, and its first book's reviews.
    assert [(c["resource"], c["request"]) for c in data["requests"]] == [
        ("books", f"GET {library}/books?limit=3"),
        ("reviews", f"GET {library}/books/101/reviews"),
    ]
    assert data["parent"]["resource"] == "books" and data["parent"]["record"]["id"] == 101
    assert [r["book_id"] for r in data["records"]] == [101, 101, 101]
    assert data["paging"] == {
        "goes_on": False,
        "next_request": None,
        "why": "one request (SINGLE): the answer holds every record",
    }
    drafted = yaml.safe_load(data["drafted_yaml"])["record_model"][0]
    assert drafted["resource_name"] == "reviews" and drafted["key_json"] == ["id"]
    assert drafted["fields_json"] == {"id": "str", "stars": "int", "text": "str", "book_id": "int"}

    # A client token may not send the operator's credentials anywhere.
    client = {"Authorization": f"Bearer {TOKENS['cli']}"}
    resp = await stack.http.post("/registry/preview", json=body, headers=client)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "FORBIDDEN", resp.text
    # A file is never posted: only an imported provenance is previewed.
    resp = await stack.http.post(
        "/registry/preview", json={**body, "file": "provenance: {}"}, headers=ops
    )
    assert resp.status_code == 422, resp.text

    # A provenance whose URL the request checks refuse is not asked at all.
    inner = f"inner-{new_task_id()[2:10]}"
    import_doc(stack, library_doc(inner, "http://169.254.169.254/latest"))
    resp = await stack.http.post("/registry/preview", json={"provenance": inner}, headers=ops)
    error = resp.json()["error"]
    assert resp.status_code == 422 and error["code"] == "INVALID_INPUT", resp.text
    assert "provenance base URL" in error["message"] and "169.254.169.254" in error["message"]
