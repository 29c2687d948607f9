"""More ways to log in: OAuth2 refresh tokens (RFC 6749 §6) against an authorization
server that rotates its refresh token on every use and refuses a used one (RFC 9700
§4.14.2: a reuse revokes the whole family), and session logins whose token is read from
the login's answer. Real servers on 127.0.0.1; the workers that share a refresh token are
processes of their own (tests/registry/refresh_worker.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml
from aiohttp import web
from sqlalchemy import select
from structlog.testing import capture_logs

from artemis.crawler.vault import vault_for
from artemis.errors import ArtemisError, ErrorCode
from artemis.redact import REDACTED, redact_text
from artemis.registry.client import ContractClient, Credentials
from artemis.registry.models import RegProvCredential, RegProvTokenState
from artemis.registry.yaml_io import export_yaml, import_yaml
from tests.helpers import eventually, http_client
from tests.registry.net import Server, contract_of, provenance, settings_for, unique_code

ROOT = Path(__file__).resolve().parents[2]
STATE = RegProvTokenState.__table__  # type: ignore[attr-defined]
CREDENTIAL = RegProvCredential.__table__  # type: ignore[attr-defined]
# An access token's life here: ten minutes of harvesting are some ten lifetimes.
LIFETIME_S = 1.0


@pytest.fixture(autouse=True)
def fresh_process_state():
    """Held tokens and benched keys are per process, by key and row id: each test starts
    as a new worker would."""
    for held in (Credentials._benched, Credentials._tokens, Credentials._refused):
        held.clear()
    yield
    for held in (Credentials._benched, Credentials._tokens, Credentials._refused):
        held.clear()


def _secret(tag: str) -> str:
    return f"{tag}-{secrets.token_hex(16)}"


# -- the rotating authorization server -----------------------------------------------------
class RotatingServer:
    """An authorization server whose refresh token is single-use: every refresh answers a
    new one and the old one is spent; a spent one presented again is refused
    (``invalid_grant``) and revokes the family. Each refresh takes ``delay`` seconds, so
    two sent at once would overlap here (``overlaps``). The source takes an access token
    until it expires."""

    def __init__(self, client_id: str, client_secret: str | None, seed: str, lifetime: float):
        self.client_id, self.client_secret = client_id, client_secret
        self.lifetime, self.delay = lifetime, 0.05
        self.live = seed
        self.issued = [seed]  # every refresh token, in order
        self.presented: dict[str, int] = {}  # each refresh token: times presented
        self.refused: list[str] = []
        self.revoked = False
        self.access: dict[str, float] = {}  # access token -> when it expires (loop time)
        self.refresh_times: list[float] = []
        self.in_flight = self.overlaps = self.unauthorized = self.served = 0
        self.token_server = Server({("POST", "/oauth/token"): self.token})
        self.source = Server({("GET", "/items"): self.items})

    async def start(self) -> RotatingServer:
        await self.token_server.start()
        await self.source.start()
        return self

    async def stop(self) -> None:
        await self.token_server.stop()
        await self.source.stop()

    def _client_ok(self, form: dict[str, list[str]], request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            cid, _, sec = base64.b64decode(auth[6:]).decode().partition(":")
            return (cid, sec) == (self.client_id, self.client_secret)
        given = form.get("client_secret")
        cid = form.get("client_id", [""])[0]
        return (cid, given[0] if given else None) == (self.client_id, self.client_secret)

    async def token(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        try:
            if self.in_flight > 1:
                self.overlaps += 1
            await asyncio.sleep(self.delay)
            return self._refresh(parse_qs((await request.read()).decode()), request)
        finally:
            self.in_flight -= 1

    def _refresh(self, form: dict[str, list[str]], request: web.Request) -> web.Response:
        if not self._client_ok(form, request):
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("grant_type") != ["refresh_token"]:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        presented = form.get("refresh_token", [""])[0]
        self.presented[presented] = self.presented.get(presented, 0) + 1
        if self.revoked or presented != self.live:
            if presented in self.issued:
                self.revoked = True  # a spent one came back: the family is revoked
            self.refused.append(presented)
            return web.json_response({"error": "invalid_grant"}, status=400)
        self.live = f"rt-{len(self.issued)}-{secrets.token_hex(16)}"
        self.issued.append(self.live)
        access = f"at-{len(self.issued)}-{secrets.token_hex(16)}"
        self.access[access] = asyncio.get_running_loop().time() + self.lifetime
        self.refresh_times.append(time.monotonic())
        return web.json_response(
            {
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": self.lifetime,
                "refresh_token": self.live,
            }
        )

    async def items(self, request: web.Request) -> web.Response:
        value = request.headers.get("Authorization", "").removeprefix("Bearer ")
        expires = self.access.get(value)
        if expires is None or asyncio.get_running_loop().time() > expires:
            self.unauthorized += 1
            return web.json_response({"error": "invalid_token"}, status=401)
        self.served += 1
        return await self.page(request)

    async def page(self, request: web.Request) -> web.Response:
        """The source's answer to an authorized request."""
        return web.json_response({"items": [{"id": 1}]})

    def spent(self) -> list[str]:
        """Every refresh token but the live one: each presented exactly once."""
        return self.issued[:-1]


