"""A provenance of several resources in the registry (docs/registry.md "Resources"): the
import refuses bad resource names, fields a resource's SEARCH endpoint alone has, files
whose resources are no tree and places whose tables are another's; ``registry check``
walks every instant the SEARCH rows change at; ``registry contract`` prints the tree; an
export imports back unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.models import RegProvEndpointDef
from artemis.registry.writes import add_row, check_registry, close_row, gray_switch
from artemis.registry.yaml_io import export_yaml, import_yaml
from tests.registry.test_resolution import add_provenance, day
from tests.registry.test_writes_and_yaml import registry_cli

START = "2025-01-01T00:00:00Z"


def endpoint(name: str, path: str, parent: str | None = None, **cols: Any) -> dict[str, Any]:
    row = {
        "scope_code": "SOURCE",
        "effective_from": START,
        "resource_name": name,
        "endpoint_name": name,
        "endpoint_usage_code": "SEARCH",
        "path_template": path,
        **cols,
    }
    if parent is not None:
        row["parent_resource_name"] = parent
    return row


def tree_doc(code: str = "forge", **comments: Any) -> dict[str, Any]:
    """Three levels: repositories, each one's issues, each issue's comments."""
    paging = {"scope_code": "SOURCE", "effective_from": START, "pagination_mode_code": "SINGLE"}
    return {
        "provenance": {"provenance_code": code, "base_url_default": "https://forge.example"},
        "endpoint_def": [
            endpoint("repos", "/orgs/acme/repos"),
            endpoint(
                "issues",
                "/repos/{parent.full_name}/issues",
                "repos",
                include_from_parent_json={"full_name": "repo"},
            ),
            endpoint(
                "comments",
                "/repos/{parent.repo}/issues/{parent.number}/comments",
                "issues",
                **{"include_from_parent_json": ["number"], **comments},
            ),
        ],
        "pagination_cfg": [
            {**paging, "resource_name": name} for name in ("repos", "issues", "comments")
        ],
    }


def text(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def endpoint_id(reg, name: str) -> int:
    t = RegProvEndpointDef.__table__
    with reg.connect() as conn:
        return conn.execute(select(t.c.id).where(t.c.endpoint_name == name)).scalar_one()


def tree_findings(reg) -> list[str]:
    with reg.connect() as conn:
        return [f["message"] for f in check_registry(conn) if f["kind"] == "resource_tree"]


def refused(reg, key_file, doc: dict[str, Any]) -> str:
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, text(doc), key_file)
    assert e.value.code is ErrorCode.INVALID_INPUT
    return e.value.message


def test_a_three_level_file_imports_and_the_contract_prints_its_tree(tmp_path):
    cli = registry_cli(tmp_path)
    assert cli("db upgrade").returncode == 0
    path = tmp_path / "forge.yaml"
    path.write_text(text(tree_doc(output_name="forge_comments")))
    done = cli("registry import", str(path))
    assert done.returncode == 0, done.stderr
    out = cli("registry contract forge -o json")
    assert out.returncode == 0, out.stderr
    resources = json.loads(out.stdout)["resources"]
    assert list(resources) == ["repos", "issues", "comments"]  # parents first
    assert [(r["parent"], r["place"]) for r in resources.values()] == [
        (None, "forge__repos"),
        ("repos", "forge__issues"),
        ("issues", "forge_comments"),
    ]
    assert resources["comments"]["endpoint"]["include_from_parent_json"] == ["number"]
    assert resources["issues"]["pagination"]["pagination_mode_code"] == "SINGLE"
    table = cli("registry contract forge -o table")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    at = lines.index("resources:")
    assert lines[at + 1 : at + 4] == [
        "  repos  GET /orgs/acme/repos  paging SINGLE  place forge__repos",
        "    repos → issues  GET /repos/{parent.full_name}/issues  paging SINGLE  "
        "place forge__issues",
        "      repos → issues → comments  GET /repos/{parent.repo}/issues/{parent.number}/"
        "comments  paging SINGLE  place forge_comments",
    ]
    assert not any(line.startswith("problem:") for line in lines)
    assert cli("registry check").returncode == 0


def test_closing_the_parent_endpoint_reports_the_orphan_from_that_instant(reg, key_file):
    import_yaml(reg, text(tree_doc()), key_file)
    assert tree_findings(reg) == []
    with reg.begin() as conn:
        close_row(conn, "reg_prov_endpoint_def", endpoint_id(reg, "issues"), day(30))
    assert tree_findings(reg) == [
        f"provenance forge: from {day(30).isoformat()}: resource 'comments': its parent "
        "resource 'issues' has no SEARCH endpoint in force"
    ]


def test_a_switch_that_makes_a_cycle_is_reported_from_the_switch(reg, key_file):
    import_yaml(reg, text(tree_doc()), key_file)
    with reg.begin() as conn:
        repos = endpoint_id(reg, "repos")
        gray_switch(
            conn, "reg_prov_endpoint_def", repos, {"parent_resource_name": "comments"}, day(40)
        )
    found = tree_findings(reg)
    assert found == [
        f"provenance forge: from {day(40).isoformat()}: resource {name!r}: its parent "
        "resources make a cycle"
        for name in ("comments", "issues", "repos")
    ]


def test_a_problem_of_one_task_type_names_it(reg, key_file):
    doc = tree_doc()
    doc["endpoint_def"].append(
        {
            **endpoint("repos", "/orgs/acme/repos", "ghost"),
            "scope_code": "TASK",
            "task_type": "update",
            "effective_from": "2025-03-01T00:00:00Z",
            "endpoint_name": "repos_update",
        }
    )
    # Refused as a file (its resources are no tree for update from March) ...
    assert "resource 'repos': its parent resource 'ghost'" in refused(reg, key_file, doc)
    # ... and found by the check when written another way.
    import_yaml(reg, text(tree_doc()), key_file)
    with reg.begin() as conn:
        pid = conn.execute(select(RegProvEndpointDef.__table__.c.provenance_id)).scalar()
        values = {**doc["endpoint_def"][-1], "provenance_id": pid, "effective_from": day(59)}
        add_row(conn, RegProvEndpointDef, values)
    assert tree_findings(reg) == [
        f"provenance forge: from {day(59).isoformat()} (task_type update): resource "
        "'repos': its parent resource 'ghost' has no SEARCH endpoint in force"
    ]


@pytest.mark.parametrize(
    ("other", "theirs"),
    [
        ("FORGE__ISSUES", "'FORGE__ISSUES': table names are one whatever their case"),
        ("forge-_issues", "'forge__issues'"),
    ],
)
def test_a_resource_place_that_is_another_provenances_table_is_refused(
    reg, key_file, other, theirs
):
    import_yaml(reg, text({"provenance": {"provenance_code": other}}), key_file)
    said = refused(reg, key_file, tree_doc())
    assert said == (
        "endpoint_def: resource 'issues': its place 'forge__issues', table 'forge__issues' is "
        f"provenance {other!r}'s ({theirs}); give resource 'issues' another output_name"
    )


def test_a_code_whose_table_is_another_provenances_resource_place_is_refused(reg, key_file):
    import_yaml(reg, text(tree_doc()), key_file)
    said = refused(reg, key_file, {"provenance": {"provenance_code": "Forge__Repos"}})
    assert said == (
        "provenance_code 'Forge__Repos': its default table 'Forge__Repos' is the table of "
        "provenance 'forge''s resource 'repos' ('forge__repos': table names are one "
        "whatever their case); pick another code"
    )


def test_two_resources_of_one_file_in_one_table_are_refused(reg, key_file):
    said = refused(reg, key_file, tree_doc(output_name="Forge__Issues"))
    assert "resource 'comments': its place 'Forge__Issues', table 'Forge__Issues' is the " in said
    assert "provenance 'forge''s resource 'issues' ('forge__issues'" in said


def test_the_check_finds_resource_places_shared_before_the_rule(reg, key_file):
    import_yaml(reg, text(tree_doc()), key_file)
    with reg.begin() as conn:  # written around the import
        add_provenance(conn, "FORGE__comments")
    with reg.connect() as conn:
        found = [f["message"] for f in check_registry(conn) if f["kind"] == "shared_table"]
    assert found == [
        "provenance FORGE__comments: its table 'FORGE__comments' (place 'FORGE__comments') "
        "is the table of provenance 'forge''s resource 'comments' ('forge__comments'; names "
        "are one whatever their case): give one of the resources an output_name of its own"
    ]


def test_a_place_past_63_bytes_is_refused(reg, key_file):
    name = "r" * 57  # forge__rrr...: 64 bytes
    doc = tree_doc()
    doc["endpoint_def"].append(endpoint(name, "/more"))
    said = refused(reg, key_file, doc)
    assert said == (
        f"endpoint_def: resource {name!r}: its place 'forge__{name}': table name "
        f"'forge__{name}' is 64 bytes: PostgreSQL keeps 63 (a longer name is cut, and two "
        "cut names can be one table); give it a shorter output_name"
    )
    said = refused(reg, key_file, tree_doc(output_name="9" + "c" * 61))
    assert f"output_name '9{'c' * 61}': table name 't_9{'c' * 61}' is 64 bytes" in said


def test_an_export_imports_back_writing_nothing(reg, key_file):
    import_yaml(reg, text(tree_doc(output_name="forge_comments")), key_file)
    exported = export_yaml(reg, "forge")
    again = import_yaml(reg, exported, key_file)
    assert (again.created, again.updated) == ([], [])
    one = {
        "provenance": {"provenance_code": "shop"},
        "endpoint_def": [{**endpoint("x", "/items"), "endpoint_name": "items"}],
    }
    del one["endpoint_def"][0]["resource_name"]
    import_yaml(reg, text(one), key_file)
    exported = export_yaml(reg, "shop")
    assert "resource_name" not in exported  # a file of one resource looks as it did
    again = import_yaml(reg, exported, key_file)
    assert (again.created, again.updated) == ([], [])


def test_a_row_that_leaves_its_resource_out_is_the_provenances_own_again(reg, key_file):
    named = {
        "provenance": {"provenance_code": "shop"},
        "endpoint_def": [{**endpoint("items", "/items")}],
    }
    import_yaml(reg, text(named), key_file)
    del named["endpoint_def"][0]["resource_name"]
    report = import_yaml(reg, text(named), key_file)
    assert len(report.updated) == 1 and report.updated[0].endswith(": resource_name")
    with reg.connect() as conn:
        t = RegProvEndpointDef.__table__
        assert conn.execute(select(t.c.resource_name)).scalar_one() == ""


def _with(row: int, **cols: Any) -> dict[str, Any]:
    doc = tree_doc()
    doc["endpoint_def"][row].update(cols)
    return doc


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (_with(0, resource_name="1repos"), "endpoint_def[0].resource_name: '1repos': a resource"),
        (_with(0, resource_name="re pos"), "endpoint_def[0].resource_name: 're pos': a resource"),
        (_with(1, parent_resource_name="re/pos"), "endpoint_def[1].parent_resource_name: 're/"),
        (
            _with(0, resource_name="r" * 65),
            "endpoint_def[0].resource_name: String should have at most 64 characters",
        ),
        (
            _with(2, endpoint_usage_code="DETAIL"),
            "parent_resource_name, include_from_parent_json: only on the SEARCH endpoint of a "
            "named resource",
        ),
        (_with(1, resource_name=""), "endpoint_def[1]: parent_resource_name, include_from"),
        (_with(2, output_name="../x"), "output_name '../x': starts with a letter or digit"),
        (_with(2, include_from_parent_json=[1]), "include_from_parent_json: a list of the"),
        (
            _with(0, parent_resource_name="comments"),
            "from 2025-01-01T00:00:00+00:00: resource 'comments': its parent resources make a "
            "cycle",
        ),
        (_with(2, parent_resource_name="ghost"), "its parent resource 'ghost' has no SEARCH"),
        (_with(2, parent_resource_name=None), "{parent.…} in its request, and no parent"),
        (
            _with(0, endpoint_usage_code="TOKEN"),
            "endpoint_def[0].resource_name: a TOKEN endpoint is the provenance's",
        ),
        (
            {
                **tree_doc(),
                "record_model": [
                    {
                        "scope_code": "SOURCE",
                        "effective_from": START,
                        "resource_name": "labels",
                        "key_json": ["id"],
                        "fields_json": {"id": "int"},
                    }
                ],
            },
            "record_model[0].resource_name: 'labels' has no SEARCH endpoint in the file",
        ),
    ],
)
def test_bad_resources_are_refused_naming_the_field(reg, key_file, doc, said):
    for row in doc["endpoint_def"]:
        if row.get("parent_resource_name", 0) is None:
            del row["parent_resource_name"]
    assert said in refused(reg, key_file, doc)
    t = RegProvEndpointDef.__table__
    with reg.connect() as conn:
        assert conn.execute(select(t.c.id)).first() is None  # nothing written
