"""A registry file chooses an environment variable and a destination for it: the service's
own variables are refused (at import, on any write, when a run uses the contract), the
import reports where each credential goes, and oversized or aliased files are refused."""

from __future__ import annotations

import json

import pytest
import yaml
from sqlalchemy import insert, select

from artemis.config import load_settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.client import Credentials
from artemis.registry.models import RegProvCredential, RegProvenance
from artemis.registry.resolve import find_provenance, resolve_contract
from artemis.registry.writes import check_registry, gray_switch
from artemis.registry.yaml_io import MAX_FILE_BYTES, import_yaml
from tests.registry.test_registry_file import crossref
from tests.registry.test_resolution import day
from tests.registry.test_writes_and_yaml import registry_cli

ELSEWHERE = "https://elsewhere.example"


def with_credential(env: str, **cols) -> dict:
    """Crossref with one credential read from ``env`` and its base URL elsewhere."""
    doc = crossref()
    doc["provenance"]["base_url_default"] = ELSEWHERE
    doc["credential"] = [
        {
            "scope_code": "SOURCE",
            "effective_from": "2025-01-01T00:00:00Z",
            "credential_name": "key",
            "auth_type_code": "API_KEY_QUERY",
            "param_or_header_name": "api_key",
            "secret_env": env,
            **cols,
        }
    ]
    return doc


