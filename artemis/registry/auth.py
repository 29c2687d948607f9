"""How a run reaches a registry source: its transport (proxy, TLS, timeouts, compression:
``http_cfg``) and its credentials (API keys, Bearer tokens, HTTP Basic, OAuth2 client
credentials), with per-key health and the rule that an endpoint needing auth has a
usable credential before the run sends anything.

Secrets are decrypted here, on use, and registered with the log redaction; an OAuth2
access token lives in this process only (never in a contract, a checkpoint or workflow
history), is registered with the redaction while it is in use and until it has expired
(a replaced one too), and goes to the source's origin only, as the client secret goes to
the token endpoint's only. The source's transport and default headers go to the source's
origin only: a token endpoint elsewhere is reached with the worker's defaults.
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
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote_plus

from sqlalchemy import select

from artemis.config import Settings
from artemis.crawler.vault import vault_for
from artemis.db import get_engine
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import (
    Answer,
    HttpClient,
    Transport,
    TransportError,
    body_excerpt,
    ca_bundle_problem,
    retry_after_seconds,
    status_error,
    transport_error,
    with_params,
)
from artemis.logsetup import get_logger
from artemis.redact import forget_secret, register_secret
from artemis.registry.http_rules import (
    OAUTH2,
    PAIRED_AUTH_TYPES,
    TOKEN_USAGE,
    basic_user_problem,
    credential_problem,
    http_cfg_problem,
    token_url_problem,
)
from artemis.registry.models import RegProvCredential
from artemis.registry.resolve import Contract
from artemis.registry.secret_env import check_secret_env, placement
from artemis.security import origin, same_origin

log = get_logger(__name__)

# An access token is replaced this long before its ``expires_in`` runs out (at most a
# tenth of its life), so that a request sent just before the end does not meet a 401.
TOKEN_MARGIN_S = 60.0
# A replaced access token stays redacted this long past its expiry (or past its
# replacement when its life is unknown): requests sent with it just before may still be
# in flight, and their errors and log lines may quote it.
RETIRED_GRACE_S = 60.0


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
            f"provenance {contract.provenance.get('provenance_code')!r}: an {OAUTH2} "
            f"credential needs an endpoint_def row with endpoint_usage_code {TOKEN_USAGE} "
            "(where its access tokens are fetched)"
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
    if not cred.get("has_secret"):
        return False
    if cred.get("auth_type_code") in PAIRED_AUTH_TYPES and not cred.get("has_principal"):
        return False
    return cred.get("lifecycle_status_code", "ACTIVE") == "ACTIVE" and not cred.get("deleted")


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
            and (usage != TOKEN_USAGE or c.get("auth_type_code") == OAUTH2)
        ]
        if not found:
            kind = f"an {OAUTH2} credential" if usage == TOKEN_USAGE else "a credential"
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
    """

    # credential id -> monotonic time until which the key is not used (per worker process)
    _benched: ClassVar[dict[int, float]] = {}
    # credential id -> the status that benched it (None: its client was refused at the
    # token endpoint): a refusal no wait heals, a 429 one that passes.
    _bench_status: ClassVar[dict[int, int | None]] = {}
    # OAuth2 access tokens by what shapes them (a digest: ``_client_key``)
    _tokens: ClassVar[dict[str, _Token]] = {}
    # Replaced access tokens still redacted, as a heap of (monotonic time to forget, value):
    # one entry per replacement, each gone within its token's life plus RETIRED_GRACE_S.
    _retired: ClassVar[list[tuple[float, str]]] = []
    # One fetch at a time per client, per event loop (an asyncio lock belongs to one).
    _locks: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]]]
    _locks = weakref.WeakKeyDictionary()

    def __init__(
        self,
        contract: Contract,
        settings: Settings,
        *,
        base: str | None = None,
        headers: dict[str, str] | None = None,
        transport: Transport | None = None,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.contract = contract
        self.code = contract.provenance.get("provenance_code")
        self.rows = [c for c in contract.credentials if _usable(c)]
        for cred in contract.credentials:
            if cred.get("has_secret") and not _usable(cred):
                # A pair with one half (a row written around the import): not skipped in
                # silence, the run says which.
                raise _config_error(
                    f"provenance {self.code!r}: credential {cred.get('credential_name')!r} "
                    f"({cred.get('auth_type_code')}) has no principal (principal_env)"
                )
        for cred in self.rows:
            label = f"credential {cred.get('credential_name')!r}"
            # A row written around the import's checks may hold one of the service's own
            # variables: the run stops before that secret is sent anywhere.
            check_secret_env(
                cred.get("secret_env_name"), ErrorCode.CONFIG_ERROR, f"{label}: secret_env"
            )
            check_secret_env(
                cred.get("principal_env_name"), ErrorCode.CONFIG_ERROR, f"{label}: principal_env"
            )
            why = credential_problem(cred, "principal_env_name")
            if why:
                raise _config_error(f"provenance {self.code!r}: {label}: {why}")
        self.settings = settings
        self.base = base or ""
        self.headers = dict(headers or {})
        self.transport = transport
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._secrets: dict[tuple[int, str], str] = {}
        self.token_url = (
            token_url(contract, self.base)
            if any(c.get("auth_type_code") == OAUTH2 for c in self.rows)
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
                what = "secret" if column == "secret_ciphertext" else "principal"
                raise _config_error(f"credential {cred_id} has no {what}")
            value = vault_for(self.settings).decrypt(row[0], row.encryption_key_id)
            register_secret(value)
            self._secrets[(cred_id, column)] = value
        return self._secrets[(cred_id, column)]

    def _principal(self, cred_id: int) -> str:
        return self._secret(cred_id, "principal_ciphertext")

    async def apply(
        self,
        cred: dict[str, Any],
        params: dict[str, Any],
        headers: dict[str, str],
        client: HttpClient | None = None,
    ) -> str:
        """Put ``cred`` on a request; the value sent (an OAuth2 client: the access token,
        fetched with ``client`` when none is held)."""
        where, name = placement(cred)
        kind = cred.get("auth_type_code")
        if kind == OAUTH2:
            if client is None:
                raise ArtemisError(ErrorCode.INTERNAL, "an OAuth2 credential needs a client")
            value = await self._access_token(client, cred)
            headers[name] = f"Bearer {value}"
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

    # -- OAuth2 client credentials --------------------------------------------------------
    def _client_key(self, cred: dict[str, Any]) -> str:
        # The held token belongs to everything that shapes it: this client (a new secret
        # or client id, a re-import, gets a token of its own) at this token endpoint,
        # asked with this body and query (another ``audience`` or ``scope`` is another
        # token) and these headers, for this source's origin (a token is sent to the
        # origin it was fetched for only, never to another provenance's API).
        ep = self.contract.endpoints.get(TOKEN_USAGE) or {}
        raw = "\0".join(
            (
                str(self.token_url),
                self._principal(cred["id"]),
                self._secret(cred["id"]),
                cred.get("token_auth_method_code") or "",
                _canonical(_given(ep.get("default_body_payload"))),
                _canonical(_given(ep.get("default_query_params"))),
                _canonical({k.lower(): v for k, v in self.token_headers.items()}),
                _canonical(list(origin(self.base)) if self.base else None),
            )
        )
        return hashlib.sha256(raw.encode()).hexdigest()

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
            token = await self._fetch_token(client, cred)
            self._tokens[key] = token
            if held is not None and held.value != token.value:
                # Replaced at the margin, so still valid for a while: redacted until then.
                self._retire(held)
            return token.value

    def expire(self, cred: dict[str, Any], used: str) -> None:
        """The source answered 401 to access token ``used``: the next request fetches a
        new one (unless another request already replaced it)."""
        key = self._client_key(cred)
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

    async def _fetch_token(self, client: HttpClient, cred: dict[str, Any]) -> _Token:
        assert self.token_url is not None
        ep = self.contract.endpoints[TOKEN_USAGE]
        name = cred.get("credential_name")
        what = f"{self.code} token endpoint {ep.get('endpoint_name')!r}"
        form, headers = self._token_form(ep, cred)
        url = self.token_url
        query = _given(ep.get("default_query_params"))
        try:
            resp = await client.post(
                with_params(url, query),
                data=form,
                headers=headers,
                timeout=self.token_timeout,
                max_bytes=self.token_max_bytes,
                transport=self.token_transport,
            )
        except TransportError as e:
            raise transport_error(ErrorCode.SOURCE_ERROR, what, e) from None
        _check_token_status(resp, what, name)
        return _token_of(resp, what, name)

    def _token_form(
        self, ep: dict[str, Any], cred: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The client-credentials grant's form and headers, the client authenticated in
        the form or by HTTP Basic (``token_auth_method_code``)."""
        client_id, secret = self._principal(cred["id"]), self._secret(cred["id"])
        form = _given(ep.get("default_body_payload"))
        form["grant_type"] = "client_credentials"
        headers = {**self.token_headers, "Accept": "application/json"}
        if cred.get("token_auth_method_code") == "CLIENT_SECRET_POST":
            form.update(client_id=client_id, client_secret=secret)
        else:
            # RFC 6749 §2.3.1: each part form-urlencoded, then HTTP Basic.
            headers["Authorization"] = _basic(
                quote_plus(client_id, safe=""), quote_plus(secret, safe="")
            )
        return form, headers


def _check_token_status(resp: Answer, what: str, name: Any) -> None:
    """A token endpoint's error answer: a refused client (400/401) is final for the key
    (``_TokenRefused``), any other error status is classified as usual."""
    if resp.status_code in (400, 401):
        # RFC 6749 §5.2: invalid_client, unauthorized_client, invalid_scope ... no
        # retry of the same client helps.
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
