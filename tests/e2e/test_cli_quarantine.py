"""`artemis quarantine` against a real stack: a registry source whose records do not all
fit its model, harvested into SQLite; the CLI lists the quarantined records, shows one,
discards one, and replays the rest once the model is fixed, waiting for the replay."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from artemis.quarantine import store as quarantine
from tests.conftest import ROOT, write_config
from tests.e2e.test_literature import import_doc
from tests.e2e.test_quarantine import (  # noqa: F401  (gh, issues_server: fixtures)
    doc,
    fixed,
    gh,
    issues,
    issues_server,
    poison,
    sql_stack,
    start,
    table_rows,
)


def _cli(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "starter.cli", "quarantine", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ARTEMIS_API": stack.api_url, "COLUMNS": "200"},
        cwd=ROOT,
    )


async def cli(stack, *args: str) -> subprocess.CompletedProcess:
    # in a thread: the API under test is served by this event loop
    return await asyncio.to_thread(_cli, stack, *args)


async def cli_json(stack, *args: str) -> Any:
    out = await cli(stack, *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# (gh is the fixture imported above, asked for by name)
async def test_list_show_discard_and_replay_through_the_cli(make_stack, gh, tmp_path):  # noqa: F811
    stack, lake = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = issues(300)
    kinds = poison(records, wrong=3, no_key=1, not_object=1)
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, max_bad_records=10)
    assert answer["data"]["status"] == "completed", answer["error"]
    assert answer["data"]["stats"]["records_quarantined"] == 5
    rows = quarantine.list_rows(stack.settings.database.url, quarantine.RowPage(task_id=task_id))
    by_field = {r["field_path"]: r for r in rows}
    assert len(rows) == 5 and by_field.keys() == {"score", "id", None}

    # list -o json: the API's page as it is
    listed = await cli_json(stack, "list", task_id)
    assert listed["task_id"] == task_id and listed["counts"] == {"quarantined": 5}
    assert [r["id"] for r in listed["items"]] == [r["id"] for r in rows]
    assert all("record" not in r or r["record"] is None for r in listed["items"])

    # list as a table: a line per row, then the counts; --limit pages
    table = await cli(stack, "list", task_id)
    assert table.returncode == 0, table.stderr
    lines = {
        int(m.group(1)): line
        for line in table.stdout.splitlines()
        if (m := re.match(r"\W*(\d+)\s", line))
    }
    assert lines.keys() == {r["id"] for r in rows}
    for r in rows:
        line = lines[r["id"]]
        assert r["error_code"] in line and (r["field_path"] or "") in line
        assert f" {r['page_seq']}/{r['position']} " in line and "quarantined" in line
        assert r["message"].splitlines()[0][:60] in line
    assert f"{task_id}: quarantined 5" in table.stdout
    first = await cli(stack, "list", task_id, "--limit", "2")
    assert f"more: --after {rows[1]['id']}" in first.stdout
    rest = await cli_json(stack, "list", task_id, "--after", str(rows[1]["id"]))
    assert [r["id"] for r in rest["items"]] == [r["id"] for r in rows[2:]]

    # across runs (no task id): by source and error code, the record key a column
    across = await cli_json(stack, "list", "--provenance", code)
    assert across["task_id"] is None and [r["id"] for r in across["items"]] == [
        r["id"] for r in rows
    ]
    assert across["counts"] == {"quarantined": 5}
    bad_score = await cli_json(stack, "list", "--provenance", code, "--code", "RECORD_MODEL")
    assert {r["field_path"] for r in bad_score["items"]} == {"score", "id"}  # not the string
    as_rows = await cli(stack, "list", "--provenance", code)
    keyed = by_field["score"]
    assert task_id in as_rows.stdout and json.dumps(keyed["record_key"]) in as_rows.stdout
    assert "across runs: quarantined 5" in as_rows.stdout

    # show: the record itself, as the source sent it
    bare = by_field[None]
    shown = await cli_json(stack, "show", str(bare["id"]))
    assert shown["record"] == records[kinds[None][0]] and shown["error_code"] == "SOURCE_CONTRACT"
    no_key = by_field["id"]
    as_table = await cli(stack, "show", str(no_key["id"]), "-o", "table")
    assert as_table.returncode == 0, as_table.stderr
    assert "record:" in as_table.stdout and no_key["message"].splitlines()[0] in as_table.stdout
    record = json.loads(as_table.stdout[as_table.stdout.index("record:") + len("record:") :])
    assert record == records[kinds["id"][0]] and "id" not in record
    missing = await cli(stack, "show", "999999999")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr

    # discard the bare string: kept, never replayed
    discarded = await cli(stack, "discard", task_id, "--id", str(bare["id"]))
    assert discarded.returncode == 0, discarded.stderr
    assert f"discarded 1 of {task_id}" in discarded.stdout

    # The model fixed: the replay lands the three numbers written as strings; the record
    # without an id stays, judged again.
    import_doc(stack, fixed(code, gh.base, coerce_types_enabled=True))
    replayed = await cli(stack, "replay", task_id)
    assert replayed.returncode == 0, replayed.stderr
    assert f"workflow artemis/quarantine-replay/{task_id}" in replayed.stdout
    assert "· 4 rows" in replayed.stdout and "landed 3 · still bad 1" in replayed.stdout
    assert f"{task_id}: quarantined 1 · replayed 3 · discarded 1" in replayed.stdout
    assert len(table_rows(lake, code.replace("-", "_"))) == 298
    left = await cli_json(stack, "list", task_id, "--status", "quarantined")
    assert [(r["id"], r["replays"]) for r in left["items"]] == [(no_key["id"], 1)]
    assert left["counts"] == {"quarantined": 1, "replayed": 3, "discarded": 1}

    # --no-wait: started and left to run (the workflow's own result says how it ended)
    started = await cli(stack, "replay", task_id, "--id", str(no_key["id"]), "--no-wait")
    assert started.returncode == 0, started.stderr
    assert "· 1 row\n" in started.stdout and "landed" not in started.stdout
    handle = stack.client.get_workflow_handle(f"artemis/quarantine-replay/{task_id}")
    result = await handle.result()
    assert (result["landed"], result["still_bad"]) == (0, 1)

    # A run that quarantined nothing: the API's error, exit 1
    unknown = await cli(stack, "replay", "t-nothing-here")
    assert unknown.returncode == 1 and "TASK_NOT_FOUND" in unknown.stderr


def _output_commands() -> set[str]:
    """Every `artemis` command that takes ``-o``, as the CLI itself declares them."""
    import typer.main

    from starter.cli import full_app

    found: set[str] = set()

    def walk(command: Any, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            if "-o" in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
                found.add(" ".join(path))

    walk(typer.main.get_command(full_app()), [])
    return found


def _artemis(stack, config, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "artemis"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "ARTEMIS_API": stack.api_url, "ARTEMIS_CONFIG": str(config)},
        cwd=ROOT,
    )


async def test_every_command_that_takes_o_prints_one_json_document(make_stack, gh, tmp_path):  # noqa: F811
    """Each command with ``-o``, run with ``-o json`` as a script would: standard output
    is one JSON document and nothing else (live steps and notes go to standard error)."""
    stack, _ = await sql_stack(make_stack, tmp_path)
    code = f"q-{gh.ns}"
    records = issues(60)
    poison(records, wrong=1, no_key=0, not_object=0)
    gh.serve(records)
    import_doc(stack, doc(code, gh.base))
    task_id, _, answer = await start(stack, code, max_bad_records=10)
    assert answer["data"]["status"] == "completed", answer["error"]
    (row,) = quarantine.list_rows(stack.settings.database.url, quarantine.RowPage(task_id=task_id))
    config = write_config(tmp_path / "cli.yaml", stack.settings)
    name = f"json-{gh.ns}"
    made = await asyncio.to_thread(
        _artemis, stack, config, "schedules", "create", name, "--task", "source_harvest",
        "-p", f"provenance={code}", "--every", "1h",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    runs = {
        "run": ["run", "source_harvest", "-p", f"provenance={code}"],
        "task-types": ["task-types"],
        "tasks list": ["tasks", "list"],
        "tasks show": ["tasks", "show", task_id],
        "tasks watch": ["tasks", "watch", task_id],
        "quarantine list": ["quarantine", "list"],
        "quarantine show": ["quarantine", "show", str(row["id"])],
        "registry contract": ["registry", "contract", code],
        "registry preview": ["registry", "preview", code],
        "schedules list": ["schedules", "list"],
        "schedules show": ["schedules", "show", name],
        "builds list": ["builds", "list"],
    }
    assert set(runs) == _output_commands()
    also = [["run", "source_harvest", "-p", f"provenance={code}", "--async"]]
    also += [["tasks", "show", task_id, "--events"], ["quarantine", "list", task_id]]
    try:
        for args in [*runs.values(), *also]:
            out = await asyncio.to_thread(_artemis, stack, config, *args, "-o", "json")
            # (builds list exits 1 when runs wait on a build no worker polls: still JSON)
            assert out.returncode == 0 or args[0] == "builds", (args, out.stderr)
            assert out.stdout.strip(), (args, out.stderr)
            json.loads(out.stdout)  # one document: anything else around it fails here
    finally:
        await asyncio.to_thread(_artemis, stack, config, "schedules", "delete", name)
