"""What a request that got no answer means: the ``TransportError`` family the HTTP client
(``artemis/http.py``) maps every aiohttp, OS and TLS failure into, and the error code each
becomes for a source, a sink or a callback (``transport_error``). No aiohttp here: the
client's callers handle these without it."""

from __future__ import annotations

from artemis.errors import ArtemisError, ErrorCode
from artemis.outage import status_reason


class TransportError(Exception):
    """No usable answer: the request could not be sent or its answer not read whole.

    Retrying may help, except where no wait can (``transport_error`` says which). The
    message never carries the URL's
    query (an API key may be a parameter); ``reason`` is a few words for an operator, the
    ones an outage shows ("connection refused", "read timed out", ...)."""

    reason = "network error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class ConnectError(TransportError):
    """No connection: refused, a name that does not resolve, a failed TLS handshake."""

    reason = "cannot connect"


class CertificateRejected(ConnectError):
    """The server's TLS certificate failed verification: no waiting makes a certificate
    trusted, renews it or changes the name it is for, so no retry helps. ``check`` names
    the check that failed: ``untrusted`` (no CA of the trust store, or of the CA bundle,
    signed it), ``expired``, ``hostname`` (a certificate for another name or address) or
    ``other``."""

    reason = "TLS certificate rejected"

    def __init__(self, message: str, *, check: str, reason: str) -> None:
        super().__init__(message, reason=reason)
        self.check = check


class ProxyRefused(ConnectError):
    """The proxy answered the tunnel request (CONNECT) with a status no retry changes
    (407 Proxy Authentication Required, 403, ...)."""

    reason = "proxy refused"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, reason=f"proxy refused ({status_reason(status)})")
        self.status = status


class CABundleError(ConnectError):
    """A CA bundle (``Transport.ca_bundle``) that cannot verify anything: missing,
    unreadable, not a regular file, or holding no certificate. A configuration error."""

    reason = "CA bundle unreadable"


class TransportTimeout(TransportError):
    reason = "timed out"


class ConnectTimeout(TransportTimeout):
    reason = "connect timed out"


class ReadTimeout(TransportTimeout):
    """No answer, or not all of it, in time (an answer that trickles in included)."""

    reason = "read timed out"


class ProtocolError(TransportError):
    """The server broke HTTP: closed the connection mid-answer, or answered garbage."""

    reason = "connection closed mid-answer"


class AddressNotAllowed(TransportError):
    """A request-supplied URL whose host, or every address it resolves to, the allow-list
    does not admit (``artemis.netguard``): never sent, never retried."""


class InvalidURL(TransportError):
    """A URL no request can be sent to (not http(s), a broken host or port)."""

    reason = "invalid URL"


class AnswerTooLarge(TransportError):
    """An answer larger than the reader's bound (after decompression): no retry helps."""

    reason = "answer too large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes (http_client.max_body_bytes)")
        self.limit = limit


_CERT_ADVICE = {
    "untrusted": "trust its CA (a registry source: http_cfg.tls_ca_bundle_path; the worker: "
    "SSL_CERT_FILE)",
    "expired": "the server's certificate must be renewed",
    "hostname": "the certificate is for another name: use a URL with a name it is for",
    "other": "the certificate cannot be verified",
}


# --- onto error codes -------------------------------------------------------------------


def transport_error(code: ErrorCode, what: str, exc: TransportError) -> ArtemisError:
    """A transport failure as an error naming what was being done: retryable (what an
    outage wait may heal: refused, reset, timed out, a name not resolved, a proxy down),
    or final (docs/errors.md): an answer past its size bound (a source's:
    SOURCE_CONTRACT), an address not allowed, a certificate failing verification, a
    CA bundle, a proxy refusing the tunnel, an invalid URL."""
    if isinstance(exc, AnswerTooLarge):
        return ArtemisError(
            ErrorCode.SOURCE_CONTRACT if code is ErrorCode.SOURCE_ERROR else code,
            f"{what}: {exc}",
            retryable=False,
            details={"reason": exc.reason, "limit": exc.limit},
        )
    if isinstance(exc, AddressNotAllowed):
        # The request's URL leads where it may not: no retry can change that.
        return ArtemisError(
            ErrorCode.INVALID_INPUT,
            f"{what}: {exc}",
            retryable=False,
            details={"reason": exc.reason},
        )
    final = _final_transport_error(code, what, exc)
    if final is not None:
        return final
    if isinstance(exc, TransportTimeout):
        message = f"{what}: timed out ({type(exc).__name__})"
    else:
        message = f"{what}: {type(exc).__name__}: {exc}"
    return ArtemisError(code, message, retryable=True, details={"reason": exc.reason})


def _final_transport_error(code: ErrorCode, what: str, exc: TransportError) -> ArtemisError | None:
    """The transport failures no wait heals, each failing at once naming its cause: a
    certificate that fails verification (TLS_VERIFY_FAILED naming the check), a CA bundle
    that cannot verify anything (CONFIG_ERROR), a proxy refusing the tunnel, a URL no
    request can go to. None: ``exc`` may pass on retry."""
    if isinstance(exc, CertificateRejected):
        return ArtemisError(
            ErrorCode.TLS_VERIFY_FAILED,
            f"{what}: {exc.reason}: {_CERT_ADVICE[exc.check]} ({exc})",
            retryable=False,
            details={"reason": exc.reason, "check": exc.check},
        )
    if isinstance(exc, CABundleError):
        return ArtemisError(
            ErrorCode.CONFIG_ERROR,
            f"{what}: {exc}",
            retryable=False,
            details={"reason": exc.reason},
        )
    if isinstance(exc, ProxyRefused | InvalidURL):
        return ArtemisError(
            code,
            f"{what}: {type(exc).__name__}: {exc}",
            retryable=False,
            details={"reason": exc.reason},
        )
    return None