def refresh_doc(code: str, auth: RotatingServer, method: str | None = None) -> dict[str, Any]:
    cred: dict[str, Any] = {
        "credential_name": "rotating",
        "auth_type_code": "OAUTH2_REFRESH_TOKEN",
        "principal_env": "RT_CLIENT_ID",
        "secret_env": "RT_REFRESH_TOKEN",
    }
    if method is not None:
        cred["token_auth_method_code"] = method
    if method != "NONE":
        cred["client_secret_env"] = "RT_CLIENT_SECRET"
    return provenance(
        code,
        auth.source.url,
        endpoint_def=[
            {
                "endpoint_name": "token",
                "endpoint_usage_code": "TOKEN",
                "http_method_code": "POST",
                "path_template": f"{auth.token_server.url}/oauth/token",
                "default_body_payload": {"scope": "items:read"},
            }
        ],
        credential=[cred],
    )


async def rotating(monkeypatch, public: bool = False) -> RotatingServer:
    client_id, client_secret, seed = f"client-{secrets.token_hex(6)}", _secret("cs"), _secret("rt0")
    monkeypatch.setenv("RT_CLIENT_ID", client_id)
    monkeypatch.setenv("RT_CLIENT_SECRET", client_secret)
    monkeypatch.setenv("RT_REFRESH_TOKEN", seed)
    server = RotatingServer(client_id, None if public else client_secret, seed, LIFETIME_S)
    return await server.start()


async def get(cc: ContractClient, **params: Any):
    async with http_client() as http:
        return await cc.send(http, "GET", f"{cc.base}/items", params, f"{cc.code} GET")


def _client(reg, key_file: str, code: str) -> ContractClient:
    """A worker's client built from the database (as a restarted worker builds it)."""
    return ContractClient(contract_of(reg, code), settings_for(reg, key_file))


def _state(reg) -> Any:
    with reg.connect() as conn:
        return conn.execute(select(STATE)).one()


def _stored_texts(reg) -> str:
    """Every column of the credential and its token state, as text."""
    with reg.connect() as conn:
        rows = [
            *conn.execute(select(CREDENTIAL)).all(),
            *conn.execute(select(STATE)).all(),
        ]
    return " ".join(repr(tuple(r)) for r in rows)


