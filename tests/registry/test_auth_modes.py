"""Credentials of every auth type as the source receives them (HTTP Basic, OAuth2 client
credentials through a TOKEN endpoint), ``is_auth_required`` refusing a run without a
usable key, endpoint-bound keys, and the rate buckets per key and per endpoint. Real
servers on 127.0.0.1; the OAuth2 authorization server is on an origin of its own."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import time
from urllib.parse import parse_qs

import pytest
import yaml
from aiohttp import web
from sqlalchemy import select

from artemis.crawler.vault import vault_for
from artemis.errors import ArtemisError, ErrorCode
from artemis.ratelimit import RateGateRow
from artemis.redact import REDACTED, redact_text
from artemis.registry import auth as auth_module
from artemis.registry.client import ContractClient, Credentials, Sending, require_credentials
from artemis.registry.models import RegProvCredential
from artemis.registry.yaml_io import export_yaml, import_yaml
from tests.helpers import assert_rate_at_most, http_client
from tests.registry.net import (
    CountingProxy,
    Server,
    contract_client,
    contract_of,
    json_ok,
    make_certs,
    provenance,
    settings_for,
    unique_code,
)


@pytest.fixture(autouse=True)
def no_benched_keys():
    """Keys are benched per process by row id, and each test's rows may reuse the ids of
    the last one's (a refused OAuth2 client is benched for an hour)."""
    Credentials._benched.clear()
    yield
    Credentials._benched.clear()


def secret_value(tag: str) -> str:
    return f"{tag}-{secrets.token_hex(12)}"


async def get(cc: ContractClient, path: str = "/items", endpoint=None, **params):
    async with http_client() as http:
        how = Sending(endpoint=endpoint)
        return await cc.send(http, "GET", f"{cc.base}{path}", params, f"{cc.code} GET", how)


@pytest.fixture
async def source():
    server = await Server({("GET", "/items"): json_ok, ("GET", "/detail"): json_ok}).start()
    yield server
    await server.stop()


# -- BASIC -----------------------------------------------------------------------------------
async def test_basic_sends_user_and_password_as_the_source_receives_them(
    reg, key_file, source, monkeypatch
):
    user, password = "harvester", secret_value("pw")
    monkeypatch.setenv("SRC_USER", user)
    monkeypatch.setenv("SRC_PASSWORD", password)
    code = unique_code("basic")
    doc = provenance(
        code,
        source.url,
        credential=[
            {
                "credential_name": "login",
                "auth_type_code": "BASIC",
                "principal_env": "SRC_USER",
                "secret_env": "SRC_PASSWORD",
            }
        ],
    )
    report = import_yaml(reg, yaml.safe_dump(doc), key_file).to_dict()
    assert report["credentials"][0]["principal_env"] == "SRC_USER"
    assert report["credentials"][0]["as"].startswith("header Authorization (Basic")
    assert password not in json.dumps(report)
    cc = ContractClient(contract_of(reg, code), settings_for(reg, key_file))
    assert (await get(cc)).status_code == 200
    header = source.seen[-1].headers["Authorization"]
    assert header.startswith("Basic ")
    assert base64.b64decode(header[6:]).decode() == f"{user}:{password}"
    # both halves sealed in the database, neither in clear, nor in the export
    with reg.connect() as conn:
        row = conn.execute(select(RegProvCredential.__table__)).one()
    assert row.principal_ciphertext and row.secret_ciphertext
    assert user not in row.principal_ciphertext and password not in row.secret_ciphertext
    exported = export_yaml(reg, code)
    assert "principal_env: SRC_USER" in exported and password not in exported
    assert "principal_ciphertext" not in exported
    assert redact_text(f"sent {password}") == f"sent {REDACTED}"


async def test_a_basic_login_still_works_after_the_vault_key_is_rotated(
    reg, key_file, source, monkeypatch
):
    user, password = "rotating-user", secret_value("pw")
    monkeypatch.setenv("SRC_USER", user)
    monkeypatch.setenv("SRC_PASSWORD", password)
    code = unique_code("rotated")
    doc = provenance(
        code,
        source.url,
        credential=[
            {
                "credential_name": "login",
                "auth_type_code": "BASIC",
                "principal_env": "SRC_USER",
                "secret_env": "SRC_PASSWORD",
            }
        ],
    )
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    with reg.connect() as conn:
        before = conn.execute(select(RegProvCredential.__table__)).one()
    # a fresh salt under the same master: both halves move to the new key together
    vault_for(settings_for(reg, key_file)).rotate()
    with reg.connect() as conn:
        after = conn.execute(select(RegProvCredential.__table__)).one()
    assert after.encryption_key_id != before.encryption_key_id
    assert after.principal_ciphertext != before.principal_ciphertext
    cc = ContractClient(contract_of(reg, code), settings_for(reg, key_file))
    await get(cc)
    header = source.seen[-1].headers["Authorization"]
    assert base64.b64decode(header[6:]).decode() == f"{user}:{password}"


