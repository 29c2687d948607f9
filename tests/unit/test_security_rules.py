"""Where a request may point a run (artemis/security.py): pinned ports, wildcards that
resolve inside, next-page origins."""

from __future__ import annotations

import pytest

from artemis.errors import ArtemisError
from artemis.security import (
    check_request_url,
    check_resolved,
    check_same_origin,
    host_allowed,
)
from tests.conftest import new_task_id


def test_entries_may_pin_a_port():
    allowed = ["127.0.0.1:8300", "[::1]:8300", "api.example.com", "::1"]
    assert host_allowed("127.0.0.1", allowed, 8300)
    assert not host_allowed("127.0.0.1", allowed, 7233)  # Temporal's port is not allowed
    assert host_allowed("::1", allowed, 6379)  # the bare IPv6 entry: any port
    assert host_allowed("api.example.com", allowed, 443)
    check_request_url("http://127.0.0.1:8300/quotes", allowed, "params.base_url")
    with pytest.raises(ArtemisError) as e:
        check_request_url("http://127.0.0.1:6379/", allowed, "params.base_url")
    assert "'127.0.0.1' (port 6379)" in e.value.message
    assert "security.allowed_hosts" in e.value.message


async def test_a_name_resolving_inside_is_refused_unless_an_ip_entry_contains_the_address():
    # "localhost" resolves to a loopback address: through a wildcard, or even named, it
    # is refused: a host *name* in the list never admits an internal answer
    for allowed in (["*"], ["localhost"]):
        with pytest.raises(ArtemisError) as e:
            await check_resolved("localhost", allowed, "output")
        assert "internal addresses only" in e.value.message
    await check_resolved("localhost", ["*", "127.0.0.1", "::1"], "output")  # IPs listed
    await check_resolved("localhost", ["localhost", "127.0.0.0/8"], "output")  # a CIDR entry
    # an entry pinned to a port admits the address on that port only
    await check_resolved("localhost", ["localhost", "127.0.0.1:8300"], "output", 8300)
    with pytest.raises(ArtemisError):
        await check_resolved("localhost", ["localhost", "127.0.0.1:8300"], "output", 6379)


async def test_a_name_that_does_not_resolve_is_refused_with_a_clear_error():
    with pytest.raises(ArtemisError) as e:
        await check_resolved("no-such-host.invalid", ["*"], "params.base_url", 443)
    assert e.value.code.value == "INVALID_INPUT"
    assert "params.base_url" in e.value.message and "does not resolve" in e.value.message


def test_next_pages_stay_on_the_sources_origin():
    check_same_origin("https://api.x.org/items?page=2", "https://api.x.org/items", "src")
    check_same_origin("http://h:80/a", "http://h/b", "src")  # the default port is the same
    for other in (
        "http://169.254.169.254/latest/meta-data/iam/?page=2&api_key=K",
        "http://api.x.org/items?page=2",  # http, not https
        "https://api.x.org:8443/items",
        "https://evil.org/items",
    ):
        with pytest.raises(ArtemisError) as e:
            check_same_origin(other, "https://api.x.org/items", "src")
        assert e.value.code.value == "SOURCE_CONTRACT" and "api_key" not in e.value.message


async def test_an_internal_ip_literal_needs_its_own_entry_not_a_wildcard():
    for ip in ("169.254.169.254", "10.0.0.5", "::1", "100.100.100.200"):
        with pytest.raises(ArtemisError):
            await check_resolved(ip, ["*"], "params.base_url")
        await check_resolved(ip, ["*", ip], "params.base_url")  # named: allowed
    await check_resolved("8.8.8.8", ["*"], "params.base_url")  # public: a wildcard will do


def test_a_resolved_outputs_credential_urls_are_run_secrets_not_history():
    """The operator's database and object-store URLs travel with the run's resolved
    output: one with a password (or a query) is stored as a run secret, history keeps
    the marker, and the activity reads the same URL back."""
    from artemis.sinks.factory import resolve_output
    from artemis.sinks.sealing import SECRET_REF, seal_output, unseal_output

    resolved = resolve_output(
        "pull_stock_quotes",
        {
            "sinks": ["log"],
            "sql": {"url": "postgresql://artemis:s3cret@db.internal/lake", "table": "q"},
            "files": {"url": "/var/lake", "format": "jsonl"},
        },
        {"sinks": ["log"]},
        None,
        "",
    )
    stored: dict[str, str] = {}
    sealed = seal_output(resolved, stored.__setitem__)
    assert sealed["sql"] == {"url": SECRET_REF, "table": "q"}
    assert sealed["files"] == {"url": "/var/lake", "format": "jsonl"}  # no credentials
    assert "s3cret" not in repr(sealed) and sealed["resolved"] is True
    assert unseal_output(sealed, stored.get) == resolved
    # A request cannot claim its output was resolved (and so skip output_defaults).
    with pytest.raises(ArtemisError) as e:
        resolve_output("pull_stock_quotes", {}, {"resolved": True, "sinks": ["log"]}, None, "")
    assert e.value.code.value == "INVALID_INPUT" and "output.resolved" in e.value.message


def test_only_the_credentials_of_sink_secrets_are_redacted():
    """Redaction replaces a registered value everywhere: a plain header value or an
    sslmode would garble every log line, so only credentials are registered."""
    from artemis.redact import redact_text
    from artemis.sinks.sealing import SECRET_REF, seal_output, unseal_output

    team = f"team{new_task_id()}"
    password = f"pw{new_task_id()}"
    token = f"tok{new_task_id()}"
    output = {
        "sinks": ["http", "sql"],
        "http_endpoint": f"http://127.0.0.1/sink?api_key={token}&region=eu",
        "http_headers": {"X-Team": team, "Authorization": f"Bearer {token}"},
        "sql": {"url": f"postgresql://artemis:{password}@db/lake?sslmode=require", "table": "t"},
        "resolved": True,
    }
    stored: dict[str, str] = {}
    sealed = seal_output(output, stored.__setitem__)
    assert sealed["http_headers"] == {"X-Team": SECRET_REF, "Authorization": SECRET_REF}
    assert unseal_output(sealed, stored.get) == output
    line = f"sent to {team} region=eu sslmode=require with {password} and {token}"
    shown = redact_text(line)
    assert team in shown and "region=eu" in shown and "sslmode=require" in shown
    assert password not in shown and token not in shown


def test_a_requests_output_problem_names_the_tasks_own_config_key():
    from artemis.sinks.factory import resolve_output

    for request in (
        {"sinks": ["sql"], "sql": {"url": "sqlite:////tmp/x.db"}},  # operator-only
        {"sinks": ["sql"]},  # no section in the config either
    ):
        with pytest.raises(ArtemisError) as e:
            resolve_output("pull_stock_quotes", {}, request, None, "")
        assert e.value.code.value == "INVALID_INPUT", e.value
        assert "<code>" not in e.value.message, e.value.message
        assert "output_defaults.pull_stock_quotes" in e.value.message, e.value.message
