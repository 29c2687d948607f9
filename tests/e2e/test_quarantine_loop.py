# ruff: noqa: F811  (gh, issues_server, lake_url: fixtures imported from their modules)
"""The quarantine loop after the most common model fix, on SQLite and PostgreSQL: records
set aside because a field the model required came null; the field turned `| None` and
the file imported again; the replay lands them, the table's column taking nulls from
then on (artemis/sinks/sql.py ``_allow_nulls``), its rows and key kept."""

from __future__ import annotations

import time

import sqlalchemy as sa

from artemis.quarantine import store as quarantine
from tests.e2e.test_literature import import_doc
from tests.e2e.test_quarantine import (  # noqa: F401  (gh, issues_server: fixtures)
    MODEL,
    doc,
    fixed,
    gh,
    issues,
    issues_server,
    replay,
    start,
    table_rows,
)
from tests.e2e.test_source_harvest import lake_url  # noqa: F401  (a fixture)


async def test_a_field_turned_nullable_lands_its_records_on_replay(
    make_stack,
    gh,
    lake_url,  # noqa: F811
):
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake_url}}}
    )
    code = f"nullable-{gh.ns}"
    records = issues(200)
    for i in (3, 50, 51, 120, 199):
        records[i]["title"] = None
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, max_bad_records=10)
    stats = answer["data"]["stats"]
    assert (stats["records_emitted"], stats["records_quarantined"]) == (195, 5), stats
    table = code.replace("-", "_")

    def title_nullable() -> bool:
        with sa.create_engine(lake_url).connect() as conn:
            cols = {c["name"]: c for c in sa.inspect(conn).get_columns(table)}
        return bool(cols["title"]["nullable"])

    assert not title_nullable()

    fields = {**MODEL["fields"], "title": "str | None"}
    import_doc(stack, fixed(code, gh.base, fields_json=fields))
    done = await replay(stack, task_id)
    assert (done["result"]["landed"], done["result"]["still_bad"]) == (5, 0), done
    assert title_nullable()
    landed = table_rows(lake_url, table)
    assert len(landed) == 200 and len({r["id"] for r in landed}) == 200
    assert sorted(r["id"] for r in landed if r["title"] is None) == [4, 51, 52, 121, 200]
    assert quarantine.counts(stack.settings.database.url, task_id) == {"replayed": 5}
    # The key still holds: a second replay lands nothing twice.
    again = await replay(stack, task_id)
    assert again["result"]["landed"] == 0 and len(table_rows(lake_url, table)) == 200


async def test_a_replay_against_a_table_it_cannot_fit_fails_at_once_naming_the_column(
    make_stack, gh, tmp_path
):
    """A model changed so that the run's table cannot hold its records (a field's type):
    `artemis quarantine replay` returns as soon as the replay's workflow fails, exit 1,
    naming the column and what to do; the rows stay quarantined."""
    from tests.e2e.test_cli_quarantine import cli

    lake = f"sqlite:///{tmp_path / 'lake.db'}"
    stack = await make_stack(
        output_defaults={"source_harvest": {"sinks": ["sql"], "sql": {"url": lake}}}
    )
    code = f"mismatch-{gh.ns}"
    records = issues(20)
    records[7]["title"] = None
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, max_bad_records=5)
    assert answer["data"]["stats"]["records_quarantined"] == 1, answer
    # (the records' updated_at kept as text, which the table's DATETIME column cannot hold)
    fields = {**MODEL["fields"], "title": "str | None", "updated_at": "str"}
    import_doc(stack, fixed(code, gh.base, fields_json=fields))
    began = time.monotonic()
    out = await cli(stack, "replay", task_id, "--timeout", "120")
    took = time.monotonic() - began
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the replay failed: SINK_ERROR" in out.stderr, out.stderr
    assert "column 'updated_at'" in out.stderr and "table of its own" in out.stderr, out.stderr
    # No retry waited out: a replay that retried would take minutes.
    assert took < 60, took
    assert quarantine.counts(stack.settings.database.url, task_id) == {"quarantined": 1}