# -- two workers, one single-use refresh token ---------------------------------------------
class Worker:
    """A worker process (tests/registry/refresh_worker.py) harvesting ``code`` for
    ``seconds`` once told to go."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self.proc, self.out = proc, out

    @classmethod
    async def start(cls, reg, key_file: str, code: str, seconds: float, tmp: Path) -> Worker:
        out = tmp / f"worker-{secrets.token_hex(4)}.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.registry.refresh_worker",
            reg.url.render_as_string(hide_password=False),
            key_file,
            code,
            str(seconds),
            "3",
            str(out),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        return cls(proc, out)

    async def ready(self) -> None:
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)  # type: ignore[union-attr]
        assert line.strip() == b"ready", (line, await self.proc.stderr.read())  # type: ignore[union-attr]

    async def go(self) -> None:
        self.proc.stdin.write(b"go\n")  # type: ignore[union-attr]
        await self.proc.stdin.drain()  # type: ignore[union-attr]

    async def result(self) -> dict[str, Any]:
        _, err = await asyncio.wait_for(self.proc.communicate(), 60)
        assert self.proc.returncode == 0, err.decode()[-3000:]
        result = json.loads(self.out.read_text())
        result["stderr"] = err.decode()
        return result


@pytest.mark.processes
async def test_two_workers_share_a_rotating_refresh_token_and_a_restart_goes_on(
    reg, key_file, monkeypatch, tmp_path
):
    """The acceptance: two workers harvesting through several access-token lifetimes
    never meet a refusal, every refresh token is used once, one refresh at a time; a
    restarted worker goes on with the rotated token; no token in the logs or in clear in
    the registry."""
    auth = await rotating(monkeypatch)
    seed = auth.live
    code = unique_code("rotating")
    try:
        report = import_yaml(reg, yaml.safe_dump(refresh_doc(code, auth)), key_file)
        # Two workers, and the one that comes after them (a process that never held a
        # token: a restart), all started at once so that their start-up overlaps.
        pair = [await Worker.start(reg, key_file, code, 5 * LIFETIME_S, tmp_path) for _ in "ab"]
        restart = await Worker.start(reg, key_file, code, 1.5 * LIFETIME_S, tmp_path)
        await asyncio.gather(*(w.ready() for w in [*pair, restart]))
        await asyncio.gather(*(w.go() for w in pair))
        first = [await w.result() for w in pair]
        before_restart = len(auth.issued)
        # The stored access token runs out meanwhile: the restarted worker must refresh,
        # with the refresh token the others left.
        await asyncio.sleep(LIFETIME_S)
        live_at_restart = auth.live
        await restart.go()
        second = [await restart.result()]
    finally:
        await auth.stop()
    # Never a refusal, every request answered; one refresh at a time at the server.
    assert auth.refused == [] and not auth.revoked
    for result in first + second:
        assert result["errors"] == [] and result["statuses"]
        assert set(result["statuses"]) == {200}
    assert auth.overlaps == 0
    # Several lifetimes went by: several refreshes, far fewer than requests (the access
    # token one worker stored serves the other until it is due).
    refreshes = len(auth.issued) - 1
    assert refreshes >= 4, refreshes
    assert refreshes * 10 < auth.served
    # Every refresh token but the live one was presented exactly once, the seed first.
    assert auth.presented[seed] == 1
    assert all(auth.presented.get(t) == 1 for t in auth.spent())
    assert auth.presented.get(auth.live, 0) == 0
    # The restart went on from the token the first workers left.
    assert len(auth.issued) > before_restart and auth.presented[live_at_restart] == 1
    # The state holds the live token, sealed, and counts every refresh.
    state = _state(reg)
    assert state.version == refreshes and state.encryption_key_id
    tokens = [*auth.issued, *auth.access]
    stored = _stored_texts(reg)
    assert not [t for t in tokens if t in stored]
    assert not [t for t in tokens if t in export_yaml(reg, code)]
    assert not [t for t in tokens if t in json.dumps(report.to_dict())]
    # Every refresh said so in its worker's log (a worker that only took what another
    # stored says nothing), and no token is in any log event (as structlog received it,
    # before redaction) nor in what the workers wrote on stderr.
    said = [" ".join(r["logs"]) + r["stderr"] for r in first + second]
    assert sum(s.count('"oauth2_token_refreshed"') for s in said) == refreshes
    assert not [t for t in tokens if any(t in s for s in said)]


# -- one worker, in process ------------------------------------------------------------------
@pytest.mark.parametrize("method", [None, "CLIENT_SECRET_POST", "NONE"])
async def test_a_refresh_sends_the_token_in_force_and_keeps_the_rotated_one(
    reg, key_file, monkeypatch, method
):
    auth = await rotating(monkeypatch, public=method == "NONE")
    seed = auth.live
    code = unique_code("refresh")
    try:
        report = import_yaml(reg, yaml.safe_dump(refresh_doc(code, auth, method)), key_file)
        with capture_logs() as logs:
            cc = _client(reg, key_file, code)
            for page in range(3):
                assert (await get(cc, page=page)).status_code == 200
            await asyncio.sleep(LIFETIME_S)
            assert (await get(cc, page=4)).status_code == 200
    finally:
        await auth.stop()
    # one refresh for the first three pages, one more once the access token was due
    assert len(auth.issued) == 3 and auth.refused == []
    assert auth.presented == {seed: 1, auth.issued[1]: 1}
    form = parse_qs(auth.token_server.seen[0].body.decode())
    assert form["grant_type"] == ["refresh_token"] and form["refresh_token"] == [seed]
    assert form["scope"] == ["items:read"]
    headers = auth.token_server.seen[0].headers
    if method == "NONE":
        assert form["client_id"] == [auth.client_id] and "client_secret" not in form
        assert "Authorization" not in headers
    elif method == "CLIENT_SECRET_POST":
        assert form["client_secret"] == [auth.client_secret]
    else:
        assert headers["Authorization"].startswith("Basic ") and "client_secret" not in form
    # The refresh tokens reached the token endpoint only, the access tokens the source.
    source_texts = " ".join(auth.source.texts())
    assert not [t for t in auth.issued if t in source_texts]
    assert _state(reg).version == 2
    assert redact_text(f"sent {auth.live}") == f"sent {REDACTED}"
    said = " ".join(json.dumps(e, default=repr) for e in logs)
    assert not [t for t in [*auth.issued, *auth.access] if t in said]
    entry = report.credentials[0]
    assert entry["as"].startswith("a refresh token and its client to the TOKEN endpoint")
    assert entry.get("client_secret_env") == (None if method == "NONE" else "RT_CLIENT_SECRET")


async def test_rotate_key_reseals_the_stored_refresh_token_and_it_still_works(
    reg, key_file, monkeypatch
):
    auth = await rotating(monkeypatch)
    code = unique_code("refresh_rotate")
    try:
        import_yaml(reg, yaml.safe_dump(refresh_doc(code, auth)), key_file)
        assert (await get(_client(reg, key_file, code))).status_code == 200
        before = _state(reg)
        result = vault_for(settings_for(reg, key_file)).rotate()
        after = _state(reg)
        assert after.encryption_key_id == result.new_key_id != before.encryption_key_id
        assert after.refresh_token_ciphertext != before.refresh_token_ciphertext
        assert after.access_token_ciphertext != before.access_token_ciphertext
        # A restarted worker, once the access token is due, refreshes with the token the
        # rotation sealed again.
        Credentials._tokens.clear()
        await asyncio.sleep(LIFETIME_S)
        live = auth.live
        assert (await get(_client(reg, key_file, code))).status_code == 200
    finally:
        await auth.stop()
    assert auth.refused == [] and auth.presented[live] == 1 and len(auth.issued) == 3


async def test_a_new_refresh_token_imported_starts_over_and_the_same_one_does_not(
    reg, key_file, monkeypatch
):
    auth = await rotating(monkeypatch)
    code = unique_code("refresh_reimport")
    doc = yaml.safe_dump(refresh_doc(code, auth))
    try:
        import_yaml(reg, doc, key_file)
        assert (await get(_client(reg, key_file, code))).status_code == 200
        # The file imported again with the same (spent) refresh token: the state stays.
        assert import_yaml(reg, doc, key_file).updated == []
        assert _state(reg).version == 1
        # A new authorization: its refresh token replaces the rotated one.
        fresh = _secret("rt-new")
        auth.live = fresh
        auth.issued.append(fresh)
        monkeypatch.setenv("RT_REFRESH_TOKEN", fresh)
        import_yaml(reg, doc, key_file)
        with reg.connect() as conn:
            assert conn.execute(select(STATE)).first() is None
        Credentials._tokens.clear()
        assert (await get(_client(reg, key_file, code))).status_code == 200
    finally:
        await auth.stop()
    assert auth.refused == [] and auth.presented[fresh] == 1


async def test_a_refused_refresh_token_fails_at_once_naming_the_credential(
    reg, key_file, monkeypatch
):
    auth = await rotating(monkeypatch)
    seed = auth.live
    auth.revoked = True
    code = unique_code("refresh_refused")
    try:
        import_yaml(reg, yaml.safe_dump(refresh_doc(code, auth)), key_file)
        with pytest.raises(ArtemisError) as e:
            await get(_client(reg, key_file, code))
    finally:
        await auth.stop()
    assert e.value.code is ErrorCode.SOURCE_ERROR and not e.value.retryable
    assert "refused credential 'rotating'" in e.value.message
    assert "invalid_grant" in e.value.message and seed not in e.value.message
    assert auth.source.seen == []


async def test_a_401_to_an_access_token_refreshes_once_and_never_takes_it_back(
    reg, key_file, monkeypatch
):
    auth = await rotating(monkeypatch)
    code = unique_code("refresh_401")
    try:
        import_yaml(reg, yaml.safe_dump(refresh_doc(code, auth)), key_file)
        cc = _client(reg, key_file, code)
        assert (await get(cc)).status_code == 200
        auth.access.clear()  # the server forgets every access token it issued
        assert (await get(cc)).status_code == 200
    finally:
        await auth.stop()
    # the stored one was refused, so a refresh, not the database's copy of it
    assert auth.unauthorized == 1 and len(auth.issued) == 3 and auth.refused == []


@pytest.mark.parametrize(
    "cred, why",
    [
        ({"secret_env": "RT_REFRESH_TOKEN"}, "needs principal_env"),
        (
            {"secret_env": "RT_REFRESH_TOKEN", "principal_env": "RT_CLIENT_ID"},
            "needs client_secret_env (the client secret; secret_env is the refresh token)",
        ),
        (
            {
                "secret_env": "RT_REFRESH_TOKEN",
                "principal_env": "RT_CLIENT_ID",
                "client_secret_env": "RT_CLIENT_SECRET",
                "token_auth_method_code": "NONE",
            },
            "token_auth_method_code NONE sends no client secret",
        ),
        (
            {
                "auth_type_code": "OAUTH2_CLIENT_CREDENTIALS",
                "secret_env": "RT_CLIENT_SECRET",
                "principal_env": "RT_CLIENT_ID",
                "token_auth_method_code": "NONE",
            },
            "NONE (a public client) is for OAUTH2_REFRESH_TOKEN credentials",
        ),
        (
            {"auth_type_code": "BEARER", "secret_env": "RT_REFRESH_TOKEN", "token_jsonpath": "$.t"},
            "token_jsonpath is for SESSION_TOKEN credentials, not BEARER",
        ),
        (
            {
                "auth_type_code": "BEARER",
                "secret_env": "RT_REFRESH_TOKEN",
                "client_secret_env": "RT_CLIENT_SECRET",
            },
            "client_secret_env is for OAUTH2_REFRESH_TOKEN credentials, not BEARER",
        ),
        (
            {
                "secret_env": "RT_REFRESH_TOKEN",
                "principal_env": "RT_CLIENT_ID",
                "client_secret_env": "COOKIE_MASTER_KEY",
            },
            "COOKIE_MASTER_KEY is one of the service's own variables",
        ),
        ({"refresh_token": "rt-in-clear"}, "secrets are never written in the file"),
    ],
)
def test_refresh_and_session_fields_that_do_not_go_together_are_refused(
    reg, key_file, monkeypatch, cred, why
):
    for name in ("RT_REFRESH_TOKEN", "RT_CLIENT_ID", "RT_CLIENT_SECRET"):
        monkeypatch.setenv(name, _secret(name.lower()))
    row = {"credential_name": "c", "auth_type_code": "OAUTH2_REFRESH_TOKEN", **cred}
    doc = provenance(
        unique_code("badrt"),
        "http://127.0.0.1:9",
        endpoint_def=[
            {"endpoint_name": "token", "endpoint_usage_code": "TOKEN", "path_template": "/t"}
        ],
        credential=[row],
    )
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="c.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert "credential[0]" in e.value.message and why in e.value.message


@pytest.mark.parametrize("kind", ["OAUTH2_REFRESH_TOKEN", "OAUTH2_CLIENT_CREDENTIALS"])
def test_an_oauth2_token_endpoint_with_a_content_type_is_refused(reg, key_file, monkeypatch, kind):
    """An OAuth2 token request is a form (RFC 6749): a content type the TOKEN endpoint
    names would be ignored, so it is refused; a login's is not."""
    for name in ("RT_REFRESH_TOKEN", "RT_CLIENT_ID", "RT_CLIENT_SECRET"):
        monkeypatch.setenv(name, _secret(name.lower()))
    row = {
        "credential_name": "c",
        "auth_type_code": kind,
        "principal_env": "RT_CLIENT_ID",
        "secret_env": "RT_REFRESH_TOKEN",
    }
    if kind == "OAUTH2_REFRESH_TOKEN":
        row["client_secret_env"] = "RT_CLIENT_SECRET"
    token = {
        "endpoint_name": "token",
        "endpoint_usage_code": "TOKEN",
        "path_template": "/t",
        "request_content_type": "application/json",
    }
    doc = provenance(
        unique_code("typed"), "http://127.0.0.1:9", endpoint_def=[token], credential=[row]
    )
    with pytest.raises(ArtemisError) as e:
        import_yaml(reg, yaml.safe_dump(doc), key_file, source="c.yaml")
    assert e.value.code is ErrorCode.INVALID_INPUT
    assert e.value.message == (
        f"c.yaml: credential[0]: {kind} asks its TOKEN endpoint 'token' with a form (RFC "
        "6749); request_content_type there is for SESSION_TOKEN logins: leave it out"
    )


