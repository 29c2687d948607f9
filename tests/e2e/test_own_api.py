"""Your own JSON API in YAML alone: the README's walk-through "Add your own API in YAML"
run as written, and the end markers and record models it relies on, against the sample
catalogue (``artemis_samples/catalog.py``) on a real server, through real API and worker
processes, into SQLite and Parquet."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml

from artemis.errors import ArtemisError
from tests.conftest import ROOT, new_task_id
from tests.walkthrough import (
    CONFIG,
    DEV_SAMPLES,
    blocks,
    console,
    run_shown,
    run_the_commands,
    walkthrough_folder,
    walkthrough_stack,
)

README = ROOT / "README.md"
CATALOG = ROOT / "infra" / "registry" / "catalog.yaml"
STOCK = ROOT / "infra" / "registry" / "stock.yaml"


def walkthrough() -> str:
    text = README.read_text()
    start = text.index("## Add your own API in YAML\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_walkthroughs_yaml_is_the_bundled_files():
    # the README shows the files the test (and a user) imports and runs with, verbatim
    assert blocks(walkthrough(), "yaml") == [
        CATALOG.read_text(),
        STOCK.read_text(),
        CONFIG.read_text(),
    ]


def test_the_walkthroughs_refusal_is_what_the_import_says():
    from artemis.registry.yaml_io import import_yaml

    # refused before the database is touched: an empty one does
    engine = sa.create_engine("sqlite://")
    doc = yaml.safe_load(CATALOG.read_text())
    doc["provenance"]["record_model"]["fields"]["price"] = "number"
    row = doc["pagination_cfg"][0]
    row["page_param_name"] = row.pop("page_number_param_name")
    row["pagination_mode_code"] = "PAGE"
    with pytest.raises(ArtemisError) as e:
        import_yaml(engine, yaml.safe_dump(doc), "unused.key", source="catalog.yaml")
    assert e.value.message == blocks(walkthrough(), "text")[0].strip()


async def test_the_readme_walkthrough_runs_as_written(
    base_settings, samples, tmp_path: Path
) -> None:
    """The walk-through's commands, in a fresh folder, against real API and worker
    processes started with its configuration (standing in for `artemis dev --config`: the
    suite's Temporal and sample server, so the one substitution is the sample server's
    address in the catalogue's base URL)."""
    section = walkthrough()
    bash = blocks(section, "bash")
    await the_shown_api_answers_as_shown(section, bash[0], samples.url)
    commands = [line for line in bash[1].splitlines() if line.strip()]
    assert commands[0] == "artemis dev --config infra/catalog.config.yaml"
    env, port = walkthrough_folder(tmp_path, base_settings, samples.url, (CATALOG, STOCK))
    async with walkthrough_stack(env, port, tmp_path):
        outputs = run_the_commands(commands[1:], env, tmp_path)
        for out, records in ((outputs[-2], 23), (outputs[-1], 31)):
            ran = re.sub(r"\s+", " ", out)
            assert '"status": "completed"' in ran, out
            assert f'"records_emitted": {records}' in ran, out

        # every record once, as the README shows it
        for command, shown in console(blocks(section, "console")[0]):
            assert run_shown(command, tmp_path) == shown, command

    # the source's own end marker ended paging: page 6 (a 404) was never asked for
    async with httpx.AsyncClient() as http:
        calls = (await http.get(f"{samples.url}/_catalog/calls")).json()
    pages = [c for c in calls if c["path"] == "/catalog/products"]
    assert sorted(int(c["params"]["page"]) for c in pages) == [1, 2, 3, 4, 5]
    # the stock list's own end marker (has_more false at offset 30) ended its paging
    offsets = [c for c in calls if c["path"] == "/catalog/stock"]
    assert sorted(int(c["params"]["offset"]) for c in offsets) == [0, 10, 20, 30]


async def the_shown_api_answers_as_shown(section: str, curl_block: str, samples_url: str) -> None:
    """The walk-through's curl of the sample API answers the JSON it shows (then the
    catalogue's request log starts afresh)."""
    curl = shlex.split(curl_block.strip())
    assert curl[0] == "curl"
    async with httpx.AsyncClient() as http:
        answer = (await http.get(curl[1].replace(DEV_SAMPLES, samples_url))).json()
        await http.post(f"{samples_url}/_control/catalog", json={"reset": True})
    assert answer == json.loads(blocks(section, "json")[0])


def catalog_doc(code: str, base: str, **pagination: Any) -> dict[str, Any]:
    """The walk-through's catalogue file under another code, its paging changed."""
    doc = yaml.safe_load(CATALOG.read_text())
    doc["provenance"].update(provenance_code=code, base_url_default=base)
    doc["pagination_cfg"][0].update(pagination)
    return doc


def import_doc(settings, doc: dict[str, Any]) -> None:
    from artemis.db import get_engine
    from artemis.registry.yaml_io import import_yaml

    # in the order written, as a file is: the record model's fields are its columns, in order
    import_yaml(
        get_engine(settings.database.url),
        yaml.safe_dump(doc, sort_keys=False),
        settings.vault.master_key_file,
    )


async def calls_of(stack, path: str, before: int) -> list[dict[str, Any]]:
    calls = (await stack.samples_http.get("/_catalog/calls")).json()[before:]
    return [c for c in calls if c["path"] == path]


async def _harvest(stack, code: str, doc: dict) -> tuple[dict, int]:
    """Import ``doc``, harvest provenance ``code`` once (completed): the run's answer and
    how many catalogue requests the sample had logged before it."""
    import_doc(stack.settings, doc)
    before = len((await stack.samples_http.get("/_catalog/calls")).json())
    resp = await stack.run(
        {"meta": {"task_id": new_task_id()}, "params": {"provenance": code}},
        code="source_harvest",
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    return data, before


async def test_page_number_paging_ends_on_the_sources_next_page_marker(stack) -> None:
    # No stated total and no short-page rule: only next_page (null on page 5) ends it.
    code = f"catalog-{uuid.uuid4().hex[:6]}"
    doc = catalog_doc(code, f"{stack.samples_url}/catalog", total_count_jsonpath=None)
    data, before = await _harvest(stack, code, doc)
    task_id = data["task_id"]
    calls = await calls_of(stack, "/catalog/products", before)
    assert [int(c["params"]["page"]) for c in calls] == [1, 2, 3, 4, 5]
    batches = await stack.sink_batches(f"source_harvest/{task_id}:")
    records = [r for b in batches if b["status"] == 200 for r in b["records"]]
    assert sorted(r["id"] for r in records) == list(range(1, 24))
    # the records carry the fields of the declared model, nothing else
    assert {frozenset(r) for r in records} == {
        frozenset({"id", "name", "price", "in_stock", "added", "tags"})
    }


async def test_offset_paging_ends_on_has_more_into_sqlite_and_parquet(
    make_stack, tmp_path: Path
) -> None:
    lake_db = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={
            "source_harvest": {
                "sinks": ["sql", "files"],
                "sql": {"url": lake_db, "tables": {"stock-main": "stock"}},
                "files": {"url": str(tmp_path / "lake"), "format": "parquet"},
            }
        }
    )
    code = "stock-main"
    doc = stock_doc(code, f"{stack.samples_url}/catalog")
    data, before = await _harvest(stack, code, doc)
    task_id = data["task_id"]
    assert data["stats"]["sinks"] == {"sql": 31, "files": 31}
    calls = await calls_of(stack, "/catalog/stock", before)
    assert [int(c["params"]["offset"]) for c in calls] == [0, 10, 20, 30]
    with sa.create_engine(lake_db).connect() as conn:
        count, distinct = conn.execute(
            sa.text("SELECT COUNT(*), COUNT(DISTINCT sku) FROM stock")
        ).one()
        table = sa.Table("stock", sa.MetaData(), autoload_with=conn)
    assert (count, distinct) == (31, 31)
    assert [c.name for c in table.primary_key.columns] == ["sku"]
    parquet = pq.read_table(tmp_path / "lake" / code / task_id)
    assert parquet.num_rows == 31 and len(set(parquet["sku"].to_pylist())) == 31
    assert parquet.schema.field("counted_at").type == pa.timestamp("us", tz="UTC")
    assert parquet.schema.field("quantity").type == pa.int64()
    # The columns in the model's order (stock.yaml's), in SQLite and Parquet alike.
    order = list(doc["provenance"]["record_model"]["fields"])
    assert order[:2] == ["sku", "product_id"], order
    assert parquet.schema.names == order
    assert [c.name for c in table.columns][: len(order)] == order


def stock_doc(code: str, base: str) -> dict[str, Any]:
    """A provenance ``code`` of the sample catalogue's stock list at ``base``: offset
    paging that ends on the source's ``has_more`` flag, records keyed by sku."""
    return {
        "provenance": {
            "provenance_code": code,
            "base_url_default": base,
            "record_model": {
                "key": ["sku"],
                "fields": {
                    "sku": "str",
                    "product_id": "int",
                    "quantity": "int",
                    "warehouse": "str",
                    "counted_at": "datetime",
                },
            },
        },
        "endpoint_def": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "endpoint_name": "stock",
                "endpoint_usage_code": "SEARCH",
                "path_template": "/stock",
            }
        ],
        "pagination_cfg": [
            {
                "scope_code": "SOURCE",
                "effective_from": "2025-01-01T00:00:00Z",
                "pagination_mode_code": "OFFSET",
                "page_size_value": 10,
                "records_jsonpath": "$.items",
                "has_more_jsonpath": "$.has_more",
                "record_key_jsonpath": "$.sku",
            }
        ],
    }


