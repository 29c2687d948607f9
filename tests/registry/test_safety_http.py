"""What a registry source's requests may not do to another owner or to the operator:

- an OAuth2 access token is held per everything that shapes it (token endpoint, client,
  auth method, the TOKEN endpoint's body and query, the source origin), so two
  provenances sharing an authorization server and a client but asking another
  ``audience`` or ``scope`` never get each other's token;
- every key of a source refused (401/403) fails at once naming each key and status,
  where a key resting after a 429 is waited for;
- a token request to a loopback ``http://`` token URL (client secret included) never
  goes through the environment's proxy;
- ``tls_ca_bundle_path`` names a regular file, refused at import otherwise.

Real servers on 127.0.0.1: an authorization server written from RFC 6749 §4.4 (client
credentials), resource servers that check the bearer's audience, a recording proxy."""

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

from artemis.errors import ArtemisError, ErrorCode
from artemis.outage import outage_of
from artemis.registry.client import ContractClient
from artemis.registry.yaml_io import import_yaml
from tests.helpers import http_client
from tests.registry.net import (
    Server,
    contract_client,
    contract_of,
    provenance,
    settings_for,
    unique_code,
)
from tests.registry.test_auth_modes import client_pair, get, no_benched_keys, secret_value

__all__ = ["client_pair", "no_benched_keys"]  # fixtures this module uses from there


# -- an authorization server and resource servers ---------------------------------------------
def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class AuthorizationServer:
    """RFC 6749 §4.4: ``POST /token`` with ``grant_type=client_credentials``, the client
    authenticated by HTTP Basic (§2.3.1) or in the form; the access token (§5.1) encodes
    the ``audience`` and ``scope`` asked, and the server remembers every one it issued.
    Errors as §5.2 (400 ``unsupported_grant_type``, 401 ``invalid_client``)."""

    def __init__(self, client_id: str, client_secret: str) -> None:
        self.client = (client_id, client_secret)
        self.issued: dict[str, dict[str, str]] = {}
        self.server = Server({("POST", "/token"): self.token})

    async def token(self, request: web.Request) -> web.Response:
        form = {k: v[0] for k, v in parse_qs((await request.read()).decode()).items()}
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            cid, _, sec = base64.b64decode(auth[6:]).decode().partition(":")
        else:
            cid, sec = form.get("client_id", ""), form.get("client_secret", "")
        if (cid, sec) != self.client:
            return web.json_response(
                {"error": "invalid_client"},
                status=401,
                headers={"WWW-Authenticate": 'Basic realm="token"'},
            )
        claims = {
            "aud": form.get("audience", ""),
            "scope": form.get("scope", ""),
            "jti": secrets.token_hex(8),
        }
        value = f"at.{_b64(json.dumps(claims).encode())}"
        self.issued[value] = claims
        return web.json_response(
            {"access_token": value, "token_type": "Bearer", "expires_in": 3600},
            headers={"Cache-Control": "no-store"},
        )