# -- session logins ----------------------------------------------------------------------------
class SessionServer:
    """A login endpoint answering a session token for the right user and password, and a
    source that takes that token in ``X-Session`` for ``uses`` requests, then ends the
    session (401)."""

    def __init__(self, user: str, password: str, uses: int):
        self.user, self.password, self.uses = user, password, uses
        self.sessions: dict[str, int] = {}
        self.logins: list[dict[str, Any]] = []
        self.unauthorized = 0
        self.server = Server({("POST", "/login"): self.login, ("GET", "/items"): self.items})

    async def login(self, request: web.Request) -> web.Response:
        raw = (await request.read()).decode()
        if request.headers.get("Content-Type", "").startswith("application/json"):
            body = json.loads(raw)
        else:
            body = {k: v[0] for k, v in parse_qs(raw).items()}
        self.logins.append(body)
        user = body.get("username") or body.get("auth", {}).get("email")
        password = body.get("password") or body.get("auth", {}).get("pass")
        if (user, password) != (self.user, self.password):
            return web.json_response({"error": f"bad login for {user}"}, status=401)
        token = f"sess-{len(self.logins)}-{secrets.token_hex(16)}"
        self.sessions[token] = 0
        return web.json_response({"data": {"session": token}})

    async def items(self, request: web.Request) -> web.Response:
        token = request.headers.get("X-Session", "")
        if token not in self.sessions or self.sessions[token] >= self.uses:
            self.unauthorized += 1
            return web.json_response({"error": "session ended"}, status=401)
        self.sessions[token] += 1
        return web.json_response({"items": [{"id": 1}]})


