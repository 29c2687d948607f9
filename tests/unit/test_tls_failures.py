"""A certificate that fails verification is permanent: the workers' HTTP client names the
check that failed (untrusted, expired, host name), and the error it becomes fails at once
(``TLS_VERIFY_FAILED``, never retried, never waited out as an outage), where a refused
connection stays an outage. A CA bundle that is not a regular file (a FIFO, a directory,
``/dev/zero``) is refused before anything reads it. Real HTTPS servers on 127.0.0.1 with
certificates made here by ``cryptography``."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from artemis.errors import ErrorCode
from artemis.http import Transport, ca_bundle_problem
from artemis.outage import outage_of
from artemis.transport_errors import (
    CABundleError,
    CertificateRejected,
    ConnectError,
    transport_error,
)
from tests.helpers import http_client
from tests.registry.net import Server, json_ok

PEM = serialization.Encoding.PEM
LOOPBACK_NAMES = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]


@dataclass
class Issuer:
    """A key and the certificate it signs with (a CA, or a leaf signing itself)."""

    key: ec.EllipticCurvePrivateKey
    name: x509.Name


def make_ca(folder: Path, common_name: str = "Artemis TLS test CA") -> tuple[Issuer, Path]:
    """A CA and its PEM file (what a CA bundle holds)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{common_name.replace(' ', '-')}.pem"
    path.write_bytes(cert.public_bytes(PEM))
    return Issuer(key, name), path


def server_tls(
    folder: Path,
    issuer: Issuer | None = None,
    names: list[x509.GeneralName] | None = None,
    expired: bool = False,
) -> ssl.SSLContext:
    """A server's TLS context: its certificate for ``names`` (default 127.0.0.1 and
    localhost) signed by ``issuer`` (None: by itself, a self-signed certificate), valid
    now or (``expired``) until yesterday."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "artemis-tls-test")])
    signer = issuer or Issuer(key, subject)
    now = dt.datetime.now(dt.UTC)
    start, end = (
        (now - dt.timedelta(days=10), now - dt.timedelta(days=1))
        if expired
        else (
            now - dt.timedelta(hours=1),
            now + dt.timedelta(days=1),
        )
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names or LOOPBACK_NAMES), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(signer.key, hashes.SHA256())
    )
    tag = os.urandom(4).hex()
    cert_file, key_file = folder / f"server-{tag}.pem", folder / f"server-{tag}.key"
    cert_file.write_bytes(cert.public_bytes(PEM))
    key_file.write_bytes(
        key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


@pytest.fixture(autouse=True)
def default_trust_store(monkeypatch):
    """The worker's own trust store (certifi's), which holds none of the CAs made here."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


async def _rejected(url: str, transport: Transport | None = None) -> CertificateRejected:
    async with http_client() as http:
        with pytest.raises(CertificateRejected) as e:
            await http.get(url, transport=transport)
    return e.value


def _case(tmp_path: Path, kind: str) -> tuple[ssl.SSLContext, Transport | None, str]:
    """The server's TLS, the client's transport and the host to ask, for each failure:
    only the check named fails (an expired or misnamed certificate is signed by a CA the
    client trusts through its CA bundle)."""
    ca, ca_file = make_ca(tmp_path)
    trusted = Transport(ca_bundle=str(ca_file))
    if kind == "self-signed":
        return server_tls(tmp_path), None, "127.0.0.1"
    if kind == "unknown CA":
        other, _ = make_ca(tmp_path, "A CA nobody trusts")
        return server_tls(tmp_path, other), None, "127.0.0.1"
    if kind == "expired":
        return server_tls(tmp_path, ca, expired=True), trusted, "127.0.0.1"
    other_name: list[x509.GeneralName] = [x509.DNSName("api.other.example")]
    host = "localhost" if kind == "wrong host name" else "127.0.0.1"
    return server_tls(tmp_path, ca, other_name), trusted, host