class ResourceServer:
    """An API that takes only tokens the authorization server issued for its own
    audience (RFC 6750 §3.1: 401 ``invalid_token`` otherwise); every bearer it was sent
    is kept with the claims it carried."""

    def __init__(self, auth: AuthorizationServer, audience: str) -> None:
        self.auth, self.audience = auth, audience
        self.bearers: list[tuple[str, dict[str, str] | None]] = []
        self.server = Server({("GET", "/items"): self.items})

    async def items(self, request: web.Request) -> web.Response:
        value = request.headers.get("Authorization", "").removeprefix("Bearer ")
        claims = self.auth.issued.get(value)
        self.bearers.append((value, claims))
        if claims is None or claims["aud"] != self.audience:
            return web.json_response(
                {"error": "invalid_token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        return web.json_response({"items": [{"id": 1}], "scope": claims["scope"]})


def oauth_provenance(code: str, base: str, token_url: str, **body: str) -> dict:
    """A provenance on ``base`` whose OAuth2 client (OAUTH_CLIENT_ID / _SECRET) gets its
    tokens at ``token_url``, the TOKEN endpoint's body ``body``."""
    return provenance(
        code,
        base,
        endpoint_def=[
            {
                "endpoint_name": "token",
                "endpoint_usage_code": "TOKEN",
                "http_method_code": "POST",
                "path_template": token_url,
                "default_body_payload": body,
            }
        ],
        credential=[
            {
                "credential_name": "client",
                "auth_type_code": "OAUTH2_CLIENT_CREDENTIALS",
                "principal_env": "OAUTH_CLIENT_ID",
                "secret_env": "OAUTH_CLIENT_SECRET",
            }
        ],
    )


@pytest.fixture
async def auth(client_pair):
    server = AuthorizationServer(*client_pair)
    await server.server.start()
    yield server
    await server.server.stop()


async def _resource(auth: AuthorizationServer, audience: str) -> ResourceServer:
    api = ResourceServer(auth, audience)
    await api.server.start()
    return api


# -- the token cache ---------------------------------------------------------------------------
async def test_two_audiences_on_one_authorization_server_each_get_their_own_token(
    reg, key_file, auth
):
    api_a = await _resource(auth, "https://a.api.example")
    api_b = await _resource(auth, "https://b.api.example")
    token_url = f"{auth.server.url}/token"
    try:
        cc_a = contract_client(
            reg,
            key_file,
            oauth_provenance(
                unique_code("aud_a"), api_a.server.url, token_url, audience=api_a.audience
            ),
        )
        cc_b = contract_client(
            reg,
            key_file,
            oauth_provenance(
                unique_code("aud_b"), api_b.server.url, token_url, audience=api_b.audience
            ),
        )
        for page in range(1, 4):
            assert (await get(cc_a, page=page)).status_code == 200
            assert (await get(cc_b, page=page)).status_code == 200
    finally:
        await api_a.server.stop()
        await api_b.server.stop()
    # One token per audience, each held and sent to its own API only; never a 401.
    assert sorted(c["aud"] for c in auth.issued.values()) == [api_a.audience, api_b.audience]
    for api in (api_a, api_b):
        assert len(api.bearers) == 3
        assert {claims["aud"] for _, claims in api.bearers if claims} == {api.audience}
        assert len({value for value, _ in api.bearers}) == 1


async def test_another_scope_for_the_same_api_is_another_token(reg, key_file, auth):
    api = await _resource(auth, "https://a.api.example")
    token_url = f"{auth.server.url}/token"
    try:
        ccs = {
            scope: contract_client(
                reg,
                key_file,
                oauth_provenance(
                    unique_code("scope"),
                    api.server.url,
                    token_url,
                    audience=api.audience,
                    scope=scope,
                ),
            )
            for scope in ("read:items", "read:items write:items")
        }
        answered = {scope: (await get(cc)).json()["scope"] for scope, cc in ccs.items()}
    finally:
        await api.server.stop()
    assert answered == {s: s for s in ccs}  # each request carried a token of its own scope
    assert sorted(c["scope"] for c in auth.issued.values()) == sorted(ccs)


async def test_the_same_token_request_for_another_origin_is_another_token(reg, key_file, auth):
    """Same endpoint, client and body, two source origins: a token fetched for one
    origin never goes to the other."""
    api_1 = await _resource(auth, "https://shared.api.example")
    api_2 = await _resource(auth, "https://shared.api.example")
    token_url = f"{auth.server.url}/token"
    try:
        for api in (api_1, api_2):
            doc = oauth_provenance(
                unique_code("origin"), api.server.url, token_url, audience=api.audience
            )
            assert (await get(contract_client(reg, key_file, doc))).status_code == 200
    finally:
        await api_1.server.stop()
        await api_2.server.stop()
    assert len(auth.issued) == 2
    assert api_1.bearers[0][0] != api_2.bearers[0][0]


async def test_one_provenance_still_shares_its_token_between_clients(reg, key_file, auth):
    api = await _resource(auth, "https://a.api.example")
    code = unique_code("same")
    doc = oauth_provenance(
        code, api.server.url, f"{auth.server.url}/token", audience=api.audience, scope="read"
    )
    try:
        first = contract_client(reg, key_file, doc)
        assert (await get(first)).status_code == 200
        # Another run of the same provenance (its contract read again): the token held.
        again = ContractClient(contract_of(reg, code), settings_for(reg, key_file))
        assert (await get(again)).status_code == 200
    finally:
        await api.server.stop()
    assert len(auth.issued) == 1 and len(api.bearers) == 2


# -- every key refused ---------------------------------------------------------------------------
def _keyed(code: str, base: str) -> dict:
    return provenance(
        code,
        base,
        credential=[
            {"credential_name": "a", "auth_type_code": "API_KEY_QUERY", "secret_env": "KEY_A"},
            {"credential_name": "b", "auth_type_code": "API_KEY_QUERY", "secret_env": "KEY_B"},
        ],
    )


@pytest.fixture
def keys(monkeypatch):
    values = {"a": secret_value("a"), "b": secret_value("b")}
    monkeypatch.setenv("KEY_A", values["a"])
    monkeypatch.setenv("KEY_B", values["b"])
    return values


def _refusing(keys: dict[str, str], answers: dict[str, int]) -> Server:
    """A source answering each key as ``answers`` says (by key name)."""
    by_value = {keys[name]: status for name, status in answers.items()}

    async def items(request: web.Request) -> web.Response:
        status = by_value.get(request.query.get("api_key", ""), 200)
        headers = {"Retry-After": "30"} if status == 429 else {}
        return web.json_response({"items": []}, status=status, headers=headers)

    return Server({("GET", "/items"): items})


async def test_every_key_refused_fails_at_once_naming_each_key_and_status(reg, key_file, keys):
    source = await _refusing(keys, {"a": 401, "b": 403}).start()
    code = unique_code("refused")
    try:
        cc = contract_client(reg, key_file, _keyed(code, source.url))
        began = time.monotonic()
        with pytest.raises(ArtemisError) as first:
            await get(cc)
        took = time.monotonic() - began
        # The next run of this worker meets the keys resting: final too, not an
        # hour-long wait.
        again = ContractClient(contract_of(reg, code), settings_for(reg, key_file))
        with pytest.raises(ArtemisError) as second:
            await get(again)
    finally:
        await source.stop()
    assert took < 5 and len(source.seen) == 2  # each key tried once, none again
    for err in (first.value, second.value):
        assert err.code is ErrorCode.SOURCE_ERROR and not err.retryable
        assert "every credential for endpoint 'items' was refused" in err.message
        assert "'a' answered 401" in err.message and "'b' answered 403" in err.message
        assert err.details == {"reason": "credentials refused", "credentials": {"a": 401, "b": 403}}
        assert outage_of(err, "source", code) is None
        assert keys["a"] not in err.message and keys["b"] not in err.message
    assert first.value.message.startswith(f"{code} GET: ")


async def test_a_key_resting_after_a_429_is_waited_for(reg, key_file, keys):
    source = await _refusing(keys, {"a": 401, "b": 429}).start()
    code = unique_code("resting")
    try:
        cc = contract_client(reg, key_file, _keyed(code, source.url))
        with pytest.raises(ArtemisError) as e:
            # Whichever key goes first, by the second request both rest: a 429 answer
            # is the caller's to wait (Retry-After), then the wait for key b.
            for _ in range(2):
                assert (await get(cc)).status_code == 429
    finally:
        await source.stop()
    err = e.value
    assert err.code is ErrorCode.SOURCE_ERROR and err.retryable
    assert "every credential is benched" in err.message
    assert err.retry_after_s is not None and 25 <= err.retry_after_s <= 30
    assert outage_of(err, "source", code) is not None


async def test_the_only_key_refused_fails_at_once_after_one_request(reg, key_file, monkeypatch):
    """One key: its 401 is final at once; no rotation, no second request."""
    value = secret_value("only")
    monkeypatch.setenv("KEY_A", value)
    source = await _refusing({"a": value}, {"a": 401}).start()
    code = unique_code("only")
    try:
        doc = provenance(
            code,
            source.url,
            credential=[
                {"credential_name": "a", "auth_type_code": "API_KEY_QUERY", "secret_env": "KEY_A"}
            ],
        )
        cc = contract_client(reg, key_file, doc)
        with pytest.raises(ArtemisError) as e:
            await get(cc)
    finally:
        await source.stop()
    assert not e.value.retryable and "'a' answered 401" in e.value.message
    assert len(source.seen) == 1


# -- loopback token requests never go through a proxy --------------------------------------------
class RecordingProxy:
    """What the environment's proxy would be: it records every request line it gets and
    answers each itself (a token of its own), so that a request through it shows."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.received = b""
        self.url = ""
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> RecordingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        self.received += head
        self.lines.append(head.decode("latin-1").split("\r\n", 1)[0])
        body = b'{"access_token": "from-the-proxy", "token_type": "Bearer"}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def env_proxy(monkeypatch):
    proxy = await RecordingProxy().start()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield proxy
    await proxy.stop()


async def test_the_environments_proxy_is_used_off_loopback_only(env_proxy):
    """The contrast: a request elsewhere goes through the environment's proxy."""
    async with http_client() as http:
        resp = await http.get("http://api.proxied.example/items")
    assert resp.json()["access_token"] == "from-the-proxy"
    assert env_proxy.lines == ["GET http://api.proxied.example/items HTTP/1.1"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_loopback_token_request_never_goes_through_the_environments_proxy(
    reg, key_file, auth, client_pair, env_proxy, host
):
    api = await _resource(auth, "https://a.api.example")
    token_url = f"http://{host}:{auth.server.url.rsplit(':', 1)[1]}/token"
    try:
        doc = oauth_provenance(
            unique_code("noproxy"), api.server.url, token_url, audience=api.audience
        )
        assert (await get(contract_client(reg, key_file, doc))).status_code == 200
    finally:
        await api.server.stop()
    assert env_proxy.lines == [] and env_proxy.received == b""
    assert len(auth.server.seen) == 1 and len(auth.issued) == 1
    [(bearer, claims)] = api.bearers
    assert claims is not None and bearer in auth.issued


# -- tls_ca_bundle_path is a regular file ----------------------------------------------------------
def _fifo(tmp_path) -> str:
    path = tmp_path / "ca.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.timeout(60)  # reading a FIFO would block for ever: refused before that
@pytest.mark.parametrize(
    "make, kind",
    [
        (_fifo, "FIFO"),
        (lambda tmp_path: str(tmp_path), "directory"),
        (lambda tmp_path: "/dev/zero", "character device"),
    ],
)
def test_a_ca_bundle_that_is_not_a_regular_file_is_refused_at_import_and_at_use(
    reg, key_file, tmp_path, make, kind
):
    path = make(tmp_path)
    code = unique_code("ca_kind")
    doc = provenance(code, "https://127.0.0.1:9", http_cfg=[{"tls_ca_bundle_path": path}])
    with pytest.raises(ArtemisError) as at_import:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="src.yaml")
    assert at_import.value.code is ErrorCode.INVALID_INPUT
    message = at_import.value.message
    assert "src.yaml: http_cfg[0]" in message
    assert (
        f"tls_ca_bundle_path must name a regular file (a PEM bundle), and {path!r} is a {kind}"
        in message
    )
    # Written where it was a file, replaced since: the run stops before any request.
    good = tmp_path / "swap.pem"
    good.write_text("placeholder")
    doc["http_cfg"][0]["tls_ca_bundle_path"] = str(good)
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    good.unlink()
    if kind == "FIFO":
        os.mkfifo(good)
    elif kind == "directory":
        good.mkdir()
    else:
        good.symlink_to("/dev/zero")
    with pytest.raises(ArtemisError) as at_use:
        ContractClient(contract_of(reg, code), settings_for(reg, key_file))
    assert at_use.value.code is ErrorCode.CONFIG_ERROR and not at_use.value.retryable
    assert "http_cfg.tls_ca_bundle_path" in at_use.value.message
    assert "must name a regular file" in at_use.value.message and kind in at_use.value.message
