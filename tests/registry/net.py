"""Real network parts for the registry's transport and auth tests, all on 127.0.0.1: an
HTTP server that records what it received, a forward proxy that counts what passes
through it, a test CA with a server certificate, a listening port whose backlog is full
(a connection to it never completes), and a provenance built from a YAML document
behind a ``ContractClient``."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import select
import socket
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from artemis.config import Settings, load_settings
from artemis.registry.client import ContractClient
from artemis.registry.resolve import resolve_contract
from artemis.registry.yaml_io import import_yaml

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Server:
    """An aiohttp server on 127.0.0.1 (optionally TLS) recording every request."""

    routes: dict[tuple[str, str], Handler]
    tls: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> Server:
        app = web.Application()

        def recording(handler: Handler) -> Handler:
            async def record(request: web.Request) -> web.StreamResponse:
                self.seen.append(
                    Seen(
                        request.method,
                        request.path,
                        dict(request.query),
                        dict(request.headers),
                        await request.read(),
                        asyncio.get_running_loop().time(),
                    )
                )
                return await handler(request)

            return record

        for (method, path), handler in self.routes.items():
            app.router.add_route(method, path, recording(handler))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def texts(self) -> list[str]:
        """Everything each request carried, as text (to look for a secret in)."""
        return [
            " ".join([s.path, repr(s.query), repr(s.headers), s.body.decode("latin-1")])
            for s in self.seen
        ]


async def json_ok(request: web.Request) -> web.Response:
    return web.json_response({"items": [{"id": 1}], "path": request.path})


class CountingProxy:
    """A forward HTTP proxy: an absolute-form request (``GET http://host:port/p``) is sent
    on to its origin in origin-form, one request per connection; ``CONNECT host:port``
    opens a tunnel. Every request line it received is kept in ``lines``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.url = ""
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> CountingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
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
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        self.lines.append(f"{method} {target}")
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:
            rest = target.split("://", 1)[1]
            authority, _, path = rest.partition("/")
            host, port = authority.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            kept = [
                h
                for h in lines[1:]
                if h and h.split(":", 1)[0].lower() not in ("connection", "proxy-connection")
            ]
            request = [f"{method} /{path} {version}", *kept, "Connection: close", "", ""]
            up_writer.write("\r\n".join(request).encode("latin-1"))
            await up_writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def count(self, method: str | None = None) -> int:
        return sum(1 for line in self.lines if method is None or line.startswith(method))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except RuntimeError:
            pass


@dataclass
class Certs:
    """A test CA and a server certificate for 127.0.0.1 signed by it (PEM files)."""

    ca_file: Path
    other_ca_file: Path
    server: ssl.SSLContext


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_certs(folder: Path) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and localhost signed by it, and another
    CA that signed nothing (a bundle that must not verify the server)."""
    ca_key, ca_cert = _ca("Artemis test CA")
    _, other_cert = _ca("Another test CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, other_file = folder / "ca.pem", folder / "other-ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    other_file.write_bytes(other_cert.public_bytes(pem))
    cert_file, key_file = folder / "server.pem", folder / "server.key"
    cert_file.write_bytes(cert.public_bytes(pem))
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    return Certs(ca_file, other_file, server)


class FullBacklog:
    """A port that listens and never accepts, its backlog filled: the kernel drops every
    further SYN, so a connection to it neither completes nor is refused (a connect
    timeout on loopback, without depending on an unroutable address)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.fillers: list[socket.socket] = []
        for _ in range(64):
            probe = socket.socket()
            probe.setblocking(False)
            probe.connect_ex(("127.0.0.1", self.port))
            self.fillers.append(probe)
            # A probe that stays unconnected shows the queue is full.
            _, writable, _ = select.select([], [probe], [], 0.3)
            if not writable:
                return
        raise RuntimeError("the listen backlog never filled")

    def close(self) -> None:
        for s in self.fillers:
            s.close()
        self.listener.close()


def unique_code(prefix: str) -> str:
    # Rate gates and held tokens are per process: a code of its own per test.
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def provenance(code: str, base: str, **sections: Any) -> dict[str, Any]:
    """A provenance whose SEARCH endpoint is ``/items`` on ``base``, plus ``sections``
    (each a list of rows; ``effective_from`` and ``scope_code`` filled in)."""
    doc: dict[str, Any] = {
        "provenance": {"provenance_code": code, "base_url_default": base},
        "endpoint_def": [
            {"endpoint_name": "items", "endpoint_usage_code": "SEARCH", "path_template": "/items"}
        ],
        # (a DETAIL endpoint some tests add fetches records by this key)
        "pagination_cfg": [{"pagination_mode_code": "PAGE_NUMBER", "record_key_jsonpath": "$.id"}],
    }
    for name, rows in sections.items():
        if name == "endpoint_def":
            doc[name] = doc[name] + rows
        else:
            doc[name] = rows
    for name, rows in doc.items():
        if name != "provenance":
            for row in rows:
                row.setdefault("scope_code", "SOURCE")
                row.setdefault("effective_from", "2025-01-01T00:00:00Z")
    return doc


def settings_for(engine: Any, key_file: str) -> Settings:
    return load_settings(
        None,
        database={"url": engine.url.render_as_string(hide_password=False)},
        vault={"master_key_file": key_file},
    )


def contract_client(
    engine: Any, key_file: str, doc: dict[str, Any], usage: str = "SEARCH"
) -> ContractClient:
    """``doc`` imported, its contract resolved now for a harvest, as a ``ContractClient``."""
    import_yaml(engine, yaml.safe_dump(doc), key_file)
    with engine.connect() as conn:
        contract = resolve_contract(
            conn, doc["provenance"]["provenance_code"], "harvest", usage=usage
        )
    return ContractClient(contract, settings_for(engine, key_file))


def contract_of(engine: Any, code: str) -> Any:
    with engine.connect() as conn:
        return resolve_contract(conn, code, "harvest")