def test_a_pair_missing_its_principal_stops_the_run(reg, key_file, monkeypatch):
    """A row written around the import (its principal dropped by hand) is not skipped in
    silence: the run names it, and registry check reports it."""
    from sqlalchemy import update

    from artemis.registry.writes import check_registry

    monkeypatch.setenv("SRC_USER", "someone")
    monkeypatch.setenv("SRC_PASSWORD", secret_value("pw"))
    code = unique_code("half")
    doc = provenance(
        code,
        "http://127.0.0.1:9",
        credential=[
            {
                "credential_name": "login",
                "auth_type_code": "BASIC",
                "principal_env": "SRC_USER",
                "secret_env": "SRC_PASSWORD",
            }
        ],
    )
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    table = RegProvCredential.__table__  # type: ignore[attr-defined]
    with reg.begin() as conn:
        conn.execute(update(table).values(principal_ciphertext=None))
        kinds = [f["kind"] for f in check_registry(conn)]
    assert "credential_without_principal" in kinds
    with pytest.raises(ArtemisError) as e:
        ContractClient(contract_of(reg, code), settings_for(reg, key_file))
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert "credential 'login' (BASIC) has no principal" in e.value.message


@pytest.mark.parametrize(
    "cred, why",
    [
        ({"auth_type_code": "BASIC", "secret_env": "SRC_PASSWORD"}, "BASIC needs principal_env"),
        (
            {"auth_type_code": "BEARER", "secret_env": "SRC_PASSWORD", "principal_env": "SRC_USER"},
            "principal_env is for BASIC, OAUTH2_CLIENT_CREDENTIALS, OAUTH2_REFRESH_TOKEN, "
            "SESSION_TOKEN credentials, not BEARER",
        ),
        (
            {
                "auth_type_code": "BASIC",
                "secret_env": "SRC_PASSWORD",
                "principal_env": "SRC_USER",
                "token_auth_method_code": "CLIENT_SECRET_POST",
            },
            "token_auth_method_code is for OAUTH2_CLIENT_CREDENTIALS",
        ),
        (
            {"auth_type_code": "BASIC", "secret_env": "SRC_PASSWORD", "principal_env": "PGUSER"},
            "PGUSER is one of the service's own variables",
        ),
    ],
)
def test_credential_fields_that_do_not_go_together_are_refused(
    reg, key_file, monkeypatch, cred, why
):
    monkeypatch.setenv("SRC_USER", "someone")
    monkeypatch.setenv("SRC_PASSWORD", secret_value("pw"))
    doc = provenance(
        unique_code("badcred"), "http://x.example", credential=[{"credential_name": "c", **cred}]
    )
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="c.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert "c.yaml: credential[0]" in e.value.message and why in e.value.message


def test_a_basic_user_with_a_colon_is_refused(reg, key_file, monkeypatch):
    monkeypatch.setenv("SRC_USER", "team:ops")
    monkeypatch.setenv("SRC_PASSWORD", secret_value("pw"))
    doc = provenance(
        unique_code("colon"),
        "http://x.example",
        credential=[
            {
                "credential_name": "c",
                "auth_type_code": "BASIC",
                "principal_env": "SRC_USER",
                "secret_env": "SRC_PASSWORD",
            }
        ],
    )
    with pytest.raises(ArtemisError, match=r"may not contain ':' \(RFC 7617\)") as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file)
    assert "team:ops" not in e.value.message


