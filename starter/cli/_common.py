"""What every command group shares: the consoles, settings, failing, and calling the API."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from artemis.config import Settings, load_settings
from artemis.pipes import QuietOnClosedPipe

# Off a terminal (a pipe, a file) nothing is wrapped at 80 columns: a link stays whole.
_WIDTH = None if sys.stdout.isatty() else 10_000
console = Console(stderr=False, file=QuietOnClosedPipe("stdout"), width=_WIDTH)  # type: ignore[arg-type]
err_console = Console(stderr=True, file=QuietOnClosedPipe("stderr"), width=_WIDTH)  # type: ignore[arg-type]

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config (else ARTEMIS_CONFIG)")


def print_table(table: Table, drop: Sequence[str] = (), out: Console | None = None) -> None:
    """A table as a person reads it on a terminal, fitted to its width: no column is
    narrower than its header (a cell folds instead), and while the table cannot fit, the
    columns named in ``drop`` leave it in that order. Piped or redirected: plain text for
    a script or a pager, a line per row, the columns aligned by spaces, every column, no
    box-drawing, no padding at the end of a line."""
    out = out or console
    if out.is_terminal:
        out.print(_fitted(table, out, list(drop)))
        return
    columns = list(table.columns)
    grid = [[_plain(c) for c in col.cells] for col in columns]
    rows = [list(r) for r in zip(*grid, strict=True)] if grid else []
    if table.show_header:
        rows.insert(0, [_plain(col.header) for col in columns])
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(columns))]
    lines = [_plain(table.title)] if table.title else []
    for r in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _fitted(table: Table, out: Console, drop: list[str]) -> Table:
    """``table`` fitted to the terminal: while its columns cannot all keep their header's
    width (a column that does not wrap: its widest cell), the next column of ``drop``
    leaves it; then the wrapping columns are narrowed, each in proportion to what it
    can give, their cells folding. A table still too wide with every ``drop`` gone folds
    its unwrapped columns too (an id over two lines rather than a column of no width)."""
    while drop and sum(_least(c) for c in table.columns) + _frame(table) > out.width:
        table = _without(table, drop.pop(0))
    if sum(_least(c) for c in table.columns) + _frame(table) > out.width:
        for c in table.columns:
            c.no_wrap = False
    room = out.width - _frame(table)
    natural = [max(_least(c), *(len(_plain(x)) for x in c.cells), 1) for c in table.columns]
    least = [_least(c) for c in table.columns]
    excess = sum(natural) - room
    give = [n - m for n, m in zip(natural, least, strict=True)]
    if excess <= 0 or sum(give) <= 0:
        return table
    cuts = [min(g, excess * g // sum(give)) for g in give]
    for i in sorted(range(len(give)), key=lambda j: give[j] - cuts[j], reverse=True):
        if sum(cuts) >= excess:
            break
        if cuts[i] < give[i]:
            cuts[i] += 1
    for col, n, cut in zip(table.columns, natural, cuts, strict=True):
        col.width = n - cut
        if not col.no_wrap:
            col.overflow = "fold"
    return table


# A column this narrow or narrower is never folded (a status, a count, an age).
SHORT = 12


def _least(col: Any) -> int:
    """The narrowest a column may be: one that does not wrap, its widest cell; another,
    its header or ``SHORT``, whichever is wider (its values when they are shorter)."""
    header = len(_plain(col.header))
    widest = max([header, *(len(_plain(c)) for c in col.cells)])
    if col.no_wrap:
        return max(widest, 1)
    return max(min(widest, max(header, SHORT)), 1)


def _frame(table: Table) -> int:
    """The characters a line spends on borders and padding."""
    n = len(table.columns)
    return (1 + 3 * n) if table.box else 2 * n


def _without(table: Table, name: str) -> Table:
    """``table`` without its column headed ``name``."""
    keep = [c for c in table.columns if _plain(c.header) != name]
    if len(keep) == len(table.columns):
        return table
    smaller = Table(
        title=table.title,
        show_header=table.show_header,
        box=table.box,
        show_lines=table.show_lines,
    )
    for c in keep:
        smaller.add_column(c.header, no_wrap=c.no_wrap, overflow=c.overflow)
    for row in zip(*[list(c.cells) for c in keep], strict=True):
        smaller.add_row(*row)
    return smaller


def _plain(cell: Any) -> str:
    """A cell's text without its markup (rich markup in a string, or a Text)."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain
    return str(cell or "")


def _settings(config: Path | None, **overrides: Any) -> Settings:
    return load_settings(config, **overrides)


def _fail(message: str) -> None:
    # The message is plain text: `list[str]` or `[bold]x` in it is shown, not styled.
    err_console.print(f"[red]error:[/red] {escape(str(message))}", highlight=False)
    raise typer.Exit(1)


def _require_master_key() -> None:
    """A cluster process never makes up its own key: API and workers must share one."""
    # lazy: importing it costs every `artemis` start-up ~0.2 s
    from artemis.vault import MASTER_KEY_ENV, master_key_missing

    value = os.environ.get(MASTER_KEY_ENV, "")
    if not value:
        _fail(master_key_missing())
    if len(value) < 32:
        _fail(f"{MASTER_KEY_ENV} is too short: at least 32 characters")


def _registry_engine(settings: Settings):
    # lazy: importing it costs every `artemis` start-up ~0.2 s
    from artemis.db import get_engine

    return get_engine(settings.database.url)


def _parse_kv(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            _fail(f"-p expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value.split(",") if "," in value else value
    return out


# -- the starter API ------------------------------------------------------------------------------
def _api_url(settings: Settings, api: str | None) -> str:
    return (
        api
        or os.environ.get("ARTEMIS_API")
        or f"http://{settings.server.host}:{settings.server.port}"
    )


def _headers(settings: Settings) -> dict[str, str]:
    # ARTEMIS_API_TOKEN first (a client's own token); else the config's first token, for
    # an operator on the API's own machine.
    tokens = settings.server.tokens()
    token = os.environ.get("ARTEMIS_API_TOKEN") or (tokens[0].token if tokens else None)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _call_status(method: str, url: str, settings: Settings, **kw: Any) -> int:
    """Only the status an API call answers (connection errors fail as _call does)."""
    try:
        return httpx.request(method, url, headers=_headers(settings), timeout=30, **kw).status_code
    except httpx.HTTPError as e:
        _fail(f"cannot reach the Artemis API at {url.split('?')[0]}: {e}")
        raise  # unreachable


def _call(method: str, url: str, settings: Settings, **kw: Any) -> dict[str, Any]:
    try:
        resp = httpx.request(method, url, headers=_headers(settings), timeout=30, **kw)
    except httpx.HTTPError as e:
        _fail(f"cannot reach the Artemis API at {url}: {e}")
    data = _json_of(resp, f"{method} {url}")
    if (
        not data.get("success")
        and data.get("error")
        and resp.status_code >= 400
        and not data.get("data")
    ):
        err = data["error"]
        _fail(f"{err.get('code')}: {err.get('message')}")
    return data


def _json_of(resp: httpx.Response, what: str) -> dict[str, Any]:
    try:
        return resp.json()
    except ValueError:
        _fail(f"{what} answered {resp.status_code} without JSON")
        raise  # unreachable: _fail exits


def _call_error(resp: httpx.Response, what: str) -> None:
    """Exit with the API's error code and message."""
    e = _json_of(resp, what).get("error") or {}
    _fail(f"{e.get('code', resp.status_code)}: {e.get('message', what)}")
