"""A source as a tree, as docs/resources.md walks through it ("Walk-through: a tree in three
tables"): the bundled ``infra/registry/forge.yaml`` imported, its tree of resources read
from the contract, one harvest of the sample code hosting API (``artemis_samples/forge.py``)
into three SQLite tables, each command run as written through real API and worker
processes and each shown output compared with what the command prints."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ROOT
from tests.walkthrough import (
    as_shown,
    blocks,
    console,
    run_shown,
    run_the_commands,
    walkthrough_folder,
    walkthrough_stack,
)

GUIDE = ROOT / "docs" / "resources.md"
FORGE = ROOT / "infra" / "registry" / "forge.yaml"


def tree_walkthrough() -> str:
    text = GUIDE.read_text()
    start = text.index("## Walk-through: a tree in three tables\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_tree_walkthroughs_yaml_is_the_bundled_file():
    # the guide shows the file the test (and a user) imports, verbatim
    assert blocks(tree_walkthrough(), "yaml") == [FORGE.read_text()]


def run_result(printed: str) -> dict[str, Any]:
    """The run's final state: the JSON that ``artemis run`` prints after its live steps."""
    start = re.search(r"^\{$", printed, re.M)
    assert start is not None, printed
    return json.loads(printed[start.start() :])


async def test_the_tree_walkthrough_runs_as_written(base_settings, samples, tmp_path: Path) -> None:
    """The walk-through's commands, in a fresh folder, against real API and worker
    processes started with its configuration (standing in for `artemis dev --config`: the
    suite's Temporal and sample server, so the one substitution is the sample server's
    address in the file's base URL)."""
    section = tree_walkthrough()
    setup, harvest = ([ln for ln in b.splitlines() if ln.strip()] for b in blocks(section, "bash"))
    assert setup[0] == "artemis dev --config infra/catalog.config.yaml"
    contract, tables = (console(b) for b in blocks(section, "console"))
    env, port = walkthrough_folder(tmp_path, base_settings, samples.url, [FORGE])
    # the sample's default tree, whatever an earlier test made of it
    async with httpx.AsyncClient() as http:
        (await http.post(f"{samples.url}/_control/forge", json={"reset": True})).raise_for_status()
    async with walkthrough_stack(env, port, tmp_path):
        run_the_commands(setup[1:], env, tmp_path)
        for command, shown in contract:
            assert as_shown(run_shown(command, tmp_path, env), shown) == shown, command
        (printed,) = run_the_commands(harvest, env, tmp_path)
        result = run_result(printed)

    # the run's end as the guide tells it, and its stats.resources as the guide shows them
    emitted = re.search(r"`records_emitted: (\d+)`", section)
    assert emitted is not None
    assert result["status"] == "completed", printed
    assert result["stats"]["records_emitted"] == int(emitted.group(1)), result["stats"]
    assert result["stats"]["resources"] == json.loads(blocks(section, "json")[0])
    # three tables, every record once, each comment joined to its issue, as shown
    for command, shown in tables:
        assert run_shown(command, tmp_path) == shown, command
    lake = tmp_path / ".artemis" / "lake"
    folders = {p.name: [run.name for run in p.iterdir()] for p in lake.iterdir()}
    assert folders == {
        name: [result["task_id"]] for name in ("forge__repos", "forge__issues", "forge__comments")
    }