@pytest.mark.parametrize(
    "kind, check, reason, openssl_says",
    [
        ("self-signed", "untrusted", "TLS certificate not trusted", "self-signed certificate"),
        ("unknown CA", "untrusted", "TLS certificate not trusted", "unable to get local issuer"),
        ("expired", "expired", "TLS certificate expired", "certificate has expired"),
        ("wrong host name", "hostname", "TLS hostname mismatch", "Hostname mismatch"),
        ("wrong IP address", "hostname", "TLS hostname mismatch", "IP address mismatch"),
    ],
)
async def test_a_certificate_failing_verification_fails_at_once_naming_the_check(
    tmp_path, kind, check, reason, openssl_says
):
    tls, transport, host = _case(tmp_path, kind)
    server = await Server({("GET", "/items"): json_ok}, tls=tls).start()
    port = server.url.rsplit(":", 1)[1]
    try:
        began = time.monotonic()
        rejected = await _rejected(f"https://{host}:{port}/items?api_key=s3cret", transport)
        took = time.monotonic() - began
    finally:
        await server.stop()
    assert rejected.check == check and rejected.reason == reason
    assert openssl_says in str(rejected) and "s3cret" not in str(rejected)
    assert server.seen == []  # the handshake failed: no request reached the server
    assert took < 30  # one handshake, never retried (slack for a loaded machine)
    for code in (ErrorCode.SOURCE_ERROR, ErrorCode.SINK_ERROR):
        err = transport_error(code, "quotes GET", rejected)
        assert err.code is ErrorCode.TLS_VERIFY_FAILED and not err.retryable
        assert err.details == {"reason": reason, "check": check}
        assert err.message.startswith(f"quotes GET: {reason}: ")
        # Not an outage: the run fails now, it does not wait its tolerance out.
        assert outage_of(err, "source", "quotes") is None


async def test_the_same_server_trusted_through_its_ca_answers(tmp_path):
    """The contrast: the certificates made here are good ones when their CA is trusted."""
    ca, ca_file = make_ca(tmp_path)
    server = await Server({("GET", "/items"): json_ok}, tls=server_tls(tmp_path, ca)).start()
    try:
        async with http_client() as http:
            resp = await http.get(
                f"{server.url}/items", transport=Transport(ca_bundle=str(ca_file))
            )
    finally:
        await server.stop()
    assert resp.status_code == 200 and len(server.seen) == 1


async def test_a_refused_connection_stays_an_outage():
    async with http_client() as http:
        with pytest.raises(ConnectError) as e:
            await http.get("https://127.0.0.1:1/nothing-listens")
    assert not isinstance(e.value, CertificateRejected)
    err = transport_error(ErrorCode.SOURCE_ERROR, "quotes GET", e.value)
    assert err.code is ErrorCode.SOURCE_ERROR and err.retryable
    outage = outage_of(err, "source", "quotes")
    assert outage is not None and outage.reason == "connection refused"


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "bundle.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.timeout(30)  # a read of the FIFO would block for ever: the check comes first
@pytest.mark.parametrize(
    "make, kind",
    [
        (_fifo, "FIFO"),
        (lambda tmp_path: str(tmp_path), "directory"),
        (lambda tmp_path: "/dev/zero", "character device"),
    ],
)
async def test_a_ca_bundle_that_is_not_a_regular_file_is_a_config_error(tmp_path, make, kind):
    path = make(tmp_path)
    assert f"a {kind}, not a regular file" in (ca_bundle_problem(path) or "")
    async with http_client() as http:
        with pytest.raises(CABundleError) as e:
            await http.get("https://127.0.0.1:1/x", transport=Transport(ca_bundle=path))
    assert e.value.reason == "CA bundle not a regular file"
    err = transport_error(ErrorCode.SOURCE_ERROR, "quotes GET", e.value)
    assert err.code is ErrorCode.CONFIG_ERROR and not err.retryable
    assert f"CA bundle {path}: a {kind}, not a regular file" in err.message
