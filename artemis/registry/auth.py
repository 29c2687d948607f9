"""How a run reaches a registry source: its transport (proxy, TLS, timeouts, compression:
``http_cfg``) and its credentials (API keys, Bearer tokens, HTTP Basic, OAuth2 client
credentials, OAuth2 refresh tokens, session logins), with per-key health and the rule
that an endpoint needing auth has a usable credential before the run sends anything.

Secrets are decrypted here, on use, and registered with the log redaction; an access or
session token is held in this process's memory (never in a contract, a checkpoint or
workflow history), is registered with the redaction while it is in use and until it has
expired (a replaced one too), and goes to the source's origin only, as the client secret,
the refresh token and the login go to the token endpoint's only. A refresh token's
credential keeps its rotated refresh token and its latest access token sealed in the
database (``artemis/registry/token_state.py``), refreshed one at a time across every
worker. The source's transport and default headers go to the source's origin only: a
token endpoint elsewhere is reached with the worker's defaults.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import heapq
import json
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import quote_plus

from sqlalchemy import select

from artemis.calls import statement
from artemis.config import Settings
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from artemis.dblock import LockBusy, NamedLock
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import (
    Answer,
    Form,
    HttpClient,
    Transport,
    body_excerpt,
    ca_bundle_problem,
    retry_after_seconds,
    status_error,
)
from artemis.logsetup import get_logger
from artemis.paging import json_path_get
from artemis.redact import forget_secret, register_secret
from artemis.registry.http_rules import (
    DEFAULT_TOKEN_JSONPATH,
    OAUTH2_REFRESH,
    OAUTH2_TYPES,
    PAIRED_AUTH_TYPES,
    PUBLIC_CLIENT,
    SESSION,
    TOKEN_AUTH_TYPES,
    TOKEN_USAGE,
    basic_user_problem,
    credential_problem,
    http_cfg_problem,
    token_url_problem,
)
from artemis.registry.models import RegProvCredential
from artemis.registry.resolve import Contract
from artemis.registry.secret_env import check_secret_env, placement
from artemis.registry.token_state import Issued, Stored, TokenState
from artemis.security import origin, same_origin
from artemis.sources.rest import JSON_TYPE, encode_body
from artemis.transport_errors import TransportError, transport_error
from artemis.urls import with_params

log = get_logger(__name__)

# An access token is replaced this long before its ``expires_in`` runs out (at most a
# tenth of its life), so that a request sent just before the end does not meet a 401.
TOKEN_MARGIN_S = 60.0
# A replaced access token stays redacted this long past its expiry (or past its
# replacement when its life is unknown): requests sent with it just before may still be
# in flight, and their errors and log lines may quote it.
RETIRED_GRACE_S = 60.0


# A SESSION_TOKEN login's body: a value that is exactly one of these marks (at any
# depth of the TOKEN endpoint's default_body_payload) is replaced by the login's user or
# password; one the body does not mark goes under its default name.
PRINCIPAL_MARK, SECRET_MARK = "{principal}", "{secret}"
_LOGIN_FIELDS = {PRINCIPAL_MARK: "username", SECRET_MARK: "password"}

# What benches a key for good (until its hour is over): the source refused it, or the
# token endpoint refused its client (None).
_REFUSALS = (401, 403, None)


def _config_error(message: str) -> ArtemisError:
    return ArtemisError(ErrorCode.CONFIG_ERROR, message, retryable=False)


def transport_for(contract: Contract) -> Transport:
    """The contract's ``http_cfg`` as the client's transport options. A row that cannot
    act as written (written around the import's checks) or a CA bundle the worker cannot
    read stops the run: CONFIG_ERROR, never retried."""
    http = contract.http or {}
    code = contract.provenance.get("provenance_code")
    why = http_cfg_problem(http)
    if why:
        raise _config_error(f"provenance {code!r}: http_cfg.{why}")
    bundle = http.get("tls_ca_bundle_path")
    if bundle:
        why = ca_bundle_problem(bundle)
        if why:
            raise _config_error(f"provenance {code!r}: http_cfg.tls_ca_bundle_path: {why}")
    connect_ms = http.get("timeout_connect_millis")
    return Transport(
        proxy=http.get("proxy_url"),
        verify=http.get("tls_verify_enabled") is not False,
        ca_bundle=bundle,
        connect_timeout=connect_ms / 1000 if connect_ms else None,
        compress=http.get("accept_compress") is not False,
    )


def token_url(contract: Contract, base: str) -> str:
    """Where the contract's TOKEN endpoint is: its ``path_template`` after ``base``, or
    that template itself when it is a whole URL (an authorization server elsewhere)."""
    ep = contract.endpoints.get(TOKEN_USAGE)
    if ep is None:
        raise _config_error(
            f"provenance {contract.provenance.get('provenance_code')!r}: an "
            f"{', '.join(TOKEN_AUTH_TYPES)} credential needs an endpoint_def row with "
            f"endpoint_usage_code {TOKEN_USAGE} (where its tokens are fetched)"
        )
    path = ep.get("path_template") or ""
    whole = path.startswith(("http://", "https://"))
    url = path if whole else f"{base}{path}"
    # A row written around the import's checks, or a path on an http:// base: the client
    # secret is not sent in clear.
    why = token_url_problem(url, f"endpoint {ep.get('endpoint_name')!r} path_template")
    if why and (whole or base):
        raise _config_error(why)
    return url


def _bound_to(cred: dict[str, Any], endpoint: dict[str, Any] | None) -> bool | None:
    """True: bound to ``endpoint``; False: unbound; None: bound to another endpoint."""
    if cred.get("endpoint_id") is None:
        return False
    if endpoint is not None and cred["endpoint_id"] == endpoint.get("id"):
        return True
    return None


def _usable(cred: dict[str, Any]) -> bool:
    """ACTIVE rows only reach a contract; usable ones have their secrets too."""
    if not cred.get("has_secret") or _missing(cred):
        return False
    return cred.get("lifecycle_status_code", "ACTIVE") == "ACTIVE" and not cred.get("deleted")


def _needs_client_secret(cred: dict[str, Any]) -> bool:
    return (
        cred.get("auth_type_code") == OAUTH2_REFRESH
        and cred.get("token_auth_method_code") != PUBLIC_CLIENT
    )


def _missing(cred: dict[str, Any]) -> str | None:
    """The secret a row lacks besides its own (None: it has them all)."""
    if cred.get("auth_type_code") in PAIRED_AUTH_TYPES and not cred.get("has_principal"):
        return "principal (principal_env)"
    if _needs_client_secret(cred) and not cred.get("has_client_secret"):
        return "client secret (client_secret_env)"
    return None


def require_credentials(contract: Contract, usages: tuple[str, ...] | None = None) -> None:
    """Every endpoint of the contract (or of ``usages``) whose ``is_auth_required`` is set
    has a usable credential: ACTIVE, in force, with its secrets, bound to that endpoint or
    to none (a TOKEN endpoint: an OAuth2 client). Else CONFIG_ERROR, never retried,
    naming the provenance, the endpoint and the field."""
    code = contract.provenance.get("provenance_code")
    for usage, ep in sorted(contract.endpoints.items()):
        if usages is not None and usage not in usages:
            continue
        if not ep.get("is_auth_required"):
            continue
        found = [
            c
            for c in contract.credentials
            if _usable(c)
            and _bound_to(c, ep) is not None
            and (usage != TOKEN_USAGE or c.get("auth_type_code") in TOKEN_AUTH_TYPES)
        ]
        if not found:
            kind = (
                f"a {' / '.join(TOKEN_AUTH_TYPES)} credential"
                if usage == TOKEN_USAGE
                else "a credential"
            )
            raise ArtemisError(
                ErrorCode.CONFIG_ERROR,
                f"provenance {code!r}: endpoint {ep.get('endpoint_name')!r} ({usage}) has "
                f"endpoint_def.is_auth_required set, and the run's contract holds no usable "
                f"credential for it: add {kind} (ACTIVE, in force, with its secret_env"
                f"{' and principal_env' if usage == TOKEN_USAGE else ''}, bound to that "
                "endpoint or to none), or set is_auth_required false",
                retryable=False,
                details={
                    "provenance": code,
                    "endpoint": ep.get("endpoint_name"),
                    "field": "endpoint_def.is_auth_required",
                },
            )


@dataclass
class _Token:
    value: str
    # monotonic time from which it is fetched again; None: until the source answers 401
    renew_at: float | None
    # monotonic time at which the authorization server said it expires (None: unsaid)
    expires_at: float | None = None


class _TokenRefused(Exception):
    """The token endpoint refused the client (400/401: invalid_client and the like)."""

    def __init__(self, error: ArtemisError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True)
class Reach:
    """How a source's origin is reached (its contract's ``http_cfg`` and default
    headers): the ``base`` URL, the headers every request carries, the ``transport``
    (proxy, TLS), the read ``timeout`` and the body limit ``max_bytes``."""

    base: str | None = None
    headers: dict[str, str] | None = None
    transport: Transport | None = None
    timeout: float | None = None
    max_bytes: int | None = None

    def carried(self) -> Transport:
        """The transport a request to the origin goes by, its read timeout and body
        limit included."""
        return replace(
            self.transport or Transport(), read_timeout=self.timeout, max_bytes=self.max_bytes
        )


class Credentials:
    """The contract's credentials in priority order, with per-key health: a key answered
    401/403 is benched for an hour, one answered 429 until its Retry-After (else a minute),
    and the next healthy key takes over. A key bound to an endpoint is used there only,
    before the unbound ones. Secrets are decrypted here, on use.

    When no key is healthy and every one was refused (401/403, or its OAuth2 client at
    the token endpoint), the request fails at once (SOURCE_ERROR, not retryable, naming
    each key and status): a refused key does not heal by waiting. A key resting after a
    429 makes the wait retryable until it is back.

    OAuth2 client credentials: the access token is fetched from the contract's TOKEN
    endpoint (``grant_type=client_credentials``, RFC 6749 §4.4), shared by every run of
    this process that asks the same token endpoint for the same client with the same
    body, query and headers for the same source origin, kept until ``expires_in`` less a
    margin, and fetched again once when the source answers 401 to it; one fetch at a
    time per client.

    OAuth2 refresh tokens: the same, the access token got by ``grant_type=refresh_token``
    (RFC 6749 §6) with the refresh token in force, one refresh at a time across every
    worker; the refresh token the server rotates and the access token it issues are
    written back sealed (``TokenState``), so that every worker and a restarted one go on
    from them. Session logins: the token a login at the TOKEN endpoint answers, sent as a
    header until the source answers 401, then one new login.
    """

    # credential id -> monotonic time until which the key is not used (per worker process)
    _benched: ClassVar[dict[int, float]] = {}
    # credential id -> the status that benched it (None: its client was refused at the
    # token endpoint): a refusal no wait heals, a 429 one that passes.
    _bench_status: ClassVar[dict[int, int | None]] = {}
    # Access and session tokens by what shapes them (a digest: ``_client_key``)
    _tokens: ClassVar[dict[str, _Token]] = {}
    # The token the source last answered 401 to, by the same key: a refresh-token
    # credential never takes it back from the database.
    _refused: ClassVar[dict[str, str]] = {}
    # Replaced access tokens still redacted, as a heap of (monotonic time to forget, value):
    # one entry per replacement, each gone within its token's life plus RETIRED_GRACE_S.
    _retired: ClassVar[list[tuple[float, str]]] = []
    # One fetch at a time per client, per event loop (an asyncio lock belongs to one).
    _locks: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]]]
    _locks = weakref.WeakKeyDictionary()

    def __init__(self, contract: Contract, settings: Settings, reach: Reach | None = None) -> None:
        reach = reach or Reach()
        base, headers = reach.base, reach.headers
        transport, timeout, max_bytes = reach.transport, reach.timeout, reach.max_bytes
        self.contract = contract
        self.code = contract.provenance.get("provenance_code")
        self.rows = [c for c in contract.credentials if _usable(c)]
        self._check_rows()
        self.settings = settings
        self.base = base or ""
        self.headers = dict(headers or {})
        self.transport = transport
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._secrets: dict[tuple[int, str], str] = {}
        # Told of each token request (``POST url``, its status or None, milliseconds):
        # how a preview lists them next to the source's own requests.
        self.on_token_request: Callable[[str, int | None, float], None] | None = None
        self.token_url = (
            token_url(contract, self.base)
            if any(c.get("auth_type_code") in TOKEN_AUTH_TYPES for c in self.rows)
            else None
        )
        # The source's http_cfg (proxy, TLS verification or CA bundle, timeouts, body
        # limit) and default headers say how to reach the source's origin, and go there
        # only: a token endpoint on that origin gets them. An authorization server
        # elsewhere is reached as a request without an http_cfg is (the worker's trust
        # store, with verification; its own timeouts and limits; the environment's proxy,
        # HTTP(S)_PROXY / NO_PROXY, never the source's proxy_url, a route to the source
        # that need not reach it nor see its traffic), and its request carries only what
        # OAuth2 needs, plus the TOKEN endpoint's own params and body.
        own = self.token_url is not None and same_origin(self.token_url, self.base)
        self.token_transport = transport if own else None
        self.token_headers = dict(self.headers) if own else {}
        self.token_timeout = timeout if own else None
        self.token_max_bytes = max_bytes if own else None

    def _check_rows(self) -> None:
        """Rows written around the import's checks stop the run before a secret is sent."""
        for cred in self.contract.credentials:
            missing = _missing(cred) if cred.get("has_secret") else None
            if missing:
                # A pair with one half: not skipped in silence, the run says which.
                raise _config_error(
                    f"provenance {self.code!r}: credential {cred.get('credential_name')!r} "
                    f"({cred.get('auth_type_code')}) has no {missing}"
                )
        for cred in self.rows:
            label = f"credential {cred.get('credential_name')!r}"
            # One of the service's own variables: the run stops before that secret is
            # sent anywhere.
            for field in ("secret_env", "principal_env", "client_secret_env"):
                check_secret_env(
                    cred.get(f"{field}_name"), ErrorCode.CONFIG_ERROR, f"{label}: {field}"
                )
            why = credential_problem(cred, "principal_env_name", "client_secret_env_name")
            if why:
                raise _config_error(f"provenance {self.code!r}: {label}: {why}")

    # -- choosing a key ----------------------------------------------------------------
    def for_endpoint(self, endpoint: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The keys a request to ``endpoint`` may carry: those bound to it, then the
        unbound ones, each group in the contract's order."""
        bound = [c for c in self.rows if _bound_to(c, endpoint) is True]
        return bound + [c for c in self.rows if _bound_to(c, endpoint) is False]

    def current(self, endpoint: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The first healthy key for ``endpoint`` (None: the contract's own endpoint);
        when every key is benched, a retryable error that says when the first comes back."""
        rows = self.for_endpoint(endpoint if endpoint is not None else self.contract.endpoint)
        if not rows:
            return None
        now = time.monotonic()
        for cred in rows:
            if self._benched.get(cred["id"], 0) <= now:
                return cred
        raise self.exhausted(endpoint)

    def exhausted(
        self, endpoint: dict[str, Any] | None = None, what: str | None = None
    ) -> ArtemisError:
        """Why no key for ``endpoint`` is healthy (``what``: the request that found out):
        every one refused fails at once naming each key and the status it got; one
        resting after a 429 (or for a reason not known) is a retryable wait until the
        first such key is back."""
        ep = endpoint if endpoint is not None else self.contract.endpoint
        rows = self.for_endpoint(ep)
        now = time.monotonic()
        benched = [c for c in rows if self._benched.get(c["id"], 0) > now]
        passing = [c for c in benched if self._bench_status.get(c["id"], 429) not in _REFUSALS]
        if passing or not benched:
            wait = min((self._benched[c["id"]] for c in passing), default=now) - now
            return ArtemisError(
                ErrorCode.SOURCE_ERROR,
                f"{what + ': ' if what else ''}every credential is benched "
                f"(next back in {wait:.0f} s)",
                retryable=True,
                retry_after_s=max(1.0, wait),
                details={"reason": "credentials rate limited"},
            )
        statuses = {str(c.get("credential_name")): self._bench_status[c["id"]] for c in benched}
        said = ", ".join(
            f"{name!r} {'refused at the token endpoint' if st is None else f'answered {st}'}"
            for name, st in statuses.items()
        )
        return ArtemisError(
            ErrorCode.SOURCE_ERROR,
            f"{what or f'provenance {self.code!r}'}: every credential for endpoint "
            f"{(ep or {}).get('endpoint_name')!r} was refused ({said}); waiting does not "
            "make a refused key valid: replace or renew it (registry import). A refused key "
            "rests an hour in each worker that met it",
            retryable=False,
            details={"reason": "credentials refused", "credentials": statuses},
        )

    def bench(
        self, cred_id: int, resp: Answer | None, endpoint: dict[str, Any] | None = None
    ) -> bool:
        """Take a key out after 401/403/429 (``resp`` None: its client was refused at the
        token endpoint); True when another key for ``endpoint`` is healthy now."""
        if resp is not None and resp.status_code == 429:
            seconds = retry_after_seconds(resp) or 60.0
        else:
            seconds = 3600.0
        self._benched[cred_id] = time.monotonic() + seconds
        self._bench_status[cred_id] = resp.status_code if resp is not None else None
        log.warning(
            "credential_benched",
            credential_id=cred_id,
            status=resp.status_code if resp is not None else None,
            seconds=seconds,
        )
        now = time.monotonic()
        rows = self.for_endpoint(endpoint if endpoint is not None else self.contract.endpoint)
        return any(self._benched.get(c["id"], 0) <= now for c in rows)

    # -- secrets -----------------------------------------------------------------------
    def _secret(self, cred_id: int, column: str = "secret_ciphertext") -> str:
        if (cred_id, column) not in self._secrets:
            t = RegProvCredential.__table__  # type: ignore[attr-defined]
            with get_engine(self.settings.database.url).connect() as conn:
                row = conn.execute(
                    select(t.c[column], t.c.encryption_key_id).where(t.c.id == cred_id)
                ).first()
            if row is None or not row[0]:
                what = column.removesuffix("_ciphertext").replace("_", " ")
                raise _config_error(f"credential {cred_id} has no {what}")
            value = vault_for(self.settings).decrypt(row[0], row.encryption_key_id)
            register_secret(value)
            self._secrets[(cred_id, column)] = value
        return self._secrets[(cred_id, column)]

    def _principal(self, cred_id: int) -> str:
        return self._secret(cred_id, "principal_ciphertext")

    def _client_secret(self, cred: dict[str, Any]) -> str:
        """An OAuth2 client's secret: a refresh token's credential holds it with the
        refresh token, a client-credentials one as its secret."""
        if cred.get("auth_type_code") == OAUTH2_REFRESH:
            return self._secret(cred["id"], "client_secret_ciphertext")
        return self._secret(cred["id"])

    async def apply(
        self,
        cred: dict[str, Any],
        params: dict[str, Any],
        headers: dict[str, str],
        client: HttpClient | None = None,
    ) -> str:
        """Put ``cred`` on a request; the value sent (an OAuth2 client: the access token; a
        session login: the session token; either fetched with ``client`` when none is
        held). A session token goes in the ``Authorization`` header as Bearer, in any
        other header as it is."""
        where, name = placement(cred)
        kind = cred.get("auth_type_code")
        if kind in TOKEN_AUTH_TYPES:
            if client is None:
                raise ArtemisError(ErrorCode.INTERNAL, f"a {kind} credential needs a client")
            value = await self._access_token(client, cred)
            bearer = kind in OAUTH2_TYPES or name.lower() == "authorization"
            headers[name] = f"Bearer {value}" if bearer else value
            return value
        secret = self._secret(cred["id"])
        if kind == "BASIC":
            user = self._principal(cred["id"])
            why = basic_user_problem(user)
            if why:
                raise _config_error(f"credential {cred.get('credential_name')!r}: {why}")
            headers[name] = _basic(user, secret)
        elif where == "query":
            params[name] = secret
        else:
            headers[name] = f"Bearer {secret}" if kind == "BEARER" else secret
        return secret

    # -- tokens from the TOKEN endpoint ----------------------------------------------------
    def _shape(self, cred: dict[str, Any]) -> list[str]:
        """What shapes a token besides the credential's secrets: the token endpoint, how
        it is asked (auth method, body and its type, query, headers: another
        ``audience`` or ``scope`` is another token) and the source's origin (a token is
        sent to the origin it was fetched for only, never to another provenance's API)."""
        ep = self.contract.endpoints.get(TOKEN_USAGE) or {}
        return [
            str(self.token_url),
            cred.get("auth_type_code") or "",
            cred.get("token_auth_method_code") or "",
            cred.get("token_jsonpath") or "",
            ep.get("request_content_type") or "",
            _canonical(_given(ep.get("default_body_payload"))),
            _canonical(_given(ep.get("default_query_params"))),
            _canonical({k.lower(): v for k, v in self.token_headers.items()}),
            _canonical(list(origin(self.base)) if self.base else None),
        ]

    def _client_key(self, cred: dict[str, Any]) -> str:
        # The held token belongs to everything that shapes it, and to this client or
        # login: a new secret or client id (a re-import) gets a token of its own.
        parts = [self._principal(cred["id"]), self._secret(cred["id"])]
        if cred.get("auth_type_code") == OAUTH2_REFRESH:
            # Its refresh tokens are this row's (its state), under this client's secret.
            parts.append(str(cred["id"]))
            parts.append(self._client_secret(cred) if _needs_client_secret(cred) else "")
        return _digest([*parts, *self._shape(cred)])

    def _lock(self, key: str) -> asyncio.Lock:
        locks = self._locks.setdefault(asyncio.get_running_loop(), {})
        if key not in locks:
            locks[key] = asyncio.Lock()
        return locks[key]

    async def _access_token(self, client: HttpClient, cred: dict[str, Any]) -> str:
        self._forget_expired()
        key = self._client_key(cred)
        held = self._tokens.get(key)
        if held is not None and (held.renew_at is None or time.monotonic() < held.renew_at):
            return held.value
        async with self._lock(key):
            held = self._tokens.get(key)  # another request may have fetched it meanwhile
            if held is not None and (held.renew_at is None or time.monotonic() < held.renew_at):
                return held.value
            token = await self._new_token(client, cred, key)
            self._tokens[key] = token
            if held is not None and held.value != token.value:
                # Replaced at the margin, so still valid for a while: redacted until then.
                self._retire(held)
            return token.value

    def expire(self, cred: dict[str, Any], used: str) -> None:
        """The source answered 401 to access or session token ``used``: the next request
        fetches a new one (unless another request already replaced it)."""
        key = self._client_key(cred)
        self._refused[key] = used
        held = self._tokens.get(key)
        if held is not None and held.value == used:
            del self._tokens[key]
            # Refused by this source, perhaps still good elsewhere until its expiry.
            self._retire(held)

    @classmethod
    def _retire(cls, token: _Token) -> None:
        """Keep redacting a replaced token until it has expired (its life unknown: until
        now), plus RETIRED_GRACE_S for requests still in flight with it; then forget it,
        so that a worker fetching tokens for months holds only the live ones."""
        now = time.monotonic()
        end = token.expires_at if token.expires_at is not None else now
        heapq.heappush(cls._retired, (max(end, now) + RETIRED_GRACE_S, token.value))
        cls._forget_expired()

    @classmethod
    def _forget_expired(cls) -> None:
        now = time.monotonic()
        live = None
        while cls._retired and cls._retired[0][0] <= now:
            _, value = heapq.heappop(cls._retired)
            if live is None:
                live = {t.value for t in cls._tokens.values()}
            # An authorization server may hand the same token out again: a value still in
            # use stays redacted.
            if value not in live and not any(v == value for _, v in cls._retired):
                forget_secret(value)

    async def _new_token(self, client: HttpClient, cred: dict[str, Any], key: str) -> _Token:
        """A new token for ``cred``: a login, a refresh, or client credentials."""
        kind = cred.get("auth_type_code")
        if kind == SESSION:
            return await self._login(client, cred)
        if kind == OAUTH2_REFRESH:
            return await self._refreshed(client, cred, key)
        form = _given(self.contract.endpoints[TOKEN_USAGE].get("default_body_payload"))
        form["grant_type"] = "client_credentials"
        headers = {**self.token_headers, "Accept": "application/json"}
        self._client_auth(cred, form, headers)
        resp = await self._post_token(client, cred, form, headers)
        return _token_of(resp, self._token_what(), cred.get("credential_name"))

    def _token_what(self) -> str:
        ep = self.contract.endpoints[TOKEN_USAGE]
        return f"{self.code} token endpoint {ep.get('endpoint_name')!r}"

    async def _post_token(
        self,
        client: HttpClient,
        cred: dict[str, Any],
        data: dict[str, Any] | None,
        headers: dict[str, str],
        content: tuple[bytes, str] | None = None,
    ) -> Answer:
        """A POST to the TOKEN endpoint (``data``: a form; ``content``: a body and its
        type), its refusal final for the key (``_TokenRefused``)."""
        assert self.token_url is not None
        ep = self.contract.endpoints[TOKEN_USAGE]
        url = with_params(self.token_url, _given(ep.get("default_query_params")))
        what = self._token_what()
        if content is not None:
            headers = {**headers, "Content-Type": content[1]}
        started, status = time.monotonic(), None
        try:
            carried = replace(
                self.token_transport or Transport(),
                read_timeout=self.token_timeout,
                max_bytes=self.token_max_bytes,
            )
            body = content[0] if content is not None else Form(data or {})
            resp = await client.post(url, body=body, headers=headers, transport=carried)
            status = resp.status_code
        except TransportError as e:
            raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
        finally:
            if self.on_token_request is not None:
                millis = round((time.monotonic() - started) * 1000, 1)
                self.on_token_request(f"POST {url}", status, millis)
        refusals = (400, 401, 403) if cred.get("auth_type_code") == SESSION else (400, 401)
        _check_token_status(resp, what, cred.get("credential_name"), refusals)
        return resp

    def _client_auth(
        self, cred: dict[str, Any], form: dict[str, Any], headers: dict[str, str]
    ) -> None:
        """The client authenticated in the form or by HTTP Basic (``token_auth_method_code``),
        or a public client naming itself in the form (``NONE``, RFC 6749 §3.2.1)."""
        client_id = self._principal(cred["id"])
        method = cred.get("token_auth_method_code")
        if method == PUBLIC_CLIENT:
            form["client_id"] = client_id
            return
        secret = self._client_secret(cred)
        if method == "CLIENT_SECRET_POST":
            form.update(client_id=client_id, client_secret=secret)
        else:
            # RFC 6749 §2.3.1: each part form-urlencoded, then HTTP Basic.
            headers["Authorization"] = _basic(
                quote_plus(client_id, safe=""), quote_plus(secret, safe="")
            )

    # -- OAuth2 refresh tokens ---------------------------------------------------------------
    async def _refreshed(self, client: HttpClient, cred: dict[str, Any], key: str) -> _Token:
        """An access token for a refresh-token credential: the one stored by the last
        refresh (another worker's, or this one's before a restart) while it is good and
        was asked for the same way, else a refresh under the credential's named lock."""
        state = TokenState(self.settings, cred["id"])
        shape = _digest(self._shape(cred))
        refused = self._refused.get(key)
        token = _adopted(await statement(state.engine, state.read), shape, refused)
        if token is not None:
            return token
        # Shielded: a request cancelled meanwhile must not cut the refresh between the
        # server's answer (the old refresh token gone) and the write of the new one, nor
        # let the lock go before it.
        task = asyncio.ensure_future(self._refresh_locked(client, cred, state, shape, refused))
        task.add_done_callback(_retrieved)
        return await asyncio.shield(task)

    async def _refresh_locked(
        self,
        client: HttpClient,
        cred: dict[str, Any],
        state: TokenState,
        shape: str,
        refused: str | None,
    ) -> _Token:
        # Longer than the token request may take (its connect deadline, then its headers
        # and its body within the read timeout each), so that a live holder never loses
        # the lock to a waiter who would send the same single-use refresh token.
        wait = self.token_timeout or self.settings.http_client.timeout_seconds
        connect = getattr(self.token_transport, "connect_timeout", None) or wait
        lease = 30.0 + connect + 2 * wait
        lock = NamedLock(state.engine, f"oauth2-refresh:{cred['id']}", lease)
        try:
            async with lock.held(max_wait=lease + 10):
                stored = await statement(state.engine, state.read)
                token = _adopted(stored, shape, refused)
                if token is not None:
                    return token  # another worker refreshed while this one waited
                return await self._refresh(client, cred, state, stored, shape)
        except LockBusy as e:
            raise ArtemisError(
                ErrorCode.SOURCE_ERROR,
                f"{self.code} credential {cred.get('credential_name')!r}: {e}",
                retryable=True,
                details={"reason": "token refresh busy"},
            ) from None

    async def _refresh(
        self,
        client: HttpClient,
        cred: dict[str, Any],
        state: TokenState,
        stored: Stored,
        shape: str,
    ) -> _Token:
        """RFC 6749 §6: the refresh token in force for a new access token (and, from a
        server that rotates them, a new refresh token), written back sealed at once."""
        name = cred.get("credential_name")
        form = _given(self.contract.endpoints[TOKEN_USAGE].get("default_body_payload"))
        form.update(grant_type="refresh_token", refresh_token=stored.refresh_token)
        headers = {**self.token_headers, "Accept": "application/json"}
        self._client_auth(cred, form, headers)
        resp = await self._post_token(client, cred, form, headers)
        rotated = _refresh_token_of(resp)
        kept = rotated or stored.refresh_token
        try:
            token = _token_of(resp, self._token_what(), name)
        except ArtemisError:
            if rotated is not None:  # the old one is spent: the new one is kept whatever
                await statement(state.engine, state.save, stored.version, Issued(kept, None, shape))
            raise
        issued = Issued(kept, token.value, shape, *_seconds_left(token))
        if not await statement(state.engine, state.save, stored.version, issued):
            log.error(
                "refresh_token_not_saved",
                credential=name,
                version=stored.version,
                reason="the credential's token state changed during the refresh",
            )
        elif rotated is not None and rotated != stored.refresh_token:
            # The spent one: redacted a while longer (lines in flight), then forgotten.
            self._retire(_Token(stored.refresh_token, None))
        log.info("oauth2_token_refreshed", credential=name, version=stored.version + 1)
        return token

    # -- session logins ---------------------------------------------------------------------
    async def _login(self, client: HttpClient, cred: dict[str, Any]) -> _Token:
        """One login at the TOKEN endpoint: the user and password in its body (JSON or a
        form, ``request_content_type``), the session token read at ``token_jsonpath``."""
        ep = self.contract.endpoints[TOKEN_USAGE]
        name = cred.get("credential_name")
        kind = ep.get("request_content_type") or JSON_TYPE
        body = _login_body(
            _given(ep.get("default_body_payload")),
            self._principal(cred["id"]),
            self._secret(cred["id"]),
        )
        headers = {**self.token_headers, "Accept": "application/json"}
        resp = await self._post_token(client, cred, None, headers, (encode_body(body, kind), kind))
        path = cred.get("token_jsonpath") or DEFAULT_TOKEN_JSONPATH
        try:
            value = json_path_get(resp.json(), path)
        except ValueError:
            value = None
        if not isinstance(value, str) or not value:
            raise ArtemisError(
                ErrorCode.SOURCE_CONTRACT,
                f"{self._token_what()}: the login's answer has no token at {path!r} "
                f"(credential {name!r}, token_jsonpath)",
                retryable=False,
            )
        register_secret(value)
        log.info("session_login", credential=name)
        return _Token(value, None)


def _check_token_status(
    resp: Answer, what: str, name: Any, refusals: tuple[int, ...] = (400, 401)
) -> None:
    """A token endpoint's error answer: a refused client or login (``refusals``) is final
    for the key (``_TokenRefused``), any other error status is classified as usual."""
    if resp.status_code in refusals:
        # RFC 6749 §5.2: invalid_client, invalid_grant (a refresh token used, revoked or
        # expired), invalid_scope ...; a login refused: no retry of the same key helps.
        raise _TokenRefused(
            ArtemisError(
                ErrorCode.SOURCE_ERROR,
                f"{what} refused credential {name!r} (answered {resp.status_code}: "
                f"{body_excerpt(resp)})",
                retryable=False,
                details={"status": resp.status_code, "reason": "token refused"},
            )
        )
    if resp.status_code >= 300:
        raise status_error(ErrorCode.SOURCE_ERROR, what, resp)


def _token_of(resp: Answer, what: str, name: Any) -> _Token:
    """The access token a token endpoint answered (redacted from the logs from here on),
    renewed a margin before it expires."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    value = body.get("access_token") if isinstance(body, dict) else None
    kind = body.get("token_type") if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"{what}: the answer has no access_token (RFC 6749 §5.1)",
            retryable=False,
        )
    register_secret(value)
    if kind is not None and str(kind).lower() != "bearer":
        raise ArtemisError(
            ErrorCode.SOURCE_CONTRACT,
            f"{what}: token_type {str(kind)[:40]!r} is not supported (Bearer only)",
            retryable=False,
        )
    lifetime = _seconds(body.get("expires_in"))
    renew_at = expires_at = None
    if lifetime is not None:
        expires_at = time.monotonic() + lifetime
        renew_at = expires_at - min(TOKEN_MARGIN_S, lifetime / 10)
    log.info("oauth2_token_fetched", credential=name, expires_in=lifetime)
    return _Token(value, renew_at, expires_at)


def _refresh_token_of(resp: Answer) -> str | None:
    """The refresh token a refresh answered (RFC 6749 §5.1, optional: a server that does
    not rotate keeps the one sent), redacted from the logs from here on."""
    try:
        body = resp.json()
    except ValueError:
        return None
    value = body.get("refresh_token") if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        return None
    register_secret(value)
    return value


def _seconds_left(token: _Token) -> tuple[float | None, float | None]:
    """Seconds until ``token`` is due for renewal and until it expires (None: unsaid)."""
    now = time.monotonic()
    return (
        None if token.renew_at is None else token.renew_at - now,
        None if token.expires_at is None else token.expires_at - now,
    )


def _adopted(stored: Stored, shape: str, refused: str | None) -> _Token | None:
    """The access token a refresh stored, when it was asked for the same way, is not the
    one the source refused, and is not yet due for renewal."""
    value = stored.access_token
    if value is None or stored.access_shape != shape or value == refused:
        return None
    if stored.renew_in is not None and stored.renew_in <= 0:
        return None
    now = time.monotonic()
    return _Token(
        value,
        None if stored.renew_in is None else now + stored.renew_in,
        None if stored.expires_in is None else now + stored.expires_in,
    )


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A refresh whose requests were all cancelled: its error is logged by its own
    lines, never left unretrieved."""
    if not task.cancelled():
        task.exception()


def _login_body(body: dict[str, Any], user: str, password: str) -> dict[str, Any]:
    """A login's body: ``body`` with its ``{principal}`` and ``{secret}`` values replaced
    by the user and the password; one it does not mark goes as ``username`` or
    ``password``."""
    marked: set[str] = set()
    values = {PRINCIPAL_MARK: user, SECRET_MARK: password}

    def fill(value: Any) -> Any:
        if isinstance(value, str) and value in values:
            marked.add(value)
            return values[value]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    out = fill(body)
    for mark, field in _LOGIN_FIELDS.items():
        if mark not in marked:
            out[field] = values[mark]
    return out


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _given(values: dict[str, Any] | None) -> dict[str, Any]:
    """A TOKEN endpoint's default body or query as sent: the keys whose value is not null."""
    return {k: v for k, v in (values or {}).items() if v is not None}


def _canonical(value: Any) -> str:
    """``value`` as one text whatever its keys' order (a part of a token's cache key)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _basic(user: str, password: str) -> str:
    """An HTTP Basic ``Authorization`` value (RFC 7617, UTF-8)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _seconds(value: Any) -> float | None:
    """``expires_in`` as seconds (a number, or a numeric string some servers send)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
