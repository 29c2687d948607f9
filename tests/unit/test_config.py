"""Configuration: YAML file, env overrides, and errors that name the key."""

from __future__ import annotations

import json
import os

import pytest

from artemis.config import (
    SecuritySettings,
    ServerSettings,
    Settings,
    TemporalSettings,
    load_settings,
)
from artemis.errors import ArtemisError, ErrorCode


def test_yaml_file_then_env_overrides(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "temporal:\n  address: temporal.example:7233\n  namespace: prod\n"
        "server:\n  port: 9000\nlogging:\n  level: debug\n"
    )
    monkeypatch.setenv("ARTEMIS__TEMPORAL__NAMESPACE", "from-env")
    monkeypatch.setenv("ARTEMIS__CALLBACK__PROGRESS_MIN_INTERVAL_MS", "250")
    s = load_settings(cfg)
    assert s.temporal.address == "temporal.example:7233"
    assert s.temporal.namespace == "from-env"
    assert s.server.port == 9000
    assert s.logging.level == "DEBUG"
    assert s.callback.progress_min_interval_ms == 250


def test_precedence_flags_then_env_then_yaml_then_defaults(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "server:\n  port: 9000\n  host: 127.0.0.2\n  sync_timeout_s: 7\n"
        "temporal:\n  namespace: yaml-ns\n"
    )
    monkeypatch.setenv("ARTEMIS__SERVER__PORT", "9001")
    monkeypatch.setenv("ARTEMIS__SERVER__HOST", "127.0.0.3")
    s = load_settings(cfg, server={"port": 9002})  # a command-line flag, e.g. --port
    assert s.server.port == 9002  # flag > env > yaml
    assert s.server.host == "127.0.0.3"  # env > yaml
    assert s.server.sync_timeout_s == 7  # yaml > default, the rest of its section kept
    assert s.temporal.namespace == "yaml-ns"
    assert s.temporal.address == TemporalSettings().address  # default
    assert s.server.max_body_bytes == ServerSettings().max_body_bytes  # default
    monkeypatch.delenv("ARTEMIS__SERVER__PORT")
    assert load_settings(cfg).server.port == 9000  # yaml again once env is gone


def test_artemis_config_env_names_the_file(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server:\n  sync_timeout_s: 12\n")
    monkeypatch.setenv("ARTEMIS_CONFIG", str(cfg))
    assert load_settings().server.sync_timeout_s == 12


@pytest.mark.parametrize(
    "text, key",
    [
        ("server:\n  port: seventy\n", "server.port"),
        ("logging:\n  format: xml\n", "logging.format"),
        ("temporal:\n  adress: x\n", "temporal.adress"),
        ("telemetry:\n  exporter: zipkin\n", "telemetry.exporter"),
        ("callback:\n  override_port: 70000\n", "callback.override_port"),
        ("nonsense_section: 1\n", "nonsense_section"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, key):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ArtemisError) as e:
        load_settings(cfg)
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert key in e.value.message


def test_bad_env_value_names_the_key(monkeypatch):
    monkeypatch.setenv("ARTEMIS__SERVER__MAX_BODY_BYTES", "-5")
    with pytest.raises(ArtemisError) as e:
        load_settings(None)
    assert "server.max_body_bytes" in e.value.message


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ArtemisError, match="not found"):
        load_settings(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ArtemisError, match="not valid YAML"):
        load_settings(bad)


@pytest.mark.processes
def test_worker_refuses_to_start_on_bad_config(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "c.yaml"
    cfg.write_text("runs:\n  pages_per_fetch: 0\n")
    import os

    out = subprocess.run(
        [sys.executable, "-m", "infra.devstack", "worker", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COOKIE_MASTER_KEY": "k" * 40},
    )
    assert out.returncode == 1
    assert "runs.pages_per_fetch" in out.stderr


def test_platform_search_ends_on_a_configured_marker_one_at_a_time():
    from artemis.config import PlatformSettings

    assert PlatformSettings(base_url="http://x").next_page_path == "next_page"  # the sample's
    flag = PlatformSettings(base_url="http://x", has_more_path="has_more")
    assert flag.next_page_path is None and flag.has_more_path == "has_more"
    with pytest.raises(ValueError, match="not both"):
        PlatformSettings(base_url="http://x", has_more_path="more", next_page_path="next")
    with pytest.raises(ValueError, match="next_page_path"):
        PlatformSettings(base_url="http://x", next_page_path=None)


def test_callbacks_have_their_own_allow_list(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("callback:\n  allowed_hosts: [cron.internal]\n")
    s = load_settings(cfg)
    # a callback host is not a host sources and sinks may reach: the security
    # list stays its default, empty (pinned here on purpose)
    assert s.security.allowed_hosts == []
    assert s.callback_hosts() == ["cron.internal"]
    s = load_settings(None, callback={"base_url": "https://cron.example:8443/runs"})
    assert s.callback_hosts() == ["cron.example:8443"]  # the CronJob's origin only
    # nothing set: the callback hosts are the security list
    assert load_settings(None).callback_hosts() == SecuritySettings().allowed_hosts


@pytest.mark.parametrize(
    "value", ["dns.example:53", "localhost:53", "127.0.0.1", "127.0.0.1:0", "::1:53", "[x]:53"]
)
def test_the_dns_server_is_an_ip_address_and_port(tmp_path, value):
    # a host name would itself need resolving, by a resolver the setting is meant to replace
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"security:\n  dns_server: {value!r}\n")
    with pytest.raises(ArtemisError) as e:
        load_settings(cfg)
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert "security.dns_server" in e.value.message and "IP address" in e.value.message


def test_a_dns_server_may_be_ipv4_or_bracketed_ipv6():
    assert SecuritySettings(dns_server="10.0.0.53:53").dns_server == "10.0.0.53:53"
    assert SecuritySettings(dns_server="[2001:db8::1]:5353").dns_server == "[2001:db8::1]:5353"


def test_the_defaults_name_no_sample_server(monkeypatch):
    """Built-in settings point nowhere: no source, sink, platform or allowed host of the
    sample servers (the embedded stack sets those), so a worker deployed without its own
    output sends records nowhere it did not name."""
    for key in [k for k in os.environ if k.startswith("ARTEMIS")]:
        monkeypatch.delenv(key)
    dumped = json.dumps(Settings().model_dump(mode="json"))
    assert "8300" not in dumped
    s = Settings()
    assert s.task_defaults == {} and s.output_defaults == {}
    assert s.security.allowed_hosts == [] and s.crawler.platforms == {}