@pytest.mark.parametrize(
    "env, rule",
    [
        ("COOKIE_MASTER_KEY", "the vault's master key"),
        ("AWS_SECRET_ACCESS_KEY", "AWS_*: cloud credentials"),
        ("ARTEMIS__DATABASE__URL", "ARTEMIS_*"),
        ("PGPASSWORD", "PG*"),
        ("TEMPORAL_TLS_KEY", "TEMPORAL_*"),
        ("https_proxy", "*_PROXY"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_*"),
    ],
)
def test_the_service_variables_are_refused_at_import(reg, key_file, monkeypatch, env, rule):
    value = "service-secret-value-0123456789-abcdef"
    monkeypatch.setenv(env, value)
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(with_credential(env)), key_file, source="evil.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    message = e.value.message
    assert message.startswith("evil.yaml: credential[0].secret_env: ")
    assert f"{env} is one of the service's own variables" in message and rule in message
    assert value not in message
    with reg.connect() as conn:  # nothing written, nothing sealed
        assert conn.execute(select(RegProvenance.__table__)).first() is None
        assert conn.execute(select(RegProvCredential.__table__)).first() is None


def test_a_malformed_variable_name_is_refused(reg, key_file):
    with pytest.raises(ArtemisError, match="not an environment variable name"):
        import_yaml(reg, yaml.safe_dump(with_credential("MY KEY=x")), key_file)


def test_an_ordinary_variable_is_imported_and_reported_with_its_origin(reg, key_file, monkeypatch):
    value = "my-ordinary-api-key-42"
    monkeypatch.setenv("MY_API_KEY", value)
    monkeypatch.setenv("MY_BEARER", "bearer-token-of-harvests")
    doc = with_credential("MY_API_KEY")
    doc["credential"].append(
        {
            "scope_code": "TASK",
            "task_type": "harvest",
            "effective_from": "2025-01-01T00:00:00Z",
            "credential_name": "harvest-token",
            "auth_type_code": "BEARER",
            "secret_env": "MY_BEARER",
            "endpoint_name": doc["endpoint_def"][0]["endpoint_name"],
        }
    )
    # harvests go to another host from mid-2025: that origin is where their token goes
    doc["http_cfg"].append(
        {
            "scope_code": "TASK",
            "task_type": "harvest",
            "effective_from": "2025-06-01T00:00:00Z",
            "base_url_override": "http://mirror.example:8080/api/",
        }
    )
    report = import_yaml(reg, yaml.safe_dump(doc), key_file).to_dict()
    assert report["credentials"] == [
        {
            "credential": "key",
            "secret_env": "MY_API_KEY",
            "endpoint": None,
            # every task type may use a SOURCE key: the harvests' mirror too
            "sent_to": ["http://mirror.example:8080", "https://elsewhere.example:443"],
            "as": "query parameter api_key",
        },
        {
            "credential": "harvest-token",
            "secret_env": "MY_BEARER",
            "endpoint": doc["endpoint_def"][0]["endpoint_name"],
            "sent_to": ["http://mirror.example:8080", "https://elsewhere.example:443"],
            "as": "header Authorization (Bearer)",
        },
    ]
    printed = json.dumps(report)
    assert value not in printed and "bearer-token-of-harvests" not in printed
    with reg.connect() as conn:
        rows = conn.execute(select(RegProvCredential.__table__)).fetchall()
        assert {r.secret_env_name for r in rows} == {"MY_API_KEY", "MY_BEARER"}
        assert all(r.secret_ciphertext and value not in r.secret_ciphertext for r in rows)


def test_an_override_in_force_over_the_whole_interval_hides_the_default(reg, key_file, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "my-ordinary-api-key-42")
    doc = with_credential("MY_API_KEY")
    doc["http_cfg"][0]["base_url_override"] = "https://api.crossref.org"
    report = import_yaml(reg, yaml.safe_dump(doc), key_file)
    assert report.credentials[0]["sent_to"] == ["https://api.crossref.org:443"]


def test_a_row_written_around_the_import_is_refused_on_write_check_and_use(
    reg, key_file, monkeypatch
):
    monkeypatch.setenv("MY_API_KEY", "my-ordinary-api-key-42")
    import_yaml(reg, yaml.safe_dump(with_credential("MY_API_KEY")), key_file)
    ct = RegProvCredential.__table__
    with reg.connect() as conn:
        good = conn.execute(select(ct)).one()
    # a switch may not rename the variable to one of the service's
    with pytest.raises(ArtemisError, match="AWS_SECRET_ACCESS_KEY is one of the service's"):
        with reg.begin() as conn:
            gray_switch(
                conn, "credential", good.id, {"secret_env_name": "AWS_SECRET_ACCESS_KEY"}, day(600)
            )
    with reg.connect() as conn:  # the switch left nothing behind
        assert conn.execute(select(ct)).one().effective_to is None
    # a row inserted straight into the table, past the registry's checks
    with reg.begin() as conn:
        pid = find_provenance(conn, "crossref").id
        conn.execute(
            insert(ct).values(
                provenance_id=pid,
                scope_code="SOURCE",
                effective_from=day(-1000),
                credential_name="master",
                auth_type_code="API_KEY_QUERY",
                secret_env_name="COOKIE_MASTER_KEY",
                secret_ciphertext="sealed-elsewhere",
                encryption_key_id="k-x",
                is_default_preferred=True,
                lifecycle_status_code="ACTIVE",
                deleted=False,
                created_at=day(-1000),
                updated_at=day(-1000),
            )
        )
    with reg.connect() as conn:
        findings = check_registry(conn)
        contract = resolve_contract(conn, "crossref", "harvest", day(10))
    assert [f["kind"] for f in findings if f["kind"] == "reserved_secret_env"] == [
        "reserved_secret_env"
    ]
    with pytest.raises(ArtemisError) as e:
        Credentials(contract, load_settings(None))
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert "credential 'master': secret_env COOKIE_MASTER_KEY is one of" in e.value.message


def test_a_file_over_the_size_limit_is_refused(reg, key_file):
    text = yaml.safe_dump(crossref()) + "#" * MAX_FILE_BYTES + "\n"
    with pytest.raises(ArtemisError, match=r"over the registry file limit") as e:
        import_yaml(reg, text, key_file, source="big.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT and e.value.message.startswith("big.yaml: ")
    with reg.connect() as conn:
        assert conn.execute(select(RegProvenance.__table__)).first() is None


@pytest.mark.parametrize(
    "text",
    [
        # an alias reusing a row
        "provenance: &p {provenance_code: x}\nhttp_cfg: []\nretry_cfg: [*p]\n",
        # a merge key (needs an alias)
        "base: &b {scope_code: SOURCE}\nprovenance: {<<: *b, provenance_code: x}\n",
        # the "billion laughs" shape: a few lines, a document of millions of strings
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + "provenance: {provenance_code: x}\n",
        # an anchor alone
        "provenance: &p {provenance_code: x}\n",
    ],
)
def test_a_file_with_anchors_or_aliases_is_refused(reg, key_file, text):
    with pytest.raises(ArtemisError, match="YAML anchors and aliases are not accepted") as e:
        import_yaml(reg, text, key_file, source="alias.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT and "line 1" in e.value.message
    with reg.connect() as conn:
        assert conn.execute(select(RegProvenance.__table__)).first() is None


def test_cli_import_reports_origins_and_refuses_big_and_reserved_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "cli-ordinary-key-value-77")
    cli = registry_cli(tmp_path)
    assert cli("db upgrade").returncode == 0
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(with_credential("MY_API_KEY")))
    out = cli("registry import", str(ok))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["credentials"][0]["sent_to"] == ["https://elsewhere.example:443"]
    assert report["credentials"][0]["as"] == "query parameter api_key"
    assert "cli-ordinary-key-value-77" not in out.stdout + out.stderr
    evil = tmp_path / "evil.yaml"
    evil.write_text(yaml.safe_dump(with_credential("COOKIE_MASTER_KEY")))
    out = cli("registry import", str(evil))
    assert out.returncode == 1
    assert "credential[0].secret_env: COOKIE_MASTER_KEY is one of the service's" in out.stderr
    assert "registry-cli-test-master-key" not in out.stdout + out.stderr
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    out = cli("registry import", str(big))
    assert out.returncode == 1 and "over the registry file limit" in out.stderr
