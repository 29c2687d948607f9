"""The quarantine loop after the most common model fix, on SQLite and PostgreSQL: records
set aside because a field the model required came null; the field turned `| None` and
the file imported again; the replay lands them, the table's column taking nulls from
then on (artemis/sinks/sql.py ``_allow_nulls``), its rows and key kept."""

from __future__ import annotations

import sqlalchemy as sa

from artemis import quarantine
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