# -- OAuth2 client credentials -----------------------------------------------------------------
class AuthServer:
    """An authorization server (RFC 6749 §4.4) and a resource server on two origins. Each
    access token is good for ``uses`` requests, after which the source answers 401; the
    token endpoint states ``expires_in``."""

    def __init__(self, client_id: str, client_secret: str, uses: int, expires_in: float | None):
        self.client_id, self.client_secret = client_id, client_secret
        self.uses, self.expires_in = uses, expires_in
        self.issued: list[str] = []
        self.used: dict[str, int] = {}
        self.unauthorized = 0
        self.refuse = False
        self.token_server = Server({("POST", "/oauth/token"): self.token})
        self.source = Server({("GET", "/items"): self.items})

    async def start(self) -> AuthServer:
        await self.token_server.start()
        await self.source.start()
        return self

    async def stop(self) -> None:
        await self.token_server.stop()
        await self.source.stop()

    async def token(self, request: web.Request) -> web.Response:
        form = parse_qs((await request.read()).decode())
        if form.get("grant_type") != ["client_credentials"]:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            cid, _, sec = base64.b64decode(auth[6:]).decode().partition(":")
        else:
            cid, sec = form.get("client_id", [""])[0], form.get("client_secret", [""])[0]
        if self.refuse or (cid, sec) != (self.client_id, self.client_secret):
            return web.json_response({"error": "invalid_client"}, status=401)
        value = f"at-{len(self.issued)}-{secrets.token_hex(16)}"
        self.issued.append(value)
        self.used[value] = 0
        body: dict[str, object] = {"access_token": value, "token_type": "Bearer"}
        if self.expires_in is not None:
            body["expires_in"] = self.expires_in
        return web.json_response(body)

    async def items(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        value = auth.removeprefix("Bearer ")
        if value not in self.used or self.used[value] >= self.uses:
            self.unauthorized += 1
            return web.json_response({"error": "invalid_token"}, status=401)
        self.used[value] += 1
        return web.json_response({"items": [{"id": 1}]})


def oauth_doc(code: str, auth: AuthServer, method: str | None = None, **cred) -> dict:
    return provenance(
        code,
        auth.source.url,
        endpoint_def=[
            {
                "endpoint_name": "token",
                "endpoint_usage_code": "TOKEN",
                "http_method_code": "POST",
                "path_template": f"{auth.token_server.url}/oauth/token",
                "default_body_payload": {"scope": "read:items"},
            }
        ],
        credential=[
            {
                "credential_name": "client",
                "auth_type_code": "OAUTH2_CLIENT_CREDENTIALS",
                "principal_env": "OAUTH_CLIENT_ID",
                "secret_env": "OAUTH_CLIENT_SECRET",
                **({"token_auth_method_code": method} if method else {}),
                **cred,
            }
        ],
    )


@pytest.fixture
def client_pair(monkeypatch):
    client_id, client_secret = f"client-{secrets.token_hex(6)}", secret_value("cs")
    monkeypatch.setenv("OAUTH_CLIENT_ID", client_id)
    monkeypatch.setenv("OAUTH_CLIENT_SECRET", client_secret)
    return client_id, client_secret


async def oauth(client_pair: tuple[str, str], uses: int, expires_in: float | None) -> AuthServer:
    client_id, client_secret = client_pair
    return await AuthServer(client_id, client_secret, uses=uses, expires_in=expires_in).start()


@pytest.mark.parametrize("method", [None, "CLIENT_SECRET_BASIC", "CLIENT_SECRET_POST"])
async def test_oauth2_tokens_are_fetched_cached_and_renewed_once_per_expiry(
    reg, key_file, client_pair, method
):
    client_id, client_secret = client_pair
    auth = await oauth(client_pair, uses=3, expires_in=3600)
    try:
        code = unique_code("oauth")
        report = import_yaml(reg, yaml.safe_dump(oauth_doc(code, auth, method)), key_file)
        cc = ContractClient(contract_of(reg, code), settings_for(reg, key_file))
        for page in range(1, 8):
            assert (await get(cc, page=page)).status_code == 200
    finally:
        await auth.stop()
    # 7 requests, 3 per token: 3 tokens, each replaced once after the source's 401
    assert len(auth.issued) == 3 and auth.unauthorized == 2
    assert len(auth.token_server.seen) == 3
    # pages 4 and 7 met an expired token first, then went again with a new one
    pages = [s.query["page"] for s in auth.source.seen]
    assert pages == ["1", "2", "3", "4", "4", "5", "6", "7", "7"]
    token_requests = auth.token_server.seen
    form = parse_qs(token_requests[0].body.decode())
    assert form["grant_type"] == ["client_credentials"] and form["scope"] == ["read:items"]
    if method == "CLIENT_SECRET_POST":
        assert form["client_id"] == [client_id] and form["client_secret"] == [client_secret]
        assert "Authorization" not in token_requests[0].headers
    else:
        assert "client_secret" not in form
        assert token_requests[0].headers["Authorization"].startswith("Basic ")
    # The client secret and id reached the token endpoint only; the access tokens the
    # source only.
    source_texts = " ".join(auth.source.texts())
    assert client_secret not in source_texts and client_id not in source_texts
    token_texts = " ".join(auth.token_server.texts())
    assert not any(t in token_texts for t in auth.issued)
    # the token in use is redacted from any text (those it replaced are never used again)
    assert redact_text(f"token {auth.issued[-1]}") == f"token {REDACTED}"
    # the import report says where each goes
    entry = report.credentials[0]
    port_token = auth.token_server.url.rsplit(":", 1)[1]
    port_source = auth.source.url.rsplit(":", 1)[1]
    assert entry["sent_to"] == [f"http://127.0.0.1:{port_token}"]
    assert entry["token_sent_to"] == [f"http://127.0.0.1:{port_source}"]
    assert entry["as"].startswith("client credentials to the TOKEN endpoint")


async def test_an_access_token_is_fetched_again_when_expires_in_runs_out(
    reg, key_file, client_pair
):
    # expires_in 0: gone at once, so each request needs a new token (and no 401 is met)
    auth = await oauth(client_pair, uses=100, expires_in=0)
    try:
        code = unique_code("oauth_exp")
        cc = contract_client(reg, key_file, oauth_doc(code, auth))
        for _ in range(3):
            assert (await get(cc)).status_code == 200
    finally:
        await auth.stop()
    assert len(auth.issued) == 3 and auth.unauthorized == 0


async def test_requests_in_flight_together_share_one_token_fetch(reg, key_file, client_pair):
    auth = await oauth(client_pair, uses=100, expires_in=None)
    try:
        cc = contract_client(reg, key_file, oauth_doc(unique_code("oauth_many"), auth))
        async with http_client() as http:
            answers = await asyncio.gather(
                *(cc.send(http, "GET", f"{cc.base}/items", {"n": n}, "get") for n in range(8))
            )
    finally:
        await auth.stop()
    assert [a.status_code for a in answers] == [200] * 8
    assert len(auth.issued) == 1 and len(auth.source.seen) == 8


async def test_a_refused_client_fails_without_retry_and_without_its_secret(
    reg, key_file, client_pair
):
    auth = await oauth(client_pair, uses=100, expires_in=None)
    auth.refuse = True
    try:
        cc = contract_client(reg, key_file, oauth_doc(unique_code("oauth_refused"), auth))
        with pytest.raises(ArtemisError) as e:
            await get(cc)
    finally:
        await auth.stop()
    assert e.value.code is ErrorCode.SOURCE_ERROR and not e.value.retryable
    assert "refused credential 'client'" in e.value.message and "invalid_client" in e.value.message
    assert client_pair[1] not in e.value.message
    assert auth.source.seen == []  # no token, no request to the source


def test_an_oauth2_client_needs_a_token_endpoint(reg, key_file, client_pair):
    doc = provenance(
        unique_code("oauth_none"),
        "http://x.example",
        credential=[
            {
                "credential_name": "client",
                "auth_type_code": "OAUTH2_CLIENT_CREDENTIALS",
                "principal_env": "OAUTH_CLIENT_ID",
                "secret_env": "OAUTH_CLIENT_SECRET",
            }
        ],
    )
    with pytest.raises(
        ArtemisError, match="needs an endpoint_def row with endpoint_usage_code TOKEN"
    ):
        import_yaml(reg, yaml.safe_dump(doc), key_file)


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda d: d["endpoint_def"][1].update(http_method_code="GET"), "asked by POST"),
        (
            lambda d: d["endpoint_def"][1].update(
                path_template="https://user:tok-pass@auth.example/token"
            ),
            "carries a user or password",
        ),
        (lambda d: d["credential"][0].update(endpoint_name="token"), "not to the TOKEN endpoint"),
    ],
)
async def test_a_token_endpoint_set_up_wrong_is_refused(reg, key_file, client_pair, change, why):
    auth = AuthServer(*client_pair, uses=1, expires_in=None)
    auth.token_server.url, auth.source.url = "https://auth.example", "https://api.example"
    doc = oauth_doc(unique_code("oauth_bad"), auth)
    change(doc)
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file)
    assert why in e.value.message and "tok-pass" not in e.value.message


