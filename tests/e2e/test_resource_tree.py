"""A provenance of several resources (docs/registry.md "Resources"), harvested from the
sample code hosting API (artemis_samples/forge.py, written from GitHub's REST docs):
repositories → issues (Link header) → comments (a next URL in the body), one YAML file,
one run, three tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from tests.conftest import new_task_id
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
FORGE = ROOT / "infra" / "registry" / "forge.yaml"


def forge_doc(code: str, base: str) -> dict[str, Any]:
    doc = yaml.safe_load(FORGE.read_text())
    doc["provenance"].update(provenance_code=code, base_url_default=base)
    return doc


def import_doc(settings, doc: dict[str, Any]) -> None:
    from artemis.db import get_engine
    from artemis.registry.yaml_io import import_yaml

    import_yaml(
        get_engine(settings.database.url), yaml.safe_dump(doc), settings.vault.master_key_file
    )


async def forge_calls(stack) -> list[dict[str, Any]]:
    return (await stack.samples_http.get("/forge/_calls")).json()


def expected_tree() -> tuple[int, int, int]:
    """The sample's default tree: 3 repositories, 30 + 20 issues (the third answers 404),
    ``n % 5`` comments on issue ``n``."""
    comments = sum(n % 5 for n in range(1, 31)) + sum(n % 5 for n in range(1, 21))
    return 3, 50, comments


async def test_one_file_one_run_three_tables_each_record_once(
    make_stack, samples, tmp_path
) -> None:
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={
            "source_harvest": {
                "sinks": ["sql", "http"],
                "sql": {"url": lake},
                "http_endpoint": f"{samples.url}/sink/sources",
            }
        }
    )
    await stack.samples_http.post("/_control/forge", json={"reset": True})
    code = "forge1"
    import_doc(stack.settings, forge_doc(code, f"{stack.samples_url}/forge"))
    runs = []
    for _ in range(2):  # the second run upserts the same rows
        resp = await stack.run(
            {"meta": {"task_id": new_task_id()}, "params": {"provenance": code}},
            code="source_harvest",
        )
        data = resp.json()["data"]
        assert resp.status_code == 200 and data["status"] == "completed", resp.text
        runs.append(data)
    repos, issues, comments = expected_tree()
    stats = runs[0]["stats"]
    assert stats["sinks"] == {
        "sql/repos": repos,
        "http/repos": repos,
        "sql/issues": issues,
        "http/issues": issues,
        "sql/comments": comments,
        "http/comments": comments,
    }, stats
    assert stats["responses_ignored"] == 1, stats
    # each resource's records, the answers ignored (traps' issues) and the stated totals
    assert stats["resources"] == {
        "repos": {"records": repos, "ignored": 0, "stated": repos},
        "issues": {"records": issues, "ignored": 1, "stated": issues},
        "comments": {"records": comments, "ignored": 0, "stated": comments},
    }, stats["resources"]
    with sa.create_engine(lake).connect() as conn:
        counted = {
            t: conn.execute(sa.text(f"SELECT COUNT(*), MAX(_artemis_task_id) FROM {t}")).one()
            for t in (f"{code}__repos", f"{code}__issues", f"{code}__comments")
        }
        pairs = conn.execute(
            sa.text(
                f"SELECT c.issue_number, c.repo, i.number FROM {code}__comments c "
                f"JOIN {code}__issues i ON i.number = c.issue_number AND i.repo = c.repo"
            )
        ).fetchall()
        repos_of_issues = set(
            conn.execute(sa.text(f"SELECT DISTINCT repo FROM {code}__issues")).scalars()
        )
    second = runs[1]["task_id"]
    assert counted == {
        f"{code}__repos": (repos, second),
        f"{code}__issues": (issues, second),
        f"{code}__comments": (comments, second),
    }
    assert len(pairs) == comments  # every comment joins to its issue
    assert repos_of_issues == {"acme/rockets", "acme/anvils"}
    # the HTTP sink got each record of each resource once per run, by idempotency key
    first = runs[0]["task_id"]
    batches = [
        b for b in await stack.sink_batches(f"source_harvest/{first}:") if b["status"] == 200
    ]
    keys = Counter(b["idempotency_key"] for b in batches)
    assert set(keys.values()) == {1}
    by_resource = Counter(
        b["idempotency_key"].split(":")[1].split("/")[1] for b in batches for _ in b["records"]
    )
    assert by_resource == {"repos": repos, "issues": issues, "comments": comments}


async def test_a_resource_alone_and_its_parents_values(make_stack, tmp_path) -> None:
    """``-p resource=comments -p only=true``: repositories and issues are asked for their
    values, only comments land."""
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}
    )
    await stack.samples_http.post("/_control/forge", json={"reset": True})
    code = "forge2"
    import_doc(stack.settings, forge_doc(code, f"{stack.samples_url}/forge"))
    resp = await stack.run(
        {
            "meta": {"task_id": new_task_id()},
            "params": {"provenance": code, "resource": "comments", "only": True},
        },
        code="source_harvest",
    )
    data = resp.json()["data"]
    assert resp.status_code == 200 and data["status"] == "completed", resp.text
    assert data["stats"]["sinks"] == {"sql": expected_tree()[2]}
    with sa.create_engine(lake).connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert f"{code}__comments" in tables and f"{code}__issues" not in tables

    async def unknown() -> bool:
        bad = await stack.run(
            {
                "meta": {"task_id": new_task_id()},
                "params": {"provenance": code, "resource": "labels"},
            },
            code="source_harvest",
        )
        return bad.status_code == 422 and "labels" in bad.text

    await eventually(unknown, "an unknown resource refused naming it", timeout=30)
