"""A provenance of several resources (docs/registry.md "Resources"), harvested from the
sample code hosting API (artemis_samples/forge.py, written from GitHub's REST docs):
repositories → issues (Link header) → comments (a next URL in the body), one YAML file,
one run, three tables."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from tests.conftest import new_task_id, start_worker_process
from tests.helpers import eventually, stop_processes

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


def sql_and_http(lake: str, samples_url: str) -> dict[str, Any]:
    """The output of a run landing in a SQL database and sent to the sample HTTP sink."""
    return {
        "sinks": ["sql", "http"],
        "sql": {"url": lake},
        "http_endpoint": f"{samples_url}/sink/sources",
    }


async def forge_stack(make_stack, code: str, output: dict[str, Any], **overrides: Any):
    """A stack whose ``source_harvest`` runs go to ``output``, the forge sample reset and
    ``infra/registry/forge.yaml`` imported as provenance ``code``."""
    stack = await make_stack(output_defaults={"source_harvest": output}, **overrides)
    await stack.samples_http.post("/_control/forge", json={"reset": True})
    import_doc(stack.settings, forge_doc(code, f"{stack.samples_url}/forge"))
    return stack


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
    code, lake = "forge1", f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await forge_stack(make_stack, code, sql_and_http(lake, samples.url))
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
    code, lake = "forge2", f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await forge_stack(make_stack, code, {"sinks": ["sql"], "sql": {"url": lake}})
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


async def test_a_worker_killed_among_the_sub_resources_delivers_each_record_once(
    make_stack, samples, tmp_path
) -> None:
    """SIGKILL while comments are being asked (the sample server holds every request after
    the 30th): a fresh worker finishes the run; the HTTP sink next to the SQL one has each
    record of each resource once (by key, and by idempotency key), the tables the source's
    counts, and the source was asked at most the pages in flight twice."""
    from tests.e2e.test_worker_crash import worker_config

    code, lake = "forge3", f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await forge_stack(
        make_stack,
        code,
        sql_and_http(lake, samples.url),
        worker=False,
        runs={"heartbeat_timeout_s": 2.0},
    )
    config = worker_config(stack, tmp_path, worker={"heartbeat_throttle_s": 0.2})
    await stack.samples_http.post("/_control/forge", json={"hang_after": 30, "for_s": 300})
    first = start_worker_process(config, tmp_path / "worker1.out")
    second = None
    task_id = new_task_id()
    try:
        resp = await stack.run(
            {"meta": {"task_id": task_id}, "params": {"provenance": code}},
            code="source_harvest",
            mode="async",
        )
        assert resp.status_code == 202, resp.text

        async def held_after_pages() -> bool:
            state = (await stack.samples_http.get("/_control/forge")).json()
            sent = await stack.sink_batches(f"source_harvest/{task_id}:")
            return bool(state["holding"]) and len(sent) >= 2

        await eventually(held_after_pages, "pages delivered, then requests held", timeout=90)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        await stack.samples_http.post("/_control/forge", json={"hang_after": None})
        second = start_worker_process(config, tmp_path / "worker2.out")
        final = await stack.wait_status(task_id, timeout=120)
        assert final["status"] == "completed", final
    finally:
        await stack.samples_http.post("/_control/forge", json={"hang_after": None})
        stop_processes(first, second)
    repos, issues, comments = expected_tree()
    batches = [
        b for b in await stack.sink_batches(f"source_harvest/{task_id}:") if b["status"] == 200
    ]
    by_key: dict[str, list] = {}
    for b in batches:
        if b["idempotency_key"] in by_key:  # sent again: the same records under its key
            assert by_key[b["idempotency_key"]] == b["records"]
        by_key[b["idempotency_key"]] = b["records"]
    seen = Counter(
        (key.split(":")[1].split("/")[1], r["id"]) for key, rs in by_key.items() for r in rs
    )
    assert set(seen.values()) == {1}
    assert Counter(resource for resource, _ in seen) == {
        "repos": repos,
        "issues": issues,
        "comments": comments,
    }
    with sa.create_engine(lake).connect() as conn:
        for table, n in (("repos", repos), ("issues", issues), ("comments", comments)):
            assert conn.execute(sa.text(f"SELECT COUNT(*) FROM {code}__{table}")).scalar() == n
    asked = Counter((c["path"], c["query"]) for c in await forge_calls(stack))
    twice = [request for request, n in asked.items() if n > 1]
    assert max(asked.values()) <= 2, asked.most_common(3)
    # the pages in flight: a repositories page, an issues page and its issues' comments
    issue_pages = [p for p, _ in twice if p.endswith("/issues")]
    assert len(issue_pages) <= 1, twice
    assert len(twice) <= 2 + 10 * 2, twice


async def test_an_update_asks_the_comments_of_the_changed_issues_only(make_stack, tmp_path):
    """The issues resource takes the window (``since``) and names its own
    ``updated_at``: after three issues change, an update asks the comments of those three
    only (counted at the server), and lands their new comments."""
    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}
    )
    await stack.samples_http.post("/_control/forge", json={"reset": True})
    code = "forge4"
    doc = forge_doc(code, f"{stack.samples_url}/forge")
    doc["window_offset_cfg"] = [
        {
            "scope_code": "SOURCE",
            "effective_from": "2025-01-01T00:00:00Z",
            "resource_name": "issues",
            "window_start_param_name": "since",
            "window_time_format": "%Y-%m-%dT%H:%M:%SZ",
            "watermark_field_name": "updated_at",
        }
    ]
    import_doc(stack.settings, doc)

    async def update(**params: Any) -> dict[str, Any]:
        resp = await stack.run(
            {
                "meta": {"task_id": new_task_id()},
                "params": {"provenance": code, "task_type": "update", **params},
            },
            code="source_harvest",
        )
        data = resp.json()["data"]
        assert resp.status_code == 200 and data["status"] == "completed", resp.text
        return data

    repos, issues, comments = expected_tree()
    first = await update(start="2026-01-01")
    assert first["stats"]["sinks"] == {
        "sql/repos": repos,
        "sql/issues": issues,
        "sql/comments": comments,
    }
    before = len(await forge_calls(stack))
    touched = [3, 7, 12]
    await stack.samples_http.post(
        "/_control/forge", json={"touch": touched, "repo": "acme/rockets"}
    )
    second = await update()
    calls = (await forge_calls(stack))[before:]
    asked = sorted(
        {int(c["path"].split("/")[-2]) for c in calls if c["path"].endswith("/comments")}
    )
    assert asked == touched, calls
    assert second["stats"]["sinks"]["sql/issues"] == 3
    with sa.create_engine(lake).connect() as conn:
        total = conn.execute(sa.text(f"SELECT COUNT(*) FROM {code}__comments")).scalar()
    assert total == comments + len(touched)  # each touched issue got one new comment


async def test_each_resource_quarantines_its_own_records_and_a_replay_lands_them(
    make_stack, tmp_path
) -> None:
    """Issues' model says ``closed_at: datetime`` (not null): the 42 open issues do not
    fit and are set aside under the issues resource (the other resources land whole);
    the model fixed, a replay lands them in the issues folder, once."""
    from artemis.quarantine import store as quarantine

    lake = tmp_path / "lake"
    stack = await make_stack(
        output_defaults={
            "source_harvest": {"sinks": ["files"], "files": {"url": str(lake), "format": "jsonl"}}
        }
    )
    await stack.samples_http.post("/_control/forge", json={"reset": True})
    code = "forge5"

    def doc_with(closed: str) -> dict[str, Any]:
        doc = forge_doc(code, f"{stack.samples_url}/forge")
        model = next(r for r in doc["record_model"] if r["resource_name"] == "issues")
        model["fields_json"] = {**model["fields_json"], "closed_at": closed}
        model["max_bad_records_value"] = "50"
        return doc

    import_doc(stack.settings, doc_with("datetime"))
    task_id = new_task_id()
    resp = await stack.run(
        {"meta": {"task_id": task_id}, "params": {"provenance": code}},
        code="source_harvest",
        mode="async",
    )
    assert resp.status_code == 202, resp.text
    data = await stack.wait_status(task_id, timeout=90)
    assert data["status"] == "completed", data
    repos, issues, comments = expected_tree()
    opened = sum(1 for n in range(1, 31) if n % 6) + sum(1 for n in range(1, 21) if n % 6)
    assert data["stats"]["records_quarantined"] == opened
    assert data["stats"]["sinks"] == {
        "files/repos": repos,
        "files/issues": issues - opened,
        "files/comments": comments,
    }
    rows = quarantine.list_rows(
        stack.settings.database.url, quarantine.RowPage(task_id=task_id, limit=100)
    )
    assert len(rows) == opened
    assert {r["run_key"].rsplit("/", 1)[1] for r in rows} == {"issues"}
    assert {r["field_path"] for r in rows} == {"closed_at"}

    import_doc(stack.settings, doc_with("datetime | None"))
    resp = await stack.http.post("/quarantine/replay", json={"task_id": task_id})
    assert resp.status_code == 202, resp.text
    handle = stack.client.get_workflow_handle(resp.json()["data"]["workflow_id"])
    result = await handle.result()
    assert (result["landed"], result["still_bad"]) == (opened, 0), result
    landed = [
        json.loads(line)["id"]
        for path in (lake / f"{code}__issues").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert len(landed) == len(set(landed)) == issues
