"""URLs as Artemis sends them: percent-encoded by the WHATWG URL standard's sets, with a
request's params merged into the query, and the links of a ``Link`` header read.
Plain functions (stdlib and yarl): the HTTP client (``artemis/http.py``) and the
paginators (``artemis/paging.py``) share them."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import yarl

# A request's query parameters (None: none).
Params = Mapping[str, Any] | None


_QUERY_SAFE = "".join(chr(i) for i in range(0x21, 0x7F) if chr(i) not in '"#<>')
_PATH_SAFE = "".join(c for c in _QUERY_SAFE if c not in "?`{}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def encode_url(url: str) -> yarl.URL:
    """``url`` as it goes on the wire: host IDNA-encoded and lower-cased, a default port
    dropped, dot segments removed from the path, path and query percent-encoded by the
    WHATWG sets, the fragment dropped. ValueError: not an http(s) URL one can send to."""
    if _CONTROL.search(url):
        # urlsplit would drop a tab or a CR LF silently; such a URL is a mistake or an
        # attempt at a header of one's own, and is refused.
        raise ValueError("a control character in the URL")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {url.split('?', 1)[0]!r}")
    path = quote(_without_dot_segments(parts.path) or "/", safe=_PATH_SAFE)
    query = quote(parts.query, safe=_QUERY_SAFE)
    # encoded=True: yarl would otherwise re-quote the query ("%2F" sent as "/").
    return yarl.URL(
        f"{_origin(scheme, parts.netloc)}{path}{'?' if query else ''}{query}", encoded=True
    )


@functools.lru_cache(maxsize=1024)
def _origin(scheme: str, netloc: str) -> str:
    # yarl checks the port and encodes the host (IDNA) and user info.
    return str(yarl.URL.build(scheme=scheme, authority=netloc))


def _without_dot_segments(path: str) -> str:
    """``/a/./b/../c`` as ``/a/c`` (RFC 3986 §5.2.4; a trailing ``..`` leaves no slash)."""
    if "." not in path:
        return path
    segments = path.split("/")
    if "." not in segments and ".." not in segments:
        return path
    out: list[str] = []
    for segment in segments:
        if segment == "..":
            if out and out != [""]:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/".join(out)


def query_pairs(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A mapping as query pairs: a list value repeats its key, True/False are
    ``true``/``false``, None is empty."""
    out: list[tuple[str, str]] = []
    for k, v in params.items():
        for item in v if isinstance(v, list | tuple) else (v,):
            if item is True:
                out.append((k, "true"))
            elif item is False:
                out.append((k, "false"))
            else:
                out.append((k, "" if item is None else str(item)))
    return out


def with_params(url: str, params: Params) -> str:
    """``url`` with ``params`` merged into its query: a key given in ``params`` replaces
    the URL's own values of that key, the URL's other parameters stay (httpx 0.28's client
    dropped them all — a next-page URL lost its page to a credential parameter); no params
    keeps the URL as is."""
    if not params:
        return url
    pairs = query_pairs(params)
    parts = urlsplit(url)
    if parts.query:
        given = {k for k, _ in pairs}
        kept = parse_qsl(parts.query, keep_blank_values=True)
        if any(k in given for k, _ in kept):
            query = urlencode([(k, v) for k, v in kept if k not in given] + pairs)
        else:
            query = parts.query + "&" + urlencode(pairs)
    else:
        query = urlencode(pairs)
    return parts._replace(query=query).geturl()


def header_links(value: str) -> dict[str, dict[str, str]]:
    """The links of a ``Link`` header (RFC 8288) by ``rel`` (a link without one: by its
    URL), each a dict of its ``url``, as given, and its parameters; ``{}`` when the value
    holds none."""
    links: dict[str, dict[str, str]] = {}
    value = value.strip(" '\"")
    if not value:
        return links
    for item in re.split(", *<", value):
        url, _, params = item.partition(";")
        link = {"url": url.strip("<> '\"")}
        for param in params.split(";") if params else ():
            key, eq, val = param.partition("=")
            if not eq or "=" in val:
                break
            link[key.strip(" '\"")] = val.strip(" '\"")
        links[link.get("rel") or link["url"]] = link
    return links


# --- transport failures -----------------------------------------------------------------
