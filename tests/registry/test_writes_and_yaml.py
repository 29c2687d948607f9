"""Registry writes (overlaps, scopes, gray switch, rollback) and YAML import/export."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
import yaml
from sqlalchemy import select

from artemis.errors import ArtemisError
from artemis.registry.models import RegProvCredential, RegProvPaginationCfg
from artemis.registry.resolve import CONTRACT_KEYS, current_row, resolve_contract
from artemis.registry.writes import (
    add_row,
    check_registry,
    close_row,
    gray_switch,
    reopen_row,
    rollback,
)
from artemis.registry.yaml_io import export_yaml, import_yaml
from tests.conftest import ROOT
from tests.helpers import artemis_cli
from tests.registry.test_resolution import add_provenance, day

BUNDLED = ROOT / "infra" / "registry"


def pagination(pid, scope="SOURCE", task=None, start=0, end=None, **cols):
    return {
        "provenance_id": pid,
        "scope_code": scope,
        "task_type": task,
        "effective_from": day(start),
        "effective_to": day(end) if end is not None else None,
        "pagination_mode_code": "PAGE_NUMBER",
        **cols,
    }


def test_overlapping_interval_is_refused_naming_the_row(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        first = add_row(conn, RegProvPaginationCfg, pagination(pid, start=0, end=10))
        add_row(conn, RegProvPaginationCfg, pagination(pid, start=10))  # adjacent: fine
        # another slot (TASK/update) may overlap
        add_row(conn, RegProvPaginationCfg, pagination(pid, "TASK", "update", start=5))
        with pytest.raises(ArtemisError) as e:
            add_row(conn, RegProvPaginationCfg, pagination(pid, start=3, end=4))
    assert e.value.code.value == "INVALID_INPUT"
    assert f"reg_prov_pagination_cfg id={first}" in e.value.message
    assert "2025-01-01T00:00:00+00:00, 2025-01-11T00:00:00+00:00" in e.value.message
    assert e.value.details["conflicts"] == [first]


@pytest.mark.parametrize(
    "values, needle",
    [
        ({"scope_code": "TASK", "task_type": None}, "needs a task_type"),
        ({"scope_code": "SOURCE", "task_type": "update"}, "has no task_type"),
        ({"scope_code": "TASK", "task_type": "weekly"}, "harvest, update or backfill"),
        ({"scope_code": "GLOBAL"}, "SOURCE or TASK"),
        ({"effective_to": day(-1)}, "must be after"),
        ({"colour": "red"}, "unknown column"),
    ],
)
def test_bad_rows_are_refused(reg, values, needle):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        with pytest.raises(ArtemisError, match=needle):
            add_row(conn, RegProvPaginationCfg, {**pagination(pid), **values})


def test_gray_switch_then_rollback_after_it_started(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        old = add_row(conn, RegProvPaginationCfg, pagination(pid, page_size_value=100))
        new = gray_switch(conn, "reg_prov_pagination_cfg", old, {"page_size_value": 500}, at=day(5))
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(4)).id == old
        switched = current_row(conn, RegProvPaginationCfg, pid, None, day(6))
        assert switched.id == new and switched.page_size_value == 500
        back = rollback(conn, "reg_prov_pagination_cfg", new, old, at=day(8))
        restored = current_row(conn, RegProvPaginationCfg, pid, None, day(9))
        assert restored.id == back and restored.page_size_value == 100
        # history stays exact: the new row still answers for the days it was in force
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(7)).id == new
        assert check_registry(conn) == [f for f in check_registry(conn) if f["kind"] != "overlap"]


def test_rollback_of_a_switch_not_yet_started_reopens_the_old_row(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        old = add_row(conn, RegProvPaginationCfg, pagination(pid, page_size_value=100))
        new = gray_switch(conn, "reg_prov_pagination_cfg", old, {"page_size_value": 500}, at=day(5))
        assert rollback(conn, "reg_prov_pagination_cfg", new, old, at=day(2)) == old
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(6)).id == old
        assert current_row(conn, RegProvPaginationCfg, pid, None, day(6)).effective_to is None


def test_close_and_reopen(reg):
    with reg.begin() as conn:
        pid = add_provenance(conn)
        a = add_row(conn, RegProvPaginationCfg, pagination(pid))
        close_row(conn, "reg_prov_pagination_cfg", a, day(3))
        b = add_row(conn, RegProvPaginationCfg, pagination(pid, start=3))
        with pytest.raises(ArtemisError, match=f"id={b}"):
            reopen_row(conn, "reg_prov_pagination_cfg", a)
        close_row(conn, "pagination_cfg", b, day(4))
        with pytest.raises(ArtemisError, match=f"id={b}"):  # [0,inf) still meets [3,4)
            reopen_row(conn, "reg_prov_pagination_cfg", a)
        with pytest.raises(ArtemisError, match="unknown registry table"):
            close_row(conn, "reg_prov_nope", a, day(1))


def test_check_reports_overlaps_and_task_rows_without_task_type(reg):
    from sqlalchemy import insert

    with reg.begin() as conn:
        pid = add_provenance(conn)
        t = RegProvPaginationCfg.__table__
        base = {
            "provenance_id": pid,
            "pagination_mode_code": "CURSOR",
            "created_at": day(0),
            "updated_at": day(0),
        }
        conn.execute(insert(t).values(scope_code="SOURCE", effective_from=day(0), **base))
        conn.execute(insert(t).values(scope_code="SOURCE", effective_from=day(1), **base))
        conn.execute(insert(t).values(scope_code="TASK", effective_from=day(0), **base))
        kinds = sorted(f["kind"] for f in check_registry(conn))
    assert kinds.count("overlap") == 1
    assert "task_row_without_task_type" in kinds and "missing_endpoint" in kinds


# -- YAML ----------------------------------------------------------------------------------
def test_bundled_files_import_cleanly_and_round_trip(reg, key_file, tmp_path):
    for name in ("pubmed", "crossref"):
        report = import_yaml(reg, (BUNDLED / f"{name}.yaml").read_text(), key_file)
        assert report.created and not report.updated
        again = import_yaml(reg, (BUNDLED / f"{name}.yaml").read_text(), key_file)
        assert again.created == [] and again.updated == [] and again.unchanged > 5
    with reg.connect() as conn:
        assert check_registry(conn) == []
        c = resolve_contract(conn, "pubmed", "update", "2026-01-01T00:00:00Z")
    assert c.endpoint["endpoint_name"] == "esearch"
    assert c.endpoints["DETAIL"]["endpoint_name"] == "efetch"
    assert c.window_offset["default_date_field_name"] == "EDAT"
    assert c.rate_limit["qps_limit"] == 3
    exported = export_yaml(reg, "crossref")
    # into a second, empty database: the same export comes back
    from artemis.db import get_engine
    from artemis.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'second.db'}"
    upgrade(url)
    import_yaml(get_engine(url), exported, key_file)
    assert export_yaml(get_engine(url), "crossref") == exported
    data = yaml.safe_load(exported)
    assert data["pagination_cfg"][0]["next_cursor_jsonpath"] == "$.message.next-cursor"
    assert "id" not in data["pagination_cfg"][0] and "provenance_id" not in data["endpoint_def"][0]


def test_reimport_updates_in_place_and_overlap_writes_nothing(reg, key_file):
    text = (BUNDLED / "crossref.yaml").read_text()
    import_yaml(reg, text, key_file)
    with reg.connect() as conn:
        before = resolve_contract(conn, "crossref", "harvest", "2026-01-01T00:00:00Z")
    data = yaml.safe_load(text)
    data["pagination_cfg"][0]["page_size_value"] = 500
    report = import_yaml(reg, yaml.safe_dump(data), key_file)
    assert len(report.updated) == 1 and "page_size_value" in report.updated[0]
    with reg.connect() as conn:
        after = resolve_contract(conn, "crossref", "harvest", "2026-01-01T00:00:00Z")
    assert after.pagination["id"] == before.pagination["id"]
    assert after.pagination["page_size_value"] == 500
    # a new overlapping interval, plus a provenance change: refused, nothing written
    data["provenance"]["provenance_name"] = "Crossref (renamed)"
    data["pagination_cfg"].append(
        {**data["pagination_cfg"][0], "effective_from": "2025-06-01T00:00:00Z"}
    )
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(data), key_file, source="crossref.yaml")
    assert "crossref.yaml: pagination_cfg[1]" in e.value.message
    assert f"id={before.pagination['id']}" in e.value.message
    with reg.connect() as conn:
        still = resolve_contract(conn, "crossref", "harvest", "2026-01-01T00:00:00Z")
    assert still.provenance["provenance_name"] == "Crossref"


def test_credentials_come_from_the_environment_encrypted(reg, key_file, monkeypatch):
    doc = pubmed_with_two_keys()
    text = yaml.safe_dump(doc)
    monkeypatch.delenv("TEST_NCBI_KEY_B", raising=False)
    monkeypatch.setenv("TEST_NCBI_KEY_A", "plain-key-aaaa-1111")
    with pytest.raises(ArtemisError, match="TEST_NCBI_KEY_B"):
        import_yaml(reg, text, key_file)
    monkeypatch.setenv("TEST_NCBI_KEY_B", "plain-key-bbbb-2222")
    import_yaml(reg, text, key_file)
    rows = sealed_and_resolved_by_usage(reg)
    exported = export_yaml(reg, "pubmed")
    assert "plain-key" not in exported and "secret_env: TEST_NCBI_KEY_A" in exported
    assert "endpoint_name: efetch" in exported
    # a changed secret in the environment is a change of the row
    monkeypatch.setenv("TEST_NCBI_KEY_A", "plain-key-aaaa-rotated")
    report = import_yaml(reg, text, key_file)
    assert len(report.updated) == 1 and "ncbi-a" in report.updated[0]
    with pytest.raises(ArtemisError, match="secret_env"):
        bad = dict(doc)
        bad["credential"] = [{**doc["credential"][0], "secret_value": "inline"}]
        import_yaml(reg, yaml.safe_dump(bad), key_file)
    # Sealed by the vault: a salted key named per row ...
    assert all(r.encryption_key_id.startswith("k-") for r in rows)
    rotate_key_reseals_the_registry_legacy_rows_too(reg, key_file)


def pubmed_with_two_keys() -> dict:
    """The bundled PubMed file with two API keys from the environment: ncbi-a for every
    endpoint (preferred), ncbi-b for efetch only."""
    doc = yaml.safe_load((BUNDLED / "pubmed.yaml").read_text())
    key = {
        "scope_code": "SOURCE",
        "auth_type_code": "API_KEY_QUERY",
        "param_or_header_name": "api_key",
        "effective_from": "2025-01-01T00:00:00Z",
    }
    doc["credential"] = [
        {
            **key,
            "credential_name": "ncbi-a",
            "secret_env": "TEST_NCBI_KEY_A",
            "is_default_preferred": True,
        },
        {
            **key,
            "credential_name": "ncbi-b",
            "secret_env": "TEST_NCBI_KEY_B",
            "endpoint_name": "efetch",
        },
    ]
    return doc


def sealed_and_resolved_by_usage(reg) -> list:
    """Both keys are stored sealed (no clear value); a DETAIL contract offers efetch's own
    key first, a search contract the source-wide one first and efetch's after it (bound to
    efetch: the run's efetch requests carry it, its searches never); a printed contract
    holds no secret. The stored rows."""
    with reg.connect() as conn:
        rows = conn.execute(select(RegProvCredential.__table__)).fetchall()
        assert len(rows) == 2
        for r in rows:
            assert r.secret_ciphertext and "plain-key" not in r.secret_ciphertext
        detail = resolve_contract(conn, "pubmed", None, "2026-01-01T00:00:00Z", usage="DETAIL")
        search = resolve_contract(conn, "pubmed", None, "2026-01-01T00:00:00Z")
    assert [c["credential_name"] for c in detail.credentials] == ["ncbi-b", "ncbi-a"]
    assert [c["credential_name"] for c in search.credentials] == ["ncbi-a", "ncbi-b"]
    efetch = detail.endpoint
    assert search.credentials[1]["endpoint_id"] == efetch["id"]
    printed = json.dumps(detail.public())
    assert "plain-key" not in printed and "secret_ciphertext" not in printed
    assert detail.credential["has_secret"] is True
    return rows


def rotate_key_reseals_the_registry_legacy_rows_too(reg, key_file: str) -> None:
    """rotate-key re-encrypts the registry's secrets, including a row from before salted
    keys (sealed by the legacy scheme: one fixed-salt key per purpose)."""
    from artemis.crawler.vault import LEGACY_KEY_ID, CookieVault
    from artemis.vault import derive_fernet, master_key

    legacy = derive_fernet(master_key(key_file), "registry-credentials")
    with reg.begin() as conn:
        conn.execute(
            RegProvCredential.__table__.update()
            .where(RegProvCredential.credential_name == "ncbi-b")
            .values(
                secret_ciphertext=legacy.encrypt(b"plain-key-bbbb-2222").decode(),
                encryption_key_id=LEGACY_KEY_ID,
            )
        )
    new_master = b"registry-rotation-master-key-0123456789"
    result = CookieVault(reg, master_key(key_file)).rotate(new_master)
    assert result.rows == 2
    fresh = CookieVault(reg, new_master)
    with reg.connect() as conn:
        rotated = conn.execute(select(RegProvCredential.__table__)).fetchall()
    assert {r.encryption_key_id for r in rotated} == {result.new_key_id}
    assert sorted(fresh.decrypt(r.secret_ciphertext, r.encryption_key_id) for r in rotated) == [
        "plain-key-aaaa-rotated",
        "plain-key-bbbb-2222",
    ]


def test_cli_import_contract_check_close(tmp_path):
    cli = registry_cli(tmp_path)
    assert cli("db upgrade").returncode == 0
    assert cli("registry import", str(BUNDLED / "pubmed.yaml")).returncode == 0
    out = cli(
        "registry contract pubmed --task-type update --at 2026-03-01T00:00:00Z --usage DETAIL"
    )
    assert out.returncode == 0, out.stderr
    contract = json.loads(out.stdout)
    for key in CONTRACT_KEYS:
        assert key in contract
    assert contract["endpoint"]["endpoint_name"] == "efetch"
    assert contract["window_offset"]["scope_code"] == "TASK" and contract["credential"] is None
    before = cli("registry contract pubmed --at 2024-06-01T00:00:00Z")
    assert json.loads(before.stdout)["endpoint"] is None  # before the rows start
    assert cli("registry check").returncode == 0
    wid = contract["window_offset"]["id"]
    closed = cli(f"registry close reg_prov_window_offset_cfg {wid} --at 2026-04-01T00:00:00Z")
    assert closed.returncode == 0, closed.stderr
    later = json.loads(
        cli("registry contract pubmed --task-type update --at 2026-05-01T00:00:00Z").stdout
    )
    assert later["window_offset"] is None
    bad = cli("registry contract nope")
    assert bad.returncode == 1 and "unknown provenance 'nope'" in bad.stderr


def registry_cli(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """``artemis <command words> <args>`` on a SQLite database of its own, with no config
    file and the cluster's key (registry import seals credentials: a cluster command
    needs the cluster's key)."""
    env: dict[str, str | None] = {
        "ARTEMIS__DATABASE__URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "ARTEMIS__VAULT__MASTER_KEY_FILE": str(tmp_path / "k"),
        "COOKIE_MASTER_KEY": "registry-cli-test-master-key-0123456789",
        "ARTEMIS_CONFIG": None,
    }

    def cli(command: str, *args: str) -> subprocess.CompletedProcess:
        return artemis_cli(*command.split(), *args, env=env)

    return cli