def session_doc(code: str, server: SessionServer, **token_ep: Any) -> dict[str, Any]:
    return provenance(
        code,
        server.server.url,
        endpoint_def=[
            {
                "endpoint_name": "login",
                "endpoint_usage_code": "TOKEN",
                "http_method_code": "POST",
                "path_template": "/login",
                **token_ep,
            }
        ],
        credential=[
            {
                "credential_name": "login",
                "auth_type_code": "SESSION_TOKEN",
                "principal_env": "SESSION_USER",
                "secret_env": "SESSION_PASSWORD",
                "token_jsonpath": "$.data.session",
                "param_or_header_name": "X-Session",
            }
        ],
    )


@pytest.fixture
async def session(monkeypatch):
    user, password = "harvester@example.org", _secret("pw")
    monkeypatch.setenv("SESSION_USER", user)
    monkeypatch.setenv("SESSION_PASSWORD", password)
    server = SessionServer(user, password, uses=3)
    await server.server.start()
    yield server
    await server.server.stop()


@pytest.mark.parametrize(
    "token_ep, sent",
    [
        # the login's fields placed by the TOKEN endpoint's body, sent as JSON
        (
            {"default_body_payload": {"auth": {"email": "{principal}", "pass": "{secret}"}}},
            lambda u, p: {"auth": {"email": u, "pass": p}},
        ),
        # no marks: username and password, as a form
        (
            {"request_content_type": "application/x-www-form-urlencoded"},
            lambda u, p: {"username": u, "password": p},
        ),
    ],
)
async def test_a_session_login_is_reused_until_a_401_then_one_new_login(
    reg, key_file, session, token_ep, sent
):
    code = unique_code("session")
    report = import_yaml(reg, yaml.safe_dump(session_doc(code, session, **token_ep)), key_file)
    with capture_logs() as logs:
        cc = _client(reg, key_file, code)
        for page in range(1, 6):
            assert (await get(cc, page=page)).status_code == 200
    # one login for three requests; the session ended at the fourth: one new login, then
    # the same request again
    assert len(session.logins) == 2 and session.unauthorized == 1
    assert session.logins[0] == sent(session.user, session.password)
    pages = [s.query["page"] for s in session.server.seen if s.path == "/items"]
    assert pages == ["1", "2", "3", "4", "4", "5"]
    tokens = list(session.sessions)
    item_headers = [s.headers for s in session.server.seen if s.path == "/items"]
    assert item_headers[0]["X-Session"] == tokens[0] and "Authorization" not in item_headers[0]
    # the password went to the login only, and no token or password is logged
    assert not [t for t in session.server.texts() if "/items" in t and session.password in t]
    said = " ".join(json.dumps(e, default=repr) for e in logs)
    assert session.password not in said and not [t for t in tokens if t in said]
    assert redact_text(f"t {tokens[-1]}") == f"t {REDACTED}"
    entry = report.credentials[0]
    assert entry["as"].startswith("a login to the TOKEN endpoint (its token at $.data.session)")
    assert entry["as"].endswith("header X-Session")
    assert session.password not in _stored_texts(reg)


