"""A provenance's ``http_cfg`` acts on every request of its source, or is refused at import
with the reason: proxy, TLS verification and CA bundle, connect timeout, compression,
default headers, HTTP/2. Each against real servers on 127.0.0.1, asserting what the
source (or the proxy) received."""

from __future__ import annotations

import gzip
import json
import time

import pytest
import yaml
from aiohttp import web

from artemis.errors import ArtemisError, ErrorCode
from artemis.registry.client import ContractClient
from artemis.registry.yaml_io import import_yaml
from tests.helpers import http_client
from tests.registry.net import (
    CountingProxy,
    FullBacklog,
    Server,
    contract_client,
    contract_of,
    json_ok,
    make_certs,
    provenance,
    settings_for,
    unique_code,
)


async def echo_encoding(request: web.Request) -> web.Response:
    """Gzip when asked for it (as a real server does), saying what was asked."""
    asked = request.headers.get("Accept-Encoding", "")
    body = json.dumps({"items": [], "asked": asked}).encode()
    if "gzip" in asked:
        return web.Response(
            body=gzip.compress(body),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
    return web.Response(body=body, content_type="application/json")


@pytest.fixture
async def source():
    server = await Server({("GET", "/items"): echo_encoding}).start()
    yield server
    await server.stop()


@pytest.fixture
async def proxy():
    p = await CountingProxy().start()
    yield p
    await p.stop()


async def get(cc: ContractClient, path: str = "/items", **params):
    async with http_client() as http:
        return await cc.send(http, "GET", f"{cc.base}{path}", params, f"{cc.code} GET")


def refused(reg, key_file, doc) -> ArtemisError:
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="src.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    return e.value


# -- proxy_url -------------------------------------------------------------------------------
async def test_proxy_url_sends_every_request_through_the_proxy(reg, key_file, source, proxy):
    doc = provenance(unique_code("proxied"), source.url, http_cfg=[{"proxy_url": proxy.url}])
    cc = contract_client(reg, key_file, doc)
    for page in (1, 2, 3):
        resp = await get(cc, page=page)
        assert resp.status_code == 200
    # absolute-form requests: the proxy saw each, the source got each from the proxy
    assert proxy.lines == [f"GET {source.url}/items?page={n}" for n in (1, 2, 3)]
    assert [s.query["page"] for s in source.seen] == ["1", "2", "3"]


async def test_without_proxy_url_requests_go_straight_to_the_source(reg, key_file, source, proxy):
    cc = contract_client(reg, key_file, provenance(unique_code("direct"), source.url))
    assert (await get(cc)).status_code == 200
    assert proxy.lines == [] and len(source.seen) == 1


async def test_an_https_source_goes_through_the_proxy_by_connect(reg, key_file, tmp_path, proxy):
    certs = make_certs(tmp_path)
    tls = await Server({("GET", "/items"): json_ok}, tls=certs.server).start()
    try:
        doc = provenance(
            unique_code("tunnel"),
            tls.url,
            http_cfg=[{"proxy_url": proxy.url, "tls_ca_bundle_path": str(certs.ca_file)}],
        )
        cc = contract_client(reg, key_file, doc)
        assert (await get(cc)).status_code == 200
        port = tls.url.rsplit(":", 1)[1]
        assert proxy.lines == [f"CONNECT 127.0.0.1:{port}"]
        assert len(tls.seen) == 1
    finally:
        await tls.stop()


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://ops:hunter2-proxy-pass@proxy.example:3128", "carries a user or password"),
        ("socks5://proxy.example:1080", "must be an http:// URL"),
        ("https://proxy.example:3128", "must be an http:// URL"),
    ],
)
def test_a_proxy_url_with_a_login_or_another_scheme_is_refused(reg, key_file, url, why):
    doc = provenance(unique_code("badproxy"), "http://127.0.0.1:9", http_cfg=[{"proxy_url": url}])
    err = refused(reg, key_file, doc)
    assert "http_cfg[0]: proxy_url" in err.message and why in err.message
    assert "hunter2" not in err.message and "hunter2" not in json.dumps(err.details)


# -- TLS -------------------------------------------------------------------------------------
@pytest.fixture
async def tls_source(tmp_path):
    certs = make_certs(tmp_path)
    server = await Server({("GET", "/items"): json_ok}, tls=certs.server).start()
    yield server, certs
    await server.stop()