# -- the token endpoint's transport, headers and scheme -----------------------------------------
@pytest.fixture
async def proxy():
    p = await CountingProxy().start()
    yield p
    await p.stop()


async def _servers(
    client_pair: tuple[str, str], where: str, source_tls=None, token_tls=None
) -> AuthServer:
    """An authorization server on an origin of its own, or (own-origin) its token
    endpoint on the source's server."""
    auth = AuthServer(*client_pair, uses=100, expires_in=None)
    auth.source.tls, auth.token_server.tls = source_tls, token_tls
    if where == "own-origin":
        auth.source.routes[("POST", "/oauth/token")] = auth.token
    return await auth.start()


def _token_doc(code: str, auth: AuthServer, where: str, **http) -> dict:
    doc = oauth_doc(code, auth)
    if where == "own-origin":
        doc["endpoint_def"][1]["path_template"] = "/oauth/token"
    doc["http_cfg"] = [{"scope_code": "SOURCE", "effective_from": "2025-01-01T00:00:00Z", **http}]
    return doc


@pytest.mark.parametrize("where", ["elsewhere", "own-origin"])
async def test_the_source_proxy_and_default_headers_go_to_its_own_origin_only(
    reg, key_file, client_pair, proxy, where
):
    api_key = secret_value("hdr")
    auth = await _servers(client_pair, where)
    try:
        doc = _token_doc(
            unique_code("oauth_route"),
            auth,
            where,
            proxy_url=proxy.url,
            default_headers_json={"X-Api-Key": api_key, "X-Team": "data"},
        )
        cc = contract_client(reg, key_file, doc)
        assert (await get(cc, page=1)).status_code == 200
    finally:
        await auth.stop()
    [token_request] = [s for s in auth.token_server.seen + auth.source.seen if s.method == "POST"]
    [items] = [s for s in auth.source.seen if s.method == "GET"]
    # The source gets its proxy and default headers wherever the token endpoint is.
    assert items.headers["X-Api-Key"] == api_key and items.headers["X-Team"] == "data"
    assert items.headers["Authorization"] == f"Bearer {auth.issued[0]}"
    if where == "elsewhere":
        # An authorization server elsewhere: only what OAuth2 needs (and the endpoint's
        # own body), not through the source's proxy.
        assert len(auth.token_server.seen) == 1
        assert proxy.lines == [f"GET {auth.source.url}/items?page=1"]
        assert "X-Api-Key" not in token_request.headers and "X-Team" not in token_request.headers
        assert api_key not in " ".join(auth.token_server.texts())
        assert token_request.headers["Authorization"].startswith("Basic ")
        assert parse_qs(token_request.body.decode()) == {
            "grant_type": ["client_credentials"],
            "scope": ["read:items"],
        }
    else:
        # On the source's own origin, the token request travels as the source's do.
        assert auth.token_server.seen == []
        assert proxy.lines == [
            f"POST {auth.source.url}/oauth/token",
            f"GET {auth.source.url}/items?page=1",
        ]
        assert token_request.headers["X-Api-Key"] == api_key


