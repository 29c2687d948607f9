"""docs/errors.md cannot drift from the code: its table of error codes lists every
``ErrorCode`` with the handling the code gets (waited out, retried, fails at once), and
its table of HTTP statuses and transport failures says of each what the classifying
functions make of it (``status_error``, ``transport_error`` after ``_mapped``,
``is_transient_status``, ``outage_of``, the key rotation's ``Credentials.exhausted``),
with the code and the reason the error carries."""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from artemis.config import load_settings
from artemis.errors import ArtemisError, ErrorCode
from artemis.http import Answer, Headers, _ca_bundle_context, _mapped, status_error
from artemis.netguard import AddressRefused
from artemis.outage import TRANSIENT_4XX, is_transient_status, outage_of
from artemis.registry.auth import Credentials, _check_token_status, _TokenRefused
from artemis.registry.resolve import Contract
from artemis.transport_errors import AnswerTooLarge, TransportError, transport_error
from workflows.retry_policies import NON_RETRYABLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
OUTCOMES = ("waited out", "retried", "fails at once")


def handling(err: ArtemisError) -> str:
    """What a run does with ``err`` raised by its fetch or emit: an outage is waited out,
    another retryable error retried by Temporal's policy, the rest fail at once."""
    if not err.retryable:
        return "fails at once"
    if outage_of(err, "source", "src") is not None:
        return "waited out"
    return "retried"