async def test_an_untrusted_certificate_fails_by_default_naming_the_check(
    reg, key_file, tls_source
):
    server, _ = tls_source
    cc = contract_client(reg, key_file, provenance(unique_code("tls_default"), server.url))
    with pytest.raises(ArtemisError) as e:
        await get(cc)
    assert e.value.code is ErrorCode.TLS_VERIFY_FAILED and not e.value.retryable
    assert e.value.details["reason"] == "TLS certificate not trusted"
    assert "certificate verify failed" in e.value.message
    assert server.seen == []  # the handshake failed: no request reached the source


async def test_tls_verify_disabled_accepts_the_certificate(reg, key_file, tls_source):
    server, _ = tls_source
    doc = provenance(unique_code("tls_off"), server.url, http_cfg=[{"tls_verify_enabled": False}])
    cc = contract_client(reg, key_file, doc)
    assert (await get(cc)).status_code == 200
    assert len(server.seen) == 1


async def test_a_ca_bundle_verifies_the_source_and_another_ca_does_not(reg, key_file, tls_source):
    server, certs = tls_source
    doc = provenance(
        unique_code("tls_ca"),
        server.url,
        http_cfg=[{"tls_ca_bundle_path": str(certs.ca_file), "tls_verify_enabled": True}],
    )
    cc = contract_client(reg, key_file, doc)
    assert (await get(cc)).status_code == 200
    doc = provenance(
        unique_code("tls_other"),
        server.url,
        http_cfg=[{"tls_ca_bundle_path": str(certs.other_ca_file)}],
    )
    cc = contract_client(reg, key_file, doc)
    with pytest.raises(ArtemisError, match="certificate verify failed"):
        await get(cc)
    assert len(server.seen) == 1


def test_a_missing_ca_bundle_stops_the_run_before_any_request(reg, key_file, tmp_path):
    doc = provenance(
        unique_code("tls_missing"),
        "https://127.0.0.1:9",
        http_cfg=[{"tls_ca_bundle_path": str(tmp_path / "nowhere.pem")}],
    )
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    with pytest.raises(ArtemisError) as e:
        ContractClient(
            contract_of(reg, doc["provenance"]["provenance_code"]), settings_for(reg, key_file)
        )
    assert e.value.code is ErrorCode.CONFIG_ERROR and not e.value.retryable
    assert "http_cfg.tls_ca_bundle_path" in e.value.message and "nowhere.pem" in e.value.message


@pytest.mark.parametrize(
    "cfg, why",
    [
        (
            {"tls_verify_enabled": False, "tls_ca_bundle_path": "/etc/ssl/ca.pem"},
            "set one of them",
        ),
        ({"tls_ca_bundle_path": "certs/ca.pem"}, "absolute path"),
    ],
)
def test_contradictory_tls_fields_are_refused(reg, key_file, cfg, why):
    err = refused(
        reg, key_file, provenance(unique_code("tls_bad"), "https://x.example", http_cfg=[cfg])
    )
    assert "http_cfg[0]: " in err.message and why in err.message


# -- timeout_connect_millis --------------------------------------------------------------------
async def test_the_connect_timeout_cuts_a_connection_that_never_completes(reg, key_file):
    backlog = FullBacklog()
    try:
        doc = provenance(
            unique_code("connect"),
            f"http://127.0.0.1:{backlog.port}",
            # the read timeout is long: only the connect timeout can end this quickly
            http_cfg=[{"timeout_connect_millis": 300, "timeout_read_millis": 30_000}],
        )
        cc = contract_client(reg, key_file, doc)
        began = time.monotonic()
        with pytest.raises(ArtemisError) as e:
            await get(cc)
        took = time.monotonic() - began
    finally:
        backlog.close()
    assert e.value.code is ErrorCode.SOURCE_ERROR and e.value.retryable
    assert e.value.details["reason"] == "connect timed out"
    assert 0.25 <= took < 15, took  # 0.3 s, with room for a loaded machine


def test_a_timeout_that_is_not_positive_is_refused(reg, key_file):
    doc = provenance(
        unique_code("t0"), "http://x.example", http_cfg=[{"timeout_connect_millis": 0}]
    )
    assert "timeout_connect_millis must be positive" in refused(reg, key_file, doc).message