async def test_a_token_endpoint_elsewhere_is_verified_though_the_source_is_not(
    reg, key_file, client_pair, tmp_path, monkeypatch
):
    """``tls_verify_enabled: false`` is the source's: the client secret does not go to an
    authorization server whose certificate the worker cannot verify."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    certs = make_certs(tmp_path)  # a CA the worker's trust store does not hold
    auth = await _servers(client_pair, "elsewhere", certs.server, certs.server)
    try:
        doc = _token_doc(unique_code("oauth_noverify"), auth, "elsewhere", tls_verify_enabled=False)
        cc = contract_client(reg, key_file, doc)
        with pytest.raises(ArtemisError) as e:
            await get(cc)
    finally:
        await auth.stop()
    assert e.value.code is ErrorCode.TLS_VERIFY_FAILED and not e.value.retryable
    assert "token endpoint 'token'" in e.value.message
    assert "certificate verify failed" in e.value.message
    assert client_pair[1] not in e.value.message
    # the handshake failed: no secret reached the token endpoint, no request the source
    assert auth.token_server.seen == [] and auth.source.seen == []


@pytest.mark.parametrize("where", ["elsewhere", "own-origin"])
async def test_a_source_ca_bundle_verifies_its_own_origin_and_not_a_token_endpoint_elsewhere(
    reg, key_file, client_pair, tmp_path, monkeypatch, where
):
    """The source is verified against its CA bundle; an authorization server elsewhere
    (certified by a CA of the worker's trust store, as a public one is) against the trust
    store; a token endpoint on the source's origin against the source's bundle."""
    (tmp_path / "ours").mkdir()
    (tmp_path / "public").mkdir()
    ours, public = make_certs(tmp_path / "ours"), make_certs(tmp_path / "public")
    monkeypatch.setenv("SSL_CERT_FILE", str(public.ca_file))  # the worker's trust store
    auth = await _servers(client_pair, where, ours.server, public.server)
    try:
        doc = _token_doc(unique_code("oauth_ca"), auth, where, tls_ca_bundle_path=str(ours.ca_file))
        cc = contract_client(reg, key_file, doc)
        assert (await get(cc)).status_code == 200
    finally:
        await auth.stop()
    assert len(auth.issued) == 1
    token_server = auth.token_server if where == "elsewhere" else auth.source
    assert [s.path for s in token_server.seen if s.method == "POST"] == ["/oauth/token"]
    [items] = [s for s in auth.source.seen if s.method == "GET"]
    assert items.headers["Authorization"] == f"Bearer {auth.issued[0]}"


@pytest.mark.parametrize(
    "url, origin",
    [
        ("http://127.0.0.1:8/oauth/token", "http://127.0.0.1:8"),
        ("http://127.0.0.9/oauth/token", "http://127.0.0.9:80"),
        ("http://localhost:8/oauth/token", "http://localhost:8"),
        ("http://[::1]:8/oauth/token", "http://[::1]:8"),
    ],
)
def test_an_http_token_url_on_loopback_is_accepted(reg, key_file, client_pair, url, origin):
    auth = AuthServer(*client_pair, uses=1, expires_in=None)
    auth.source.url = "https://api.example"
    doc = oauth_doc(unique_code("oauth_loop"), auth)
    doc["endpoint_def"][1]["path_template"] = url
    report = import_yaml(reg, yaml.safe_dump(doc), key_file)
    assert report.credentials[0]["sent_to"] == [origin]


@pytest.mark.parametrize(
    "base, token, where",
    [
        # a whole token URL in clear to another host
        ("https://api.example", "http://auth.example/oauth/token", "endpoint_def[1]"),
        ("https://api.example", "http://10.0.0.7:8080/oauth/token", "endpoint_def[1]"),
        # a path after a base URL in clear: the secret would go in clear too
        ("http://api.example", "/oauth/token", "credential[0]"),
    ],
)
def test_an_http_token_url_off_loopback_is_refused(reg, key_file, client_pair, base, token, where):
    auth = AuthServer(*client_pair, uses=1, expires_in=None)
    auth.source.url = base
    doc = oauth_doc(unique_code("oauth_clear"), auth)
    doc["endpoint_def"][1]["path_template"] = token
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="t.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    message = e.value.message
    assert f"t.yaml: {where}" in message and "path_template" in message
    assert "must be an https:// URL" in message and "client secret" in message
    assert "in clear" in message and "loopback only" in message
    assert client_pair[1] not in message


def test_an_http_token_url_written_around_the_import_stops_the_run(reg, key_file, client_pair):
    from sqlalchemy import update

    from artemis.registry.models import RegProvEndpointDef

    auth = AuthServer(*client_pair, uses=1, expires_in=None)
    auth.token_server.url, auth.source.url = "https://auth.example", "https://api.example"
    code = unique_code("oauth_hand")
    import_yaml(reg, yaml.safe_dump(oauth_doc(code, auth)), key_file)
    table = RegProvEndpointDef.__table__  # type: ignore[attr-defined]
    with reg.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.endpoint_usage_code == "TOKEN")
            .values(path_template="http://auth.example/oauth/token")
        )
    with pytest.raises(ArtemisError) as e:
        ContractClient(contract_of(reg, code), settings_for(reg, key_file))
    assert e.value.code is ErrorCode.CONFIG_ERROR
    assert "path_template must be an https:// URL" in e.value.message


# -- a replaced access token stays redacted until it has expired -------------------------------
async def test_a_token_replaced_at_the_margin_stays_redacted_until_it_expires(
    reg, key_file, client_pair
):
    auth = await oauth(client_pair, uses=100, expires_in=3600)
    try:
        cc = contract_client(reg, key_file, oauth_doc(unique_code("oauth_margin"), auth))
        assert (await get(cc)).status_code == 200
        [first] = auth.issued
        # Its renewal point (expires_in less the margin) reached, the token still valid.
        [held] = [t for t in Credentials._tokens.values() if t.value == first]
        held.renew_at = time.monotonic() - 1
        assert (await get(cc)).status_code == 200
    finally:
        await auth.stop()
    assert len(auth.issued) == 2
    second = auth.issued[1]
    # Both redacted: the replaced one may still be in a request in flight, or its error.
    assert redact_text(f"a {first} b {second}") == f"a {REDACTED} b {REDACTED}"
    # Forgotten only once it has expired, and requests sent with it have ended.
    assert held.expires_at is not None
    assert [at for at, value in Credentials._retired if value == first] == [
        held.expires_at + auth_module.RETIRED_GRACE_S
    ]


async def test_replaced_tokens_are_forgotten_once_expired(reg, key_file, client_pair, monkeypatch):
    """Bounded: a worker fetching tokens for months does not hold every one it replaced."""
    monkeypatch.setattr(auth_module, "RETIRED_GRACE_S", 0.0)
    # expires_in 0: each token has expired by the time the next request replaces it
    auth = await oauth(client_pair, uses=100, expires_in=0)
    try:
        cc = contract_client(reg, key_file, oauth_doc(unique_code("oauth_forget"), auth))
        for _ in range(3):
            assert (await get(cc)).status_code == 200
    finally:
        await auth.stop()
    assert len(auth.issued) == 3
    for old in auth.issued[:2]:
        assert redact_text(old) == old
        assert all(value != old for _, value in Credentials._retired)
    assert redact_text(auth.issued[2]) == REDACTED  # the one in use


# -- is_auth_required --------------------------------------------------------------------------
def _secured(code: str, cred: dict | None = None) -> dict:
    """SEARCH requires auth; one query key (with ``cred``'s columns), none when None."""
    key = {"credential_name": "key", "auth_type_code": "API_KEY_QUERY", "secret_env": "SRC_KEY"}
    doc = provenance(
        code,
        "http://127.0.0.1:9",
        endpoint_def=[
            {"endpoint_name": "detail", "endpoint_usage_code": "DETAIL", "path_template": "/detail"}
        ],
        credential=[{**key, **cred}] if cred is not None else [],
    )
    doc["endpoint_def"][0]["is_auth_required"] = True
    return doc


@pytest.mark.parametrize(
    "cred",
    [
        None,  # no credential at all
        {"lifecycle_status_code": "PAUSED"},  # set aside
        {"endpoint_name": "detail"},  # bound to another endpoint
        {"deleted": True},
    ],
)
def test_an_endpoint_that_requires_auth_without_a_usable_key_is_refused_at_start(
    reg, key_file, monkeypatch, cred
):
    monkeypatch.setenv("SRC_KEY", secret_value("key"))
    code = unique_code("authreq")
    doc = _secured(code, cred)
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    contract = contract_of(reg, code)
    for attempt in (
        lambda: require_credentials(contract),
        lambda: ContractClient(contract, settings_for(reg, key_file)),
    ):
        with pytest.raises(ArtemisError) as e:
            attempt()
        assert e.value.code is ErrorCode.CONFIG_ERROR and not e.value.retryable
        message = e.value.message
        assert f"provenance {code!r}" in message and "endpoint 'items' (SEARCH)" in message
        assert "endpoint_def.is_auth_required" in message
        assert e.value.details == {
            "provenance": code,
            "endpoint": "items",
            "field": "endpoint_def.is_auth_required",
        }


def test_an_endpoint_that_requires_auth_with_a_usable_key_starts(reg, key_file, monkeypatch):
    monkeypatch.setenv("SRC_KEY", secret_value("key"))
    code = unique_code("authok")
    doc = _secured(code, {})
    doc["endpoint_def"][1]["is_auth_required"] = True  # DETAIL too: the unbound key serves it
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    require_credentials(contract_of(reg, code))


# -- endpoint-bound keys -----------------------------------------------------------------------
async def test_a_key_bound_to_an_endpoint_is_used_there_only(reg, key_file, source, monkeypatch):
    search_key, detail_key = secret_value("search"), secret_value("detail")
    monkeypatch.setenv("SEARCH_KEY", search_key)
    monkeypatch.setenv("DETAIL_KEY", detail_key)
    doc = provenance(
        unique_code("bound"),
        source.url,
        endpoint_def=[
            {"endpoint_name": "detail", "endpoint_usage_code": "DETAIL", "path_template": "/detail"}
        ],
        credential=[
            {"credential_name": "s", "auth_type_code": "API_KEY_QUERY", "secret_env": "SEARCH_KEY"},
            {
                "credential_name": "d",
                "auth_type_code": "API_KEY_QUERY",
                "secret_env": "DETAIL_KEY",
                "endpoint_name": "detail",
            },
        ],
    )
    cc = contract_client(reg, key_file, doc)
    await get(cc, "/items")
    await get(cc, "/detail")
    assert [(s.path, s.query["api_key"]) for s in source.seen] == [
        ("/items", search_key),
        ("/detail", detail_key),
    ]


async def test_a_search_then_detail_run_sends_each_endpoint_its_own_key(reg, key_file, monkeypatch):
    """Through the registry's REST source: the search pages carry the unbound key, each
    per-id DETAIL request (a path template) the key bound to DETAIL, each endpoint under
    its own rate bucket."""
    from artemis.registry.rest_source import rest_source

    search_key, detail_key = secret_value("search"), secret_value("detail")
    monkeypatch.setenv("SEARCH_KEY", search_key)
    monkeypatch.setenv("DETAIL_KEY", detail_key)

    async def ids(request: web.Request) -> web.Response:
        return web.json_response({"hits": [{"ref": n} for n in (1, 2, 3)]})

    async def one(request: web.Request) -> web.Response:
        return web.json_response({"id": int(request.match_info["ident"])})

    server = await Server({("GET", "/ids"): ids, ("GET", "/detail/{ident}"): one}).start()
    try:
        code = unique_code("search_detail")
        doc = provenance(
            code,
            server.url,
            endpoint_def=[
                {
                    "endpoint_name": "detail",
                    "endpoint_usage_code": "DETAIL",
                    "path_template": "/detail/{id}",
                }
            ],
            batching_cfg=[
                {
                    "detail_batch_size": 1,
                    "detail_id_jsonpath": "$.ref",
                    "detail_records_jsonpath": "$",
                }
            ],
            rate_limit_cfg=[
                {"qps_limit": 50, "burst_capacity": 5, "bucket_granularity_code": "PER_ENDPOINT"}
            ],
            credential=[
                {
                    "credential_name": "s",
                    "auth_type_code": "API_KEY_HEADER",
                    "secret_env": "SEARCH_KEY",
                },
                {
                    "credential_name": "d",
                    "auth_type_code": "API_KEY_HEADER",
                    "secret_env": "DETAIL_KEY",
                    "endpoint_name": "detail",
                },
            ],
        )
        doc["endpoint_def"][0]["path_template"] = "/ids"
        doc["pagination_cfg"][0].update(
            records_jsonpath="$.hits",
            record_key_jsonpath="$.ref",
            short_page_is_last=True,
            page_size_value=10,
        )
        cc = contract_client(reg, key_file, doc)
        detail_ep = cc.contract.endpoints["DETAIL"]
        assert cc.endpoint_of(f"{server.url}/detail/7") == detail_ep
        assert cc.endpoint_of(f"{server.url}/ids?page=2") == cc.contract.endpoint
        async with http_client() as http:
            pages = [p async for p in rest_source(cc, None, {}, None).pages(http, None)]
    finally:
        await server.stop()
    assert sorted(r["id"] for p in pages for r in p.records) == [1, 2, 3]
    sent = [(s.path, s.headers.get("X-API-Key")) for s in server.seen]
    assert sent[0] == ("/ids", search_key)
    assert sorted(sent[1:]) == [(f"/detail/{n}", detail_key) for n in (1, 2, 3)]
    assert _gate_keys(reg, code) == {
        f"provenance:{code}:endpoint:items",
        f"provenance:{code}:endpoint:detail",
    }


# -- bucket_granularity_code -------------------------------------------------------------------
def _gate_keys(reg, code: str) -> set[str]:
    with reg.connect() as conn:
        table = RateGateRow.__table__  # type: ignore[attr-defined]
        keys = conn.execute(select(table.c.key)).scalars().all()
    return {k for k in keys if code in k}


async def _burst(cc: ContractClient, n: int) -> None:
    async with http_client() as http:
        await asyncio.gather(
            *(
                cc.send(http, "GET", f"{cc.base}{path}", {"n": i}, "get")
                for i in range(n)
                for path in ("/items", "/detail")
            )
        )


def _rated(code: str, base: str, granularity: str | None, **sections) -> dict:
    rl: dict[str, object] = {"qps_limit": 4, "burst_capacity": 1}
    if granularity:
        rl["bucket_granularity_code"] = granularity
    return provenance(
        code,
        base,
        endpoint_def=[
            {"endpoint_name": "detail", "endpoint_usage_code": "DETAIL", "path_template": "/detail"}
        ],
        rate_limit_cfg=[rl],
        **sections,
    )


async def test_per_endpoint_buckets_hold_each_endpoints_rate(reg, key_file, source):
    code = unique_code("per_ep")
    cc = contract_client(reg, key_file, _rated(code, source.url, "PER_ENDPOINT"))
    await _burst(cc, 5)
    assert _gate_keys(reg, code) == {
        f"provenance:{code}:endpoint:items",
        f"provenance:{code}:endpoint:detail",
    }
    for path in ("/items", "/detail"):
        times = [s.at for s in source.seen if s.path == path]
        assert len(times) == 5
        assert_rate_at_most(times, qps=4, burst=1)


async def test_per_key_buckets_hold_each_credentials_rate(reg, key_file, source, monkeypatch):
    monkeypatch.setenv("KEY_A", secret_value("a"))
    monkeypatch.setenv("KEY_B", secret_value("b"))
    code = unique_code("per_key")
    doc = _rated(
        code,
        source.url,
        "PER_KEY",
        credential=[
            {"credential_name": "a", "auth_type_code": "API_KEY_QUERY", "secret_env": "KEY_A"},
            {
                "credential_name": "b",
                "auth_type_code": "API_KEY_QUERY",
                "secret_env": "KEY_B",
                "endpoint_name": "detail",
            },
        ],
    )
    cc = contract_client(reg, key_file, doc)
    await _burst(cc, 5)
    assert _gate_keys(reg, code) == {f"provenance:{code}:key:a", f"provenance:{code}:key:b"}
    for key in ("KEY_A", "KEY_B"):
        times = [s.at for s in source.seen if s.query.get("api_key") == os.environ[key]]
        assert len(times) == 5
        assert_rate_at_most(times, qps=4, burst=1)


async def test_the_global_bucket_is_one_gate_for_the_provenance(reg, key_file, source):
    code = unique_code("global")
    cc = contract_client(reg, key_file, _rated(code, source.url, None))
    await _burst(cc, 3)
    assert _gate_keys(reg, code) == {f"provenance:{code}"}
    assert_rate_at_most([s.at for s in source.seen], qps=4, burst=1)


def test_an_unknown_granularity_is_refused(reg, key_file):
    doc = _rated(unique_code("gran"), "http://x.example", "PER_USER")
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file)
    assert "must be one of GLOBAL, PER_KEY, PER_ENDPOINT (got 'PER_USER')" in e.value.message