async def test_a_refused_login_fails_at_once_naming_the_credential(
    reg, key_file, session, monkeypatch
):
    wrong = _secret("wrong")
    monkeypatch.setenv("SESSION_PASSWORD", wrong)
    code = unique_code("session_refused")
    import_yaml(reg, yaml.safe_dump(session_doc(code, session)), key_file)
    with pytest.raises(ArtemisError) as e:
        await get(_client(reg, key_file, code))
    assert e.value.code is ErrorCode.SOURCE_ERROR and not e.value.retryable
    assert "refused credential 'login'" in e.value.message and "answered 401" in e.value.message
    assert wrong not in e.value.message and session.password not in e.value.message
    assert len(session.logins) == 1
    assert [s for s in session.server.seen if s.path == "/items"] == []


async def test_a_login_answer_without_the_token_names_the_path(reg, key_file, session):
    code = unique_code("session_path")
    doc = session_doc(code, session)
    doc["credential"][0]["token_jsonpath"] = "$.data.token"
    import_yaml(reg, yaml.safe_dump(doc), key_file)
    with pytest.raises(ArtemisError) as e:
        await get(_client(reg, key_file, code))
    assert e.value.code is ErrorCode.SOURCE_CONTRACT
    assert "no token at '$.data.token'" in e.value.message
    assert not [t for t in session.sessions if t in e.value.message]


