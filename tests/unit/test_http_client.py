"""The workers' HTTP client (aiohttp underneath) against real servers on loopback: it
sends URLs as httpx would (httpx's encoding, the WHATWG sets; httpx is the reference here),
joins repeated headers, raises only Artemis' own transport errors, never follows a
redirect, never keeps a cookie and never puts a query into an error message."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from artemis.errors import ErrorCode
from artemis.http import Form, Headers, retry_after_seconds
from artemis.transport_errors import (
    ConnectError,
    InvalidURL,
    ProtocolError,
    ReadTimeout,
    TransportTimeout,
    transport_error,
)
from artemis.urls import encode_url, header_links, with_params
from artemis_samples.server import ThreadedServer
from tests.helpers import http_client


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {
            "query": list(request.query_params.multi_items()),
            "raw_query": request.url.query,
            "cookie": request.headers.get("cookie"),
            "x": request.headers.get("x-test"),
        }

    @app.post("/form")
    async def form(request: Request) -> dict[str, Any]:
        body = await request.body()
        return {"type": request.headers.get("content-type"), "body": body.decode()}

    @app.get("/redirect")
    async def redirect() -> Response:
        return RedirectResponse("/echo", status_code=302)

    @app.get("/cookie")
    async def cookie() -> Response:
        resp = JSONResponse({"ok": True})
        resp.set_cookie("session", "s3cret")
        return resp

    @app.get("/odd-charset")
    async def odd_charset() -> Response:
        return Response(b'\xef\xbb\xbf{"a": 1}', media_type="application/json; charset=utf8mb4")

    @app.get("/links")
    async def links() -> Response:
        resp = Response("é".encode("latin-1"), media_type="text/plain; charset=latin-1")
        resp.headers.append("Link", '<http://x/2>; rel="next"')
        resp.headers.append("Link", '<http://x/9>; rel="last"')
        resp.headers["Retry-After"] = "7"
        return resp

    @app.get("/slow")
    async def slow() -> dict[str, bool]:
        await asyncio.sleep(2)
        return {"late": True}

    return app


@pytest.fixture(scope="module")
def server():
    srv = ThreadedServer(make_app()).start()
    yield srv.url
    srv.stop()


def test_params_merge_into_the_query():
    assert with_params("http://h/p?a=b%2Fc", None) == "http://h/p?a=b%2Fc"
    assert with_params("http://h/p?a=b%2Fc", {}) == "http://h/p?a=b%2Fc"
    assert with_params("http://h/p", {"q": "x y", "n": 2}) == "http://h/p?q=x+y&n=2"
    # A key the URL already has is replaced; others are kept, in order.
    assert with_params("http://h/p?page=1&s=k", {"page": 2}) == "http://h/p?s=k&page=2"
    assert with_params("http://h/p?s=k", {"t": [1, 2], "on": True, "off": False, "e": None}) == (
        "http://h/p?s=k&t=1&t=2&on=true&off=false&e="
    )
    # The same query as httpx's URL merge builds for these params.
    params = {"q": "a&b=c", "t": ["1", "2"], "on": True}
    assert (
        httpx.URL(with_params("http://h/p?z=1", params)).params
        == httpx.URL("http://h/p?z=1").copy_merge_params(params).params
    )


async def test_get_sends_params_and_headers(server):
    async with http_client(headers={"X-Test": "default"}) as http:
        resp = await http.get(f"{server}/echo?keep=1", params={"q": "a b", "t": [1, 2]})
        assert resp.status_code == 200
        assert resp.json()["query"] == [["keep", "1"], ["q", "a b"], ["t", "1"], ["t", "2"]]
        assert resp.json()["x"] == "default"
        resp = await http.get(f"{server}/echo", headers={"X-Test": "mine"})
        assert resp.json()["x"] == "mine"


async def test_form_post_and_json_post(server):
    async with http_client() as http:
        resp = await http.post(f"{server}/form", body=Form({"id": [1, 2], "db": "pubmed"}))
        assert resp.json() == {
            "type": "application/x-www-form-urlencoded",
            "body": "id=1&id=2&db=pubmed",
        }
        resp = await http.post(f"{server}/form", json={"a": 1})
        assert resp.json() == {"type": "application/json", "body": '{"a":1}'}


async def test_a_redirect_is_an_answer_never_followed(server):
    async with http_client() as http:
        resp = await http.get(f"{server}/redirect")
        assert resp.status_code == 302
        assert resp.headers["location"] == "/echo"


async def test_no_cookie_is_kept_between_requests(server):
    async with http_client() as http:
        first = await http.get(f"{server}/cookie")
        assert "session=s3cret" in first.headers["set-cookie"]
        again = await http.get(f"{server}/echo")
        assert again.json()["cookie"] is None


@pytest.mark.parametrize(
    "url",
    [
        "http://h/echo?next=http%3A%2F%2Fh%2Fq%3Fa%3D1&sig=a%2Bb%2Fc&sp=x%20y",
        "http://h/p?q=a b&r=é&s=a+b&t=%zz&u=100%&v=a%2fb",
        "http://h/a b/é/%7e/~x?x=[1]&y={2}|^`'\"<>",
        "http://Höst.Example/x",
        "http://H:80/a/./b/../c?x=1#frag",
        "https://h:443/p;param?q=1;2",
        "https://h:8443/path/./to/somewhere/..",
        "http://h/%2F%2f//x?a=1&&b=&c",
        "http://[::1]:8080/x?y=%E2%82%AC&w=€",
    ],
)
def test_urls_go_out_encoded_as_before(url):
    """Byte for byte what httpx sent (path, query, host, port), apart from the fragment,
    which is never sent."""
    want = httpx.URL(url)
    got = encode_url(url)
    assert (got.scheme, got.raw_host, got.explicit_port) == (
        want.scheme,
        want.raw_host.decode(),
        want.port,
    )
    assert got.raw_path_qs == want.raw_path.decode()


def test_what_is_not_an_http_url_is_refused():
    bad = ("ftp://h/x", "h/x", "http:///x", "http://h:99999/x", "http://[::1/x")
    # a control character (a CR LF could add a header) is never sent, as with httpx
    for url in (*bad, "http://h/p?tab=\t", "http://h/p\r\nX-A: b", "http://h/\x7f"):
        with pytest.raises(ValueError):
            encode_url(url)


@pytest.mark.parametrize(
    "value",
    [
        '<http://x/2>; rel="next", <http://x/9>; rel="last"',
        '<http://x/2>; rel=next,<http://x/1>; rel=prev; title="a b"',
        "<http://x/a>, <http://x/b>; rel=next",
        "<http://x/a>; rel; x=1",
        "",
        "garbage",
    ],
)
def test_link_headers_read_as_before(value):
    assert header_links(value) == httpx.Response(200, headers={"link": value}).links


def test_headers_are_case_insensitive_and_join_repeats():
    h = Headers([("Link", "<a>"), ("X-One", "1"), ("link", "<b>")])
    assert h["LINK"] == "<a>, <b>" and "x-one" in h and h.get("x-two") is None
    assert dict(h) == {"link": "<a>, <b>", "x-one": "1"}
    assert Headers({"Retry-After": "7"})["retry-after"] == "7"


async def test_headers_text_and_retry_after_read_as_with_httpx(server):
    async with http_client() as http:
        resp = await http.get(f"{server}/links")
        # Repeated headers join as httpx joins them; names are case-insensitive.
        assert resp.headers.get("LINK") == '<http://x/2>; rel="next", <http://x/9>; rel="last"'
        assert resp.text == "é"  # decoded by the answer's own charset (latin-1)
        assert retry_after_seconds(resp) == 7.0


async def test_transport_failures_are_artemis_errors_with_their_reason(server):
    async with http_client() as http:
        with pytest.raises(ConnectError) as refused:
            await http.get("http://127.0.0.1:1/nothing-listens")
        assert refused.value.reason == "connection refused"
        with pytest.raises(ConnectError) as unknown:
            await http.get("http://no-such-host.invalid/x", timeout=5)
        assert unknown.value.reason == "name not resolved"
        with pytest.raises(TransportTimeout):
            await http.get(f"{server}/slow", timeout=0.2)
        # The client's own timeout applies when a request gives none.
    async with http_client(timeout_seconds=0.2) as http:
        with pytest.raises(ReadTimeout) as slow:
            await http.get(f"{server}/slow")
    err = transport_error(ErrorCode.SOURCE_ERROR, "quotes GET", slow.value)
    assert err.retryable and err.details["reason"] == "read timed out"
    assert err.message == "quotes GET: timed out (ReadTimeout)"
    err = transport_error(ErrorCode.SINK_ERROR, "sink POST", refused.value)
    assert err.retryable and err.details["reason"] == "connection refused"
    assert err.message.startswith("sink POST: ConnectError: ")


async def test_an_invalid_url_is_named_without_its_query():
    async with http_client() as http:
        for url in ("http://[::1/x", "ftp://h/x"):
            with pytest.raises(InvalidURL) as err:
                await http.get(url, params={"api_key": "s3cret-key"})
            assert "s3cret-key" not in str(err.value)


async def test_an_encoded_next_url_goes_out_byte_for_byte(server):
    raw = "next=http%3A%2F%2Fh%2Fq%3Fa%3D1&sig=a%2Bb%2Fc&sp=x%20y"
    async with http_client() as http:
        resp = await http.get(f"{server}/echo?{raw}")
        assert resp.json()["raw_query"] == raw
        # Values given as params are encoded as httpx encodes them.
        resp = await http.get(f"{server}/echo", params={"v": "a/b c+d&e"})
        assert (
            resp.json()["raw_query"]
            == httpx.URL(f"{server}/echo", params={"v": "a/b c+d&e"}).query.decode()
        )


async def test_an_unknown_charset_reads_as_utf8_and_json_takes_a_bom(server):
    async with http_client() as http:
        resp = await http.get(f"{server}/odd-charset")
        assert resp.text.endswith('{"a": 1}')
        assert resp.json() == {"a": 1}


async def test_a_malformed_answer_is_a_protocol_error_without_the_query():
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nBad Header Line\r\n\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(broken, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with http_client() as http:
            with pytest.raises(ProtocolError) as err:
                await http.get(f"http://127.0.0.1:{port}/p", params={"api_key": "s3cret-key"})
        assert "s3cret-key" not in str(err.value)
    finally:
        srv.close()
        await srv.wait_closed()


def test_one_client_serves_one_event_loop_after_another(server):
    client = http_client()

    async def once() -> int:
        return (await client.get(f"{server}/echo")).status_code

    assert asyncio.run(once()) == 200
    assert asyncio.run(once()) == 200  # a new loop: a new session, not "loop is closed"
    asyncio.run(client.aclose())


async def _raw_server(handler) -> tuple[asyncio.Server, str]:
    srv = await asyncio.start_server(handler, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


async def test_an_answer_that_trickles_in_is_a_read_timeout():
    """Every single read comes within 0.3 s, far inside the 1 s read timeout; the body
    (50 bytes, 15 s at that pace) is still cut within the read timeout of its headers."""
    body = b"x" * 50
    served = asyncio.Event()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        try:
            for i in range(len(body)):
                writer.write(body[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0.3)
        except ConnectionError:
            pass
        finally:
            served.set()
            writer.close()

    srv, url = await _raw_server(trickle)
    try:
        async with http_client(timeout_seconds=30) as http:
            t0 = time.monotonic()
            with pytest.raises(ReadTimeout) as err:
                await http.get(f"{url}/slow", params={"api_key": "s3cret-key"}, timeout=1.0)
            took = time.monotonic() - t0
        assert 0.9 <= took < 3, took
        assert "s3cret-key" not in str(err.value)
        # the client let go of the connection: the server's next write fails soon
        await asyncio.wait_for(served.wait(), timeout=5)
    finally:
        srv.close()
        await srv.wait_closed()


async def test_the_clients_own_timeout_cuts_a_trickle_too():
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        try:
            for _ in range(100):
                writer.write(b"y")
                await writer.drain()
                await asyncio.sleep(0.2)
        except ConnectionError:
            pass
        finally:
            writer.close()

    srv, url = await _raw_server(trickle)
    try:
        async with http_client(timeout_seconds=0.8) as http:
            t0 = time.monotonic()
            with pytest.raises(ReadTimeout):
                await http.get(f"{url}/slow")
            assert time.monotonic() - t0 < 3
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_server_that_accepts_and_never_answers_is_a_read_timeout():
    released = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await released.wait()
        finally:
            writer.close()

    srv, url = await _raw_server(silent)
    try:
        async with http_client() as http:
            t0 = time.monotonic()
            with pytest.raises(ReadTimeout) as err:
                await http.post(f"{url}/sink?token=s3cret-key", json=[{"a": 1}], timeout=0.5)
            assert time.monotonic() - t0 < 3
        assert "s3cret-key" not in str(err.value)
    finally:
        released.set()
        srv.close()
        await srv.wait_closed()


async def test_a_server_that_trickles_its_headers_is_a_read_timeout():
    async def slow_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(100):
                writer.write(b"X-%d: y\r\n" % i)
                await writer.drain()
                await asyncio.sleep(0.2)
        except ConnectionError:
            pass
        finally:
            writer.close()

    srv, url = await _raw_server(slow_headers)
    try:
        async with http_client() as http:
            t0 = time.monotonic()
            with pytest.raises(ReadTimeout) as err:
                await http.get(f"{url}/h", timeout=0.6)
            assert time.monotonic() - t0 < 3
        assert "headers" in str(err.value)
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_slow_but_whole_answer_within_the_timeout_is_read(server):
    """The deadlines cut only what is too slow: a 2 s answer under a request's own 10 s read
    timeout (past the client's 1 s), and a normal answer under the client's 1 s (a loaded
    2-core machine once took longer than 0.5 s to answer on loopback, and 3 s for the 2 s
    answer), come back whole; the client stays usable."""
    async with http_client(timeout_seconds=1.0) as http:
        resp = await http.get(f"{server}/slow", timeout=10)
        assert resp.json() == {"late": True}
        for _ in range(3):
            resp = await http.get(f"{server}/echo", params={"q": "1"})
            assert resp.status_code == 200 and resp.json()["query"] == [["q", "1"]]


@pytest.mark.parametrize(
    ("http_cfg", "client_timeout"),
    [({"timeout_read_millis": 400}, 30.0), (None, 0.4)],
    ids=["provenance-timeout_read_millis", "http_client.timeout_seconds"],
)
async def test_a_sources_read_timeout_is_its_provenances_else_the_clients(http_cfg, client_timeout):
    """A literature source's requests carry the contract's ``timeout_read_millis``; without
    one the client's own ``timeout_seconds`` cuts them."""
    from artemis.config import load_settings
    from artemis.errors import ArtemisError
    from artemis.registry.client import ContractClient
    from artemis.registry.resolve import Contract

    released = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await released.wait()
        finally:
            writer.close()

    srv, url = await _raw_server(silent)
    endpoint = {"endpoint_name": "search", "path_template": "/search"}
    contract = Contract(
        provenance={"provenance_code": "pm", "base_url_default": url},
        task_type="harvest",
        at="",
        usage="SEARCH",
        endpoint=endpoint,
        endpoints={"SEARCH": endpoint},
        pagination={},
        window_offset=None,
        http=http_cfg,
        batching=None,
        retry=None,
        rate_limit=None,
    )
    source = ContractClient(contract, load_settings(None))
    try:
        async with http_client(timeout_seconds=client_timeout) as http:
            t0 = time.monotonic()
            with pytest.raises(ArtemisError) as err:
                await source.send(http, "GET", source.url(endpoint), {"q": "x"}, "search")
            assert time.monotonic() - t0 < 3
        assert err.value.details["reason"] == "read timed out"
    finally:
        released.set()
        srv.close()
        await srv.wait_closed()
