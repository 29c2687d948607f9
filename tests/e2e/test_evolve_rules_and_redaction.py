"""A model that evolves and a quarantine that redacts, end to end through the real API,
worker and Temporal into a real SQLite table (the GitHub-issues source of
tests/e2e/test_quarantine.py):

- an operator's ``schema_contract: evolve`` against records carrying ``_id`` (every
  Elasticsearch hit does) and ``ID`` and ``id``: the drift events report both skipped
  with the reason, the other new fields are added, and the runs after it complete;
- a source that echoes its key in a record set aside: the quarantine shows the record
  redacted, and the replay lands it as it came."""

from __future__ import annotations

import pytest

from tests.conftest import new_task_id
from tests.e2e.test_events import read_sse
from tests.e2e.test_literature import import_doc
from tests.e2e.test_quarantine import (  # noqa: F401  (issues_server: a fixture)
    Source,
    columns,
    doc,
    fixed,
    issues,
    issues_server,
    replay,
    sql_stack,
    start,
    table_rows,
)

REDACTED = "***REDACTED***"


@pytest.fixture
def gh(issues_server) -> Source:  # noqa: F811  (the fixture imported above)
    return Source(*issues_server)


async def test_evolve_skips_names_no_table_can_hold_and_the_next_runs_complete(
    make_stack, gh, tmp_path
):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"e-{gh.ns}"
    records = issues(150)
    for r in records:
        r["_id"] = f"doc-{r['id']}"  # an Elasticsearch hit's
        r["ID"] = r["id"]  # `id` to SQLite
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, schema_contract="evolve")
    assert answer["data"]["status"] == "completed", answer["error"]
    drift = {
        e["field"]: e
        for e in await read_sse(stack.api_url, task_id)
        if e["event"] == "schema_drift"
    }
    assert set(drift) == {"_id", "ID", "node_id", "user"}
    assert drift["_id"]["evolved"] is False
    assert drift["_id"]["skipped"] == (
        "not a valid field name: a name starts with a letter and holds letters, digits, "
        "'_' or '-' (at most 63)"
    )
    assert drift["ID"]["evolved"] is False
    assert drift["ID"]["skipped"].startswith("differs only in case from field 'id'")
    assert drift["node_id"]["evolved"] is True and "skipped" not in drift["node_id"]
    # The next runs start and complete: the model written is one the import takes.
    _, _, again = await start(stack, code)
    assert again["data"]["status"] == "completed", again["error"]
    table = code.replace("-", "_")
    have = columns(lake, table)
    assert {"node_id", "user"} <= have and not {"_id", "ID"} & have
    assert len(table_rows(lake, table)) == 150
    _, _, third = await start(stack, code, schema_contract="evolve")
    assert third["data"]["status"] == "completed", third["error"]


async def test_a_key_the_source_echoes_is_redacted_in_the_quarantine_and_replayed_as_it_came(
    make_stack, gh, tmp_path, monkeypatch
):
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"r-{gh.ns}"
    secret = f"ECHOED-KEY-{new_task_id()}"
    monkeypatch.setenv("ISSUES_KEY", secret)
    records = issues(150)
    records[120]["title"] = f"key {secret} echoed"  # the source echoes its key ...
    records[120]["score"] = "12.5"  # ... in a record set aside (a number as a string)
    gh.serve(records)
    d = doc(code, gh.base)
    d["credential"] = [
        {
            "scope_code": "SOURCE",
            "credential_name": "k",
            "auth_type_code": "API_KEY_QUERY",
            "param_or_header_name": "api_key",
            "secret_env": "ISSUES_KEY",
            "effective_from": "2025-01-01T00:00:00Z",
            "is_default_preferred": True,
        }
    ]
    import_doc(stack, d)
    task_id, _, answer = await start(stack, code)
    assert answer["data"]["stats"]["records_quarantined"] == 1, answer
    listed = (await stack.http.get("/quarantine", params={"task_id": task_id})).json()["data"]
    (item,) = listed["items"]
    shown = await stack.http.get(f"/quarantine/records/{item['id']}")
    assert shown.status_code == 200 and secret not in shown.text
    assert shown.json()["data"]["record"]["title"] == f"key {REDACTED} echoed"
    # The model fixed (numbers written as strings read laxly): the record lands as it came.
    import_doc(stack, fixed(code, gh.base, coerce_types_enabled=True))
    done = await replay(stack, task_id)
    assert (done["result"]["landed"], done["result"]["still_bad"]) == (1, 0)
    by_id = {r["id"]: r for r in table_rows(lake, code.replace("-", "_"))}
    assert by_id[121]["title"] == f"key {secret} echoed" and by_id[121]["score"] == 12.5