# -- what a preview lists --------------------------------------------------------------------
async def test_a_preview_lists_the_login_beside_the_sources_requests(
    reg, key_file, session, tmp_path
):
    """A file's preview logs in (the password read from the environment) and lists the
    login as a request made, its URL only."""
    from starter.cli.preview import run_preview

    code = unique_code("session_preview")
    file = tmp_path / "session.yaml"
    file.write_text(yaml.safe_dump(session_doc(code, session)))
    report = await asyncio.to_thread(run_preview, settings_for(reg, key_file), str(file), None, 1)
    lines = [(c["request"], c["status"]) for c in report["requests"]]
    assert lines[0] == (
        f"POST {session.server.url}/login (token request; its form is not shown)",
        200,
    ), lines
    assert lines[1][0].startswith(f"GET {session.server.url}/items") and lines[1][1] == 200
    assert session.password not in json.dumps(report) and len(session.logins) == 1


async def test_a_preview_by_code_refreshes_and_keeps_the_rotated_token(reg, key_file, monkeypatch):
    """A refresh-token provenance previewed by its code: the refresh is listed, and the
    rotated refresh token is kept sealed (the only thing a preview writes: the spent one
    is gone at the server), so that the next run goes on with it."""
    from starter.cli.preview import run_preview

    auth = await rotating(monkeypatch)
    code = unique_code("rotating_preview")
    try:
        import_yaml(reg, yaml.safe_dump(refresh_doc(code, auth)), key_file)
        settings = settings_for(reg, key_file)
        report = await asyncio.to_thread(run_preview, settings, code, None, 1)
        rotated = auth.live
        Credentials._tokens.clear()  # a worker that held nothing, once the access
        loop = asyncio.get_running_loop()  # token the preview stored has run out
        expires = max(auth.access.values())
        await eventually(lambda: loop.time() > expires, "the stored access token to expire")
        assert (await get(_client(reg, key_file, code))).status_code == 200
    finally:
        await auth.stop()
    assert report["requests"][0]["request"] == (
        f"POST {auth.token_server.url}/oauth/token (token request; its form is not shown)"
    )
    assert report["requests"][0]["status"] == 200
    assert auth.refused == [] and len(auth.issued) == 3 and _state(reg).version == 2
    assert auth.presented[rotated] == 1
    assert not [t for t in [*auth.issued, *auth.access] if t in json.dumps(report)]