# -- accept_compress ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg, asked",
    [
        (None, "gzip, deflate"),
        ({"accept_compress": True}, "gzip, deflate"),
        ({"accept_compress": False}, "identity"),
    ],
)
async def test_accept_encoding_follows_accept_compress(reg, key_file, source, cfg, asked):
    doc = provenance(unique_code("gz"), source.url, **({"http_cfg": [cfg]} if cfg else {}))
    resp = await get(contract_client(reg, key_file, doc))
    assert source.seen[-1].headers["Accept-Encoding"] == asked
    # a compressed answer is decoded, an identity one read as it is
    assert resp.json()["asked"] == asked


def test_an_accept_encoding_header_is_refused_in_favour_of_accept_compress(reg, key_file):
    doc = provenance(
        unique_code("ae"),
        "http://x.example",
        http_cfg=[{"default_headers_json": {"Accept-Encoding": "br"}}],
    )
    assert "Accept-Encoding is set by accept_compress" in refused(reg, key_file, doc).message


# -- default_headers_json ----------------------------------------------------------------------
async def test_default_headers_reach_the_source(reg, key_file, source):
    doc = provenance(
        unique_code("hdr"),
        source.url,
        http_cfg=[
            {
                "default_headers_json": {
                    "User-Agent": "Artemis-test/1",
                    "X-Team": "data",
                    "X-Api-Version": 2,
                }
            }
        ],
    )
    await get(contract_client(reg, key_file, doc))
    got = source.seen[-1].headers
    assert got["User-Agent"] == "Artemis-test/1"
    assert got["X-Team"] == "data" and got["X-Api-Version"] == "2"


@pytest.mark.parametrize("name", ["Authorization", "cookie", "Proxy-Authorization"])
def test_a_secret_header_in_the_file_is_refused(reg, key_file, name):
    doc = provenance(
        unique_code("sh"),
        "http://x.example",
        http_cfg=[{"default_headers_json": {name: "Bearer in-the-file-0123456789"}}],
    )
    err = refused(reg, key_file, doc)
    assert f"default_headers_json: {name} would be a secret" in err.message
    assert "in-the-file" not in err.message


# -- prefer_http2 ------------------------------------------------------------------------------
def test_prefer_http2_is_refused_with_the_reason(reg, key_file):
    doc = provenance(unique_code("h2"), "http://x.example", http_cfg=[{"prefer_http2": True}])
    err = refused(reg, key_file, doc)
    assert "http_cfg[0]: prefer_http2: true is not supported" in err.message
    assert "HTTP/1.1" in err.message


def test_prefer_http2_false_is_accepted(reg, key_file):
    doc = provenance(unique_code("h1"), "http://x.example", http_cfg=[{"prefer_http2": False}])
    import_yaml(reg, yaml.safe_dump(doc), key_file)


def test_a_row_written_around_the_import_stops_the_run(reg, key_file):
    """A switch writes columns past the file's checks: the run refuses the row."""
    from artemis.registry.writes import gray_switch

    code = unique_code("h2switch")
    doc = provenance(code, "http://x.example", http_cfg=[{"prefer_http2": False}])
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    contract = contract_of(reg, code)
    with reg.begin() as conn:
        gray_switch(
            conn, "http_cfg", contract.http["id"], {"prefer_http2": True}, "2025-06-01T00:00:00Z"
        )
    with pytest.raises(ArtemisError) as e:
        ContractClient(contract_of(reg, code), settings_for(reg, key_file))
    assert e.value.code is ErrorCode.CONFIG_ERROR and "prefer_http2" in e.value.message


def test_the_http_auth_columns_go_down_and_up_again(db_engine):
    from alembic import command
    from sqlalchemy import inspect

    from artemis.migrate import alembic_config

    cfg = alembic_config(str(db_engine.url.render_as_string(hide_password=False)))

    def columns(table: str) -> set[str]:
        return {c["name"] for c in inspect(db_engine).get_columns(table)}

    added = {"principal_env_name", "principal_ciphertext", "token_auth_method_code"}
    try:
        command.downgrade(cfg, "0013_source_harvest")
        assert "tls_ca_bundle_path" not in columns("reg_prov_http_cfg")
        assert not added & columns("reg_prov_credential")
    finally:
        command.upgrade(cfg, "head")
    assert "tls_ca_bundle_path" in columns("reg_prov_http_cfg")
    assert added <= columns("reg_prov_credential")
    command.check(cfg)