async def test_two_apis_of_different_shapes_land_in_their_own_tables_and_folders(
    make_stack, tmp_path: Path
) -> None:
    """The walk-through's two provenances on one stack with one config: each in its own
    SQLite table (by its code, or mapped) and Parquet folder, every record once; a second
    run of each updates the same rows."""
    lake_db = f"sqlite:///{tmp_path / 'lake.db'}"
    own = yaml.safe_load(CONFIG.read_text())["output_defaults"]["source_harvest"]
    stack = await make_stack(
        output_defaults={
            "source_harvest": {
                **own,
                "sql": {**own["sql"], "url": lake_db},
                "files": {**own["files"], "url": str(tmp_path / "lake")},
            }
        }
    )
    base = f"{stack.samples_url}/catalog"
    for path in (CATALOG, STOCK):
        doc = yaml.safe_load(path.read_text())
        doc["provenance"]["base_url_default"] = base
        import_doc(stack.settings, doc)
    runs: dict[str, list[str]] = {"catalog": [], "stock": []}
    for _ in range(2):
        for code in runs:
            resp = await stack.run(
                {"meta": {"task_id": new_task_id()}, "params": {"provenance": code}},
                code="source_harvest",
            )
            data = resp.json()["data"]
            assert resp.status_code == 200 and data["status"] == "completed", resp.text
            runs[code].append(data["task_id"])
    with sa.create_engine(lake_db).connect() as conn:
        products = conn.execute(
            sa.text(
                "SELECT COUNT(*), COUNT(DISTINCT id), MIN(_artemis_task_id), "
                "MAX(_artemis_task_id) FROM products"
            )
        ).one()
        stock = conn.execute(
            sa.text(
                "SELECT COUNT(*), COUNT(DISTINCT sku), MIN(_artemis_task_id), "
                "MAX(_artemis_task_id) FROM stock"
            )
        ).one()
        tables = set(sa.inspect(conn).get_table_names())
        keys = {
            name: sa.Table(name, sa.MetaData(), autoload_with=conn).primary_key.columns.keys()
            for name in ("products", "stock")
        }
    # every record once, each row last written by the second run
    assert tuple(products) == (23, 23, runs["catalog"][1], runs["catalog"][1])
    assert tuple(stock) == (31, 31, runs["stock"][1], runs["stock"][1])
    assert {"products", "stock"} <= tables and "catalog" not in tables
    assert keys == {"products": ["id"], "stock": ["sku"]}
    # each provenance's own folder, one sub-folder per run
    for code, key, count in (("catalog", "id", 23), ("stock", "sku", 31)):
        folders = sorted(p.name for p in (tmp_path / "lake" / code).iterdir())
        assert folders == sorted(runs[code])
        for task_id in runs[code]:
            table = pq.read_table(tmp_path / "lake" / code / task_id)
            assert table.num_rows == count and len(set(table[key].to_pylist())) == count
    assert not (tmp_path / "lake" / "source_harvest").exists()
    # each run is named by its provenance: in its status and in the task list
    for code, ids in runs.items():
        view = (await stack.http.get(f"/tasks/{ids[0]}")).json()["data"]
        assert (view["task_code"], view["provenance"]) == ("source_harvest", code)
    listed = (await stack.http.get("/tasks", params={"code": "source_harvest"})).json()
    by_id = {i["task_id"]: i["provenance"] for i in listed["data"]["items"]}
    assert {by_id[t] for t in runs["stock"]} == {"stock"}
    assert {by_id[t] for t in runs["catalog"]} == {"catalog"}