def section(heading: str) -> str:
    text = DOC.read_text()
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table(heading: str) -> list[list[str]]:
    """The rows of the section's table (header and rule left out), cells stripped."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in section(heading).splitlines()
        if line.startswith("| ")
    ]
    return [row for row in rows[1:] if not all(set(cell) == {"-"} for cell in row)]


def first_code(cell: str) -> str:
    found = re.search(r"`([^`]+)`", cell)
    assert found, f"no `...` in {cell!r}"
    return found.group(1)


# -- the error codes -------------------------------------------------------------------------
def test_every_error_code_is_in_the_table_once_with_its_handling():
    rows = table("Error codes")
    codes = [first_code(row[0]) for row in rows]
    assert sorted(codes) == sorted(c.value for c in ErrorCode), "docs/errors.md: codes"
    assert len(codes) == len(set(codes))
    for row in rows:
        code = ErrorCode(first_code(row[0]))
        assert row[1] in OUTCOMES, row
        assert row[1] == handling(ArtemisError(code, "x")), (code, row[1])
        # "fails at once" is what every retry policy of a run knows as non-retryable
        assert (row[1] == "fails at once") == (code.value in NON_RETRYABLE), code


def test_internal_is_waited_out_only_when_it_names_the_staging_store():
    [row] = [r for r in table("Error codes") if r[0] == "`INTERNAL`"]
    assert "waited out when it names the run's staging database" in row[2]
    bug = ArtemisError(ErrorCode.INTERNAL, "x")
    store = ArtemisError(ErrorCode.INTERNAL, "x", details={"dependency": "store"})
    assert handling(bug) == "retried" and handling(store) == "waited out"


# -- statuses and transport failures -----------------------------------------------------------
def _status(status: int, code: ErrorCode = ErrorCode.SOURCE_ERROR) -> ArtemisError:
    return status_error(code, "src GET", Answer(status, Headers()))


_KEY = aiohttp.client_reqrep.ConnectionKey("api.example", 443, True, True, None, None, None)


def _cert_error(verify_code: int) -> BaseException:
    e = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"
    )
    e.verify_code = verify_code
    return aiohttp.ClientConnectorCertificateError(_KEY, e)


def _proxy_answer(status: int) -> BaseException:
    return aiohttp.ClientHttpProxyError(None, (), status=status, message="proxy says no")


def _bundle(path: str) -> TransportError:
    try:
        _ca_bundle_context(path)
    except TransportError as e:
        return e
    raise AssertionError(f"{path} verified")


# Each row's label -> the transport failures it stands for, as aiohttp or the OS raise
# them (mapped by the client's one mapping), or as the client raises them itself.
TRANSPORT: dict[str, Callable[[], list[TransportError]]] = {
    "connection refused": lambda: [
        _mapped(aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(111, "refused")), "u")
    ],
    "connection reset": lambda: [_mapped(ConnectionResetError(104, "reset by peer"), "u")],
    "connection closed mid-answer": lambda: [
        _mapped(aiohttp.ServerDisconnectedError(), "u"),
        _mapped(aiohttp.ClientPayloadError("cut"), "u"),
    ],
    "a malformed answer": lambda: [_mapped(aiohttp.ClientResponseError(None, ()), "u")],
    "a name that does not resolve (DNS)": lambda: [
        _mapped(aiohttp.ClientConnectorError(_KEY, OSError_gai()), "u")
    ],
    "connect timeout": lambda: [_mapped(aiohttp.ConnectionTimeoutError(), "u")],
    "read timeout (no answer, or not all of it, in time)": lambda: [
        _mapped(TimeoutError(), "u"),
        _mapped(aiohttp.SocketTimeoutError(), "u"),
    ],
    "a TLS handshake failing otherwise than by a certificate check": lambda: [
        _mapped(aiohttp.ClientConnectorSSLError(_KEY, ssl.SSLError(1, "wrong version")), "u")
    ],
    "TLS certificate not trusted (self-signed, an unknown CA)": lambda: [
        _mapped(_cert_error(code), "u") for code in (2, 18, 19, 20, 21, 27)
    ],
    "TLS certificate expired": lambda: [_mapped(_cert_error(10), "u")],
    "TLS certificate for another host name or address": lambda: [
        _mapped(_cert_error(62), "u"),
        _mapped(_cert_error(64), "u"),
    ],
    "a CA bundle missing, unreadable or not a regular file": lambda: [
        _bundle("/dev/null"),
        _bundle("/nonexistent/artemis-ca.pem"),
    ],
    "a proxy that cannot be reached or answers the tunnel with a `5xx`": lambda: [
        _mapped(
            aiohttp.ClientProxyConnectionError(_KEY, ConnectionRefusedError(111, "refused")), "u"
        ),
        _mapped(_proxy_answer(502), "u"),
        _mapped(_proxy_answer(503), "u"),
    ],
    "a proxy refusing the tunnel (`407`, `403`, ...)": lambda: [
        _mapped(_proxy_answer(407), "u"),
        _mapped(_proxy_answer(403), "u"),
    ],
    "a URL no request can go to": lambda: [_mapped(ValueError("not an http(s) URL"), "u")],
    "an answer past its size bound": lambda: [AnswerTooLarge(1024)],
    "a request-supplied URL to an address not allowed": lambda: [
        _mapped(aiohttp.ClientConnectorError(_KEY, AddressRefused("10.0.0.1 not allowed")), "u")
    ],
}


def OSError_gai() -> OSError:  # noqa: N802  (what the resolver raises)
    import socket

    return socket.gaierror(socket.EAI_NONAME, "Name or service not known")


OTHER_4XX = [s for s in range(400, 500) if s not in TRANSIENT_4XX]
STATUSES: dict[str, list[int]] = {
    "a `5xx` answer": [500, 502, 503, 504, 599],
    "a `408`, `425` or `429` answer": sorted(TRANSIENT_4XX),
    "any other `4xx` answer": OTHER_4XX,
}


def _contract(rows: list[dict]) -> Contract:
    endpoint = {"id": 1, "endpoint_name": "items", "endpoint_usage_code": "SEARCH"}
    return Contract(
        provenance={"provenance_code": "doc_table"},
        task_type=None,
        at="2025-01-01T00:00:00+00:00",
        usage="SEARCH",
        endpoint=endpoint,
        endpoints={"SEARCH": endpoint},
        pagination=None,
        window_offset=None,
        http=None,
        batching=None,
        retry=None,
        rate_limit=None,
        credentials=rows,
    )


def _keys_benched(statuses: list[int]) -> ArtemisError:
    """The error a request meets when every key rests after these answers."""
    ids = [987_650 + n for n in range(len(statuses))]
    rows = [
        {
            "id": i,
            "credential_name": f"k{i}",
            "auth_type_code": "API_KEY_QUERY",
            "secret_env_name": "DOC_TABLE_KEY",
            "has_secret": True,
        }
        for i in ids
    ]
    creds = Credentials(_contract(rows), load_settings(None))
    try:
        for i, status in zip(ids, statuses, strict=True):
            headers = Headers({"Retry-After": "30"}) if status == 429 else Headers()
            creds.bench(i, Answer(status, headers))
        return creds.exhausted(None, "src GET")
    finally:
        for i in ids:
            Credentials._benched.pop(i, None)
            Credentials._bench_status.pop(i, None)


def _token_refused(status: int) -> ArtemisError:
    with pytest.raises(_TokenRefused) as e:
        _check_token_status(Answer(status, Headers()), "src token endpoint", "client")
    return e.value.error


KEYS: dict[str, Callable[[], list[ArtemisError]]] = {
    "`401`/`403` from every key of the source": lambda: [
        _keys_benched([401]),
        _keys_benched([401, 403]),
        _keys_benched([403, 403]),
    ],
    "every key resting after a `429`": lambda: [_keys_benched([429]), _keys_benched([401, 429])],
    "the token endpoint refusing the OAuth2 client (`400`/`401`)": lambda: [
        _token_refused(400),
        _token_refused(401),
    ],
}


def test_the_failure_table_lists_every_class_the_tests_know_and_no_other():
    labels = [row[0] for row in table("HTTP statuses and transport failures")]
    assert len(labels) == len(set(labels))
    assert set(labels) == set(TRANSPORT) | set(STATUSES) | set(KEYS)


def _errors(label: str, code: ErrorCode) -> list[ArtemisError]:
    if label in STATUSES:
        return [_status(s, code) for s in STATUSES[label]]
    if label in TRANSPORT:
        return [transport_error(code, "src GET", e) for e in TRANSPORT[label]()]
    return KEYS[label]() if code is ErrorCode.SOURCE_ERROR else []


@pytest.mark.parametrize(
    "row", table("HTTP statuses and transport failures"), ids=lambda row: row[0][:40]
)
def test_each_failure_class_has_the_code_handling_and_reason_written(row):
    label, code_cell, outcome, reason_cell = row
    assert outcome in OUTCOMES
    errors = _errors(label, ErrorCode.SOURCE_ERROR)
    assert errors
    for err in errors:
        assert err.code.value == first_code(code_cell), (label, err.code)
        assert handling(err) == outcome, (label, err.message)
        assert err.details.get("reason") == first_code(reason_cell) or label in (
            *STATUSES,
            "a CA bundle missing, unreadable or not a regular file",
            "a proxy refusing the tunnel (`407`, `403`, ...)",
        ), (label, err.details)
    # The reason written is the first case's own (a status: the example status's).
    if label in STATUSES:
        example = int(first_code(reason_cell).split()[0])
        assert first_code(reason_cell) == _status(example).details["reason"]
        assert example in STATUSES[label]
    else:
        assert errors[0].details.get("reason") == first_code(reason_cell), label
    # A sink's failure of the same class: SINK_ERROR where a source's is SOURCE_ERROR
    # (an answer too large stays the sink's own code), handled alike.
    for err in _errors(label, ErrorCode.SINK_ERROR):
        if first_code(code_cell) in ("SOURCE_ERROR", "SOURCE_CONTRACT"):
            assert err.code is ErrorCode.SINK_ERROR, label
        assert handling(err) == outcome, label


def test_the_status_classes_are_what_is_transient_status_says():
    for status in range(400, 600):
        transient = status in STATUSES["a `5xx` answer"] or status >= 500
        transient = transient or status in STATUSES["a `408`, `425` or `429` answer"]
        assert is_transient_status(status) == transient, status
        assert (status in OTHER_4XX) == (not transient), status
